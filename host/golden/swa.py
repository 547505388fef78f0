"""Float64 reference for sliding-window attention (SWA), GQA and split-KV decoding.

This is the reference every later attention block (fixed-point golden model, RTL) is checked
against. Everything is float64 numpy; nothing here is tuned for speed.

Conventions (``docs/CONVENTIONS.md``; FlashAttention layout without the batch dimension):

* Shapes: ``q`` is ``(Sq, Hq, D)``, ``k`` and ``v`` are ``(Sk, Hkv, D)`` (``v`` may have its own
  last dimension ``Dv``); the output is ``(Sq, Hq, Dv)``.
* **GQA.** ``G = Hq // Hkv`` (``Hq`` must be a multiple of ``Hkv``); query head ``h`` uses KV head
  ``h // G``: consecutive query heads share a KV head (not ``h % Hkv``).
* **Alignment.** Bottom-right: the queries are the last ``Sq`` of the ``Sk`` positions, so query
  row ``r`` sits at absolute position ``Sk - Sq + r`` and key row ``j`` at position ``j``. If
  ``Sq > Sk`` the first ``Sq - Sk`` query rows have negative positions and see no key.
* **Window** ``W`` (``window=None``: no window).

  - causal: a query at ``i`` attends keys ``j`` with ``i - W < j <= i`` -- W keys including
    itself (FlashAttention ``window_size=(W-1, 0)``, Hugging Face ``sliding_window=W``).
  - non-causal: the symmetric local window ``|i - j| < W``, i.e. FlashAttention's
    ``window_size=(W-1, W-1)``: W-1 keys on each side plus the key at the query's own position.
  - ``causal=True, window=None``: plain causal attention ``j <= i``; ``causal=False,
    window=None``: every key.

* **Scale** defaults to ``1 / sqrt(D)``.
* **Empty rows.** A query row with no valid key returns zeros (the FlashAttention convention for
  fully masked rows), never NaN.
* **Key positions below 0** mark empty slots (a ring buffer that is not full yet) and are never
  attended, whatever the window.

Split-KV decoding (Flash-Decoding, ``docs/CONVENTIONS.md#split-kv``): the valid keys are cut
into ``P`` contiguous segments (:func:`split_segments`), each lane produces ``(m, l, acc)`` with
:func:`partial_attention`, and :func:`lse_merge` combines them::

    m = max_i m_i,   l = sum_i l_i * exp(m_i - m),   o = sum_i acc_i * exp(m_i - m) / l

An empty segment is ``(m=-inf, l=0, acc=0)`` and contributes exactly nothing.
"""

import math

import numpy as np

__all__ = [
    "positions_mask",
    "swa_attention",
    "swa_attention_naive",
    "split_segments",
    "partial_attention",
    "lse_merge",
    "split_kv_decode",
]


def _check_window(window):
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)):
        raise TypeError(f"window must be a positive integer or None, not {window!r}")
    if window < 1:
        raise ValueError(f"window must be >= 1 (W keys including the query's own), "
                         f"not {window!r}")
    return int(window)


def positions_mask(q_pos, k_pos, window=None, causal=True):
    """Boolean ``(len(q_pos), len(k_pos))`` matrix: ``True`` where query may attend key.

    ``q_pos`` and ``k_pos`` are absolute positions. Causal: ``i - W < j <= i``; non-causal:
    ``|i - j| < W``; ``window=None`` drops the window condition. Keys with a negative position
    (empty ring slots) are never attended.
    """
    window = _check_window(window)
    qp = np.asarray(q_pos, dtype=np.int64).reshape(-1, 1)
    kp = np.asarray(k_pos, dtype=np.int64).reshape(1, -1)
    diff = qp - kp  # i - j
    keep = kp >= 0
    if causal:
        keep = keep & (diff >= 0)
        if window is not None:
            keep = keep & (diff < window)
    elif window is not None:
        keep = keep & (np.abs(diff) < window)
    return np.broadcast_to(keep, (qp.shape[0], kp.shape[1])).copy()


def _check_qkv(q, k, v):
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"q, k, v must be (S, H, D); got {q.shape}, {k.shape}, {v.shape}")
    if k.shape[:2] != v.shape[:2]:
        raise ValueError(f"k and v must agree in (Sk, Hkv); got {k.shape} and {v.shape}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must have the same head dim; got {q.shape} and {k.shape}")
    hq, hkv = q.shape[1], k.shape[1]
    if hkv < 1 or hq % hkv:
        raise ValueError(f"Hq ({hq}) must be a positive multiple of Hkv ({hkv})")
    return q, k, v


def _gqa_scores(q, k):
    """``(Sq, Hq, D) x (Sk, Hkv, D) -> (Hkv, G, Sq, Sk)`` dot products; query head ``h`` is
    ``(h // G, h % G)``, i.e. uses KV head ``h // G``."""
    sq, hq, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(sq, hkv, hq // hkv, d).transpose(1, 2, 0, 3)  # (Hkv, G, Sq, D)
    return qg @ k.transpose(1, 2, 0)[:, None]  # (Hkv, 1, D, Sk)


def _gqa_weighted(p, v):
    """``(Hkv, G, Sq, Sk) x (Sk, Hkv, Dv) -> (Sq, Hq, Dv)`` weighted V sums."""
    hkv, g, sq, _ = p.shape
    o = p @ v.transpose(1, 0, 2)[:, None]  # (Hkv, G, Sq, Dv)
    return o.transpose(2, 0, 1, 3).reshape(sq, hkv * g, v.shape[2])


def _positions(sq, sk, q_pos, k_pos):
    qp = np.arange(sk - sq, sk) if q_pos is None else np.asarray(q_pos, dtype=np.int64)
    kp = np.arange(sk) if k_pos is None else np.asarray(k_pos, dtype=np.int64)
    if qp.shape != (sq,) or kp.shape != (sk,):
        raise ValueError(f"q_pos must have shape ({sq},) and k_pos ({sk},); "
                         f"got {qp.shape} and {kp.shape}")
    return qp, kp


def swa_attention(q, k, v, window=None, causal=True, scale=None, *, q_pos=None, k_pos=None):
    """Vectorized float64 (sliding-window) attention with GQA; returns ``(Sq, Hq, Dv)``.

    See the module docstring for the conventions. ``q_pos``/``k_pos`` (keyword only) override the
    default bottom-right positions, e.g. to attend a ring buffer in slot order with the absolute
    position stored in each slot (``-1`` = empty slot).
    """
    q, k, v = _check_qkv(q, k, v)
    sq, _, d = q.shape
    sk = k.shape[0]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qp, kp = _positions(sq, sk, q_pos, k_pos)
    keep = positions_mask(qp, kp, window, causal)  # (Sq, Sk)
    s = _gqa_scores(q, k) * scale  # (Hkv, G, Sq, Sk)
    s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if sk else np.full(s.shape[:-1] + (1,), -np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(keep, np.exp(s - m), 0.0)
    l = p.sum(axis=-1, keepdims=True)
    p = np.divide(p, l, out=np.zeros_like(p), where=l > 0)
    return _gqa_weighted(p, v)


def swa_attention_naive(q, k, v, window=None, causal=True, scale=None, *, q_pos=None,
                        k_pos=None):
    """Same as :func:`swa_attention`, by explicit Python loops (an independent formulation).

    Per query head, per query row: collect the attended keys, take the max score, the sum of
    exponentials and the weighted V sum with scalar Python floats.
    """
    q, k, v = _check_qkv(q, k, v)
    sq, hq, d = q.shape
    sk, hkv, dv = v.shape
    g = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qp, kp = _positions(sq, sk, q_pos, k_pos)
    keep = positions_mask(qp, kp, window, causal)
    out = np.zeros((sq, hq, dv))
    for h in range(hq):
        kvh = h // g
        for r in range(sq):
            scores = []
            for j in range(sk):
                if keep[r, j]:
                    dot = 0.0
                    for e in range(d):
                        dot += float(q[r, h, e]) * float(k[j, kvh, e])
                    scores.append((j, dot * scale))
            if not scores:
                continue
            mx = max(s for _, s in scores)
            den = 0.0
            acc = [0.0] * dv
            for j, s in scores:
                w = math.exp(s - mx)
                den += w
                for e in range(dv):
                    acc[e] += w * float(v[j, kvh, e])
            for e in range(dv):
                out[r, h, e] = acc[e] / den
    return out


def split_segments(n_valid, P):
    """Cut ``n_valid`` slots into ``P`` contiguous ``(start, stop)`` segments, one per lane.

    The first ``n_valid % P`` segments are one slot longer than the rest; when ``n_valid < P``
    the trailing segments are empty (``start == stop``).
    """
    if isinstance(P, bool) or not isinstance(P, (int, np.integer)) or P < 1:
        raise ValueError(f"P must be a positive integer, not {P!r}")
    if isinstance(n_valid, bool) or not isinstance(n_valid, (int, np.integer)) or n_valid < 0:
        raise ValueError(f"n_valid must be a non-negative integer, not {n_valid!r}")
    base, extra = divmod(int(n_valid), int(P))
    segs, start = [], 0
    for i in range(int(P)):
        stop = start + base + (1 if i < extra else 0)
        segs.append((start, stop))
        start = stop
    return segs


def partial_attention(q, k, v, scale):
    """One lane's partial result ``(m, l, acc)``: ``q`` ``(D,)`` over ``k``/``v`` ``(n, D)``.

    ``m`` is the max score, ``l = sum exp(s - m)``, ``acc = sum exp(s - m) * v``. An empty
    segment (``n == 0``) gives ``(-inf, 0.0, zeros(Dv))``.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if k.shape[0] == 0:
        return -np.inf, 0.0, np.zeros(v.shape[1])
    s = (k @ q) * float(scale)
    m = float(s.max())
    p = np.exp(s - m)
    return m, float(p.sum()), p @ v


def lse_merge(partials):
    """Merge lane partials ``[(m_i, l_i, acc_i), ...]`` by log-sum-exp into the output ``o``.

    Empty segments (``m_i = -inf``) get weight exactly 0. If every segment is empty the result
    is zeros (no valid key), never NaN.
    """
    partials = list(partials)
    if not partials:
        raise ValueError("lse_merge needs at least one partial")
    m = max(float(mi) for mi, _, _ in partials)
    dv = np.asarray(partials[0][2]).shape[0]
    if m == -np.inf:
        return np.zeros(dv)
    l = 0.0
    acc = np.zeros(dv)
    for mi, li, ai in partials:
        if mi == -np.inf:
            continue
        w = math.exp(float(mi) - m)
        l += float(li) * w
        acc = acc + np.asarray(ai, dtype=np.float64) * w
    return acc / l


def split_kv_decode(q, k, v, P, scale=None):
    """Flash-Decoding of one query position: ``q`` ``(Hq, D)`` against ``k``/``v`` ``(n, Hkv, D)``.

    Every one of the ``n`` keys is attended (the caller passes only valid slots, which in a ring
    buffer are all inside the window). The keys are split into ``P`` contiguous segments
    (:func:`split_segments`); for each query head (GQA: KV head ``h // G``) each segment yields a
    partial and :func:`lse_merge` combines them. Returns ``(Hq, Dv)``.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if q.ndim != 2 or k.ndim != 3 or v.ndim != 3 or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"need q (Hq, D), k/v (n, Hkv, D); got {q.shape}, {k.shape}, {v.shape}")
    hq, d = q.shape
    n, hkv, _ = k.shape
    if k.shape[2] != d or hkv < 1 or hq % hkv:
        raise ValueError(f"shape mismatch: q {q.shape}, k {k.shape}")
    g = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    segs = split_segments(n, P)
    out = np.zeros((hq, v.shape[2]))
    for h in range(hq):
        kvh = h // g
        parts = [partial_attention(q[h], k[a:b, kvh], v[a:b, kvh], scale) for a, b in segs]
        out[h] = lse_merge(parts)
    return out
