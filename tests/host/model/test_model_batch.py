"""Batched model steps: a sequence's logits and rings are the same alone or in any batch."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringkv.defs.config import RingKVConfig
from ringkv.host.golden.fixed import FixedRingCore
from ringkv.host.model.transformer import (
    ROW_TILE,
    FixedBackend,
    Float64Backend,
    Model,
    RingPool,
    batch_matmul,
)

SMALL = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=16)
FX2 = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=16,
                   numerics="ringkv-fx2")


@pytest.fixture(scope="module")
def model():
    return Model(SMALL, hidden=64, ffn=96, seed=11)


@given(rows=st.integers(1, 3 * ROW_TILE + 3), seed=st.integers(0, 2 ** 16),
       shape=st.sampled_from([(256, 256), (256, 128), (256, 512), (512, 256), (256, 257),
                              (64, 96)]))
def test_batch_matmul_rows_do_not_depend_on_their_neighbours(rows, seed, shape):
    """The property the batch relies on, checked on the installed BLAS: a row's product is
    the same alone, at any place in a batch, next to any other rows (a plain ``x @ w`` is
    not: one row goes to gemv, and gemm's rounding depends on the number of rows)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape)
    x = rng.standard_normal((rows, shape[0]))
    alone = np.stack([batch_matmul(x[i:i + 1], w)[0] for i in range(rows)])
    assert np.array_equal(batch_matmul(x, w), alone)
    perm = rng.permutation(rows)
    assert np.array_equal(batch_matmul(x[perm], w), alone[perm])
    assert np.allclose(alone, x @ w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("config", [SMALL, FX2], ids=["fx1", "fx2"])
def test_fixed_backend_chunks_equal_the_golden_core_token_by_token(config):
    rng = np.random.default_rng(3)
    backend = FixedBackend(config, lanes=4)
    core = FixedRingCore.for_config(config, 4)
    c = config
    for size in (1, 5, 16, 1, 23, 1, 1, 40):
        q = rng.standard_normal((size, c.q_heads, c.head_dim)) * 2
        k = rng.standard_normal((size, c.kv_heads, c.head_dim)) * 2
        v = rng.standard_normal((size, c.kv_heads, c.head_dim)) * 2
        for layer in range(c.layers):
            got = backend.prefill(layer, q, k, v)
            # the scalar golden core, one call per KV head, as the FPGA's ATTN requests
            from ringkv.host.golden.fixed import dequantize_out, quantize
            fr = backend.fracs[layer]
            qi, ki, vi = (quantize(x, backend.numerics, f) for x, f in zip((q, k, v), fr))
            g = c.group
            want = np.empty_like(got)
            for h in range(c.kv_heads):
                o = core.attend(layer, h, qi[:, h * g:(h + 1) * g], ki[:, h], vi[:, h])
                want[:, h * g:(h + 1) * g] = dequantize_out(o, backend.numerics, fr[2])
            assert np.array_equal(got, want)
    assert np.array_equal(backend.core.rings, core.rings)
    assert np.array_equal(backend.core.count, core.count)
    assert np.array_equal(backend.core.head, core.head)


def _prefilled(model, make, prompts):
    backends = []
    for p in prompts:
        b = make()
        if p:
            model.prefill(p, 0, b, 7)
        backends.append(b)
    return backends


@pytest.mark.parametrize("kind", ["fixed", "pooled", "float64"])
def test_forward_batch_equals_each_sequence_alone(model, kind):
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 256, n).tolist() for n in (0, 3, 40, 0, 17, 16, 5)]
    pool = RingPool(SMALL, 2 * len(prompts))
    slots = iter(range(pool.slots))
    make = {"fixed": lambda: FixedBackend(SMALL), "pooled": lambda: pool.backend(next(slots)),
            "float64": lambda: Float64Backend(SMALL)}[kind]
    batched, alone = _prefilled(model, make, prompts), _prefilled(model, make, prompts)
    for step in range(4):
        # a mix of decode steps and chunks, and every item's own position
        chunks = [rng.integers(0, 256, 1 if (i + step) % 3 else 1 + i).tolist()
                  for i in range(len(prompts))]
        full = [i % 2 == 0 for i in range(len(prompts))]
        got = model.forward_batch([(c, b.n, b) for c, b in zip(chunks, batched)], full)
        for c, b, g, f in zip(chunks, alone, got, full):
            want = model.forward(c, b.n, b)
            assert np.array_equal(g, want if f else want[-1])
    for a, b in zip(batched, alone):
        if kind != "float64":
            assert np.array_equal(a.core.rings, b.core.rings)
            assert np.array_equal(a.core.count, b.core.count)


def test_ring_pool_slots_and_bytes():
    pool = RingPool(SMALL, 3)
    assert pool.rings.dtype == np.int8 and pool.nbytes >= 3 * 2 * 2 * 2 * 16 * 16
    assert RingPool(FX2, 1).rings.dtype == np.int16
    assert RingPool.slots_for_bytes(SMALL, 10 * RingPool.slot_bytes(SMALL)) == 10
    assert RingPool.slots_for_bytes(SMALL, 1) == 1
    b = pool.backend(2)
    b.core.rings[...] = 5
    b.reset()
    assert not pool.rings[2].any() and pool.count[2].sum() == 0
    with pytest.raises(ValueError, match="slot 3"):
        pool.backend(3)
    with pytest.raises(ValueError, match="at least one slot"):
        RingPool(SMALL, 0)
    with pytest.raises(ValueError, match="both its pool and its slot"):
        FixedBackend(SMALL, pool=pool)
