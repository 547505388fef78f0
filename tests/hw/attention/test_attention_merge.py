"""The attention core's merge unit (``hw/attention/merge.py``), each piece against the golden
model's formulas (``ringkv.host.golden.fixed``) at the widths of the core's builds (the merge
widths depend on the window and the lanes; the numerics change only the beta shift, tested
with FX1 and FX2): boundary values, random values, and gaps between the inputs."""

import random

import pytest
from amaranth import Signal
from amaranth.sim import Simulator

from ringkv.defs.checks import log2_exact
from ringkv.defs.numerics import FX1, FX2, P_FRAC
from ringkv.host.golden.fixed import (
    acc_shift,
    beta_fx,
    beta_shift_amount,
    reciprocal_fx,
    round_output,
    weight_term,
)
from ringkv.hw.attention.merge import (
    RECIP_BITS,
    BetaUnit,
    LaneMax,
    OutputTree,
    Reciprocal,
    WeightSum,
)

#: (window, lanes) of the cores whose merge widths are tested: the default core and the
#: smallest and largest lane splits the tests use
SHAPES = [(128, 4), (4, 1), (512, 8)]


def merge_widths(window, lanes):
    """``(LW, LSW)`` as ``AttentionCore.elaborate`` sizes them: the lane exp sum (``S``
    weights of at most ``2**15``, plus a bit) and the merged ``L`` (``P`` such sums)."""
    lw = 16 + log2_exact(window // lanes) + 1
    return lw, lw + log2_exact(lanes) + 1


def run(dut, stimulus, outputs):
    """Drive ``dut`` with one dict of input values per clock; return, per clock, the values
    of ``outputs`` (names of ports) during that clock."""
    got = []

    async def bench(ctx):
        for inputs in stimulus:
            for name, value in inputs.items():
                port = dut
                for part in name.split("."):
                    port = port[int(part)] if part.isdigit() else getattr(port, part)
                ctx.set(port, value)
            got.append({name: ctx.get(getattr(dut, name)) for name in outputs})
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


def boundary_ints(width, low=1):
    """``low`` and up, the powers of two and their neighbours, and the largest ``width``-bit
    value."""
    out = {low, low + 1, low + 2, (1 << width) - 1}
    for b in range(1, width):
        out |= {(1 << b) - 1, 1 << b, (1 << b) + 1}
    return sorted(v for v in out if low <= v < (1 << width))


# ---- Reciprocal ----

@pytest.mark.parametrize("window,lanes", SHAPES)
def test_reciprocal_matches_golden(window, lanes):
    """``e`` and ``R = 2**(e+16) // L`` for every boundary value of ``L >= 2`` (the unit's
    domain; the core's ``L`` is at least ``2**15``) and random ones, with idle clocks before
    the load, between the steps and after the last (the quotient holds). The width of ``L``
    is the same for every numerics."""
    _, lsw = merge_widths(window, lanes)
    rng = random.Random(f"recip{window}{lanes}")
    values = boundary_ints(lsw, low=2) + [rng.randrange(2, 1 << lsw) for _ in range(40)]
    dut = Reciprocal(lsw)
    stimulus, checks = [], []
    for value in values:
        stimulus += [{"divisor": value, "load": 0, "step": 0}] * rng.randrange(2)
        stimulus.append({"divisor": value, "load": 1, "step": 0})
        steps = 0
        while steps < RECIP_BITS:
            go = rng.random() < 0.8
            steps += go
            stimulus.append({"divisor": value, "load": 0, "step": int(go)})
        idle = rng.randrange(3)
        stimulus += [{"divisor": rng.randrange(1 << lsw), "load": 0, "step": 0}] * idle
        checks.append((len(stimulus), value))
    stimulus.append({"divisor": 1, "load": 0, "step": 0})
    got = run(dut, stimulus, ["e", "quotient"])
    for at, value in checks:
        assert (got[at]["e"], got[at]["quotient"]) == reciprocal_fx(value), f"L = {value}"


def test_reciprocal_latency_is_exact():
    """One step short of 18 the quotient is not yet ``R`` (for an ``L`` whose ``R`` has its
    lowest bit set): the core's MERGE_DIVIDE must last exactly 18 clocks."""
    dut = Reciprocal(8)
    value = 3                       # R = 2**18 // 3 = 87381, odd
    stimulus = ([{"divisor": value, "load": 1, "step": 0}]
                + [{"divisor": value, "load": 0, "step": 1}] * (RECIP_BITS - 1)
                + [{"divisor": value, "load": 0, "step": 0}] * 2)
    got = run(dut, stimulus, ["quotient"])
    assert got[RECIP_BITS]["quotient"] == reciprocal_fx(value)[1] >> 1
    assert Reciprocal.latency == 1 + RECIP_BITS


# ---- WeightSum ----

@pytest.mark.parametrize("window,lanes", SHAPES)
def test_weight_sum_matches_golden(window, lanes):
    """``L = sum (l * alpha) >> 15`` over random series of pairs (extremes of ``l`` and of
    ``alpha`` included), with gaps, each series started by ``clear``."""
    lw, lsw = merge_widths(window, lanes)
    rng = random.Random(window * lanes)
    dut = WeightSum(lw, lsw)
    stimulus, checks = [], []
    quiet = {"l": 0, "alpha": 0, "valid": 0, "clear": 0}
    for _ in range(30):
        stimulus.append(dict(quiet, clear=1, l=rng.randrange(1 << lw)))
        total = 0
        for _ in range(lanes):
            lsum = rng.choice([0, 1, (1 << lw) - 1, rng.randrange(1 << lw)])
            alpha = rng.choice([0, 1, 1 << P_FRAC, rng.randrange((1 << P_FRAC) + 1)])
            stimulus += [dict(quiet, l=rng.randrange(1 << lw))] * rng.randrange(2)
            stimulus.append(dict(quiet, l=lsum, alpha=alpha, valid=1))
            total += weight_term(lsum, alpha)
        stimulus += [quiet] * WeightSum.latency
        checks.append((len(stimulus), total))
    stimulus.append(quiet)
    got = run(dut, stimulus, ["total"])
    for at, total in checks:
        assert total < (1 << lsw)
        assert got[at]["total"] == total


# ---- BetaUnit ----

@pytest.mark.parametrize("numerics", [FX1, FX2], ids=lambda n: n.name)
@pytest.mark.parametrize("window,lanes", SHAPES)
def test_beta_unit_matches_golden(numerics, window, lanes):
    """Each lane's ``beta`` from the golden model's ``alpha``, ``l`` and ``L`` (random lane
    states, some lanes with the largest max, some with alpha 0 or 1), one lane per clock with
    gaps; the unit writes ``beta`` into the right lane, 4 clocks after its input."""
    lw, lsw = merge_widths(window, lanes)
    amt_width = len(Signal(range(lsw + numerics.beta_shift + 2)))
    rng = random.Random(f"beta{numerics.name}{window}{lanes}")
    dut = BetaUnit(lanes, amt_width)
    stimulus, want = [], []
    quiet = {"alpha": 0, "amt": 0, "lane": 0, "valid": 0, "recip": 0}
    for _ in range(40):
        states = [(rng.choice([0, 1, 1 << P_FRAC, rng.randrange((1 << P_FRAC) + 1)]),
                   rng.choice([1, (1 << lw) - 1, rng.randrange(1, 1 << lw)]))
                  for _ in range(lanes)]
        states[0] = (1 << P_FRAC, states[0][1])      # the lane with the largest max
        total = sum(weight_term(lsum, alpha) for alpha, lsum in states)
        e, recip = reciprocal_fx(total)
        for lane, (alpha, lsum) in enumerate(states):
            amt = beta_shift_amount(e, acc_shift(lsum, numerics), numerics)
            assert amt < (1 << amt_width)
            stimulus += [dict(quiet, recip=recip)] * rng.randrange(2)
            stimulus.append({"alpha": alpha, "amt": amt, "lane": lane, "valid": 1,
                             "recip": recip})
            want.append((len(stimulus) - 1 + BetaUnit.latency, lane, beta_fx(alpha, recip, amt)))
        stimulus += [dict(quiet, recip=recip)] * BetaUnit.latency
    got = run(dut, stimulus, ["beta", "beta_lane", "beta_valid"])
    written = [(k, g["beta_lane"], g["beta"]) for k, g in enumerate(got) if g["beta_valid"]]
    assert written == want


def test_beta_unit_saturates():
    """``(alpha * R) >> amt`` above ``2**17 - 1`` (alpha = 1.0, R = 2**17, no shift) gives
    ``2**17 - 1``; the 18th bit of ``R`` reaches the product."""
    dut = BetaUnit(2, 5)
    quiet = {"alpha": 0, "amt": 0, "lane": 0, "valid": 0, "recip": 1 << 17}
    stimulus = ([{"alpha": 1 << 15, "amt": 0, "lane": 1, "valid": 1, "recip": 1 << 17},
                 {"alpha": 1 << 15, "amt": 16, "lane": 0, "valid": 1, "recip": 1 << 17}]
                + [quiet] * 5)
    got = run(dut, stimulus, ["beta", "beta_lane", "beta_valid"])
    assert [(g["beta_lane"], g["beta"]) for g in got if g["beta_valid"]] == [
        (1, beta_fx(1 << 15, 1 << 17, 0)), (0, 1 << 16)]
    assert beta_fx(1 << 15, 1 << 17, 0) == (1 << 17) - 1


# ---- LaneMax ----

@pytest.mark.parametrize("lanes", [1, 2, 4, 8])
def test_lane_max_matches_model(lanes):
    """The largest live value (random values at the width's extremes, random live masks with
    at least one lane live), a new set every clock, ``1 + log2(P)`` clocks late."""
    width = 20
    rng = random.Random(lanes)
    dut = LaneMax(lanes, width)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    stimulus, want = [], []
    for _ in range(200):
        values = [rng.choice([lo, hi, 0, -1, rng.randint(lo, hi)]) for _ in range(lanes)]
        live = rng.randrange(1, 1 << lanes)
        stimulus.append({**{f"values.{j}": values[j] for j in range(lanes)}, "live": live})
        want.append(max(v for j, v in enumerate(values) if live >> j & 1))
    stimulus += [stimulus[-1]] * dut.latency
    got = run(dut, stimulus, ["max"])
    assert [g["max"] for g in got[dut.latency:]][:len(want)] == want


# ---- OutputTree ----

@pytest.mark.parametrize("lanes,macs", [(1, 1), (2, 4), (4, 8), (8, 2)])
def test_output_tree_matches_golden(lanes, macs):
    """``clamp((sum a*beta + 2**16) >> 17)`` per element, products at the 18x18 extremes
    (saturating both ways) and random, valid with gaps."""
    rng = random.Random(lanes * 100 + macs)
    dut = OutputTree(lanes, macs)
    big = 1 << 34                   # |a * beta| < 2**17 * 2**17
    stimulus, want = [], []
    for n in range(150):
        prods = [[rng.choice([big - 1, -big, 0, rng.randrange(-big, big),
                              rng.randrange(-(1 << 20), 1 << 20)]) for _ in range(macs)]
                 for _ in range(lanes)]
        valid = int(rng.random() < 0.7)
        stimulus.append({**{f"products.{j}.{k}": prods[j][k]
                            for j in range(lanes) for k in range(macs)}, "valid": valid})
        if valid:
            sums = [sum(prods[j][k] for j in range(lanes)) for k in range(macs)]
            want.append((n + dut.latency, list(round_output(sums))))
    stimulus += [{"valid": 0}] * dut.latency
    got = run(dut, stimulus, ["o", "o_valid"])
    seen = [(n, [g["o"][k] for k in range(macs)]) for n, g in enumerate(got) if g["o_valid"]]
    assert seen == want


@pytest.mark.parametrize("cls,args,message", [
    (Reciprocal, (0,), "width must be"),
    (WeightSum, (20, 20), "total_width must be"),
    (BetaUnit, (3, 5), "lanes must be"),
    (LaneMax, (4, 0), "width must be"),
    (OutputTree, (4, 3), "macs must be"),
])
def test_parameter_errors(cls, args, message):
    with pytest.raises(ValueError, match=message):
        cls(*args)
