"""The small RingKVTop the Amaranth-simulator tests of the top share (``test_top.py``,
``test_recovery_device.py``): its configuration and request packing. A plain module, not a test
module: test modules import it, never each other."""

from ringkv.defs.config import RingKVConfig
from ringkv.defs.protocol import REQUESTS
from ringkv.hw.top import RingKVTop

__all__ = ["CFG", "CFG2", "REGIONS", "LANES", "MACS", "make_top", "req"]

CFG = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=8, window=8, max_tokens=64)
#: the same device with numerics ringkv-fx2 (int16 q/k/v: two bytes per element)
CFG2 = RingKVConfig(**{**CFG.__dict__, "numerics": "ringkv-fx2"})
REGIONS = 4
LANES, MACS = 2, 4


def make_top(config=CFG, **kw):
    kw = {"regions": REGIONS, "lanes": LANES, "macs": MACS, "max_payload": 1024, **kw}
    return RingKVTop(config, **kw)


def req(op, **fields):
    return REQUESTS[op].pack(**fields)
