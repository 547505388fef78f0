"""Hot tier: formal invariants with SymbiYosys (smtbmc + Yices 2), and broken variants.

The hot tier (``formal=True``: tables as registers, invariants as ``Assert`` whenever it is
idle) sits in a harness whose command fields are free inputs narrowed to the small
configuration's ranges plus one bit (so out-of-range regions and slots are exercised), and
whose ``i.valid``/``o.ready`` are free (any idle and backpressure).

As the directory's formal tests (``test_directory_formal.py``): a bounded check with a single
query at the last step. The invariants are asserted only in the idle state, and a stall keeps
the block idle and unchanged, so every idle state reachable within ``depth`` clocks is
reachable exactly at clock ``depth``. Two starts: the empty state (as the reset sweep leaves
it) and the full one (``_full``: every slot valid, the state a fill leaves, checked reachable
below), from which an eviction fits a short depth; the run from empty through an eviction is
in the slow tier.

Invariants (``HotTier._add_properties``): ``pool``: every slot is in the free FIFO or
reserved/valid, exactly once; free + reserved + valid = slots; a free row is all zero; no
fourth state. ``maps``: a mapped region points to a reserved/valid slot whose row names that
region, and every reserved/valid slot's region points back to it.
"""

import pytest
from amaranth.hdl import Signal
from conftest import requires_yices, requires_yowasp

from ringkv.defs.hot_tier import Op
from ringkv.host.golden.hot_tier import GoldenHotTier
from ringkv.hw.store.hot_tier import HotTier
from ringkv.sim.cocotb_run import BUILD_ROOT
from ringkv.sim.formal import CommandHarness, bmc
from ringkv.sim.streams import run_commands

#: Three slots: not a power of two, so the free FIFO's pointers wrap at 3.
FORMAL = dict(regions=4, slots=3, stamp_width=2)
# Which property each broken variant must violate, and a depth that reaches it: a COMMIT of a
# free slot (3 clocks back to idle); ALLOC + DROP (6); from the full start, an ALLOC that
# evicts (slots + 6).
BROKEN = {"commit_unchecked": ("pool", 5, False), "drop_leak": ("pool", 8, False),
          "stale_victim": ("maps", 10, True)}


def hot_tier_harness(**params):
    """The hot tier under free inputs, its command fields one bit wider than their ranges."""
    dut = HotTier(formal=True, **params)
    return CommandHarness(dut, {
        "op": Signal(4), "region": Signal(range(2 * params["regions"])),
        "slot": Signal(range(2 * params["slots"])), "now": Signal(params["stamp_width"]),
    })


def run_sby(name, depth, *, params=FORMAL, **kwargs) -> str:
    """One bounded check (``_bug``/``_checks`` in ``kwargs``): ``"PASS"`` or ``"FAIL"``."""
    harness = hot_tier_harness(**params, **kwargs)
    return bmc(harness, BUILD_ROOT / "formal" / f"hot_tier_{name}", depth, last_step_only=True)


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("full", [False, True], ids=["empty", "full"])
def test_formal_invariants_hold(full):
    """All invariants hold for every run of up to 12 clocks (up to four commands) from the
    empty state and from the full one (every slot valid: evictions; see ``full_start``)."""
    assert run_sby(f"ok_{'full' if full else 'empty'}_12", 12, _full=full) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("bug", sorted(BROKEN))
def test_formal_broken_variant_fails(bug):
    """Each property group fails on the variant that breaks it (``lru_tie`` keeps every
    invariant: only the simulator tests against the golden model catch it)."""
    checks, depth, full = BROKEN[bug]
    assert run_sby(f"bug_{bug}", depth, _bug=bug, _checks=(checks,), _full=full) == "FAIL"


@requires_yowasp
@requires_yices
@pytest.mark.slow     # 6 minutes on 2 busy cores; the fast tier starts the eviction from full
def test_formal_invariants_hold_from_empty_through_eviction():
    """Two slots from the empty state, 21 clocks: ALLOC and COMMIT of both, then an ALLOC
    that evicts, all within the depth."""
    assert run_sby("ok_slots2_21", 21, params=dict(FORMAL, slots=2)) == "PASS"


def test_full_start_is_reachable():
    """The ``_full`` start is the state ALLOC + COMMIT of regions 0..slots-1 at now = 0 leaves
    (so checks from it are sound): the register build started there answers a READ of every
    slot, a LOOKUP of every region and an evicting ALLOC as the golden model after that fill."""
    params = dict(FORMAL)
    g = GoldenHotTier(**params)
    for r in range(params["slots"]):
        slot = g.command({"op": Op.ALLOC, "region": r})["slot"]
        g.command({"op": Op.COMMIT, "region": r, "slot": slot})
    probe = ([{"op": Op.READ, "slot": s} for s in range(params["slots"])]
             + [{"op": Op.LOOKUP, "region": r, "now": 1} for r in range(params["regions"])]
             + [{"op": Op.ALLOC, "region": params["regions"] - 1, "now": 2}, {"op": Op.COUNT}])
    expected = [g.command(c) for c in probe]
    got, _ = run_commands(HotTier(formal=True, _full=True, **params), probe)
    assert got == expected
    assert expected[-2]["evicted"] == 1
