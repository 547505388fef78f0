"""guidellm (vLLM's load generator) against ``ringkv serve``, and against llama.cpp's
``llama-server`` on the same weights when ``make peer`` has built it.

guidellm pulls torch and transformers (about 6 GB): it lives in a virtual environment of its
own, ``build/venv-guidellm`` (``make guidellm``), never in the default install, ``make test`` or
``make demo``'s setup; without it this group has nothing to run. It runs offline: its synthetic
prompts are counted with the Hugging Face tokenizer files shipped with the model (``ringkv
tokenizer``: byte-level, 256 byte tokens and ``<BOS>``, no merges; checked in guidellm's venv:
``AutoTokenizer`` encodes and decodes as the model's byte tokenizer).

The profile: ``concurrent`` at ``STREAMS`` streams (guidellm's ``sweep`` first measures the
synchronous and the maximum rate, then ten rates between, each for its duration: longer than
this shared machine affords), each level for ``SECONDS`` s, synthetic chat requests of
``PROMPT_TOKENS`` prompt tokens and ``OUTPUT_TOKENS`` output tokens (``/v1/chat/completions``;
the template adds its role labels to the prompt). Per level: TTFT p50/p99 and output tokens a
second, as guidellm reports them. ``ringkv serve``: one software device, the demo shape.
llama-server: ``bench_peer``'s settings (``SLOTS`` slots of the token memory, one compute
thread) and our chat template as its Jinja template (so that the chat route reads the same
tokens).
"""

import json
import os
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


def _guidellm(target, model, tokenizer, streams, seconds, requests=None) -> list[dict]:
    """guidellm's ``concurrent`` profile at each of ``streams``: one result per level."""
    spec = {"backend": {"kind": "openai_http", "target": target, "model": model,
                        "request_format": "/v1/chat/completions"},
            "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
            "profile": {"kind": "concurrent"},
            "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS,
                      "output_tokens": OUTPUT_TOKENS}],
            "constraints": [{"kind": "max_requests", "count": requests} if requests else
                            {"kind": "max_duration", "seconds": seconds}]}
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "scenario.json"
        scenario.write_text(json.dumps({"spec": spec, "benchmarks": [
            {"profile.streams": s} for s in streams]}))
        report = Path(tmp) / "report.json"
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        done = subprocess.run([str(GUIDELLM), "run", "-c", str(scenario), "--output",
                               f"kind=json,path={report}", "--disable-console"],
                              env=env, cwd=tmp, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"guidellm exited with {done.returncode}: "
                               f"{(done.stderr or done.stdout)[-2000:]}")
        data = json.loads(report.read_text())
    levels = []
    for b in data["benchmarks"]:
        m = b["metrics"]
        ttft = m["time_to_first_token_ms"]["successful"]["percentiles"]
        levels.append({"streams": b["config"]["strategy"]["streams"],
                       "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"],
                       "output_tokens_per_s": m["output_tokens_per_second"]["successful"]["mean"],
                       "requests": m["request_totals"]["successful"],
                       "errored": m["request_totals"]["errored"],
                       "duration_s": b["duration"]})
    return levels


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
    """The figures; ``smoke``: 1 and 2 streams, 4 requests each, ringkv serve only."""
    import bench.bench_serve as serve
    from bench import bench_peer
    reason = missing()
    if reason:
        raise RuntimeError(f"bench guidellm cannot run: {reason}")
    streams = (1, 2) if smoke else STREAMS
    requests = 4 if smoke else None
    tokenizer = _tokenizer()
    common = {"guidellm": VERSION, "profile": "concurrent", "seconds_per_level": SECONDS,
              "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS,
              "config": serve.SHAPE, "machine": f"{os.cpu_count()} CPUs, shared"}
    servers = [("ringkv_serve", None)]
    if not smoke and bench_peer.missing() is None:
        servers.append(("llama_server", bench_peer))
    out = []
    for key, peer in servers:
        start = os.getloadavg()[0]
        if peer is None:
            with serve._server(1, "prefix", serve.CAPACITY, clients=max(streams)) as base:
                levels = _guidellm(base, "ringkv-kjv", tokenizer, streams, SECONDS, requests)
        else:
            config = peer._config(serve.SHAPE)
            with tempfile.NamedTemporaryFile("w", suffix=".jinja") as template:
                template.write(CHAT_TEMPLATE)
                template.flush()
                with peer.llama_server(peer._gguf(serve.SHAPE), peer.SLOTS, config.max_tokens,
                                       extra=("--jinja", "--chat-template-file",
                                              template.name, "--alias", "ringkv-kjv")) as base:
                    _check_template(base)
                    levels = _guidellm(base, "ringkv-kjv", tokenizer, streams, SECONDS,
                                       requests)
        end = os.getloadavg()[0]
        for level in levels:
            params = dict(common, server=key, loadavg_1min=round(start, 2),
                          loadavg_1min_end=round(end, 2), **level)
            prefix = f"guidellm.{key}.streams{level['streams']}"
            out += [{"name": f"{prefix}.output_tokens_per_s",
                     "value": round(level["output_tokens_per_s"], 1), "unit": "tokens/s",
                     "params": params},
                    {"name": f"{prefix}.ttft_p50_s", "value": round(level["ttft_p50_ms"] / 1e3, 4),
                     "unit": "s", "params": params},
                    {"name": f"{prefix}.ttft_p99_s", "value": round(level["ttft_p99_ms"] / 1e3, 4),
                     "unit": "s", "params": params}]
    return out


def markdown(results) -> str:
    by = {r["name"]: r for r in results}
    p = results[0]["params"]
    rows = []
    for r in results:
        if not r["name"].endswith(".output_tokens_per_s"):
            continue
        q, stem = r["params"], r["name"][:-len(".output_tokens_per_s")]
        rows.append([q["server"].replace("_", " ").replace("ringkv serve", "ringkv serve"),
                     q["streams"], r["value"], f"{by[stem + '.ttft_p50_s']['value'] * 1e3:.0f}",
                     f"{by[stem + '.ttft_p99_s']['value'] * 1e3:.0f}", q["requests"],
                     q["errored"], f"{q['loadavg_1min']} / {q['loadavg_1min_end']}"])
    return "\n".join([
        f"guidellm {p['guidellm']}, profile `{p['profile']}` ({p['seconds_per_level']} s a "
        f"level), synthetic chat requests of {p['prompt_tokens']} prompt and "
        f"{p['output_tokens']} output tokens, the `{p['config']}` shape; ringkv serve with one "
        f"software device, llama-server as in the peer section. Wall-clock on {p['machine']}.",
        "", table(["server", "streams", "output tokens/s", "TTFT p50 ms", "TTFT p99 ms",
                   "requests", "errored", "load avg start / end"], rows)])
