"""The fixed-point golden models ("ringkv-fx1", "ringkv-fx2") against the float64 references."""

import math

import numpy as np
import pytest

from ringkv.defs import numerics as nm
from ringkv.host.golden import fixed as gf
from ringkv.host.golden.ring import RingKVCache
from ringkv.host.golden.swa import swa_attention


def test_numerics_name_matches_config():
    from ringkv.defs.config import DEFAULT_CONFIG
    assert gf.NUMERICS == DEFAULT_CONFIG.numerics == "ringkv-fx1"


def test_exp2_table_and_function():
    assert nm.EXP_TABLE[0] == 1 << 15 and len(nm.EXP_TABLE) == 256
    assert all(a > b for a, b in zip(nm.EXP_TABLE, nm.EXP_TABLE[1:]))
    y = np.arange(0, 16 * 256 + 300)
    got = gf.exp2_fx(y)
    assert np.all(np.diff(got) <= 0)
    ref = 2.0 ** (15 - y / 256)
    live = y < 8 * 256
    assert np.all(np.abs(got[live] - ref[live]) <= 1.0)
    assert np.all(got[y >= 16 * 256] == 0)
    with pytest.raises(ValueError, match="non-negative"):
        gf.exp2_fx(-1)


def test_quantize_rounds_and_clips():
    assert gf.quantize([0.0, 1.0, -4.0, 10.0, -10.0, 1 / 64]).tolist() == [0, 32, -128, 127,
                                                                          -128, 0]
    assert gf.quantize([0.0, 1.0, -16.0, 20.0, -20.0, 2 ** -12, 3 * 2 ** -12],
                       "ringkv-fx2").tolist() == [0, 2048, -32768, 32767, -32768, 0, 2]


def test_numerics_table():
    assert nm.numerics_of(None) is nm.FX1 and nm.numerics_of("ringkv-fx2") is nm.FX2
    assert nm.numerics_of(nm.FX2) is nm.FX2
    # fx1's derived constants are those of the first version of the core
    assert (nm.FX1.elem_bytes, nm.FX1.out_frac, nm.FX1.dot_shift, nm.FX1.acc_shift_bits,
            nm.FX1.beta_shift) == (1, 13, 0, 10, 6)
    assert (nm.FX2.elem_bytes, nm.FX2.out_frac, nm.FX2.dot_shift, nm.FX2.acc_shift_bits,
            nm.FX2.beta_shift) == (2, 11, 12, 2, 14)
    with pytest.raises(ValueError, match="unknown numerics 'fx3'; known: ringkv-fx1, "
                       "ringkv-fx1c, ringkv-fx2"):
        nm.numerics_of("fx3")
    with pytest.raises(ValueError, match="unknown numerics"):
        gf.quantize([1.0], "ringkv-fx3")


def test_per_layer_fractions():
    """ringkv-fx1c: fx1's element format; a layer's q/k fractions move only its score constant
    (fx1's CS when Fq + Fk = 10), v's only the host's output scale; bad fractions are refused."""
    from ringkv.defs.config import RingKVConfig
    c1 = nm.FX1C
    assert (c1.elem_bits, c1.dot_shift, c1.acc_shift_bits, c1.beta_shift) == (8, 0, 10, 6)
    assert nm.FX1.layer_fracs(2) == ((5, 5, 5),) * 2 and nm.FX2.layer_fracs(1) == ((11,) * 3,)
    fr = ((4, 4, 6), (5, 5, 5), (4, 3, 2), (6, 5, 7))
    cs = nm.layer_score_consts(c1, 64, 4, fr)
    base = nm.score_const(64)
    # round(scale * log2(e) * 2**(16 + 10 - Fq - Fk)), not a multiple of the rounded CS
    assert cs == (47274, base, 94548, 5909) and base == 11819
    assert nm.layer_score_consts(nm.FX1, 64, 3) == (base,) * 3
    assert c1.out_frac_of(6) == 14 and nm.FX1.out_frac_of(5) == nm.FX1.out_frac
    assert gf.quantize([1.0, -9.0], c1, 4).tolist() == [16, -128]
    assert gf.dequantize_out([1 << 14], c1, 6).tolist() == [1.0]
    for bad, match in ((((4, 4, 6),), "one .Fq, Fk, Fv. per layer .2."),
                       (((4, 4), (4, 4)), "one .Fq, Fk, Fv. per layer"),
                       (((4, 4, 16), (4, 4, 4)), "integers 0..15, not 16"),
                       (((4, 4, 6), (3, 3, 5)), "layer 1: q/k fractions 3 \\+ 3 with d=64")):
        with pytest.raises(ValueError, match=match):
            nm.layer_score_consts(c1, 64, 2, bad)
        with pytest.raises(ValueError, match=match):
            RingKVConfig(layers=2, numerics="ringkv-fx1c", qkv_fracs=bad)
    with pytest.raises(ValueError, match="ringkv-fx1 has fixed scales"):
        RingKVConfig(layers=1, qkv_fracs=((5, 5, 5),))
    with pytest.raises(ValueError, match="needs qkv_fracs"):
        RingKVConfig(numerics="ringkv-fx1c")
    # lists (a JSON round trip) are the same configuration
    a = RingKVConfig(layers=1, numerics="ringkv-fx1c", qkv_fracs=[[4, 4, 6]])
    assert a == RingKVConfig(layers=1, numerics="ringkv-fx1c", qkv_fracs=((4, 4, 6),))
    assert a.digest() != RingKVConfig(layers=1, numerics="ringkv-fx1c",
                                      qkv_fracs=((4, 4, 5),)).digest()


def test_fx1c_core_is_fx1_at_fx1_fractions_and_follows_its_scales():
    """The golden core in fx1c: bit for bit fx1 where every fraction is 5; with coarser q/k
    and finer v on a layer (values beyond fx1's range), close to float64."""
    rng = np.random.default_rng(3)
    L, Hq, Hkv, d, W, P = 2, 4, 2, 16, 16, 4
    a = gf.FixedRingCore(L, Hq, Hkv, d, W, P, numerics="ringkv-fx1")
    b = gf.FixedRingCore(L, Hq, Hkv, d, W, P, numerics="ringkv-fx1c",
                         qkv_fracs=((5, 5, 5), (5, 5, 5)))
    fr = ((4, 4, 7), (5, 5, 5))
    c = gf.FixedRingCore(L, Hq, Hkv, d, W, P, numerics="ringkv-fx1c", qkv_fracs=fr)
    assert c.cs_layers == (nm.score_const(d, shift=2), nm.score_const(d))
    worst = 0.0
    for _ in range(3):
        n = int(rng.integers(1, 12))
        q = rng.integers(-128, 128, (n, 2, d))
        k, v = rng.integers(-128, 128, (2, n, d))
        for layer in range(L):
            assert np.array_equal(a.attend(layer, 1, q, k, v), b.attend(layer, 1, q, k, v))
        qf = rng.standard_normal((n, 2, d)) * 3
        kf = rng.standard_normal((n, d)) * 3
        vf = rng.standard_normal((n, d)) * 0.25
        o = gf.dequantize_out(c.attend(0, 0, gf.quantize(qf, c.numerics, 4),
                                       gf.quantize(kf, c.numerics, 4),
                                       gf.quantize(vf, c.numerics, 7)), c.numerics, 7)
        valid = min(int(c.count[0]), W)
        ring_k = c.rings[0, 0, 0] / 16.0
        ring_v = c.rings[0, 0, 1] / 128.0
        ref = gf.attend_float(gf.quantize(qf[-1], c.numerics, 4) / 16.0, ring_k, ring_v, valid,
                              P)
        worst = max(worst, gf.nrmse(o[-1], ref))
    assert worst < 0.01, worst


@pytest.mark.parametrize("window,lanes,valid", [(8, 1, 8), (8, 4, 3), (8, 8, 1), (16, 4, 16),
                                                (32, 8, 5)])
def test_float_split_reference_equals_golden_swa(window, lanes, valid):
    """The float64 split-KV reference (static lane segments, LSE merge, empty lanes) agrees
    with the foundation's golden SWA."""
    rng = np.random.default_rng(window * 100 + lanes)
    d, G = 8, 3
    q = rng.standard_normal((G, d))
    k = rng.standard_normal((window, d))
    v = rng.standard_normal((window, d))
    got = gf.attend_float(q, k, v, valid, lanes)
    ref = swa_attention(q[None], k[:valid, None], v[:valid, None])[0]
    assert np.allclose(got, ref, rtol=1e-12, atol=1e-12)


def _accuracy(window, lanes, d=64, G=2, trials=6, seed=0, nx=nm.FX1):
    rng = np.random.default_rng(seed)
    worst_dp, worst_total = 0.0, 0.0
    for _ in range(trials):
        qf = rng.standard_normal((G, d))
        kf, vf = rng.standard_normal((window, d)), rng.standard_normal((window, d))
        q, k, v = gf.quantize(qf, nx), gf.quantize(kf, nx), gf.quantize(vf, nx)
        o = gf.dequantize_out(gf.attend_fx(q, k, v, window, lanes, nm.score_const(d), nx), nx)
        s = 2.0 ** -nx.qkv_frac
        ref_q = gf.attend_float(q * s, k * s, v * s, window, lanes)
        ref = gf.attend_float(qf, kf, vf, window, lanes)
        worst_dp = max(worst_dp, gf.nrmse(o, ref_q))
        worst_total = max(worst_total, gf.nrmse(o, ref))
    return worst_dp, worst_total


@pytest.mark.parametrize("window,lanes", [(32, 1), (128, 4), (128, 8), (256, 2)])
def test_accuracy_normal_inputs(window, lanes):
    """N(0, 1) inputs: the datapath's normalized RMS error against float64 is at most 1%."""
    datapath, total = _accuracy(window, lanes)
    assert datapath <= 0.01
    assert total <= 0.03      # includes the int8 quantization of q, k, v (about 1.6 %)


@pytest.mark.parametrize("window,lanes", [(32, 1), (128, 4), (128, 8), (256, 2), (512, 8)])
def test_accuracy_target_wide_numerics(window, lanes):
    """The issue's target: N(0, 1) q, k, v, unquantized, against float64: at most 1 % with
    ``ringkv-fx2`` (int16 q/k/v; int8 cannot, its quantization alone is about 1.6 %)."""
    datapath, total = _accuracy(window, lanes, nx=nm.FX2)
    assert datapath <= 0.005
    assert total <= 0.01


def test_accuracy_peaky_and_limits():
    d, W, P, G = 64, 128, 4, 2
    rng = np.random.default_rng(5)
    s = 2.0 ** -gf.QKV_FRAC
    cases = []
    # one score far above the rest
    k = rng.integers(-8, 8, (W, d))
    k[37] = 127
    cases.append((np.full((G, d), 127), k, rng.integers(-128, 128, (W, d))))
    # every element at the format limits, scores all equal and maximal
    cases.append((np.full((G, d), 127), np.full((W, d), 127), np.full((W, d), -128)))
    cases.append((np.full((G, d), -128), np.full((W, d), -128), np.full((W, d), 127)))
    # large alternating magnitudes
    sign = np.where(rng.random((W, d)) < 0.5, -128, 127)
    cases.append((np.full((G, d), 127), sign, sign[::-1].copy()))
    for q, k, v in cases:
        o = gf.attend_fx(q, k, v, W, P, nm.score_const(d))
        assert o.min() >= -32768 and o.max() <= 32767
        ref = gf.attend_float(q * s, k * s, v * s, W, P)
        assert np.max(np.abs(gf.dequantize_out(o) - ref)) <= 2 ** -9


def test_accuracy_peaky_and_limits_wide():
    """fx2: peaky scores and every element at the int16 limits (real -16 .. 16): no overflow,
    the output within 2**-9 of float64 on the same inputs (the output keeps v's range)."""
    nx, d, W, P, G = nm.FX2, 64, 128, 4, 2
    rng = np.random.default_rng(6)
    s = 2.0 ** -nx.qkv_frac
    hi, lo = nx.qkv_max, nx.qkv_min
    cases = []
    k = rng.integers(-2048, 2048, (W, d))
    k[37] = hi
    cases.append((np.full((G, d), hi), k, rng.integers(lo, hi + 1, (W, d))))
    cases.append((np.full((G, d), hi), np.full((W, d), hi), np.full((W, d), lo)))
    cases.append((np.full((G, d), lo), np.full((W, d), lo), np.full((W, d), hi)))
    sign = np.where(rng.random((W, d)) < 0.5, lo, hi)
    cases.append((np.full((G, d), hi), sign, sign[::-1].copy()))
    cases.append((rng.integers(-3, 4, (G, d)), rng.integers(-3, 4, (W, d)),
                  rng.integers(-3, 4, (W, d))))       # the smallest magnitudes
    for q, k, v in cases:
        o = gf.attend_fx(q, k, v, W, P, nm.score_const(d), nx)
        assert o.min() >= -32768 and o.max() <= 32767
        ref = gf.attend_float(q * s, k * s, v * s, W, P)
        assert np.max(np.abs(gf.dequantize_out(o, nx) - ref)) <= 2 ** -9


def test_empty_lanes_contribute_nothing():
    rng = np.random.default_rng(3)
    q = rng.integers(-128, 128, (2, 8))
    k = rng.integers(-128, 128, (16, 8))
    v = rng.integers(-128, 128, (16, 8))
    cs = nm.score_const(8)
    k2, v2 = k.copy(), v.copy()
    k2[3:], v2[3:] = 127, -128      # slots beyond the valid ones must not matter
    a = gf.attend_fx(q, k, v, 3, 8, cs)
    assert np.array_equal(a, gf.attend_fx(q, k2, v2, 3, 8, cs))
    # S = 2 slots per lane: lanes 2..7 are empty; merging without them gives the same bits
    states = [gf.lane_state(q, k[0:2], v[0:2], cs), gf.lane_state(q, k[2:3], v[2:3], cs)]
    assert np.array_equal(a, gf.merge_lanes(states + [None] * 6, 2, 8))
    assert np.array_equal(a, gf.merge_lanes(states, 2, 8))
    assert np.array_equal(gf.merge_lanes([None] * 4, 2, 8), np.zeros((2, 8)))


@pytest.mark.parametrize("nx", [nm.FX1, nm.FX2], ids=lambda n: n.name)
@pytest.mark.parametrize("rule", ["mod", "packed"])
@pytest.mark.parametrize("chunks", [[1] * 12, [3, 1, 5, 1], [8, 1, 1], [11, 2], [1, 2, 17]])
def test_fixed_core_matches_float_ring(rule, chunks, nx):
    """Decode and chunked prefill on the fixed core track the float64 ring cache (both slot
    rules give the same outputs); the fixed ring holds the same tokens as the 'mod' rule."""
    L, Hq, Hkv, d, W, P = 1, 4, 2, 16, 8, 2
    core = gf.FixedRingCore(L, Hq, Hkv, d, W, P, numerics=nx)
    ref = RingKVCache(W, Hkv, d, rule=rule)
    rng = np.random.default_rng(len(chunks))
    s = 2.0 ** -nx.qkv_frac
    for C in chunks:
        q = gf.quantize(rng.standard_normal((C, Hq, d)), nx)
        k = gf.quantize(rng.standard_normal((C, Hkv, d)), nx)
        v = gf.quantize(rng.standard_normal((C, Hkv, d)), nx)
        out = np.concatenate([core.attend(0, h, q[:, h * 2:h * 2 + 2], k[:, h], v[:, h])
                              for h in range(Hkv)], axis=1)
        want = ref.chunked_prefill(q * s, k * s, v * s) if C > 1 else \
            ref.decode_step(q[0] * s, k[0] * s, v[0] * s)[None]
        assert gf.nrmse(gf.dequantize_out(out, nx), want) < 0.01
        assert math.isclose(core.count[0], ref.n)
    if rule == "mod":
        fixed = np.stack([core.rings[0, h, 0] for h in range(Hkv)], axis=1) * s
        assert np.array_equal(fixed, ref.k_slots)


def test_ring_port_addressing():
    core = gf.FixedRingCore(2, 2, 1, 4, 4, 2)
    addr = ((1 * 1 + 0) * 2 + 1) * 4 * 4 + 3 * 4 + 2      # layer 1, V, slot 3, dim 2
    core.ring_write(addr, 0xFE)
    assert core.rings[1, 0, 1, 3, 2] == -2
    assert core.ring_read(addr) == 0xFE
    assert core.ring_read(core.ring_elements) == 0
    core.ring_write(core.ring_elements, 5)
    assert core.rings.sum() == -2


def test_ring_port_bytes_of_wide_elements():
    """fx2: two bytes per element, little-endian; a byte write keeps the other byte."""
    core = gf.FixedRingCore(2, 2, 1, 4, 4, 2, numerics="ringkv-fx2")
    elem = ((1 * 1 + 0) * 2 + 1) * 4 * 4 + 3 * 4 + 2      # layer 1, V, slot 3, dim 2
    core.ring_write(2 * elem, 0x34)
    core.ring_write(2 * elem + 1, 0xF2)
    assert core.rings[1, 0, 1, 3, 2] == 0xF234 - 0x10000
    assert [core.ring_read(2 * elem), core.ring_read(2 * elem + 1)] == [0x34, 0xF2]
    core.ring_write(2 * elem, 0x00)
    assert core.rings[1, 0, 1, 3, 2] == 0xF200 - 0x10000
    assert core.ring_bytes == 2 * core.ring_elements
    assert core.ring_read(core.ring_bytes) == 0
    core.ring_write(core.ring_bytes, 5)
    assert core.rings.sum() == 0xF200 - 0x10000
