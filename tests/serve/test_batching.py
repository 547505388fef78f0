"""``ringkv serve`` with continuous batching and a hot tier on software devices: many clients at
once (the official ``openai`` client, in threads), every answer the one a request alone gets,
the hot tier's hits counted apart from the store's, a client that leaves freeing its place."""

import concurrent.futures as cf
import time

import httpx
from serve_helpers import SYSTEM, running

from ringkv.defs.config import DEMO_CONFIG
from ringkv.host.model.transformer import FixedBackend, RingPool
from ringkv.host.scheduler import plain_run
from ringkv.serve.template import chat_prompt

http = httpx.Client(timeout=120)

QUESTIONS = ["Who went up to the mountain?", "What did the king say?",
             "Where did they dwell?", "Who begat whom?", "What is the light?",
             "Why did the people murmur?", "When came the flood?", "How shall a man live?"]


def _answer(engine, messages, n):
    """The reply a request alone gets (greedy, no reuse): ``plain_run`` of its prompt, cut at
    the end of the message as the server cuts it."""
    out = plain_run(engine.model, [(0, list(chat_prompt(messages).tokens), n)],
                    lambda: FixedBackend(engine.config))[0]
    return bytes(t for t in out if t < 256).split(b"\n\n")[0].decode("utf-8", "replace")


def _conversation(srv, question, turns=3):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    replies = []
    for turn in range(turns):
        r = srv.client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=10,
                                               temperature=0)
        replies.append((list(msgs), r.choices[0].message.content, r.usage))
        msgs = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                       {"role": "user", "content": f"And then? ({turn})"}]
    return replies


def test_many_clients_at_once_get_what_each_alone_gets():
    with running("--device", "software") as srv:
        health = http.get(srv.base + "/health").json()["devices"][0]
        assert health["batching"] and health["max_batch"] == health["resident_limit"] >= 64
        with cf.ThreadPoolExecutor(len(QUESTIONS)) as pool:
            got = list(pool.map(lambda q: _conversation(srv, q), QUESTIONS))
        for conv in got:
            for msgs, reply, _usage in conv:
                assert reply == _answer(srv.engine, msgs, 10)
        # each conversation's later turns continued its rings, resident in the hot tier
        assert srv.metric('ringkv_device_hot_hits_total{device="software"}') >= \
            len(QUESTIONS) * 2
        assert srv.metric("ringkv_device_resident_conversations") >= len(QUESTIONS)
        assert all(u.prompt_tokens_details.cached_tokens > 0
                   for conv in got for _, _, u in conv[1:])
        # they ran together: the device's steps served several requests each
        assert srv.metric("ringkv_requests_total") == 3 * len(QUESTIONS)


def test_a_small_hot_tier_evicts_to_the_card_and_imports_back(tmp_path):
    """Two conversations' rings fit; four conversations take turns: the ones evicted resume
    from their records on the card (store hits), the resident ones without any import (hot
    hits), and every answer is the same."""
    slot = RingPool.slot_bytes(DEMO_CONFIG)
    with running("--device", f"software:{tmp_path / 'card.img'}", "--hot-bytes",
                 str(2 * slot)) as srv:
        health = http.get(srv.base + "/health").json()["devices"][0]
        assert health["resident_limit"] == 2 and health["max_batch"] == 2
        convs = [[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": q}] for q in QUESTIONS[:4]]
        # 0 and 1 stay resident while they alternate; 2 and 3 push them out to the card
        cached, prompts = [], []
        for turn, i in enumerate([0, 1, 0, 1, 2, 3, 0, 1, 2, 3]):
            msgs = convs[i]
            r = srv.client.chat.completions.create(model=srv.name, messages=msgs,
                                                   max_tokens=8, temperature=0)
            reply = r.choices[0].message.content
            assert reply == _answer(srv.engine, msgs, 8)
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
            prompts.append(r.usage.prompt_tokens)
            convs[i] = msgs + [{"role": "assistant", "content": reply},
                               {"role": "user", "content": f"Go on ({turn})."}]

        def path(name):
            return srv.metric(f'ringkv_device_requests_total{{device="software:{tmp_path}'
                              f'/card.img",path="{name}"}}')
        # 0 first; 1, 2, 3 from the system prompt's checkpoint; 0 and 1 twice from the hot
        # tier; the four evicted conversations from their last turn's record on the card (the
        # longest stored prefix of their prompts: all of the previous turn)
        assert (path("first"), path("prefix"), path("continue"), path("hit")) == (1, 7, 2, 0)
        for k in range(6, 10):             # each evicted one reused its whole previous turn
            assert cached[k] > prompts[k - 4]
        assert srv.metric("ringkv_device_hot_hits_total") == 2
        assert srv.metric("ringkv_device_hits_total") == 7


def test_a_client_that_leaves_frees_its_place_and_the_others_go_on():
    with running("--device", "software") as srv:
        def long_stream():
            with http.stream("POST", srv.base + "/v1/completions", json={
                    "prompt": "And it came to pass", "max_tokens": 400, "temperature": 0.7,
                    "seed": 1, "stream": True}) as r:
                lines = r.iter_lines()
                for _ in range(3):
                    next(lines)
            return "left"

        with cf.ThreadPoolExecutor(5) as pool:
            leaving = pool.submit(long_stream)
            staying = [pool.submit(_conversation, srv, q, 2) for q in QUESTIONS[:4]]
            assert leaving.result() == "left"
            for fut in staying:
                for msgs, reply, _ in fut.result():
                    assert reply == _answer(srv.engine, msgs, 10)
        deadline = time.monotonic() + 30
        while srv.engine.workers[0].load and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.engine.workers[0].load == 0 and not srv.engine.workers[0].jobs
