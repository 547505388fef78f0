"""``ringkv.hw.attention``: sliding-window attention on ring buffers -- the core and its
sequencer, its split-KV lanes, the log-sum-exp merge unit, and the ring port (with its arbiter)
through which the DMA and the dispatcher reach the rings.

It may import Amaranth, the standard library and ``ringkv.defs`` only: it knows nothing of the
link, the store, storage or sealing (``tests/repo/test_layers.py``).

The core's names are re-exported here from :mod:`.core`, so ``from ringkv.hw.attention import
AttentionCore, AttnOp`` works as it did when the core was the module ``ringkv.hw.attention``.
"""

from .core import YOSYS_AFTER_READ, AttentionCore, AttnErr, AttnOp
from .lane import AttentionLane, LaneParams
from .merge import BetaUnit, LaneMax, OutputTree, Reciprocal, WeightSum
from .ring_port import (
    RING_READ_LATENCY,
    RING_WRITE_LATENCY,
    RingPortArbiter,
    RingPortSignature,
    RingReadSignature,
)

__all__ = ["AttentionCore", "AttnOp", "AttnErr", "YOSYS_AFTER_READ", "AttentionLane",
           "LaneParams", "LaneMax", "WeightSum", "Reciprocal", "BetaUnit", "OutputTree",
           "RingPortSignature", "RingReadSignature", "RingPortArbiter", "RING_READ_LATENCY",
           "RING_WRITE_LATENCY"]
