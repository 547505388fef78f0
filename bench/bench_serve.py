"""``ringkv serve`` under a bounded load: many clients, shared system prompts, multi-turn
conversations with edits, on 1 and 4 software devices; prefix-aware placement against
round-robin; the server's own overhead per request.

The server is ``ringkv serve`` in a process of its own (the trained model, software devices
with the bit-exact attention core model), the clients in this process's event loop
(``httpx``, streaming chat completions with ``stream_options.include_usage``). The load,
from a fixed seed:

* ``CLIENTS`` clients at once, each running conversations one after another until
  ``REQUESTS`` requests have been sent in all;
* each conversation starts behind one of ``SYSTEMS`` system prompts and has ``TURNS`` (3 to
  6) turns, fewer when the next prompt and its answer would not fit the token memory, the
  client resending the whole conversation each turn (the API's way); after a reply, with
  probability 0.15 the client edits its last message instead of going on (the request forks
  at that message) and with 0.1 it regenerates the reply (same messages, another seed);
* every request samples (temperature 0.8, its own seed, ``max_tokens`` ``MAX_TOKENS``); the
  replies do not depend on where a request ran or what it reused (a seeded request is
  reproducible), so every configuration serves the same conversations.

Configurations: one device and four devices with ``CAPACITY`` records each (least recently
used evicted), each batching (continuous batching over its hot tier, the server's default)
and one request at a time (``--max-batch 1``: the baseline, in the same run); prefix-aware
placement (the server's default) and round-robin on the four; and one device that never
evicts (the reference "infinite" store). Per configuration: time to first token (from sending
the request to the first text chunk) p50/p99, generated tokens per second over the whole run,
and the fraction of prompt tokens served from the store or the hot tier (``cached_tokens`` /
``prompt_tokens``, from the responses' ``usage``). Targets: batched at least 15x the
throughput of one request at a time and a median TTFT under 2 s; prefix-aware placement's
fraction at least 0.9 of the infinite device's and at least 2x round-robin's. Then how
throughput grows with the clients (``SWEEP_CLIENTS``: 1, 4, 16, 64 clients, ``SWEEP_REQUESTS``
requests each, one device, batched and one at a time), and the limit to measure against
(:func:`model_limit`: one device's arithmetic on one core).

What bounds the second ratio is the load: round-robin too finds each of the few shared system
prompts on every device after a few requests (every device holds all ``SYSTEMS`` checkpoints),
so each of its requests is served the system prompt from the store and misses only the
conversation's own turns; no placement serves more than the infinite store, so the infinite
store's fraction over round-robin's (``serve.infinite_vs_round_robin``) is the ceiling of
prefix-aware placement's gain on that load. The longer a conversation, the larger the part of
its prompts that only the device holding its turns has: the same load with conversations of
``LONG_TURNS`` (8 to 12) turns is measured too (four devices by prefix and round-robin, the
infinite store; names ``serve.long.*``).

The server's own overhead per request (``ringkv_server_overhead_seconds``: a request's time
in the server minus its time in the scheduler and in the device's queue: parsing, routing with
its prefix hashes, streaming) is read from ``/metrics``: its mean under the load, and with
one client sending requests one at a time (target: under 2 ms).

Wall-clock figures on a shared machine: the 1-minute load average at the start and at the end
of each configuration is recorded with its results. ``RINGKV_BENCH_SERVE_REQUESTS`` (default
320), ``RINGKV_BENCH_SERVE_CLIENTS`` (32), ``RINGKV_BENCH_SERVE_CONFIG`` (``demo``: the
small shape with its trained model, the load every recorded figure used; ``default``: the
board's shape), ``RINGKV_BENCH_SERVE_TURNS`` (``3-6``) and
``RINGKV_BENCH_SERVE_LONG_TURNS`` (``8-12``; ``0``: not measured).
"""

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.run import table

__all__ = ["TITLE", "run", "markdown", "sequential_overhead", "sse_events", "set_priority",
           "priority_of", "STEPS", "OVERHEAD_STEPS"]

TITLE = "Server: ringkv serve under load (software devices)"
REQUESTS = int(os.environ.get("RINGKV_BENCH_SERVE_REQUESTS", "320"))
CLIENTS = int(os.environ.get("RINGKV_BENCH_SERVE_CLIENTS", "32"))
SHAPE = os.environ.get("RINGKV_BENCH_SERVE_CONFIG", "demo")
SYSTEMS = 8
CAPACITY = 48
MAX_TOKENS = 32
SEQUENTIAL = 30


def _turns(text: str):
    if text.strip() == "0":
        return None
    low, _, high = text.partition("-")
    return int(low), int(high or low)


TURNS = _turns(os.environ.get("RINGKV_BENCH_SERVE_TURNS", "3-6"))
LONG_TURNS = _turns(os.environ.get("RINGKV_BENCH_SERVE_LONG_TURNS", "8-12"))

_TOPICS = ["Abraham", "Moses", "David", "Solomon", "Elijah", "Daniel", "Ruth", "Joseph"]
_QUESTIONS = ["Who was he?", "Where did he go?", "What did the LORD say unto him?",
              "And what came after?", "Who were his sons?", "What did the people do?",
              "Tell me of the city.", "What was written of him?"]


def _system(i: int) -> str:
    who = _TOPICS[i]
    return (f"You are a scribe of the King James Bible. Speak only of {who}, in the words of "
            f"the book, briefly, and name the book, chapter and verse where {who} is written "
            f"of. Number {i}.")


@contextlib.contextmanager
def _server(devices, placement, capacity, *, device="software", clients=None, shape=None,
            niceness=None, realtime=False, log=None, pids=None, extra=()):
    """``ringkv serve`` in its own process (the clients' event loop is not the server's), on
    ``devices`` times ``--device device``; ``niceness``, ``realtime``: once it is up, its
    scheduling priority and its devices' processes' (:func:`set_priority`); ``log``: a file
    for its log at ``--log-level debug`` (the step-by-step times of each request), else
    warnings only;
    ``pids``: a list that receives the server's process id and its descendants'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "ringkv.serve.main", "--port", str(port), "--config",
            shape or SHAPE, "--placement", placement, "--capacity", str(capacity),
            "--max-queue", str((clients or CLIENTS) + 1),
            "--log-level", "warning" if log is None else "debug"]
    for _ in range(devices):
        argv += ["--device", device]
    argv += list(extra)

    with contextlib.ExitStack() as stack:
        err = None if log is None else stack.enter_context(open(log, "w"))
        proc = subprocess.Popen(argv, start_new_session=True, stderr=err, stdout=err)
        stack.callback(_stop_server, proc)
        base = _wait_up(proc, f"http://127.0.0.1:{port}")
        everyone = [proc.pid, *_descendants(proc.pid)]
        if niceness is not None:
            for pid in everyone:
                set_priority(pid, niceness, realtime=realtime)
        if pids is not None:
            pids[:] = everyone
        yield base


def set_priority(pid: int, niceness: int, *, realtime: bool = False):
    """Every thread of process ``pid`` at ``niceness`` (on Linux a nice value is a thread's),
    and its session's autogroup too: where the kernel groups processes by session
    (``/proc/sys/kernel/sched_autogroup_enabled``), a nice value ranks a thread only among its
    own session's, the autogroup's among the machine's other sessions (the server and each
    device's process have a session of their own). ``realtime``: every thread also in the
    real-time round-robin class (``SCHED_RR``, priority 1), which runs before every ordinary
    thread whatever its nice value."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)
        if realtime:
            os.sched_setscheduler(int(task.name), os.SCHED_RR, os.sched_param(1))
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(niceness))


def priority_of(pid: int) -> dict:
    """``{"nice", "autogroup_nice", "policy"}`` of process ``pid``'s threads (each the
    set of its threads' values; the autogroup's None without autogroups)."""
    try:
        group = int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        group = None
    tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    names = {os.SCHED_OTHER: "other", os.SCHED_RR: "rr", os.SCHED_FIFO: "fifo"}
    return {"nice": sorted({os.getpriority(os.PRIO_PROCESS, t) for t in tids}),
            "autogroup_nice": group,
            "policy": sorted({names.get(os.sched_getscheduler(t), "other") for t in tids})}


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (its devices' processes, their simulators)."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        kids = [c for c, p in parents.items() if p == todo[-1]]
        todo.pop()
        out += kids
        todo += kids
    return out


def _stop_server(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_up(proc, base) -> str:
    """``base`` once the server answers ``/health`` with every device ready."""
    import httpx
    deadline = time.monotonic() + 900          # a simulated board's first start builds it
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"ringkv serve exited with {proc.returncode}")
        try:
            if httpx.get(base + "/health").status_code == 200:
                return base
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("ringkv serve did not start within 900 s")
        time.sleep(0.1)


async def sse_events(client, url, body):
    """The events of one streamed OpenAI-style request (``data:`` lines, JSON, up to
    ``[DONE]``); an HTTP error or an ``error`` event raises ``RuntimeError``."""
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {await r.aread()}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            yield event


async def _chat(client, base, messages, seed, max_tokens=None, temperature=0.8):
    """One streamed chat completion: (reply, ttft s, usage)."""
    t0 = time.perf_counter()
    ttft, parts, usage = None, [], None
    body = {"messages": messages, "max_tokens": max_tokens or MAX_TOKENS,
            "temperature": temperature, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    async for event in sse_events(client, base + "/v1/chat/completions", body):
        if event["choices"]:
            text = event["choices"][0]["delta"].get("content")
            if text:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                parts.append(text)
        if event.get("usage"):
            usage = event["usage"]
    return "".join(parts), (ttft if ttft is not None else time.perf_counter() - t0), usage


async def _load(base, turns, seed=24, *, requests=None, clients=None, max_tokens=None,
                send=None, max_len=None):
    """The load (module docstring): ``(records, wall s)``, a record ``(ttft s, usage,
    (client, its request number), reply)`` per request. ``base``: a server's URL, or a list
    of several (instances of one cluster): each request then goes to one of them at random.
    ``send``: how a request goes out (:func:`_chat`'s arguments and result; another server's
    API in ``bench_peer``); ``max_len``: the token memory when the server's ``/v1/models`` does
    not tell it."""
    import httpx

    from ringkv.serve.template import chat_prompt
    budget = [requests or REQUESTS]
    records = []
    max_tokens = max_tokens or MAX_TOKENS
    bases = [base] if isinstance(base, str) else list(base)
    send = send or _chat
    if max_len is None:
        max_len = httpx.get(bases[0] + "/v1/models").json()["data"][0]["max_model_len"]

    async def client_task(c):
        rng = random.Random(seed * 1000 + c)
        pick = random.Random(seed * 7919 + c)      # (the instance: not the load's own draws)
        sent = 0
        async with httpx.AsyncClient(timeout=1800) as client:
            while budget[0] > 0:
                messages = [{"role": "system", "content": _system(rng.randrange(SYSTEMS))},
                            {"role": "user", "content": rng.choice(_QUESTIONS)}]
                for _turn in range(rng.randint(*turns)):
                    if budget[0] <= 0 or \
                            len(chat_prompt(messages).tokens) + max_tokens > max_len:
                        break
                    budget[0] -= 1
                    to = bases[0] if len(bases) == 1 else pick.choice(bases)
                    reply, ttft, usage = await send(client, to, messages,
                                                    rng.randrange(1 << 31), max_tokens)
                    records.append((ttft, usage, (c, sent), reply))
                    sent += 1
                    roll = rng.random()
                    if roll < 0.15:              # edit the last message
                        messages = messages[:-1] + [{"role": "user",
                                                     "content": rng.choice(_QUESTIONS)}]
                    elif roll < 0.25:            # regenerate: the same messages again
                        pass
                    else:
                        messages = messages + [{"role": "assistant", "content": reply},
                                               {"role": "user",
                                                "content": rng.choice(_QUESTIONS)}]

    t0 = time.perf_counter()
    await asyncio.gather(*(client_task(c) for c in range(clients or CLIENTS)))
    return records, time.perf_counter() - t0


def _overhead(base) -> tuple[float, int, dict]:
    """The server's overhead from its ``/metrics``: the mean (s), the requests counted, and
    the share of requests whose overhead was at most 1, 2 and 5 ms with the median and the
    90th percentile (ms; interpolated within the histogram's buckets, ``serve/metrics.py``, as
    Prometheus' ``histogram_quantile`` does): the mean carries a loaded machine's rare long
    stalls, the shares and the quantiles say how many requests met the 2 ms target."""
    import httpx
    total = count = 0.0
    buckets = {}
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("ringkv_server_overhead_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("ringkv_server_overhead_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("ringkv_server_overhead_seconds_bucket"):
            buckets[line.split('le="', 1)[1].split('"', 1)[0]] = float(line.split()[-1])
    shares = {f"overhead_share_le_{ms}ms": round(buckets.get(bound, 0.0) / count, 4)
              if count else None for ms, bound in (("1", "0.001"), ("2", "0.002"),
                                                   ("5", "0.005"))}
    for q in (50, 90):
        shares[f"overhead_p{q}_ms"] = _quantile_ms(buckets, q / 100)
    return (total / count if count else float("nan")), int(count), shares


def _quantile_ms(buckets: dict, q: float) -> float | None:
    """The ``q`` quantile (ms) of a Prometheus histogram's cumulative ``{le: count}``, linear
    within the bucket it falls in (None without observations; the last finite bound when it
    falls in ``+Inf``)."""
    bounds = sorted((float(le), n) for le, n in buckets.items())
    if not bounds or bounds[-1][1] == 0:
        return None
    rank, low, below = q * bounds[-1][1], 0.0, 0.0
    for le, n in bounds:
        if n >= rank:
            if le == float("inf"):
                return round(low * 1e3, 3)
            return round((low + (le - low) * (rank - below) / max(n - below, 1e-12)) * 1e3, 3)
        low, below = le, n
    return round(low * 1e3, 3)


#: the steps of a request in the server's debug log (``serve/app.py``); one request at a time
#: (:func:`sequential_overhead`) a request's overhead is all of them but ``routed->picked``
#: (the device's queue) and ``started->ended`` (the scheduler): with nothing else running,
#: ``picked->got`` is the hop to the device's process and ``got->started`` its setup. (Under
#: load a batching device reads a request between two steps: ``ringkv_queue_wait_seconds``
#: then counts ``picked->got`` as the device's queue, ``serve/engine.py``.)
STEPS = ("received->routed", "routed->picked", "picked->got", "got->started",
         "started->ended", "ended->answered", "answered->finished")
OVERHEAD_STEPS = tuple(s for s in STEPS if s not in ("routed->picked", "started->ended"))


def _steps(log) -> list[dict]:
    """``{step: ms}`` per request from a server's debug log."""
    import re
    out = []
    for line in Path(log).read_text().splitlines():
        found = dict(re.findall(r"(\w+->\w+) ([\d.]+) ms", line))
        if set(STEPS) <= set(found):
            out.append({k: float(found[k]) for k in STEPS})
    return out


def sequential_overhead(requests: int, niceness=None, *, realtime=False, shape=None,
                        workdir=None) -> dict:
    """The server's own overhead with one client sending ``requests`` chat requests one at a
    time (8 tokens each) to one software device (the ``shape``; None: ``SHAPE``), the server
    and its device's process at scheduling priority ``niceness`` and ``realtime``
    (:func:`set_priority`; None: as started). Returns the metric's
    mean (``ringkv_server_overhead_seconds``, ms), the per-request overhead's median, p90 and
    max from the step log, each step's median, the priorities of the server and its device's
    process (``priorities``: :func:`priority_of`) and the 1-minute load average at the start
    and end."""
    import tempfile

    import httpx
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-serve-"))
        log = Path(workdir) / f"sequential-{niceness}-{realtime}.log"
        load_start = os.getloadavg()[0]
        pids: list = []
        with _server(1, "prefix", CAPACITY, clients=1, shape=shape, niceness=niceness,
                     realtime=realtime, log=log, pids=pids) as base:
            priorities = [priority_of(pid) for pid in pids]
            msgs = [{"role": "system", "content": _system(0)},
                    {"role": "user", "content": "Who?"}]
            with httpx.Client(timeout=600) as client:
                for i in range(requests):
                    r = client.post(base + "/v1/chat/completions", json={
                        "messages": msgs, "max_tokens": 8, "temperature": 0.8, "seed": i})
                    r.raise_for_status()
            mean, n, _ = _overhead(base)
        load_end = os.getloadavg()[0]
        steps = _steps(log)
    per = [sum(st[k] for k in OVERHEAD_STEPS) for st in steps]
    return {"mean_ms": mean * 1e3, "requests_measured": n, "logged": len(steps),
            "median_ms": _percentile(per, 0.5) if per else float("nan"),
            "p90_ms": _percentile(per, 0.9) if per else float("nan"),
            "max_ms": max(per, default=float("nan")),
            "first_ms": per[0] if per else float("nan"),
            "step_median_ms": {k: round(_percentile([st[k] for st in steps], 0.5), 3)
                               for k in STEPS} if steps else {},
            "niceness": niceness, "priorities": priorities,
            "bench_priority": priority_of(os.getpid()),
            "loadavg_1min": round(load_start, 2), "loadavg_1min_end": round(load_end, 2)}


def _percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


#: ``ringkv serve`` running one request at a time on each device (the baseline of batching)
ONE_AT_A_TIME = ("--max-batch", "1")
CONFIGS = (("one device", 1, "prefix", CAPACITY, ()),
           ("one device, one at a time", 1, "prefix", CAPACITY, ONE_AT_A_TIME),
           ("four devices", 4, "prefix", CAPACITY, ()),
           ("four devices, one at a time", 4, "prefix", CAPACITY, ONE_AT_A_TIME),
           ("four devices, round-robin", 4, "round-robin", CAPACITY, ()),
           ("one device, infinite store", 1, "prefix", 1 << 30, ()))
#: the long-conversation load: the configurations that the placement comparison needs
LONG_CONFIGS = tuple(c for c in CONFIGS if c[0] in ("four devices", "four devices, round-robin",
                                                     "one device, infinite store"))
#: how throughput grows with the clients (one device, batched and one at a time): clients,
#: requests (``SWEEP_REQUESTS`` per client)
SWEEP_CLIENTS = (1, 4, 16, 64)
SWEEP_REQUESTS = 4


def run(smoke: bool = False):
    """The figures; ``smoke``: 8 requests of 2 clients on the demo shape, 3 sequential ones
    (``make test`` runs it so that a broken benchmark fails there)."""
    if not smoke:
        return _run()
    names = ("REQUESTS", "CLIENTS", "SHAPE", "SEQUENTIAL", "SWEEP_CLIENTS", "SWEEP_REQUESTS",
             "LONG_TURNS")
    saved = {k: globals()[k] for k in names}
    globals().update(REQUESTS=8, CLIENTS=2, SHAPE="demo", SEQUENTIAL=3, SWEEP_CLIENTS=(1, 2),
                     SWEEP_REQUESTS=2, LONG_TURNS=None)
    try:
        return _run()
    finally:
        globals().update(saved)


def _key(label: str) -> str:
    return label.replace(", ", "_").replace(" ", "_")


def _measure(prefix: str, turns, configs, common) -> tuple[list, dict]:
    """One load on each configuration: ``(results, {label: cached fraction})``."""
    out, fractions = [], {}
    for label, devices, placement, capacity, extra in configs:
        load_start = os.getloadavg()[0]
        with _server(devices, placement, capacity, extra=extra) as base:
            records, wall = asyncio.run(_load(base, turns))
            overhead, n, shares = _overhead(base)
        ttfts = [r[0] for r in records]
        prompt = sum(r[1]["prompt_tokens"] for r in records)
        cached = sum(r[1]["prompt_tokens_details"]["cached_tokens"] for r in records)
        generated = sum(r[1]["completion_tokens"] for r in records)
        fractions[label] = cached / prompt
        params = dict(common, devices=devices, placement=placement, turns=list(turns),
                      capacity=None if capacity >= 1 << 30 else capacity, setup=label,
                      wall_s=round(wall, 2), prompt_tokens=prompt, cached_tokens=cached,
                      generated_tokens=generated, requests_sent=len(records),
                      computed_tokens=prompt - cached + generated,
                      max_batch=1 if extra == ONE_AT_A_TIME else "hot tier",
                      loadavg_1min=round(load_start, 2),
                      loadavg_1min_end=round(os.getloadavg()[0], 2))
        key = prefix + _key(label)
        out += [
            {"name": f"serve.{key}.ttft_p50_s", "value": round(_percentile(ttfts, 0.5), 4),
             "unit": "s", "params": params},
            {"name": f"serve.{key}.ttft_p99_s", "value": round(_percentile(ttfts, 0.99), 4),
             "unit": "s", "params": params},
            {"name": f"serve.{key}.tokens_per_s", "value": round(generated / wall, 1),
             "unit": "tokens/s", "params": params},
            {"name": f"serve.{key}.cached_fraction", "value": round(cached / prompt, 4),
             "unit": "fraction", "params": params},
            {"name": f"serve.{key}.overhead_ms", "value": round(overhead * 1e3, 3),
             "unit": "ms", "params": dict(params, requests_measured=n, **shares)},
        ]
    prefix_, inf = fractions["four devices"], fractions["one device, infinite store"]
    rr = fractions["four devices, round-robin"]
    common = dict(common, turns=list(turns))
    out += [{"name": f"serve.{prefix}prefix_vs_infinite", "value": round(prefix_ / inf, 3),
             "unit": "ratio", "params": dict(common, target=">= 0.9")},
            {"name": f"serve.{prefix}prefix_vs_round_robin",
             "value": round(prefix_ / rr, 3) if rr else float("inf"), "unit": "ratio",
             "params": dict(common, target=">= 2")},
            {"name": f"serve.{prefix}infinite_vs_round_robin",
             "value": round(inf / rr, 3) if rr else float("inf"), "unit": "ratio",
             "params": dict(common, target="the ceiling of prefix_vs_round_robin")}]
    return out, fractions


def _batching(out, prefix, common):
    """Batched against one request at a time, one and four devices (targets: at least 15x
    the throughput, a median TTFT under 2 s)."""
    by = {r["name"]: r for r in out}
    figures = []
    for label in ("one device", "four devices"):
        key = f"serve.{prefix}{_key(label)}"
        base = by.get(f"serve.{prefix}{_key(label + ', one at a time')}.tokens_per_s")
        if base is None or key + ".tokens_per_s" not in by:
            continue
        ratio = by[key + ".tokens_per_s"]["value"] / base["value"]
        figures.append({"name": f"{key}.batched_vs_one_at_a_time", "value": round(ratio, 2),
                        "unit": "ratio", "params": dict(common, target=">= 15")})
    return figures


def _sweep(common) -> list:
    """Throughput and TTFT against the number of clients, one device, batched and one
    request at a time (``SWEEP_REQUESTS`` requests a client)."""
    out = []
    for clients in SWEEP_CLIENTS:
        for mode, extra in (("batched", ()), ("one_at_a_time", ONE_AT_A_TIME)):
            load_start = os.getloadavg()[0]
            with _server(1, "prefix", CAPACITY, clients=clients, extra=extra) as base:
                records, wall = asyncio.run(_load(base, TURNS, requests=SWEEP_REQUESTS * clients,
                                                  clients=clients))
            ttfts = [r[0] for r in records]
            generated = sum(r[1]["completion_tokens"] for r in records)
            params = dict(common, clients=clients, requests=len(records), mode=mode,
                          wall_s=round(wall, 2), generated_tokens=generated,
                          loadavg_1min=round(load_start, 2),
                          loadavg_1min_end=round(os.getloadavg()[0], 2))
            key = f"serve.clients{clients}.{mode}"
            out += [{"name": f"{key}.tokens_per_s", "value": round(generated / wall, 1),
                     "unit": "tokens/s", "params": params},
                    {"name": f"{key}.ttft_p50_s", "value": round(_percentile(ttfts, 0.5), 4),
                     "unit": "s", "params": params}]
    return out


def model_limit(shape: str | None = None, seconds: float = 3.0) -> dict:
    """What one device's arithmetic allows, measured in this process on one core (the BLAS on
    one thread, as in a device's process): the model's matrix products per token (FLOPs)
    and their rate in 512-row batches (:func:`~ringkv.host.model.transformer.batch_matmul`),
    so ``matmul_tokens_per_s``: tokens a second if a token cost only its products; and
    ``step_tokens_per_s``: tokens a batched step computes a second with the bit-exact core
    model's attention too (32 decode tokens and 7 prefill chunks of 64 over rings of 256
    tokens, the load's mix)."""
    import numpy as np

    from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG
    from ringkv.host.model.transformer import Model, RingPool, batch_matmul, limit_blas_threads
    limit_blas_threads(1)
    config = DEMO_CONFIG if (shape or SHAPE) == "demo" else DEFAULT_CONFIG
    model = Model.trained(config)
    mats = [w for k, w in model.w.items() if w.ndim == 2 and k != "emb"]
    flops = sum(2 * w.shape[0] * w.shape[1] for w in mats)
    x = np.random.default_rng(0).standard_normal((512, model.hidden))
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        for w in mats:
            batch_matmul(x if w.shape[0] == model.hidden else
                         np.zeros((512, w.shape[0])), w)
        done += 512
    matmul_rate = done / (time.perf_counter() - t0)
    pool = RingPool(config, 40)
    backends = [pool.backend(i) for i in range(39)]
    rng = np.random.default_rng(1)
    for b in backends:
        model.prefill(rng.integers(0, 256, 256).tolist(), 0, b, 64)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        items = [([int(rng.integers(0, 256))], b.n, b) for b in backends[:32]]
        items += [(rng.integers(0, 256, 64).tolist(), b.n, b) for b in backends[32:]]
        model.forward_batch(items)
        done += 32 + 7 * 64
    step_rate = done / (time.perf_counter() - t0)
    return {"flops_per_token": flops, "matmul_gflops": round(flops * matmul_rate / 1e9, 2),
            "matmul_tokens_per_s": round(matmul_rate, 1),
            "step_tokens_per_s": round(step_rate, 1)}


def _run():
    common = {"requests": REQUESTS, "clients": CLIENTS, "systems": SYSTEMS,
              "max_tokens": MAX_TOKENS, "config": SHAPE,
              "loadavg_1min": round(os.getloadavg()[0], 2),
              "machine": f"{os.cpu_count()} CPUs, shared"}
    limit = model_limit()
    out = [{"name": "serve.model_limit.step_tokens_per_s", "value": limit["step_tokens_per_s"],
            "unit": "tokens/s", "params": dict(common, **limit)},
           {"name": "serve.model_limit.matmul_tokens_per_s",
            "value": limit["matmul_tokens_per_s"], "unit": "tokens/s",
            "params": dict(common, **limit)}]
    out += _measure("", TURNS, CONFIGS, common)[0]
    out += _batching(out, "", common)
    out += _sweep(common)
    if LONG_TURNS:
        out += _measure("long.", LONG_TURNS, LONG_CONFIGS, common)[0]
    # the server's own overhead with one client, one request at a time
    seq = sequential_overhead(SEQUENTIAL)
    out.append({"name": "serve.overhead_sequential_ms", "value": round(seq["mean_ms"], 3),
                "unit": "ms", "params": dict(common, **_rounded(seq), clients=1,
                                             target="< 2 ms")})
    return out


def _rounded(d: dict) -> dict:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()}


def _overhead_cell(r) -> str:
    """The mean, with the median and the share of requests at most 2 ms where the run
    recorded them."""
    p = r["params"]
    share, p50 = p.get("overhead_share_le_2ms"), p.get("overhead_p50_ms")
    extra = [] if p50 is None else [f"p50 {p50:.2f}"]
    extra += [] if share is None else [f"{100 * share:.0f} % <= 2"]
    return f"{r['value']:.2f}" + (f" ({', '.join(extra)})" if extra else "")


def _table(by, prefix, configs) -> str | None:
    rows = []
    for label, *_ in configs:
        key = "serve." + prefix + _key(label)
        if key + ".ttft_p50_s" not in by:
            continue
        p = by[key + ".ttft_p50_s"]["params"]
        rows.append([label, p["devices"], p["placement"], p["capacity"] or "unbounded",
                     f"{by[key + '.ttft_p50_s']['value'] * 1e3:.0f}",
                     f"{by[key + '.ttft_p99_s']['value'] * 1e3:.0f}",
                     by[key + ".tokens_per_s"]["value"],
                     f"{by[key + '.cached_fraction']['value']:.3f}",
                     _overhead_cell(by[key + ".overhead_ms"]), p["wall_s"],
                     f"{p['loadavg_1min']} / {p['loadavg_1min_end']}"])
    if not rows:
        return None
    return table(["setup", "devices", "placement", "records/device", "TTFT p50 ms",
                  "TTFT p99 ms", "tokens/s", "cached", "overhead ms: mean (p50, share <= 2 ms)",
                  "wall s",
                  "load avg start / end"], rows)


def markdown(results) -> str:
    by = {r["name"]: r for r in results}
    any_p = next(r["params"] for r in results)
    lines = [f"{any_p['clients']} clients at once, {any_p['requests']} streamed chat requests "
             f"in multi-turn conversations behind {any_p['systems']} system prompts, with "
             f"edits and regenerations; sampled (temperature 0.8, a seed per request), "
             f"max_tokens {any_p['max_tokens']}; the `{any_p['config']}` shape with the "
             f"trained model, software devices (bit-exact core model), each in a process of "
             f"its own. Wall-clock on {any_p['machine']} (the 1-minute load average at the "
             "start and end of each setup is in the tables: the times are inflated by other "
             "jobs). Cached = prompt tokens served from the store (or still resident) / "
             "prompt tokens; overhead = a request's time in the server outside the device's "
             "scheduler and its queue (mean over the setup's requests)."]
    for prefix, configs, what in (("", CONFIGS, "Conversations of {t} turns"),
                                  ("long.", LONG_CONFIGS, "Longer conversations: {t} turns")):
        text = _table(by, prefix, configs)
        if text is None:
            continue
        turns = by["serve." + prefix + _key(configs[0][0]) + ".ttft_p50_s"]["params"]["turns"]
        lines += ["", what.format(t=f"{turns[0]} to {turns[1]}") +
                  " (fewer when the token memory is full):", "", text]
    sweep = [(c, by.get(f"serve.clients{c}.batched.tokens_per_s"),
              by.get(f"serve.clients{c}.one_at_a_time.tokens_per_s"),
              by.get(f"serve.clients{c}.batched.ttft_p50_s"),
              by.get(f"serve.clients{c}.one_at_a_time.ttft_p50_s")) for c in SWEEP_CLIENTS]
    sweep = [row for row in sweep if all(row[1:])]
    if sweep:
        lines += ["", "Throughput against the number of clients (one device, "
                  f"{sweep[0][1]['params']['requests'] // sweep[0][0]} requests a client):", "",
                  table(["clients", "batched tokens/s", "one at a time tokens/s", "ratio",
                         "batched TTFT p50 ms", "one at a time TTFT p50 ms"],
                        [[c, b["value"], o["value"], round(b["value"] / o["value"], 2),
                          f"{tb['value'] * 1e3:.0f}", f"{to['value'] * 1e3:.0f}"]
                         for c, b, o, tb, to in sweep])]
    limit = by.get("serve.model_limit.step_tokens_per_s")
    if limit is not None:
        p = limit["params"]
        lines += ["", f"The limit to measure against, one device's arithmetic on one core "
                  f"(its process; the server's HTTP side and the clients take the other): "
                  f"the model's matrix products cost {p['flops_per_token'] / 1e6:.2f} MFLOP a "
                  f"token, {p['matmul_gflops']} GFLOP/s in 512-row batches, so at most "
                  f"{p['matmul_tokens_per_s']:.0f} tokens/s from the products alone; a batched "
                  f"step with the bit-exact core model's attention computes "
                  f"{p['step_tokens_per_s']:.0f} tokens/s (32 decode tokens and 7 prefill "
                  f"chunks of 64 a step). A request's computed tokens are its prompt tokens "
                  f"not served from the store or the hot tier, and the tokens it generates "
                  f"(column `computed` of the results)."]
    names = [n for p in ("", "long.") for n in (f"serve.{p}prefix_vs_infinite",
                                                 f"serve.{p}prefix_vs_round_robin",
                                                 f"serve.{p}infinite_vs_round_robin")]
    names = [f"serve.{k}.batched_vs_one_at_a_time" for k in ("one_device", "four_devices")] \
        + names
    extra = [(n, by[n]) for n in names + ["serve.overhead_sequential_ms"] if n in by]
    if extra:
        lines += ["", table(["figure", "value", "target"],
                            [[n, r["value"], r["params"].get("target", "")]
                             for n, r in extra])]
    return "\n".join(lines)
