"""The link protocol, defined once for the gateware and the host.

Frame constants, the opcodes (:class:`Op`), the response codes (:class:`Status`) and the payload
layout of every request and response (:data:`REQUESTS`, :data:`RESPONSES`, :data:`LENGTH`). The
frame decoder and the dispatcher (:mod:`ringkv.hw.link.framing`, :mod:`ringkv.hw.top`) take their
constants, argument offsets and response packing from here; the host
(:mod:`ringkv.host.device.frames`, :mod:`ringkv.host.device.fpga`) packs and unpacks with the same
tables, so the two sides cannot drift apart. ``docs/blocks/link.md`` documents the frames and
holds the opcode, status and payload tables, written from these definitions by
``tools/doc_tables.py``.

Request::

    SYNC op seq len_lo len_hi payload[len] crc_hi crc_lo

Response::

    SYNC op|0x80 seq status len_lo len_hi payload[len] crc_hi crc_lo

The CRC (:data:`FRAME_CRC`) is CRC-16/XMODEM: polynomial 0x1021, initial value 0, no
reflection, no final XOR, over every byte after SYNC up to the end of the payload, sent most
significant byte first, so that running the CRC over the CRC bytes too leaves the residue 0.

Builds: an open build (the default) executes every op of :data:`REQUESTS` but :data:`KEY_OPS`
and :data:`SDRAM_OPS`; a sealed build (``RingKVTop(sealed=True)``) executes the key ops too,
with :data:`SEALED_REQUESTS`'s layouts (a tenant key slot appended) for :data:`TENANT_OPS`; a
build with the SDRAM self-test (``RingKVTop(sdram_test=True)``: the ULX3S top with its SDRAM)
executes :data:`SDRAM_OPS` (:func:`build_requests`).

Payloads: every request and response payload is a fixed little-endian record (:class:`Layout`),
optionally followed by a variable *tail* (tokens, attention elements, sector bytes). Integers are
unsigned little-endian; a field whose kind is ``"bytes"`` is a raw byte string.
"""

import enum
from dataclasses import dataclass

from .config import RingKVConfig
from .crc import CrcSpec
from .mac import KEY_BYTES
from .record import elem_bytes

__all__ = ["Op", "Status", "OP_BITS", "STATUS_BITS", "SYNC", "RESPONSE_FLAG",
           "DEFAULT_MAX_PAYLOAD", "FRAME_CRC", "REQUEST_OVERHEAD", "RESPONSE_OVERHEAD",
           "PROTOCOL_VERSION", "GATEWARE_VERSION", "IDEMPOTENT_OPS", "Layout", "Length",
           "REQUESTS", "RESPONSES", "LENGTH", "TAILS", "IMPLEMENTED", "DIR_RESPONSE",
           "SNAPSHOT_RESPONSE", "PREFIX_RESPONSE", "RECOVERY_STATUS", "RecoveryState",
           "RECOVERY_GATED", "RECOVERY_SCAN_GATED", "NO_RECORD", "RING_CLEAR_ALL", "FLAG_EVICT",
           "FLAG_EXISTING",
           "RING_ELEMENTS", "RING_META", "META_BYTES", "attn_in_bytes", "attn_out_bytes",
           "max_attn_tokens", "STORAGE_INFO", "StorageKind", "CardType", "StorageError",
           "KEY_SET_TAIL", "KEY_OPS", "TENANT_OPS", "SEALED_REQUESTS", "build_requests",
           "SDRAM_OPS", "SDRAM_TEST_RESPONSE"]

#: First byte of every frame; the decoder hunts for it after an error.
SYNC = 0xA5
#: A response carries its request's opcode with this bit set.
RESPONSE_FLAG = 0x80
#: Default bound on a frame's payload, in bytes (a parameter of the decoder).
DEFAULT_MAX_PAYLOAD = 4096
#: Bytes of a request besides its payload: SYNC, op, seq, 2 length, 2 CRC.
REQUEST_OVERHEAD = 7
#: Bytes of a response besides its payload: SYNC, op, seq, status, 2 length, 2 CRC.
RESPONSE_OVERHEAD = 8
#: Reported by ``Op.VERSION``; bump it when a frame layout or an opcode's payload changes.
PROTOCOL_VERSION = 5
#: The frame CRC (the gateware builds it with ``amaranth.lib.crc``, the host computes it with
#: ``binascii.crc_hqx``; a test checks both against these parameters).
FRAME_CRC = CrcSpec("CRC16_XMODEM", width=16, polynomial=0x1021, initial=0, reflect=False,
                    xor_output=0)
#: Bits of the opcode and status fields of a frame.
OP_BITS = 8
STATUS_BITS = 8


class Op(enum.Enum):
    """Request opcodes of the whole system (bit 7 clear; a response sets it).

    Grouped by block in the high nibble. Payload layouts per opcode: :data:`REQUESTS`,
    :data:`RESPONSES`, :data:`TAILS`, rendered in ``docs/blocks/link.md``.
    """

    # link and device identity
    PING           = 0x01   # echo the payload
    VERSION        = 0x02   # protocol version, gateware version, parameters
    CONFIG_DIGEST  = 0x03   # the device's RingKVConfig digest (32 bytes) and fields
    STATS          = 0x04   # error/frame counters and cycle counters
    STATS_CLEAR    = 0x05
    # token memory and hash engine
    TOKENS_WRITE   = 0x10   # write tokens at an offset of a session's token memory
    TOKENS_APPEND  = 0x11   # append tokens after the last one
    TOKENS_READ    = 0x12   # read tokens back (verification, inspection)
    SESSION_BEGIN  = 0x13   # select/clear the resident session's token memory
    HASH_QUERY     = 0x14   # prefix hash of the first n tokens
    # cache directory
    DIR_LOOKUP     = 0x20
    DIR_INSERT     = 0x21
    DIR_DELETE     = 0x22
    DIR_TOUCH      = 0x23
    DIR_EXPIRE     = 0x24
    DIR_READ       = 0x25
    DIR_CLEAR      = 0x26
    # snapshot store: query = hash + lookup + token verification
    QUERY          = 0x30
    IMPORT         = 0x31
    EXPORT         = 0x32
    ALLOC_STATUS   = 0x33   # levels of the two address FIFOs
    QUERY_PREFIX   = 0x34   # longest prefix of the first n tokens with a directory entry
    # SWA attention core
    ATTN_DECODE    = 0x40   # one decode step of one layer
    ATTN_PREFILL   = 0x41   # one prefill chunk of one layer
    RING_CLEAR     = 0x42   # empty the ring buffers
    RING_READ      = 0x43   # read ring slots back (inspection, tests)
    # storage
    SECTOR_READ    = 0x50   # raw sector, for inspection and the host's deep check (fsck)
    STORAGE_REBUILD = 0x51  # re-run the device's recovery: rebuild the directory from headers
    STORAGE_STATUS = 0x52   # recovery state and figures (RECOVERY_STATUS)
    STORAGE_INFO   = 0x53   # the storage medium: controller, card type and size (STORAGE_INFO)
    SDRAM_TEST     = 0x54   # the board's SDRAM self-test (builds with an SDRAM only)
    # record keys (sealed builds only; an open build answers UNKNOWN_OP)
    KEY_SET        = 0x60   # write a key slot: key id and 32-byte key; derives its hash seed
    KEY_CLEAR      = 0x61   # erase a key slot


class Status(enum.Enum):
    """Response status codes. Errors of the frame layer are sent with the request's opcode."""

    OK             = 0x00
    BAD_CRC        = 0x01   # frame CRC mismatch: the frame was dropped, nothing was done
    UNKNOWN_OP     = 0x02   # CRC good, opcode not in :class:`Op`
    BAD_LENGTH     = 0x03   # length above the decoder's bound, or wrong for the opcode
    BAD_ARG        = 0x04   # an argument out of range; nothing was done
    TIMEOUT        = 0x05   # a partial frame timed out and was dropped
    BUSY           = 0x06
    MISS           = 0x07
    HIT            = 0x08
    FULL           = 0x09   # no free storage region / directory link
    STORAGE_ERROR  = 0x0A
    FOREIGN_CONFIG = 0x0B   # a record made by a device with another configuration
    CORRUPT        = 0x0C   # a record whose payload CRC does not match
    NOT_READY      = 0x0D   # the directory is being recovered (or recovery failed): the body
                            # is the RECOVERY_STATUS record (state, progress, error)
    NO_KEY         = 0x0E   # sealed build: the request's tenant slot holds no key; nothing done
    INTERNAL       = 0x0F


#: Operations a host may repeat after a lost or corrupted response without changing the result.
IDEMPOTENT_OPS = frozenset({
    Op.PING, Op.VERSION, Op.CONFIG_DIGEST, Op.STATS, Op.TOKENS_WRITE, Op.TOKENS_READ,
    Op.HASH_QUERY, Op.DIR_LOOKUP, Op.DIR_READ, Op.QUERY, Op.QUERY_PREFIX, Op.ALLOC_STATUS,
    Op.RING_READ, Op.SECTOR_READ, Op.STORAGE_STATUS, Op.STORAGE_INFO, Op.KEY_SET, Op.KEY_CLEAR,
})


#: Reported by ``Op.VERSION``; bump when the gateware's behaviour changes.
GATEWARE_VERSION = 5
#: ``record_status`` of a QUERY whose directory lookup missed (the DMA did not run).
NO_RECORD = 0xFF
#: ``RING_CLEAR`` of this layer clears every ring.
RING_CLEAR_ALL = 0xFF
#: ``DIR_INSERT`` flags.
FLAG_EVICT, FLAG_EXISTING = 1, 2
#: ``RING_READ`` ``what``: ring element bytes or per-ring metadata (count u32, head u16). The
#: ring port is byte-addressed: ``addr`` and ``n`` of ``RING_ELEMENTS`` count bytes, element ``e``
#: being bytes ``e*EB .. e*EB+EB-1`` little-endian (``EB = elem_bytes(config)``: 1 for
#: ``ringkv-fx1``, 2 for ``ringkv-fx2``).
RING_ELEMENTS, RING_META = 0, 1
META_BYTES = 6


@dataclass(frozen=True)
class Layout:
    """A fixed record of ``(name, size)`` fields (``(name, size, "bytes")`` for raw bytes)."""

    fields: tuple = ()

    @property
    def size(self) -> int:
        return sum(f[1] for f in self.fields)

    def offset(self, name: str) -> tuple[int, int]:
        """``(offset, size)`` in bytes of field ``name``."""
        off = 0
        for f in self.fields:
            if f[0] == name:
                return off, f[1]
            off += f[1]
        raise KeyError(f"no field {name!r} in {self.names}")

    @property
    def names(self) -> list[str]:
        return [f[0] for f in self.fields]

    def pack(self, **values) -> bytes:
        unknown = set(values) - set(self.names)
        if unknown:
            raise KeyError(f"unknown fields {sorted(unknown)}; fields are {self.names}")
        out = bytearray()
        for f in self.fields:
            name, size = f[0], f[1]
            value = values.get(name, b"" if len(f) > 2 else 0)
            if len(f) > 2:
                value = bytes(value)
                if len(value) > size:
                    raise ValueError(f"{name} is {len(value)} bytes, the field holds {size}")
                out += value.ljust(size, b"\0")
            else:
                if not 0 <= int(value) < 1 << (8 * size):
                    raise ValueError(f"{name} = {value!r} does not fit in {size} bytes")
                out += int(value).to_bytes(size, "little")
        return bytes(out)

    def unpack(self, data: bytes) -> dict:
        """The fields of the first :attr:`size` bytes of ``data`` (the rest is the tail)."""
        if len(data) < self.size:
            raise ValueError(f"{len(data)} bytes given, the layout needs {self.size}")
        out, off = {}, 0
        for f in self.fields:
            name, size = f[0], f[1]
            chunk = bytes(data[off:off + size])
            out[name] = chunk if len(f) > 2 else int.from_bytes(chunk, "little")
            off += size
        return out


_EMPTY = Layout()
#: The response of every DIR_* op: the directory's response, field for field.
DIR_RESPONSE = Layout((("dir_status", 1), ("evicted", 1), ("link", 2), ("region", 4),
                       ("count", 4), ("hash", 8), ("stamp", 4), ("prev", 2), ("next", 2),
                       ("victim", 2), ("expired", 2)))


class RecoveryState(enum.Enum):
    """``state`` of :data:`RECOVERY_STATUS`: the device's directory recovery (power-on scan)."""

    SCANNING = 0   #: scanning the record headers (after reset, or after STORAGE_REBUILD)
    READY = 1      #: the directory holds every live record; the store is usable
    FAILED = 2     #: the storage failed during the scan (``error``); STORAGE_REBUILD retries


#: The response of STORAGE_STATUS and STORAGE_REBUILD, and the body of every ``NOT_READY``
#: answer: ``state`` (:class:`RecoveryState`), ``error`` (the storage port's error code of a
#: failed scan, 0 otherwise: ``hw/storage.StorageError``), ``scanned`` of ``regions`` header
#: sectors checked so far, ``live`` records in the directory, ``freed`` regions holding
#: something the scan did not use (a header that fails a check, a zero-token record, a
#: superseded commit), ``next_seq`` (the commit sequence register: valid when READY),
#: ``cycles`` (clocks of the last scan, from its start to READY or FAILED; while scanning,
#: so far).
RECOVERY_STATUS = Layout((("state", 1), ("error", 1), ("scanned", 4), ("regions", 4),
                          ("live", 4), ("freed", 4), ("next_seq", 4), ("cycles", 8)))
#: Requests answered ``NOT_READY`` (with :data:`RECOVERY_STATUS`) unless recovery is READY:
#: they need a directory that holds the store.
RECOVERY_GATED = frozenset({Op.QUERY, Op.EXPORT, Op.QUERY_PREFIX})
#: Requests answered ``NOT_READY`` while the scan runs (it owns the directory, the DMA and the
#: storage port); after a failed scan they answer normally, for inspection and repair.
RECOVERY_SCAN_GATED = frozenset({Op.DIR_LOOKUP, Op.DIR_INSERT, Op.DIR_DELETE, Op.DIR_TOUCH,
                                 Op.DIR_EXPIRE, Op.DIR_READ, Op.DIR_CLEAR, Op.SECTOR_READ,
                                 Op.STORAGE_REBUILD, Op.SDRAM_TEST})

class StorageKind(enum.Enum):
    """``kind`` of :data:`STORAGE_INFO`: what serves the device's storage port."""

    NONE = 0       #: no SD controller in this build (a simulation's sector model)
    SD_SPI = 1     #: an SD card in SPI mode (``hw/storage/sdspi.py``)
    SD_NATIVE = 2  #: an SD card in native mode, 4-bit bus (``hw/storage/sdnative.py``)


class CardType(enum.Enum):
    """``card_type`` of :data:`STORAGE_INFO`, from the card's answer to ``ACMD41`` (the OCR's
    CCS bit) and ``CMD8`` (a card that does not answer it is SD v1: SDSC)."""

    UNKNOWN = 0    #: no card seen yet (or no SD controller)
    SDSC = 1       #: standard capacity (byte addressed; CSD version 1)
    SDHC = 2       #: high or extended capacity, SDHC/SDXC (block addressed; CSD version 2)


class StorageError(enum.Enum):
    """The storage port's error codes (``hw/storage.StorageError``), as the link reports them
    (``error`` of :data:`RECOVERY_STATUS`, ``last_error`` of :data:`STORAGE_INFO`)."""

    OK = 0
    TIMEOUT = 1    #: no response, no data, or busy too long (card gone or hung)
    CRC = 2        #: a CRC error on the bus (command, read data or written data)
    CARD = 3       #: the card answered with an error
    RANGE = 4      #: count 0, or sectors outside the medium
    NOT_READY = 5  #: initialisation failed (no card, unusable card)


#: The response of STORAGE_INFO: ``kind`` (:class:`StorageKind`), ``card_type``
#: (:class:`CardType`), ``initialised`` (1 once the controller has initialised the card),
#: ``bus_width`` (data lines: 1 for SPI, 4 for the native 4-bit bus, 0 without a controller),
#: ``high_speed`` (1 once the card runs in high-speed mode), ``last_error`` (the storage
#: port's error code of the last failed storage operation since reset,
#: :class:`StorageError`; 0: none), ``errors`` (failed storage operations since reset),
#: ``sd_clock_hz`` (the SD clock of data transfers, from the build's dividers; 0 without a
#: controller), ``sectors`` (the card's capacity in 512-byte sectors, from its CSD; 0 when
#: unknown: the SPI controller does not read the CSD). Then the SDRAM hot tier
#: (``RingKVTop(tier=...)``, ``docs/blocks/tiered_storage.md``; all 0 without one):
#: ``hot_slots`` (SDRAM copies it can hold), ``hot_residents`` (committed copies now: the hot
#: tier's ``COUNT``, read when the request is answered), ``hot_slot_sectors`` (sectors per
#: slot) and ``hot_slot_tokens`` (token sectors a slot holds: ``slot_token_sectors``; a
#: record's token sectors beyond it stay on the card).
STORAGE_INFO = Layout((("kind", 1), ("card_type", 1), ("initialised", 1), ("bus_width", 1),
                       ("high_speed", 1), ("last_error", 1), ("errors", 4),
                       ("sd_clock_hz", 4), ("sectors", 8), ("hot_slots", 2),
                       ("hot_residents", 2), ("hot_slot_sectors", 2), ("hot_slot_tokens", 2)))

#: The response of SDRAM_TEST (the self-test's answer, ``hw/sdram/bist.py``): ``failed`` (0 when
#: every test passed, else the test of the first word read back wrong:
#: :class:`ringkv.defs.sdram.BistPhase`), that word's ``address`` (16-bit words), the word
#: ``expected`` and the word ``got``; ``errors`` (words read back wrong, saturating), ``words``
#: of the full pattern, ``chip_words`` (the part's size in 16-bit words), ``cycles`` (device
#: clocks of the run).
SDRAM_TEST_RESPONSE = Layout((("failed", 1), ("address", 4), ("expected", 2), ("got", 2),
                              ("errors", 4), ("words", 4), ("chip_words", 4), ("cycles", 4)))

#: The response of QUERY and EXPORT.
SNAPSHOT_RESPONSE = Layout((("record_status", 1), ("dir_status", 1), ("link", 2), ("region", 4),
                            ("count", 4), ("hash", 8), ("bytes", 4), ("cycles", 4),
                            ("seq", 4)))

#: The response of QUERY_PREFIX (status HIT or MISS): the longest prefix ``count`` (0 on a
#: miss) of the first ``n`` tokens whose ``(count, hash)`` has a directory entry, its ``hash``,
#: the entry's ``link`` and ``region``; ``probes``: directory links compared over all the
#: prefix lengths; ``cycles``: device clocks of the request (from its header to the answer).
#: A hit is a directory entry, not yet a verified record: ``QUERY count`` verifies and imports.
PREFIX_RESPONSE = Layout((("count", 4), ("hash", 8), ("link", 2), ("region", 4), ("probes", 4),
                          ("cycles", 4)))

#: Request layouts (the fixed part; see :data:`TAILS` for what follows it).
REQUESTS = {
    Op.PING: _EMPTY,
    Op.VERSION: _EMPTY,
    Op.CONFIG_DIGEST: _EMPTY,
    Op.STATS: _EMPTY,
    Op.STATS_CLEAR: _EMPTY,
    Op.SESSION_BEGIN: _EMPTY,
    Op.TOKENS_WRITE: Layout((("offset", 4), ("n", 2))),
    Op.TOKENS_APPEND: Layout((("n", 2),)),
    Op.TOKENS_READ: Layout((("offset", 4), ("n", 2))),
    Op.HASH_QUERY: Layout((("n", 4),)),
    Op.DIR_LOOKUP: Layout((("count", 4), ("hash", 8))),
    Op.DIR_INSERT: Layout((("count", 4), ("hash", 8), ("region", 4), ("flags", 1))),
    Op.DIR_DELETE: Layout((("link", 2),)),
    Op.DIR_TOUCH: Layout((("link", 2),)),
    Op.DIR_EXPIRE: Layout((("max_age", 4),)),
    Op.DIR_READ: Layout((("link", 2),)),
    Op.DIR_CLEAR: Layout((("next_seq", 4),)),     # or an empty payload: keep the sequence
    Op.QUERY: Layout((("n", 4),)),
    Op.EXPORT: Layout((("n", 4), ("kind", 1))),     # kind: ringkv.defs.record.RecordKind
    Op.ALLOC_STATUS: _EMPTY,
    Op.QUERY_PREFIX: Layout((("n", 4),)),
    Op.ATTN_DECODE: Layout((("layer", 1), ("flags", 1), ("count", 2))),
    Op.ATTN_PREFILL: Layout((("layer", 1), ("flags", 1), ("count", 2))),
    Op.RING_CLEAR: Layout((("layer", 1),)),
    Op.RING_READ: Layout((("addr", 4), ("n", 2), ("what", 1))),
    Op.SECTOR_READ: Layout((("lba", 4),)),
    Op.STORAGE_REBUILD: _EMPTY,
    Op.STORAGE_STATUS: _EMPTY,
    Op.STORAGE_INFO: _EMPTY,
    # tests: ringkv.defs.sdram.BistTest bits; words of the full pattern (0: the whole part);
    # pause_ms: the retention test's pause
    Op.SDRAM_TEST: Layout((("tests", 1), ("words", 4), ("pause_ms", 2))),
    Op.KEY_SET: Layout((("slot", 1), ("key_id", 2))),      # then the key: KEY_BYTES bytes
    Op.KEY_CLEAR: Layout((("slot", 1),)),
}

#: Response layouts (the fixed part).
RESPONSES = {
    Op.PING: _EMPTY,
    Op.VERSION: Layout((("protocol", 2), ("gateware", 2), ("max_payload", 2), ("lanes", 1),
                        ("macs", 1), ("regions", 4), ("links", 4), ("buckets", 4),
                        ("sectors_per_region", 4), ("base_lba", 4), ("hash_width", 1),
                        ("token_bytes", 1))),
    Op.CONFIG_DIGEST: Layout((("digest", 32, "bytes"), ("fields", 36, "bytes"))),
    Op.STATS: Layout((("cycles", 8), ("attn_cycles", 8), ("dma_cycles", 8), ("dir_cycles", 8),
                      ("frames", 4), ("frame_errors", 4), ("rejected", 4), ("queries", 4),
                      ("hits", 4), ("exports", 4))),
    Op.STATS_CLEAR: _EMPTY,
    Op.SESSION_BEGIN: _EMPTY,
    Op.TOKENS_WRITE: Layout((("count", 4),)),
    Op.TOKENS_APPEND: Layout((("count", 4),)),
    Op.TOKENS_READ: _EMPTY,
    Op.HASH_QUERY: Layout((("hash", 8),)),
    Op.DIR_LOOKUP: DIR_RESPONSE,
    Op.DIR_INSERT: DIR_RESPONSE,
    Op.DIR_DELETE: DIR_RESPONSE,
    Op.DIR_TOUCH: DIR_RESPONSE,
    Op.DIR_EXPIRE: DIR_RESPONSE,
    Op.DIR_READ: DIR_RESPONSE,
    Op.DIR_CLEAR: DIR_RESPONSE,
    Op.QUERY: SNAPSHOT_RESPONSE,
    Op.EXPORT: SNAPSHOT_RESPONSE,
    Op.ALLOC_STATUS: Layout((("fifo_a", 4), ("fifo_b", 4), ("live", 4), ("commit_seq", 4),
                             ("token_count", 4), ("dir_now", 4))),
    Op.QUERY_PREFIX: PREFIX_RESPONSE,
    Op.ATTN_DECODE: _EMPTY,
    Op.ATTN_PREFILL: _EMPTY,
    Op.RING_CLEAR: _EMPTY,
    Op.RING_READ: _EMPTY,
    Op.SECTOR_READ: _EMPTY,
    Op.STORAGE_REBUILD: RECOVERY_STATUS,
    Op.STORAGE_STATUS: RECOVERY_STATUS,
    Op.STORAGE_INFO: STORAGE_INFO,
    Op.SDRAM_TEST: SDRAM_TEST_RESPONSE,
    Op.KEY_SET: _EMPTY,           # status only: no key material ever goes back
    Op.KEY_CLEAR: _EMPTY,
}

#: What follows the fixed part, per op: ``(request tail, response tail)`` in words.
TAILS = {
    Op.PING: ("any bytes", "the request's bytes"),
    Op.TOKENS_WRITE: ("n tokens", ""),
    Op.TOKENS_APPEND: ("n tokens", ""),
    Op.TOKENS_READ: ("", "n tokens"),
    Op.ATTN_DECODE: ("q/k/v of 1 token (attn_in_bytes)", "outputs (attn_out_bytes)"),
    Op.ATTN_PREFILL: ("q/k/v of count tokens", "outputs of count tokens"),
    Op.RING_READ: ("", "n ring bytes (EB per element), or n x (count u32, head u16)"),
    Op.SECTOR_READ: ("", "512 bytes"),
    Op.KEY_SET: ("the key (32 bytes)", ""),
}

#: The opcodes the gateware executes (:data:`KEY_OPS` in sealed builds only, :data:`SDRAM_OPS`
#: in builds with the SDRAM self-test only); the others
#: (IMPORT: QUERY imports on a hit) are answered UNKNOWN_OP.
IMPLEMENTED = frozenset(REQUESTS)


class Length(enum.Enum):
    """How a request's payload length is checked against its layout (``BAD_LENGTH`` if not)."""

    EXACT = "exact"          #: exactly the layout
    TAIL = "tail"            #: the layout, then a tail whose length the op's handler checks
    OPTIONAL = "optional"    #: empty, or exactly the layout
    ANY = "any"              #: any length (PING: echoed)


#: The length rule of every implemented request (:class:`Length`).
LENGTH = {op: Length.EXACT for op in REQUESTS} | {
    Op.PING: Length.ANY,
    Op.DIR_CLEAR: Length.OPTIONAL,       # empty: keep the commit sequence
    Op.TOKENS_WRITE: Length.TAIL,
    Op.TOKENS_APPEND: Length.TAIL,
    Op.ATTN_DECODE: Length.TAIL,
    Op.ATTN_PREFILL: Length.TAIL,
    Op.KEY_SET: Length.TAIL,             # exactly the key: the unit checks, BAD_LENGTH
}

#: Bytes of ``KEY_SET``'s tail: the key.
KEY_SET_TAIL = KEY_BYTES
#: Requests only a sealed build executes (an open build has no key slots: ``UNKNOWN_OP``).
KEY_OPS = frozenset({Op.KEY_SET, Op.KEY_CLEAR})
#: Requests only a build with the SDRAM self-test executes (``RingKVTop(sdram_test=True)``; any
#: other build answers ``UNKNOWN_OP``).
SDRAM_OPS = frozenset({Op.SDRAM_TEST})
#: Requests that carry a tenant slot in a sealed build: the open layout, then ``slot`` (u8).
TENANT_OPS = frozenset({Op.QUERY, Op.QUERY_PREFIX, Op.EXPORT})
#: The sealed build's layouts of :data:`TENANT_OPS`: the open layout followed by the tenant's
#: key slot. The slot selects the hash seed (the tenant's), the key that seals an export and
#: the key an import must verify under; a slot ``>= KEY_SLOTS`` is ``BAD_ARG``, a slot without
#: a key ``NO_KEY``, before anything is done.
SEALED_REQUESTS = {op: Layout(REQUESTS[op].fields + (("slot", 1),))
                   for op in sorted(TENANT_OPS, key=lambda o: o.value)}


def build_requests(sealed: bool, sdram_test: bool = False) -> dict:
    """The request layouts a build executes: an open build every op of :data:`REQUESTS` but
    :data:`KEY_OPS`; a sealed build every op, :data:`TENANT_OPS` with their
    :data:`SEALED_REQUESTS` layouts; :data:`SDRAM_OPS` only with ``sdram_test``. The length
    rules are :data:`LENGTH`'s in all."""
    skip = set() if sdram_test else set(SDRAM_OPS)
    if sealed:
        return {op: SEALED_REQUESTS.get(op, lay) for op, lay in REQUESTS.items()
                if op not in skip}
    return {op: lay for op, lay in REQUESTS.items() if op not in KEY_OPS | skip}


def attn_in_bytes(config: RingKVConfig, count: int) -> int:
    """Tail bytes of an ATTN request of ``count`` tokens: q (Hq) + k, v (Hkv) vectors of ``EB``
    bytes per element (int8 for ``ringkv-fx1``, int16 for ``ringkv-fx2``)."""
    return count * (config.q_heads + 2 * config.kv_heads) * config.head_dim * elem_bytes(config)


def attn_out_bytes(config: RingKVConfig, count: int) -> int:
    """Response bytes of an ATTN request: int16 outputs of Hq heads per token."""
    return count * config.q_heads * config.head_dim * 2


def max_attn_tokens(config: RingKVConfig, max_payload: int) -> int:
    """Most tokens per ATTN frame such that request and response fit ``max_payload``."""
    fixed = REQUESTS[Op.ATTN_PREFILL].size
    per_in = attn_in_bytes(config, 1)
    per_out = attn_out_bytes(config, 1)
    return max(0, min((max_payload - fixed) // per_in, max_payload // per_out, 0xFFFF))
