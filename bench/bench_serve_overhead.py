"""The server's own overhead per request with one client sending one request at a time, at
the priority the server was started with and raised above the machine's other jobs, back to
back: what the server costs apart from what the machine's contention adds.

``bench_serve.sequential_overhead``: ``SEQUENTIAL`` chat requests (8 tokens each, sampled) one
after another to ``ringkv serve`` on one software device, the demo shape; the metric's mean
(``ringkv_server_overhead_seconds``) and, from the server's step log (``--log-level debug``),
each request's own overhead (its steps outside the device's queue and the scheduler:
``bench_serve.OVERHEAD_STEPS``) with its median and p90, and each step's median. Once as
started (a session of its own, the machine's default priority), once with the server and its
device's process raised to niceness ``RAISED`` (``bench_serve.set_priority``: every thread,
and the session's autogroup, without which a nice value ranks a thread only within its own
session), and once more in the real-time class besides (``SCHED_RR``, priority 1: before every
ordinary thread; the run's CPU time is bounded, a few seconds of the device's model); both
need root and are skipped otherwise. The 1-minute load average at the start and end of
each is recorded: on a loaded machine a process that was waiting for a message (the device's
process for its request, the server's thread for the answer) waits again for a core before it
can read it; raised above the load it does not, and what remains is the server's own cost.

``RINGKV_BENCH_SERVE_SEQUENTIAL`` (default 200). ``run(smoke=True)``: 3 requests each.
"""

import os

from bench import bench_serve as serve
from bench.run import table

__all__ = ["TITLE", "run", "markdown", "RAISED"]

TITLE = "Server: its own overhead per request, one request at a time, by priority"
SEQUENTIAL = int(os.environ.get("RINGKV_BENCH_SERVE_SEQUENTIAL", "200"))
RAISED = -10
#: (figure name, niceness, real-time)
LEVELS = (("as_started", None, False), ("raised", RAISED, False), ("realtime", RAISED, True))


def run(smoke: bool = False):
    """The figures (module docstring); ``smoke``: 3 requests at each priority."""
    requests = 3 if smoke else SEQUENTIAL
    out = []
    for name, level, realtime in LEVELS:
        if level is not None and os.geteuid() != 0:
            continue
        seq = serve.sequential_overhead(requests, level, realtime=realtime, shape="demo")
        params = dict(serve._rounded(seq), requests=requests, clients=1, config="demo",
                      max_tokens=8, priority=name,
                      machine=f"{os.cpu_count()} CPUs, shared", target="< 2 ms")
        for figure in ("mean_ms", "median_ms", "p90_ms"):
            out.append({"name": f"serve.overhead.{name}.{figure}",
                        "value": round(seq[figure], 3), "unit": "ms", "params": params})
    return out


def markdown(results) -> str:
    by = {r["name"]: r for r in results}
    rows = []
    for name, *_ in LEVELS:
        key = f"serve.overhead.{name}"
        if key + ".mean_ms" not in by:
            continue
        p = by[key + ".mean_ms"]["params"]
        steps = p.get("step_median_ms", {})
        prio = ", ".join("{}/{}/{}".format(",".join(map(str, x["nice"])), x["autogroup_nice"],
                                           ",".join(x["policy"])) for x in p["priorities"])
        rows.append([name.replace("_", " "), prio, p["requests"],
                     f"{by[key + '.mean_ms']['value']:.2f}",
                     f"{by[key + '.median_ms']['value']:.2f}",
                     f"{by[key + '.p90_ms']['value']:.2f}", f"{p['max_ms']:.2f}",
                     " / ".join(f"{steps.get(s, float('nan')):.2f}"
                                for s in serve.OVERHEAD_STEPS),
                     f"{p['loadavg_1min']} / {p['loadavg_1min_end']}"])
    p = results[0]["params"]
    return "\n".join([
        f"One client, {p['requests']} chat requests one after another ({p['max_tokens']} "
        "tokens each, sampled), `ringkv serve` on one software device, the demo shape; "
        f"wall-clock on {p['machine']}. Overhead = a request's time in the server outside the "
        "device's queue and its scheduler; per request from the server's step log (mean, "
        "median, p90, max), the steps' medians being " +
        ", ".join(f"`{s}`" for s in serve.OVERHEAD_STEPS) + ". Priority: nice / autogroup "
        "nice / scheduling class of the server's threads and its device's process's. Target: "
        "under 2 ms.", "",
        table(["priority", "nice / autogroup / class", "requests", "mean ms", "median ms", "p90 ms",
               "max ms", "steps (medians) ms", "load avg start / end"], rows)])
