"""The scheduler on the software device: paths, snapshots, identical tokens."""

import random

import pytest

from ringkv.defs.config import RingKVConfig
from ringkv.host.device.interface import snapshot_bytes
from ringkv.host.device.software import SoftwareDevice
from ringkv.host.model.transformer import BOS, FixedBackend, Float64Backend, Model
from ringkv.host.scheduler import Scheduler, plain_run

SMALL = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=16)


@pytest.fixture(scope="module")
def model():
    return Model(SMALL, hidden=64, ffn=96, seed=11)


def _script(seed, sessions=3, turns=10):
    rng = random.Random(seed)
    reqs = []
    for _ in range(turns):
        sid = f"s{rng.randrange(sessions)}"
        first = not any(r[0] == sid for r in reqs)
        prompt = ([BOS] if first else []) + \
            [rng.randrange(256) for _ in range(rng.randrange(1, 12))]
        reqs.append((sid, prompt, rng.randrange(0, 6)))
    return reqs


def _run(model, device, reqs, **kw):
    sched = Scheduler(model, device, chunk=5, **kw)
    return sched, [sched.request(sid, toks, n) for sid, toks, n in reqs]


@pytest.mark.parametrize("export_after_inference", [True, False])
def test_interleaved_sessions_equal_plain_run(model, export_after_inference):
    reqs = _script(1, turns=14)
    sched, outs = _run(model, SoftwareDevice(SMALL), reqs,
                       export_after_inference=export_after_inference)
    assert outs == plain_run(model, reqs, lambda: Float64Backend(SMALL), chunk=5)
    paths = [e["path"] for e in sched.events]
    assert "hit" in paths and "miss" not in paths and paths[0] == "first"
    for e in sched.events:
        if e["path"] == "hit":
            assert e["imported_bytes"] == snapshot_bytes(SMALL, e["before"])


def test_paths_resume_and_eviction(model):
    """The scheduler's paths when a session keeps one turn snapshot (``keep_turns=1``). An
    export writes the new snapshot before it retires the one it replaces (as the board's
    ``EXPORT`` does, so a power cut in between keeps the old one), so it needs a free place
    for one more record:
    a store of three holds both sessions; in a store of two, a's export evicts b's snapshot."""
    dev = SoftwareDevice(SMALL, capacity=1)
    sched = Scheduler(model, dev, chunk=4, keep_turns=1)
    reqs = [("a", [BOS, 1, 2, 3], 3), ("a", [4, 5], 2), ("b", [BOS, 9, 9], 2), ("a", [6], 2),
            ("b", [7], 2)]
    outs = [sched.request(*r) for r in reqs]
    assert [e["path"] for e in sched.events] == ["first", "continue", "first", "miss", "miss"]
    assert sched.events[3]["reason"] == "no record"            # b's export evicted a's
    assert sched.events[3]["recomputed"] == sched.events[1]["after"]
    assert dev.stats()["evictions"] == 4
    assert outs == plain_run(model, reqs, lambda: Float64Backend(SMALL), chunk=4)
    # with room for both: the same script resumes by import
    dev2 = SoftwareDevice(SMALL, capacity=3)
    sched2 = Scheduler(model, dev2, chunk=4, keep_turns=1)
    assert [sched2.request(*r) for r in reqs] == outs
    assert [e["path"] for e in sched2.events] == ["first", "continue", "first", "hit", "hit"]
    assert dev2.stats()["evictions"] == 0 and dev2.stats()["records"] == 2
    dev3 = SoftwareDevice(SMALL, capacity=2)
    sched3 = Scheduler(model, dev3, chunk=4, keep_turns=1)
    assert [sched3.request(*r) for r in reqs] == outs
    assert [e["path"] for e in sched3.events] == ["first", "continue", "first", "hit", "miss"]
    assert dev3.stats()["evictions"] == 1


def test_long_conversation_beyond_window(model):
    """Sessions several times longer than W; switching costs one W-sized import."""
    rng = random.Random(3)
    reqs = []
    for turn in range(8):
        for sid in ("x", "y"):
            reqs.append((sid, ([BOS] if turn == 0 else []) +
                         [rng.randrange(256) for _ in range(9)], 4))
    sched, outs = _run(model, SoftwareDevice(SMALL), reqs)
    assert outs == plain_run(model, reqs, lambda: Float64Backend(SMALL), chunk=5)
    last = sched.events[-1]
    assert last["before"] > 5 * SMALL.window and last["path"] == "hit"
    assert last["imported_bytes"] == snapshot_bytes(SMALL, last["before"])
    assert snapshot_bytes(SMALL, 10 * SMALL.window) - snapshot_bytes(SMALL, SMALL.window) == \
        9 * SMALL.window * 2                           # only the token list grows


def test_power_cycle_with_image(model, tmp_path):
    """The store is a card image: a new device on the same file recovers its directory from
    the records' headers (the board's power-on rule) and resumes by import."""
    image = tmp_path / "store.img"
    reqs = [("a", [BOS, 5, 6, 7, 8], 3), ("b", [BOS, 1], 2), ("a", [9], 3)]
    fixed = lambda: FixedBackend(SMALL, lanes=2)             # noqa: E731
    dev = SoftwareDevice(SMALL, attention=fixed(), image=image, regions=4)
    sched = Scheduler(model, dev, chunk=4)
    outs = [sched.request(*r) for r in reqs[:2]]
    dev.close()
    # power cycle: a new device on the same image, the host's session table kept
    dev2 = SoftwareDevice(SMALL, attention=fixed(), image=image)
    assert dev2.regions == 4 and dev2.recovery.live == 2 and dev2.next_seq == 3
    assert {h.key for h in dev2.holdings()} == {s.key for s in sched.sessions.values()}
    sched2 = Scheduler(model, dev2, chunk=4, sessions=sched.sessions)
    outs.append(sched2.request(*reqs[2]))
    assert sched2.events[0]["path"] == "hit"
    assert outs == plain_run(model, reqs, fixed, chunk=4)


def test_never_a_wrong_hit(model):
    """Stored tokens that differ, or a foreign config: a miss and a recompute, same tokens."""
    dev = SoftwareDevice(SMALL)
    sched = Scheduler(model, dev, chunk=4)
    reqs = [("a", [BOS, 1, 2], 2), ("b", [BOS, 3], 2), ("a", [4], 2), ("b", [5], 2)]
    outs = [sched.request(*r) for r in reqs[:2]]
    key_a = sched.sessions["a"].key
    rec = dev.records[key_a]
    rec.tokens = (BOS, 1, 99) + rec.tokens[3:]                 # same key, other tokens
    key_b = sched.sessions["b"].key
    dev.records[key_b].digest = b"\0" * 32
    outs += [sched.request(*r) for r in reqs[2:]]
    assert [(e["path"], e["reason"]) for e in sched.events[2:]] == \
        [("miss", "tokens differ"), ("miss", "foreign config")]
    assert outs == plain_run(model, reqs, lambda: Float64Backend(SMALL), chunk=4)


def test_fixed_point_device(model):
    """The FPGA core's bit-exact model as the rings: switching is exact (bit-equal import)."""
    reqs = _script(5, sessions=2, turns=6)
    dev = SoftwareDevice(SMALL, attention=FixedBackend(SMALL, lanes=2), capacity=8)
    _, outs = _run(model, dev, reqs)
    assert outs == plain_run(model, reqs, lambda: FixedBackend(SMALL, lanes=2), chunk=5)


def test_parameter_errors(model):
    with pytest.raises(ValueError, match=r"^capacity must be a positive number of records, "
                                         r"not 0$"):
        SoftwareDevice(SMALL, capacity=0)
    with pytest.raises(ValueError, match=r"^chunk must be positive, not 0$"):
        Scheduler(model, SoftwareDevice(SMALL), chunk=0)
    with pytest.raises(ValueError, match=r"^import needs the result of a hit$"):
        dev = SoftwareDevice(SMALL)
        dev.import_(dev.query([1, 2]))
