"""One record format everywhere: a card image written by the simulated board (the Verilator
top of ``tests/system/test_system.py``: ``TRAINED_DEMO_CONFIG``, 2 regions) is served by the
software device, and an image written by the software device is served by the board after its own
power-on recovery; a record copied from a software device into the board
(``FpgaDevice.write_record``) hits there with the same rings. Both devices' ``holdings`` agree on
the same card."""

import numpy as np
import pytest
from conftest import requires_verilator

from ringkv.defs.config import TRAINED_DEMO_CONFIG
from ringkv.defs.record import SECTOR, RecordLayout
from ringkv.host.model.transformer import BOS, FixedBackend, Model
from ringkv.host.record import RecordError, read_record_bytes

CONFIG = TRAINED_DEMO_CONFIG
LAY = RecordLayout(CONFIG)
SPAN = LAY.sectors_per_region * SECTOR

pytestmark = requires_verilator


def _top_kwargs():
    from ringkv.sim.system_demo import LANES, MACS, REGIONS
    return {"regions": REGIONS, "lanes": LANES, "macs": MACS}


@pytest.fixture(scope="module")
def model():
    return Model(CONFIG, hidden=64, ffn=128, seed=0)


def golden():
    from ringkv.sim.system_demo import LANES
    return FixedBackend(CONFIG, lanes=LANES)


def tokens_of(seed, n):
    rng = np.random.default_rng(seed)
    return [BOS] + [int(t) for t in rng.integers(1, 256, size=n - 1)]


def compute(dev, tokens, model):
    dev.attention.reset()
    dev.write_tokens(tokens)
    model.prefill(list(tokens), 0, dev.attention, 16)


def valid(rings, meta):
    """Per ring ``(count, head)`` and its valid slots' K/V, oldest first (signed values)."""
    c = CONFIG
    out = []
    for ring, (count, head) in enumerate(meta):
        layer, h = divmod(ring, c.kv_heads)
        v = min(int(count), c.window)
        slots = [(int(head) - v + 1 + t) % c.window for t in range(v)]
        out.append((int(count), int(head), np.asarray(rings)[layer, h][:, slots].tolist()))
    return out


def fixed_valid(backend):
    rings, count, head = backend.snapshot()
    return valid(rings, list(zip(count.tolist(), head.tolist(), strict=True)))


def start(image, tmp_path, name):
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    from ringkv.sim.harness import SimDevice
    sim = SimDevice(image, config=CONFIG, prebuilt=True, log=tmp_path / f"sim-{name}.log",
                    **_top_kwargs())
    return sim, FpgaDevice(Link(sim.url, timeout=60), CONFIG)


def software(image=None, **kw):
    from ringkv.host.device.software import SoftwareDevice
    return SoftwareDevice(CONFIG, attention=golden(), image=image, **kw)


def test_board_image_served_by_the_software_device(model, tmp_path):
    """The board computes and exports a checkpoint; the software device opened on its card
    lists the same record (both devices' holdings) and hits it with the golden rings."""
    image = tmp_path / "board.img"
    image.write_bytes(b"\xff" * (2 * SPAN))              # an erased card
    toks = tokens_of(1, 45)                               # beyond the window (32)
    ref = golden()
    model.prefill(toks, 0, ref, 16)
    sim, fpga = start(image, tmp_path, "board")
    with sim:
        fpga.wait_ready()
        fpga.check_config()
        compute(fpga, toks, model)
        key = fpga.export(toks, checkpoint=True)[0]
        board_held = fpga.holdings()
        record = fpga.read_record(key)
    card = image.read_bytes()
    assert record == read_record_bytes(CONFIG, lambda lba, n: card[lba * SECTOR:
                                                                  (lba + n) * SECTOR], 0)
    dev = software(image)
    assert dev.regions == 2 and dev.next_seq == 2
    assert dev.holdings() == board_held
    assert [(h.key, h.kind, h.region, h.tokens, h.commit_seq) for h in board_held] == \
        [(key, "checkpoint", 0, tuple(toks), 1)]
    r = dev.query(toks)
    assert r.hit and (r.count, r.prefix_hash) == key and dev.tokens == toks
    assert fixed_valid(dev.attention) == fixed_valid(ref)
    assert dev.read_record(key) == record


def test_software_image_served_by_the_board(model, tmp_path):
    """The software device exports a turn snapshot into a new card image; the board's power-on
    recovery finds it (its holdings equal the software device's), its ``QUERY`` hits with the
    same rings. Then a record of another software device is copied into the board
    (``write_record``): it hits there too, with the same rings and the same payload bytes."""
    image = tmp_path / "soft.img"
    toks, other = tokens_of(2, 40), tokens_of(3, 50)          # both beyond the window (32)
    dev = software(image, regions=2)
    compute(dev, toks, model)
    key = dev.export(toks)[0]
    want = fixed_valid(dev.attention)
    soft_held = dev.holdings()
    dev.close()
    assert image.stat().st_size == 2 * SPAN
    donor = software()
    compute(donor, other, model)
    other_key = donor.export(other, checkpoint=True)[0]
    copied = donor.read_record(other_key)
    sim, fpga = start(image, tmp_path, "soft")
    with sim:
        st = fpga.wait_ready()
        assert (st["live"], st["freed"], st["next_seq"]) == (1, 0, 2)
        assert fpga.holdings() == soft_held
        fpga.reset()
        r = fpga.query(toks)
        assert r.hit and (r.count, r.prefix_hash) == key
        assert valid(*fpga.snapshot()) == want
        damaged = bytearray(copied)
        damaged[-SECTOR] ^= 1                                     # a K/V byte
        with pytest.raises(RecordError, match="payload CRC mismatch"):
            fpga.write_record(bytes(damaged))                     # refused before any request
        assert fpga.write_record(copied) == other_key
        fpga.reset()
        assert fpga.query(other).hit
        assert valid(*fpga.snapshot()) == fixed_valid(donor.attention)
        assert fpga.read_record(other_key)[SECTOR:] == copied[SECTOR:]
        held = {h.key: h for h in fpga.holdings()}
        assert set(held) == {key, other_key} and held[other_key].kind == "checkpoint"
        assert held[other_key].commit_seq == 2


@pytest.mark.slow
def test_a_conversation_alternates_between_the_software_device_and_the_board(model,
                                                                            tmp_path):
    """One card, the scheduler's session kept across devices: a conversation goes on for
    rounds of two requests on the software device, then on the board started on its card, then
    on the software device again, ... (each device recovering the card the other left); after
    every switch it resumes by import (a hit of the other device's record), and every
    generated token equals the run without reuse."""
    from ringkv.host.scheduler import Scheduler, plain_run
    image = tmp_path / "card.img"
    rng = np.random.default_rng(5)
    rounds = [[("u", ([BOS] if r == i == 0 else []) + [int(t) for t in rng.integers(
        1, 256, size=int(rng.integers(4, 20)))], 4) for i in range(2)] for r in range(4)]
    sessions, outs, paths = None, [], []
    for r, reqs in enumerate(rounds):
        if r % 2 == 0:
            dev, sim = software(image, regions=2 if r == 0 else None), None
        else:
            sim, dev = start(image, tmp_path, f"round{r}")
            dev.wait_ready()
        try:
            sched = Scheduler(model, dev, chunk=16, sessions=sessions, keep_turns=1)
            for req in reqs:
                outs.append(sched.request(*req))
                paths.append(sched.events[-1]["path"])
            sessions = sched.sessions
            assert [h.key for h in dev.holdings()] == [sessions["u"].key]
        finally:
            if sim is not None:
                sim.stop()
            else:
                dev.close()
    plan = [req for reqs in rounds for req in reqs]
    assert outs == plain_run(model, plan, golden, chunk=16)
    assert paths == ["first", "continue"] + ["hit", "continue"] * (len(rounds) - 1)
    assert len(sessions["u"].tokens) > 2 * CONFIG.window


@pytest.mark.slow
def test_store_decisions_equal_the_boards(model, tmp_path):
    """The same requests on the software device and on the board, a store of 2 regions for 3
    conversations (evictions, re-exports, checkpoints): after every request both hold the same
    records in the same regions, in the same LRU order, with the same commits, and the
    generated tokens are equal."""
    from ringkv.host.scheduler import Scheduler
    rng = np.random.default_rng(8)
    system = [int(t) for t in rng.integers(1, 256, size=12)]
    reqs = []
    for r in range(3):
        for sid in ("a", "b", "c"):
            toks = [int(t) for t in rng.integers(1, 256, size=int(rng.integers(3, 9)))]
            opts = {}
            if r == 0:
                toks = [BOS] + system + toks
                opts["checkpoints"] = (1 + len(system),)
            reqs.append((sid, toks, 3, opts))
    soft = software(tmp_path / "soft.img", regions=2)
    image = tmp_path / "board.img"
    sim, fpga = start(image, tmp_path, "twin")
    with sim:
        fpga.wait_ready()
        a = Scheduler(model, soft, chunk=16, keep_turns=1)
        b = Scheduler(model, fpga, chunk=16, keep_turns=1)
        for sid, toks, n, opts in reqs:
            assert a.request(sid, toks, n, **opts) == b.request(sid, toks, n, **opts)
            ea, eb = a.events[-1], b.events[-1]
            assert (ea["path"], ea["reused"]) == (eb["path"], eb["reused"])
            assert soft.holdings(tokens=False) == fpga.holdings(tokens=False)
        assert soft.counters["evictions"] > 0
