"""Tiered storage: bounded formal check with SymbiYosys (smtbmc + Yices 2) that SDRAM never
serves a byte the card does not hold, and the broken variants that it catches.

``ringkv.sim.tiered_sim.TieredFormalHarness``: a ``TieredStorage`` of 2 regions × 2 sectors and
2 slots (``formal=True``: the hot tier's tables and the extents as registers) under free
inputs -- the initiator's commands (sectors inside and outside the record area, counts 0..3),
every valid and ready, the backends' statuses and errors at any time after their command -- and a
shadow of which write each card and SDRAM sector last received and whether it ended OK there.
Properties: ``read`` (a read offered to SDRAM reads sectors holding, OK, the same write as the
card sectors asked for) and ``copies`` (every written sector of a slot the hot tier holds valid
equals its region's card sector), plus the hot tier's own invariants.

As the hot tier's and the directory's formal tests: a bounded check with a single query at the
last step. A violation of either property persists while the environment stalls (a read
command is held until the SDRAM side takes it; a copy's disagreement stays while no command
moves), so every violation within ``depth`` clocks is one at clock ``depth``. Two starts: empty
(after reset) and ``full`` (the state two exports leave: region s committed in slot s, slot 0
with only its header sector written), from which reads and writes of committed copies fit a
short depth: an export's committing write alone takes 15 clocks from empty. ``compact``: the
same harness over compact slots (regions of 3 sectors whose middle one is the gap, slots of 2).
"""

import pytest
from conftest import requires_yices, requires_yowasp

from ringkv.sim.cocotb_run import BUILD_ROOT
from ringkv.sim.formal import bmc
from ringkv.sim.tiered_sim import TieredFormalHarness

#: the broken variants a data property catches (``early`` breaks a rule, not the data: only
#: the simulation's comparison with the golden model catches it, as ``lru_tie`` in the hot tier)
CAUGHT = ("address", "error", "extents", "span", "stale")


def run_sby(name, depth, **kwargs) -> str:
    return bmc(TieredFormalHarness(**kwargs), BUILD_ROOT / "formal" / f"tiered_{name}", depth,
               last_step_only=True)


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("full, depth", [(True, 16), (False, 20)], ids=["full16", "empty20"])
def test_formal_holds(full, depth):
    """From two committed copies, 16 clocks: a read or a write of either region, a CLEAR; from
    empty, 20: an export's header write committing (15 clocks) and the next command."""
    assert run_sby(f"ok_{'full' if full else 'empty'}_{depth}", depth, full=full) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.slow
def test_formal_holds_longer():
    """From full, 22 clocks."""
    assert run_sby("ok_full_22", 22, full=True) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("bug", CAUGHT)
def test_formal_broken_variant_fails(bug):
    assert run_sby(f"bug_{bug}", 16, bug=bug, full=True) == "FAIL"


#: the compact slots' broken variants a data property catches (``gap_read`` changes only the
#: clocks: the extents never hold a gap sector)
CAUGHT_COMPACT = ("gap_address", "gap_keep", "gap_write")


@requires_yowasp
@requires_yices
def test_formal_compact_holds():
    """Compact slots (regions of 3 sectors, the middle one the gap; slots of 2), from full,
    16 clocks: SDRAM serves only the card's bytes and no extent holds the gap."""
    assert run_sby("ok_compact_full_16", 16, full=True, compact=True) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("bug", CAUGHT_COMPACT)
def test_formal_compact_broken_variant_fails(bug):
    assert run_sby(f"bug_compact_{bug}", 16, bug=bug, full=True, compact=True) == "FAIL"
