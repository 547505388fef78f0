"""The small RingKVTop the Amaranth-simulator tests of the top share (``test_top.py``,
``test_recovery_device.py``): its configuration and request packing. A plain module, not a test
module: test modules import it, never each other."""

from ringkv.defs.config import RingKVConfig
from ringkv.defs.mac import KEY_BYTES
from ringkv.defs.protocol import REQUESTS, Op, build_requests
from ringkv.hw.top import RingKVTop

__all__ = ["CFG", "CFG2", "REGIONS", "LANES", "MACS", "make_top", "req", "sreq", "key_set_req"]

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


def sreq(op, **fields):
    """A request of a sealed build (:func:`~ringkv.defs.protocol.build_requests`): QUERY,
    QUERY_PREFIX and EXPORT carry ``slot``."""
    return build_requests(True)[op].pack(**fields)


def key_set_req(slot, key_id, key):
    """KEY_SET's payload: the slot, the key id, then the key."""
    assert len(key) == KEY_BYTES
    return REQUESTS[Op.KEY_SET].pack(slot=slot, key_id=key_id) + bytes(key)
