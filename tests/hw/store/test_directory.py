"""Cache directory: Amaranth-simulator tests against the golden model, and parameter checks."""

import random

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from ringkv.defs.directory import NIL, Op, Status
from ringkv.host.golden.directory import GoldenDirectory, random_commands
from ringkv.hw.store.directory import CacheDirectory, layout_fields
from ringkv.sim.cocotb_streams import pack_fields, unpack_fields
from ringkv.sim.streams import run_commands, stream_get, stream_put, tick_until

SMALL = dict(buckets=4, links=8, regions=8, count_width=8, hash_width=16, stamp_width=8)


def rtl_directory(params, commands, *, seed=0, idle=0.0, stall=0.0, timing=False):
    """Run ``commands`` through the gateware; return the response dicts (and cycle counts)."""
    responses, cycles = run_commands(CacheDirectory(**params), commands, seed=seed, idle=idle,
                                     stall=stall)
    return (responses, cycles) if timing else responses


def _ints(cmd):
    return {k: int(v.value) if isinstance(v, Op) else int(v) for k, v in cmd.items()}


def _normalise(responses):
    return [{k: int(v) for k, v in r.items()} for r in responses]


def golden_run(params, commands):
    g = GoldenDirectory(**params)
    return g, _normalise([g.command(c) for c in commands])


def probe(g):
    """Commands that reveal the whole state: read every link, then fill up without eviction."""
    reads = [{"op": Op.READ, "link": n} for n in range(g.links)]
    fills = [{"op": Op.INSERT, "count": 1, "hash": 0x5A5A, "now": 0}
             for _ in range(g.links + 1)]
    return reads + fills


# -- parameters --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(buckets=3), ValueError, "Bucket count must be a power of two between 2 and 65536, not 3"),
    (dict(buckets=1.0), TypeError, "Bucket count must be an integer, not 1.0"),
    (dict(links=1 << 15 + 1), ValueError,
     "Link count must be a power of two between 2 and 32768, not 65536"),
    (dict(links=True), TypeError, "Link count must be an integer, not True"),
    (dict(regions=12), ValueError,
     "Region count must be a power of two between 2 and 16777216, not 12"),
    (dict(count_width=0), ValueError, "Count width must be between 1 and 32 bits, not 0"),
    (dict(hash_width=9), ValueError, "Hash width must be between 10 and 128 bits, not 9"),
    (dict(stamp_width="8"), TypeError, "Stamp width must be an integer, not '8'"),
    (dict(b_threshold=0), ValueError, "FIFO B threshold must be between 1 and 4096, not 0"),
    (dict(b_threshold=2.5), TypeError, "FIFO B threshold must be an integer, not 2.5"),
    (dict(_bug="nope"), ValueError,
     "Unknown bug 'nope'; known: ('region_leak', 'region_dup', 'link_dup', 'lost_head', "
     "'stale_prev')"),
])
def test_parameter_errors(kwargs, exc, message):
    with pytest.raises(exc) as info:
        CacheDirectory(**kwargs)
    assert str(info.value) == message
    if not kwargs.get("_bug"):
        g_kwargs = {k: v for k, v in kwargs.items()}
        with pytest.raises(exc) as info:
            GoldenDirectory(**{"buckets": 1024, "links": 4096, "regions": 4096, **g_kwargs})
        assert str(info.value) == message


def test_properties_and_default_policy():
    dut = CacheDirectory(buckets=16, links=32, regions=64)
    dut._MustUse__silence = True
    assert (dut.buckets, dut.links, dut.regions, dut.b_threshold) == (16, 32, 64, 32)
    assert dut.params()["hash_width"] == 64
    assert Op.INSERT_EXISTING.value == 6 and Status.BAD_REGION.value == 6


# -- behaviour ---------------------------------------------------------------------------------

def _ins(count, hash_value, now=0, evict=0):
    return {"op": Op.INSERT, "count": count, "hash": hash_value, "now": now, "evict": evict}


def test_chain_insert_lookup_delete():
    """Three links in one bucket: hits at positions 0..2, a miss, unlinking the middle one."""
    cmds = [_ins(1, 0x100), _ins(2, 0x200), _ins(3, 0x300),         # all bucket 0
            {"op": Op.LOOKUP, "count": 1, "hash": 0x100, "now": 5},
            {"op": Op.LOOKUP, "count": 3, "hash": 0x300, "now": 6},
            {"op": Op.LOOKUP, "count": 2, "hash": 0x300, "now": 7},   # same hash, other count
            {"op": Op.DELETE, "link": 1},
            {"op": Op.READ, "link": 0}, {"op": Op.READ, "link": 2},
            {"op": Op.LOOKUP, "count": 2, "hash": 0x200}]
    g, expected = golden_run(SMALL, cmds)
    got = rtl_directory(SMALL, cmds)
    assert got == expected
    assert [Status(r["status"]) for r in got[3:6]] == [Status.OK, Status.OK, Status.MISS]
    assert got[7]["prev"] == 2 and got[7]["next"] == NIL and got[8]["next"] == 0
    assert got[9]["status"] == Status.MISS.value


def test_bad_input_changes_nothing():
    """Count 0, free and out-of-range links, full without eviction, bad region, bad opcode."""
    params = dict(SMALL, links=4, regions=4)
    setup = [_ins(1 + n, 0x40 * n + n, now=n) for n in range(4)] + [{"op": Op.DELETE, "link": 2}]
    bad = [{"op": Op.LOOKUP, "count": 0, "hash": 0x40},
           {"op": Op.INSERT, "count": 0, "hash": 1},
           {"op": Op.DELETE, "link": 2}, {"op": Op.TOUCH, "link": 2, "now": 9},
           {"op": Op.DELETE, "link": 4}, {"op": Op.READ, "link": NIL},
           {"op": Op.DELETE, "link": 0x8000},
           _ins(9, 0x999),                         # one link free: fills the last region
           _ins(9, 0x777, evict=0),                # now full, eviction off
           {"op": Op.INSERT_EXISTING, "count": 1, "hash": 3, "region": 1},   # not in FIFO A
           {"op": Op.INSERT_EXISTING, "count": 1, "hash": 3, "region": 4},   # out of range
           {"op": 12, "count": 1, "hash": 3}, {"op": 15}]
    g = GoldenDirectory(**params)
    for c in setup:
        g.command(c)
    expected = _normalise([g.command(c) for c in bad])
    statuses = [r["status"] for r in expected]
    assert [Status(s).name for s in statuses] == [
        "BAD_COUNT", "BAD_COUNT", "NOT_LIVE", "NOT_LIVE", "BAD_LINK", "BAD_LINK", "BAD_LINK", "OK",
        "FULL", "BAD_REGION", "BAD_REGION", "BAD_OP", "BAD_OP"]
    # State after the good insert only, against state after all the bad commands too.
    good_only = GoldenDirectory(**params)
    for c in setup + [bad[7]]:
        good_only.command(c)
    assert g.state() == good_only.state()
    tail = probe(g)
    got = rtl_directory(params, setup + bad + tail)
    assert got[len(setup):len(setup) + len(bad)] == expected
    assert got[len(setup) + len(bad):] == _normalise([good_only.command(c) for c in tail])


def test_eviction_lru_and_expire():
    params = dict(SMALL, links=4, regions=8)
    cmds = [_ins(1, 0x10, now=10), _ins(1, 0x11, now=11), _ins(1, 0x12, now=12),
            _ins(1, 0x13, now=13),
            {"op": Op.TOUCH, "link": 0, "now": 20},
            {"op": Op.LOOKUP, "count": 1, "hash": 0x11, "now": 21},
            _ins(2, 0x14, now=22, evict=1),          # evicts link 2 (stamp 12)
            _ins(2, 0x15, now=250, evict=1),         # evicts link 3 (stamp 13)
            {"op": Op.EXPIRE, "now": 30, "max_age": 9},   # 0 is 10 old, 3 is 36 (wrapped)
            {"op": Op.EXPIRE, "now": 5, "max_age": 200},  # 1 and 2: 240 and 239 old
            ]
    g, expected = golden_run(params, cmds)
    got = rtl_directory(params, cmds)
    assert got == expected
    assert (got[6]["evicted"], got[6]["victim"], got[7]["victim"]) == (1, 2, 3)
    assert got[8]["expired"] == 2 and got[9]["expired"] == 2


def test_rebuild_after_clear():
    cmds = [_ins(1, 1), _ins(2, 2), {"op": Op.CLEAR},
            {"op": Op.INSERT_EXISTING, "count": 5, "hash": 0x21, "region": 2, "now": 1},
            {"op": Op.INSERT_EXISTING, "count": 6, "hash": 0x22, "region": 3, "now": 1},
            {"op": Op.INSERT_EXISTING, "count": 7, "hash": 0x23, "region": 6, "now": 1},
            {"op": Op.INSERT_EXISTING, "count": 7, "hash": 0x23, "region": 5, "now": 1},
            {"op": Op.LOOKUP, "count": 6, "hash": 0x22},
            _ins(3, 3), _ins(3, 4), _ins(3, 5), _ins(3, 6), _ins(3, 7)]
    g, expected = golden_run(SMALL, cmds)
    assert g.state()["fifo_b"] == []
    got = rtl_directory(SMALL, cmds)
    assert got == expected
    assert got[6]["status"] == Status.BAD_REGION.value
    # Regions 0, 1 (skipped, FIFO B) and 7 (A) are reused after the rebuild.
    assert sorted(r["region"] for r in got[8:]) == [0, 1, 4, 5, 7]


@pytest.mark.parametrize("threshold", [1, 4, 8])
def test_allocation_policy(threshold):
    params = dict(SMALL, b_threshold=threshold)
    cmds = [_ins(1, n) for n in range(5)] + [{"op": Op.DELETE, "link": n} for n in range(4)]
    cmds += [_ins(2, n) for n in range(6)]
    g, expected = golden_run(params, cmds)
    got = rtl_directory(params, cmds)
    assert got == expected
    regions = [r["region"] for r in got[9:]]
    want = {1: [0, 1, 2, 3, 5, 6], 4: [0, 5, 6, 7, 1, 2], 8: [5, 6, 7, 0, 1, 2]}
    assert regions == want[threshold]


@pytest.mark.parametrize("seed, params", [
    (1, SMALL), (2, SMALL),
    # Fewer regions than links: inserts run out of regions first (eviction frees one); B first.
    (3, dict(SMALL, regions=4, b_threshold=1)),
])
def test_random_against_golden(seed, params):
    rng = random.Random(seed)
    g = GoldenDirectory(**params)
    cmds, expected = random_commands(rng, g, 600)
    tail = probe(g)
    expected += [g.command(c) for c in tail]
    got = rtl_directory(params, cmds + tail, seed=seed, idle=0.3, stall=0.3)
    assert got == _normalise(expected)
    statuses = {r["status"] for r in expected}
    assert {"OK", "MISS", "FULL", "NOT_LIVE", "BAD_LINK", "BAD_COUNT", "BAD_OP"} <= {
        Status(s).name for s in statuses}


def test_latency():
    """Cycle counts stated in the docstring (informative; the bench records them)."""
    cmds = [_ins(1, 0x100), _ins(2, 0x200), _ins(3, 0x300),
            {"op": Op.LOOKUP, "count": 3, "hash": 0x300}, {"op": Op.LOOKUP, "count": 1,
                                                            "hash": 0x100},
            {"op": Op.LOOKUP, "count": 1, "hash": 0x101}, {"op": Op.LOOKUP, "count": 9,
                                                            "hash": 0x100},
            {"op": Op.DELETE, "link": 1}, {"op": Op.TOUCH, "link": 0}, {"op": Op.READ, "link": 0},
            {"op": Op.EXPIRE, "now": 100, "max_age": 10}]
    _, cycles = rtl_directory(SMALL, cmds, timing=True)
    # a hit at chain position k: 5 + 2k; a miss in an empty bucket 2, after n links 3 + 2n
    assert cycles == [2, 3, 3, 5 + 2 * 0, 5 + 2 * 2, 2, 3 + 2 * 3, 3, 3, 3,
                      3 * SMALL["links"] + 2 + 2]


# -- PROBE runs ---------------------------------------------------------------------------------

def rtl_probe(params, setup, runs, *, seed=0, idle=0.0, stall=0.0):
    """``setup`` commands, then one PROBE run per entry of ``runs`` (lists of ``(count,
    hash)``), then the state-revealing tail of :func:`probe` of the golden directory. Returns
    ``(responses of the runs, clocks of each run, responses of the tail)``: clocks from the
    PROBE command's transfer to ``o.valid``."""
    dut = CacheDirectory(**params)
    cmd_fields, resp_fields = layout_fields(dut.cmd_layout), layout_fields(dut.resp_layout)
    key_fields = layout_fields(dut.probe_layout)
    rng = random.Random(seed)
    g = GoldenDirectory(**params)
    for c in setup:
        g.command(c)
    tail = probe(g)
    out, clocks, tail_out = [], [], []

    async def command(ctx, cmd):
        await stream_put(ctx, dut.i, data.Const(dut.cmd_layout, pack_fields(
            cmd_fields, _ints(cmd))), rng=rng, idle=idle)

    async def response(ctx):
        return unpack_fields(resp_fields, (await stream_get(ctx, dut.o, rng=rng, stall=stall))
                             .as_value().value)

    async def keys(ctx):
        # offered ahead of their run: ``probe.ready`` is high only during a run
        for run in runs:
            for n, (count, h) in enumerate(run):
                word = pack_fields(key_fields, {"count": count, "hash": h,
                                                "last": int(n == len(run) - 1)})
                await stream_put(ctx, dut.probe, data.Const(dut.probe_layout, word), rng=rng,
                                 idle=idle)

    async def bench(ctx):
        await tick_until(ctx, dut.i.ready)
        for cmd in setup:
            await command(ctx, cmd)
            await response(ctx)
        for _ in runs:
            await command(ctx, {"op": Op.PROBE})
            start = 0
            while not ctx.get(dut.o.valid):
                await ctx.tick()
                start += 1
            clocks.append(start + 1)
            out.append(await response(ctx))
        for cmd in tail:
            await command(ctx, cmd)
            tail_out.append(await response(ctx))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.add_testbench(keys, background=True)
    sim.run()
    return out, clocks, tail_out, [g.command(c) for c in tail]


#: PROBE run overhead: the clock that takes the command and the clock of the response, beside
#: the keys' own clocks (GoldenDirectory.probe).
PROBE_OVERHEAD = 2


def test_probe_run_cycles_and_state():
    """Hits at several chain positions (the last hit wins), a same-hash other-count key, empty
    buckets, a miss after a whole chain; exact clocks; no stamp refreshed (the LRU victim
    after the runs is the one it was before)."""
    params = dict(SMALL, links=8, regions=8)
    setup = [_ins(1, 0x100, now=1), _ins(2, 0x200, now=2), _ins(3, 0x300, now=3),
             _ins(4, 0x401, now=4), _ins(5, 0x502, now=5)]
    runs = [[(1, 0x100), (2, 0x201), (3, 0x300), (4, 0x999)],            # bucket 0 chain
            [(1, 0x103), (2, 0x200), (3, 0x301), (9, 0x401), (5, 0x502)],
            [(7, 0x703)],                                                 # one key, empty
            [(2, 0x300), (1, 0x100)]]                                     # other count first
    g = GoldenDirectory(**params)
    for c in setup:
        g.command(c)
    expected = [g.probe(run) for run in runs]
    got, clocks, tail_got, tail_want = rtl_probe(params, setup, runs)
    assert got == _normalise([r for r, _ in expected])
    assert clocks == [c + PROBE_OVERHEAD for _, c in expected]
    assert [(r["status"], r["count"], r["link"]) for r in got] == [
        (0, 3, 2), (0, 5, 4), (1, 0, 0), (0, 1, 0)]
    assert tail_got == _normalise(tail_want)
    # the first insert after a full store evicts link 0 (stamp 1): probes refreshed nothing
    evict = GoldenDirectory(**params)
    for c in setup:
        evict.command(c)
    for run in runs:
        evict.probe(run)
    assert evict.lru_victim(100) == 0


@pytest.mark.parametrize("seed", [4, 5])
def test_probe_random_against_golden(seed):
    """Random directories (collisions in one bucket, same hash other count) and random runs,
    with idle on both input streams and stall on the response."""
    rng = random.Random(seed)
    params = SMALL
    g = GoldenDirectory(**params)
    setup, _ = random_commands(rng, g, 120)
    live = [(row["count"], row["hash"]) for row in g.live.values()]
    runs = []
    for _ in range(12):
        run = []
        for _ in range(rng.randrange(1, 9)):
            roll = rng.random()
            if live and roll < 0.4:
                run.append(rng.choice(live))
            elif live and roll < 0.6:
                c, h = rng.choice(live)
                run.append((c % 255 + 1, h))
            else:
                run.append((rng.randrange(1, 256), rng.randrange(1 << 16)))
        runs.append(run)
    expected = [g.probe(run)[0] for run in runs]
    got, _, tail_got, tail_want = rtl_probe(params, setup, runs, seed=seed, idle=0.3,
                                            stall=0.3)
    assert got == _normalise(expected)
    assert tail_got == _normalise(tail_want)
    assert {r["status"] for r in got} == {0, 1}
