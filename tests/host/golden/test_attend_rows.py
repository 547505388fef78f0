"""The vectorized core datapath (``attend_rows``, ``ring_sources``) against the scalar golden
model (``attend_fx``, ``FixedRingCore.attend``), integer for integer."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringkv.defs.numerics import numerics_of, score_const
from ringkv.host.golden.fixed import FixedRingCore, attend_fx, attend_rows, ring_sources


def ring_views(ring, count, head, new, window):
    """The ring as each of a chunk's tokens sees it, through :func:`ring_sources`: ``(views
    (C, W, d), valid, final ring, count, head)``."""
    index, valid, count, head = ring_sources(count, head, len(new), window)
    views = np.concatenate([ring, new])[index]
    return views, valid, views[-1], count, head


SHAPES = [(128, 4, 2, 64), (8, 2, 4, 16), (32, 1, 1, 8), (16, 16, 2, 4), (16, 4, 3, 8)]


@pytest.mark.parametrize("numerics", ["ringkv-fx1", "ringkv-fx2"])
@pytest.mark.parametrize("window,lanes,group,dim", SHAPES)
def test_attend_rows_equals_attend_fx(numerics, window, lanes, group, dim):
    nx = numerics_of(numerics)
    rng = np.random.default_rng(window * lanes + group)
    n = 48
    lo, hi = nx.qkv_min, nx.qkv_max
    k = rng.integers(lo, hi + 1, (n, window, dim))
    v = rng.integers(lo, hi + 1, (n, window, dim))
    q = rng.integers(lo, hi + 1, (n, group, dim))
    # boundaries: saturated operands (the largest scores, sums and products), one valid slot,
    # a full ring, a lane boundary, zeros
    k[:8], q[:4], q[4:8], v[:12] = hi, hi, lo, lo
    k[8:10], q[10:12] = 0, 0
    valid = rng.integers(1, window + 1, n)
    valid[:3], valid[3:6], valid[6:9] = 1, window, window // lanes
    cs = score_const(dim)
    got = attend_rows(k, v, valid, q, cs, lanes, numerics)
    want = np.stack([attend_fx(q[i], k[i], v[i], valid[i], lanes, cs, numerics)
                     for i in range(n)])
    assert got.dtype.kind == "i" and np.array_equal(got, want)


def test_attend_rows_takes_a_score_constant_per_row():
    rng = np.random.default_rng(5)
    k, v = rng.integers(-128, 128, (2, 6, 16, 8))
    q = rng.integers(-128, 128, (6, 2, 8))
    cs = np.array([score_const(8), score_const(8, 0.5)] * 3)
    got = attend_rows(k, v, [16, 3, 9, 1, 16, 7], q, cs, 4)
    want = [attend_fx(q[i], k[i], v[i], [16, 3, 9, 1, 16, 7][i], 4, cs[i]) for i in range(6)]
    assert np.array_equal(got, np.stack(want))


@given(window=st.sampled_from([4, 8, 16]), count=st.integers(0, 40),
       chunk=st.integers(1, 40), seed=st.integers(0, 2 ** 16))
def test_ring_views_are_the_ring_each_token_attends(window, count, chunk, seed):
    rng = np.random.default_rng(seed)
    core = FixedRingCore(1, 2, 1, 4, window, 2)
    zeros = np.zeros((1, 2, 4), dtype=np.int64)
    for x in rng.integers(-128, 128, (count, 4)):
        core.attend(0, 0, zeros, x[None], x[None])
    before, n0, h0 = core.rings[0, 0, 0].copy(), core.count[0], core.head[0]
    new = rng.integers(-128, 128, (chunk, 4))
    views, valid, final, n1, h1 = ring_views(before, n0, h0, new, window)
    for t in range(chunk):
        core.attend(0, 0, zeros, new[t][None], new[t][None])
        assert np.array_equal(views[t], core.rings[0, 0, 0])
        assert valid[t] == min(core.count[0], window)
    assert np.array_equal(final, core.rings[0, 0, 0])
    assert (n1, h1) == (core.count[0], core.head[0])


def test_ring_views_of_a_ring_whose_head_is_not_its_count():
    """An imported record's ring head need not be ``count - 1`` modulo W: the views follow the
    stored head, as the core's writes do."""
    core = FixedRingCore(1, 2, 1, 4, 8, 2)
    rng = np.random.default_rng(2)
    core.rings[0, 0, 0] = rng.integers(-128, 128, (8, 4))
    core.count[0], core.head[0] = 5, 2
    before = core.rings[0, 0, 0].copy()
    new = rng.integers(-128, 128, (11, 4))
    views, valid, final, _, _ = ring_views(before, 5, 2, new, 8)
    zeros = np.zeros((1, 2, 4), dtype=np.int64)
    for t in range(11):
        core.attend(0, 0, zeros, new[t][None], new[t][None])
        assert np.array_equal(views[t], core.rings[0, 0, 0])
    assert np.array_equal(final, core.rings[0, 0, 0])
