"""guidellm (vLLM's load generator) against ``ringkv serve``, and against llama.cpp's
``llama-server`` on the same weights when ``make peer`` has built it.

guidellm pulls torch and transformers (about 6 GB): it lives in a virtual environment of its
own, ``build/venv-guidellm`` (``make guidellm``), never in the default install, ``make test`` or
``make demo``'s setup; without it this group has nothing to run. It runs offline: its synthetic
prompts are counted with the Hugging Face tokenizer files shipped with the model (``ringkv
tokenizer``: byte-level, 256 byte tokens and ``<BOS>``, no merges; checked in guidellm's venv:
``AutoTokenizer`` encodes and decodes as the model's byte tokenizer).

Two profiles, each level synthetic chat requests of ``PROMPT_TOKENS`` prompt tokens and
``OUTPUT_TOKENS`` output tokens (``/v1/chat/completions``; the template adds its role labels to
the prompt):

* ``concurrent`` at ``STREAMS`` streams, each level for ``SECONDS`` s;
* guidellm's ``sweep`` (what its documentation runs first against a server): the synchronous
  rate (one request at a time), the maximum (``throughput``, at most ``SWEEP_CONCURRENCY``
  requests in flight), then ``SWEEP_SIZE - 2`` constant request rates evenly between the two,
  each level for ``SWEEP_SECONDS`` s (guidellm's default is ten levels of longer runs: more
  than this shared machine affords beside the rest of the bench).

Per level: the request rate asked for and achieved, TTFT p50/p99 and output tokens a second,
as guidellm reports them. ``ringkv serve``: one software device, the demo shape.
llama-server: ``bench_peer``'s settings (``SLOTS`` slots of the token memory, one compute
thread) and our chat template as its Jinja template (so that the chat route reads the same
tokens).
"""

import contextlib
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from bench.run import table

__all__ = ["TITLE", "run", "markdown", "missing", "GUIDELLM", "CHAT_TEMPLATE"]

TITLE = "guidellm against ringkv serve and llama-server"
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "build" / "venv-guidellm"
GUIDELLM = VENV / "bin" / "guidellm"
VERSION = "0.8.1"
STREAMS = (1, 8, 32)
SECONDS = 30
SWEEP_SIZE = 6
SWEEP_SECONDS = 20
SWEEP_CONCURRENCY = 64
PROMPT_TOKENS = 128
OUTPUT_TOKENS = 32
#: our chat template (``serve/template.py``) in Jinja for llama-server's chat route; its BOS
#: is the server's own, put in front by ``add_bos_token``
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] in ['system', 'developer'] %}{{ 'System: ' }}"
    "{% elif m['role'] == 'user' %}{{ 'User: ' }}{% else %}{{ 'Assistant: ' }}{% endif %}"
    "{{ m['content'] }}{{ '\n\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}")


def missing() -> str | None:
    if not GUIDELLM.exists():
        return f"no guidellm at {GUIDELLM} (make guidellm)"
    return None


def _tokenizer() -> Path:
    """The byte vocabulary's Hugging Face tokenizer files shipped with the model (``ringkv
    tokenizer``; ``AutoTokenizer`` in guidellm's venv reads them exactly as the server
    tokenizes)."""
    from ringkv.host.model.vocab import TOKENIZER_DIR
    return Path(TOKENIZER_DIR)


def _guidellm(target, model, tokenizer, profile: dict, overrides: list[dict], seconds,
              requests=None) -> list[dict]:
    """guidellm's ``profile`` (its scenario's ``profile`` spec), once per entry of
    ``overrides`` (a scenario's benchmark: e.g. ``{"profile.streams": 8}``): one result per
    benchmark guidellm reports (a sweep reports one per level)."""
    spec = {"backend": {"kind": "openai_http", "target": target, "model": model,
                        "request_format": "/v1/chat/completions"},
            "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
            "profile": profile,
            "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS,
                      "output_tokens": OUTPUT_TOKENS}],
            "constraints": [{"kind": "max_requests", "count": requests} if requests else
                            {"kind": "max_duration", "seconds": seconds}]}
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "scenario.json"
        scenario.write_text(json.dumps({"spec": spec, "benchmarks": overrides}))
        report = Path(tmp) / "report.json"
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # a guidellm that stops making progress is an error, not a bench that never ends (seen
        # once: its scheduler's processes idle, no connection open, the server idle)
        levels = profile.get("sweep_size", len(overrides))
        limit = levels * (seconds if requests is None else 60) * 3 + 300
        # its own session: on a timeout (or Ctrl-C) the whole group goes, guidellm's worker
        # processes with it
        proc = subprocess.Popen([str(GUIDELLM), "run", "-c", str(scenario), "--output",
                                 f"kind=json,path={report}", "--disable-console"],
                                env=env, cwd=tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"guidellm did not finish within {limit} s "
                               f"({levels} levels of {seconds} s)") from e
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"guidellm exited with {proc.returncode}: "
                               f"{(stderr or stdout)[-2000:]}")
        data = json.loads(report.read_text())
    levels = []
    for b in data["benchmarks"]:
        m = b["metrics"]
        ttft = m["time_to_first_token_ms"]["successful"]["percentiles"]
        strategy = b["config"]["strategy"]
        levels.append({"strategy": strategy.get("type_", profile["kind"]),
                       "streams": strategy.get("streams"),
                       "rate": strategy.get("rate"),
                       "requests_per_s": m["requests_per_second"]["successful"]["mean"],
                       "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"],
                       "output_tokens_per_s": m["output_tokens_per_second"]["successful"]["mean"],
                       "requests": m["request_totals"]["successful"],
                       "errored": m["request_totals"]["errored"],
                       "duration_s": b["duration"]})
    return levels


def _profiles(smoke: bool):
    """``(name, profile spec, overrides, seconds a level, requests a level)`` of each run."""
    if smoke:
        return [("concurrent", {"kind": "concurrent"},
                 [{"profile.streams": s} for s in (1, 2)], SECONDS, 4),
                ("sweep", {"kind": "sweep", "sweep_size": 3, "max_concurrency": 4}, [{}],
                 SWEEP_SECONDS, 4)]
    return [("concurrent", {"kind": "concurrent"},
             [{"profile.streams": s} for s in STREAMS], SECONDS, None),
            ("sweep", {"kind": "sweep", "sweep_size": SWEEP_SIZE,
                       "max_concurrency": SWEEP_CONCURRENCY}, [{}], SWEEP_SECONDS, None)]


def _check_template(base):
    """llama-server's chat route reads our template's tokens (the BOS its own)."""
    import httpx

    from ringkv.serve.template import chat_prompt
    messages = [{"role": "system", "content": "Speak of Moses."},
                {"role": "user", "content": "Who was he?"},
                {"role": "assistant", "content": "A man of God."},
                {"role": "user", "content": "And then?"}]
    text = httpx.post(base + "/apply-template", json={"messages": messages}).json()["prompt"]
    got = httpx.post(base + "/tokenize", json={"content": text, "add_special": True}).json()
    if got["tokens"] != list(chat_prompt(messages).tokens):
        raise RuntimeError(f"llama-server's chat template reads otherwise: {text!r}")


def run(smoke: bool = False):
    """The figures; ``smoke``: 1 and 2 streams and a 3-level sweep, 4 requests a level,
    ringkv serve only."""
    import bench.bench_serve as serve
    from bench import bench_peer
    reason = missing()
    if reason:
        raise RuntimeError(f"bench guidellm cannot run: {reason}")
    tokenizer = _tokenizer()
    common = {"guidellm": VERSION, "prompt_tokens": PROMPT_TOKENS,
              "output_tokens": OUTPUT_TOKENS, "config": serve.SHAPE,
              "machine": f"{os.cpu_count()} CPUs, shared"}
    servers = [("ringkv_serve", None)]
    if not smoke and bench_peer.missing() is None:
        servers.append(("llama_server", bench_peer))
    out = []
    for name, profile, overrides, seconds, requests in _profiles(smoke):
        # the most requests in flight: what the server's queue must take without a 429
        most = max([o.get("profile.streams", 0) for o in overrides]
                   + [profile.get("max_concurrency", 0)])
        for key, peer in servers:
            start = os.getloadavg()[0]
            if peer is None:
                with serve._server(1, "prefix", serve.CAPACITY, clients=most) as base:
                    levels = _guidellm(base, "ringkv-kjv", tokenizer, profile, overrides,
                                       seconds, requests)
            else:
                config = peer._config(serve.SHAPE)
                with tempfile.NamedTemporaryFile("w", suffix=".jinja") as template:
                    template.write(CHAT_TEMPLATE)
                    template.flush()
                    with peer.llama_server(peer._gguf(serve.SHAPE), peer.SLOTS,
                                           config.max_tokens,
                                           extra=("--jinja", "--chat-template-file",
                                                  template.name, "--alias",
                                                  "ringkv-kjv")) as base:
                        _check_template(base)
                        levels = _guidellm(base, "ringkv-kjv", tokenizer, profile, overrides,
                                           seconds, requests)
            end = os.getloadavg()[0]
            for i, level in enumerate(levels):
                params = dict(common, server=key, profile=name, seconds_per_level=seconds,
                              loadavg_1min=round(start, 2), loadavg_1min_end=round(end, 2),
                              **level)
                if name == "concurrent":
                    prefix = f"guidellm.{key}.streams{level['streams']}"
                else:
                    prefix = f"guidellm.{key}.{name}{i}"
                out += [{"name": f"{prefix}.output_tokens_per_s",
                         "value": round(level["output_tokens_per_s"], 1), "unit": "tokens/s",
                         "params": params},
                        {"name": f"{prefix}.ttft_p50_s",
                         "value": round(level["ttft_p50_ms"] / 1e3, 4), "unit": "s",
                         "params": params},
                        {"name": f"{prefix}.ttft_p99_s",
                         "value": round(level["ttft_p99_ms"] / 1e3, 4), "unit": "s",
                         "params": params}]
    return out


def _level(q) -> str:
    """A level as guidellm names it: streams, or the strategy and its rate."""
    if q.get("profile", "concurrent") == "concurrent":
        return f"{q['streams']} stream{'s' if q['streams'] != 1 else ''}"
    if q.get("rate") is not None:
        return f"{q['strategy']} {q['rate']:.2f} req/s"
    return q.get("strategy", "?")


def markdown(results) -> str:
    by = {r["name"]: r for r in results}
    p = results[0]["params"]
    sections = []
    for profile in ("concurrent", "sweep"):
        rows, seconds = [], None
        for r in results:
            q = r["params"]
            if not r["name"].endswith(".output_tokens_per_s") or \
                    q.get("profile", "concurrent") != profile:
                continue
            stem, seconds = r["name"][:-len(".output_tokens_per_s")], q["seconds_per_level"]
            achieved = q.get("requests_per_s")
            rows.append([q["server"].replace("_", " "), _level(q),
                         "" if achieved is None else f"{achieved:.2f}", r["value"],
                         f"{by[stem + '.ttft_p50_s']['value'] * 1e3:.0f}",
                         f"{by[stem + '.ttft_p99_s']['value'] * 1e3:.0f}", q["requests"],
                         q["errored"], f"{q['loadavg_1min']} / {q['loadavg_1min_end']}"])
        if rows:
            sections += ["", f"Profile `{profile}` ({seconds} s a level):", "",
                         table(["server", "level", "requests/s", "output tokens/s",
                                "TTFT p50 ms", "TTFT p99 ms", "requests", "errored",
                                "load avg start / end"], rows)]
    return "\n".join([
        f"guidellm {p['guidellm']}, synthetic chat requests of {p['prompt_tokens']} prompt and "
        f"{p['output_tokens']} output tokens, the `{p['config']}` shape; ringkv serve with one "
        f"software device, llama-server as in the peer section. Wall-clock on {p['machine']}. "
        f"The sweep: guidellm's synchronous level (one request at a time), its throughput "
        f"level (at most {SWEEP_CONCURRENCY} in flight), then constant rates evenly between "
        f"the two.", *sections])
