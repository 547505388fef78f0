"""Tools nobody here wrote, run against ``ringkv serve``: lm-evaluation-harness'
``local-completions`` model on a multiple-choice task (loglikelihood requests: ``echo``,
``logprobs``, ``max_tokens`` 1) and a generation task (``generate_until``), both from the data
files in tests/data/lm_eval (no hub), with the shipped tokenizer (``tokenizer=`` the directory
``ringkv tokenizer`` prints) and with lm-eval's default, which finds ``/tokenizer_info`` and
``/tokenize`` and uses the server's; and ``transformers``' ``AutoTokenizer`` on the shipped
files, against ringkv's own tokenization. Offline: ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``
set, so any download would fail the run.

lm-eval pulls torch, so it lives in a venv of its own, ``build/venv-eval`` (``make eval``
makes it and runs this module; ``RINGKV_EVAL_VENV`` names another); without it these tests
skip. Slow tier (minutes), so not in ``make test``.
"""

import glob
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ringkv.host.model.transformer import FixedBackend
from ringkv.host.model.vocab import TOKENIZER_DIR, decode, encode
from ringkv.serve.main import build_parser, build_server, serve_in_thread
from ringkv.serve.template import chat_prompt

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("RINGKV_EVAL_VENV", ROOT / "build" / "venv-eval"))
LM_EVAL = VENV / "bin" / "lm_eval"
TASKS = ROOT / "tests" / "data" / "lm_eval"

#: slow: three lm-eval runs take minutes (most of it lm-eval's start), too long for make test
#: on a machine that has the venv; make eval and make test-slow run them
pytestmark = [pytest.mark.skipif(not LM_EVAL.exists(),
                                 reason=f"no lm-eval venv at {VENV}: lm-eval pulls torch, "
                                        f"kept out of make test's install; make eval makes "
                                        f"the venv and runs these tests"),
              pytest.mark.slow]

#: test -> lm-eval's results (the default-tokenizer test compares with the files' run)
_RUNS: dict = {}

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "OPENAI_API_KEY": "none"}


@pytest.fixture(scope="module")
def server():
    args = build_parser().parse_args(["--config", "demo", "--device", "software"])
    engine, app, name = build_server(args)
    srv, thread, base = serve_in_thread(app)
    assert engine.wait_ready(60)
    try:
        yield base, engine, name
    finally:
        srv.should_exit = True
        thread.join(30)


def _lm_eval(base, name, out: Path, extra: str = "", batch_size: int = 1):
    model_args = (f"model={name},base_url={base}/v1/completions,max_length=1024,"
                  f"num_concurrent=1{extra}")
    cmd = [str(LM_EVAL), "--model", "local-completions", "--model_args", model_args,
           "--tasks", "ringkv_kjv_choice,ringkv_kjv_generate", "--include_path", str(TASKS),
           "--output_path", str(out), "--log_samples", "--batch_size", str(batch_size)]
    env = dict(os.environ, **OFFLINE, HF_HOME=str(out / "hf-home"))
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    results = json.loads(Path(glob.glob(str(out / "*" / "results_*.json"))[0]).read_text())
    samples = {}
    for task in ("ringkv_kjv_choice", "ringkv_kjv_generate"):
        path = glob.glob(str(out / "*" / f"samples_{task}_*.jsonl"))[0]
        samples[task] = [json.loads(line) for line in Path(path).read_text().splitlines()]
    print(r.stdout[-1200:])                   # lm-eval's table (make eval shows it)
    return results["results"], samples, r.stderr


def _loglikelihood(engine, tokens, start):
    """The sum of the logprobs of ``tokens[start:]`` under the server's model (a plain
    forward pass)."""
    from ringkv.host.model.logprobs import prompt_logprobs
    backend = FixedBackend(engine.config)
    rows = np.concatenate([engine.model.forward(tokens[c:c + 64], c, backend)
                           for c in range(0, len(tokens), 64)])
    return sum(e.logprob for e in prompt_logprobs(rows, tokens)[start:])


def test_transformers_loads_the_shipped_tokenizer_offline_and_agrees():
    rng = np.random.default_rng(0)
    texts = ["In the beginning God created", "héllo – wörld ✓ 日本語 🙂", " two  spaces\n\n\t",
             "a<BOS>b", "x"]
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Who art thou?"}]
    cases = {"dir": str(TOKENIZER_DIR),
             "encode": [[t, encode(t), encode(t, add_special_tokens=True)] for t in texts],
             "decode": [[ids, decode(ids)] for ids in
                        (rng.integers(0, 257, rng.integers(1, 40)).tolist()
                         for _ in range(200))],
             "chat": [msgs, list(chat_prompt(msgs).tokens)]}
    r = subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).with_name(
        "check_tokenizer.py"))], input=json.dumps(cases), capture_output=True, text=True,
        env=dict(os.environ, **OFFLINE), timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_lm_eval_local_completions_with_the_shipped_tokenizer(server, tmp_path):
    base, engine, name = server
    results, samples, _ = _lm_eval(base, name, tmp_path,
                                   f",tokenizer_backend=huggingface,tokenizer={TOKENIZER_DIR}")
    _RUNS["files"] = results
    choice, gen = results["ringkv_kjv_choice"], results["ringkv_kjv_generate"]
    assert len(samples["ringkv_kjv_choice"]) == 10 and len(samples["ringkv_kjv_generate"]) == 8
    # the trained model picks the verse's true ending more often than chance (0.25)
    assert choice["acc,none"] >= 0.5, choice
    assert 0 <= gen["exact_match,strip"] <= 1
    # what lm-eval summed from the server's echoed logprobs is the model's loglikelihood of
    # each ending, to the bit (context without BOS, as lm-eval sends it by default; the
    # target delimiter, a space, begins the continuation)
    doc = samples["ringkv_kjv_choice"][0]
    context = encode(doc["doc"]["context"])
    for k, ending in enumerate(doc["doc"]["choices"]):
        got = float(doc["resps"][k][0][0])
        assert got == _loglikelihood(engine, context + encode(" " + ending), len(context))
    # generate_until: the text the server gives for the same request
    first = samples["ringkv_kjv_generate"][0]
    assert isinstance(first["resps"][0][0], str) and first["resps"][0][0]


def test_lm_eval_finds_the_servers_tokenizer_by_itself(server, tmp_path):
    """lm-eval's default (``tokenizer_backend`` auto): it probes ``/tokenizer_info`` and
    ``/tokenize``, then tokenizes through the server; the same numbers as with the files.
    Here with ``batch_size`` 4: each request a list of 4 prompts."""
    base, engine, name = server
    results, _, log = _lm_eval(base, name, tmp_path, batch_size=4)
    assert "remote tokenizer" in log
    first = _RUNS.get("files") or _lm_eval(
        base, name, tmp_path / "files",
        f",tokenizer_backend=huggingface,tokenizer={TOKENIZER_DIR}")[0]
    assert results["ringkv_kjv_choice"]["acc,none"] == first["ringkv_kjv_choice"]["acc,none"]
    assert results["ringkv_kjv_generate"]["exact_match,strip"] == \
        first["ringkv_kjv_generate"]["exact_match,strip"]
