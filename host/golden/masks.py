"""Sliding-window masks, and the block-tiled use of a compressed 512x512 mask.

The masks follow the reference mask generator of block-tiled sliding-window attention kernels
(it exists as Python and as C++ code; "the reference" below). The RTL needs no stored mask (it
compares positions); these masks are the reference for software kernels and the proof that the
reference's mask conventions agree with the window rule (``docs/CONVENTIONS.md#window``,
``#masks``).

**Full masks** (``max_seq x max_seq``, row = query position ``i``, column = key position ``j``),
generated exactly as the reference's numpy code: ``triu(M, 1) + tril(M, -window)`` of a matrix ``M``
full of the "masked" value. An entry is masked iff ``j > i`` or ``j <= i - window``, so row ``i``
keeps ``i - W < j <= i``: **W keys including itself**, RingKV's window. The reference's prose ("skip
when m - n > windowLen") would keep W + 1 keys: it is off by one, its code is right. When
``window >= max_seq`` the mask is plain causal, as the reference says.

* :func:`swa_mask_additive`: ``-65536.0`` masked, ``0.0`` kept (added to the scores).
* :func:`swa_mask_bool`: ``1`` masked, ``0`` kept (``uint8``; the reference builds it as floats).

(The reference's C++ version of the full mask indexes rows with ``SWA_COMPRESS_MASK_SIZE``
instead of ``SWA_MASK_SIZE``, which is only right when ``maxSeq == 512``; we follow its Python
code.)

**Compressed mask** (:func:`swa_mask_compressed`): the same band construction on a fixed
``512 x 512`` matrix with window ``true_size`` (:func:`compressed_mask_true_size`, the
reference's Python)::

    pp_n = 128 if head_size <= 128 else 64
    true_size = window                      if window <= 3 * pp_n
              = 3 * pp_n                    elif window % pp_n == 0
              = 2 * pp_n + window % pp_n    otherwise

The mask is Toeplitz: entry ``(r, c)`` depends only on ``r - c``. A block-tiled kernel
(FlashAttention style, tiles of ``B = pp_n`` queries x ``B`` keys) visits, for each query tile,
only the key tiles that hold a key inside some row's window. Let ``delta = q_start - k_start``
be the distance between the tiles' first positions. A visited tile pair is

* *fully visible* if ``delta >= B - 1`` and ``delta + B - 1 < W``: no mask is read;
* otherwise it is masked by the ``B x B`` slice of the compressed mask whose top-left corner
  lies on diagonal ``d = row0 - col0`` with ``d = delta`` when the tile touches the causal
  diagonal (``delta < B - 1``) and ``d = delta - (W - true_size)`` when it only touches the
  window's far edge. Because the mask is Toeplitz, this slice keeps exactly the pairs with
  ``0 <= delta + t - c < W``. (The far edge and the diagonal meet in one tile only when
  ``W < 2B - 1``, where ``true_size == W`` and both formulas agree.) We take
  ``row0 = max(d, 0)``, ``col0 = max(-d, 0)``.

The compression removes the fully visible tiles between the diagonal and the far edge: the
residue ``window % pp_n`` fixes where the far edge cuts a tile, and ``2 * pp_n`` (or ``3 * pp_n``
for exact multiples) keeps the edge tiles ``B``-aligned with the diagonal, so the far-edge tiles
land on diagonals ``d <= 3 * B``.

**Where it works and where it does not.** With query tiles aligned to key tiles at absolute
multiples of ``B`` (``align="absolute"``, how a prefill kernel tiles ``Sq == Sk``; with
bottom-right alignment ``Sq < Sk`` the first query tile is partial), ``delta`` is a multiple of
``B``, every slice starts at a row ``<= 3 * B <= 384`` and fits: the tiled evaluation equals the
full mask for every window, sequence length and head size (tested over a sweep).

If the query tiles start at the first query instead (``align="query"``, e.g. chunked prefill or
decode with ``(Sk - Sq) % B != 0``) and the kernel loads whole ``B x B`` mask tiles, ``delta`` is
not a multiple of ``B``: the needed diagonal ``d`` can reach ``true_size + B - 2``, while a tile
must start at ``d <= 512 - B``. That always holds for ``pp_n = 64`` (``head_size > 128``), but for
``pp_n = 128`` (``head_size <= 128``) and ``true_size > 258`` (e.g. ``W = 300``, ``W = 400``; not
for ``W <= 258``, nor for ``W > 384`` with ``W % 128`` equal to 1 or 2) some offsets need mask rows
beyond 511: **the reference's 512x512 mask is too small for 128-tiles that are not aligned to the
key tiles.** :func:`tiled_mask_block` raises ``ValueError`` in those cases (tested over a sweep of
windows: some offset fails if and only if ``true_size > 258``).

The reference's C++ variant differs (``variant="cpp"``): block size
``16384 // head_size // 16 * 16`` for ``head_size > 128`` (64 for 256, but 80 for 192, 32 for
512), and ``true_size = 2 * B + window % B`` also for exact multiples (``2B`` instead of the
Python's ``3B``). Both variants give correct tiled results with the offsets above; they just are
not the same mask, and reading one variant's mask at the other's offsets is wrong for exact
multiples above ``3B`` (tested).
"""

import math

import numpy as np

from .swa import _gqa_scores, _gqa_weighted

__all__ = [
    "MASK_VALUE",
    "COMPRESSED_MASK_SIZE",
    "swa_mask_additive",
    "swa_mask_bool",
    "compressed_block_size",
    "compressed_mask_true_size",
    "swa_mask_compressed",
    "tiled_mask_block",
    "tiled_mask_assemble",
    "tiled_swa_attention",
    "masked_attention",
]

MASK_VALUE = -65536.0
COMPRESSED_MASK_SIZE = 512
_VARIANTS = ("python", "cpp")
_ALIGNS = ("absolute", "query")


def _pos_int(name, x):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(f"{name} must be a positive integer, not {x!r}")
    return int(x)


def _band(size, window, fill):
    m = np.ones(shape=[size, size]) * fill
    return np.triu(m, 1) + np.tril(m, -window)


def swa_mask_additive(max_seq, window):
    """Full ``(max_seq, max_seq)`` float64 mask: ``-65536.0`` masked, ``0.0`` kept."""
    return _band(_pos_int("max_seq", max_seq), _pos_int("window", window), MASK_VALUE)


def swa_mask_bool(max_seq, window):
    """Full ``(max_seq, max_seq)`` ``uint8`` mask: ``1`` masked, ``0`` kept."""
    m = _band(_pos_int("max_seq", max_seq), _pos_int("window", window), 1.0)
    return m.astype(np.uint8)


def compressed_block_size(head_size, variant="python"):
    """Tile size ``pp_n`` the compressed mask is built for.

    ``"python"`` (the reference's Python, the default): 128 if ``head_size <= 128`` else 64.
    ``"cpp"`` (the reference's C++): 128 if ``head_size <= 128`` else
    ``16384 // head_size // 16 * 16``.
    """
    head_size = _pos_int("head_size", head_size)
    if variant not in _VARIANTS:
        raise ValueError(f"variant must be one of {_VARIANTS}, not {variant!r}")
    if head_size <= 128:
        return 128
    if variant == "python":
        return 64
    b = 16384 // head_size // 16 * 16
    if b < 1:
        raise ValueError(f"head_size {head_size} gives a zero C++ block size")
    return b


def compressed_mask_true_size(window, head_size, variant="python"):
    """Band width of the compressed mask (``true_size`` in the reference's Python)."""
    window = _pos_int("window", window)
    pp_n = compressed_block_size(head_size, variant)
    if window <= pp_n * 3:
        return window
    if variant == "cpp":
        return 2 * pp_n + window % pp_n
    if window % pp_n == 0:
        return pp_n * 3
    return pp_n * 2 + window % pp_n


def swa_mask_compressed(window, head_size, form="additive", variant="python"):
    """The compressed ``(512, 512)`` mask (the reference's array has a leading axis of 1).

    ``form="additive"``: ``-65536.0``/``0.0``; ``form="bool"``: ``uint8`` ``1``/``0``.
    """
    t = compressed_mask_true_size(window, head_size, variant)
    if form == "additive":
        return _band(COMPRESSED_MASK_SIZE, t, MASK_VALUE)
    if form == "bool":
        return _band(COMPRESSED_MASK_SIZE, t, 1.0).astype(np.uint8)
    raise ValueError(f"form must be 'additive' or 'bool', not {form!r}")


def tiled_mask_block(q_start, k_start, window, head_size, *, cmask=None, variant="python"):
    """Mask of the ``B x B`` tile pair with first query position ``q_start`` and first key
    position ``k_start``, read from the compressed mask as a block-tiled kernel would.

    Returns a view of the compressed mask (additive form unless ``cmask`` is given), or ``None``
    for a fully visible tile pair (the kernel reads no mask). Raises ``ValueError`` for a tile
    pair with no visible entry (the kernel never visits it) and when the slice would fall
    outside the 512x512 mask (unaligned 128-tiles, see the module docstring).
    """
    window = _pos_int("window", window)
    b = compressed_block_size(head_size, variant)
    t = compressed_mask_true_size(window, head_size, variant)
    delta = int(q_start) - int(k_start)
    if delta + b - 1 < 0 or delta - (b - 1) >= window:
        raise ValueError(f"tile pair q_start={q_start}, k_start={k_start} is fully masked "
                         f"(window {window}, block {b}); a tiled kernel does not visit it")
    lower = delta < b - 1  # the causal diagonal crosses the tile
    upper = delta + b - 1 >= window  # the window's far edge crosses the tile
    if not (lower or upper):
        return None
    if lower and upper:
        assert t == window, "both edges in one tile only happen for window < 2B - 1"
    d = delta if lower else delta - (window - t)
    r0, c0 = max(d, 0), max(-d, 0)
    if r0 + b > COMPRESSED_MASK_SIZE or c0 + b > COMPRESSED_MASK_SIZE:
        raise ValueError(f"tile pair q_start={q_start}, k_start={k_start} (window {window}, "
                         f"block {b}, true_size {t}) needs mask rows {r0}..{r0 + b - 1}: "
                         f"outside the {COMPRESSED_MASK_SIZE}x{COMPRESSED_MASK_SIZE} "
                         f"compressed mask (query tiles not aligned to key tiles)")
    if cmask is None:
        cmask = swa_mask_compressed(window, head_size, variant=variant)
    return cmask[r0:r0 + b, c0:c0 + b]


def _tile_plan(seq_q, seq_k, window, b, align):
    """Yield ``(q_start, q_rows, [(k_start, k_cols), ...])`` per query tile.

    ``q_rows``/``k_cols`` are the index ranges (into the query and key arrays) a tile covers;
    tiles are clipped to the arrays, so edge tiles are partial.
    """
    if align not in _ALIGNS:
        raise ValueError(f"align must be one of {_ALIGNS}, not {align!r}")
    if not 1 <= seq_q <= seq_k:
        raise ValueError(f"tiled evaluation needs 1 <= Sq <= Sk; got Sq={seq_q}, Sk={seq_k}")
    first = seq_k - seq_q  # absolute position of query row 0 (bottom-right alignment)
    qs = (first // b) * b if align == "absolute" else first
    while qs < seq_k:
        p0, p1 = max(qs, first), min(qs + b, seq_k) - 1  # absolute positions of real rows
        lo, hi = max(p0 - window + 1, 0) // b, p1 // b
        keys = [(kb * b, range(kb * b, min(kb * b + b, seq_k))) for kb in range(lo, hi + 1)]
        yield qs, range(p0 - first, p1 - first + 1), keys
        qs += b


def tiled_mask_assemble(seq_q, seq_k, window, head_size, *, align="absolute",
                        variant="python"):
    """The ``(seq_q, seq_k)`` additive mask a tiled kernel effectively applies.

    Unvisited tiles count as masked. Must equal ``swa_mask_additive(seq_k, window)[-seq_q:]``.
    """
    window = _pos_int("window", window)
    b = compressed_block_size(head_size, variant)
    cmask = swa_mask_compressed(window, head_size, variant=variant)
    first = seq_k - seq_q
    out = np.full((seq_q, seq_k), MASK_VALUE)
    for qs, rows, keys in _tile_plan(seq_q, seq_k, window, b, align):
        tr = slice(rows.start + first - qs, rows.stop + first - qs)
        for ks, cols in keys:
            blk = tiled_mask_block(qs, ks, window, head_size, cmask=cmask, variant=variant)
            rs, cs = slice(rows.start, rows.stop), slice(cols.start, cols.stop)
            out[rs, cs] = 0.0 if blk is None else blk[tr, :len(cols)]
    return out


def tiled_swa_attention(q, k, v, window, head_size=None, scale=None, *, align="absolute",
                        variant="python"):
    """Causal SWA evaluated tile by tile with the compressed mask and an online softmax.

    ``q`` ``(Sq, Hq, D)``, ``k``/``v`` ``(Sk, Hkv, D)``, ``1 <= Sq <= Sk``, bottom-right
    alignment, GQA ``h // G``, scale ``1/sqrt(D)`` by default. ``head_size`` (default ``D``)
    only selects the tile size. For each query tile only the key tiles inside the window are
    visited; masked tiles add the compressed-mask slice from :func:`tiled_mask_block`
    (``-65536``, so masked scores underflow to exactly 0 in float64); the running max / sum /
    accumulator are rescaled FlashAttention-style. Returns ``(Sq, Hq, Dv)``.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    sq, hq, d = q.shape
    sk, hkv, dv = v.shape
    if k.shape[:2] != (sk, hkv) or k.shape[2] != d or hq % hkv:
        raise ValueError(f"shape mismatch: q {q.shape}, k {k.shape}, v {v.shape}")
    head_size = d if head_size is None else head_size
    window = _pos_int("window", window)
    g = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    b = compressed_block_size(head_size, variant)
    cmask = swa_mask_compressed(window, head_size, variant=variant)
    first = sk - sq
    out = np.zeros((sq, hq, dv))
    for qs, rows, keys in _tile_plan(sq, sk, window, b, align):
        tr = slice(rows.start + first - qs, rows.stop + first - qs)
        qt = q[rows.start:rows.stop]
        m = np.full((hkv, g, len(rows), 1), -np.inf)
        l = np.zeros((hkv, g, len(rows), 1))
        acc = np.zeros((len(rows), hq, dv))
        for ks, cols in keys:
            kt, vt = k[cols.start:cols.stop], v[cols.start:cols.stop]
            s = _gqa_scores(qt, kt) * scale  # (Hkv, G, rows, cols)
            blk = tiled_mask_block(qs, ks, window, head_size, cmask=cmask, variant=variant)
            if blk is not None:
                s = s + blk[tr, :len(cols)]
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            alpha = np.exp(m - m_new)
            p = np.exp(s - m_new)
            l = l * alpha + p.sum(axis=-1, keepdims=True)
            acc = acc * _heads_last(alpha) + _gqa_weighted(p, vt)
            m = m_new
        out[rows.start:rows.stop] = acc / _heads_last(l)
    return out


def _heads_last(x):
    """``(Hkv, G, S, 1) -> (S, Hq, 1)``, the layout of :func:`_gqa_weighted`'s output."""
    hkv, g, sq, _ = x.shape
    return x.transpose(2, 0, 1, 3).reshape(sq, hkv * g, 1)


def masked_attention(q, k, v, mask, scale=None):
    """Reference attention with an explicit additive mask ``(Sq, Sk)`` (e.g. rows of
    :func:`swa_mask_additive`): ``softmax(q k^T * scale + mask) v`` per head, GQA ``h // G``."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    sq, hq, d = q.shape
    sk, hkv, dv = v.shape
    mask = np.asarray(mask, dtype=np.float64)
    if mask.shape != (sq, sk) or hq % hkv:
        raise ValueError(f"mask must be ({sq}, {sk}) and Hq a multiple of Hkv; "
                         f"got mask {mask.shape}, q {q.shape}, k {k.shape}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s = _gqa_scores(q, k) * scale + mask
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return _gqa_weighted(p / p.sum(axis=-1, keepdims=True), v)
