"""The longest stored prefix: what ``QUERY_PREFIX`` costs the device per token, at directory
loads 0.5, 0.75 and 1.0 (``prefix.query_clk_per_token``, target <= 4 at 0.75).

``RingKVTop`` at the default configuration (``DEFAULT_CONFIG``, 64 regions: 64 directory links
in 32 buckets, P=4 lanes x M=8 MACs) in the Amaranth simulator, driven through byte frames as
the host drives it; the clock counts are the device's own (the response's ``cycles``, from the
request's header to its answer), exact, and each answer is checked field for field, cycles
included, against the golden model :func:`ringkv.host.golden.prefix.query_prefix`.

Workload per load factor (load = live links / buckets, as in the directory bench): the directory
is cleared and filled with ``load * 32`` entries by ``DIR_INSERT``: two checkpoints of the
conversation (its prefixes of 256 and 768 tokens) and random keys (random count, random 64-bit
hash); then ``QUERY_PREFIX n=1024`` over a 1024-token conversation in token memory (the
shared-prefix length the target is stated for): it answers the 768-token checkpoint. The
constant part is measured on an empty directory with ``n = 1``; the per-token cost is
``(cycles - constant) / n``.
"""

import math
import random

from bench.run import table
from ringkv.defs.config import DEFAULT_CONFIG
from ringkv.defs.hash import hash_seed
from ringkv.defs.protocol import DIR_RESPONSE, PREFIX_RESPONSE, REQUESTS, RESPONSES, Op, Status
from ringkv.host.device.ops import pack_tokens
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.host.golden.prefix import QUERY_PREFIX_FIXED, prefix_keys, query_prefix

__all__ = ["TITLE", "run", "markdown"]

TITLE = "Whole system: longest stored prefix (QUERY_PREFIX)"
REGIONS, LANES, MACS = 64, 4, 8
N = 1024
CHECKPOINTS = (256, 768)
LOADS = (0.5, 0.75, 1.0)
#: the smoke run (``run(smoke=True)``): a 64-token conversation, checkpoints at 16 and 48, 16
#: regions (16 links in 8 buckets)
SMOKE_REGIONS, SMOKE_N, SMOKE_CHECKPOINTS = 16, 64, (16, 48)


def _measure(regions=REGIONS, n_tokens=N, checkpoints=CHECKPOINTS):
    from ringkv.hw.top import RingKVTop
    from ringkv.sim.top_bench import image_for, run_top

    config = DEFAULT_CONFIG
    top = RingKVTop(config, regions=regions, lanes=LANES, macs=MACS)
    seed = hash_seed(config)
    rng = random.Random(16)
    tokens = [rng.randrange(1 << config.token_width) for _ in range(n_tokens)]
    keys = dict(prefix_keys(tokens, seed, n_tokens))
    out = {}

    def req(op, **fields):
        return REQUESTS[op].pack(**fields)

    async def call(ctx, link, op, payload=b""):
        frame = await link.request(ctx, op, payload)
        return Status(frame.status), frame.payload

    async def prefix(ctx, link, n, g):
        status, data = await call(ctx, link, Op.QUERY_PREFIX, req(Op.QUERY_PREFIX, n=n))
        got = PREFIX_RESPONSE.unpack(data)
        want = query_prefix(tokens, seed, n, g)
        if (status, got) != want:
            raise AssertionError(f"QUERY_PREFIX n={n}: device {status} {got}, golden {want}")
        return got

    async def scenario(ctx, link):
        await call(ctx, link, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=n_tokens)
                   + pack_tokens(config, tokens))
        for load in LOADS:
            await call(ctx, link, Op.DIR_CLEAR)
            g = GoldenDirectory(buckets=top.buckets, links=top.links, regions=top.regions)
            if load == LOADS[0]:
                out["fixed"] = (await prefix(ctx, link, 1, g))["cycles"] - 1
            entries = [(c, keys[c]) for c in checkpoints]
            while len(entries) < int(load * top.buckets):
                entries.append((rng.randrange(1, n_tokens + 1), rng.getrandbits(64)))
            for count, h in entries:
                _, data = await call(ctx, link, Op.ALLOC_STATUS)
                now = RESPONSES[Op.ALLOC_STATUS].unpack(data)["dir_now"]
                status, data = await call(ctx, link, Op.DIR_INSERT, req(
                    Op.DIR_INSERT, count=count, hash=h, region=0, flags=0))
                want = g.command({"op": 1, "count": count, "hash": h, "now": now})
                if (status, DIR_RESPONSE.unpack(data)["link"]) != (Status.OK, want["link"]):
                    raise AssertionError("directory insert disagrees with the golden model")
            chains = [len(g.chain(b)) for b in range(g.buckets)]
            out[load] = {"response": await prefix(ctx, link, n_tokens, g), "live": len(g.live),
                         "empty_buckets": chains.count(0)}

    run_top(top, image_for(top), scenario)
    return top, out


def run(smoke: bool = False):
    regions, n, checkpoints = ((SMOKE_REGIONS, SMOKE_N, SMOKE_CHECKPOINTS) if smoke
                               else (REGIONS, N, CHECKPOINTS))
    top, out = _measure(regions, n, checkpoints)
    base = {"config": "DEFAULT_CONFIG", "regions": regions, "links": top.links,
            "buckets": top.buckets, "n": n, "checkpoints": list(checkpoints),
            "simulator": "Amaranth"}
    fixed = out["fixed"]
    if fixed != QUERY_PREFIX_FIXED:
        raise AssertionError(f"measured constant {fixed} != golden {QUERY_PREFIX_FIXED}")
    results = [{"name": "system.prefix.query_fixed_cycles", "value": fixed, "unit": "cycles",
                "params": {**base, "how": "n = 1 on an empty directory, minus its one key"}}]
    for load in LOADS:
        r, live = out[load]["response"], out[load]["live"]
        per_token = (r["cycles"] - fixed) / n
        params = {**base, "load_factor": load, "live_links": live,
                  "empty_buckets": out[load]["empty_buckets"], "cycles": r["cycles"],
                  "answer_count": r["count"], "links_compared": r["probes"],
                  "poisson_model": round(3 - 2 * math.exp(-load) + 2 * load, 3)}
        name = "system.prefix.query_clk_per_token" + ("" if load == 0.75 else f".load{load}")
        results.append({"name": name, "value": round(per_token, 4), "unit": "clk/token",
                        "params": params})
    return results


def markdown(results) -> str:
    by = {r["name"]: r for r in results}
    fixed = by["system.prefix.query_fixed_cycles"]
    rows = []
    for load in LOADS:
        r = by["system.prefix.query_clk_per_token" + ("" if load == 0.75 else f".load{load}")]
        p = r["params"]
        rows.append([load, p["live_links"], p["empty_buckets"], p["cycles"], p["answer_count"],
                     p["links_compared"], f"{r['value']:g}", p["poisson_model"]])
    p = fixed["params"]
    lines = [f"`QUERY_PREFIX n={p['n']}` on `RingKVTop` (default configuration, {p['regions']} "
             f"regions: {p['links']} links in {p['buckets']} buckets; Amaranth simulator, the "
             "device's own cycle count, checked against the golden model). The directory holds "
             f"two checkpoints of the conversation ({', '.join(map(str, p['checkpoints']))} "
             "tokens) and random keys up to the load factor (live links / buckets). Per-token "
             f"cost = (cycles - {fixed['value']}) / n, {fixed['value']} being the constant "
             "(measured: n = 1 on an empty directory). Per key the directory takes 1 clock "
             "when the bucket is empty, else 3 + 2 x links compared (two clocks a link: the "
             "walk reads at a registered address); the last column is that cost's mean for "
             "Poisson chain lengths, 3 - 2 exp(-load) + 2 load. Target: "
             "at most 4 clocks per token at load 0.75.", ""]
    lines.append(table(["load", "live links", "empty buckets", f"cycles (n={p['n']})",
                        "answer", "links compared", "clk/token", "Poisson model"], rows))
    return "\n".join(lines)
