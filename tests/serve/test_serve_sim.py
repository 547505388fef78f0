"""``ringkv serve`` on a simulated board (``RingKVTop`` on Verilator, the same build as
``tests/system/test_system.py``'s) beside a software device: the ``openai`` client streamed and not,
greedy answers equal to the run with the golden core and no reuse; the simulator killed (a
power cut) while it serves: the server goes on with the software device, the board is started
again on its card, recovers its directory, and rejoins with its index read from that
directory; killed in the middle of a stream: that stream ends with an error event."""

import os
import signal
import time

import httpx
import openai
from conftest import requires_verilator

from ringkv.defs.config import TRAINED_DEMO_CONFIG
from ringkv.host.model.transformer import FixedBackend, Model
from ringkv.host.scheduler import plain_run
from ringkv.serve.app import create_app
from ringkv.serve.devices import SimHandle, SoftwareHandle
from ringkv.serve.engine import Engine
from ringkv.serve.main import serve_in_thread
from ringkv.serve.metrics import Metrics
from ringkv.serve.template import chat_prompt

#: plain HTTP with a timeout for a loaded machine (httpx's default is 5 s)
http = httpx.Client(timeout=120)


def _serve(engine, name):
    return serve_in_thread(create_app(engine, model_name=name))


def _power_cut(worker):
    """Kill the simulator (and its Verilator binary) that the device's process started."""
    os.killpg(worker.info["sim_pid"], signal.SIGKILL)


@requires_verilator
def test_serve_on_a_simulated_board_and_survive_its_power_cut(tmp_path):
    from ringkv.sim.harness import build_top
    from ringkv.sim.system_demo import LANES, MACS, REGIONS
    top = {"regions": REGIONS, "lanes": LANES, "macs": MACS}
    build_top(TRAINED_DEMO_CONFIG, **top)
    config = TRAINED_DEMO_CONFIG      # the demo's device: the Verilator build make demo uses
    model = Model.trained(config)
    board = SimHandle("sim", config, image=tmp_path / "board.img", timeout=10,
                      top_kwargs=top)
    board._built = True
    soft = SoftwareHandle("software", config, attention_factory=FixedBackend)
    metrics = Metrics()
    engine = Engine(model, config, [board, soft], metrics, chunk=16)
    server, thread, base = _serve(engine, "ringkv-kjv")
    try:
        assert engine.wait_ready(300)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                               timeout=300)
        msgs = [{"role": "user", "content": "And the LORD said unto Moses,"}]
        r = client.chat.completions.create(model="ringkv-kjv", messages=msgs, max_tokens=10,
                                           temperature=0)
        ref = plain_run(model, [(0, list(chat_prompt(msgs).tokens), 10)],
                        lambda: FixedBackend(config))[0]
        want = bytes(t for t in ref if t < 256).split(b"\n\n")[0].decode("utf-8", "replace")
        assert r.choices[0].message.content == want
        # the first request goes to the board (least loaded, first named)
        assert engine.workers[0].index and metrics.device_exports.labels("sim")._value.get()
        chunks = list(client.chat.completions.create(
            model="ringkv-kjv", messages=msgs, max_tokens=10, temperature=0, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
        # the next turn resends the conversation: the board resumes it from its own store
        turn = msgs + [{"role": "assistant", "content": want},
                       {"role": "user", "content": "And Moses answered"}]
        raw = client.chat.completions.with_raw_response.create(
            model="ringkv-kjv", messages=turn, max_tokens=4, temperature=0)
        r = raw.parse()
        assert raw.headers["x-ringkv-device"] == "sim"
        assert 0 < r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens
        assert metrics.device_hits.labels("sim")._value.get() \
            + metrics.device_prefix_hits.labels("sim")._value.get() >= 1

        # power cut: the simulator dies; requests go on (retried on the software device)
        _power_cut(engine.workers[0])
        for _ in range(2):
            r = http.post(base + "/v1/chat/completions", timeout=300, json={
                "messages": msgs, "max_tokens": 10, "temperature": 0})
            assert r.status_code == 200
            assert r.json()["choices"][0]["message"]["content"] == want
        deadline = time.monotonic() + 300
        w = engine.workers[0]
        while (w.state != "ready" or not w.recoveries) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert w.state == "ready" and w.recoveries == 1
        # the index is the recovered board's own directory
        assert w.index == set(w.listing()) and w.index
        assert http.get(base + "/health").json()["devices"][0]["recoveries"] == 1
        # the failed request counted once, on the device that served it: nothing left counted
        assert [x.load for x in engine.workers] == [0, 0]

        # a power cut in the middle of a stream: the tokens sent stand, the stream ends with
        # an error event, the server keeps serving
        with http.stream("POST", base + "/v1/completions", timeout=300, json={
                "prompt": "Now these are the generations", "max_tokens": 300,
                "temperature": 0, "stream": True}) as r:
            assert r.headers["x-ringkv-device"] == "sim"     # the device with fewer records
            lines = r.iter_lines()
            first = next(x for x in lines if x.startswith("data: "))
            _power_cut(engine.workers[0])
            rest = [x for x in lines if x]
        assert '"text_completion"' in first and rest[-1] == "data: [DONE]"
        assert '"error"' in rest[-2] and "sim failed" in rest[-2]
        r = http.post(base + "/v1/chat/completions", timeout=300, json={
            "messages": msgs, "max_tokens": 10, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want
    finally:
        server.should_exit = True
        thread.join(60)
