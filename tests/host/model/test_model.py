"""Host model: ring-buffer chunked prefill + decode equals a full SWA recompute; backends."""

import numpy as np
import pytest

from ringkv.defs.config import RingKVConfig
from ringkv.host.model.transformer import (
    BOS,
    FixedBackend,
    Float64Backend,
    Model,
    decode_text,
    encode_text,
    rope,
)

SMALL = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=16)


@pytest.fixture(scope="module")
def model():
    return Model()


@pytest.mark.parametrize("chunk", [50, 128, 200])
def test_chunked_prefill_and_decode_equal_full_recompute(model, chunk):
    rng = np.random.default_rng(chunk)
    tokens = [BOS] + list(rng.integers(0, 256, 299))          # 300 > W = 128
    backend = Float64Backend()
    last = model.prefill(tokens, 0, backend, chunk=chunk)
    steps = [last]
    seq = list(tokens)
    for _ in range(6):
        token = int(np.argmax(steps[-1]))
        seq.append(token)
        steps.append(model.forward([token], len(seq) - 1, backend)[0])
    full = model.forward_full(seq)
    for i, logits in enumerate(steps):
        np.testing.assert_allclose(logits, full[len(tokens) - 1 + i], rtol=0, atol=1e-9)
    assert backend.n == len(seq)


def test_window_matters():
    """A different token outside the window changes nothing; inside it changes the output."""
    m = Model(SMALL, hidden=64, ffn=96, seed=3)
    base = list(range(1, 41))
    far, near = list(base), list(base)
    far[5] = 200          # position 5: outside the last token's window (positions 24..39)
    near[30] = 200
    out = m.forward_full(base)[-1]
    # RoPE/MLP are per-token, so only attention propagates a change: through the 2 layers a
    # change at p reaches p + 2*(W-1) at most. Position 5 + 30 = 35 < 39: compare position 39.
    assert not np.allclose(m.forward_full(near)[-1], out)
    assert np.allclose(m.forward_full(far)[-1], out, atol=0, rtol=0)


def test_rope_relative():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 1, 64)), rng.standard_normal((1, 1, 64))
    d1 = np.sum(rope(q, [10]) * rope(k, [7]))
    d2 = np.sum(rope(q, [103]) * rope(k, [100]))
    assert d1 == pytest.approx(d2, abs=1e-9)
    assert not np.isclose(d1, np.sum(rope(q, [10]) * rope(k, [9])))


def test_weights_deterministic_and_save_load(tmp_path):
    a, b, c = Model(SMALL, hidden=64, ffn=96, seed=1), Model(SMALL, hidden=64, ffn=96, seed=1), \
        Model(SMALL, hidden=64, ffn=96, seed=2)
    assert all(np.array_equal(a.w[k], b.w[k]) for k in a.w)
    assert not np.array_equal(a.w["l0.wq"], c.w["l0.wq"])
    a.save(tmp_path / "w.npz")
    d = Model.load(tmp_path / "w.npz", SMALL)
    tokens = encode_text("persistent sessions")
    assert np.array_equal(d.forward_full(tokens), a.forward_full(tokens))
    assert (d.hidden, d.ffn) == (64, 96)


def test_parameter_errors(model):
    with pytest.raises(ValueError, match=r"^chunk must be positive, not 0$"):
        model.prefill([1, 2], 0, Float64Backend(), chunk=0)
    with pytest.raises(ValueError, match=r"^hidden and ffn must be positive, not 0, 512$"):
        Model(hidden=0)


def test_tokenizer():
    assert encode_text("añ") == [97, 0xC3, 0xB1]
    assert decode_text([BOS] + encode_text("añ")) == "añ"


def test_fixed_backend_tracks_float64():
    """The FPGA core's bit-exact model in the loop: close to float64, same greedy tokens."""
    m = Model(SMALL, hidden=64, ffn=96, seed=5)
    prompt = [BOS] + encode_text("sliding windows, ring buffers")      # 30 > W = 16
    fixed, ref = FixedBackend(SMALL, lanes=2), Float64Backend(SMALL)
    lf, lr = m.prefill(prompt, 0, fixed, chunk=8), m.prefill(prompt, 0, ref, chunk=8)
    err = np.sqrt(np.mean((lf - lr) ** 2)) / np.sqrt(np.mean(lr ** 2))
    assert err < 0.05
    assert m.generate(prompt, 0, FixedBackend(SMALL, lanes=2), 8, chunk=8) == \
        m.generate(prompt, 0, Float64Backend(SMALL), 8, chunk=8)


@pytest.mark.parametrize("backend_cls", [Float64Backend, FixedBackend])
def test_snapshot_restore(backend_cls):
    m = Model(SMALL, hidden=64, ffn=96, seed=6)
    be = backend_cls(SMALL)
    m.prefill(list(range(20)), 0, be, chunk=7)
    snap = be.snapshot()
    a = m.forward([5], 20, be)
    be.reset()
    assert be.n == 0
    be.restore(snap)
    assert be.n == 20
    np.testing.assert_array_equal(m.forward([5], 20, be), a)


def test_fixed_backend_fx2_is_the_wide_numerics():
    """With numerics ringkv-fx2 the FixedBackend runs the core's int16 model: the rings hold
    int16 values beyond the int8 range, it is the golden core in fx2 bit for bit, and it is
    closer to float64 than fx1."""
    from ringkv.defs.numerics import FX2
    from ringkv.host.golden.fixed import FixedRingCore, dequantize_out, quantize
    small2 = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx2"})
    m = Model(SMALL, hidden=64, ffn=96, seed=5)
    prompt = [BOS] + encode_text("sliding windows, ring buffers")      # 30 > W = 16
    fx1, fx2, ref = FixedBackend(SMALL, lanes=2), FixedBackend(small2, lanes=2), \
        Float64Backend(SMALL)
    l1, l2, lr = (m.prefill(prompt, 0, be, chunk=8) for be in (fx1, fx2, ref))

    def err(x):
        return np.sqrt(np.mean((x - lr) ** 2)) / np.sqrt(np.mean(lr ** 2))

    assert err(l2) < err(l1) / 4
    rings = fx2.snapshot()[0]
    assert fx2.core.numerics is FX2 and np.abs(rings).max() > 127
    assert np.abs(fx1.snapshot()[0]).max() <= 128
    # one decode step against the golden core in fx2, directly
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((4, 16)), rng.standard_normal((2, 16)), \
        rng.standard_normal((2, 16))
    core = FixedRingCore(2, 4, 2, 16, 16, 2, numerics="ringkv-fx2")
    core.rings[...], core.count[...], core.head[...] = fx2.snapshot()
    want = np.concatenate([dequantize_out(core.attend(1, h, quantize(q[None, 2 * h:2 * h + 2],
                                                                     FX2),
                                                      quantize(k[None, h], FX2),
                                                      quantize(v[None, h], FX2)), FX2)[0]
                           for h in range(2)])
    np.testing.assert_array_equal(fx2.decode(1, q, k, v), want)
