"""Float64 SWA reference: mask convention, naive vs vectorized, GQA, split-KV, off-by-one traps."""

import math
import zlib

import numpy as np
import pytest

from ringkv.host.golden.swa import (
    lse_merge,
    partial_attention,
    positions_mask,
    split_kv_decode,
    split_segments,
    swa_attention,
    swa_attention_naive,
)


def rand_qkv(rng, sq, sk, hq, hkv, d, amp=1.0):
    return (amp * rng.standard_normal((sq, hq, d)), amp * rng.standard_normal((sk, hkv, d)),
            rng.standard_normal((sk, hkv, d)))


# ---- an explicit variant reference with every convention as a knob ----------------------------

def variant_attention(q, k, v, window, *, window_delta=0, head_map="div", align="bottom_right"):
    """Causal attention written from docs/CONVENTIONS.md#window, with knobs to break each
    convention on purpose."""
    sq, hq, d = q.shape
    sk, hkv, _ = k.shape
    g = hq // hkv
    w = None if window is None else window + window_delta
    out = np.zeros((sq, hq, v.shape[2]))
    for h in range(hq):
        kvh = h // g if head_map == "div" else h % hkv
        for r in range(sq):
            i = sk - sq + r if align == "bottom_right" else r
            js = [j for j in range(sk) if j <= i and (w is None or i - j < w)]
            if not js:
                continue
            s = np.array([q[r, h] @ k[j, kvh] for j in js]) / math.sqrt(d)
            p = np.exp(s - s.max())
            out[r, h] = (p / p.sum()) @ v[js, kvh]
    return out


# ---- positions_mask -----------------------------------------------------------------------------

@pytest.mark.parametrize("window", [None, 1, 2, 3, 7])
@pytest.mark.parametrize("causal", [True, False])
def test_positions_mask_matches_predicate(window, causal):
    qp = np.arange(-2, 12)
    kp = np.arange(-3, 12)
    m = positions_mask(qp, kp, window, causal)
    for a, i in enumerate(qp):
        for b, j in enumerate(kp):
            if j < 0:
                want = False
            elif causal:
                want = j <= i and (window is None or i - window < j)
            else:
                want = window is None or abs(i - j) < window
            assert m[a, b] == want, (i, j)


@pytest.mark.parametrize("W", [1, 2, 3, 5, 16])
def test_causal_window_keeps_W_keys_including_itself(W):
    pos = np.arange(40)
    m = positions_mask(pos, pos, W, True)
    assert list(m.sum(axis=1)) == [min(i + 1, W) for i in pos]
    assert all(m[i, i] for i in pos)  # itself included
    assert not any(m[i, i - W] for i in pos if i >= W)  # the W+1-th key back is excluded
    # FlashAttention window_size=(W-1, W-1) for the non-causal window
    mn = positions_mask(pos, pos, W, False)
    assert list(mn.sum(axis=1)) == [min(i, W - 1) + 1 + min(39 - i, W - 1) for i in pos]


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        positions_mask([0], [0], 0, True)
    with pytest.raises(TypeError):
        positions_mask([0], [0], 2.5, True)


# ---- vectorized vs naive ------------------------------------------------------------------------

SHAPES = [  # (Sq, Sk, Hq, Hkv, D)
    (1, 1, 1, 1, 4), (1, 9, 4, 2, 5), (6, 6, 2, 2, 3), (4, 11, 6, 2, 4), (9, 5, 3, 1, 3),
    (7, 13, 4, 4, 2), (5, 0, 2, 1, 3),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", [None, 1, 2, 3, 7, 100])
@pytest.mark.parametrize("causal", [True, False])
def test_naive_equals_vectorized(shape, window, causal):
    rng = np.random.default_rng(zlib.crc32(repr((shape, window, causal)).encode()))
    q, k, v = rand_qkv(rng, *shape)
    a = swa_attention(q, k, v, window, causal)
    b = swa_attention_naive(q, k, v, window, causal)
    assert a.shape == (shape[0], shape[2], shape[4])
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES[:-1])
@pytest.mark.parametrize("window", [None, 1, 2, 4, 9])
def test_golden_equals_spec_variant(shape, window):
    rng = np.random.default_rng(7)
    q, k, v = rand_qkv(rng, *shape)
    np.testing.assert_allclose(swa_attention(q, k, v, window),
                               variant_attention(q, k, v, window), rtol=0, atol=1e-12)


def test_explicit_positions_and_scale():
    rng = np.random.default_rng(1)
    q, k, v = rand_qkv(rng, 3, 8, 2, 1, 4)
    perm = rng.permutation(8)  # keys in any order, with their positions: same result
    a = swa_attention(q, k, v, 3, scale=0.7)
    b = swa_attention(q, k[perm], v[perm], 3, scale=0.7, q_pos=[5, 6, 7], k_pos=perm)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)
    c = swa_attention_naive(q, k[perm], v[perm], 3, scale=0.7, q_pos=[5, 6, 7], k_pos=perm)
    np.testing.assert_allclose(a, c, rtol=0, atol=1e-12)
    # empty slots (position -1) are ignored
    kp = perm.copy()
    kp[perm == 0] = -1
    d = swa_attention(q, k[perm], v[perm], None, q_pos=[5, 6, 7], k_pos=kp)
    np.testing.assert_allclose(d, swa_attention(q, k[1:], v[1:], None), rtol=0, atol=1e-13)


def test_window_pins_exact_keys():
    """Decode against W+1 keys: the first key must be out, the other W in, with scale 1/sqrt(D)."""
    rng = np.random.default_rng(2)
    W, d = 4, 6
    q, k, v = rand_qkv(rng, 1, W + 1, 1, 1, d)
    s = k[1:, 0] @ q[0, 0] / math.sqrt(d)
    want = (np.exp(s - s.max()) / np.exp(s - s.max()).sum()) @ v[1:, 0]
    np.testing.assert_allclose(swa_attention(q, k, v, W)[0, 0], want, rtol=0, atol=1e-13)


def test_no_window_equals_huge_window_and_noncausal_full():
    rng = np.random.default_rng(3)
    q, k, v = rand_qkv(rng, 5, 12, 4, 2, 3)
    np.testing.assert_array_equal(swa_attention(q, k, v, None), swa_attention(q, k, v, 10**6))
    np.testing.assert_array_equal(swa_attention(q, k, v, None, causal=False),
                                  swa_attention(q, k, v, 10**6, causal=False))


def test_empty_rows_are_zero_not_nan():
    rng = np.random.default_rng(4)
    q, k, v = rand_qkv(rng, 6, 3, 2, 1, 4)  # Sq > Sk: first 3 query rows see nothing
    with np.errstate(all="raise"):
        o = swa_attention(q, k, v, 2)
    assert np.all(o[:3] == 0) and np.all(np.any(o[3:] != 0, axis=-1))
    np.testing.assert_allclose(o, swa_attention_naive(q, k, v, 2), rtol=0, atol=1e-12)
    assert np.all(swa_attention(q, k[:0], v[:0], 3) == 0)


def test_large_scores_are_stable():
    rng = np.random.default_rng(5)
    q, k, v = rand_qkv(rng, 4, 9, 2, 2, 8, amp=40.0)  # scores in the thousands
    with np.errstate(over="raise", invalid="raise"):
        a = swa_attention(q, k, v, 5)
    np.testing.assert_allclose(a, swa_attention_naive(q, k, v, 5), rtol=0, atol=1e-10)


def test_gqa_equals_mha_with_repeated_kv():
    rng = np.random.default_rng(6)
    q, k, v = rand_qkv(rng, 5, 10, 6, 2, 4)
    g = 3
    mha = swa_attention(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), 4)
    np.testing.assert_allclose(swa_attention(q, k, v, 4), mha, rtol=0, atol=1e-13)


def test_bad_shapes():
    rng = np.random.default_rng(0)
    q, k, v = rand_qkv(rng, 2, 3, 3, 2, 4)
    with pytest.raises(ValueError):
        swa_attention(q, k, v)
    with pytest.raises(ValueError):
        swa_attention(q[..., :3], k[:, :1], v[:, :1])


# ---- the off-by-one traps: each wrong variant must differ from the golden ------------------------

def trap_inputs():
    rng = np.random.default_rng(11)
    return rand_qkv(rng, 6, 14, 4, 2, 5)  # Sq < Sk, G = 2, windows shorter than Sk


@pytest.mark.parametrize("W", [1, 2, 3, 5])
@pytest.mark.parametrize("wrong", [
    {"window_delta": -1}, {"window_delta": +1}, {"head_map": "mod"}, {"align": "top_left"},
])
def test_off_by_one_traps_are_caught(W, wrong):
    q, k, v = trap_inputs()
    golden = swa_attention(q, k, v, W)
    np.testing.assert_allclose(variant_attention(q, k, v, W), golden, rtol=0, atol=1e-12)
    if wrong.get("window_delta") == -1 and W == 1:
        return  # window 0 is not a window
    bad = variant_attention(q, k, v, W, **wrong)
    assert np.abs(bad - golden).max() > 1e-3, wrong


def test_naive_catches_head_map_trap():
    # the naive formulation cross-checks the vectorized GQA reshape: a wrong head map differs
    q, k, v = trap_inputs()
    assert np.abs(variant_attention(q, k, v, None, head_map="mod")
                  - swa_attention_naive(q, k, v, None)).max() > 1e-3


# ---- split-KV (Flash-Decoding) ------------------------------------------------------------------

@pytest.mark.parametrize("P", range(1, 10))
def test_split_segments(P):
    for n in range(0, 3 * P + 2):
        segs = split_segments(n, P)
        assert len(segs) == P
        assert segs[0][0] == 0 and segs[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
        lens = [b - a for a, b in segs]
        assert lens == [n // P + 1] * (n % P) + [n // P] * (P - n % P)


def test_split_segments_rejects_bad_args():
    for args in ((3, 0), (-1, 2), (3, 1.5)):
        with pytest.raises(ValueError):
            split_segments(*args)


def test_partial_attention_empty_and_single():
    m, l, acc = partial_attention(np.ones(3), np.zeros((0, 3)), np.zeros((0, 5)), 0.5)
    assert m == -np.inf and l == 0.0 and acc.shape == (5,) and not acc.any()
    m, l, acc = partial_attention(np.ones(3), np.ones((1, 3)), np.arange(5.0)[None], 0.5)
    assert m == 1.5 and l == 1.0 and np.array_equal(acc, np.arange(5.0))


@pytest.mark.parametrize("P", range(1, 10))
def test_split_kv_equals_unsplit(P):
    rng = np.random.default_rng(100 + P)
    for n in list(range(0, P + 3)) + [2 * P + 1, 17]:
        q, k, v = rand_qkv(rng, 1, n, 4, 2, 6)
        with np.errstate(all="raise"):
            o = split_kv_decode(q[0], k, v, P)
        ref = swa_attention(q, k, v, None)[0]
        assert np.all(np.isfinite(o))
        np.testing.assert_allclose(o, ref, rtol=0, atol=1e-12)
        if n == 0:
            assert not o.any()


def test_lse_merge_all_empty_and_order():
    e = (-np.inf, 0.0, np.zeros(3))
    with np.errstate(all="raise"):
        assert not lse_merge([e, e]).any()
    rng = np.random.default_rng(9)
    q, k, v = rand_qkv(rng, 1, 7, 1, 1, 3)
    parts = [partial_attention(q[0, 0], k[a:b, 0], v[a:b, 0], 0.5)
             for a, b in split_segments(7, 4) + [(7, 7)]]
    ref = swa_attention(q, k, v, None, scale=0.5)[0, 0]
    for perm in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 4, 0, 3, 1]):
        np.testing.assert_allclose(lse_merge([parts[i] for i in perm]), ref, rtol=0, atol=1e-13)
    with pytest.raises(ValueError):
        lse_merge([])


def test_split_kv_large_scores_and_wrong_merge_trap():
    rng = np.random.default_rng(10)
    q, k, v = rand_qkv(rng, 1, 12, 2, 1, 8, amp=30.0)
    with np.errstate(over="raise", invalid="raise"):
        o = split_kv_decode(q[0], k, v, 5)
    ref = swa_attention(q, k, v, None)[0]
    np.testing.assert_allclose(o, ref, rtol=0, atol=1e-10)
    # a merge that forgets to rescale by exp(m_i - m) is caught
    q, k, v = rand_qkv(rng, 1, 12, 1, 1, 4)
    parts = [partial_attention(q[0, 0], k[a:b, 0], v[a:b, 0], 0.5)
             for a, b in split_segments(12, 3)]
    wrong = sum(p[2] for p in parts) / sum(p[1] for p in parts)
    ref = swa_attention(q, k, v, None, scale=0.5)[0, 0]
    assert np.abs(wrong - ref).max() > 1e-3
    np.testing.assert_allclose(lse_merge(parts), ref, rtol=0, atol=1e-13)
