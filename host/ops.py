"""Per-opcode payload layouts of the command front end, defined once for gateware and host.

Every request and response payload of :class:`ringkv.hw.protocol.Op` is a fixed little-endian
record (:class:`Layout`), optionally followed by a variable *tail* (tokens, attention elements,
sector bytes). ``hw/top.py`` takes its argument offsets and its response packing from the
tables below (:data:`REQUESTS`, :data:`RESPONSES`), ``host/fpga_device.py`` and the tests pack
and unpack with them, so the two sides cannot drift apart. ``docs/blocks/top.md`` renders the
same tables.

Integers are unsigned little-endian; a field whose kind is ``"bytes"`` is a raw byte string.
"""

from dataclasses import dataclass

from ..hw.protocol import Op
from .config import RingKVConfig
from .record import elem_bytes

__all__ = ["Layout", "REQUESTS", "RESPONSES", "TAILS", "IMPLEMENTED", "DIR_RESPONSE",
           "SNAPSHOT_RESPONSE", "NO_RECORD", "RING_CLEAR_ALL", "FLAG_EVICT", "FLAG_EXISTING",
           "RING_ELEMENTS", "RING_META", "META_BYTES", "GATEWARE_VERSION", "attn_in_bytes",
           "attn_out_bytes", "max_attn_tokens", "pack_attn", "unpack_attn", "pack_tokens",
           "unpack_tokens", "token_bytes", "elem_bytes"]

#: Reported by ``Op.VERSION``; bump when the gateware's behaviour changes.
GATEWARE_VERSION = 1
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
#: The response of QUERY and EXPORT.
SNAPSHOT_RESPONSE = Layout((("record_status", 1), ("dir_status", 1), ("link", 2), ("region", 4),
                            ("count", 4), ("hash", 8), ("bytes", 4), ("cycles", 4),
                            ("seq", 4)))

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
    Op.EXPORT: Layout((("n", 4),)),
    Op.ALLOC_STATUS: _EMPTY,
    Op.ATTN_DECODE: Layout((("layer", 1), ("flags", 1), ("count", 2))),
    Op.ATTN_PREFILL: Layout((("layer", 1), ("flags", 1), ("count", 2))),
    Op.RING_CLEAR: Layout((("layer", 1),)),
    Op.RING_READ: Layout((("addr", 4), ("n", 2), ("what", 1))),
    Op.SECTOR_READ: Layout((("lba", 4),)),
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
    Op.ATTN_DECODE: _EMPTY,
    Op.ATTN_PREFILL: _EMPTY,
    Op.RING_CLEAR: _EMPTY,
    Op.RING_READ: _EMPTY,
    Op.SECTOR_READ: _EMPTY,
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
}

#: The opcodes the gateware executes; the others (IMPORT: QUERY imports on a hit;
#: STORAGE_REBUILD: the host rebuilds, see ``FpgaDevice.rebuild``) are answered UNKNOWN_OP.
IMPLEMENTED = frozenset(REQUESTS)


def token_bytes(config: RingKVConfig) -> int:
    return (config.token_width + 7) // 8


def pack_tokens(config: RingKVConfig, tokens) -> bytes:
    tb = token_bytes(config)
    return b"".join(int(t).to_bytes(tb, "little") for t in tokens)


def unpack_tokens(config: RingKVConfig, data: bytes) -> list[int]:
    tb = token_bytes(config)
    return [int.from_bytes(data[i:i + tb], "little") for i in range(0, len(data), tb)]


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


def pack_attn(config: RingKVConfig, layer: int, q, k, v, *, decode: bool = False) -> bytes:
    """ATTN request payload from q/k/v integers ``q`` (C, Hq, d), ``k``/``v`` (C, Hkv, d) of the
    configuration's numerics (int8 for ``ringkv-fx1``, int16 for ``ringkv-fx2``).

    Tail order = the attention core's input order, one command per KV head: for each KV head
    ``h``, for each token ``t``: the ``G`` query vectors of heads ``h*G .. h*G+G-1``, then
    ``k[t, h]``, then ``v[t, h]``; element 0 first, each element as ``EB`` bytes of its two's
    complement, little-endian (so the core's ``i`` beats of M elements are M*EB consecutive
    bytes, element 0 at the LSB).
    """
    import numpy as np
    eb = elem_bytes(config)
    q, k, v = (np.asarray(x, dtype=np.int64) for x in (q, k, v))
    count, g = len(k), config.group
    out = bytearray(REQUESTS[Op.ATTN_PREFILL].pack(layer=layer, count=count))
    mask = (1 << (8 * eb)) - 1
    for h in range(config.kv_heads):
        # (count, G + 2, d): the G query vectors, k, v of each token, in the core's order
        vecs = np.concatenate([q[:, h * g:(h + 1) * g], k[:, h, None], v[:, h, None]], axis=1)
        out += (vecs & mask).astype(f"<u{eb}").tobytes()
    return bytes(out)


def unpack_attn(config: RingKVConfig, data: bytes, count: int):
    """int16 outputs (C, Hq, d) from an ATTN response payload (order: KV head, token, group
    member, element; little-endian int16)."""
    import numpy as np
    c, g = config, config.group
    raw = np.frombuffer(bytes(data), dtype="<i2").astype(np.int64)
    raw = raw.reshape(c.kv_heads, count, g, c.head_dim)
    return np.transpose(raw, (1, 0, 2, 3)).reshape(count, c.q_heads, c.head_dim)
