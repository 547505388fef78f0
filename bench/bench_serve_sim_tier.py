"""``ringkv serve`` on a simulated board with many conversations: the card alone against the
card behind the SDRAM hot tier (issue #35, item 5).

**Boards.** One simulated board each (``--device sim``: ``RingKVTop`` on Verilator, the demo
shape ``ringkv-fx1c`` with the trained demo model), with ``REGIONS`` regions (``--sim-top``: the
demo's top holds 2, too few to keep a conversation of this load) so that every conversation's
record stays on the card, and the card served at the pace of the board's SD native controller
(``--sim-card-pace sd4``, ``ringkv.sim.sector_model.CARD_PACES``: ~4.1 clocks a byte, measured
by ``bench storage`` with the card model's best-case timing; a real card is slower). The
second board adds the SDRAM hot tier between the DMA and the card (``--sim-sdram``:
``RingKVTop(tier=...)`` with the ULX3S's 32 MB part, compact slots; the SDRAM served a byte a
clock): an export writes both, an import of a record whose copy is in the SDRAM reads it from
there. "Today's board" is the first.

**Load.** ``bench_serve``'s load (the same clients, conversations, edits, regenerations and
seeded sampling), ``TIER_CLIENTS`` clients at once, ``TIER_REQUESTS`` requests,
``TIER_MAX_TOKENS`` tokens a reply. Per board: time to first token p50/p99, generated tokens
per second, the fraction of prompt tokens cached, wall time, the 1-minute load average at its
start and end. ``serve_sim_tier.replies_identical``: 1 when every request got the same reply
on both boards (the tier changes where bytes come from, never a number).

**What it shows and what it does not.** The storage ports' figures are simulated clocks and
exact (``RINGKV_SIM_STATS``: each port's commands, sectors and clocks from command to status,
over the whole run): the card's reads against the SDRAM's are what the tier changes. The
TTFT and tokens/s are a simulator's wall-clock, and the tiered board's simulator is slower
per clock (a second storage port served from Python, every export's bytes served twice), so
its wall-clock TTFT does not show the tier's gain; they are kept to show that the load ran
the same (the same replies, the same cached fraction). A real card's access and busy times
and the UART link's speed are not in it.

Environment: ``RINGKV_BENCH_SERVE_SIM_TIER_REQUESTS`` (default 32),
``RINGKV_BENCH_SERVE_SIM_TIER_CLIENTS`` (8), ``RINGKV_BENCH_SERVE_SIM_TIER_MAX_TOKENS`` (8).

``run(smoke=True)`` runs no board (a tiered top's Verilator build and its requests take
minutes): it runs the same load, at 4 requests of 2 clients, on a software device with the
same ``--sim-*``-free command line, so that the load and the figures' code are checked.
"""

import asyncio
import contextlib
import json
import os
import tempfile
from pathlib import Path

from bench import bench_serve as serve
from bench import bench_serve_sim as sim
from bench.run import table
from ringkv.sim.cocotb_server import STATS_ENV

__all__ = ["TITLE", "run", "markdown", "CONFIGS", "REGIONS"]

TITLE = "Server: many conversations on a simulated board, with and without the SDRAM hot tier"
TIER_REQUESTS = int(os.environ.get("RINGKV_BENCH_SERVE_SIM_TIER_REQUESTS", "32"))
TIER_CLIENTS = int(os.environ.get("RINGKV_BENCH_SERVE_SIM_TIER_CLIENTS", "8"))
TIER_MAX_TOKENS = int(os.environ.get("RINGKV_BENCH_SERVE_SIM_TIER_MAX_TOKENS", "8"))
#: Regions of the simulated boards (every conversation of the load keeps its record).
REGIONS = 64
_TOP = json.dumps({"regions": REGIONS, "lanes": 4, "macs": 8})
_BOARD = ("--sim-top", _TOP, "--sim-card-pace", "sd4")

#: (label, --device, the server's extra options)
CONFIGS = (("card only (today's board)", "sim", _BOARD),
           ("SDRAM hot tier before the card", "sim", (*_BOARD, "--sim-sdram")))
SMOKE_CONFIGS = (("software device (smoke)", "software", ()),)


def run(smoke: bool = False):
    """The figures (module docstring); ``smoke``: no board, the smallest sizes."""
    if smoke:
        return _run(SMOKE_CONFIGS, 4, 2)
    return _run(CONFIGS, TIER_REQUESTS, TIER_CLIENTS)


def _run(configs, requests, clients):
    common = {"requests": requests, "clients": clients, "systems": serve.SYSTEMS,
              "max_tokens": TIER_MAX_TOKENS, "config": "demo", "turns": list(serve.TURNS),
              "regions": REGIONS, "card_pace": "sd4",
              "machine": f"{os.cpu_count()} CPUs, shared"}
    out, replies = [], {}
    for label, device, extra in configs:
        load_start = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="ringkv-sim-stats-") as stats_dir, \
                _environ(STATS_ENV, stats_dir), \
                serve._server(1, "prefix", serve.CAPACITY, device=device, clients=clients,
                              shape="demo", extra=extra) as base:
            records, wall = asyncio.run(serve._load(base, serve.TURNS, requests=requests,
                                                    clients=clients,
                                                    max_tokens=TIER_MAX_TOKENS))
            load_end = os.getloadavg()[0]
            storage = _storage_stats(stats_dir)
        replies[label] = {key: reply for _, _, key, reply in records}
        params = dict(common, device=device, setup=label, server_options=list(extra),
                      tier="--sim-sdram" in extra,
                      **sim.load_params(records, wall, load_start, load_end))
        key = "serve_sim_tier." + serve._key(label)
        for port, ops in storage.items():
            for op, st in ops.items():
                if st["commands"]:
                    out.append({"name": f"{key}.{port}_{op}_clocks", "value": st["clocks"],
                                "unit": "clocks",
                                "params": dict(params, commands=st["commands"],
                                               sectors=st["sectors"])})
        out += sim.load_results(key, records, wall, params)
    labels = [label for label, *_ in configs]
    if len(labels) > 1:
        out.append(sim.replies_identical("serve_sim_tier.replies_identical", replies, labels,
                                         common))
        by = {r["name"]: r["value"] for r in out}
        card, tier = ("serve_sim_tier." + serve._key(x) for x in labels[:2])
        out.append({"name": "serve_sim_tier.ttft_p50_tier_vs_card",
                    "value": round(by[tier + ".ttft_p50_s"] / by[card + ".ttft_p50_s"], 3),
                    "unit": "ratio", "params": dict(common, setups=labels[:2])})
    return out


@contextlib.contextmanager
def _environ(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _storage_stats(directory) -> dict:
    """The simulator's storage statistics (``cocotb_server.STATS_ENV``): per port (``card``,
    ``sdram``) and op, commands, sectors and busy clocks; summed over the simulators that
    wrote one (a board restarted writes a second file), empty for a software device."""
    total = {}
    for path in sorted(Path(directory).glob("sim-*.json")):
        for port, ops in json.loads(path.read_text()).items():
            for op, st in ops.items():
                mine = total.setdefault(port, {}).setdefault(
                    op, {"commands": 0, "sectors": 0, "clocks": 0})
                for k in mine:
                    mine[k] += st[k]
    return total


def markdown(results) -> str:
    by = {r["name"]: r for r in results}
    rows = []
    for label, *_ in CONFIGS + SMOKE_CONFIGS:
        key = "serve_sim_tier." + serve._key(label)
        if key + ".ttft_p50_s" not in by:
            continue
        p = by[key + ".ttft_p50_s"]["params"]
        rows.append([label, f"{by[key + '.ttft_p50_s']['value']:.2f}",
                     f"{by[key + '.ttft_p99_s']['value']:.2f}",
                     by[key + ".tokens_per_s"]["value"],
                     f"{by[key + '.cached_fraction']['value']:.3f}", p["requests_sent"],
                     p["wall_s"], f"{p['loadavg_1min']} / {p['loadavg_1min_end']}"])
    lines = []
    if rows:
        p = next(r["params"] for r in results if r["name"].endswith(".ttft_p50_s"))
        lines += [f"One simulated board (`RingKVTop` on Verilator, demo shape, {p['regions']} "
                  f"regions, the card served at the SD native controller's pace, "
                  f"`--sim-card-pace {p['card_pace']}`); {p['clients']} clients at once, "
                  f"{p['requests']} streamed chat requests in conversations of "
                  f"{p['turns'][0]} to {p['turns'][1]} turns behind {p['systems']} system "
                  f"prompts (the `serve` group's load), max_tokens {p['max_tokens']}, sampled "
                  f"with a seed per request; placement by prefix. The TTFT and tokens/s are "
                  f"a simulator's wall-clock (the tiered board's simulator is slower per "
                  f"clock: a second port served from Python), on {p['machine']}: they show "
                  f"the same load ran, not the tier's gain, which the storage clocks below "
                  f"give exactly.", "",
                  table(["setup", "TTFT p50 s", "TTFT p99 s", "tokens/s", "cached",
                         "requests", "wall s", "load avg start / end"], rows)]
    srows = []
    for label, *_ in CONFIGS:
        key = "serve_sim_tier." + serve._key(label)
        for port, op in (("card", "read"), ("sdram", "read"), ("card", "write"),
                         ("sdram", "write")):
            r = by.get(f"{key}.{port}_{op}_clocks")
            if r is not None:
                p = r["params"]
                srows.append([label, f"{port} {op}s", p["commands"], p["sectors"], r["value"],
                              f"{r['value'] / 40e3:.1f}",
                              f"{r['value'] / max(p['sectors'], 1):.0f}"])
    if srows:
        lines += ["", "The storage ports over the whole run, in simulated clocks (exact; the "
                  "power-on recovery scan's header reads included, the same on both boards): "
                  "commands, sectors, the clocks from each command to its status, those "
                  "clocks at the board's 40 MHz, and per sector. An SDRAM write runs beside "
                  "the card's (the tier tees each byte: its busy clocks wait on the card's), "
                  "so it adds no time to an export.", "",
                  table(["setup", "port", "commands", "sectors", "clocks", "ms at 40 MHz",
                         "clocks/sector"], srows)]
    extra = [(n, by[n]) for n in ("serve_sim_tier.replies_identical",
                                  "serve_sim_tier.ttft_p50_tier_vs_card") if n in by]
    if extra:
        lines += ["", table(["figure", "value"], [[n, r["value"]] for n, r in extra])]
    return "\n".join(lines)
