"""Hot tier: Amaranth-simulator tests against the golden model, exact clocks, parameter checks,
and the broken variants that the tests must catch."""

import random

import pytest
from conftest import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ringkv.defs.hot_tier import Op, SlotState, Status
from ringkv.host.golden.hot_tier import GoldenHotTier, random_commands
from ringkv.hw.store.hot_tier import BUGS, HotTier, layout_fields
from ringkv.sim.streams import run_commands

SMALL = dict(regions=16, slots=5, stamp_width=8)


def rtl_hot_tier(params, commands, *, seed=0, idle=0.0, stall=0.0, bug=None):
    """Run ``commands`` through the gateware; return ``(responses, clocks)``: the response
    dicts, and for each command the clocks from its transfer to ``o.valid``."""
    return run_commands(HotTier(**params, _bug=bug), commands, seed=seed, idle=idle,
                        stall=stall)


def golden_run(params, commands, golden=None):
    """``(golden, responses, clocks)`` of ``commands`` on the golden model."""
    g = golden or GoldenHotTier(**params)
    responses, clocks = [], []
    for cmd in commands:
        responses.append(g.command(cmd))
        clocks.append(g.clocks)
    return g, responses, clocks


def reveal(g):
    """Commands that reveal the whole state: READ every slot, then COUNT."""
    return [{"op": Op.READ, "slot": s} for s in range(g.slots)] + [{"op": Op.COUNT}]


def _alloc(region, now=0):
    return {"op": Op.ALLOC, "region": region, "now": now}


def _commit(region, slot, now=0):
    return {"op": Op.COMMIT, "region": region, "slot": slot, "now": now}


def _lookup(region, now=0):
    return {"op": Op.LOOKUP, "region": region, "now": now}


def _status(responses):
    return [Status(r["status"]).name for r in responses]


# -- parameters --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(regions=3), ValueError,
     "Region count must be a power of two between 2 and 16777216, not 3"),
    (dict(regions=1 << 25), ValueError,
     "Region count must be a power of two between 2 and 16777216, not 33554432"),
    (dict(regions=1.0), TypeError, "Region count must be an integer, not 1.0"),
    (dict(slots=1), ValueError, "Slot count must be between 2 and 1024, not 1"),
    (dict(slots=1025), ValueError, "Slot count must be between 2 and 1024, not 1025"),
    (dict(slots=True), TypeError, "Slot count must be an integer, not True"),
    (dict(stamp_width=0), ValueError, "Stamp width must be between 1 and 32 bits, not 0"),
    (dict(stamp_width="8"), TypeError, "Stamp width must be an integer, not '8'"),
    (dict(_bug="nope"), ValueError,
     "Unknown bug 'nope'; known: ('lru_tie', 'commit_unchecked', 'drop_leak', "
     "'stale_victim')"),
    (dict(_full=True), ValueError, "_full needs formal=True and slots <= regions"),
])
def test_parameter_errors(kwargs, exc, message):
    with pytest.raises(exc) as info:
        HotTier(**kwargs)
    assert str(info.value) == message
    if not any(name.startswith("_") for name in kwargs):
        with pytest.raises(exc) as info:
            GoldenHotTier(**kwargs)
        assert str(info.value) == message


def test_properties():
    dut = HotTier(slots=250)
    assert (dut.regions, dut.slots, dut.stamp_width) == (4096, 250, 32)
    assert dut.params() == dict(regions=4096, slots=250, stamp_width=32)
    assert GoldenHotTier(**dut.params()).slots == 250
    names = [name for name, _ in layout_fields(dut.resp_layout)]
    assert names[:4] == ["status", "op", "evicted", "slot"]


# -- behaviour ---------------------------------------------------------------------------------

def test_write_through_cycle():
    """ALLOC reserves (LOOKUP misses until COMMIT), COMMIT makes it valid, LOOKUP refreshes
    the stamp, re-ALLOC of a mapped region reuses its slot and hides the old copy, ABORT
    unmaps, DROP frees (and misses when unmapped), READ shows each state."""
    cmds = [_alloc(3, now=1),                                  # slot 0
            _lookup(3, now=2),                                 # reserved: MISS
            {"op": Op.READ, "slot": 0},
            _commit(3, 0, now=4),
            _lookup(3, now=9),                                 # hit, stamp 9
            {"op": Op.READ, "slot": 0},
            _alloc(3, now=10),                                 # rewrite: slot 0 again
            _lookup(3, now=11),                                # MISS while rewritten
            {"op": Op.ABORT, "region": 3, "slot": 0},
            _lookup(3, now=12), {"op": Op.READ, "slot": 0},
            _alloc(7, now=13),                                 # slot 1 (freed 0 goes last)
            _commit(7, 1, now=14),
            {"op": Op.DROP, "region": 7}, {"op": Op.DROP, "region": 7},
            {"op": Op.COUNT}]
    g, expected, want_clocks = golden_run(SMALL, cmds)
    got, clocks = rtl_hot_tier(SMALL, cmds)
    assert got == expected and clocks == want_clocks
    assert _status(got) == ["OK", "MISS", "OK", "OK", "OK", "OK", "OK", "MISS", "OK", "MISS",
                            "OK", "OK", "OK", "OK", "MISS", "OK"]
    assert [got[n]["slot"] for n in (0, 4, 6, 11)] == [0, 0, 0, 1]
    assert (got[2]["state"], got[2]["region"], got[2]["stamp"]) == (SlotState.RESERVED.value,
                                                                    3, 1)
    assert (got[5]["state"], got[5]["stamp"]) == (SlotState.VALID.value, 9)
    assert (got[10]["state"], got[10]["region"], got[10]["stamp"]) == (0, 0, 0)
    assert got[15]["count"] == 0 and g.state()["free"] == [2, 3, 4, 0, 1]


def test_boundaries_and_errors_change_nothing():
    """Region 0 and the last region, slot 0 and the last slot; every error (BAD_REGION,
    BAD_SLOT, BAD_OP) leaves the state exactly as before."""
    params = SMALL
    last_region, last_slot = params["regions"] - 1, params["slots"] - 1
    setup = [_alloc(0, now=1), _commit(0, 0, now=1)]
    setup += [_alloc(r, now=2) for r in (1, 2, 3)]
    setup += [_alloc(last_region, now=3), _commit(last_region, last_slot, now=3)]
    bad = [_lookup(params["regions"]), _alloc(params["regions"]), _alloc(0xFFFFFF),
           {"op": Op.DROP, "region": 0x800000},
           _commit(params["regions"], 1), _commit(1, last_slot + 1), _commit(1, 0xFFFF),
           _commit(1, 2),                            # reserved for region 2
           _commit(1, 0),                            # valid, not reserved
           {"op": Op.ABORT, "region": last_region, "slot": last_slot},   # valid
           {"op": Op.ABORT, "region": 2, "slot": 1},                     # another region's
           {"op": Op.READ, "slot": last_slot + 1}, {"op": Op.READ, "slot": 0xFFFF},
           {"op": 8, "region": 1}, {"op": 15, "slot": 1}]
    g, _, _ = golden_run(params, setup)
    before = g.state()
    _, expected, _ = golden_run(params, bad, golden=g)
    assert _status(expected) == ["BAD_REGION"] * 5 + ["BAD_SLOT"] * 8 + ["BAD_OP"] * 2
    assert g.state() == before
    tail = [_lookup(0, now=5), _lookup(last_region, now=5),
            {"op": Op.READ, "slot": 0}, {"op": Op.READ, "slot": last_slot}] + reveal(g)
    _, tail_expected, _ = golden_run(params, tail, golden=g)
    got, _ = rtl_hot_tier(params, setup + bad + tail)
    assert got[len(setup):] == expected + tail_expected
    assert [r["slot"] for r in tail_expected[:2]] == [0, last_slot]
    assert tail_expected[3]["region"] == last_region


def test_full_when_every_slot_is_reserved():
    """All slots reserved: ALLOC answers FULL (nothing is evictable) and changes nothing;
    an ABORT frees one, which the next ALLOC takes; with one slot valid, ALLOC evicts it."""
    params = dict(SMALL, slots=3)
    cmds = [_alloc(r, now=r) for r in (4, 5, 6)]
    cmds += [_alloc(9, now=7), _lookup(4), {"op": Op.COUNT},
             {"op": Op.ABORT, "region": 5, "slot": 1},
             _alloc(9, now=8),                         # slot 1
             _commit(9, 1, now=8),
             _alloc(10, now=20),                       # evicts slot 1 (region 9)
             _lookup(9), _alloc(11, now=21)]           # all reserved again: FULL
    g, expected, want_clocks = golden_run(params, cmds)
    expected += golden_run(params, reveal(g), golden=g)[1]
    got, clocks = rtl_hot_tier(params, cmds + reveal(g))
    assert got == expected and clocks[:len(cmds)] == want_clocks
    assert _status(got[:len(cmds)]) == ["OK", "OK", "OK", "FULL", "MISS", "OK", "OK", "OK",
                                        "OK", "OK", "MISS", "FULL"]
    assert (got[9]["evicted"], got[9]["victim_region"], got[9]["slot"]) == (1, 9, 1)
    assert clocks[3] == params["slots"] + 4 and clocks[9] == params["slots"] + 5


def test_lru_ties_and_stamp_wraparound():
    """The victim is the valid slot with the largest age modulo 2**stamp_width (a stamp from
    before the wrap is older); equal ages go to the lowest slot; LOOKUP refreshes."""
    params = dict(SMALL, slots=4, stamp_width=8)
    cmds = []
    for slot, (region, now) in enumerate([(1, 250), (2, 250), (3, 3), (4, 250)]):
        cmds += [_alloc(region, now=now), _commit(region, slot, now=now)]
    cmds += [_alloc(5, now=10),          # ages 16, 16, 7, 16: slot 0 (tie, lowest)
             _commit(5, 0, now=10),
             _lookup(2, now=11),         # slot 1 refreshed: ages now 6?, -, 8, 17
             _alloc(6, now=12),          # slot 3 (stamp 250: age 18)
             _commit(6, 3, now=12),
             _alloc(7, now=13)]          # slot 2 (stamp 3: age 10) before 0 (3) and 1 (2)
    g, expected, want_clocks = golden_run(params, cmds)
    got, clocks = rtl_hot_tier(params, cmds)
    assert got == expected and clocks == want_clocks
    assert [(got[n]["slot"], got[n]["victim_region"]) for n in (8, 11, 13)] == [
        (0, 1), (3, 4), (2, 3)]


def test_clocks_per_operation():
    """The clock counts of docs/blocks/hot_tier.md, written out (the golden model's
    ``clocks`` says the same; the random tests check it on every command)."""
    params = dict(SMALL, slots=3)
    n, sweep = params["slots"], max(params["regions"], params["slots"])
    cases = [({"op": 9}, 1),
             (_lookup(1), 2), (_alloc(1), 2), (_lookup(1), 3), (_commit(1, 0), 2),
             (_lookup(1), 3), ({"op": Op.READ, "slot": 0}, 2), (_lookup(99), 2),
             (_alloc(2), 2), ({"op": Op.ABORT, "region": 2, "slot": 1}, 2),
             (_alloc(2), 2), (_alloc(3), 2), (_commit(3, 1), 2), (_alloc(4), n + 5),
             (_alloc(5), n + 5), (_alloc(6), n + 4),
             ({"op": Op.DROP, "region": 6}, 2), ({"op": Op.DROP, "region": 4}, 2),
             ({"op": Op.COUNT}, n + 2), ({"op": Op.CLEAR}, sweep + 1), (_lookup(1), 2)]
    cmds = [c for c, _ in cases]
    _, expected, want_clocks = golden_run(params, cmds)
    got, clocks = rtl_hot_tier(params, cmds, stall=0.5, seed=3)
    assert got == expected
    assert clocks == want_clocks == [k for _, k in cases]
    assert _status(got[12:16]) == ["OK", "OK", "OK", "FULL"]


# -- random sequences against the golden model --------------------------------------------------

def fill(g, regions, now):
    """ALLOC and COMMIT each of ``regions`` in turn on ``g``: ``(commands, responses)``."""
    cmds, resps = [], []
    for region in regions:
        cmds.append(_alloc(region, now=now))
        resps.append(g.command(cmds[-1]))
        cmds.append(_commit(region, resps[-1]["slot"], now=now))
        resps.append(g.command(cmds[-1]))
        now = (now + 1) & g.stamp_mask
    return cmds, resps


def _random_run(params, seed, count, *, idle=0.3, stall=0.3, bug=None, prefill=0, **kwargs):
    """``prefill`` regions filled first (ALLOC + COMMIT each), then ``count`` random commands,
    then the state read back."""
    rng = random.Random(seed)
    g = GoldenHotTier(**params)
    start = kwargs.pop("now_start", 0)
    cmds, expected = fill(g, rng.sample(range(params["regions"]), prefill), start)
    more, more_expected = random_commands(rng, g, count, now_start=(start + prefill)
                                          & g.stamp_mask, **kwargs)
    cmds, expected = cmds + more, expected + more_expected
    count = len(cmds)
    clocks_golden = golden_run(params, cmds)[2]
    tail = reveal(g)
    expected += golden_run(params, tail, golden=g)[1]
    got, clocks = rtl_hot_tier(params, cmds + tail, seed=seed, idle=idle, stall=stall, bug=bug)
    return g, expected, got, clocks_golden, clocks[:count]


@settings(max_examples=examples(fast=2, thorough=12))
@given(seed=st.integers(0, 2**32 - 1),
       params=st.sampled_from([SMALL, dict(regions=4, slots=3, stamp_width=3),
                               dict(regions=32, slots=8, stamp_width=5)]))
@example(seed=1, params=SMALL)
def test_random_against_golden(seed, params):
    """Thousands of random commands (every op, every status, evictions, FULL, stamp
    wrap-around at small stamp widths) with 30 % idle on ``i`` and 30 % stall on ``o``, always
    at 16 regions x 5 slots and at drawn seeds and shapes: every
    response, every clock count and the final state (every slot read back) equal the golden
    model's."""
    g, expected, got, want_clocks, clocks = _random_run(
        params, seed, 3000, region_pool=2 * params["slots"] + 1)
    assert got == expected
    assert clocks == want_clocks
    seen = {Status(r["status"]).name for r in expected}
    assert {"OK", "MISS", "BAD_REGION", "BAD_SLOT", "BAD_OP"} <= seen
    assert g.evictions > 0


def test_random_against_golden_defaults():
    """The default shape (4096 regions, 256 slots, 32-bit stamps), without CLEAR (each
    sweeps 4096 clocks): 270 regions filled (the last 14 evict), then random commands over
    300 regions, with the stamps wrapping around."""
    params = dict(regions=4096, slots=256, stamp_width=32)
    g, expected, got, want_clocks, clocks = _random_run(
        params, 7, 1200, idle=0.2, stall=0.2, prefill=270, region_pool=300, clears=False,
        now_start=2**32 - 700)
    assert got == expected
    assert clocks == want_clocks
    assert g.evictions > 0 and expected[-1]["count"] > 200


BUG_RUN = dict(seed=11, count=600, idle=0.0, stall=0.0, region_pool=11)


@pytest.fixture(scope="module")
def bug_run_expected():
    """The golden responses of the broken variants' run, checked on the correct gateware."""
    _, expected, got, _, _ = _random_run(SMALL, **BUG_RUN)
    assert got == expected
    return expected


@pytest.mark.parametrize("bug", BUGS)
def test_broken_variants_are_caught(bug, bug_run_expected):
    """Each deliberately broken variant answers differently from the golden model on a
    random run that the correct gateware passes (tests that cannot fail prove nothing)."""
    _, _, got, _, _ = _random_run(SMALL, bug=bug, **BUG_RUN)
    assert got != bug_run_expected
