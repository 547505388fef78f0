"""Cache directory: exact cycles per operation at load factors 0.5/0.75/1.0, eviction and expiry
scans, and synthesis on the LFE5U-85F (nextpnr report)."""

import random
from collections import defaultdict

from amaranth.lib import data
from amaranth.sim import Simulator

from bench.run import SYNTH_HEADER, synth_or_elaborate, synth_result, synth_rows, table
from ringkv.defs.directory import Op
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.hw.store.directory import CacheDirectory, layout_fields
from ringkv.sim.cocotb_streams import pack_fields, unpack_fields
from ringkv.sim.streams import stream_get, stream_put, tick_until

__all__ = ["TITLE", "run", "markdown", "measure_cycles"]

TITLE = "Cache directory and allocator"
CONFIG = dict(buckets=1024, links=4096, regions=4096)
#: the smoke run's directory and samples per kind and load (the full run: 256 lookups, 64 churn)
SMOKE_CONFIG = dict(buckets=16, links=32, regions=32)
SAMPLES, CHURN, SMOKE_SAMPLES, SMOKE_CHURN = 256, 64, 4, 2


def measure_cycles(params, commands):
    """Responses and exact cycles (command transfer -> response valid) for ``commands``."""
    dut = CacheDirectory(**params)
    cmd_fields, resp_fields = layout_fields(dut.cmd_layout), layout_fields(dut.resp_layout)
    out = []

    async def bench(ctx):
        await tick_until(ctx, dut.i.ready)
        for cmd in commands:
            word = pack_fields(cmd_fields, {k: int(getattr(v, "value", v)) for k, v in cmd.items()})
            await stream_put(ctx, dut.i, data.Const(dut.cmd_layout, word))
            cycles = 1
            while not ctx.get(dut.o.valid):
                await ctx.tick()
                cycles += 1
            payload = await stream_get(ctx, dut.o)
            out.append((unpack_fields(resp_fields, payload.as_value().value), cycles))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


def _workload(rng, g, samples=SAMPLES, churn=CHURN):
    """Commands and, per command, a label: (kind, load factor, chain position)."""
    cmds, labels = [], []
    keys = []

    def add(cmd, label):
        cmds.append(cmd)
        labels.append(label)
        g.command(cmd)

    now = 1
    for load in (0.5, 0.75, 1.0):
        while len(keys) < int(load * g.buckets):
            key = (rng.randrange(1, 1 << 14), rng.getrandbits(64))
            keys.append(key)
            add({"op": Op.INSERT, "count": key[0], "hash": key[1], "now": now},
                ("insert", load, None))
            now += 1
        for count, hash_value in rng.sample(keys, samples):
            link = next(n for n, row in g.live.items()
                        if row["count"] == count and row["hash"] == hash_value)
            position = g.chain(g.bucket(hash_value)).index(link)
            add({"op": Op.LOOKUP, "count": count, "hash": hash_value, "now": now},
                ("hit", load, position))
        for _ in range(samples):
            hash_value = rng.getrandbits(64)
            add({"op": Op.LOOKUP, "count": 1, "hash": hash_value, "now": now},
                ("miss", load, len(g.chain(g.bucket(hash_value)))))
        # Delete and re-insert some keys: delete cycles at this load, load unchanged.
        for count, hash_value in rng.sample(keys, churn):
            link = next(n for n, row in g.live.items()
                        if row["count"] == count and row["hash"] == hash_value)
            add({"op": Op.DELETE, "link": link}, ("delete", load, None))
            add({"op": Op.INSERT, "count": count, "hash": hash_value, "now": now},
                ("insert", load, None))
    # Expire: nothing old enough, then every link untouched since the first buckets/4 inserts.
    first = g.buckets // 4
    add({"op": Op.EXPIRE, "now": now, "max_age": 1 << 30}, ("expire", 0, None))
    add({"op": Op.EXPIRE, "now": now, "max_age": now - (first + 1)}, ("expire", 1, None))
    # Fill the link pool, then insert with eviction (an LRU scan over all links).
    while len(g.live) < g.links:
        key = (rng.randrange(1, 1 << 14), rng.getrandbits(64))
        add({"op": Op.INSERT, "count": key[0], "hash": key[1], "now": now}, ("fill", 0, None))
    for _ in range(4):
        add({"op": Op.INSERT, "count": 7, "hash": rng.getrandbits(64), "now": now, "evict": 1},
            ("evict", 0, None))
    add({"op": Op.INSERT, "count": 7, "hash": 5, "now": now}, ("full", 0, None))
    add({"op": Op.CLEAR}, ("clear", 0, None))
    return cmds, labels


def run(smoke: bool = False):
    config = SMOKE_CONFIG if smoke else CONFIG
    rng = random.Random(2024)
    g = GoldenDirectory(**config)
    cmds, labels = _workload(rng, g, *((SMOKE_SAMPLES, SMOKE_CHURN) if smoke else ()))
    check = GoldenDirectory(**config)
    measured = measure_cycles(config, cmds)
    groups = defaultdict(list)
    expired = {}
    for cmd, label, (resp, cycles) in zip(cmds, labels, measured):
        want = check.command(cmd)
        if resp != want:
            raise AssertionError(f"bench run disagrees with the golden model at {cmd}")
        kind, load, position = label
        if kind == "expire":
            expired[load] = resp["expired"]
        groups[(kind, load)].append(cycles)
        if kind == "hit":
            groups[("hit_at", position)].append(cycles)
        if kind == "miss":
            groups[("miss_after", position)].append(cycles)
    base = {**config, "count_width": 24, "hash_width": 64, "stamp_width": 32}
    results = []

    def add(name, values, unit, **params):
        results.append({"name": name, "value": round(sum(values) / len(values), 3),
                        "unit": unit, "params": {**base, "samples": len(values),
                                                 "min": min(values), "max": max(values),
                                                 **params}})

    for load in (0.5, 0.75, 1.0):
        for kind in ("hit", "miss", "insert", "delete"):
            add(f"{kind}.load{load}", groups[(kind, load)], "cycles", load_factor=load)
    for (kind, key), values in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if kind in ("hit_at", "miss_after"):
            add(f"{kind}.{key}", values, "cycles", chain_position=key)
    add("expire.none", groups[("expire", 0)], "cycles", expired=expired[0])
    add("expire.some", groups[("expire", 1)], "cycles", expired=expired[1])
    add("insert_evict", groups[("evict", 0)], "cycles", live_links=config["links"])
    add("insert_full", groups[("full", 0)], "cycles", live_links=config["links"])
    add("clear", groups[("clear", 0)], "cycles")
    synth = synth_or_elaborate(CacheDirectory(**config), "directory", smoke=smoke,
                               freq_mhz=100)
    if synth is not None:
        results.append(synth_result("CacheDirectory", config, synth))
    return results


def markdown(results) -> str:
    by = {r["name"]: r for r in results}

    def cell(name):
        r = by.get(name)
        if r is None:
            return "—"
        p = r["params"]
        return f"{r['value']:g}" + (f" ({p['min']}–{p['max']})" if p["min"] != p["max"] else "")

    p = by["clear"]["params"]
    lines = ["Cycles from the command transfer to `o.valid` (Amaranth simulator, exact; mean "
             f"and range over the samples), for {p['buckets']} buckets, {p['links']} links, "
             f"{p['regions']} regions, 64-bit "
             "hashes. Load factor = live links / buckets; random 64-bit hashes.", ""]
    lines.append(table(["load factor", "lookup hit", "lookup miss", "insert", "delete"],
                       [[load, *(cell(f"{k}.load{load}") for k in
                                 ("hit", "miss", "insert", "delete"))]
                        for load in (0.5, 0.75, 1.0)]))
    lines += ["", "By chain position (all loads together): a hit at position k (0 = head) and "
              "a miss after a chain of n links.", ""]
    hits = sorted((r for r in results if r["name"].startswith("hit_at.")),
                  key=lambda r: r["params"]["chain_position"])
    misses = sorted((r for r in results if r["name"].startswith("miss_after.")),
                    key=lambda r: r["params"]["chain_position"])
    rows = []
    for k in sorted({r["params"]["chain_position"] for r in hits + misses}):
        row = [k]
        for rs in (hits, misses):
            r = next((r for r in rs if r["params"]["chain_position"] == k), None)
            row += [f"{r['value']:g}", r["params"]["samples"]] if r else ["—", 0]
        rows.append(row)
    lines.append(table(["k or n", "hit at k", "samples", "miss after n", "samples"], rows))
    lines += ["", f"Scans over the link pool ({p['links']} links): expire takes "
              "3 * links + e + 2 cycles for e expired links; an insert that evicts scans the "
              "pool once (links + 8).", ""]
    lines.append(table(["operation", "cycles"], [
        ["expire, nothing expired", cell("expire.none")],
        [f"expire, {by['expire.some']['params']['expired']} links expired",
         cell("expire.some")],
        ["insert with LRU eviction (pool full)", cell("insert_evict")],
        ["insert, pool full, eviction off (FULL)", cell("insert_full")],
        ["clear", cell("clear")]]))
    lines += ["", "Synthesis (out of context, nextpnr-ecp5 report):", ""]
    lines.append(table(SYNTH_HEADER, synth_rows(results)))
    return "\n".join(lines)
