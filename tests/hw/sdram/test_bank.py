"""Bank machine against its golden model, clock by clock, under random commands."""

import random

import pytest
from amaranth.sim import Simulator
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from ringkv.defs.sdram import CHIPS, Cmd
from ringkv.host.golden.sdram import BankGolden
from ringkv.hw.sdram.bank import BankMachine

CHIP = CHIPS["MT48LC16M16A2-7E"]


@settings(max_examples=examples(fast=4, thorough=40), deadline=None)
@given(seed=st.integers(0, 2**30), tck=st.sampled_from((7.5, 10.0, 20.0)),
       bl=st.sampled_from((1, 2, 8)), rate=st.sampled_from((1, 2)))
def test_bank_machine_matches_golden(seed, tck, bl, rate):
    """Bursts offered at random to a queue of 3 (often full), and in each clock a random legal
    choice of the multiplexer: the machine's ACTIVE, PRECHARGE or READ/WRITE when it asks, a
    command to another bank, PRECHARGE ALL when it is idle and may precharge, or nothing. Every
    output equals the golden model's in every clock. ``rate`` 2: the half-rate machine (the
    SDRAM's timings at ``tck``, the machine at ``2 * tck``)."""
    run_against_golden(seed, tck, max(bl, rate), rate=rate)


@pytest.mark.parametrize("bl", [2, 8])
def test_half_rate_machine_waits_the_rounded_up_intervals(bl):
    """At half rate the golden model and the machine agree with the rounding (a golden model of
    rate 1 at the SDRAM's timings differs: the comparison sees the rate). 6 ns, tRCD 3 SDRAM
    clocks: 2 of the machine's."""
    run_against_golden(3, 6.0, bl, rate=2)
    with pytest.raises(AssertionError):
        run_against_golden(3, 6.0, bl, rate=2, golden_rate=1)


@pytest.mark.parametrize("bug", ["trcd", "tras", "closed_bank"])
def test_a_broken_machine_differs_from_golden(bug):
    """The comparison can fail: three broken machines differ from the golden model (at 6 ns,
    where tRCD is 3 clocks: a machine says nothing in the clock after its own command, so a
    tRCD or tRP one clock short is only a fault where it is at least 3)."""
    with pytest.raises(AssertionError):
        run_against_golden(1, 6.0, 2, bug=bug)


def run_against_golden(seed, tck, bl, bug=None, rate=1, golden_rate=None):
    t = CHIP.timing(tck)
    dut = BankMachine(1, t, bl=bl, row_bits=CHIP.row_bits, col_bits=CHIP.col_bits,
                      bank_bits=2, addr_bits=13, port_bits=1, depth=3, rate=rate, _bug=bug)
    gold = BankGolden(1, t, bl=bl, depth=3, rate=rate if golden_rate is None else golden_rate)
    rng = random.Random(seed)

    async def bench(ctx):
        for _ in range(400):
            want = gold.outputs()
            for name in ("want_act", "want_pre", "col_ready", "idle", "pre_ok", "open"):
                assert ctx.get(getattr(dut, name)) == want[name], name
            if want["open"]:
                assert ctx.get(dut.row) == want["row"]
            if want["head"] is not None:
                head = ctx.get(dut.head)
                assert (head.row, head.col, head.write, head.port) == want["head"]
            push = None
            if rng.random() < 0.4:
                push = (rng.choice((3, 3, 77, 8191)), rng.randrange(0, 512, bl),
                        rng.randrange(2), rng.randrange(2))
            ctx.set(dut.req.valid, push is not None)
            if push is not None:
                ctx.set(dut.req.payload, dict(zip(("row", "col", "write", "port"), push)))
            options = [(Cmd.NOP, 0, 0), (rng.choice((Cmd.ACTIVE, Cmd.READ, Cmd.WRITE,
                                                     Cmd.PRECHARGE)), rng.choice((0, 2, 3)),
                                         rng.randrange(8192))]
            if want["want_act"]:
                options += [(Cmd.ACTIVE, 1, want["head"][0])] * 3
            if want["want_pre"]:
                options += [(Cmd.PRECHARGE, 1, 0)] * 3
            if want["col_ready"]:
                options += [(Cmd.WRITE if want["head"][2] else Cmd.READ, 1,
                             want["head"][1])] * 3
            if want["idle"] and want["pre_ok"]:
                options.append((Cmd.PRECHARGE, rng.randrange(4), 1 << 10))
            issued = rng.choice(options)
            if issued[0] in (Cmd.READ, Cmd.WRITE) and issued[1] != 1:
                issued = (issued[0], issued[1], issued[2] & ~(1 << 10))
            ctx.set(dut.issued, {"cmd": issued[0].value, "ba": issued[1], "a": issued[2]})
            ready = ctx.get(dut.req.ready)
            assert gold.clock(push, issued) == (push is not None and ready)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
