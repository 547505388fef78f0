"""The MAC core's stream invariants, model-checked with SymbiYosys (smtbmc + Yices 2).

The core sits in a harness whose inputs are all free (commands, bytes, ``last``, key words,
``o.ready``: any idle and backpressure) and which tracks whether a message is open and how
many tags are owed. The tag's value is not observed, so yosys removes the datapath (state,
G units, buffers) and the check is over the control alone. Asserted at every step:

- ``i.ready`` is high whenever a message is open, and low otherwise;
- at most one tag is owed; ``o.valid`` only while one is owed; ``cmd.ready`` only when none
  is (exactly one tag per message, never a tag without a message);
- ``o.valid``, once high, holds until the transfer;
- the tag arrives at most :data:`TAG_BOUND` clocks after the message closed (the empty
  message: after its ``cmd``).

The slow tier's depth covers a message of two full blocks and the reuse of both buffers with
no idle (the tightest schedule), and every tag's deadline; ``make test`` checks the first 80
clocks (the key block's compression under the first data block, the first buffer swap). The
deliberately broken variants (``hw/seal/mac.py``'s ``BUGS``) show that the properties can fail
within those depths: one buffer at step 65, a tag per block at step 93.
"""

import pytest
from amaranth.hdl import Assert, Assume, Elaboratable, Module, ResetSignal, Signal
from conftest import requires_yices, requires_yowasp

from ringkv.hw.seal.mac import MacCore
from ringkv.sim.cocotb_run import BUILD_ROOT
from ringkv.sim.formal import bmc

#: Clocks from a message's close to ``o.valid`` at most (``tests/hw/seal/test_mac.py`` measures 91
#: for a 1-byte message; the harness counts from the clock after the close).
TAG_BOUND = 92
#: ``make test``: the key block, a first full data block and the first swap of the buffers.
DEPTH = 80
#: ``make test-all``: two full data blocks at full speed, both buffers reused, every tag due.
DEPTH_SLOW = 150


class MacHarness(Elaboratable):
    def __init__(self, bug=None):
        self.dut = MacCore(_bug=bug)
        self.inputs = {"cmd_valid": Signal(), "person": Signal(), "slot": Signal(2),
                       "empty": Signal(), "i_valid": Signal(), "data": Signal(8),
                       "last": Signal(), "o_ready": Signal(), "key_data": Signal(32)}

    def ports(self):
        return list(self.inputs.values())

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        f = self.inputs
        m.d.comb += [
            dut.cmd.valid.eq(f["cmd_valid"]), dut.cmd.payload.person.eq(f["person"]),
            dut.cmd.payload.slot.eq(f["slot"]), dut.cmd.payload.empty.eq(f["empty"]),
            dut.i.valid.eq(f["i_valid"]), dut.i.payload.data.eq(f["data"]),
            dut.i.payload.last.eq(f["last"]), dut.o.ready.eq(f["o_ready"]),
            dut.key.data.eq(f["key_data"]),
            Assume(~ResetSignal()),
        ]
        open_ = Signal()            # a message's bytes are due
        owed = Signal(2)            # tags owed
        since = Signal(range(256))  # clocks since the message closed, while its tag is owed
        held = Signal()             # o.valid was high and not taken at the last edge
        cmd_go = dut.cmd.valid & dut.cmd.ready
        i_go = dut.i.valid & dut.i.ready
        o_go = dut.o.valid & dut.o.ready
        m.d.sync += owed.eq(owed + cmd_go - o_go)
        with m.If(cmd_go):
            m.d.sync += [open_.eq(~dut.cmd.payload.empty), since.eq(0)]
        with m.Elif(i_go & dut.i.payload.last):
            m.d.sync += [open_.eq(0), since.eq(0)]
        with m.Elif((owed != 0) & ~open_ & (since != 255)):
            m.d.sync += since.eq(since + 1)
        m.d.sync += held.eq(dut.o.valid & ~dut.o.ready)
        m.d.comb += [
            Assert(dut.i.ready == open_),
            Assert(owed <= 1),
            Assert(~dut.o.valid | (owed == 1)),
            Assert(~dut.cmd.ready | (owed == 0)),
            Assert(~held | dut.o.valid),
            Assert(~((owed == 1) & ~open_ & ~dut.o.valid & (since > TAG_BOUND))),
        ]
        return m


def run_sby(name, depth, *, bug=None) -> str:
    """One bounded check of every step up to ``depth``: ``"PASS"`` or ``"FAIL"``."""
    return bmc(MacHarness(bug), BUILD_ROOT / "formal" / f"mac_{name}", depth)


@requires_yowasp
@requires_yices
def test_formal_mac_invariants_hold():
    assert run_sby(f"ok_{DEPTH}", DEPTH) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.slow
def test_formal_mac_invariants_hold_slow():
    assert run_sby(f"ok_{DEPTH_SLOW}", DEPTH_SLOW) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("bug, depth", [
    ("one_buffer", 70), pytest.param("tag_every_block", 100, marks=pytest.mark.slow)])
def test_formal_broken_variant_fails(bug, depth):
    """Each broken variant violates an invariant within the depth (a check that cannot fail
    proves nothing)."""
    assert run_sby(f"bug_{bug}", depth, bug=bug) == "FAIL"
