"""The batching scheduler: many conversations at once on the software device's hot tier, every
request's tokens those of the same request alone (``plain_run``, the one-at-a-time
``Scheduler``), the card still the persistence point."""

import random

import numpy as np
import pytest

from ringkv.defs.config import RingKVConfig
from ringkv.host.batch import BatchScheduler
from ringkv.host.device.software import SoftwareDevice
from ringkv.host.errors import StorageError, UsageError
from ringkv.host.model.sampling import Sampler, SamplingParams
from ringkv.host.model.transformer import BOS, FixedBackend, Float64Backend, Model, RingPool
from ringkv.host.scheduler import Scheduler, plain_run

SMALL = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=16)
SLOT = RingPool.slot_bytes(SMALL)


@pytest.fixture(scope="module")
def model():
    return Model(SMALL, hidden=64, ffn=96, seed=11)


def _device(slots, **kw):
    return SoftwareDevice(SMALL, attention=FixedBackend(SMALL), hot_bytes=slots * SLOT, **kw)


def _script(seed, n=40, sessions=12, longest=40, most_new=12):
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        sid = f"s{rng.randrange(sessions)}"
        first = not any(r[0] == sid for r in reqs)
        reqs.append((sid, ([BOS] if first else []) +
                     [rng.randrange(256) for _ in range(rng.randrange(1, longest))],
                     rng.randrange(0, most_new)))
    return reqs


def _drive(sched, reqs, seed, cancel=()):
    """Submit ``reqs`` a few at a time between steps (requests join while others run);
    cancel the request numbers in ``cancel`` a few steps after they start."""
    rng = random.Random(seed)
    pending, live = list(enumerate(reqs)), []
    while pending or sched.busy:
        for _ in range(rng.randrange(0, 4)):
            if pending:
                i, (sid, toks, n) = pending.pop(0)
                live.append((i, sched.submit(sid, toks, n)))
        for i, r in live:
            if i in cancel and r.state == "running" and rng.random() < 0.5:
                r.cancel()
        sched.step()
    return {i: r for i, r in live}


@pytest.mark.parametrize("slots", [1, 3, 64])
def test_concurrent_requests_equal_plain_run(model, slots):
    reqs = _script(1)
    sched = BatchScheduler(model, _device(slots), chunk=5, step_tokens=24)
    got = _drive(sched, reqs, seed=slots)
    want = plain_run(model, reqs, lambda: FixedBackend(SMALL), chunk=5)
    assert [got[i].out for i in range(len(reqs))] == want
    assert all(got[i].state == "done" for i in got)
    paths = {e["path"] for e in sched.events}
    assert "continue" in paths
    if slots < 12:                      # fewer contexts than conversations: evicted, imported
        assert "hit" in paths
    if slots == 64:                     # room for every conversation: no import at all
        assert paths <= {"first", "continue"}
        assert not sched.running


def test_requests_really_run_together(model):
    reqs = [(f"s{i}", [BOS] + [i + 1] * 9, 6) for i in range(8)]
    sched = BatchScheduler(model, _device(8), chunk=4, step_tokens=64)
    for r in reqs:
        sched.submit(*r)
    sched.step()
    assert len(sched.running) == 8             # all admitted at the first step
    while sched.busy:
        sched.step()
    assert sched.steps < 8 * 6                 # far fewer steps than one at a time
    assert [e["generated"] for e in sched.events] == [6] * 8


def test_cancelled_and_failed_requests_leave_their_sessions_as_before(model):
    reqs = _script(2, n=30, sessions=6)
    cancel = set(range(0, 30, 3))
    sched = BatchScheduler(model, _device(4), chunk=5, step_tokens=16)
    got = _drive(sched, reqs, seed=7, cancel=cancel)
    cancelled = {i for i in got if got[i].state == "failed"}
    assert cancelled and cancelled <= cancel
    assert all(isinstance(got[i].error, UsageError) for i in cancelled)
    kept = [r for i, r in enumerate(reqs) if i not in cancelled]
    # a first request cancelled: the next one of its session starts it (as a new session)
    want = plain_run(model, kept, lambda: FixedBackend(SMALL), chunk=5)
    assert [got[i].out for i in range(len(reqs)) if i not in cancelled] == want
    assert not sched.running and len(sched.where) <= 4


@pytest.mark.parametrize("backend", ["fixed", "float64"])
def test_seeded_sampling_and_checkpoints_equal_the_one_at_a_time_scheduler(model, backend):
    rng = random.Random(5)
    reqs = []
    for _ in range(18):
        sid = f"c{rng.randrange(5)}"
        first = not any(r["sid"] == sid for r in reqs)
        toks = ([BOS] if first else []) + [rng.randrange(256) for _ in range(rng.randrange(1, 30))]
        reqs.append({"sid": sid, "tokens": toks, "n_new": rng.randrange(1, 9),
                     "checkpoints": [len(toks)] if first else ()})

    def params(i):
        return SamplingParams(temperature=0.8, top_k=40, seed=i, max_tokens=9)

    make = (lambda: FixedBackend(SMALL)) if backend == "fixed" else (lambda: Float64Backend(SMALL))
    one = Scheduler(model, SoftwareDevice(SMALL, attention=make()), chunk=5, checkpoint_every=8)
    want = [one.request(r["sid"], r["tokens"], r["n_new"], checkpoints=r["checkpoints"],
                        sample=Sampler(params(i))) for i, r in enumerate(reqs)]
    dev = SoftwareDevice(SMALL, attention=make(), hot_bytes=3 * SLOT if backend == "fixed"
                         else 3 * 8 * 2 * 2 * 2 * 16 * 16)
    assert dev.resident_limit == 3
    sched = BatchScheduler(model, dev, chunk=5, checkpoint_every=8, step_tokens=20)
    got = sched.run([dict(r, sample=Sampler(params(i))) for i, r in enumerate(reqs)])
    assert got == want


def test_max_batch_one_is_one_request_at_a_time(model):
    reqs = _script(3, n=12, sessions=4)
    sched = BatchScheduler(model, _device(4), chunk=5, max_batch=1)
    for r in reqs:
        sched.submit(*r)
    while sched.busy:
        assert len(sched.running) <= 1
        sched.step()
    assert [r for r in sched.events] and sched.max_batch == 1
    assert [e["generated"] for e in sched.events] == [n for *_, n in reqs]


def test_on_token_stops_and_a_raising_client_ends_only_its_request(model):
    sched = BatchScheduler(model, _device(4), chunk=5)
    seen = []
    a = sched.submit("a", [BOS, 1, 2, 3], 10, on_token=lambda t: len(seen.append(t) or seen) >= 3)

    def gone(token):
        raise ConnectionError("client went away")
    b = sched.submit("b", [BOS, 4, 5, 6], 10, on_token=gone)
    c = sched.submit("c", [BOS, 7, 8, 9], 4)
    while sched.busy:
        sched.step()
    assert a.state == "done" and a.stopped and len(a.out) == 3
    assert b.state == "failed" and isinstance(b.error, ConnectionError)
    assert c.state == "done" and c.out == plain_run(model, [("c", [BOS, 7, 8, 9], 4)],
                                                    lambda: FixedBackend(SMALL), chunk=5)[0]
    assert "b" not in sched.where                     # its rings are not trusted
    assert sched.sessions["b"].tokens == []


def test_a_bad_request_fails_alone(model):
    sched = BatchScheduler(model, _device(2), chunk=5)
    bad = sched.submit("x", [BOS, 1], 2, checkpoints=[9])
    bad2 = sched.submit("y", [BOS, 1], 2, tenant=None, rewind=4)
    good = sched.submit("z", [BOS, 1, 2], 2)
    sched.run([])
    assert bad.state == "failed" and "checkpoint 9" in str(bad.error)
    assert bad2.state == "failed" and "rewind" in str(bad2.error)
    assert good.state == "done" and len(good.out) == 2
    with pytest.raises(ValueError, match="n_new"):
        sched.submit("z", [1], -1)
    with pytest.raises(ValueError, match="max_batch"):
        BatchScheduler(model, _device(2), max_batch=0)
    with pytest.raises(ValueError, match="step_tokens"):
        BatchScheduler(model, _device(2), step_tokens=0)


class _FailingExports(SoftwareDevice):
    """A software device whose ``fail``-th export raises a storage error (a card gone)."""

    fail = None

    def export(self, *args, **kw):
        if self.fail is not None:
            self.fail -= 1
            if self.fail < 0:
                self.fail = None
                raise StorageError("the card stopped answering")
        return super().export(*args, **kw)


def test_a_device_failure_ends_the_running_requests_and_nothing_else_changes(model):
    dev = _FailingExports(SMALL, attention=FixedBackend(SMALL), hot_bytes=4 * SLOT)
    sched = BatchScheduler(model, dev, chunk=5)
    sched.run([("a", [BOS, 1, 2, 3], 3), ("b", [BOS, 4, 5], 2)])
    before = {s: (list(v.tokens), list(v.pending)) for s, v in sched.sessions.items()}
    dev.fail = 1
    reqs = [sched.submit("a", [9, 9], 4), sched.submit("b", [8], 4)]
    with pytest.raises(StorageError):
        while sched.busy:
            sched.step()
    assert {r.state for r in reqs} <= {"failed", "done"} and not sched.running
    failed = [r for r in reqs if r.state == "failed"]
    assert failed and all(isinstance(r.error, StorageError) for r in failed)
    for r in failed:
        assert (sched.sessions[r.sid].tokens, sched.sessions[r.sid].pending) == before[r.sid]
    # the sessions go on as if the failed requests had never been sent
    again = sched.run([(r.sid, r.tokens, r.n_new) for r in failed])
    script = [("a", [BOS, 1, 2, 3], 3), ("b", [BOS, 4, 5], 2)]
    script += [(r.sid, r.tokens, r.n_new) for r in reqs if r.state == "done"]
    script += [(r.sid, r.tokens, r.n_new) for r in failed]
    want = plain_run(model, script, lambda: FixedBackend(SMALL), chunk=5)
    assert again == want[-len(failed):]


def test_the_card_is_the_persistence_point(model, tmp_path):
    """Every finished turn is on the card: a device started again on the image resumes each
    conversation from its stored prefix, as it would after a power cut."""
    image = tmp_path / "card.img"
    reqs = [(f"s{i}", [BOS] + [10 + i] * 12, 5) for i in range(6)]
    sched = BatchScheduler(model, _device(8, image=image, regions=64), chunk=5)
    outs = sched.run(reqs)
    assert all(e["exported"] for e in sched.events)
    later = BatchScheduler(model, _device(8, image=image), chunk=5)
    nxt = [(sid, list(toks) + out + [33, 34], 4) for (sid, toks, _), out in zip(reqs, outs)]
    got = later.run([(f"n{i}", t, n) for i, (_, t, n) in enumerate(nxt)])
    assert {e["path"] for e in later.events} == {"prefix"}
    # the turn's snapshot: its prompt and the tokens it fed back (the last one is pending)
    assert [e["reused"] for e in later.events] == [len(t) - 3 for _, t, _ in nxt]
    want = plain_run(model, reqs + [(sid, [33, 34], 4) for sid, *_ in reqs],
                     lambda: FixedBackend(SMALL), chunk=5)
    assert got == want[len(reqs):]


def test_device_without_a_hot_tier_holds_one_conversation(model):
    dev = SoftwareDevice(SMALL, attention=FixedBackend(SMALL))
    assert dev.resident_limit == 1
    sched = BatchScheduler(model, dev, chunk=5)
    reqs = _script(4, n=10, sessions=3)
    assert sched.run(reqs) == plain_run(model, reqs, lambda: FixedBackend(SMALL), chunk=5)
    assert sched.max_batch == 1
    with pytest.raises(ValueError, match="hot_bytes"):
        SoftwareDevice(SMALL, hot_bytes=0)
    with pytest.raises(ValueError, match="context 1"):
        dev.context(1)
    other = _device(2)
    with pytest.raises(ValueError, match="own contexts"):
        dev.bind(other.context(1))
    assert np.isfinite(other.hot_bytes) and other.hot_bytes >= 2 * SLOT - 64
