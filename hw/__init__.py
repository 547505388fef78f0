"""``ringkv.hw`` (folder ``hw/``): the gateware, one ``wiring.Component`` per module, one
subpackage per subsystem.

============================ ===========================================================
``ringkv.hw.link``            UART, frame decoder and encoder
``ringkv.hw.commands``        the command processor: dispatcher and one unit per opcode family
``ringkv.hw.store``           hash engine, cache directory (lists, region FIFOs), hot tier,
                             token memory
``ringkv.hw.storage``         storage port, SD PHY and controllers, DMA, record header
``ringkv.hw.attention``       sliding-window attention core, lanes, merge, ring port
``ringkv.hw.seal``            record MAC and key slots
``ringkv.hw.top``             ``RingKVTop``: every subsystem behind the link
``ringkv.hw.enums``,          shared shapes: Amaranth enums of ``ringkv.defs``' enums, the
``ringkv.hw.protocol``        link's opcodes and statuses
============================ ===========================================================

It may import only Amaranth, the standard library and ``ringkv.defs``: a core never sees the
host, the simulation harness or the boards, so it can be lifted into another design with
``ringkv.defs`` alone. Between the subsystems: link, store, attention and seal see none of the
others; storage sees only the ports its DMA drives; only ``commands`` and ``top`` see every
subsystem (``tests/repo/test_layers.py``).

The components a user instantiates are re-exported here and from their subpackage::

    from ringkv.hw import HashEngine
    from ringkv.hw.store import CacheDirectory
"""

from .attention import AttentionCore, AttentionLane, RingPortArbiter, RingPortSignature
from .commands import Dispatcher
from .link import UART, FrameDecoder, FrameEncoder, UARTReceiver, UARTTransmitter
from .seal import KeySlots, MacCore, MacUnit
from .storage import (
    DmaEngine,
    HeaderEncoder,
    HeaderParser,
    SDNativeController,
    SDSPIController,
    StoragePortSignature,
)
from .store import (
    BucketLists,
    CacheDirectory,
    FreeLinks,
    HashEngine,
    HotTier,
    RegionAllocator,
    TokenMemory,
)
from .top import RingKVTop

__all__ = ["UART", "UARTReceiver", "UARTTransmitter", "FrameDecoder", "FrameEncoder",
           "Dispatcher", "HashEngine", "CacheDirectory", "BucketLists", "RegionAllocator",
           "FreeLinks", "HotTier", "TokenMemory", "StoragePortSignature", "SDNativeController",
           "SDSPIController", "DmaEngine", "HeaderEncoder", "HeaderParser", "AttentionCore",
           "AttentionLane", "RingPortSignature", "RingPortArbiter", "MacCore", "MacUnit",
           "KeySlots", "RingKVTop"]
