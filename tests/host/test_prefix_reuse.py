"""Longest stored prefix (host side): the software device's ``query_prefix``, the
scheduler's checkpoints, kept turns, edit-and-resend and prefix reuse; every generated token
equal to a run with no reuse at all (float64 and the fixed-point core's golden model)."""

import random

import pytest

from ringkv.defs.config import RingKVConfig
from ringkv.host.device.interface import QueryResult, snapshot_bytes
from ringkv.host.device.software import SoftwareDevice
from ringkv.host.golden.hash import sequence_hash
from ringkv.host.model.transformer import BOS, FixedBackend, Float64Backend, Model
from ringkv.host.scheduler import CHECKPOINT_EVERY, PATHS, Scheduler, path_summary, plain_run

SMALL = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=16)


@pytest.fixture(scope="module")
def model():
    return Model(SMALL, hidden=64, ffn=96, seed=11)


def _words(rng, n):
    return [rng.randrange(1, 256) for _ in range(n)]


def _float(config=SMALL):
    return lambda: Float64Backend(config)


def _play(sched, reqs):
    return [sched.request(sid, toks, n, **(opts[0] if opts else {}))
            for sid, toks, n, *opts in reqs]


def _stored(dev, tokens, count, model):
    """Put the state after ``tokens[:count]`` into ``dev``'s store by computing it there."""
    dev.attention.reset()
    dev.write_tokens(tokens[:count])
    model.prefill(tokens[:count], 0, dev.attention, 5)
    return dev.export(tokens[:count], checkpoint=True)[0]


# -- the software device's longest-prefix query -------------------------------------------

def test_query_prefix_longest_verified_at_most_limit(model):
    rng = random.Random(1)
    tokens = [BOS] + _words(rng, 40)
    dev = SoftwareDevice(SMALL)
    keys = {n: _stored(dev, tokens, n, model) for n in (3, 17, 30)}
    other = [BOS] + _words(rng, 10)
    _stored(dev, other, 8, model)                    # another conversation's record
    assert [kind for _, _, kind in dev.listing()] == ["checkpoint"] * 4

    def ask(limit, toks=tokens):
        before = dev.counters["probes"]
        r = dev.query_prefix(toks, limit)
        assert dev.counters["probes"] - before == min(limit, len(toks))   # one per length
        return r

    for limit, want in ((41, 30), (40, 30), (30, 30), (29, 17), (17, 17), (16, 3), (3, 3)):
        r = ask(limit)
        assert (r.hit, r.count, r.prefix_hash) == (True, want, keys[want][1]), limit
        # the rings and the token memory hold exactly the state after `want` tokens
        assert dev.attention.n == want and dev.tokens == tokens[:want]
        assert dev.import_(r) == snapshot_bytes(SMALL, want)             # no second import
    imports = dev.counters["imports"]
    assert ask(2) == QueryResult(False, 0, sequence_hash(tokens[:2], dev.seed), "no record")
    assert ask(0).hit is False and ask(5, []).hit is False
    assert dev.counters["imports"] == imports
    # a hit is the most recently used record
    ask(17)
    assert dev.listing()[-1][:2] == keys[17]
    # a stored prefix of other tokens is not found; a diverging conversation gets the longest
    # common stored prefix
    fork = tokens[:20] + _words(rng, 15)
    assert ask(len(fork), fork).count == 17
    with pytest.raises(ValueError, match=r"^limit must be a non-negative number of tokens, "
                                         r"not -1$"):
        dev.query_prefix(tokens, -1)


def test_query_prefix_collision_skipped_foreign_config_misses(model):
    rng = random.Random(2)
    tokens = [BOS] + _words(rng, 30)
    dev = SoftwareDevice(SMALL)
    k10 = _stored(dev, tokens, 10, model)
    k25 = _stored(dev, tokens, 25, model)
    # the longest key's record holds other tokens (as a hash collision would): skipped
    rec = dev.records[k25]
    rec.tokens = rec.tokens[:5] + (999,) + rec.tokens[6:]
    r = dev.query_prefix(tokens, 30)
    assert (r.hit, r.count) == (True, 10)
    # every candidate collides: a miss saying why
    dev.records[k10].tokens = (7,) * 10
    r = dev.query_prefix(tokens, 30)
    assert (r.hit, r.reason) == (False, "tokens differ")
    # a record of a foreign configuration: a miss
    dev.records[k25].tokens = tuple(tokens[:25])
    dev.records[k25].digest = b"\0" * 32
    assert dev.query_prefix(tokens, 30) == QueryResult(False, 0, r.prefix_hash,
                                                       "foreign config")


def test_export_refuses_rings_or_tokens_out_of_step(model):
    dev = SoftwareDevice(SMALL)
    tokens = [BOS, 5, 6, 7, 8]
    dev.write_tokens(tokens[:3])
    model.prefill(tokens[:3], 0, dev.attention, 4)
    with pytest.raises(ValueError, match=r"^export of 4 tokens: the rings hold 3$"):
        dev.export(tokens[:4])
    with pytest.raises(ValueError, match=r"^export of 3 tokens: the token memory holds "
                                         r"other tokens$"):
        dev.export([BOS, 5, 9])
    with pytest.raises(ValueError, match=r"^export needs at least one token$"):
        dev.export([])
    assert dev.export(tokens[:3])[0] == dev.key_of(tokens[:3])
    assert dev.listing() == [(*dev.key_of(tokens[:3]), "turn")]


# -- the scheduler ------------------------------------------------------------------------

def _shared_prompt_script(rng, system, n_sessions=4):
    reqs = []
    for i in range(n_sessions):
        sid = f"c{i}"
        reqs.append((sid, [BOS] + system + _words(rng, rng.randrange(2, 9)), 4,
                     {"checkpoints": (1 + len(system),)}))
        reqs.append((sid, _words(rng, 3), 3))
    return reqs


@pytest.mark.parametrize("backend", ["float64", "fixed"])
def test_shared_system_prompt(model, backend):
    """Four conversations behind one system prompt: the first computes it and stores a
    checkpoint at its end; the others import it and compute only their own tokens."""
    rng = random.Random(3)
    system = _words(rng, 37)                         # > 2 W: the window slid
    factory = _float() if backend == "float64" else (lambda: FixedBackend(SMALL, lanes=2))
    reqs = _shared_prompt_script(rng, system)
    dev = SoftwareDevice(SMALL, attention=factory())
    sched = Scheduler(model, dev, chunk=5, checkpoint_every=None)
    outs = _play(sched, reqs)
    assert outs == plain_run(model, reqs, factory, chunk=5)
    firsts = [e for e in sched.events if e["before"] == 0]
    assert [e["path"] for e in firsts] == ["first", "prefix", "prefix", "prefix"]
    assert firsts[0]["checkpoints"] == [1 + len(system)]
    for e, (_, toks, _, _) in zip(firsts, reqs[::2]):
        reused = 0 if e["path"] == "first" else 1 + len(system)
        assert (e["reused"], e["prefilled"], e["recomputed"]) == (reused, len(toks) - reused, 0)
        assert e["imported_bytes"] == (snapshot_bytes(SMALL, reused) if reused else 0)
    # the marks of the later conversations are covered by the import: one checkpoint in all
    assert dev.stats()["checkpoint_records"] == 1 and len(sched.checkpoint_keys) == 1
    computed = sum(e["prefilled"] for e in sched.events)
    assert computed == sum(len(r[1]) for r in reqs) + sum(1 for r in reqs if r[3:] == ()) \
        - 3 * (1 + len(system))
    lines = path_summary(sched.events)
    assert lines[1].split()[:2] == ["continue", "4"] and lines[2].split()[:2] == ["prefix", "3"]


def test_no_reuse_baseline_and_nothing_stored(model):
    rng = random.Random(4)
    system = _words(rng, 20)
    reqs = _shared_prompt_script(rng, system, 3)
    base = Scheduler(model, SoftwareDevice(SMALL), chunk=5, prefix_reuse=False)
    outs = _play(base, reqs)
    assert [e["path"] for e in base.events] == ["first", "continue"] * 3
    assert base.device.counters["prefix_queries"] == 0
    assert outs == plain_run(model, reqs, _float(), chunk=5)
    # nothing stored at all: a prefix query that misses, reason "no record", not shown
    dev = SoftwareDevice(SMALL)
    sched = Scheduler(model, dev, chunk=5)
    sched.request("a", [BOS, 1, 2, 3], 2)
    e = sched.events[0]
    assert (e["path"], e["reason"], e["reused"]) == ("first", "", 0)
    assert dev.counters["prefix_queries"] == 1 and dev.counters["probes"] == 3


def test_whole_stream_stored(model):
    """A request whose every token is stored: with n_new=0 it imports all and computes
    nothing; to generate, the last token must go through the model again, so the longest
    usable prefix is one shorter."""
    rng = random.Random(5)
    prompt = [BOS] + _words(rng, 23)
    reqs = [("a", prompt, 0, {"checkpoints": (len(prompt) - 1, len(prompt))}),
            ("b", prompt, 0), ("b", _words(rng, 4), 3),
            ("c", prompt, 2), ("c", [9], 2)]
    sched = Scheduler(model, SoftwareDevice(SMALL), chunk=5, checkpoint_every=None)
    outs = _play(sched, reqs)
    assert outs == plain_run(model, reqs, _float(), chunk=5)
    ev = sched.events
    assert ev[0]["checkpoints"] == [len(prompt) - 1, len(prompt)]
    # a's turn ends at its last checkpoint: that record is its turn snapshot, not exported twice
    assert sched.sessions["a"].key in sched.checkpoint_keys
    assert ev[0]["exported_bytes"] == snapshot_bytes(SMALL, len(prompt) - 1) + \
        snapshot_bytes(SMALL, len(prompt))
    assert (ev[1]["path"], ev[1]["reused"], ev[1]["prefilled"]) == ("prefix", len(prompt), 0)
    assert ev[1]["exported_bytes"] == 0                   # nothing new to store
    assert ev[2]["path"] == "continue"
    assert (ev[3]["path"], ev[3]["reused"], ev[3]["prefilled"]) == ("prefix", len(prompt) - 1, 1)


def test_edit_and_resend(model):
    """Edit the message of an earlier turn and resend: the session resumes from the kept turn
    snapshot it forks at and computes only the edited message; the regenerated answers and
    everything after equal a run that computes the edited conversation from scratch."""
    rng = random.Random(6)
    sched = Scheduler(model, SoftwareDevice(SMALL), chunk=5, keep_turns=3,
                      checkpoint_every=None)
    reqs = [("a", [BOS] + _words(rng, 9), 4), ("a", _words(rng, 6), 4),
            ("b", [BOS] + _words(rng, 5), 3), ("a", _words(rng, 7), 4)]
    _play(sched, reqs)
    ends = [e["after"] for e in sched.events if e["session"] == "a"]    # turn snapshot counts
    assert [k[0] for k in sched.sessions["a"].turns] == ends
    # edit a's second message: the stream before it is turn 1's tokens + its pending token
    fork = ends[0] + 1
    edit = ("a", _words(rng, 8), 4, {"rewind": fork})
    more = [("b", _words(rng, 2), 2), ("a", _words(rng, 3), 3)]
    outs = _play(sched, [edit] + more)
    e = sched.events[len(reqs)]
    assert (e["path"], e["rewind"], e["reused"], e["prefilled"], e["recomputed"]) == \
        ("prefix", fork, ends[0], 1 + len(edit[1]), 1)     # turn 1's last token, fed again
    assert e["before"] == fork
    # the abandoned branch's turns left the session's list; the edited branch's joined it
    assert [k[0] for k in sched.sessions["a"].turns] == [ends[0], e["after"],
                                                         sched.events[-1]["after"]]
    # regenerate a's last answer (its message again): back to the edited turn's snapshot
    again = ("a", more[1][1], 3, {"rewind": e["after"] + 1})
    outs += _play(sched, [again])
    script = reqs + [edit] + more + [again]
    assert outs == plain_run(model, script, _float(), chunk=5)[len(reqs):]
    assert outs[-1] == outs[-2]
    last = sched.events[-1]
    assert (last["path"], last["reused"], last["prefilled"]) == ("prefix", e["after"], 1 + 3)


def test_rewind_into_pending_and_errors(model):
    sched = Scheduler(model, SoftwareDevice(SMALL), chunk=5)
    reqs = [("a", [BOS, 4, 5, 6], 3), ("a", [7, 8], 2, {"rewind": 6})]   # drops the pending
    outs = _play(sched, reqs)
    assert outs == plain_run(model, reqs, _float(), chunk=5)
    assert sched.events[1]["path"] == "continue" and sched.events[1]["prefilled"] == 2
    s = sched.sessions["a"]
    with pytest.raises(ValueError, match=r"^rewind must be a position 0\.\.10 of session "
                                         r"'a''s stream, not 12$"):
        sched.request("a", [1], 1, rewind=12)
    with pytest.raises(ValueError, match=r"^checkpoint 10 is not a position this request "
                                         r"feeds \(11\.\.12 of session 'a''s stream\)$"):
        sched.request("a", [1, 2], 1, checkpoints=(11, 10))
    with pytest.raises(ValueError, match=r"^checkpoint 6 is not a position this request "
                                         r"feeds \(4\.\.5 of session 'a''s stream\)$"):
        sched.request("a", [1, 2], 1, rewind=3, checkpoints=(4, 6))
    with pytest.raises(ValueError, match=r"^a request that generates must feed at least one "
                                         r"token"):
        sched.request("a", [], 1, rewind=s.stream.__len__() - 1)
    assert len(sched.events) == 2 and s.stream == sched.sessions["a"].stream
    with pytest.raises(ValueError, match=r"^keep_turns must be at least 1, not 0$"):
        Scheduler(model, SoftwareDevice(SMALL), keep_turns=0)
    with pytest.raises(ValueError, match=r"^checkpoint_every must be a positive number of "
                                         r"tokens or None, not -2$"):
        Scheduler(model, SoftwareDevice(SMALL), checkpoint_every=-2)


def test_checkpoint_every_and_a_diverging_conversation(model):
    """Automatic checkpoints at every multiple of C a prefill crosses (a long document read
    in one request, and a chat that grows over it); a conversation that shares the document's
    first 70 tokens and then differs reuses the checkpoint at 64."""
    rng = random.Random(7)
    doc = [BOS] + _words(rng, 79)
    q1, q2 = _words(rng, 6), _words(rng, 5)
    reqs = [("a", doc + q1, 3), ("a", _words(rng, 12), 3),
            ("b", doc[:70] + q2, 3)]
    dev = SoftwareDevice(SMALL)
    sched = Scheduler(model, dev, chunk=5, checkpoint_every=16)
    outs = _play(sched, reqs)
    assert outs == plain_run(model, reqs, _float(), chunk=5)
    ev = sched.events
    assert ev[0]["checkpoints"] == [16, 32, 48, 64, 80]
    # the second turn starts at 87 (85 fed + 2 decoded), feeds 13 (pending + 12): 96 crossed
    assert ev[1]["checkpoints"] == [96]
    assert (ev[2]["path"], ev[2]["reused"], ev[2]["checkpoints"]) == ("prefix", 64, [])
    assert dev.stats()["checkpoint_records"] == 6
    assert CHECKPOINT_EVERY == Scheduler(model, dev).checkpoint_every == 256


def test_keep_turns_and_shared_records(model):
    """A session keeps its last keep_turns turn snapshots (the older ones are deleted by the
    export that replaces them); a record another session's turns name, or a checkpoint, is
    never deleted by it."""
    rng = random.Random(8)
    dev = SoftwareDevice(SMALL)
    sched = Scheduler(model, dev, chunk=5, keep_turns=2, checkpoint_every=None)
    first = [BOS] + _words(rng, 6)
    _play(sched, [("x", first, 2, {"checkpoints": (7,)}), ("y", first, 2)])
    # y's first turn is x's too (the same tokens): one record, named by both sessions
    assert sched.sessions["x"].turns == sched.sessions["y"].turns
    for _ in range(3):
        sched.request("x", _words(rng, 3), 2)
    x, y = sched.sessions["x"], sched.sessions["y"]
    assert len(x.turns) == 2 and x.key == x.turns[-1]
    live = set(dev.records)
    assert set(x.turns) <= live and y.turns[0] in live          # shared: kept
    assert len(sched.checkpoint_keys) == 1 and sched.checkpoint_keys <= live
    deleted = [k for e in sched.events for k in e["deleted"]]
    assert len(deleted) == 1 and deleted[0] not in live          # x's second turn only
    assert len(live) == 1 + 1 + 2                                # checkpoint, shared, x's two


def test_checkpoint_evicted_or_failing_is_a_miss(model):
    """Under a small capacity the checkpoint of the system prompt is evicted by later exports
    (the same LRU as any record): a new conversation behind it recomputes; a checkpoint whose
    record fails verification is a miss and a recompute too. Tokens equal either way."""
    rng = random.Random(9)
    system = _words(rng, 25)
    reqs = [("a", [BOS] + system + [3, 4], 2, {"checkpoints": (26,)}),
            ("b", [BOS] + _words(rng, 5), 2), ("c", [BOS] + _words(rng, 5), 2),
            ("d", [BOS] + system + [5], 3)]
    dev = SoftwareDevice(SMALL, capacity=2)
    sched = Scheduler(model, dev, chunk=5, checkpoint_every=None)
    outs = _play(sched, reqs)
    assert outs == plain_run(model, reqs, _float(), chunk=5)
    assert dev.stats()["evictions"] == 3
    assert [e["path"] for e in sched.events] == ["first"] * 4
    # room for all: d imports the checkpoint; with its record damaged, d recomputes
    for damage, reason in ((None, ""), ("tokens", "tokens differ"),
                           ("digest", "foreign config")):
        dev = SoftwareDevice(SMALL)
        sched = Scheduler(model, dev, chunk=5, checkpoint_every=None)
        outs = _play(sched, reqs[:3])
        key = next(iter(sched.checkpoint_keys))
        if damage == "tokens":
            dev.records[key].tokens = (BOS,) + (0,) * 25
        elif damage == "digest":
            dev.records[key].digest = b"\1" * 32
        outs += _play(sched, reqs[3:])
        assert outs == plain_run(model, reqs, _float(), chunk=5)
        e = sched.events[-1]
        assert (e["path"], e["reason"], e["reused"]) == \
            (("prefix", "", 26) if damage is None else ("first", reason, 0))


def test_exact_snapshot_gone_resumes_from_a_prefix(model):
    """A session whose exact snapshot was evicted, but whose earlier checkpoint survived,
    imports the checkpoint and recomputes only the tokens after it."""
    rng = random.Random(10)
    reqs = [("a", [BOS] + _words(rng, 30), 3, {"checkpoints": (20,)}),
            ("b", [BOS] + _words(rng, 4), 2), ("a", _words(rng, 3), 2)]
    dev = SoftwareDevice(SMALL)
    sched = Scheduler(model, dev, chunk=5, checkpoint_every=None)
    outs = _play(sched, reqs[:2])
    assert dev.forget(sched.sessions["a"].key)                # evicted
    outs += _play(sched, reqs[2:])
    assert outs == plain_run(model, reqs, _float(), chunk=5)
    e = sched.events[-1]
    had = sched.events[0]["after"]
    assert (e["path"], e["reused"], e["recomputed"], e["prefilled"]) == \
        ("prefix", 20, had - 20, had - 20 + 1 + 3)


@pytest.mark.parametrize("backend,seed", [("float64", 0), ("float64", 1), ("fixed", 2)])
def test_random_scripts_equal_plain_run(model, backend, seed):
    """Random conversations: two shared system prompts, branches of one conversation, edits
    and regenerations (rewind), caller checkpoints, automatic checkpoints, a small store (LRU
    evictions of checkpoints and turns), both export policies: every token equals the no-reuse
    run, and the scheduler reuses and stores what it says it does."""
    rng = random.Random(100 + seed)
    factory = _float() if backend == "float64" else (lambda: FixedBackend(SMALL, lanes=2))
    systems = [_words(rng, rng.randrange(10, 40)) for _ in range(2)]
    streams, reqs = {}, []
    for _ in range(30):
        sid = f"s{rng.randrange(6)}"
        opts = {}
        if sid not in streams:
            toks = [BOS] + (rng.choice(systems) if rng.random() < 0.7 else [])
            if toks[1:]:
                opts["checkpoints"] = (len(toks),)
            toks += _words(rng, rng.randrange(1, 10))
        else:
            toks = _words(rng, rng.randrange(0, 8))
            if rng.random() < 0.25:
                opts["rewind"] = rng.randrange(1, len(streams[sid]) + 1)
        reqs.append((sid, toks, rng.randrange(1, 5), opts))
        base = streams.get(sid, [])[:opts.get("rewind", len(streams.get(sid, [])))]
        streams[sid] = base + toks + [0] * reqs[-1][2]    # stream length is what matters
        if not toks and not base:
            reqs.pop()
    dev = SoftwareDevice(SMALL, attention=factory(), capacity=rng.choice([3, 6, None]))
    sched = Scheduler(model, dev, chunk=rng.choice([3, 5, 8]),
                      checkpoint_every=rng.choice([None, 12, 20]), keep_turns=rng.choice([1, 3]),
                      export_after_inference=seed != 1)
    outs = _play(sched, reqs)
    assert outs == plain_run(model, reqs, factory, chunk=5)
    paths = {e["path"] for e in sched.events}
    assert paths <= set(PATHS) and "prefix" in paths
    for e in sched.events:
        start = e["before"] if e["path"] == "continue" else e["reused"]
        assert e["after"] == start + e["prefilled"] + max(e["generated"] - 1, 0)
        assert e["imported_bytes"] == (snapshot_bytes(SMALL, e["reused"]) if e["reused"] else 0)


@pytest.mark.parametrize("which", ["short", pytest.param("full", marks=pytest.mark.slow)])
def test_system_demo_scenario_decisions(which):
    """The Verilator demo's scenarios (``make demo``, and the short one of ``make test``) on the
    software device: every path occurs, the shared system prompt is computed once and imported
    by the other conversations, the edited question resumes from the checkpoint, and every
    token equals the no-reuse run."""
    from ringkv.defs.config import DEMO_CONFIG
    from ringkv.host.model.transformer import weights_path
    from ringkv.sim.system_demo import LANES, SYSTEM_PROMPT, scenario, short_scenario, software_run
    steps = short_scenario() if which == "short" else scenario()
    model = (Model.trained(DEMO_CONFIG) if weights_path(DEMO_CONFIG).exists()
             else Model(DEMO_CONFIG, hidden=64, ffn=128, seed=0))
    sched, outs = software_run(steps, DEMO_CONFIG, model)
    plan = [(sid, toks, n, *opts) for _, _, sid, toks, n, *opts in steps if sid is not None]
    assert outs == plain_run(model, plan, lambda: FixedBackend(DEMO_CONFIG, lanes=LANES),
                             chunk=16)
    ev = sched.events
    assert {"first", "hit", "miss", "prefix"} <= {e["path"] for e in ev}
    n_sys = 1 + len(SYSTEM_PROMPT)
    users = ("dave", "erin") if which == "short" else ("dave", "erin", "frank")
    shared = ev[-len(users) - 1:]
    assert [(e["session"], e["path"], e["reused"]) for e in shared] == \
        [(users[0], "first", 0)] + [(u, "prefix", n_sys) for u in users[1:]] + \
        [(users[-1], "prefix", n_sys)]
    assert shared[0]["checkpoints"] == [n_sys] and shared[-1]["rewind"] == n_sys


def test_bench_tokens_computed_behind_a_shared_prefix():
    """The bench's ``system.prefix.tokens_computed`` scenario, small: the prefix is computed
    once; unmarked, the automatic checkpoints give the same when the prefix ends on one; with
    no checkpoint at all every conversation computes everything."""
    from bench.bench_system import prefix_tokens_computed
    marked = prefix_tokens_computed(conversations=4, shared=64, question=8)
    assert (marked["prefix_computed"], marked["computed"], marked["paths"]) == \
        (64, 64 + 4 * 8, {"first": 1, "prefix": 3})
    auto = prefix_tokens_computed(conversations=3, shared=64, question=8, mark=False,
                                  checkpoint_every=32)
    assert (auto["prefix_computed"], auto["checkpoints"]) == (64, 2)     # at 32 and 64
    none = prefix_tokens_computed(conversations=3, shared=64, question=8, mark=False)
    assert none["computed"] == none["no_reuse_computed"] == 3 * 72


def test_failed_request_leaves_the_session_as_it_was(model):
    """A device error in the middle of a request (here: storage refusing the checkpoint's
    export) raises; the host's view of the session is as before the request, and the same
    request sent again gives the tokens of a run where nothing failed."""
    class Failing(SoftwareDevice):
        fail = True

        def export(self, tokens, replaces=None, *, checkpoint=False):
            if checkpoint and self.fail:
                raise OSError("storage error")
            return super().export(tokens, replaces, checkpoint=checkpoint)

    dev = Failing(SMALL)
    sched = Scheduler(model, dev, chunk=5, checkpoint_every=None)
    reqs = [("a", [BOS] + list(range(1, 12)), 3), ("a", list(range(20, 30)), 3,
                                                  {"checkpoints": (20,)})]
    _play(sched, reqs[:1])
    s = sched.sessions["a"]
    before = (list(s.tokens), list(s.pending), s.key, list(s.turns))
    with pytest.raises(OSError, match="storage error"):
        _play(sched, reqs[1:])
    assert (s.tokens, s.pending, s.key, s.turns) == before and sched.resident is None
    dev.fail = False
    outs = _play(sched, reqs[1:])
    assert outs == plain_run(model, reqs, _float(), chunk=5)[1:]
    assert sched.events[-1]["path"] == "hit"
