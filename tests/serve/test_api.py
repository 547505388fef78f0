"""The API that standard tools need (issue #34 items 3-4), against a real ``ringkv serve`` and
spoken to with the official ``openai`` client (and plain HTTP where it has no method):
``logprobs`` and ``echo`` in the legacy shape (``max_tokens`` 0 included), chat ``logprobs``
and ``top_logprobs``, ``n`` > 1 and lists of prompts (streamed too), ``/tokenize``,
``/detokenize``, ``/tokenizer_info``, ``ignore_eos``, ``min_tokens``, more than 4 stop
sequences, ``continuous_usage_stats``, and a 400 naming every field this server does not
serve. One server for the module (starting servers is the expensive part)."""

import json

import numpy as np
import openai
import pytest
from serve_helpers import http, running

from ringkv.host.model.logprobs import prompt_logprobs
from ringkv.host.model.transformer import FixedBackend
from ringkv.host.model.vocab import encode
from ringkv.serve.template import chat_prompt


@pytest.fixture(scope="module")
def srv():
    with running("--device", "software") as r:
        yield r


def _echo_reference(engine, tokens, top_n):
    """The prompt's logprobs from a plain forward pass of the server's model (chunks of 64,
    as the server's scheduler)."""
    backend = FixedBackend(engine.config)
    rows = np.concatenate([engine.model.forward(tokens[c:c + 64], c, backend)
                           for c in range(0, len(tokens), 64)])
    return prompt_logprobs(rows, tokens, top_n)


def test_completion_logprobs_and_echo_in_the_legacy_shape(srv):
    prompt = "And God said"
    tokens = [256, *prompt.encode()]
    r = srv.client.completions.create(model=srv.name, prompt=prompt, max_tokens=5,
                                      temperature=0, logprobs=3, echo=True)
    c = r.choices[0]
    lp = c.logprobs
    assert c.text.startswith(prompt) and r.usage.completion_tokens == 5
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == \
        len(lp.text_offset) == len(tokens) + 5
    assert lp.tokens[:4] == ["<BOS>", "A", "n", "d"]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[:4] == [0, 0, 1, 2] and lp.text_offset[len(tokens)] == len(prompt)
    for tok, x, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        # the token itself and the 3 most likely (3 or 4 entries, as vLLM's)
        assert top[tok] == x and len(top) in (3, 4) and x <= 0
        assert sorted(top.values(), reverse=True)[0] == max(top.values())
    # greedy: each generated token is the most likely one
    for x, top in zip(lp.token_logprobs[len(tokens):], lp.top_logprobs[len(tokens):]):
        assert x == max(top.values())
    ref = _echo_reference(srv.engine, tokens, 3)
    assert lp.token_logprobs[1:len(tokens)] == [e.logprob for e in ref[1:]]   # exactly
    # max_tokens 0 with echo: the prompt's logprobs alone (what lm-eval's loglikelihood reads)
    r0 = srv.client.completions.create(model=srv.name, prompt=tokens, max_tokens=0,
                                       echo=True, logprobs=0)
    c0 = r0.choices[0]
    assert c0.text == prompt and c0.finish_reason == "length"
    assert r0.usage.completion_tokens == 0 and r0.usage.prompt_tokens == len(tokens)
    assert c0.logprobs.token_logprobs == lp.token_logprobs[:len(tokens)]
    assert all(t is None or len(t) == 1 for t in c0.logprobs.top_logprobs)
    # echo without logprobs; return_tokens_as_token_ids
    e = srv.client.completions.create(model=srv.name, prompt=prompt, max_tokens=2,
                                      temperature=0, echo=True)
    assert e.choices[0].text == c.text[:len(e.choices[0].text)] and \
        e.choices[0].logprobs is None
    ids = srv.client.completions.create(model=srv.name, prompt=prompt, max_tokens=1,
                                        temperature=0, logprobs=1,
                                        extra_body={"return_tokens_as_token_ids": True})
    assert ids.choices[0].logprobs.tokens[0] == f"token_id:{ord(c.text[len(prompt)])}"
    for body, param in (({"max_tokens": 0}, "max_tokens"), ({"logprobs": 21}, "logprobs"),
                        ({"logprobs": True}, "logprobs")):
        r = http.post(srv.base + "/v1/completions", json={"prompt": prompt, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_chat_logprobs_and_top_logprobs(srv):
    msgs = [{"role": "user", "content": "Who made the heaven?"}]
    r = srv.client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=8,
                                           temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    text = b"".join(bytes(e.bytes) for e in content).decode("utf-8", errors="replace")
    assert text.startswith(r.choices[0].message.content)
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == e.logprob >= e.top_logprobs[1].logprob
    plain = srv.client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=8,
                                               temperature=0, logprobs=True)
    assert [e.logprob for e in plain.choices[0].logprobs.content] == \
        [e.logprob for e in content]
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    ids = srv.client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=2,
                                             temperature=0, logprobs=True, top_logprobs=1,
                                             extra_body={"return_tokens_as_token_ids": True})
    first = ids.choices[0].logprobs.content[0]
    assert first.token == f"token_id:{first.bytes[0]}" and first.top_logprobs[0].token == \
        first.token
    with pytest.raises(openai.BadRequestError) as err:
        srv.client.chat.completions.create(model=srv.name, messages=msgs, top_logprobs=2)
    assert err.value.body["param"] == "top_logprobs"


def test_streamed_logprobs_are_the_whole_answers(srv):
    """A stream's chunks carry each token's logprobs (one token a chunk): together they are
    the whole answer's, in both shapes."""
    msgs = [{"role": "user", "content": "Who begat Isaac?"}]
    kw = dict(model=srv.name, messages=msgs, max_tokens=6, temperature=0, logprobs=True,
              top_logprobs=2)
    whole = srv.client.chat.completions.create(**kw).choices[0].logprobs.content
    parts = [e for ch in srv.client.chat.completions.create(stream=True, **kw)
             for c in ch.choices if c.logprobs for e in c.logprobs.content]
    assert [e.model_dump() for e in parts] == [e.model_dump() for e in whole]
    kw = dict(model=srv.name, prompt="And Isaac", max_tokens=6, temperature=0, logprobs=2)
    whole = srv.client.completions.create(**kw).choices[0].logprobs
    chunks = [c.logprobs for ch in srv.client.completions.create(stream=True, **kw)
              for c in ch.choices if c.logprobs]
    assert [t for c in chunks for t in c.tokens] == whole.tokens
    assert [t for c in chunks for t in c.token_logprobs] == whole.token_logprobs
    assert [t for c in chunks for t in c.top_logprobs] == whole.top_logprobs
    assert [t for c in chunks for t in c.text_offset] == whole.text_offset


def test_a_tokens_logprob_is_the_same_from_the_store_as_computed(srv):
    """The same conversation twice: the second is resumed from the device's store (cached
    tokens), and every generated token's logprob is equal, not close (the fixed backend)."""
    msgs = [{"role": "system", "content": "Speak of Moses."},
            {"role": "user", "content": "What did Moses say unto the people?"}]
    kw = dict(model=srv.name, messages=msgs, max_tokens=12, temperature=0, logprobs=True,
              top_logprobs=5)
    a = srv.client.chat.completions.create(**kw)
    b = srv.client.chat.completions.create(**kw)
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    # from the checkpoint at the end of the user message; "Assistant: " computed again
    assert b.usage.prompt_tokens_details.cached_tokens == chat_prompt(msgs).checkpoints[-1]
    assert b.choices[0].logprobs.model_dump() == a.choices[0].logprobs.model_dump()
    # and the prompt's logprobs (echo: computed afresh, nothing reused) equal a plain pass
    tokens = list(chat_prompt(msgs).tokens)
    echo = srv.client.completions.create(model=srv.name, prompt=tokens, max_tokens=0,
                                         echo=True, logprobs=2)
    assert echo.usage.prompt_tokens_details.cached_tokens == 0
    assert echo.choices[0].logprobs.token_logprobs[1:] == \
        [e.logprob for e in _echo_reference(srv.engine, tokens, 2)[1:]]


def test_n_and_lists_of_prompts_with_their_own_seeds(srv):
    prompts = ["And God", "Let there be"]
    kw = dict(model=srv.name, max_tokens=6, temperature=1.0, seed=7)
    r = srv.client.completions.create(prompt=prompts, n=2, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    texts = [c.text for c in r.choices]
    for i, p in enumerate(prompts):
        # sample j of a seeded request draws from seed + j (vLLM's rule)
        for j in range(2):
            one = srv.client.completions.create(prompt=p, **dict(kw, seed=7 + j))
            assert texts[i * 2 + j] == one.choices[0].text
    assert r.usage.prompt_tokens == sum(1 + len(p) for p in prompts)
    assert r.usage.completion_tokens == 4 * 6
    # a stream of the same: each chunk names its choice, the texts are the same
    chunks = list(srv.client.completions.create(prompt=prompts, n=2, stream=True,
                                                stream_options={"include_usage": True}, **kw))
    got = ["", "", "", ""]
    finished = set()
    for ch in chunks:
        for c in ch.choices:
            got[c.index] += c.text
            if c.finish_reason:
                finished.add(c.index)
    assert got == texts and finished == {0, 1, 2, 3}
    assert chunks[-1].usage.completion_tokens == 24
    # chat n: greedy samples are equal; the usage counts the prompt once
    msgs = [{"role": "user", "content": "Sing"}]
    c = srv.client.chat.completions.create(model=srv.name, messages=msgs, n=3,
                                           max_tokens=5, temperature=0)
    assert [x.index for x in c.choices] == [0, 1, 2]
    assert len({x.message.content for x in c.choices}) == 1
    assert c.usage.prompt_tokens == len(chat_prompt(msgs).tokens)


def test_tokenize_detokenize_and_tokenizer_info(srv):
    r = http.post(srv.base + "/tokenize", json={"model": srv.name, "prompt": "héllo"}).json()
    assert r == {"count": 7, "max_model_len": srv.engine.config.max_tokens,
                 "tokens": [256, 104, 195, 169, 108, 108, 111], "token_strs": None}
    r = http.post(srv.base + "/tokenize", json={"prompt": "a b<BOS>", "add_special_tokens":
                                                 False, "return_token_strs": True}).json()
    assert r["tokens"] == [97, 32, 98, 256] and r["token_strs"] == ["a", "Ġ", "b", "<BOS>"]
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    r = http.post(srv.base + "/tokenize", json={"messages": msgs}).json()
    assert r["tokens"] == list(chat_prompt(msgs).tokens)
    r = http.post(srv.base + "/tokenize", json={"messages": msgs,
                                                "add_generation_prompt": False}).json()
    assert bytes(r["tokens"][1:]).endswith(b"User: hi\n\n")
    d = http.post(srv.base + "/detokenize", json={"tokens": [256, 104, 195, 169]}).json()
    assert d == {"prompt": "<BOS>hé"}
    assert encode(d["prompt"]) == [256, 104, 195, 169]
    info = http.get(srv.base + "/tokenizer_info").json()
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert info["bos_token"] == info["eos_token"] == "<BOS>" and "chat_template" in info
    assert info["model_max_length"] == srv.engine.config.max_tokens
    for route, body, param in (("/detokenize", {"tokens": [257]}, "tokens"),
                               ("/tokenize", {"prompt": 5}, "prompt"),
                               ("/tokenize", {"prompt": "x", "foo": 1}, "foo"),
                               ("/tokenize", {"prompt": "x", "model": "gpt"}, "model")):
        r = http.post(srv.base + route, json=body)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param


def test_ignore_eos_min_tokens_and_many_stop_sequences(srv):
    prompt = "And Moses said unto the LORD"
    kw = dict(model=srv.name, prompt=prompt, temperature=0)
    base = srv.client.completions.create(max_tokens=30, **kw).choices[0].text
    # more than 4 stop sequences (vLLM sets no limit; here 64): the first to appear cuts
    stops = [f"never{i}" for i in range(9)] + [base[4:6]]
    r = srv.client.completions.create(max_tokens=30, stop=stops, **kw)
    assert r.choices[0].text == base[:base.find(base[4:6])]
    assert r.choices[0].finish_reason == "stop"
    # min_tokens: the stop sequence that ends the first token does not count before it
    first = srv.client.completions.create(max_tokens=30, stop=[base[0]], **kw)
    assert first.choices[0].text == "" and first.usage.completion_tokens == 1
    m = srv.client.completions.create(max_tokens=30, stop=[base[0]],
                                      extra_body={"min_tokens": 5}, **kw)
    assert m.usage.completion_tokens >= 5 and m.choices[0].text == \
        base[:len(m.choices[0].text)]
    # ignore_eos: a chat reply goes on through the ends of messages, to max_tokens
    msgs = [{"role": "user", "content": "Say it."}]
    g = srv.client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=40,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert g.choices[0].finish_reason == "length" and g.usage.completion_tokens == 40
    r = http.post(srv.base + "/v1/completions", json={"prompt": "x", "min_tokens": 20,
                                                      "max_tokens": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"


def test_continuous_usage_stats_and_a_streamed_echo(srv):
    chunks = list(srv.client.completions.create(
        model=srv.name, prompt="In the beginning", max_tokens=5, temperature=0, echo=True,
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert chunks[0].choices[0].text == "In the beginning"
    with_choices = [c for c in chunks if c.choices]
    counts = [c.usage.completion_tokens for c in with_choices]
    assert all(c.usage.prompt_tokens == 17 for c in with_choices)
    assert counts == sorted(counts) and counts[-1] == 5
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 22


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix"),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, "best_of"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 1}, "frequency_penalty"),
    ("/v1/completions", {"prompt": "x", "use_beam_search": True}, "use_beam_search"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [5]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "x", "no_such_field": 1}, "no_such_field"),
    ("/v1/completions", {"prompt": "x", "n": 2, "session_id": "s"}, "session_id"),
    ("/v1/completions", {"prompt": "x", "stream": True, "echo": True, "logprobs": 1}, "echo"),
    ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": {
        "continuous_usage_stats": True}}, "stream_options.continuous_usage_stats"),
    ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": {"x": 1}},
     "stream_options.x"),
    ("/v1/completions", {"prompt": ["a"] * 65, "n": 2}, "n"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"echo": True}, "echo"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"suffix": "x"}, "suffix"),
    ("/v1/chat/completions", {"user": 5}, "user"),
])
def test_what_is_not_served_is_refused_naming_the_field(srv, path, body, param):
    if path.endswith("chat/completions"):
        body = {"messages": [{"role": "user", "content": "x"}], **body}
    r = http.post(srv.base + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_more_choices_than_the_devices_hold_is_a_400(srv, monkeypatch):
    """A request whose choices could never all be on the devices at once (each device's batch
    plus --max-queue: a board's batch is 1; here the software device's made so) is a 400, not a
    429 it could never get past; the most that fit is served."""
    w = srv.engine.workers[0]
    monkeypatch.setattr(w, "batch", 1)
    monkeypatch.setattr(srv.engine, "max_queue", 2)
    for body, param in (({"prompt": "x", "n": 4}, "n"), ({"prompt": ["x", "y", "z", "w"]},
                                                          "prompt")):
        r = http.post(srv.base + "/v1/completions", json={"max_tokens": 1, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param
    r = http.post(srv.base + "/v1/completions", json={"prompt": "x", "max_tokens": 1, "n": 3})
    assert r.status_code == 200 and len(r.json()["choices"]) == 3
    r = http.post(srv.base + "/v1/completions", json={"prompt": "x", "n": 129})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_neutral_values_are_accepted(srv):
    r = http.post(srv.base + "/v1/completions", json={
        "prompt": "x", "max_tokens": 2, "suffix": None, "presence_penalty": 0,
        "frequency_penalty": 0, "logit_bias": {}, "user": "someone", "best_of": 1,
        "stop_token_ids": [256], "skip_special_tokens": True, "priority": 0})
    assert r.status_code == 200, r.text
    r = http.post(srv.base + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "tools": [],
        "tool_choice": "none", "response_format": {"type": "text"},
        "add_generation_prompt": True, "parallel_tool_calls": False})
    assert r.status_code == 200, r.text
    assert json.loads(r.text)["choices"][0]["logprobs"] is None


def test_the_api_key_guards_the_tokenizer_routes_too():
    """With keys, ``/tokenize``, ``/detokenize`` and ``/tokenizer_info`` need one, as ``/v1``
    does (the ASGI gate alone: no server to start); ``/health`` stays open."""
    import asyncio

    from ringkv.serve.app import ApiKeyGate

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = ApiKeyGate(app, ["sk-1"])

    def status(path, key=None):
        sent = []
        headers = [(b"authorization", b"Bearer " + key.encode())] if key else []
        scope = {"type": "http", "path": path, "method": "GET", "headers": headers}

        async def receive():
            return {"type": "http.request", "body": b""}

        async def send(msg):
            sent.append(msg)
        asyncio.run(gate(scope, receive, send))
        return sent[0]["status"]

    for path in ("/tokenize", "/detokenize", "/tokenizer_info", "/v1/completions"):
        assert status(path) == 401 and status(path, "sk-2") == 401
        assert status(path, "sk-1") == 200
    assert status("/health") == 200 and status("/tokenizer_info_x") == 200
