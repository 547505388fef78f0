"""Bit-exact golden model of the SWA attention core's fixed-point datapath.

The numerics table (:class:`~ringkv.defs.numerics.Numerics`, ``FX1``, ``FX2``, the exp table and
the shift constants) is :mod:`ringkv.defs.numerics`, shared with the gateware; this module is
the datapath those constants drive, integer for integer.

Three numerics, chosen per device (``RingKVConfig.numerics``, ``AttentionCore(numerics=...)``);
they differ only in the width and scale of q, k, v and of the output (:class:`Numerics`):

* ``ringkv-fx1`` (the default, int8 K/V): q, k, v int8 with real = x / 32, output
  int16 with real = o / 8192.
* ``ringkv-fx2`` (wide K/V, for accuracy): q, k, v int16 with real = x / 2048 (range
  -16 .. 16), output int16 with real = o / 2048 (the range of v, so a convex combination of
  v never saturates). Twice the ring memory, record and link bytes per element; the same
  multipliers (16 x 16 and 17 x 16 still fit one MULT18X18D).
* ``ringkv-fx1c`` (int8 with calibrated per-layer scales): fx1's datapath, with layer ``l``'s
  q, k, v in units ``2**-Fq``, ``2**-Fk``, ``2**-Fv`` (``RingKVConfig.qkv_fracs[l]``, passed as
  ``qkv_fracs``). The only change in the core is the score constant, per layer:
  ``CS_l = round(scale*log2(e)*2**(16 + 10 - Fq - Fk))`` (``DSH`` stays 0), so ``s`` is in
  the same base-2 log units; the output is in units ``2**-(Fv + 8)``. fx1 is the case
  ``(5, 5, 5)`` everywhere.

Every quantity is an integer; with ``EW`` the element width (8 or 16) and ``F`` the q/k/v
fraction bits (5 or 11):

=====================  ==========================  ==============================================
quantity               format                      meaning
=====================  ==========================  ==============================================
q, k, v                signed ``EW`` bits          real = x * 2**-F; the host quantizes with
                                                   round-half-even and clips
dot                    signed                      sum over d of q*k (units ``2**-2F``)
score ``s``            signed, units ``2**-8``     ``((dot >> DSH) * CS) >> 18`` with
                                                   ``DSH = 2F - 10`` (dot in units ``2**-10``):
                                                   the score in base-2 log units,
                                                   ``CS = round(scale*log2(e)*2**16)``
                                                   with ``scale = 1/sqrt(d)`` by default
exp weight ``p``       unsigned Q1.15              ``exp2_fx(m - s)``: ``T[y & 255] >> (y >> 8)``
                                                   with ``T[f] = round(2**15 * 2**(-f/256))``,
                                                   0 when ``y >> 8 >= 16``
lane sum ``l``         unsigned                    sum of ``p`` over the lane's valid slots
lane accumulator       signed                      sum of ``p * v`` over the lane's valid slots
merge weight alpha     unsigned Q1.15              ``exp2_fx(m - m_lane)``, 0 for an empty lane
output ``o``           int16                       real = o * 2**-(F + 16 - EW) (fx1: v units
                                                   with 8 more fraction bits; fx2: v units),
                                                   rounded, saturated
=====================  ==========================  ==============================================

Split-KV merge (the core's merge unit computes exactly this), with ``A = 18 - EW`` and
``B = EW - 2``:

``L = sum_lanes (l * alpha) >> 15``, ``e = bitlength(L)``, ``R = 2**(e+16) // L`` (17 bits),
``sh = bitlength(l) - A`` (so that ``a = acc >> sh`` fits 18 bits signed: ``|acc| <= l *
2**(EW-1)``), ``beta = min((alpha * R) >> max(e + B - sh, 0), 2**17 - 1)`` (18 bits signed;
equal to ``(alpha * R << sh) >> (e + B)``, the shift is never negative when ``alpha >= 1``),
``o = clamp((sum_lanes a * beta + 2**16) >> 17, -32768, 32767)``. For fx1 (A = 10, B = 6)
these are the formulas of the first version of the core, unchanged.

Every multiply of the hot loops has operands of at most 18 bits signed, so one MULT18X18D serves
each MAC of a lane in all three phases (q*k, p*v and a*beta).

The ring rule is Mixtral's ``slot = p % W`` expressed through the stored head:
the next token goes to ``(head + 1) % W``; an empty ring has ``head = W - 1``; the valid slots are
``0 .. min(n, W) - 1``. Lane ``l`` of ``P`` owns the contiguous slots ``l*S .. (l+1)*S - 1``,
``S = W / P``; a lane whose slots are all invalid is empty and contributes nothing.
"""

import math

import numpy as np

from ringkv.defs.numerics import (
    BETA_MAX,
    CS_SHIFT,
    EXP_TABLE,
    FX1,
    P_FRAC,
    layer_score_consts,
    numerics_of,
    score_const,
)

__all__ = [
    "NUMERICS", "QKV_FRAC", "OUT_FRAC",
    "quantize", "dequantize_out", "exp2_fx", "lane_state", "weight_term", "reciprocal_fx",
    "acc_shift", "beta_shift_amount", "beta_fx", "round_output", "merge_lanes",
    "attend_fx", "attend_indexed", "attend_rows", "ring_sources", "attend_float",
    "lane_segments", "FixedRingCore", "run_ops", "nrmse",
]

# the default numerics' constants (ringkv-fx1)
NUMERICS = FX1.name
QKV_FRAC = FX1.qkv_frac     # q, k, v: int8 with real = x * 2**-5
OUT_FRAC = FX1.out_frac     # output: int16 with real = o * 2**-13


def quantize(x, numerics=None, frac=None):
    """float array -> q/k/v integers with real = x * 2**-F (round half even, clipped to the
    element width); ``F`` is ``frac`` when given (a layer's fraction of ``ringkv-fx1c``), else
    the numerics' own."""
    nx = numerics_of(numerics)
    f = nx.qkv_frac if frac is None else frac
    return np.clip(np.rint(np.asarray(x, dtype=np.float64) * (1 << f)),
                   nx.qkv_min, nx.qkv_max).astype(np.int64)


def dequantize_out(o, numerics=None, v_frac=None):
    """int16 output -> float64 in the real units of v (whose fraction is ``v_frac`` when given,
    else the numerics' own)."""
    nx = numerics_of(numerics)
    f = nx.out_frac if v_frac is None else nx.out_frac_of(v_frac)
    return np.asarray(o, dtype=np.float64) / (1 << f)


def exp2_fx(y):
    """``2**(-y/256)`` in Q1.15 for integer ``y >= 0`` (scalar or array)."""
    y = np.asarray(y, dtype=np.int64)
    if np.any(y < 0):
        raise ValueError("exp2_fx argument must be non-negative")
    hi = y >> 8
    out = _EXP_TABLE[y & 255] >> np.minimum(hi, 16)
    return np.where(hi >= 16, 0, out)


_EXP_TABLE = np.array(EXP_TABLE, dtype=np.int64)
_EXP_TABLE32 = _EXP_TABLE.astype(np.int32)


def _exp2_fx32(y):
    """:func:`exp2_fx` of an int32 array known to be non-negative (the vectorized core's hot
    loop: half the memory traffic of int64; every value fits, ``y < 2**31``, ``2**15``)."""
    hi = y >> 8
    return np.where(hi >= 16, 0, _EXP_TABLE32[y & 255] >> np.minimum(hi, 16))


def lane_state(q, k, v, cs, numerics=None):
    """One lane's ``(m, l, acc)`` for queries ``q`` (G, d) over slots ``k``, ``v`` (n, d).

    Returns ``None`` for an empty lane (no valid slot).
    """
    q = np.asarray(q, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    v = np.asarray(v, dtype=np.int64)
    if len(k) == 0:
        return None
    dot = q @ k.T                                # (G, n)
    s = ((dot >> numerics_of(numerics).dot_shift) * cs) >> CS_SHIFT
    m = s.max(axis=1)                            # (G,)
    p = exp2_fx(m[:, None] - s)                  # (G, n)
    return m, p.sum(axis=1), p @ v               # (G,), (G,), (G, d)


def _bitlength(x):
    return int(x).bit_length()


def weight_term(lsum, alpha):
    """One lane's share of the merge's ``L``: ``(l * alpha) >> 15``."""
    return (int(lsum) * int(alpha)) >> P_FRAC


def reciprocal_fx(total):
    """The merge's ``(e, R)``: ``e = bitlength(L)``, ``R = 2**(e+16) // L`` for ``L >= 1``
    (``2**16 < R <= 2**17``)."""
    total = int(total)
    if total < 1:
        raise ValueError(f"reciprocal_fx needs L >= 1, not {total}")
    e = _bitlength(total)
    return e, (1 << (e + 16)) // total


def acc_shift(lsum, numerics=None):
    """A lane's ``sh = max(bitlength(l) - A, 0)``: ``acc >> sh`` fits 18 bits signed."""
    return max(_bitlength(lsum) - numerics_of(numerics).acc_shift_bits, 0)


def beta_shift_amount(e, sh, numerics=None):
    """The shift of ``alpha * R`` into a lane's ``beta``: ``max(e + B - sh, 0)``."""
    return max(e + numerics_of(numerics).beta_shift - sh, 0)


def beta_fx(alpha, recip, amt):
    """A lane's output weight ``beta = min((alpha * R) >> amt, 2**17 - 1)``."""
    return min((int(alpha) * int(recip)) >> amt, BETA_MAX)


def round_output(acc):
    """``clamp((acc + 2**16) >> 17, -32768, 32767)`` elementwise (the summed ``a * beta``)."""
    rounded = [(int(x) + (1 << 16)) >> 17 for x in acc]
    return np.clip(np.array(rounded, dtype=np.int64), -32768, 32767)


def merge_lanes(states, group, head_dim, numerics=None):
    """Merge lane states (``None`` = empty lane) into the int16 output (G, d)."""
    live = [s for s in states if s is not None]
    out = np.zeros((group, head_dim), dtype=np.int64)
    if not live:
        return out
    for g in range(group):
        m = max(int(s[0][g]) for s in live)
        terms = []
        total = 0
        for s in live:
            alpha = int(exp2_fx(m - int(s[0][g])))
            lsum = int(s[1][g])
            total += weight_term(lsum, alpha)
            terms.append((alpha, lsum, s[2][g]))
        e, recip = reciprocal_fx(total)
        acc = np.zeros(head_dim, dtype=object)
        for alpha, lsum, vec in terms:
            sh = acc_shift(lsum, numerics)
            # == ((alpha * recip) << sh) >> (e + B): e + B - sh >= 0 whenever alpha >= 1
            beta = beta_fx(alpha, recip, beta_shift_amount(e, sh, numerics))
            acc = acc + np.array([(int(x) >> sh) * beta for x in vec], dtype=object)
        out[g] = round_output(acc)
    return out


def attend_fx(q, k_ring, v_ring, valid, lanes, cs, numerics=None):
    """Decode attention of ``q`` (G, d) over ring slots ``0..valid-1`` split in ``lanes``.

    ``k_ring``/``v_ring`` are (W, d) q/k/v integers; returns the int16 output (G, d).
    """
    window = len(k_ring)
    seg = window // lanes
    states = []
    for lane in range(lanes):
        lo, hi = lane * seg, min((lane + 1) * seg, valid)
        states.append(lane_state(q, k_ring[lo:hi], v_ring[lo:hi], cs, numerics)
                      if hi > lo else None)
    return merge_lanes(states, len(q), k_ring.shape[1], numerics)


def _bitlength_array(x):
    """``int(v).bit_length()`` of every element of a non-negative int64 array (exact below
    2**53: ``frexp`` of the exactly converted value)."""
    return np.frexp(np.asarray(x, dtype=np.float64))[1].astype(np.int64)


def attend_indexed(k_src, v_src, index, valid, q, cs, lanes, numerics=None):
    """:func:`attend_fx` for many queries over many rings at once, integer for integer.

    ``k_src``/``v_src`` (B, S, d): the words each of ``B`` rings can hold (its slots before a
    chunk, then the chunk's own K/V); ``index`` (B, T, W): for each of a ring's ``T`` queries,
    the source of each of its ``W`` slots as that query sees them (:func:`ring_sources`);
    ``valid`` (B, T): the query attends slots ``0 .. valid - 1``; ``q`` (B, T, G, d); ``cs``
    the score constant (a scalar, or one per ring). Returns the int16 outputs (B, T, G, d):
    query ``t`` of ring ``b`` gives ``attend_fx(q[b, t], k_src[b, index[b, t]],
    v_src[b, index[b, t]], valid[b, t], lanes, cs)`` (tested bit for bit).

    The same datapath vectorized: the scores of every query against every source are one
    float64 product, then each query picks its slots' scores through ``index``; the lanes'
    ``p @ v`` is one product of the weights scattered back onto their sources. Both products
    are exact: every operand and partial sum is an integer below 2**53 (``|dot| <= d *
    2**(2 EW - 2)``; ``p * v <= 2**15 * 2**(EW - 1)`` summed over at most ``S`` sources); the
    merge runs on int64 (every intermediate below 2**40). A chunk's queries need no copy of
    the ring per query: a chunk of 64 tokens over a ring of 128 slots reads 192 sources.
    """
    nx = numerics_of(numerics)
    k_src = np.asarray(k_src, dtype=np.float64)
    n_rings, n_src, d = k_src.shape
    index = np.asarray(index, dtype=np.int64)
    _, n_q, window = index.shape
    seg = window // lanes
    q = np.asarray(q, dtype=np.float64)
    g = q.shape[2]
    valid = np.asarray(valid, dtype=np.int64).reshape(n_rings, n_q)
    cs = np.broadcast_to(np.asarray(cs, dtype=np.int64), (n_rings,))
    # scores of every query against every source, exact, then each query's slots
    dot = np.matmul(q.reshape(n_rings, n_q * g, d), k_src.transpose(0, 2, 1))
    dot = dot.astype(np.int64).reshape(n_rings, n_q, g, n_src)
    # s fits 32 bits (|s| < 2**17 in units 2**-8): the (B, T, G, L, S) arrays are int32
    s = (((dot >> nx.dot_shift) * cs[:, None, None, None]) >> CS_SHIFT).astype(np.int32)
    s = np.take_along_axis(s, index[:, :, None, :], axis=3)          # (B, T, G, W)
    s = s.reshape(n_rings, n_q, g, lanes, seg)
    slot = np.arange(window, dtype=np.int64).reshape(lanes, seg)
    mask = slot < valid[..., None, None]                              # (B, T, L, S)
    live = mask[..., 0]                                               # (B, T, L)
    low = np.iinfo(np.int64).min
    m_lane = np.where(mask[:, :, None], s, np.iinfo(np.int32).min).max(axis=4)
    y = np.where(mask[:, :, None], m_lane[..., None] - s, 0)
    p = np.where(mask[:, :, None], _exp2_fx32(y), 0)                  # (B, T, G, L, S)
    l_lane = p.sum(axis=4, dtype=np.int64)                            # (B, T, G, L)
    m_lane = m_lane.astype(np.int64)
    # p @ v per lane: the weights put back on their sources (a query's slots are distinct
    # sources), one exact float64 product
    weights = np.zeros((n_rings, n_q, g, lanes, n_src))
    src = index.reshape(n_rings, n_q, 1, lanes, seg)
    np.put_along_axis(weights, np.broadcast_to(src, p.shape), p.astype(np.float64), axis=4)
    acc = np.matmul(weights.reshape(n_rings, n_q * g * lanes, n_src),
                    np.asarray(v_src, dtype=np.float64))
    acc = acc.astype(np.int64).reshape(n_rings, n_q, g, lanes, d)
    # the merge (merge_lanes), lanes as an axis; an empty lane takes no part
    livel = live[:, :, None, :]                                       # (B, T, 1, L)
    m = np.where(livel, m_lane, low).max(axis=3)                      # (B, T, G)
    alpha = np.where(livel, exp2_fx(np.where(livel, m[..., None] - m_lane, 0)), 0)
    total = ((l_lane * alpha) >> P_FRAC).sum(axis=3)                  # (B, T, G)
    any_live = live.any(axis=2)[..., None]                            # (B, T, 1)
    total = np.where(any_live, total, 1)
    e = _bitlength_array(total)
    recip = (np.int64(1) << (e + 16)) // total
    sh = np.maximum(_bitlength_array(l_lane) - nx.acc_shift_bits, 0)  # (B, T, G, L)
    amt = np.maximum(e[..., None] + nx.beta_shift - sh, 0)
    beta = np.where(livel, np.minimum((alpha * recip[..., None]) >> amt, BETA_MAX), 0)
    summed = ((acc >> sh[..., None]) * beta[..., None]).sum(axis=3)   # (B, T, G, d)
    out = np.clip((summed + (1 << 16)) >> 17, -32768, 32767)
    return np.where(any_live[..., None], out, 0)


def attend_rows(k, v, valid, q, cs, lanes, numerics=None):
    """:func:`attend_fx` on many independent rows: row ``i`` is ``q[i]`` (G, d) over its own
    ring ``k[i]``, ``v[i]`` (W, d), slots ``0 .. valid[i] - 1``; ``cs`` a scalar or one per
    row. Returns (N, G, d): :func:`attend_indexed` with each ring its own sources."""
    k = np.asarray(k)
    n, window, _ = k.shape
    index = np.broadcast_to(np.arange(window), (n, 1, window))
    return attend_indexed(k, v, index, np.asarray(valid).reshape(n, 1),
                          np.asarray(q)[:, None], cs, lanes, numerics)[:, 0]


def ring_sources(count, head, chunk, window):
    """Where each slot of a ring reads from while a chunk of ``chunk`` tokens is written.

    The sources are ``[the ring's W slots before the chunk | the chunk's tokens]``; token
    ``t`` goes to slot ``(head + 1 + t) % W`` (``count``/``head``: the ring's metadata before
    the chunk). Returns ``(index (C, W), valid (C,), count, head)``: ``index[t, s]`` is the
    source slot ``s`` holds once token ``t`` is written (the latest chunk token written there,
    else the old slot), ``valid[t] = min(count + t + 1, W)`` (the slots token ``t`` attends,
    as :meth:`FixedRingCore.attend`); ``index[C - 1]`` is the ring after the chunk, and
    ``count``/``head`` its metadata (the count wraps at 32 bits)."""
    t = np.arange(chunk, dtype=np.int64)[:, None]
    s = np.arange(window, dtype=np.int64)[None, :]
    first = (s - int(head) - 1) % window                  # the first chunk token on slot s
    latest = first + ((t - first) // window) * window     # the latest at or before t
    index = np.where(t >= first, window + latest, s)
    valid = np.minimum(int(count) + t[:, 0] + 1, window)
    return index, valid, (int(count) + chunk) & 0xFFFFFFFF, (int(head) + chunk) % window

class FixedRingCore:
    """The whole core, bit-exact: rings, metadata, commands and the ring access port.

    Rings are q/k/v integer arrays ``[layer, kv_head, kind, slot, dim]`` (kind 0 = K, 1 = V);
    ``qkv_fracs`` are a per-layer numerics' fractions (their score constants: ``cs_layers``);
    the ring access port is byte-addressed (``elem_bytes`` per element, little-endian); metadata is
    per ring (``ring = layer * kv_heads + kv_head``): count ``n`` (32 bits, never wraps at W)
    and head (slot of the newest token, ``W - 1`` when empty).
    """

    ERR_NONE, ERR_RANGE, ERR_COUNT, ERR_OP = 0, 1, 2, 3

    def __init__(self, layers, q_heads, kv_heads, head_dim, window, lanes, scale=None,
                 numerics=None, qkv_fracs=()):
        self.numerics = numerics_of(numerics)
        self.layers, self.q_heads, self.kv_heads = layers, q_heads, kv_heads
        self.head_dim, self.window, self.lanes = head_dim, window, lanes
        self.group = q_heads // kv_heads
        self.cs = score_const(head_dim, scale)
        self.qkv_fracs = self.numerics.layer_fracs(layers, qkv_fracs)
        self.cs_layers = layer_score_consts(self.numerics, head_dim, layers, qkv_fracs, scale)
        self.rings = np.zeros((layers, kv_heads, 2, window, head_dim), dtype=np.int64)
        self.count = np.zeros(layers * kv_heads, dtype=np.int64)
        self.head = np.full(layers * kv_heads, window - 1, dtype=np.int64)

    @classmethod
    def for_config(cls, config, lanes):
        """The core of a device configuration (:class:`ringkv.defs.config.RingKVConfig`):
        its shape, numerics and per-layer fractions."""
        return cls(config.layers, config.q_heads, config.kv_heads, config.head_dim,
                   config.window, lanes, numerics=config.numerics,
                   qkv_fracs=config.qkv_fracs)

    # -- commands ---------------------------------------------------------------------------
    def check(self, op, layer, kv_head, count):
        """The status code the core gives command ``(op, layer, kv_head, count)``."""
        if op not in (0, 1, 2):
            return self.ERR_OP
        if op == 0 and (layer >= self.layers or kv_head >= self.kv_heads):
            return self.ERR_RANGE
        if op == 1 and layer >= self.layers:
            return self.ERR_RANGE
        if op == 0 and count == 0:
            return self.ERR_COUNT
        return self.ERR_NONE

    def attend(self, layer, kv_head, q, k, v):
        """C tokens: ``q`` (C, G, d), ``k``/``v`` (C, d) integers -> (C, G, d) int16 output.

        Each token's K/V is written first, then its query attends the ring: the chunk's queries
        see ``[valid slots | chunk]`` under the window, and the ring ends up holding the chunk's
        last ``min(C, W)`` tokens (chunked prefill; ``C = 1`` is a decode step).
        """
        ring = layer * self.kv_heads + kv_head
        out = []
        for t in range(len(k)):
            slot = (int(self.head[ring]) + 1) % self.window
            self.rings[layer, kv_head, 0, slot] = k[t]
            self.rings[layer, kv_head, 1, slot] = v[t]
            self.head[ring] = slot
            self.count[ring] = (int(self.count[ring]) + 1) & 0xFFFFFFFF
            valid = min(int(self.count[ring]), self.window)
            out.append(attend_fx(q[t], self.rings[layer, kv_head, 0],
                                 self.rings[layer, kv_head, 1], valid, self.lanes,
                                 self.cs_layers[layer], self.numerics))
        return np.array(out, dtype=np.int64).reshape(len(k), self.group, self.head_dim)

    def clear(self, layer=None):
        """Reset the rings of ``layer`` (all layers when ``None``) to empty."""
        layers = range(self.layers) if layer is None else [layer]
        for lay in layers:
            for kvh in range(self.kv_heads):
                ring = lay * self.kv_heads + kvh
                self.count[ring] = 0
                self.head[ring] = self.window - 1

    # -- ring access port -----------------------------------------------------------------
    @property
    def ring_elements(self):
        return self.layers * self.kv_heads * 2 * self.window * self.head_dim

    @property
    def ring_bytes(self):
        """Size of the ring port's byte address space."""
        return self.ring_elements * self.numerics.elem_bytes

    def ring_read(self, addr):
        """Byte ``addr % EB`` of element ``addr // EB`` (little-endian) at ``ring_addr``;
        0 outside the rings."""
        if not 0 <= addr < self.ring_bytes:
            return 0
        eb = self.numerics.elem_bytes
        return (int(self.rings.reshape(-1)[addr // eb]) >> (8 * (addr % eb))) & 0xFF

    def ring_write(self, addr, byte):
        """Write one byte of an element (the other bytes of the element are kept)."""
        if 0 <= addr < self.ring_bytes:
            eb, bits = self.numerics.elem_bytes, self.numerics.elem_bits
            flat = self.rings.reshape(-1)
            pos = 8 * (addr % eb)
            word = int(flat[addr // eb]) & ((1 << bits) - 1)
            word = (word & ~(0xFF << pos)) | ((byte & 0xFF) << pos)
            flat[addr // eb] = (word ^ (1 << (bits - 1))) - (1 << (bits - 1))


def run_ops(model, ops):
    """Apply ``ops`` (see ``ringkv.sim.attention_sim``) to ``model``; same result layout."""
    res = {"outputs": [], "status": [], "reads": []}
    for op in ops:
        kind = op[0]
        if kind == "cmd":
            code, layer, kv_head, count = op[1:5]
            err = model.check(code, layer, kv_head, count)
            ring_count = 0
            if err == model.ERR_NONE and code == 0:
                res["outputs"].append(model.attend(layer, kv_head, op[5], op[6], op[7]))
                ring_count = int(model.count[layer * model.kv_heads + kv_head])
            elif err == model.ERR_NONE:
                model.clear(layer if code == 1 else None)
            res["status"].append((code, err, ring_count))
        elif kind == "ring_write":
            model.ring_write(op[1], op[2])
        elif kind == "ring_read":
            res["reads"].append(model.ring_read(op[1]))
        elif kind == "meta_write":
            ring, count, head = op[1:4]
            if ring < len(model.count) and head < model.window:
                model.count[ring], model.head[ring] = count, head
        elif kind == "meta_read":
            ring = op[1]
            ok = ring < len(model.count)
            res["reads"].append((int(model.count[ring]) if ok else 0,
                                 int(model.head[ring]) if ok else 0))
        else:
            raise ValueError(f"unknown operation {kind!r}")
    return res


def lane_segments(window, lanes, valid):
    """The core's static split: lane ``l`` holds ring slots ``l*S .. (l+1)*S - 1`` clipped to the
    ``valid`` slots; ``(start, stop)`` per lane, empty when ``start == stop``."""
    seg = window // lanes
    return [(min(lane * seg, valid), min((lane + 1) * seg, valid)) for lane in range(lanes)]


def attend_float(q, k_ring, v_ring, valid, lanes, scale=None):
    """float64 split-KV reference of :func:`attend_fx` (same lanes, exact softmax and merge).

    ``q`` (G, d), ``k_ring``/``v_ring`` (W, d) in real units; returns (G, d) float64.
    """
    from .swa import lse_merge, partial_attention
    q = np.asarray(q, dtype=np.float64)
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    segs = lane_segments(len(k_ring), lanes, valid)
    return np.array([lse_merge([partial_attention(qg, k_ring[a:b], v_ring[a:b], scale)
                                for a, b in segs]) for qg in q])


def nrmse(got, ref):
    """Normalized RMS error ``||got - ref|| / ||ref||``."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.sqrt(np.mean((got - ref) ** 2)) / np.sqrt(np.mean(ref ** 2)))
