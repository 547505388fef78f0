"""The link protocol's constants, defined once for the gateware and the host.

``Op`` (request opcodes) and ``Status`` (response codes) are ``amaranth.lib.enum`` enums with an
8-bit shape: the frame decoder compares against them in gateware, the host packs
``Op.PING.value`` with :mod:`struct`. The byte layout of a frame is documented in
``docs/blocks/link.md`` and implemented twice, bit-exactly: :mod:`ringkv.hw.framing` (RTL) and
:mod:`ringkv.host.protocol` (golden model).

Request::

    SYNC op seq len_lo len_hi payload[len] crc_hi crc_lo

Response::

    SYNC op|0x80 seq status len_lo len_hi payload[len] crc_hi crc_lo

The CRC is CRC-16/XMODEM (``amaranth.lib.crc.catalog.CRC16_XMODEM``: polynomial 0x1021, initial
value 0, no reflection, no final XOR) over every byte after SYNC up to the end of the payload,
sent most significant byte first, so that running the CRC over the CRC bytes too leaves the
residue 0.
"""

from amaranth.lib import crc, enum

__all__ = ["Op", "Status", "SYNC", "RESPONSE_FLAG", "DEFAULT_MAX_PAYLOAD", "CRC16",
           "REQUEST_OVERHEAD", "RESPONSE_OVERHEAD", "PROTOCOL_VERSION", "IDEMPOTENT_OPS"]

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
PROTOCOL_VERSION = 1
#: The frame CRC, with a software ``compute()`` for the host.
CRC16 = crc.catalog.CRC16_XMODEM(data_width=8)


class Op(enum.Enum, shape=8):
    """Request opcodes of the whole system (bit 7 clear; a response sets it).

    Grouped by block in the high nibble. Payload layouts per opcode are in
    ``docs/blocks/link.md``.
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
    # snapshot store (seed 001): query = hash + lookup + token verification
    QUERY          = 0x30
    IMPORT         = 0x31
    EXPORT         = 0x32
    ALLOC_STATUS   = 0x33   # levels of the two address FIFOs
    # SWA attention core
    ATTN_DECODE    = 0x40   # one decode step of one layer
    ATTN_PREFILL   = 0x41   # one prefill chunk of one layer
    RING_CLEAR     = 0x42   # empty the ring buffers
    RING_READ      = 0x43   # read ring slots back (inspection, tests)
    # storage
    SECTOR_READ    = 0x50   # raw sector, for inspection and directory rebuild
    STORAGE_REBUILD = 0x51  # rebuild the directory by scanning record headers


class Status(enum.Enum, shape=8):
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
    INTERNAL       = 0x0F


#: Operations a host may repeat after a lost or corrupted response without changing the result.
IDEMPOTENT_OPS = frozenset({
    Op.PING, Op.VERSION, Op.CONFIG_DIGEST, Op.STATS, Op.TOKENS_WRITE, Op.TOKENS_READ,
    Op.HASH_QUERY, Op.DIR_LOOKUP, Op.DIR_READ, Op.QUERY, Op.ALLOC_STATUS, Op.RING_READ,
    Op.SECTOR_READ,
})
