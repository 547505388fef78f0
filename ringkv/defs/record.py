"""The snapshot record format, defined once for the DMA engine and the host.

The byte layout (``docs/blocks/record-format.md``, whose header table ``tools/doc_tables.py``
writes from :data:`HEADER_FIELDS`): region sector 0 is the 512-byte **header**
(:data:`HEADER_FIELDS`, header CRC last); sectors ``1 .. 1+T`` the **tokens**; then the **KV
area**, K then V, each area zero padded to a sector boundary (:class:`RecordLayout` gives the
sector map of a configuration). The gateware (:mod:`ringkv.hw.storage.dma`) writes and checks
exactly these bytes; the golden encoder/decoder and the scan are :mod:`ringkv.host.record`.

The commit sequence number (``commit_seq``, 32 bits) orders the records of one store: each
export takes the next number, modulo 2**32. "Newer" is serial-number arithmetic in the manner
of RFC 1982 (:func:`seq_newer`): ``a`` is newer than ``b`` when ``(a - b) mod 2**32`` is in
``1 .. 2**31 - 1``. This is well defined for records committed fewer than 2**31 exports apart;
a freed region is overwritten within ``regions`` exports once FIFO A is spent, so a store of at
most 2**15 regions never holds two records of one key further apart. :func:`seq_newest` picks
the newest of a set, :func:`seq_next` the number after it.
"""

import enum
from dataclasses import dataclass

from .config import DEFAULT_CONFIG, RingKVConfig
from .crc import CrcSpec
from .numerics import NUMERICS_TABLE

__all__ = [
    "SECTOR", "MAGIC", "VERSION", "NUMERICS_BYTES", "FRACS_LAYERS_MAX", "HEADER_FIELDS",
    "HEADER_OFFSETS", "encode_fracs", "decode_fracs",
    "CONFIG_FIELDS", "CONST_RANGES", "RecordKind", "RecordStatus", "RECORD_STATUS_BITS",
    "RECORD_CRC", "MAC_HEADER_BYTES", "mac_message",
    "SEQ_BITS", "SEQ_MOD", "seq_newer", "seq_next", "seq_newest", "elem_bytes", "token_bytes",
    "kv_bytes_of", "ring_elements", "ring_space", "ring_bytes", "RecordLayout", "put_field",
    "header_template",
]

SECTOR = 512
MAGIC = b"RINGKVSN"
VERSION = 1
NUMERICS_BYTES = 16
#: A per-layer numerics' fractions take 3 bytes per layer in the header: at most this many layers.
FRACS_LAYERS_MAX = 64

#: ``(name, offset, size)`` of every header field; the rest of the header is zero.
HEADER_FIELDS = (
    ("magic", 0, 8),
    ("version", 8, 2),
    ("header_bytes", 10, 2),
    ("commit_seq", 12, 4),
    ("config_digest", 16, 32),
    ("prefix_hash", 48, 8),
    ("count", 56, 4),
    ("ring_head", 60, 4),
    ("token_bytes", 64, 4),
    ("k_bytes", 68, 4),
    ("v_bytes", 72, 4),
    ("payload_crc", 76, 4),
    ("layers", 80, 2),
    ("q_heads", 82, 2),
    ("kv_heads", 84, 2),
    ("head_dim", 86, 2),
    ("window", 88, 4),
    ("token_width", 92, 2),
    ("kind", 94, 2),            # RecordKind; 0 in records written before kinds existed
    ("max_tokens", 96, 4),
    ("numerics", 100, NUMERICS_BYTES),
    ("qkv_fracs", 116, 3 * FRACS_LAYERS_MAX),
    ("mac_tag", 308, 16),       # keyed BLAKE2s tag of a sealed record (MAC_SCOPE); 0 if open
    ("key_id", 324, 2),         # id of the key that made mac_tag; 0 (KEY_ID_NONE): open record
    ("header_crc", 508, 4),
)
#: ``{name: (offset, size)}`` of every header field.
HEADER_OFFSETS = {name: (off, size) for name, off, size in HEADER_FIELDS}
#: Config fields stored in the header (besides the digest), in header order. ``qkv_fracs`` (a
#: per-layer numerics' fractions, :func:`encode_fracs`) follows them, all zero for the others;
#: the gateware compares only :data:`CONST_RANGES` (the digest covers the fractions).
CONFIG_FIELDS = ("layers", "q_heads", "kv_heads", "head_dim", "window", "token_width",
                 "max_tokens", "numerics")
#: Byte ranges the gateware compares against its own constant header bytes (the config fields
#: around ``kind``, which is a variable field covered by the header CRC).
CONST_RANGES = {"magic": (0, 8), "version": (8, 12), "config": (16, 48),
                "config_fields": (80, 94), "config_fields_tail": (96, 116)}


class RecordKind(enum.Enum):
    """``kind`` of a record (header offset 94, set by ``EXPORT``'s ``kind`` argument).

    Informative: every kind is the state at its token count and imports alike; the host uses it
    to tell a session's turn snapshots from prefix checkpoints. Records written before kinds
    existed hold 0, a turn snapshot. Other values are not refused (the header CRC covers them);
    the host shows them as numbers.
    """
    TURN = 0          #: a session's snapshot at the end of a turn
    CHECKPOINT = 1    #: a checkpoint at a prefix boundary (shared system prompt, document)


#: Bits of :class:`RecordStatus` in the gateware.
RECORD_STATUS_BITS = 4
#: The bytes of a header the record MAC covers: all but the ``header_crc`` (computed after the
#: tag is written, over the header with the tag). ``mac_tag`` itself is read as zeros.
MAC_HEADER_BYTES = 508
#: The header and payload CRC.
RECORD_CRC = CrcSpec("CRC32_ISO_HDLC", width=32, polynomial=0x04C11DB7, initial=0xFFFFFFFF,
                     reflect=True, xor_output=0xFFFFFFFF)
#: Width of ``commit_seq``; sequence numbers are taken modulo :data:`SEQ_MOD`.
SEQ_BITS = 32
SEQ_MOD = 1 << SEQ_BITS


class RecordStatus(enum.Enum):
    """Result of an export, import or verify; shared by ``hw/storage/dma.py`` and the host.

    Order of precedence when several apply (gateware and golden model agree): STORAGE, BAD_REQUEST,
    EMPTY, BAD_VERSION, BAD_HEADER, FOREIGN_CONFIG, NO_KEY, NOT_THIS, TOKEN_MISMATCH,
    BAD_PAYLOAD_CRC, BAD_MAC. ``NO_KEY`` is decided from the header alone (before any payload
    byte is read); ``BAD_MAC`` after the whole record has gone through the MAC.
    """
    OK = 0
    STORAGE = 1          #: the storage port reported an error (SD timeout, CRC, ...)
    BAD_REQUEST = 2      #: region out of range, or ring metadata inconsistent/too long (export)
    EMPTY = 3            #: no record: wrong magic (never written, or torn header)
    BAD_VERSION = 4      #: magic right, format version or header size unknown
    BAD_HEADER = 5       #: header CRC wrong, or header fields inconsistent with each other
    FOREIGN_CONFIG = 6   #: written under another configuration (digest or fields differ)
    NOT_THIS = 7         #: valid record, but count or prefix hash differ from the request
    TOKEN_MISMATCH = 8   #: stored tokens differ from the session's tokens (hash collision)
    BAD_PAYLOAD_CRC = 9  #: payload CRC wrong (flipped bits, torn payload)
    NO_KEY = 10          #: the record's key id is not held for this request (a sealed record
    #:                     on an open device or under another tenant, an open record on a
    #:                     sealed one, a retired key)
    BAD_MAC = 11         #: the record's tag does not verify under the key with its key id


def seq_newer(a: int, b: int) -> bool:
    """Whether commit sequence ``a`` is newer than ``b`` (RFC 1982 serial-number order)."""
    return 0 < (a - b) % SEQ_MOD < SEQ_MOD // 2


def seq_next(a: int) -> int:
    """The commit sequence number after ``a`` (wraps from 2**32 - 1 to 0)."""
    return (a + 1) % SEQ_MOD


def seq_newest(seqs) -> int | None:
    """The newest of ``seqs`` in serial-number order (``None`` for none).

    The sequence numbers of a store lie on an arc of the 2**32 circle shorter than half of it
    (see the module docstring); the newest is the one at the arc's end, just before the largest
    gap. Defined (and deterministic) for any input: with no such arc, it is the number before
    the largest gap, ties broken by the highest value.
    """
    values = sorted({int(s) % SEQ_MOD for s in seqs})
    if not values:
        return None
    best, best_gap = values[-1], (values[0] - values[-1]) % SEQ_MOD or SEQ_MOD
    for lo, hi in zip(values, values[1:]):
        if hi - lo > best_gap:
            best, best_gap = lo, hi - lo
    return best


def _ceil_div(a, b):
    return -(-a // b)


def elem_bytes(config: RingKVConfig) -> int:
    """Bytes per K/V element of ``config.numerics`` (1 for ``ringkv-fx1``, 2 for ``ringkv-fx2``).

    Raises ``ValueError`` for a numerics name this software does not know: there is no record
    layout for it.
    """
    numerics = NUMERICS_TABLE.get(config.numerics)
    if numerics is None:
        raise ValueError(f"unknown numerics {config.numerics!r} (known: "
                         f"{', '.join(sorted(NUMERICS_TABLE))}): no record layout for it")
    return numerics.elem_bytes


def token_bytes(config: RingKVConfig) -> int:
    """Bytes per stored or transferred token: ``ceil(token_width / 8)``."""
    return _ceil_div(config.token_width, 8)


def kv_bytes_of(config: RingKVConfig, count: int) -> int:
    """K plus V bytes of a record of ``count`` tokens (``EB`` bytes per element)."""
    return (2 * config.layers * config.kv_heads * min(count, config.window) * config.head_dim
            * elem_bytes(config))


def ring_space(layers: int, kv_heads: int, window: int, head_dim: int,
               elem_bytes: int = 1) -> int:
    """Bytes behind the attention core's byte-addressed ring port (its address space):
    ``layers * kv_heads`` rings, each a K and a V ring of ``window`` slots of ``head_dim``
    elements of ``elem_bytes`` bytes. With ``elem_bytes = 1``: the number of elements."""
    return layers * kv_heads * 2 * window * head_dim * elem_bytes


def ring_elements(config: RingKVConfig) -> int:
    """K/V elements in all rings: ``layers * kv_heads * 2 * window * head_dim``."""
    return ring_space(config.layers, config.kv_heads, config.window, config.head_dim)


def ring_bytes(config: RingKVConfig) -> int:
    """Bytes of all rings (:func:`ring_elements` times :func:`elem_bytes`): the ring port's
    address space."""
    return ring_space(config.layers, config.kv_heads, config.window, config.head_dim,
                      elem_bytes(config))


@dataclass(frozen=True)
class RecordLayout:
    """Sizes and sector map of records for one configuration."""
    config: RingKVConfig = DEFAULT_CONFIG

    @property
    def token_bytes(self) -> int:
        """Bytes per stored token (:func:`token_bytes`)."""
        return token_bytes(self.config)

    @property
    def token_sectors_max(self) -> int:
        return _ceil_div(self.config.max_tokens * self.token_bytes, SECTOR)

    def __post_init__(self):
        elem_bytes(self.config)            # an unknown numerics has no layout

    @property
    def elem_bytes(self) -> int:
        """Bytes per K/V element (:func:`elem_bytes`)."""
        return elem_bytes(self.config)

    @property
    def kv_bytes_max(self) -> int:
        c = self.config
        return 2 * c.layers * c.kv_heads * c.window * c.head_dim * self.elem_bytes

    @property
    def kv_sectors_max(self) -> int:
        return _ceil_div(self.kv_bytes_max, SECTOR)

    @property
    def kv_sector(self) -> int:
        """Offset of the KV area from the region's first sector."""
        return 1 + self.token_sectors_max

    @property
    def sectors_per_region(self) -> int:
        return 1 + self.token_sectors_max + self.kv_sectors_max

    def region_lba(self, region: int) -> int:
        return region * self.sectors_per_region

    def valid_slots(self, count: int) -> int:
        return min(count, self.config.window)

    def token_sectors(self, count: int) -> int:
        return _ceil_div(count * self.token_bytes, SECTOR)

    def kv_sectors(self, count: int) -> int:
        return _ceil_div(kv_bytes_of(self.config, count), SECTOR)

    def record_bytes(self, count: int) -> int:
        """Bytes actually written by an export of ``count`` tokens (header + padded areas)."""
        return SECTOR * (1 + self.token_sectors(count) + self.kv_sectors(count))


def put_field(buf, name, value):
    """Write header field ``name`` (an integer, little-endian, or bytes, zero padded)."""
    off, size = HEADER_OFFSETS[name]
    if isinstance(value, bytes | bytearray):
        buf[off:off + size] = bytes(value).ljust(size, b"\0")[:size]
    else:
        buf[off:off + size] = int(value).to_bytes(size, "little")



def encode_fracs(config: RingKVConfig) -> bytes:
    """The ``qkv_fracs`` header field: ``Fq, Fk, Fv`` of layer 0, then of layer 1, ... one byte
    each (empty for a numerics with fixed scales; the field is zero padded)."""
    if len(config.qkv_fracs) > FRACS_LAYERS_MAX:
        raise ValueError(f"a record header holds the fractions of at most {FRACS_LAYERS_MAX} "
                         f"layers, not {len(config.qkv_fracs)}")
    return bytes(f for t in config.qkv_fracs for f in t)


def decode_fracs(buf, layers: int) -> tuple:
    """The ``qkv_fracs`` of ``layers`` layers from a header ``buf`` (:func:`encode_fracs`)."""
    off, size = HEADER_OFFSETS["qkv_fracs"]
    raw = bytes(buf[off:off + min(size, 3 * layers)])
    return tuple(tuple(raw[i:i + 3]) for i in range(0, len(raw) - len(raw) % 3, 3))


def header_template(config: RingKVConfig = DEFAULT_CONFIG) -> bytes:
    """The header bytes that depend only on the configuration (variable fields zero, no CRC).

    The gateware builds its constant header bytes from this, so the two cannot drift apart.
    """
    numerics = config.numerics.encode("ascii")
    if len(numerics) > NUMERICS_BYTES:
        raise ValueError(f"numerics name longer than {NUMERICS_BYTES} bytes: {config.numerics!r}")
    buf = bytearray(SECTOR)
    put_field(buf, "magic", MAGIC)
    put_field(buf, "version", VERSION)
    put_field(buf, "header_bytes", SECTOR)
    put_field(buf, "config_digest", config.digest())
    for name in CONFIG_FIELDS[:-1]:
        put_field(buf, name, getattr(config, name))
    put_field(buf, "numerics", numerics)
    put_field(buf, "qkv_fracs", encode_fracs(config))
    return bytes(buf)


def mac_message(token_bytes: bytes, kv_bytes: bytes, header: bytes) -> bytes:
    """The bytes a record's tag covers, in the order the DMA moves them: the record's token
    bytes, then its K/V bytes (record order, unpadded), then header bytes ``0 ..
    MAC_HEADER_BYTES - 1`` with ``mac_tag`` read as zeros (so every other header field is
    covered, ``payload_crc`` and ``key_id`` included)."""
    off, size = HEADER_OFFSETS["mac_tag"]
    head = bytearray(header[:MAC_HEADER_BYTES])
    head[off:off + size] = bytes(size)
    return bytes(token_bytes) + bytes(kv_bytes) + bytes(head)
