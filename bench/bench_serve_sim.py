"""``ringkv serve`` on simulated boards, and the server's own overhead with one request at a
time, at this process's scheduling priority and above the machine's other jobs.

**Boards.** ``bench_serve``'s load (the same clients, conversations, edits, regenerations and
seeded sampling, from the same seed), smaller: ``SIM_CLIENTS`` clients at once,
``SIM_REQUESTS`` requests in all, ``SIM_MAX_TOKENS`` tokens per reply, conversations of
``bench_serve.TURNS`` turns; on one and on two simulated boards (``--device sim``: the demo
shape, ``ringkv-fx1c`` with the trained demo model, ``RingKVTop`` on Verilator with the demo's
top, ``DEMO_TOP``: the build ``make demo`` uses; each board a simulator of its own on a card
of its own), placement by prefix (the server's default); and the same load on two software
devices (bit-exact core model, ``CAPACITY`` records each), the reference. Per configuration
as in ``bench_serve``: time to first token p50/p99, generated tokens per second, the fraction
of prompt tokens cached, the server's overhead per request (mean under the load), wall time
and the 1-minute load average at its start and end.

**Numerics.** A seeded request's reply does not depend on the device that served it nor on
what it reused: the board's attention core computes the bit-exact numbers of the software
device's core model. ``serve_sim.replies_identical`` is 1 when every request sent in all three
runs (the same client's same request: the budget is shared, so the last few requests may go
to other clients in another run) got the same reply, else 0; ``serve_sim.greedy_identical``
likewise for ``GREEDY`` greedy requests (one per system prompt, after the load) on the two
boards and on the two software devices.

**Overhead.** ``bench_serve.sequential_overhead``: one client, ``SEQUENTIAL`` requests one
after another to one software device; the metric's mean and, from the server's step log
(``--log-level debug``), each request's own overhead (the steps outside the device's queue and
the scheduler) with its median and p90: once with the server and its device's process at
this process's priority (``make bench`` runs at the machine's normal priority), once raised to
niceness -10 above the machine's other jobs (needs root; skipped otherwise), back to back.
The difference is the machine's contention: on a loaded machine a process that was waiting
for a message waits again for a core before it can read it.

Environment: ``RINGKV_BENCH_SERVE_SIM_REQUESTS`` (default 12), ``RINGKV_BENCH_SERVE_SIM_CLIENTS``
(4), ``RINGKV_BENCH_SERVE_SIM_MAX_TOKENS`` (16), ``RINGKV_BENCH_SERVE_SEQUENTIAL`` (100; 0: not
measured) and ``bench_serve``'s ``RINGKV_BENCH_SERVE_TURNS``.

``run(smoke=True)`` runs no board: a board's start and its requests take tens of seconds, and
an idle simulated board keeps a core busy, too slow for ``make test``. It runs the two software
devices' load at 4 requests of 2 clients, the greedy requests on them, and 3 sequential
requests at each priority.
"""

import asyncio
import os

from bench import bench_serve as serve
from bench.run import table

__all__ = ["TITLE", "run", "markdown"]

TITLE = "Server: simulated boards; the server's own overhead by priority"
SIM_REQUESTS = int(os.environ.get("RINGKV_BENCH_SERVE_SIM_REQUESTS", "12"))
SIM_CLIENTS = int(os.environ.get("RINGKV_BENCH_SERVE_SIM_CLIENTS", "4"))
SIM_MAX_TOKENS = int(os.environ.get("RINGKV_BENCH_SERVE_SIM_MAX_TOKENS", "16"))
SEQUENTIAL = int(os.environ.get("RINGKV_BENCH_SERVE_SEQUENTIAL", "100"))
GREEDY = 2
RAISED = -10

#: (label, devices, --device)
CONFIGS = (("one simulated board", 1, "sim"),
           ("two simulated boards", 2, "sim"),
           ("two software devices", 2, "software"))
SMOKE_CONFIGS = CONFIGS[2:]


def _greedy(base) -> list[str]:
    """The replies to ``GREEDY`` greedy requests sent at once (one per system prompt)."""
    import httpx

    async def all_of_them():
        async with httpx.AsyncClient(timeout=1800) as client:
            return await asyncio.gather(*(
                serve._chat(client, base, [{"role": "system", "content": serve._system(i)},
                                           {"role": "user", "content": "Who was he?"}],
                            0, SIM_MAX_TOKENS, temperature=0.0)
                for i in range(GREEDY)))
    return [reply for reply, _, _ in asyncio.run(all_of_them())]


def run(smoke: bool = False):
    """The figures (module docstring); ``smoke``: no board, the smallest sizes."""
    if not smoke:
        return _run(CONFIGS, SIM_REQUESTS, SIM_CLIENTS, SEQUENTIAL)
    return _run(SMOKE_CONFIGS, 4, 2, 3)


def _run(configs, requests, clients, sequential):
    common = {"requests": requests, "clients": clients, "systems": serve.SYSTEMS,
              "max_tokens": SIM_MAX_TOKENS, "config": "demo", "turns": list(serve.TURNS),
              "machine": f"{os.cpu_count()} CPUs, shared"}
    out, replies, greedy = [], {}, {}
    for label, devices, device in configs:
        load_start = os.getloadavg()[0]
        # (a queue bound that refuses nothing: the greedy requests go at once)
        with serve._server(devices, "prefix", serve.CAPACITY, device=device,
                           clients=max(clients, GREEDY), shape="demo") as base:
            records, wall = asyncio.run(serve._load(base, serve.TURNS, requests=requests,
                                                    clients=clients,
                                                    max_tokens=SIM_MAX_TOKENS))
            overhead, n = serve._overhead(base)
            load_end = os.getloadavg()[0]
            if devices == 2:
                greedy[label] = _greedy(base)
        replies[label] = {key: reply for _, _, key, reply in records}
        ttfts = [r[0] for r in records]
        prompt = sum(r[1]["prompt_tokens"] for r in records)
        cached = sum(r[1]["prompt_tokens_details"]["cached_tokens"] for r in records)
        generated = sum(r[1]["completion_tokens"] for r in records)
        params = dict(common, devices=devices, device=device, placement="prefix",
                      capacity=serve.CAPACITY if device == "software" else None,
                      top="DEMO_TOP" if device == "sim" else None, setup=label,
                      wall_s=round(wall, 2), prompt_tokens=prompt, cached_tokens=cached,
                      generated_tokens=generated, requests_sent=len(records),
                      loadavg_1min=round(load_start, 2), loadavg_1min_end=round(load_end, 2))
        key = "serve_sim." + serve._key(label)
        out += [
            {"name": f"{key}.ttft_p50_s", "value": round(serve._percentile(ttfts, 0.5), 4),
             "unit": "s", "params": params},
            {"name": f"{key}.ttft_p99_s", "value": round(serve._percentile(ttfts, 0.99), 4),
             "unit": "s", "params": params},
            {"name": f"{key}.tokens_per_s", "value": round(generated / wall, 2),
             "unit": "tokens/s", "params": params},
            {"name": f"{key}.cached_fraction", "value": round(cached / prompt, 4),
             "unit": "fraction", "params": params},
            {"name": f"{key}.overhead_ms", "value": round(overhead * 1e3, 3), "unit": "ms",
             "params": dict(params, requests_measured=n)},
        ]
    labels = [label for label, *_ in configs]
    if len(labels) > 1:
        shared = set.intersection(*(set(replies[x]) for x in labels))
        same = all(len({replies[x][k] for x in labels}) == 1 for k in shared)
        out.append({"name": "serve_sim.replies_identical", "value": int(same and bool(shared)),
                    "unit": "1/0", "params": dict(common, setups=labels,
                                                  requests_compared=len(shared))})
        out.append({"name": "serve_sim.greedy_identical",
                    "value": int(len({tuple(g) for g in greedy.values()}) == 1),
                    "unit": "1/0", "params": dict(common, setups=sorted(greedy),
                                                  requests=GREEDY, temperature=0)})
        one, two = (f"serve_sim.{serve._key(x)}.tokens_per_s" for x in labels[:2])
        by = {r["name"]: r["value"] for r in out}
        out.append({"name": "serve_sim.two_vs_one_tokens_per_s",
                    "value": round(by[two] / by[one], 3), "unit": "ratio",
                    "params": dict(common, setups=labels[:2])})
    # the server's own overhead, one request at a time, at two priorities, back to back
    levels = ([None] + ([RAISED] if os.geteuid() == 0 else [])) if sequential else []
    for level in levels:
        seq = serve.sequential_overhead(sequential, level, shape="demo")
        name = "raised" if level is not None else "as_run"
        params = dict(serve._rounded(seq), requests=sequential, clients=1, config="demo",
                      priority=name, machine=common["machine"], target="< 2 ms")
        for figure in ("mean_ms", "median_ms", "p90_ms"):
            out.append({"name": f"serve_sim.overhead_sequential.{name}.{figure}",
                        "value": round(seq[figure], 3), "unit": "ms", "params": params})
    return out


def markdown(results) -> str:
    by = {r["name"]: r for r in results}
    rows = []
    for label, *_ in CONFIGS:
        key = "serve_sim." + serve._key(label)
        if key + ".ttft_p50_s" not in by:
            continue
        p = by[key + ".ttft_p50_s"]["params"]
        rows.append([label, p["devices"], p["top"] or f"{p['capacity']} records",
                     f"{by[key + '.ttft_p50_s']['value']:.2f}",
                     f"{by[key + '.ttft_p99_s']['value']:.2f}",
                     by[key + ".tokens_per_s"]["value"],
                     f"{by[key + '.cached_fraction']['value']:.3f}",
                     f"{by[key + '.overhead_ms']['value']:.2f}", p["requests_sent"],
                     p["wall_s"], f"{p['loadavg_1min']} / {p['loadavg_1min_end']}"])
    lines = []
    if rows:
        p = next(r["params"] for r in results if r["name"].endswith(".ttft_p50_s"))
        lines += [f"{p['clients']} clients at once, {p['requests']} streamed chat requests in "
                  f"conversations of {p['turns'][0]} to {p['turns'][1]} turns behind "
                  f"{p['systems']} system prompts (the `serve` group's load, smaller), "
                  f"max_tokens {p['max_tokens']}, sampled with a seed per request; the demo "
                  "shape (`ringkv-fx1c`, trained model); placement by prefix. A simulated "
                  "board is `RingKVTop` on Verilator with the demo's top (`DEMO_TOP`: "
                  "the build `make demo` uses), over its TCP link, each in its own "
                  f"simulator. Wall-clock on {p['machine']}.", "",
                  table(["setup", "devices", "store", "TTFT p50 s", "TTFT p99 s", "tokens/s",
                         "cached", "overhead ms", "requests", "wall s",
                         "load avg start / end"], rows)]
    extra = [(n, by[n]) for n in ("serve_sim.replies_identical", "serve_sim.greedy_identical",
                                  "serve_sim.two_vs_one_tokens_per_s") if n in by]
    if extra:
        lines += ["", table(["figure", "value", "compared"],
                            [[n, r["value"], r["params"].get("requests_compared",
                                                             r["params"].get("requests", ""))]
                             for n, r in extra])]
    seq = []
    for name in ("as_run", "raised"):
        key = f"serve_sim.overhead_sequential.{name}"
        if key + ".mean_ms" in by:
            p = by[key + ".mean_ms"]["params"]
            steps = p.get("step_median_ms", {})
            seq.append([name, p["niceness"], p["requests"],
                        f"{by[key + '.mean_ms']['value']:.2f}",
                        f"{by[key + '.median_ms']['value']:.2f}",
                        f"{by[key + '.p90_ms']['value']:.2f}",
                        f"{p['first_ms']:.2f}",
                        " / ".join(f"{steps.get(s, float('nan')):.2f}"
                                   for s in serve.OVERHEAD_STEPS),
                        f"{p['loadavg_1min']} / {p['loadavg_1min_end']}"])
    if seq:
        lines += ["", "The server's own overhead per request with one client, one request at "
                  "a time (8 tokens, one software device, the demo shape), at the bench's "
                  "priority and raised above the machine's other jobs; the steps' medians "
                  "are " + ", ".join(f"`{s}`" for s in serve.OVERHEAD_STEPS) + " (the "
                  "server's debug log). Target: under 2 ms.", "",
                  table(["priority", "niceness", "requests", "mean ms", "median ms", "p90 ms",
                         "first ms", "steps (medians) ms", "load avg start / end"], seq)]
    return "\n".join(lines)
