"""Bank machine: formal invariants with SymbiYosys (smtbmc + Yices 2), and its broken variants.

The harness plays the multiplexer with free choices: in each clock it may issue the bank
machine's ACTIVE, PRECHARGE or READ/WRITE when the machine asks for it, a command to the other
bank, or (when the machine is idle and free to precharge, as the refresher's grant) PRECHARGE
ALL; bursts enter the queue with free rows, columns and directions. A shadow tracker, written
apart from the machine, follows the issued commands and asserts the chip's rules on every
command the machine asked for: no ACTIVE to an open bank, no READ/WRITE to a closed bank or
another row than the burst's, and tRCD, tRP, tRAS, tRC and tWR (and the read burst before a
PRECHARGE); and that the machine's open row is the shadow's.

At half rate (``rate=2``) the same harness runs the machine with the SDRAM's timings
:data:`T2`; the shadow counts the machine's clocks and asserts the rules in SDRAM clocks (two
a clock: every command in the first SDRAM clock of one, the write recovery from the burst's
last word ``BL - 1`` SDRAM clocks after the WRITE).
"""

import pytest
from amaranth.hdl import Array, Assert, Elaboratable, Module, Mux, Signal
from conftest import requires_yices, requires_yowasp

from ringkv.defs.sdram import Cmd, SdramTiming
from ringkv.hw.sdram.bank import BANK_BUGS, BankMachine
from ringkv.sim.cocotb_run import BUILD_ROOT
from ringkv.sim.formal import bmc

# small timings where every rule binds: tRC > tRAS + tRP, tRAS > tRCD + BL; tRCD and tRP of 3,
# as the machine says nothing in the clock after its own command (one clock short of 2 would
# still be legal)
T = SdramTiming(tck_ns=10, rcd=3, rp=3, ras=6, rc=10, rrd=1, wr=2, rfc=3, mrd=2, power_up=1,
                refi=100, ras_max=1000)
BL = 2
# the SDRAM's timings for the half-rate machine: in its clocks (rounded up) the shape of T
T2 = SdramTiming(tck_ns=5, rcd=5, rp=5, ras=11, rc=19, rrd=1, wr=3, rfc=5, mrd=2, power_up=1,
                 refi=200, ras_max=2000)
SAT = 15
# the depth that reaches each broken variant's violation
# in make test: one broken machine (the proof can fail); every one of them is also caught on
# the pin-level model by tests/hw/sdram/test_controller.py, so the other proofs (about 7 s
# each) are in the slow tier
FAST_BUGS = ("open_bank",)
BROKEN = {"trcd": 9, "trp": 15, "tras": 11, "trc": 16, "twr": 12, "closed_bank": 14,
          "open_bank": 18}
# half rate: every broken machine fails within 18 clocks (about 2.5 s each); two of them in
# make test
HALF_FAST_BUGS = ("trcd", "twr")
HALF_BROKEN = {bug: 18 for bug in BANK_BUGS}


class BankHarness(Elaboratable):
    def __init__(self, bug=None, rate=1):
        self.t, self.rate = (T, 1) if rate == 1 else (T2, rate)
        self.dut = BankMachine(0, self.t, bl=BL, row_bits=2, col_bits=2, bank_bits=1,
                               addr_bits=11, depth=2, rate=rate, _bug=bug)
        self.req_valid, self.req_row, self.req_write = Signal(), Signal(2), Signal()
        self.choice, self.other = Signal(3), Signal(2)

    def ports(self):
        return [self.req_valid, self.req_row, self.req_write, self.choice, self.other]

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        t, r = self.t, self.rate        # the shadow's counts are the machine's clocks: r each
        m.d.comb += [dut.req.valid.eq(self.req_valid), dut.req.payload.row.eq(self.req_row),
                     dut.req.payload.write.eq(self.req_write)]
        cmd, ba, a = dut.issued.cmd, dut.issued.ba, dut.issued.a
        m.d.comb += cmd.eq(Cmd.NOP.value)
        mine_act = (self.choice == 1) & dut.want_act
        mine_pre = (self.choice == 2) & dut.want_pre
        mine_col = (self.choice == 3) & dut.col_ready
        pre_all = (self.choice == 4) & dut.idle & dut.pre_ok
        other = self.choice == 5
        with m.If(mine_act):
            m.d.comb += [cmd.eq(Cmd.ACTIVE.value), ba.eq(0), a.eq(dut.head.row)]
        with m.Elif(mine_pre):
            m.d.comb += [cmd.eq(Cmd.PRECHARGE.value), ba.eq(0)]
        with m.Elif(mine_col):
            m.d.comb += [ba.eq(0), cmd.eq(Mux(dut.head.write, Cmd.WRITE.value, Cmd.READ.value))]
        with m.Elif(pre_all):
            # the bank address is don't-care for PRECHARGE ALL: let it be either
            m.d.comb += [cmd.eq(Cmd.PRECHARGE.value), a.eq(1 << 10), ba.eq(self.other[0])]
        with m.Elif(other):
            m.d.comb += [cmd.eq(Array([Cmd.ACTIVE.value, Cmd.READ.value, Cmd.WRITE.value,
                                       Cmd.PRECHARGE.value])[self.other]), ba.eq(1)]

        # the shadow: what the bus did to bank 0, counted apart from the machine
        is_open, row = Signal(), Signal(2)
        since_act, since_pre = Signal(range(SAT + 1), init=SAT), Signal(range(SAT + 1), init=SAT)
        since_read, since_write = (Signal(range(SAT + 1), init=SAT),
                                   Signal(range(SAT + 1), init=SAT))
        for c in (since_act, since_pre, since_read, since_write):
            with m.If(c != SAT):
                m.d.sync += c.eq(c + 1)
        to_me = ba == 0
        precharging = (cmd == Cmd.PRECHARGE.value) & (to_me | a[10])
        with m.If((cmd == Cmd.ACTIVE.value) & to_me):
            m.d.sync += [is_open.eq(1), row.eq(a[:2]), since_act.eq(1)]
            m.d.comb += [Assert(~is_open, "ACTIVE to an open bank"),
                         Assert(since_pre * r >= t.rp, "tRP"),
                         Assert(since_act * r >= t.rc, "tRC")]
        with m.If(((cmd == Cmd.READ.value) | (cmd == Cmd.WRITE.value)) & to_me):
            m.d.comb += [Assert(is_open, "READ/WRITE to a closed bank"),
                         Assert(row == dut.head.row, "READ/WRITE to another row"),
                         Assert(since_act * r >= t.rcd, "tRCD")]
            with m.If(cmd == Cmd.READ.value):
                m.d.sync += since_read.eq(1)
            with m.Else():
                m.d.sync += since_write.eq(1)
        with m.If(precharging):
            m.d.sync += [is_open.eq(0), since_pre.eq(1)]
            with m.If(is_open):
                m.d.comb += [Assert(since_act * r >= t.ras, "tRAS"),
                             Assert(since_write * r >= BL - 1 + t.wr, "tWR"),
                             Assert(since_read * r >= BL, "read burst before PRECHARGE")]
        m.d.comb += Assert(dut.open == is_open, "open row state")
        with m.If(is_open):
            m.d.comb += Assert(dut.row == row, "open row")
        return m


def run_sby(name, depth, bug=None, rate=1) -> str:
    return bmc(BankHarness(bug, rate), BUILD_ROOT / "formal" / f"sdram_bank_{name}", depth)


@requires_yowasp
@requires_yices
def test_bank_invariants_hold():
    """Every rule holds on every run of up to 14 clocks (several bursts, row misses, refreshes
    and the other bank's commands in between)."""
    assert run_sby("ok_14", 14) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("bug", [pytest.param(bug, marks=() if bug in FAST_BUGS else (
    pytest.mark.slow,)) for bug in BANK_BUGS])
def test_bank_broken_variant_fails(bug):
    """Each broken bank machine violates its rule within the depth (a proof that cannot fail
    proves nothing)."""
    assert run_sby(f"bug_{bug}", BROKEN[bug], bug) == "FAIL"


@requires_yowasp
@requires_yices
@pytest.mark.slow       # the same proof, deeper: about a minute more
def test_bank_invariants_hold_deeper():
    assert run_sby("ok_24", 24) == "PASS"


@requires_yowasp
@requires_yices
def test_half_rate_bank_invariants_hold():
    """The half-rate machine keeps every rule, in SDRAM clocks, on every run of up to 14 of its
    clocks."""
    assert run_sby("half_ok_14", 14, rate=2) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("bug", [pytest.param(bug, marks=() if bug in HALF_FAST_BUGS else (
    pytest.mark.slow,)) for bug in HALF_BROKEN])
def test_half_rate_bank_broken_variant_fails(bug):
    assert run_sby(f"half_bug_{bug}", HALF_BROKEN[bug], bug, rate=2) == "FAIL"
