"""``ringkv.hw.seal``: authenticated records -- the keyed BLAKE2s record MAC and the
write-only key slots it reads.

It may import Amaranth, the standard library and ``ringkv.defs`` only: it knows nothing of the
link, the store, storage or attention (the DMA drives the MAC through
:class:`~ringkv.hw.seal.mac.MacPortSignature`; ``tests/repo/test_layers.py``).
"""

from .key_slots import KeyReadSignature, KeySlots, KeyWrite
from .mac import MacCore, MacPortSignature, MacUnit

__all__ = ["MacCore", "MacUnit", "MacPortSignature", "KeySlots", "KeyWrite",
           "KeyReadSignature"]
