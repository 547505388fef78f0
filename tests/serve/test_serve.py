"""``ringkv serve`` started for real (uvicorn on a free port, in a thread) and spoken to by
clients nobody here wrote: the official ``openai`` package and plain HTTP (httpx), streaming
and not, on software devices with the trained demo-shape model (real text)."""

import json
import socket
import time

import httpx
import openai
import pytest
from serve_helpers import SYSTEM, http, running

from ringkv.host.errors import UsageError
from ringkv.host.model.transformer import FixedBackend
from ringkv.host.scheduler import plain_run
from ringkv.serve.main import api_keys, build_parser, build_server
from ringkv.serve.template import chat_prompt


@pytest.fixture(scope="module")
def srv():
    with running("--device", "software") as r:
        yield r


def _reference(engine, tokens, n):
    """The tokens a run with no reuse at all gives (greedy)."""
    return plain_run(engine.model, [(0, list(tokens), n)],
                     lambda: FixedBackend(engine.config))[0]


def _text(tokens, stop=b"\n\n"):
    data = bytes(t for t in tokens if t < 256)
    return data.split(stop)[0].decode("utf-8", errors="replace")


def test_models_health_and_the_openai_client(srv):
    assert [m.id for m in srv.client.models.list().data] == [srv.name]
    h = http.get(srv.base + "/health").json()
    assert h["status"] == "ok" and h["devices"][0]["state"] == "ready"
    assert h["devices"][0]["sealed"] is False
    r = srv.client.completions.create(model=srv.name, prompt="And God said, Let there be",
                                      max_tokens=12, temperature=0)
    choice = r.choices[0]
    assert r.object == "text_completion" and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens == 1 + len("And God said, Let there be")
    ref = _reference(srv.engine, [256, *b"And God said, Let there be"], 12)
    assert choice.text == _text(ref) and sum(c.isalpha() for c in choice.text) >= 4


def test_chat_turns_resume_from_the_store_and_equal_a_run_without_reuse(srv):
    """Turn 2 resends turn 1 (the API's way): its prompt is served from the device's store
    (cached tokens), and greedy output is token for token the run without any reuse."""
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Who made the heaven and the earth?"}]
    cached, texts = [], []
    for turn in range(3):
        r = srv.client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=24,
                                               temperature=0)
        text = r.choices[0].message.content
        prompt = chat_prompt(msgs).tokens
        ref = _reference(srv.engine, prompt, 24)
        assert text == _text(ref)
        assert r.choices[0].finish_reason == ("stop" if b"\n\n" in bytes(
            t for t in ref if t < 256) else "length")
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        assert r.usage.prompt_tokens == len(prompt)
        texts.append(text)
        msgs = msgs + [{"role": "assistant", "content": text},
                       {"role": "user", "content": ["And what did he say?", "Tell me more."][
                           turn % 2]}]
    assert cached[1] > len(chat_prompt(msgs[:2]).tokens) - 30 and cached[2] > cached[1]


def test_a_seeded_request_is_the_same_whatever_was_reused(srv):
    msgs = [{"role": "system", "content": "Speak of Abraham."},
            {"role": "user", "content": "Where did Abraham go?"}]
    kw = dict(model=srv.name, messages=msgs, max_tokens=30, temperature=1.0, top_p=0.95,
              seed=1234, stop=["\n"], extra_body={"top_k": 60})
    a = srv.client.chat.completions.create(**kw)
    b = srv.client.chat.completions.create(**kw)
    c = srv.client.chat.completions.create(**dict(kw, seed=99))
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens > 0
    assert a.choices[0].message.content == b.choices[0].message.content
    assert c.choices[0].message.content != a.choices[0].message.content


def test_streaming_with_the_openai_client_and_plain_http(srv):
    msgs = [{"role": "user", "content": "Sing unto the LORD"}]
    whole = srv.client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=20,
                                               temperature=0)
    chunks = list(srv.client.chat.completions.create(
        model=srv.name, messages=msgs, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == whole.choices[0].finish_reason and set(finals[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    # the same as plain server-sent events, byte by byte where it matters
    with http.stream("POST", srv.base + "/v1/completions", json={
            "prompt": "In the beginning", "max_tokens": 8, "temperature": 0,
            "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [x for x in r.iter_lines() if x]
    assert lines[-1] == "data: [DONE]" and all(x.startswith("data: ") for x in lines)
    events = [json.loads(x[6:]) for x in lines[:-1]]
    assert {e["object"] for e in events} == {"text_completion"}
    assert "usage" not in events[0] and events[-1]["choices"][0]["finish_reason"] == "length"
    plain = srv.client.completions.create(model=srv.name, prompt="In the beginning",
                                          max_tokens=8, temperature=0)
    assert "".join(e["choices"][0]["text"] for e in events) == plain.choices[0].text


@pytest.mark.parametrize("body, status, param", [
    ({"prompt": "x", "temperature": 3}, 400, "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "stop": ["s"] * 65}, 400, "stop"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "model": "gpt-4o"}, 404, "model"),
    ({"prompt": "x" * 1100}, 400, "prompt"),
    ({"prompt": "x" * 1000, "max_tokens": 100}, 400, "max_tokens"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
])
def test_bad_requests_get_an_openai_error_naming_the_field(srv, body, status, param):
    r = http.post(srv.base + "/v1/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    assert err["type"] == "invalid_request_error" and err["message"]
    if status == 404:
        assert err["code"] == "model_not_found"


def test_malformed_json_bad_messages_and_the_client_errors(srv):
    r = http.post(srv.base + "/v1/chat/completions", content=b'{"messages": [')
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = http.post(srv.base + "/v1/chat/completions",
                   json={"messages": [{"role": "wizard", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"
    with pytest.raises(openai.NotFoundError):
        srv.client.chat.completions.create(model="nope", messages=[{"role": "user",
                                                                    "content": "x"}])
    with pytest.raises(openai.BadRequestError) as e:
        srv.client.chat.completions.create(model=srv.name, temperature=-1,
                                           messages=[{"role": "user", "content": "x"}])
    assert e.value.body["param"] == "temperature"
    assert http.get(srv.base + "/v1/nothing").status_code == 404


def test_a_requests_moments_are_in_order_across_the_processes(srv, caplog):
    """The debug log's breakdown of a request's time: each step on the one monotonic clock of
    the host, the device's process's moments between the server's."""
    import logging
    import re
    caplog.set_level(logging.DEBUG, logger="ringkv.serve.app")
    srv.client.completions.create(model=srv.name, prompt="And Moses said", max_tokens=4)
    lines = [r.getMessage() for r in caplog.records if "received->routed" in r.getMessage()]
    assert len(lines) == 1
    steps = re.findall(r"(\w+)->(\w+) (-?[\d.]+) ms", lines[0])
    assert [a for a, _, _ in steps] == ["received", "routed", "picked", "got", "started",
                                        "ended", "answered"]
    assert all(float(v) >= 0 for _, _, v in steps), lines[0]


def test_metrics_count_requests_tokens_and_reuse(srv):
    before = srv.metric("ringkv_generation_tokens_total")
    reused = srv.metric("ringkv_tokens_reused_total")
    for _ in range(2):          # the second imports the first's snapshot
        srv.client.completions.create(model=srv.name, prompt="Blessed are the meek",
                                      max_tokens=5, temperature=0)
    text = http.get(srv.base + "/metrics").text
    assert srv.metric("ringkv_generation_tokens_total") == before + 10
    for name in ("ringkv_requests_total{", "ringkv_time_to_first_token_seconds_bucket",
                 "ringkv_inter_token_latency_seconds_bucket", "ringkv_tokens_reused_total",
                 "ringkv_tokens_prefilled_total", "ringkv_tokens_recomputed_total",
                 'ringkv_device_hits_total{device="software"}',
                 'ringkv_device_misses_total{device="software"}',
                 'ringkv_device_prefix_hits_total{device="software"}',
                 'ringkv_device_exports_total{device="software"}',
                 'ringkv_device_recoveries_total{device="software"}',
                 'ringkv_device_queue_depth{device="software"}'):
        assert name in text, name
    assert srv.metric('ringkv_requests_total{endpoint="completions",status="200"}') >= 1
    assert srv.metric("ringkv_tokens_reused_total") > reused


def test_a_pinned_session_continues_and_forks_at_an_edit(srv):
    msgs = [{"role": "user", "content": "Moses went up"}]
    extra = {"session_id": "pinned-1"}
    r1 = srv.client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=10,
                                            temperature=0, extra_body=extra)
    msgs2 = msgs + [{"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": "And then?"}]
    r2 = srv.client.chat.completions.create(model=srv.name, messages=msgs2, max_tokens=10,
                                            temperature=0, extra_body=extra)
    p2 = chat_prompt(msgs2).tokens
    assert r2.usage.prompt_tokens_details.cached_tokens >= len(p2) - 30
    edited = msgs2[:-1] + [{"role": "user", "content": "And where?"}]
    r3 = srv.client.chat.completions.create(model=srv.name, messages=edited, max_tokens=10,
                                            temperature=0, extra_body=extra)
    p3 = chat_prompt(edited).tokens
    fork = chat_prompt(msgs2[:-1]).checkpoints[-1]        # the edited message starts here
    assert r3.usage.prompt_tokens_details.cached_tokens == fork
    assert r3.choices[0].message.content == _text(_reference(srv.engine, p3, 10))
    r = http.post(srv.base + "/v1/chat/completions", json={"messages": msgs,
                                                            "session_id": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"


def test_overload_is_429_and_a_client_that_leaves_frees_the_device():
    with running("--device", "software", "--max-batch", "1", "--max-queue", "0") as srv:
        with http.stream("POST", srv.base + "/v1/completions", json={
                "prompt": "And", "max_tokens": 1000, "temperature": 0.7,
                "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")          # it is generating
            busy = http.post(srv.base + "/v1/completions", json={"prompt": "x"})
            assert busy.status_code == 429
            assert busy.json()["error"]["code"] == "rate_limit_exceeded"
            with pytest.raises(openai.RateLimitError):
                srv.client.completions.create(model=srv.name, prompt="x")
        # the stream was closed after a few tokens: its request ends, the device is free
        deadline = time.monotonic() + 30
        while srv.engine.workers[0].load and time.monotonic() < deadline:
            time.sleep(0.01)
        r = srv.client.completions.create(model=srv.name, prompt="x", max_tokens=3)
        assert r.usage.completion_tokens == 3
        assert srv.metric("ringkv_generation_tokens_total") == 3


def test_two_devices_route_by_stored_prefix(tmp_path):
    with running("--device", "software", "--device", "software") as srv:
        def ask(msgs):
            r = http.post(srv.base + "/v1/chat/completions", json={
                "messages": msgs, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200
            return r.headers["x-ringkv-device"], r.json()

        convs = [[{"role": "system", "content": f"Speak of {who}."},
                  {"role": "user", "content": f"Tell me of {who}."}]
                 for who in ("Abraham", "Isaac", "Jacob", "Joseph")]
        first = [ask(m) for m in convs]
        assert {d for d, _ in first} == {"software-0", "software-1"}   # spread by load
        for (dev, body), msgs in zip(first, convs):
            msgs2 = msgs + [{"role": "assistant",
                             "content": body["choices"][0]["message"]["content"]},
                            {"role": "user", "content": "And then?"}]
            dev2, body2 = ask(msgs2)
            assert dev2 == dev                      # where its state is
            assert body2["usage"]["prompt_tokens_details"]["cached_tokens"] > 40
        # the index is the device's own listing
        for w in srv.engine.workers:
            assert w.index == set(w.listing()) and w.index


def _wait_recovered(w, recoveries, timeout=120):
    deadline = time.monotonic() + timeout
    while (w.state != "ready" or w.recoveries < recoveries) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert w.state == "ready" and w.recoveries == recoveries


def test_a_device_process_that_dies_is_started_again_and_its_requests_go_elsewhere(tmp_path):
    """Each device runs in a process of its own: killed while idle, the next request routed to
    it (it holds the prefix) is retried on the other device; killed in the middle of a stream,
    that stream ends with an error event. Each time the process is started again on its card
    image and the device rejoins with its index read from the image's records."""
    import os
    import signal
    image = tmp_path / "card.img"
    with running("--device", f"software:{image}", "--device", "software") as srv:
        w, other = srv.engine.workers
        msgs = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Who went up to the mountain of God?"}]
        body = {"messages": msgs, "max_tokens": 8, "temperature": 0}
        r = http.post(srv.base + "/v1/chat/completions", json=body)
        assert r.headers["x-ringkv-device"] == w.name and w.index
        want = r.json()["choices"][0]["message"]["content"]
        held, pid = set(w.index), w.info["pid"]
        assert pid != os.getpid() and other.info["pid"] not in (pid, os.getpid())

        os.kill(pid, signal.SIGKILL)
        r = http.post(srv.base + "/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["x-ringkv-device"] == other.name
        assert r.json()["choices"][0]["message"]["content"] == want
        _wait_recovered(w, 1)
        assert w.info["pid"] != pid and held <= w.index == set(w.listing())

        with http.stream("POST", srv.base + "/v1/completions", json={
                "prompt": "Now these are the generations", "max_tokens": 400,
                "temperature": 0.7, "seed": 7, "stream": True}) as r:
            device = r.headers["x-ringkv-device"]
            victim = next(x for x in srv.engine.workers if x.name == device)
            lines = r.iter_lines()
            first = next(x for x in lines if x.startswith("data: "))
            os.kill(victim.info["pid"], signal.SIGKILL)
            rest = [x for x in lines if x]
        assert '"text_completion"' in first and rest[-1] == "data: [DONE]"
        assert '"error"' in rest[-2] and f"{device} failed" in rest[-2]
        _wait_recovered(victim, 1 + (victim is w))
        assert victim.index == set(victim.listing())
        r = http.post(srv.base + "/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want
        assert [x.load for x in srv.engine.workers] == [0, 0]
        assert srv.metric("ringkv_device_recoveries_total") == 2


def test_index_rebuilt_from_the_image_after_a_restart(tmp_path):
    image = tmp_path / "card.img"
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Who?"}]
    with running("--device", f"software:{image}") as srv:
        r = srv.client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=6,
                                               temperature=0)
        held = set(srv.engine.workers[0].index)
    assert held
    msgs2 = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                    {"role": "user", "content": "Why?"}]
    with running("--device", f"software:{image}") as srv:
        assert srv.engine.workers[0].index == held
        r2 = srv.client.chat.completions.create(model=srv.name, messages=msgs2,
                                                max_tokens=6, temperature=0)
        assert r2.usage.prompt_tokens_details.cached_tokens > len(chat_prompt(msgs).tokens)


@pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
def test_a_conversation_moves_with_its_record_when_its_device_is_full(tmp_path, sealed):
    """The device holding a conversation is busy to its bound: the next turn goes to the
    other device, which first copies the conversation's record from it (and imports it);
    sealed devices copy the tenant's sealed record the same way."""
    extra = ["--sealed", "--key-file", _private(tmp_path / "k", "5 " + "5a" * 32 + "\n")] \
        if sealed else []
    with running("--device", "software", "--device", "software", "--max-batch", "1",
                     "--max-queue", "0",
                 *extra) as srv:
        msgs = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Who went up to the mountain of God?"}]
        r1 = http.post(srv.base + "/v1/chat/completions", json={
            "messages": msgs, "max_tokens": 12, "temperature": 0}, timeout=300)
        holder = r1.headers["x-ringkv-device"]
        prompt = list(chat_prompt(msgs).tokens)
        # the same tokens as a completion without a stop: a long request on the holder
        with http.stream("POST", srv.base + "/v1/completions", json={
                "prompt": prompt, "max_tokens": 600, "temperature": 0.7,
                "stream": True}, timeout=300) as busy:
            assert busy.headers["x-ringkv-device"] == holder
            lines = busy.iter_lines()             # (kept: closing it would end the request)
            next(lines)
            msgs2 = msgs + [{"role": "assistant",
                             "content": r1.json()["choices"][0]["message"]["content"]},
                            {"role": "user", "content": "And what did he see?"}]
            # the copy is taken between two of the holder's requests: after the long one
            r2 = http.post(srv.base + "/v1/chat/completions", json={
                "messages": msgs2, "max_tokens": 12, "temperature": 0}, timeout=300)
        assert r2.status_code == 200 and r2.headers["x-ringkv-device"] != holder
        assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > len(prompt)
        assert r2.json()["choices"][0]["message"]["content"] == _text(
            _reference(srv.engine, chat_prompt(msgs2).tokens, 12))
        moves = [x for x in http.get(srv.base + "/metrics").text.splitlines()
                 if x.startswith("ringkv_device_moves_total")]
        assert moves == [f'ringkv_device_moves_total{{device="{r2.headers["x-ringkv-device"]}"'
                         f',source="{holder}"}} 1.0'], moves


def test_ringkv_serve_command_on_the_default_card_image(tmp_path):
    """``ringkv serve`` as a user starts it: no ``--device`` is the software device on a card
    image in the user's data directory; SIGTERM stops it cleanly (exit 130, the interruption's
status); a bad ``--device``
    is one line and exit status 2."""
    import os
    import signal
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"))
    cmd = [sys.executable, "-m", "ringkv.cli", "serve", "--config", "demo", "--port",
           str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if http.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        r = http.post(base + "/v1/completions", timeout=60, json={
            "model": "ringkv-kjv", "prompt": "And Abraham", "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert (tmp_path / "data" / "ringkv" / "card.img").stat().st_size > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 130
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    bad = subprocess.run([*cmd[:-4], "--device", "ftp://x"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "ringkv serve: --device 'ftp://x'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_api_keys_guard_v1_and_leave_health_and_metrics_open(tmp_path):
    """With keys (``--api-key`` and ``--api-key-file`` together), ``/v1`` answers 401
    ``invalid_api_key`` to no key, another scheme or another key (the ``openai`` client
    raises ``AuthenticationError``), naming no key; either key serves, streamed too;
    ``/health`` and ``/metrics`` need none; refusals are counted by endpoint."""
    keyfile = tmp_path / "keys"
    keyfile.write_text("# the team's keys\n\n  sk-second  \n")
    keyfile.chmod(0o600)
    with running("--device", "software", "--api-key", "sk-first",
                 "--api-key-file", str(keyfile)) as r:
        with pytest.raises(openai.AuthenticationError) as e:
            r.client.completions.create(model=r.name, prompt="In the beginning", max_tokens=2)
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
        body = {"model": r.name, "prompt": "In the beginning", "max_tokens": 2}
        for headers, message in [({}, "no API key"),
                                 ({"Authorization": "Basic c2stZmlyc3Q="}, "no API key"),
                                 ({"Authorization": "Bearer sk-firs"}, "incorrect API key"),
                                 ({"Authorization": "Bearer sk-first2"}, "incorrect API key")]:
            resp = http.post(r.base + "/v1/completions", json=body, headers=headers)
            assert resp.status_code == 401, headers
            assert resp.headers["www-authenticate"].startswith("Bearer")
            err = resp.json()["error"]
            assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
            assert message in err["message"] and "sk-" not in resp.text
        assert http.get(r.base + "/v1/models").status_code == 401
        assert http.get(r.base + "/v1/no/such/route").status_code == 401
        for key in ("sk-first", "sk-second"):
            client = openai.OpenAI(base_url=r.base + "/v1", api_key=key, max_retries=0,
                                   timeout=120)
            out = client.completions.create(model=r.name, prompt="And God said",
                                            max_tokens=3, temperature=0)
            assert out.usage.completion_tokens == 3
        chunks = list(client.chat.completions.create(
            model=r.name, messages=[{"role": "user", "content": "Who made the light?"}],
            max_tokens=4, temperature=0, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].choices[0].finish_reason is not None
        assert http.get(r.base + "/health").status_code == 200
        assert r.metric('ringkv_requests_total{endpoint="completions",status="401"}') == 5
        assert r.metric('ringkv_requests_total{endpoint="models",status="401"}') == 1
        assert r.metric('ringkv_requests_total{endpoint="other",status="401"}') == 1
        assert r.metric('ringkv_requests_total{endpoint="completions",status="200"}') == 2


def test_api_key_options_fail_cleanly_and_never_show_a_key(tmp_path):
    """Keys from the options, else from ``RINGKV_API_KEY`` (comma-separated); an unreadable
    or empty key file and a key that cannot travel in a header are one ``UsageError`` naming
    the option, the file and the line, never the key."""
    parser = build_parser()

    def keys(*argv, env=None):
        return api_keys(parser.parse_args(list(argv)), env or {})

    assert keys() == {}
    assert keys(env={"RINGKV_API_KEY": "k1, k2"}) == {"k1": None, "k2": None}
    assert keys("--api-key", "k3", "--api-key", "k3", env={"RINGKV_API_KEY": "k1"}) == \
        {"k3": None}
    with pytest.raises(UsageError, match=r"^--api-key-file \S*nowhere: not found$"):
        keys("--api-key-file", str(tmp_path / "nowhere"))
    for name, text in (("empty", "# none yet\n\n"), ("spaced", "fine-key\nsk secret\n"),
                       ("open", "k1\n")):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o644 if name == "open" else 0o600)
    with pytest.raises(UsageError, match=r"open: permissions 0644 are too open") as e:
        keys("--api-key-file", str(tmp_path / "open"))
    assert e.value.hint == f"chmod 600 {tmp_path / 'open'}"
    with pytest.raises(UsageError, match=r"empty: holds no key \(one a line\)$"):
        keys("--api-key-file", str(tmp_path / "empty"))
    with pytest.raises(UsageError, match=r"spaced line 2: the key id after the key must be a "
                                         r"number 1\.\.65535$") as e:
        keys("--api-key-file", str(tmp_path / "spaced"))
    assert "secret" not in str(e.value) and e.value.param == "--api-key-file"
    with pytest.raises(UsageError, match=r"^--api-key: an API key must be printable"):
        keys("--api-key", "")
    with pytest.raises(UsageError, match=r"^--api-key: an API key must be printable ASCII "
                                         r"without spaces") as e:
        keys("--api-key", "sk secret")
    assert "secret" not in str(e.value)
    with pytest.raises(UsageError, match=r"^RINGKV_API_KEY: an API key must be printable"):
        keys(env={"RINGKV_API_KEY": "k1,,k2"})


def _private(path, text):
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


RECORD_KEYS = "1 " + "11" * 32 + "\n2 " + "22" * 32 + "\n"


def test_a_sealed_server_keeps_each_tenants_records_its_own(tmp_path):
    """``--sealed`` with two record keys and an API key naming each: the same prompt from the
    other tenant reuses nothing (its prefix hash is seeded by its own key, its records sealed
    under it), from the same tenant it reuses the stored prefix; answers are the same; two
    tenants' equal session ids are two conversations."""
    keys = _private(tmp_path / "records.keys", RECORD_KEYS)
    api = _private(tmp_path / "api.keys", "sk-a 1\nsk-b 2\n")
    with running("--device", "software", "--sealed", "--key-file", keys,
                 "--api-key-file", api) as r:
        def client(key):
            return openai.OpenAI(base_url=r.base + "/v1", api_key=key, max_retries=0,
                                 timeout=120)
        a, b = client("sk-a"), client("sk-b")
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "Who made the firmament?"}]

        def ask(c, **kw):
            return c.chat.completions.create(model=r.name, messages=messages, max_tokens=6,
                                             temperature=0, **kw)
        first, other, again = ask(a), ask(b), ask(a)
        cached = [x.usage.prompt_tokens_details.cached_tokens for x in (first, other, again)]
        assert cached[0] == 0 and cached[1] == 0 and cached[2] > 0, cached
        texts = {x.choices[0].message.content for x in (first, other, again)}
        assert len(texts) == 1
        # one session id, two tenants, two conversations: B's turn under A's id is served (not
        # refused as another tenant's session), and A's conversation goes on from its own turn
        turn = ask(a, extra_body={"session_id": "s"})
        b.chat.completions.create(model=r.name, max_tokens=4, temperature=0,
                                  extra_body={"session_id": "s"},
                                  messages=[{"role": "user", "content": "And Cain?"}])
        more = messages + [{"role": "assistant", "content": turn.choices[0].message.content},
                           {"role": "user", "content": "And then?"}]
        again = a.chat.completions.create(model=r.name, messages=more, max_tokens=4,
                                          temperature=0, extra_body={"session_id": "s"})
        assert again.usage.prompt_tokens_details.cached_tokens >= turn.usage.prompt_tokens
        assert set(r.engine.hashers) == {1, 2}
        [device] = http.get(r.base + "/health").json()["devices"]
        assert device["sealed"] is True and device["state"] == "ready"


def test_sealed_options_are_checked_before_any_device_starts(tmp_path):
    """``tenancy``: what ``--sealed``, ``--key-file`` and key ids in the API key file need."""
    from ringkv.defs.config import DEMO_CONFIG
    from ringkv.serve.main import tenancy
    parser = build_parser()
    keys1 = _private(tmp_path / "one.keys", "7 " + "ab" * 32 + "\n")
    keys2 = _private(tmp_path / "two.keys", RECORD_KEYS)

    def check(argv, api=None):
        args = parser.parse_args(argv)
        return tenancy(args, api or {}, DEMO_CONFIG, environ={})

    assert check([]) == (None, None, None)
    ring, default, seeds = check(["--sealed", "--key-file", keys1])
    assert ring.ids() == [7] and default == 7 and set(seeds) == {7}
    ring, default, seeds = check(["--sealed", "--key-file", keys2], {"sk-a": 1, "sk-b": 2})
    assert default is None and set(seeds) == {1, 2} and seeds[1] != seeds[2]
    cases = [([], {"sk": 1}, "names key id 1: only a sealed server"),
             (["--key-file", keys1], {}, "--key-file holds record keys for --sealed"),
             (["--sealed"], {}, "--sealed needs the record keys"),
             (["--sealed", "--key-file", keys2], {"sk-a": 1, "sk-b": None},
              "every API key must name the key id"),
             (["--sealed", "--key-file", keys2], {}, "every API key must name the key id"),
             (["--sealed", "--key-file", keys2], {"sk-a": 3}, "names key id 3, which the")]
    for argv, api, message in cases:
        with pytest.raises(UsageError, match=message):
            check(argv, api)
    api = _private(tmp_path / "bad.keys", "sk-a one\n")
    with pytest.raises(UsageError, match=r"line 1: the key id after the key must be a number"):
        api_keys(parser.parse_args(["--api-key-file", api]), {})


def test_ringkv_serve_refuses_bad_options_and_a_port_in_use(tmp_path):
    """Bad option values are one line and exit status 2; a port in use is found before any
    device starts: one line, exit status 4, the card image not created."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"))
    base = [sys.executable, "-m", "ringkv.cli", "serve", "--config", "demo"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = [(["--port", "99999"], 2, "--port: must be 0..65535"),
                 (["--capacity", "0"], 2, "--capacity: must be at least 1"),
                 (["--timeout", "-1"], 2, "--timeout: must be positive"),
                 (["--hot-bytes", "lots"], 2, "--hot-bytes: not a size in bytes (e.g. 64M)"),
                 (["--max-batch", "0"], 2, "--max-batch: must be at least 1"),
                 (["--step-tokens", "0"], 2, "--step-tokens: must be at least 1"),
                 (["--host", "no.such.host.invalid"], 2, "--host"),
                 (["--api-key-file", str(tmp_path / "no-keys")], 2,
                  "--api-key-file " + str(tmp_path / "no-keys") + ": not found"),
                 (["--port", str(port)], 4, f"cannot listen on 127.0.0.1:{port}")]
        for extra, code, message in cases:
            r = subprocess.run(base + extra, env=env, capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == code, (extra, r.stderr)
            assert message in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
            assert r.stderr.startswith("ringkv serve: "), r.stderr
    assert not (tmp_path / "data").exists()


def test_simulated_boards_may_be_repeated_and_take_the_demo_top(tmp_path):
    """``--device sim`` twice is two boards (each its temporary card), with ``ringkv sim``'s
    top for the shape (the demo's for ``--config demo``); an image named twice is refused.
    Nothing is started."""
    from ringkv.serve.engine import Engine
    from ringkv.sim.harness import DEMO_TOP
    engine, _, _ = build_server(build_parser().parse_args(
        ["--config", "demo", "--device", "sim", "--device", "sim", "--device", "software"]))
    assert isinstance(engine, Engine)
    sims = [w.handle for w in engine.workers[:2]]
    assert [h.name for h in sims] == ["sim-0", "sim-1"] and sims[0] is not sims[1]
    assert all(h.kind == "sim" and h.top_kwargs == DEMO_TOP and h.image is None for h in sims)
    assert engine.workers[2].handle.name == "software"
    image = str(tmp_path / "card.img")
    with pytest.raises(UsageError, match=r"--device sim:.*card\.img is named twice"):
        build_server(build_parser().parse_args(
            ["--config", "demo", "--device", f"sim:{image}", "--device", f"sim:{image}"]))
    assert not (tmp_path / "card.img").exists()
