"""A peer in the same run: llama.cpp's ``llama-server`` on the same weights, the same load as
``bench serve`` (:func:`bench.bench_serve._load`), beside ``ringkv serve``; and whether the two
give the same greedy tokens.

The peer: llama.cpp built from source by ``make peer`` (``build/llama.cpp``: the llama.cpp
that ``llama-cpp-python`` 0.3.36 vendors, commit ``0c1e5709``; CPU only, the system's C++
compiler and cmake), serving the trained model written as GGUF by :mod:`bench.gguf_export`
(architecture ``granite_swa`` with the sliding window on every layer; F32 tensors). Not part of
``make test`` or ``make demo``: without the built server (or without the ``gguf`` package) this
group has nothing to run, and its smoke test is skipped.

Figures:

* **Greedy equality** (``peer.greedy.*``): for each of ``PROMPTS`` (a BOS and a text), the
  tokens ``ringkv``'s float model generates greedily (:meth:`Model.generate` on
  :class:`Float64Backend`: float64, not the fixed-point core) against llama-server's
  (``/completion`` with the prompt as token ids, temperature 0, no prompt cache), first while
  prompt and generation stay within the window ``W`` (the tokens up to ``W`` in all), then
  past it (``3 W`` in all). The figure is the fraction of generated tokens equal before the
  first difference (after a difference the two continue from different texts).
* **Under load** (``peer.<server>.*``): the ``bench serve`` load (``CLIENTS`` clients,
  ``REQUESTS`` streamed requests, conversations behind ``SYSTEMS`` system prompts, edits and
  regenerations, temperature 0.8 with a seed per request, ``MAX_TOKENS`` tokens at most, the
  token memory ``max_model_len`` of ``ringkv serve``) against llama-server with ``SLOTS`` slots
  of ``max_model_len`` tokens each, continuous batching, its prompt cache in RAM (on by default:
  ``--cache-ram`` 8 GiB) and context checkpoints (default 32 a slot), ``THREADS`` compute
  thread(s); and against ``ringkv serve`` with one software device (the ``bench serve``
  ``one device`` setup) in the same run. Requests to llama-server go to its OpenAI
  ``/v1/completions`` with our chat template applied by the client (:func:`chat_prompt`'s
  tokens after the BOS, decoded: the server puts its BOS in front, so the model reads the same
  tokens; checked per run against its ``/tokenize``) and ``stop: ["\\n\\n"]`` (where a
  ``ringkv serve`` reply stops by itself). Tokens per second over the run, TTFT p50/p99 (the
  first text chunk), the prompt tokens served from a cache.
* **A resumed turn with more conversations than slots** (``peer.<server>.resume.*``):
  ``RESUME_CONVERSATIONS`` conversations take turns one request at a time (the first turn of
  each, then the second of each, ...) on llama-server with ``RESUME_SLOTS`` slots, and on
  ``ringkv serve`` (one software device); TTFT of the first turns and of the resumed ones.

The sampled replies differ between the servers (each its own sampler and random numbers), so
after the first turn the two servers' conversations are different texts of about the same
lengths; the requests (system prompts, questions, edits, turns) are the same.

Wall-clock figures on a shared machine: the 1-minute load average at the start and end of each
setup is recorded with its results. ``RINGKV_LLAMA_SERVER``: another llama-server binary.
"""

import asyncio
import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

from bench.bench_serve import _stop_server
from bench.run import table

__all__ = ["TITLE", "run", "markdown", "llama_server", "server_binary", "missing",
           "greedy_tokens", "PROMPTS"]

TITLE = "Peer: llama.cpp's llama-server on the same weights and load"
ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "llama.cpp" / "cmake" / "bin"
SHAPE = os.environ.get("RINGKV_BENCH_SERVE_CONFIG", "demo")
SLOTS = int(os.environ.get("RINGKV_BENCH_PEER_SLOTS", "8"))
THREADS = 1
GREEDY_SHAPES = ("demo", "default")
RESUME_SLOTS = 2
RESUME_CONVERSATIONS = 8
RESUME_TURNS = 4
#: the greedy check's llama-server keeps K and V in float32 (its default is float16)
GREEDY_EXTRA = ("--cache-type-k", "f32", "--cache-type-v", "f32")
LLAMA_CPP = "llama.cpp 0c1e5709 (vendored by llama-cpp-python 0.3.36)"
PROMPTS = ("In the beginning God created the heaven and the earth.",
           "And the LORD spake unto Moses, saying,",
           "System: You are a scribe of the King James Bible.\n\nUser: Who was David?\n\n"
           "Assistant: ",
           "Blessed are the",
           "And it came to pass, when",
           "Then said Jesus unto them,")


def server_binary() -> Path:
    return Path(os.environ.get("RINGKV_LLAMA_SERVER", BUILD / "llama-server"))


def missing() -> str | None:
    """Why this group cannot run here (``None``: it can)."""
    if not server_binary().exists():
        return f"no llama-server at {server_binary()} (make peer)"
    try:
        import gguf  # noqa: F401
    except ImportError:
        return "the gguf package is not installed (make peer)"
    return None


def _config(shape):
    from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG
    return DEMO_CONFIG if shape == "demo" else DEFAULT_CONFIG


def _gguf(shape) -> Path:
    """The trained model of ``shape`` as GGUF, written anew each run (it is small)."""
    from bench.gguf_export import export
    from ringkv.host.model.transformer import Model
    return export(Model.trained(_config(shape)), ROOT / "build" / "peer" / f"ringkv-{shape}.gguf")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(model: Path, slots: int, slot_tokens: int, threads: int = THREADS,
                 extra=(), log=None):
    """llama-server on ``model`` in a process group of its own: ``slots`` slots of
    ``slot_tokens`` tokens, continuous batching (its default), ``threads`` compute threads;
    yields its base URL once ``/health`` answers 200."""
    import httpx
    port = _free_port()
    argv = [str(server_binary()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(slots), "--ctx-size", str(slots * slot_tokens),
            "--threads", str(threads), "--threads-batch", str(threads), "--no-webui",
            *extra]
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log, "w")) if log else subprocess.DEVNULL
        proc = subprocess.Popen(argv, start_new_session=True, stdout=out, stderr=out)
        stack.callback(_stop_server, proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}: {argv}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(base + "/health").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not start within 120 s")
            time.sleep(0.1)
        yield base


def _prompt_text(messages) -> str:
    """Our chat template's tokens after the BOS, as text (llama-server adds the BOS)."""
    from ringkv.serve.template import chat_prompt
    tokens = chat_prompt(messages).tokens
    return bytes(tokens[1:]).decode("utf-8")


async def _complete(client, base, messages, seed, max_tokens=None, temperature=0.8):
    """:func:`bench.bench_serve._chat` for llama-server: one streamed ``/v1/completions`` of
    the templated prompt; (reply, ttft s, usage with ``prompt_tokens_details.cached_tokens``)."""
    from bench.bench_serve import MAX_TOKENS, sse_events
    t0 = time.perf_counter()
    ttft, parts, usage, timings = None, [], None, None
    body = {"prompt": _prompt_text(messages), "max_tokens": max_tokens or MAX_TOKENS,
            "temperature": temperature, "seed": seed, "stop": ["\n\n"],
            "stream": True, "stream_options": {"include_usage": True}}
    async for event in sse_events(client, base + "/v1/completions", body):
        for choice in event.get("choices") or ():
            if choice.get("text"):
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                parts.append(choice["text"])
        usage = event.get("usage") or usage
        timings = event.get("timings") or timings
    usage = dict(usage or {})
    details = dict(usage.get("prompt_tokens_details") or {})
    if "cached_tokens" not in details and timings:
        details["cached_tokens"] = timings.get("cache_n", 0)
    usage["prompt_tokens_details"] = details
    return "".join(parts), (ttft if ttft is not None else time.perf_counter() - t0), usage


def greedy_tokens(base, prompt: list[int], n: int) -> list[int]:
    """llama-server's greedy continuation of the token ids ``prompt`` (no prompt cache)."""
    import httpx
    r = httpx.post(base + "/completion", timeout=600, json={
        "prompt": list(prompt), "n_predict": n, "temperature": 0.0, "top_k": 1,
        "cache_prompt": False, "return_tokens": True, "stream": False})
    r.raise_for_status()
    return list(r.json()["tokens"])


def _equal_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _greedy(shape, prompts) -> list:
    """Greedy tokens, ours (float64) against llama-server's, within and past the window."""
    import numpy as np

    from ringkv.host.model.transformer import BOS, Float64Backend, Model
    config = _config(shape)
    model = Model.trained(config)
    w = config.window
    rows = []
    with llama_server(_gguf(shape), 1, 4 * w, extra=GREEDY_EXTRA) as base:
        for text in prompts:
            tokens = [BOS] + list(text.encode("utf-8"))
            for span, total in (("within", w), ("past", 3 * w)):
                n = total - len(tokens) + 1     # the last generated token is not fed back
                if n < 1:
                    continue
                ours = model.generate(tokens, 0, Float64Backend(config), n)
                theirs = greedy_tokens(base, tokens, n)
                if BOS in ours:               # a generated BOS ends llama-server's generation
                    ours = ours[:ours.index(BOS) + 1]
                    n = len(ours)
                k = _equal_prefix(ours, theirs)
                gap = None
                if k < n:
                    # how close our two best tokens were where the two part
                    top = np.sort(model.forward_full(tokens + ours[:k])[-1])
                    gap = float(top[-1] - top[-2])
                rows.append({"prompt": text, "span": span, "prompt_tokens": len(tokens),
                             "generated": n, "equal_prefix": k, "top2_gap_at_difference": gap,
                             "ours": ours, "theirs": theirs[:n]})
    return rows


def _check_template(base):
    """llama-server reads our template's text as our tokens (BOS in front)."""
    import httpx

    from bench.bench_serve import _system
    from ringkv.serve.template import chat_prompt
    messages = [{"role": "system", "content": _system(0)},
                {"role": "user", "content": "Who was he? Ünïcödé, “quotes”."}]
    r = httpx.post(base + "/tokenize", json={"content": _prompt_text(messages),
                                              "add_special": True})
    r.raise_for_status()
    got = r.json()["tokens"]
    want = list(chat_prompt(messages).tokens)
    if got != want:
        raise RuntimeError(f"llama-server tokenizes our template otherwise: {got[:20]}... "
                           f"against {want[:20]}...")


def _greedy_figure(shape, span, rows, common) -> dict:
    equal = sum(r["equal_prefix"] for r in rows)
    total = sum(r["generated"] for r in rows)
    return {"name": f"peer.greedy.{shape}.{span}_window.equal_fraction",
            "value": round(equal / total, 4), "unit": "fraction",
            "params": dict(common, config=shape, window=_config(shape).window,
                           prompts=len(rows), generated_tokens=total, equal_tokens=equal,
                           ours="Float64Backend (float64)", theirs="F32 GGUF, greedy",
                           kv_cache="f32",
                           per_prompt=[{k: r[k] for k in (
                               "prompt", "prompt_tokens", "generated", "equal_prefix",
                               "top2_gap_at_difference")} for r in rows])}


def _figures(prefix, records, wall, params) -> list:
    from bench.bench_serve import _percentile
    ttfts = [r[0] for r in records]
    prompt = sum(r[1]["prompt_tokens"] for r in records)
    cached = sum(r[1]["prompt_tokens_details"].get("cached_tokens", 0) for r in records)
    generated = sum(r[1]["completion_tokens"] for r in records)
    params = dict(params, wall_s=round(wall, 2), requests_sent=len(records),
                  prompt_tokens=prompt, cached_tokens=cached, generated_tokens=generated)
    return [
        {"name": f"{prefix}.tokens_per_s", "value": round(generated / wall, 1),
         "unit": "tokens/s", "params": params},
        {"name": f"{prefix}.ttft_p50_s", "value": round(_percentile(ttfts, 0.5), 4),
         "unit": "s", "params": params},
        {"name": f"{prefix}.ttft_p99_s", "value": round(_percentile(ttfts, 0.99), 4),
         "unit": "s", "params": params},
        {"name": f"{prefix}.cached_fraction", "value": round(cached / prompt, 4) if prompt
         else 0.0, "unit": "fraction", "params": params},
    ]


async def _resume_load(base, send, conversations, turns, seed=7):
    """``conversations`` conversations taking turns, one request at a time: records
    ``(turn, ttft s, usage)``."""
    import random

    import httpx

    from bench.bench_serve import _QUESTIONS, SYSTEMS, _system
    rng = random.Random(seed)
    talks = [[{"role": "system", "content": _system(c % SYSTEMS)},
              {"role": "user", "content": rng.choice(_QUESTIONS)}] for c in range(conversations)]
    records = []
    async with httpx.AsyncClient(timeout=600) as client:
        for turn in range(turns):
            for c in range(conversations):
                reply, ttft, usage = await send(client, base, talks[c], rng.randrange(1 << 31))
                records.append((turn, ttft, usage))
                talks[c] = talks[c] + [{"role": "assistant", "content": reply},
                                       {"role": "user", "content": rng.choice(_QUESTIONS)}]
    return records


def _resume_figures(prefix, records, params) -> list:
    from bench.bench_serve import _percentile
    out = []
    for label, rows in (("first", [r for r in records if r[0] == 0]),
                        ("resumed", [r for r in records if r[0] > 0])):
        ttfts = [r[1] for r in rows]
        prompt = sum(r[2]["prompt_tokens"] for r in rows)
        cached = sum(r[2]["prompt_tokens_details"].get("cached_tokens", 0) for r in rows)
        p = dict(params, turns=label, requests_measured=len(rows), prompt_tokens=prompt,
                 cached_tokens=cached)
        out += [{"name": f"{prefix}.resume.{label}_ttft_p50_s",
                 "value": round(_percentile(ttfts, 0.5), 4), "unit": "s", "params": p},
                {"name": f"{prefix}.resume.{label}_cached_fraction",
                 "value": round(cached / prompt, 4) if prompt else 0.0, "unit": "fraction",
                 "params": p}]
    return out


def run(smoke: bool = False):
    """The figures; ``smoke``: one prompt, 6 requests of 2 clients, 2 conversations of 2 turns
    on 1 slot."""
    import bench.bench_serve as serve
    reason = missing()
    if reason:
        raise RuntimeError(f"bench peer cannot run: {reason}")
    requests, clients = (6, 2) if smoke else (serve.REQUESTS, serve.CLIENTS)
    slots, rslots, convs, turns = (2, 1, 2, 2) if smoke else \
        (SLOTS, RESUME_SLOTS, RESUME_CONVERSATIONS, RESUME_TURNS)
    prompts = PROMPTS[:1] if smoke else PROMPTS
    config = _config(SHAPE)
    common = {"config": SHAPE, "max_tokens": serve.MAX_TOKENS, "peer": LLAMA_CPP,
              "machine": f"{os.cpu_count()} CPUs, shared"}
    out = []

    for shape in (SHAPE,) if smoke else GREEDY_SHAPES:
        rows = _greedy(shape, prompts)
        for span in ("within", "past"):
            mine = [r for r in rows if r["span"] == span]
            if mine:
                out.append(_greedy_figure(shape, span, mine, common))


    model = _gguf(SHAPE)
    max_len = config.max_tokens
    load_common = dict(common, requests=requests, clients=clients, systems=serve.SYSTEMS,
                       turns=list(serve.TURNS), temperature=0.8)
    # llama-server: the same load
    start = os.getloadavg()[0]
    with llama_server(model, slots, max_len) as base:
        _check_template(base)
        records, wall = asyncio.run(serve._load(base, serve.TURNS, requests=requests,
                                                clients=clients, send=_complete,
                                                max_len=max_len))
    out += _figures("peer.llama_server", records, wall, dict(
        load_common, setup="llama-server", slots=slots, slot_tokens=max_len, threads=THREADS,
        loadavg_1min=round(start, 2), loadavg_1min_end=round(os.getloadavg()[0], 2)))
    # ringkv serve, one software device: the same load in the same run
    start = os.getloadavg()[0]
    with serve._server(1, "prefix", serve.CAPACITY, clients=clients) as base:
        records, wall = asyncio.run(serve._load(base, serve.TURNS, requests=requests,
                                                clients=clients))
    out += _figures("peer.ringkv_serve", records, wall, dict(
        load_common, setup="ringkv serve, one software device", capacity=serve.CAPACITY,
        loadavg_1min=round(start, 2), loadavg_1min_end=round(os.getloadavg()[0], 2)))

    # a resumed turn when there are more conversations than slots
    rcommon = dict(common, conversations=convs, turns_each=turns, temperature=0.8)
    start = os.getloadavg()[0]
    with llama_server(model, rslots, max_len) as base:
        records = asyncio.run(_resume_load(base, _complete, convs, turns))
    out += _resume_figures("peer.llama_server", records, dict(
        rcommon, slots=rslots, threads=THREADS, loadavg_1min=round(start, 2),
        loadavg_1min_end=round(os.getloadavg()[0], 2)))
    start = os.getloadavg()[0]
    with serve._server(1, "prefix", serve.CAPACITY, clients=1) as base:
        records = asyncio.run(_resume_load(base, serve._chat, convs, turns))
    out += _resume_figures("peer.ringkv_serve", records, dict(
        rcommon, capacity=serve.CAPACITY, loadavg_1min=round(start, 2),
        loadavg_1min_end=round(os.getloadavg()[0], 2)))
    return out


def markdown(results) -> str:
    by = {r["name"]: r for r in results}
    any_p = results[0]["params"]
    lines = [f"The peer: {any_p['peer']}, built by `make peer` (CPU only), serving the trained "
             f"`{any_p['config']}` model written as GGUF (`bench/gguf_export.py`: architecture "
             "`granite_swa`, the sliding window on every layer, F32). What differs: "
             "`docs/blocks/serve.md`, \"Peer\". Wall-clock on "
             f"{any_p['machine']}: the 1-minute load average at the start and end of each setup "
             "is in the tables."]
    greedy = [r for r in results if r["name"].startswith("peer.greedy.")]
    if greedy:
        def gaps(g):
            found = [f"{r['top2_gap_at_difference']:.1e}" for r in g["params"]["per_prompt"]
                     if r["top2_gap_at_difference"] is not None]
            return ", ".join(found) or "-"
        lines += ["", "Greedy tokens, ours (the float model, float64) against llama-server's "
                  "(temperature 0, the prompt as token ids, K/V cache in f32): the fraction of "
                  "generated tokens equal before the first difference; where they part, the "
                  "gap between our two best logits there.", "",
                  table(["shape", "W", "span (prompt + generated)", "prompts",
                         "generated tokens", "equal", "fraction", "top-2 gap where they part"],
                        [[g["params"]["config"], g["params"]["window"],
                          "within W" if ".within_" in g["name"] else "3 W",
                          g["params"]["prompts"], g["params"]["generated_tokens"],
                          g["params"]["equal_tokens"], g["value"], gaps(g)] for g in greedy])]
    rows = []
    for key, label in (("llama_server", "llama-server"), ("ringkv_serve", "ringkv serve")):
        r = by.get(f"peer.{key}.tokens_per_s")
        if r is None:
            continue
        p = r["params"]
        rows.append([label, p.get("slots", "hot tier"), r["value"],
                     f"{by[f'peer.{key}.ttft_p50_s']['value'] * 1e3:.0f}",
                     f"{by[f'peer.{key}.ttft_p99_s']['value'] * 1e3:.0f}",
                     f"{by[f'peer.{key}.cached_fraction']['value']:.3f}", p["wall_s"],
                     f"{p['loadavg_1min']} / {p['loadavg_1min_end']}"])
    if rows:
        p = by["peer.llama_server.tokens_per_s"]["params"]
        lines += ["", f"The `bench serve` load: {p['clients']} clients, {p['requests']} streamed "
                  f"requests, conversations of {p['turns'][0]} to {p['turns'][1]} turns behind "
                  f"{p['systems']} system prompts with edits and regenerations, temperature "
                  f"0.8, max_tokens {p['max_tokens']}; llama-server with {p['slots']} slots of "
                  f"{p['slot_tokens']} tokens, {p['threads']} compute thread; ringkv serve with "
                  "one software device.", "",
                  table(["server", "slots", "tokens/s", "TTFT p50 ms", "TTFT p99 ms", "cached",
                         "wall s", "load avg start / end"], rows)]
    rows = []
    for key, label in (("llama_server", "llama-server"), ("ringkv_serve", "ringkv serve")):
        first = by.get(f"peer.{key}.resume.first_ttft_p50_s")
        if first is None:
            continue
        resumed = by[f"peer.{key}.resume.resumed_ttft_p50_s"]
        p = resumed["params"]
        rows.append([label, p.get("slots", "hot tier"),
                     f"{first['value'] * 1e3:.0f}", f"{resumed['value'] * 1e3:.0f}",
                     f"{by[f'peer.{key}.resume.resumed_cached_fraction']['value']:.3f}",
                     f"{p['loadavg_1min']} / {p['loadavg_1min_end']}"])
    if rows:
        p = by["peer.llama_server.resume.resumed_ttft_p50_s"]["params"]
        lines += ["", f"More conversations than slots: {p['conversations']} conversations "
                  f"taking turns ({p['turns_each']} each), one request at a time.", "",
                  table(["server", "slots", "first turn TTFT p50 ms",
                         "resumed turn TTFT p50 ms", "resumed: cached", "load avg start / end"],
                        rows)]
    return "\n".join(lines)
