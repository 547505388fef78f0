"""``ringkv serve`` on simulated boards.

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

Environment: ``RINGKV_BENCH_SERVE_SIM_REQUESTS`` (default 40), ``RINGKV_BENCH_SERVE_SIM_CLIENTS``
(8), ``RINGKV_BENCH_SERVE_SIM_MAX_TOKENS`` (16) and ``bench_serve``'s
``RINGKV_BENCH_SERVE_TURNS``. The group takes about 20 minutes on a 2-core machine at load
average 6, most of it the one board's 40 requests.

``run(smoke=True)`` runs no board: a board's start and its requests take tens of seconds, and
an idle simulated board keeps a core busy, too slow for ``make test``. It runs the two software
devices' load at 4 requests of 2 clients and the greedy requests on them.
"""

import asyncio
import os

from bench import bench_serve as serve
from bench.run import table

__all__ = ["TITLE", "run", "markdown", "load_params", "load_results", "replies_identical"]

TITLE = "Server: ringkv serve on simulated boards"
SIM_REQUESTS = int(os.environ.get("RINGKV_BENCH_SERVE_SIM_REQUESTS", "40"))
SIM_CLIENTS = int(os.environ.get("RINGKV_BENCH_SERVE_SIM_CLIENTS", "8"))
SIM_MAX_TOKENS = int(os.environ.get("RINGKV_BENCH_SERVE_SIM_MAX_TOKENS", "16"))
GREEDY = 2

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
        return _run(CONFIGS, SIM_REQUESTS, SIM_CLIENTS)
    return _run(SMOKE_CONFIGS, 4, 2)


def _run(configs, requests, clients):
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
            overhead, n, _ = serve._overhead(base)
            load_end = os.getloadavg()[0]
            if devices == 2:
                greedy[label] = _greedy(base)
        replies[label] = {key: reply for _, _, key, reply in records}
        params = dict(common, devices=devices, device=device, placement="prefix",
                      capacity=serve.CAPACITY if device == "software" else None,
                      top="DEMO_TOP" if device == "sim" else None, setup=label,
                      **load_params(records, wall, load_start, load_end))
        key = "serve_sim." + serve._key(label)
        out += load_results(key, records, wall, params)
        out.append({"name": f"{key}.overhead_ms", "value": round(overhead * 1e3, 3),
                    "unit": "ms", "params": dict(params, requests_measured=n)})
    labels = [label for label, *_ in configs]
    if len(labels) > 1:
        out.append(replies_identical("serve_sim.replies_identical", replies, labels, common))
        out.append({"name": "serve_sim.greedy_identical",
                    "value": int(len({tuple(g) for g in greedy.values()}) == 1),
                    "unit": "1/0", "params": dict(common, setups=sorted(greedy),
                                                  requests=GREEDY, temperature=0)})
        one, two = (f"serve_sim.{serve._key(x)}.tokens_per_s" for x in labels[:2])
        by = {r["name"]: r["value"] for r in out}
        out.append({"name": "serve_sim.two_vs_one_tokens_per_s",
                    "value": round(by[two] / by[one], 3), "unit": "ratio",
                    "params": dict(common, setups=labels[:2])})
    return out


def load_params(records, wall, load_start, load_end) -> dict:
    """A load's parameters for its results: wall time, prompt, cached and generated tokens,
    requests sent, the 1-minute load average at its start and end."""
    return dict(wall_s=round(wall, 2),
                prompt_tokens=sum(r[1]["prompt_tokens"] for r in records),
                cached_tokens=sum(r[1]["prompt_tokens_details"]["cached_tokens"]
                                  for r in records),
                generated_tokens=sum(r[1]["completion_tokens"] for r in records),
                requests_sent=len(records), loadavg_1min=round(load_start, 2),
                loadavg_1min_end=round(load_end, 2))


def load_results(key, records, wall, params) -> list[dict]:
    """``key``'s TTFT p50 and p99, generated tokens/s and cached fraction of a load
    (``params``: :func:`load_params`'s and the setup's)."""
    ttfts = [r[0] for r in records]
    return [
        {"name": f"{key}.ttft_p50_s", "value": round(serve._percentile(ttfts, 0.5), 4),
         "unit": "s", "params": params},
        {"name": f"{key}.ttft_p99_s", "value": round(serve._percentile(ttfts, 0.99), 4),
         "unit": "s", "params": params},
        {"name": f"{key}.tokens_per_s", "value": round(params["generated_tokens"] / wall, 2),
         "unit": "tokens/s", "params": params},
        {"name": f"{key}.cached_fraction",
         "value": round(params["cached_tokens"] / params["prompt_tokens"], 4),
         "unit": "fraction", "params": params},
    ]


def replies_identical(name, replies, labels, common) -> dict:
    """1 when every request sent in all the setups ``labels`` got the same reply in each."""
    shared = set.intersection(*(set(replies[x]) for x in labels))
    same = all(len({replies[x][k] for x in labels}) == 1 for k in shared)
    return {"name": name, "value": int(same and bool(shared)), "unit": "1/0",
            "params": dict(common, setups=labels, requests_compared=len(shared))}


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
    return "\n".join(lines)
