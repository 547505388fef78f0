"""``ringkv.hw.storage``: records on the card -- the sector storage port, the SD PHY pieces, the
native 4-bit and SPI SD controllers, the SDRAM sector store (the hot tier behind the same port),
the tiered storage (card and SDRAM behind one port, copies routed by the hot tier's map), the
DMA engine that moves a record (header, tokens, K/V rings) between the storage and the
attention core's rings; and the pieces of the four-bytes-a-clock import: the K/V writer (V
turned from the record's column order to the rings' rows), the CRC over one to four bytes a
clock, and the converters between a port of bytes and a port of four-byte words.

It may import Amaranth, the standard library, ``ringkv.defs``, ``ringkv.hw.enums``, and of the
other subsystems only the ports the DMA drives: the attention core's ring port
(``ringkv.hw.attention.ring_port``), the token memory's read port
(``ringkv.hw.store.token_memory``) and the record MAC's port (``ringkv.hw.seal.mac``); and the
SDRAM controller's user port (``ringkv.hw.sdram.arbiter``) that the SDRAM sector store drives,
and the hot tier (``ringkv.hw.store.hot_tier``) that the tiered storage holds and routes by,
with the register slice of ``ringkv.hw.link.skid`` on its read data (a module of Amaranth
alone) (``tests/repo/test_layers.py``).

The storage port's names (``StoragePortSignature``, ``StorageOp``, ``StorageError``, ...) are
re-exported here from :mod:`.port`, so ``from ringkv.hw.storage import StoragePortSignature``
works as it did when the port was the module ``ringkv.hw.storage``.
"""

from .crc_bytes import CrcBytes
from .dma import DmaEngine, DmaOp, RecordKind, RecordStatus
from .dma_stream import RecordCursor, RecordTap, TokenChecker, WritePipeline
from .kv_words import KvWordWriter, KvWrite, kv_words_supported
from .port import (
    SECTOR_BYTES,
    STORAGE_WIDTHS,
    CardType,
    StorageCommand,
    StorageError,
    StorageInfoSignature,
    StorageOp,
    StoragePortSignature,
    StorageStatus,
)
from .port_width import BytesToWords, StorageWidener, WordsToBytes
from .record_header import HeaderEncoder, HeaderParser
from .sdnative import SDNativeController
from .sdphy import SDClocker, SDCmdReader, SDCmdWriter, SDDataPHY, SPIByteEngine
from .sdram_store import SdramSectorStore
from .sdspi import SDSPIController
from .tiered import TieredStorage

__all__ = ["SECTOR_BYTES", "StorageOp", "StorageError", "StorageCommand", "StorageStatus",
           "StoragePortSignature", "StorageInfoSignature", "CardType",
           "SDNativeController", "SDSPIController", "SDClocker", "SDCmdWriter", "SDCmdReader",
           "SDDataPHY", "SPIByteEngine", "DmaEngine", "DmaOp", "RecordStatus", "RecordKind",
           "RecordCursor", "RecordTap", "WritePipeline", "TokenChecker", "HeaderEncoder",
           "HeaderParser", "SdramSectorStore", "TieredStorage", "KvWordWriter", "KvWrite",
           "kv_words_supported", "CrcBytes", "STORAGE_WIDTHS", "WordsToBytes", "BytesToWords",
           "StorageWidener"]
