"""SDRAM controller in the Amaranth simulator, on the pin-level model, against the golden model.

Every test runs the whole controller on :class:`ringkv.sim.sdram_model.SdramModel` (strict
unless a broken variant is expected), with random idle on every port's command and write-data
streams and random backpressure on its read stream, and compares what the ports read with
:class:`ringkv.host.golden.sdram.SdramGolden`. Chips are scaled down where a datasheet figure
would make the run long (a 0.5 to 2 us power-up instead of 100 to 200 us; a refresh period of a
few refreshes instead of 8192 in 64 ms); the rules are the same.
"""

import random
from unittest.mock import patch

import pytest
from amaranth.sim import Simulator
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from sdram_helpers import overlapping_script, port_scripts, run, small, thrash_script

from ringkv.defs.sdram import DEFAULT_CHIP, mode_register
from ringkv.host.golden.sdram import init_commands, refresh_interval
from ringkv.hw.sdram.controller import (
    BUGS,
    SdramController,
    read_latency,
    refresh_interval_clocks,
)
from ringkv.hw.sdram.init import INIT_BUGS
from ringkv.sim.sdram_model import SdramModel, amaranth_sdram
from ringkv.sim.streams import tick_until

# -- parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(cl=4), ValueError, "CAS latency must be 2 or 3, not 4"),
    (dict(bl=3), ValueError, "Burst length must be 1, 2, 4 or 8, not 3"),
    (dict(ports=0), ValueError, "Ports must be between 1 and 16, not 0"),
    (dict(cl=2, tck_ns=7.0), ValueError,
     "MT48LC16M16A2-6A at CAS latency 2 needs an SDRAM clock period of at least 7.5 ns, not 7"),
    (dict(fifo_depth=24), ValueError,
     "FIFO depth must be a power of two between 16 and 4096, not 24"),
    (dict(chip="MT48LC16M16A2"), TypeError, "Chip must be a SdramChip, not 'MT48LC16M16A2'"),
    (dict(_bug="nope"), ValueError, "Unknown bug 'nope'"),
    (dict(tck_ns=0), ValueError, "Clock period must be positive, not 0"),
    (dict(read_delay=2), ValueError, "Read delay must be between 0 and 1 clocks, not 2"),
    (dict(rate=3), ValueError, "Rate must be 1 or 2 SDRAM clocks a controller clock, not 3"),
    (dict(rate=2, bl=1), ValueError, "Burst length 1 is shorter than the rate 2"),
    (dict(rate=2, cl=2, tck_ns=14.0), ValueError,
     "MT48LC16M16A2-6A at CAS latency 2 needs an SDRAM clock period of at least 7.5 ns, not 7"),
    (dict(rate=2, bl=8, fifo_depth=4), ValueError,
     "FIFO depth must be a power of two between 8 and 4096, not 4"),
])
def test_bad_parameters(kwargs, exc, message):
    with pytest.raises(exc, match=message.replace("(", r"\(")):
        SdramController(**kwargs)


# -- power-up, refresh -----------------------------------------------------------------------

@pytest.mark.parametrize("name, cl", [("MT48LC16M16A2-6A", 2), ("IS42S16160G-7", 3),
                                      ("AS4C32M16SB-7", 3)])
def test_power_up_sequence_matches_golden(name, cl):
    """The commands up to ``ready`` are the golden sequence, clock for clock, and the model
    accepts them (the model sees a command two clocks after the gateware chose it: the
    command register and the PHY; its clock 0 is the first edge)."""
    chip = small(name, power_up_ns=400)
    ctrl = SdramController(chip, tck_ns=10.0, cl=cl, bl=4)
    result, _ = run(ctrl, [[]])
    want = init_commands(chip.timing(10.0), mode_register(cl, 4), chip.init_refreshes)
    got = [(clock - 1, cmd, a) for clock, cmd, _, a in result.model.commands]
    assert got == [w for w in want if w[1] is not None]
    # ``ready`` rises in the golden clock; the testbench sees it at the edge that ends it
    assert result.start == want[-1][0] + 1 and result.model.ready


def test_refresh_interval_matches_golden():
    """Refreshes come every golden interval (7/8 of 64 ms / 8192, here scaled), and the model's
    refresh-period rule holds over more than two periods while traffic runs."""
    chip = small(refreshes=4, refresh_ns=4 * 1500)
    ctrl = SdramController(chip, tck_ns=7.5, cl=3, bl=2, ports=1)
    assert refresh_interval_clocks(chip, 7.5) == refresh_interval(chip, 7.5) == 175
    rng = random.Random(5)
    scripts = port_scripts(rng, chip, 2, 1, 150)
    result, bad = run(ctrl, scripts, idle=0.0, stall=0.0)
    refs = [c for c, cmd, _, _ in result.model.commands if cmd.name == "REFRESH"]
    refs = refs[chip.init_refreshes:]
    assert len(refs) >= 6 and bad == 0
    # a refresh may wait for its grant (bursts in flight drain first), but the timer never
    # drifts: the k-th is due (k + 1) intervals after the power-up sequence ends
    start = result.model.init_done_at
    assert all(0 <= c - start - (k + 1) * 175 < 40 for k, c in enumerate(refs))


# -- random traffic against the golden model --------------------------------------------------

CONFIGS = [("MT48LC16M16A2-6A", 7.5, 2, 8), ("MT48LC16M16A2-7E", 7.5, 3, 2),
           ("IS42S16160G-7", 10.0, 2, 4), ("AS4C32M16SB-7", 7.0, 3, 1),
           ("MT48LC16M16A2-6A", 16.0, 3, 8)]


@settings(max_examples=examples(fast=2, thorough=20), deadline=None)
@given(config=st.sampled_from(CONFIGS), ports=st.integers(1, 3), seed=st.integers(0, 2**30),
       idle=st.sampled_from((0.0, 0.3)), stall=st.sampled_from((0.0, 0.5)))
def test_random_traffic_against_golden(config, ports, seed, idle, stall):
    """Random writes (random byte masks) and reads, overlapping, across rows and banks, on every
    port at once with random idle and backpressure: every read equals the golden model and the
    pin-level model finds no violation (strict: the first one fails the test)."""
    name, tck, cl, bl = config
    chip = small(name, refreshes=8, refresh_ns=8 * 2500)
    ctrl = SdramController(chip, tck_ns=tck, cl=cl, bl=bl, ports=ports)
    rng = random.Random(seed)
    scripts = port_scripts(rng, chip, bl, ports, 24)
    result, bad = run(ctrl, scripts, seed=seed, idle=idle, stall=stall)
    assert bad == 0 and result.model.violations == []


@pytest.mark.slow       # 9 s; make test has the sequential bench smoke (tests/benchmarks), which
                        # checks every word against the golden model too
def test_sequential_read_after_write_one_port():
    """One long sequential write then read across two rows (two banks), no backpressure: the
    data comes back exactly."""
    chip = small("MT48LC16M16A2-6A")
    ctrl = SdramController(chip, tck_ns=10.0, cl=2, bl=8)
    rng = random.Random(3)
    data = [rng.randrange(1 << 16) for _ in range(2 * chip.cols)]
    script = [("w", 256, data, [0] * len(data)), ("r", 256, len(data) // 2),
              ("r", 256 + len(data) // 2, len(data) // 2)]
    result, bad = run(ctrl, [script], idle=0.0, stall=0.0)
    assert bad == 0 and result.reads[0][0][1] + result.reads[0][1][1] == data


# -- broken variants: each caught -------------------------------------------------------------

#: bug -> (chip, clock period, burst length, what catches it: a model rule or "data")
BROKEN = {
    "power_up": ("MT48LC16M16A2-7E", 7.5, 2, "power_up"),
    "no_precharge": ("MT48LC16M16A2-7E", 7.5, 2, "init_precharge"),
    "refreshes": ("MT48LC16M16A2-7E", 7.5, 2, "init_refresh"),
    "no_mode": ("MT48LC16M16A2-7E", 7.5, 2, "init_mode"),
    "tmrd": ("MT48LC16M16A2-7E", 7.5, 2, "tmrd"),
    "refresh_interval": ("MT48LC16M16A2-7E", 7.5, 2, "refresh_interval"),
    "trfc": ("MT48LC16M16A2-7E", 7.5, 2, "trfc"),
    # a bank machine says nothing in the clock after its own command: tRCD and tRP one clock
    # short are faults only where they are at least 3 clocks
    "trcd": ("MT48LC16M16A2-6A", 6.0, 2, "trcd"),
    "trp": ("MT48LC16M16A2-6A", 6.0, 2, "trp"),
    "tras": ("MT48LC16M16A2-7E", 7.5, 2, "tras"),
    "trc": ("MT48LC16M16A2-7E", 7.5, 2, "trc"),
    "twr": ("MT48LC16M16A2-7E", 7.5, 2, "twr"),
    "closed_bank": ("MT48LC16M16A2-7E", 7.5, 2, "closed_bank"),
    "open_bank": ("MT48LC16M16A2-7E", 7.5, 2, "open_bank"),
    "trrd": ("MT48LC16M16A2-7E", 7.5, 2, "trrd"),
    "turnaround": ("MT48LC16M16A2-7E", 7.5, 2, "bus"),
    "burst_length": ("MT48LC16M16A2-7E", 7.5, 2, "bus"),
    "cas_latency": ("MT48LC16M16A2-7E", 10.0, 2, "data"),
    "dqm": ("MT48LC16M16A2-7E", 7.5, 2, "data"),
}


def test_every_bug_has_a_case():
    assert sorted(BROKEN) == sorted(BUGS)


@pytest.mark.parametrize("bug", BUGS)
def test_broken_variant_caught(bug):
    """Each deliberately broken controller fails: the model names the rule it broke, or (CAS
    latency, DQM) the data read back differs from the golden model. The same traffic on the
    correct controller passes (the test can fail)."""
    name, tck, bl, caught_by = BROKEN[bug]
    chip = small(name, refreshes=4, refresh_ns=4 * 1000)
    rng = random.Random(11)
    # the power-up's mistakes show at the first ACTIVE: a few bursts are enough
    # (a hit on a row that a refresh closed needs a few refreshes: more bursts)
    n = 3 if bug in INIT_BUGS else 48 if bug == "closed_bank" else 24
    scripts = [overlapping_script(rng, chip, bl, n, base=0),
               thrash_script(rng, chip, bl, n, base=chip.words // 2 + chip.cols)]
    kw = dict(tck_ns=tck, cl=3 if tck < 7.5 or bug != "cas_latency" else 2, bl=bl, ports=2)
    result, bad = run(SdramController(chip, _bug=bug, **kw), scripts, strict=False,
                      tail=600 if bug == "refresh_interval" else 0)
    rules = {rule for _, rule, _ in result.model.violations}
    if caught_by == "data":
        assert bad > 0
    else:
        assert caught_by in rules, rules


def test_broken_variants_traffic_passes_on_the_correct_controller():
    chip = small(refreshes=4, refresh_ns=4 * 1000)
    rng = random.Random(11)
    scripts = [overlapping_script(rng, chip, 2, 24, base=0),
               thrash_script(rng, chip, 2, 24, base=chip.words // 2 + chip.cols)]
    result, bad = run(SdramController(chip, tck_ns=7.5, cl=3, bl=2, ports=2), scripts,
                      tail=600)
    assert bad == 0 and result.model.violations == []


def test_default_chip_is_the_ulx3s_micron_part():
    assert DEFAULT_CHIP.name == "MT48LC16M16A2-6A" and DEFAULT_CHIP.words * 2 == 32 << 20


@pytest.mark.parametrize("cl, read_delay, rate", [(2, 0, 1), (3, 0, 1), (2, 1, 1),
                                                   (2, 0, 2), (3, 0, 2), (2, 1, 2), (3, 1, 2)])
def test_read_latency(cl, read_delay, rate):
    """First word on ``r`` ``CL + 7`` clocks after the command's transfer on an open row, and
    ``tRCD`` more on a closed bank (the docstring's and docs/blocks/sdram.md's figures); one
    more with ``read_delay`` 1 (on the model that takes the pins an edge later). At half rate
    (``CL`` and ``read_delay`` in SDRAM clocks) the same five clocks of the arbiter, the queue,
    the decision and the FIFO, plus :func:`read_latency`'s ``ceil((5 + CL + read_delay) / 2)``
    for the way through the PHY, and tRCD in controller clocks (at least the two clocks of the
    bank machine's registered decision)."""
    chip = small("MT48LC16M16A2-6A")
    ctrl = SdramController(chip, tck_ns=10.0 * rate, cl=cl, bl=8, read_delay=read_delay,
                           rate=rate)
    model = SdramModel(chip, 10.0)
    out = {}

    async def bench(ctx):
        await tick_until(ctx, ctrl.ready)
        await ctx.tick().repeat(100)      # past the first refresh: every bank closed
        port = ctrl.port[0]
        for addr, key in ((0, "closed"), (8, "open")):
            ctx.set(port.cmd.valid, 1)
            ctx.set(port.cmd.payload, {"addr": addr, "write": 0, "count": 1})
            await tick_until(ctx, port.cmd.ready)
            ctx.set(port.cmd.valid, 0)
            ctx.set(port.r.ready, 1)
            clocks = 1
            while not (await ctx.tick().sample(port.r.valid))[2]:
                clocks += 1
            out[key] = clocks
            await ctx.tick().repeat(20)

    sim = Simulator(ctrl)
    sim.add_clock(1e-8 * rate, phase=1e-8 * rate)
    if rate == 2:
        sim.add_clock(1e-8, phase=2e-8, domain="sync2x")
    sim.add_testbench(amaranth_sdram(model, ctrl.pins, pin_delay=read_delay,
                                     domain="sync" if rate == 1 else "sync2x"),
                      background=True)
    sim.add_testbench(bench)
    sim.run()
    if rate == 1:
        assert out == {"open": cl + 7 + read_delay,
                       "closed": cl + 7 + read_delay + chip.timing(10.0).rcd}
    else:
        through_phy = -(-(5 + cl + read_delay) // 2)
        assert read_latency(cl, read_delay, 2) == through_phy
        # (tRCD is one controller clock here, but a bank machine says nothing in the clock
        # after its own ACTIVE: two)
        assert out == {"open": through_phy + 5,
                       "closed": through_phy + 5 + max(chip.timing(10.0).at_rate(2).rcd, 2)}
    assert model.violations == []


@pytest.mark.parametrize("cl", [2, 3])
def test_read_delay_on_an_sdram_clock_lagging_by_nearly_a_period(cl):
    """``read_delay=1`` (the board at 60 MHz: the SDRAM's edge just before the controller's
    next one, the input register taking each word an edge after ``CL``): random traffic on
    two ports with idle and backpressure on the model that takes the pins an edge later
    (``PinDelay``) reads what the golden model says, with no rule broken. Either side alone
    (the controller's delay without the model's, or the reverse) reads wrong words."""
    chip = small(refreshes=4, refresh_ns=4 * 1000)
    rng = random.Random(23 + cl)
    scripts = port_scripts(rng, chip, 4, 2, 20)
    ctrl = SdramController(chip, tck_ns=7.5, cl=cl, bl=4, ports=2, read_delay=1)
    assert ctrl.read_delay == 1
    result, bad = run(ctrl, scripts, seed=cl, tail=400)
    assert bad == 0 and result.model.violations == []
    assert sum(len(r) for r in result.reads) == sum(op[0] == "r" for sc in scripts for op in sc)
    for read_delay, pin_delay in ((1, 0), (0, 1)):
        _, bad = run(SdramController(chip, tck_ns=7.5, cl=cl, bl=4, ports=2,
                                     read_delay=read_delay), scripts, strict=False, seed=cl,
                     tail=400, pin_delay=pin_delay)
        assert bad > 0, (read_delay, pin_delay)


# -- half rate: the controller at half the SDRAM clock, two words a clock --------------------

#: (chip, controller clock period, CL, BL, read_delay): the board's 60 MHz controller with the
#: SDRAM at 120 MHz among them
HALF_RATE_CONFIGS = [("MT48LC16M16A2-6A", 16.0, 3, 8, 0), ("MT48LC16M16A2-6A", 1000 / 60, 3, 8, 1),
                     ("MT48LC16M16A2-7E", 15.0, 2, 2, 0), ("IS42S16160G-7", 20.0, 3, 4, 1),
                     ("AS4C32M16SB-7", 14.0, 3, 2, 0), ("MT48LC16M16A2-6A", 20.0, 2, 8, 1)]


@settings(max_examples=examples(fast=3, thorough=24), deadline=None)
@given(config=st.sampled_from(HALF_RATE_CONFIGS), ports=st.integers(1, 3),
       seed=st.integers(0, 2**30), idle=st.sampled_from((0.0, 0.3)),
       stall=st.sampled_from((0.0, 0.5)))
def test_half_rate_random_traffic_against_golden(config, ports, seed, idle, stall):
    """The half-rate controller (its PHY's registers and the pin-level model on the fast clock,
    every other edge the controller's): random writes with byte masks and reads on every port
    at once, with idle and backpressure, read what the golden model says (the ports' 32-bit
    words split into their two 16-bit words), and the model finds no violation."""
    name, tck, cl, bl, read_delay = config
    chip = small(name, refreshes=8, refresh_ns=8 * 2500)
    ctrl = SdramController(chip, tck_ns=tck, cl=cl, bl=bl, ports=ports, rate=2,
                           read_delay=read_delay)
    assert ctrl.sdram_tck_ns == tck / 2 and len(ctrl.port[0].r.payload) == 32
    rng = random.Random(seed)
    scripts = port_scripts(rng, chip, bl, ports, 24)
    result, bad = run(ctrl, scripts, seed=seed, idle=idle, stall=stall)
    assert bad == 0 and result.model.violations == []
    assert sum(len(r) for r in result.reads) == sum(op[0] == "r" for sc in scripts for op in sc)
    # every command on the pins came in the first SDRAM clock of a controller clock
    first = result.model.commands[0][0] % 2
    assert all(clock % 2 == first for clock, *_ in result.model.commands)


@pytest.mark.parametrize("cl, read_delay", [(2, 0), (3, 0), (3, 1)])
def test_half_rate_pairing_and_read_delay_are_needed(cl, read_delay):
    """The PHY's pairing of the words (``half_rate_read_even``) and ``read_delay`` matter: the
    wrong pairing, or a ``read_delay`` the pins do not have, reads wrong words (the test of
    the half-rate data path can fail)."""
    chip = small(refreshes=4, refresh_ns=4 * 1000)
    rng = random.Random(cl + 7 * read_delay)
    scripts = port_scripts(rng, chip, 4, 2, 16)
    kw = dict(tck_ns=16.0, cl=cl, bl=4, ports=2, rate=2)
    result, bad = run(SdramController(chip, read_delay=read_delay, **kw), scripts, tail=200)
    assert bad == 0 and result.model.violations == []
    _, bad = run(SdramController(chip, read_delay=1 - read_delay, **kw), scripts,
                 strict=False, tail=200, pin_delay=read_delay)
    assert bad > 0
    phy = "ringkv.hw.sdram.phy.half_rate_read_even"
    with patch(phy, lambda cl, read_delay=0: (3 + cl + read_delay) % 2 == 1):
        _, bad = run(SdramController(chip, read_delay=read_delay, **kw), scripts,
                     strict=False, tail=200)
    assert bad > 0


#: a bug one controller clock short is two SDRAM clocks short at half rate, but the bank
#: machines' registered decisions (nothing said in the clock after a bank's own command) and
#: the rounding up hide it where the datasheet interval is short: these cases stretch the
#: interval (the rule is the same) so that the broken variant reaches the pins
HALF_RATE_STRETCH = {"tmrd": dict(t_mrd_ck=5), "trcd": dict(t_rcd=40), "trp": dict(t_rp=40),
                     "tras": dict(t_ras=90, t_rc=105), "trc": dict(t_rc=120),
                     "twr": dict(t_wr=20), "trrd": dict(t_rrd=20)}


@pytest.mark.parametrize("bug", BUGS)
def test_half_rate_broken_variant_caught(bug):
    """Every deliberately broken variant at half rate (the controller at twice the period of
    the rate-1 case, bursts of at least 2): the model names its rule or the data differs;
    the correct controller on the same chip and traffic passes."""
    name, tck, bl, caught_by = BROKEN[bug]
    bl = max(bl, 2)
    chip = small(name, refreshes=4, refresh_ns=4 * 1000, **HALF_RATE_STRETCH.get(bug, {}))
    rng = random.Random(11)
    n = 3 if bug in INIT_BUGS else 48 if bug == "closed_bank" else 24
    scripts = [overlapping_script(rng, chip, bl, n, base=0),
               thrash_script(rng, chip, bl, n, base=chip.words // 2 + chip.cols)]
    kw = dict(tck_ns=2 * tck, cl=3 if tck < 7.5 or bug != "cas_latency" else 2, bl=bl,
              ports=2, rate=2)
    tail = 600 if bug == "refresh_interval" else 0
    result, bad = run(SdramController(chip, _bug=bug, **kw), scripts, strict=False, tail=tail)
    rules = {rule for _, rule, _ in result.model.violations}
    if caught_by == "data":
        assert bad > 0
    else:
        assert caught_by in rules, rules
    result, bad = run(SdramController(chip, **kw), scripts, tail=tail)
    assert bad == 0 and result.model.violations == []
