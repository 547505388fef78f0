"""``ringkv serve --kv-events``: the records the devices hold as vLLM's KV events, read by a
subscriber written against vLLM's published schema (the structs of vLLM's
``examples/online_serving/kv_events_subscriber.py``, written here again, decoding the raw
frames; nothing of ``ringkv.serve.events`` is used to read them)."""

import time
from typing import Any

import pytest

from ringkv.host.golden.hash import hash_step
from tests.serve_helpers import SYSTEM, free_port, running

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")


# -- vLLM's schema (vllm/distributed/kv_events.py, as its example subscriber copies it) --------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
END = (-1).to_bytes(8, "big", signed=True)


def _present(history):
    """Replay the events: the blocks present (hash -> parent, tokens) and how many were
    removed."""
    present, removed = {}, 0
    for _, batch in history:
        for e in batch.events:
            if isinstance(e, AllBlocksCleared):
                present.clear()
            elif isinstance(e, BlockStored):
                assert e.block_size == 16 and len(e.token_ids) == 16 * len(e.block_hashes)
                assert e.parent_block_hash is None or e.parent_block_hash in present
                parent = e.parent_block_hash
                for i, h in enumerate(e.block_hashes):
                    assert h not in present
                    present[h] = (parent, tuple(e.token_ids[16 * i:16 * (i + 1)]))
                    parent = h
            else:
                for h in e.block_hashes:
                    del present[h]
                removed += len(e.block_hashes)
    return present, removed


def _expected(holdings, seed):
    """The hashes of the full blocks of the records held (vLLM's chain from ``seed``)."""
    expected = set()
    for (count, h), tokens in holdings.items():
        assert len(tokens) == count
        state = seed
        for i, t in enumerate(tokens):
            state = hash_step(state, t)
            if (i + 1) % 16 == 0:
                expected.add(state)
        assert state == h
    return expected


def _caught_up(r, endpoint, seed):
    """``(history, holdings)`` once the replayed history's present blocks are those of the
    records the devices hold (a record's events follow its export, which may end after the
    request's answer)."""
    deadline = time.monotonic() + 20
    while True:
        history = _replay(endpoint, 0)
        holdings = {k: t for w in r.engine.workers for k, t in w.record_tokens().items()}
        if set(_present(history)[0]) == _expected(holdings, seed) \
                or time.monotonic() > deadline:
            return history, holdings
        time.sleep(0.05)


def _replay(endpoint, start):
    """vLLM's replay request (a REQ-style ``[b"", seq]`` from a DEALER): ``[(seq, batch)]``
    until the end marker."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send_multipart((b"", start.to_bytes(8, "big")))
        out = []
        while True:
            assert s.poll(20000), "no replay answer"
            empty, seq, payload = s.recv_multipart()
            if seq == END:
                assert payload == b""
                return out
            out.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
    finally:
        s.close()


def test_kv_events_follow_the_records_in_vllms_format(tmp_path):
    """Records become chained blocks (hash = the device's prefix hash at the block's end,
    parent = the block before), shared blocks are stored once and removed with their last
    record (``--capacity 3``: the device evicts), the first batch is a clear-all, sequence
    numbers run from 0 without gaps, and the replay socket gives the batches again."""
    pub, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    with running("--device", "software", "--capacity", "3", "--kv-events", pub,
                 "--kv-events-replay", rep, "--kv-events-block-size", "16") as r:
        assert r.engine.events.bound.wait(10)
        sub.connect(pub)
        time.sleep(0.3)                    # (a PUB socket's late joiner misses what went before)
        texts = ["Who made the firmament?", "Who begat Isaac?", "Who was Enoch?",
                 "Who built the ark?"]
        seed = r.engine.hashers[None].seed
        for text in texts:
            r.client.chat.completions.create(
                model=r.name, max_tokens=6, temperature=0,
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user",
                                                                  "content": text}])
            # the publisher sends the difference between what it last published and what the
            # devices hold (a burst of changes is one batch): each request's records are
            # published before the next request, so that its evicted blocks are removed in
            # the history (not folded into one final state)
            history, holdings = _caught_up(r, rep, seed)
        # the events the subscriber saw live
        live = []
        while sub.poll(500):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b""
            live.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
            if live[-1][0] == history[-1][0]:
                break
    sub.close()
    assert [s for s, _ in history] == list(range(len(history)))
    assert isinstance(history[0][1].events[0], AllBlocksCleared)
    assert live and live == [x for x in history if x[0] >= live[0][0]]
    present, removed = _present(history)
    assert removed > 0                      # the device evicted records (capacity 3)
    # what is present is exactly the full blocks of the records the device holds now, the
    # hashes those of vLLM's chain: each block's hash follows from its parent's and tokens
    expected = _expected(holdings, seed)
    assert set(present) == expected
    for h, (parent, tokens) in present.items():
        state = seed if parent is None else parent
        for t in tokens:
            state = hash_step(state, t)
        assert state == h


def test_a_restart_clears_all_then_publishes_the_images_records_again(tmp_path):
    """An instance restarted on its card image: its first batch (sequence 0) is a clear-all,
    then the blocks of the records the image holds, read from its directory."""
    image = str(tmp_path / "card.img")
    stored = set()
    for start in range(2):
        rep = f"tcp://127.0.0.1:{free_port()}"
        with running("--device", f"software:{image}", "--kv-events",
                     f"tcp://127.0.0.1:{free_port()}", "--kv-events-replay", rep) as r:
            assert r.engine.events.bound.wait(10)
            if start == 0:
                r.client.completions.create(model=r.name, prompt="In the beginning God " * 4,
                                            max_tokens=4, temperature=0)
            deadline = time.monotonic() + 20
            while True:
                history = _replay(rep, 0)
                blocks = {h for _, b in history for e in b.events
                          if isinstance(e, BlockStored) for h in e.block_hashes}
                if (start == 0 and blocks) or (start == 1 and blocks >= stored) \
                        or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        assert history[0][0] == 0 and isinstance(history[0][1].events[0], AllBlocksCleared)
        if start == 0:
            stored = blocks
            assert stored
        else:
            assert blocks == stored
