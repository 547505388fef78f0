"""Host codecs of the request and response tails: tokens and attention elements.

The fixed part of every payload is a :class:`ringkv.defs.protocol.Layout` of
:data:`ringkv.defs.protocol.REQUESTS` / :data:`~ringkv.defs.protocol.RESPONSES`; what follows it
(the *tail*: tokens, q/k/v elements, outputs) is packed and unpacked here, in the byte order
the gateware (:mod:`ringkv.hw.top`) streams.
"""

import numpy as np

from ringkv.defs.config import RingKVConfig
from ringkv.defs.protocol import REQUESTS, Op
from ringkv.defs.record import elem_bytes, token_bytes

__all__ = ["pack_attn", "unpack_attn", "pack_tokens", "unpack_tokens"]


def pack_tokens(config: RingKVConfig, tokens) -> bytes:
    tb = token_bytes(config)
    return b"".join(int(t).to_bytes(tb, "little") for t in tokens)


def unpack_tokens(config: RingKVConfig, data: bytes) -> list[int]:
    tb = token_bytes(config)
    return [int.from_bytes(data[i:i + tb], "little") for i in range(0, len(data), tb)]


def pack_attn(config: RingKVConfig, layer: int, q, k, v, *, decode: bool = False) -> bytes:
    """ATTN request payload from q/k/v integers ``q`` (C, Hq, d), ``k``/``v`` (C, Hkv, d) of the
    configuration's numerics (int8 for ``ringkv-fx1``, int16 for ``ringkv-fx2``).

    Tail order = the attention core's input order, one command per KV head: for each KV head
    ``h``, for each token ``t``: the ``G`` query vectors of heads ``h*G .. h*G+G-1``, then
    ``k[t, h]``, then ``v[t, h]``; element 0 first, each element as ``EB`` bytes of its two's
    complement, little-endian (so the core's ``i`` beats of M elements are M*EB consecutive
    bytes, element 0 at the LSB).
    """
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
    c, g = config, config.group
    raw = np.frombuffer(bytes(data), dtype="<i2").astype(np.int64)
    raw = raw.reshape(c.kv_heads, count, g, c.head_dim)
    return np.transpose(raw, (1, 0, 2, 3)).reshape(count, c.q_heads, c.head_dim)
