"""The small device the software device's tests share (``test_software_device.py``,
``test_software_device_sealed.py``): its configuration, and putting a known state in its rings.
A plain module, not a test module: test modules import it, never each other."""

import numpy as np

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import SECTOR, RecordLayout
from ringkv.host.device.software import SoftwareDevice
from ringkv.host.model.transformer import BOS, FixedBackend

__all__ = ["SMALL", "LAY", "SPAN", "fixed", "device", "compute", "stored", "tokens_of",
           "valid_state"]

SMALL = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=16, max_tokens=256)
LAY = RecordLayout(SMALL)
SPAN = LAY.sectors_per_region * SECTOR


def fixed():
    return FixedBackend(SMALL, lanes=2)


def device(**kw):
    return SoftwareDevice(SMALL, attention=fixed(), **kw)


def compute(dev, tokens, model):
    """The state after ``tokens`` in ``dev``'s rings and token memory."""
    dev.attention.reset()
    dev.write_tokens(tokens)
    model.prefill(list(tokens), 0, dev.attention, 5)


def stored(dev, tokens, model, **kw):
    compute(dev, tokens, model)
    return dev.export(tokens, **kw)[0]


def tokens_of(seed, n):
    rng = np.random.default_rng(seed)
    return [BOS] + [int(t) for t in rng.integers(1, 256, size=n - 1)]


def valid_state(dev):
    """Each ring's (count, head) and the K/V of its valid slots, oldest first."""
    rings, count, head = dev.attention.snapshot()
    v = min(int(count[0]), SMALL.window)
    slots = [(int(head[0]) - v + 1 + t) % SMALL.window for t in range(v)]
    return count.tolist(), head.tolist(), rings[:, :, :, slots, :].tolist()
