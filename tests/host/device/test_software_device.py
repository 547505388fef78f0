"""The software device's card store: the gateware's record format and region layout, the golden
directory's policy, the board's power-on recovery at opening, the write order across a crash,
import checks (a miss, never a wrong answer), images that are not card images, holdings and
records copied between devices."""

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from softdev_helpers import (
    LAY,
    SMALL,
    SPAN,
    compute,
    device,
    fixed,
    stored,
    tokens_of,
    valid_state,
)

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import SECTOR, RecordKind, RecordStatus
from ringkv.host.device.software import SoftwareDevice
from ringkv.host.errors import ConfigError, NotACardImage, StorageError
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.host.model.transformer import BOS, Float64Backend, Model
from ringkv.host.record import (
    RecordError,
    crc32,
    encode_record,
    plan_recovery,
    read_record_bytes,
    scan_headers,
)
from ringkv.host.scheduler import Scheduler, plain_run


@pytest.fixture(scope="module")
def model():
    return Model(SMALL, hidden=64, ffn=96, seed=11)


def region_bytes(image, region):
    data = image.read_bytes()
    return data[region * SPAN:(region + 1) * SPAN]


def test_records_are_the_golden_encoders_bytes(model, tmp_path):
    """An export writes exactly what the gateware's DMA writes (the golden encoder), in the
    region the golden directory allocates, with the next commit sequence number."""
    image = tmp_path / "card.img"
    dev = device(image=image, regions=4)
    assert image.stat().st_size == 4 * SPAN and dev.next_seq == 1
    toks = tokens_of(1, 21)
    key = stored(dev, toks, model, checkpoint=True)
    rings, _, head = dev.attention.snapshot()
    want = bytearray(SPAN)
    for off, data in encode_record(SMALL, toks, rings, count=21, ring_head=int(head[0]),
                                   prefix_hash=key[1], commit_seq=1,
                                   kind=RecordKind.CHECKPOINT):
        want[off * SECTOR:off * SECTOR + len(data)] = data
    assert region_bytes(image, 0) == bytes(want)
    [h] = dev.holdings()
    assert (h.key, h.kind, h.region, h.tokens, h.commit_seq) == (key, "checkpoint", 0,
                                                                 tuple(toks), 1)
    assert dev.next_seq == 2 and dev.stats()["checkpoint_records"] == 1


def test_directory_policy_is_the_golden_directorys(model):
    """Regions from FIFO A, then (A spent) from FIFO B; the least recently used record is
    evicted when the store is full (a query hit is a use); a re-export writes a new region
    and frees the old one after."""
    dev = device(regions=4)
    keys = [stored(dev, tokens_of(s, 6 + s), model) for s in range(4)]
    assert [h.region for h in dev.holdings()] == [0, 1, 2, 3]
    assert dev.query(tokens_of(0, 6)).hit                      # record 0 used
    k4 = stored(dev, tokens_of(4, 10), model)                  # evicts record 1 (LRU)
    by_key = {h.key: h.region for h in dev.holdings()}
    assert keys[1] not in by_key and by_key[k4] == 1 and dev.counters["evictions"] == 1
    assert [h.key for h in dev.holdings()] == [keys[2], keys[3], keys[0], k4]   # LRU first
    # the same decisions as the golden directory driven with the gateware's commands
    g = GoldenDirectory(buckets=2, links=4, regions=4)
    now = 0

    def cmd(op, **kw):
        nonlocal now
        now += 1
        return g.command({"op": op, "now": now, **kw})
    from ringkv.defs.directory import Op
    for k in keys:
        cmd(Op.INSERT, count=k[0], hash=k[1], evict=1)
    cmd(Op.LOOKUP, count=keys[0][0], hash=keys[0][1])
    victim = g.lru_victim(now + 1)
    assert (g.live[victim]["count"], g.live[victim]["hash"]) == keys[1]
    # a re-export of record 2's key is written before the old record is retired: into a full
    # store it evicts the least recently used other record (record 3), as on the board
    compute(dev, tokens_of(2, 8), model)
    dev.export(tokens_of(2, 8))
    assert [(h.key, h.region) for h in dev.holdings()] == [(keys[0], 0), (k4, 1),
                                                           (keys[2], 3)]
    assert dev.counters["evictions"] == 2


def test_opening_runs_the_boards_recovery(model, tmp_path):
    """A card with an older and a newer commit of one key, a torn header, a foreign record and
    a corrupt payload: the directory after opening is the golden ``plan_recovery``'s (newest
    commit per key, torn and foreign freed), the next commit follows the newest valid one; the
    corrupt payload is found at import (a miss that frees it), never a wrong answer."""
    image = tmp_path / "card.img"
    src = device()
    card = bytearray(8 * SPAN)
    toks_a, toks_b = tokens_of(5, 12), tokens_of(6, 30)

    def put(region, toks, seq, config=SMALL):
        key = stored(src, toks, model)
        rings, _, head = src.attention.snapshot()
        for off, data in encode_record(config, toks, rings, count=len(toks),
                                       ring_head=int(head[0]), prefix_hash=key[1],
                                       commit_seq=seq):
            at = region * SPAN + off * SECTOR
            card[at:at + len(data)] = data
        return key
    key_a = put(1, toks_a, 7)
    put(3, toks_a, 9)                                  # the same key, newer: wins
    key_b = put(4, toks_b, 8)
    put(5, tokens_of(7, 9), 20)
    card[5 * SPAN + 13:5 * SPAN + SECTOR] = b"\xff" * (SECTOR - 13)    # torn header
    put(6, tokens_of(8, 9), 30)
    card[6 * SPAN + 88] ^= 1                           # window field: a foreign config
    card[6 * SPAN + 508:6 * SPAN + 512] = crc32(card[6 * SPAN:6 * SPAN + 508]).to_bytes(
        4, "little")
    card[4 * SPAN + LAY.kv_sector * SECTOR + 3] ^= 0x40  # b's K/V: payload CRC wrong
    image.write_bytes(card)
    dev = device(image=image)
    plan = plan_recovery(scan_headers(SMALL, lambda lba, n: bytes(
        card[lba * SECTOR:(lba + n) * SECTOR]), 8), links=8)
    assert dev.recovery == plan and dev.regions == 8
    assert [(h.count, h.prefix_hash, h.region, h.commit_seq) for h in
            sorted(dev.holdings(), key=lambda h: h.region)] == [
        (c, h, r, s) for c, h, r, s in plan.inserts] == [(*key_a, 3, 9), (*key_b, 4, 8)]
    assert sorted(plan.reasons) == [1, 5, 6] and dev.next_seq == 10
    assert "FOREIGN_CONFIG" in plan.reasons[6] and "superseded" in plan.reasons[1]
    r = dev.query(toks_a)
    assert r.hit and dev.tokens == toks_a
    compute(src, toks_a, model)
    assert valid_state(dev) == valid_state(src)
    r = dev.query(toks_b)
    assert (r.hit, r.reason) == (False, "corrupt record")
    assert dev.attention.n == 0                        # the rings were emptied, not stale
    assert key_b not in {h.key for h in dev.holdings()}    # deleted: its region is free
    assert dev.query(toks_a).hit                       # the rings hold a's state again
    assert dev.export(toks_a)[0] == key_a and dev.next_seq == 11
    assert [(h.key, h.commit_seq) for h in dev.holdings()] == [(key_a, 10)]


def test_crash_between_payload_and_header_keeps_the_previous_snapshot(model, tmp_path):
    """The export of a session's next snapshot dies after its payload, before its header:
    a new device on the image finds the previous snapshot (hit, its state), the new one is a
    miss, and the next export's commit is newer than every valid one."""
    image = tmp_path / "card.img"
    toks = tokens_of(9, 40)
    dev = device(image=image, regions=4)
    stored(dev, toks[:20], model)
    compute(dev, toks, model)
    writes = []
    real = dev.card.write

    def dying(lba, data):
        if lba % LAY.sectors_per_region == 0:         # the header sector: power cut
            raise OSError("power cut")
        writes.append(lba)
        real(lba, data)
    dev.card.write = dying
    with pytest.raises(OSError, match="power cut"):
        dev.export(toks)
    assert writes == [LAY.region_lba(1) + 1, LAY.region_lba(1) + LAY.kv_sector]
    dev.close()
    again = device(image=image)
    assert again.recovery.live == 1 and again.next_seq == 2
    assert again.stats()["recoveries"] == 1 and dev.stats()["recoveries"] == 1
    assert again.query(toks).reason == "no record"
    assert again.query(toks[:20]).hit
    compute(dev, toks[:20], model)
    assert valid_state(again) == valid_state(dev)
    compute(again, toks, model)
    assert again.export(toks)[0] == again.key_of(toks) and again.next_seq == 3


def test_killed_process_between_payload_and_header(model, tmp_path):
    """The same with a real process death (``os._exit`` between the payload's and the
    header's write: no cleanup, no flush of anything the process still held)."""
    image = tmp_path / "card.img"
    script = textwrap.dedent(f"""
        import os
        from ringkv.defs.config import RingKVConfig
        from ringkv.host.model.transformer import FixedBackend, Model
        from ringkv.host.device.software import SoftwareDevice
        c = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=16,
                         max_tokens=256)
        model = Model(c, hidden=64, ffn=96, seed=11)
        dev = SoftwareDevice(c, attention=FixedBackend(c, lanes=2), image={str(image)!r},
                             regions=4)
        toks = {tokens_of(10, 30)!r}
        for n in (10, 30):
            dev.attention.reset()
            dev.write_tokens(toks[:n])
            model.prefill(toks[:n], 0, dev.attention, 5)
            if n == 30:
                real = dev.card.write
                def write(lba, data, real=real):
                    if lba % {LAY.sectors_per_region} == 0:
                        os._exit(9)
                    real(lba, data)
                dev.card.write = write
            dev.export(toks[:n])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 9, done.stderr
    toks = tokens_of(10, 30)
    dev = device(image=image)
    assert [h.key for h in dev.holdings()] == [dev.key_of(toks[:10])] and dev.next_seq == 2
    assert not dev.query(toks).hit and dev.query(toks[:10]).hit
    assert region_bytes(image, 1)[SECTOR:2 * SECTOR] != bytes(SECTOR)   # the payload landed


def test_images_that_are_not_card_images_are_refused_untouched(tmp_path):
    """An older version's pickle store, a file of other bytes, an image of another
    configuration, a float backend asked for an image: a clear error, the file unchanged."""
    cases = {
        "old.pkl": (pickle.dumps({(3, 5): {"tokens": (1, 2, 3)}}), NotACardImage,
                    r"older RingKV version \(a Python pickle\); it is not read"),
        "photo.jpg": (b"\xff\xd8\xff\xe0" + os.urandom(3 * SPAN), NotACardImage,
                      "not a card image"),
        "odd.img": (b"\0" * 700, NotACardImage, "not a whole number of 512-byte sectors"),
    }
    other = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=32,
                         max_tokens=256)
    card = bytearray(2 * SPAN)
    for off, data in encode_record(other, [1, 2, 3], np.zeros((2, 2, 2, 32, 16), int),
                                   count=3, ring_head=2, prefix_hash=5, commit_seq=1):
        card[off * SECTOR:off * SECTOR + len(data)] = data
    cases["foreign.img"] = (bytes(card), ConfigError, r"another configuration.*window: 32 != 16")
    # a short file of other bytes, whole sectors: not extended to the store's size either
    cases["short.bin"] = (os.urandom(3 * SECTOR), NotACardImage, "not a card image")
    for name, (content, error, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(error, match=message):
            device(image=path)
        assert path.read_bytes() == content, name
    with pytest.raises(ConfigError, match="fixed-point core's integer K/V") as e:
        SoftwareDevice(SMALL, attention=Float64Backend(SMALL), image=tmp_path / "new.img")
    assert "--backend fixed" in e.value.hint and not (tmp_path / "new.img").exists()
    with pytest.raises(ValueError, match="regions must be a power of two between 2 and 32768"):
        device(regions=3)


def test_blank_cards_and_a_truncated_image_are_accepted(model, tmp_path):
    """An erased (0xFF) or zeroed card is empty; an image cut short inside its last region
    (an interrupted copy) keeps the whole records and is extended with empty sectors."""
    for byte in (0x00, 0xFF):
        path = tmp_path / f"blank{byte}.img"
        path.write_bytes(bytes([byte]) * (2 * SPAN))
        dev = device(image=path)
        assert (dev.regions, dev.holdings(), dev.next_seq) == (2, [], 1)
        dev.close()
    path = tmp_path / "cut.img"
    dev = device(image=path, regions=2)
    toks = tokens_of(11, 9)
    stored(dev, toks, model)
    stored(dev, tokens_of(12, 9), model)
    dev.close()
    with open(path, "r+b") as f:
        f.truncate(SPAN + 3 * SECTOR)               # region 1's K/V area cut off
    dev = device(image=path)
    assert dev.regions == 2 and path.stat().st_size == 2 * SPAN
    assert dev.query(toks).hit and dev.query(tokens_of(12, 9)).reason == "corrupt record"


def test_records_copied_between_devices(model, tmp_path):
    """``read_record`` gives the verified record (the golden ``read_record_bytes``),
    ``write_record`` stores it on another device under that device's next commit: it hits
    there with the same state, and survives a power cycle. Damaged or foreign bytes are
    refused before anything is written."""
    a = device()
    toks = tokens_of(13, 50)
    key = stored(a, toks, model, checkpoint=True)
    data = a.read_record(key)
    assert len(data) == LAY.record_bytes(50)
    assert data == read_record_bytes(SMALL, a.card.read, a.holdings()[0].region)
    image = tmp_path / "b.img"
    b = device(path=image, regions=4)
    assert b.image == image
    stored(b, tokens_of(14, 5), model)
    assert b.write_record(data) == key and b.next_seq == 3
    [h] = [h for h in b.holdings() if h.key == key]
    assert (h.kind, h.commit_seq, h.tokens) == ("checkpoint", 2, tuple(toks))
    b.close()
    b = device(image=image)
    assert b.query(toks).hit
    assert valid_state(b) == valid_state(a)
    assert b.read_record(key)[SECTOR:] == data[SECTOR:]    # the payload, byte for byte
    bad = bytearray(data)
    bad[-1] ^= 1
    for damaged, status in ((bytes(bad), RecordStatus.BAD_PAYLOAD_CRC),
                            (data[:-SECTOR], RecordStatus.BAD_PAYLOAD_CRC),
                            (b"\0" * SECTOR, RecordStatus.EMPTY)):
        before = image.read_bytes()
        with pytest.raises(RecordError) as e:
            b.write_record(damaged)
        assert e.value.status is status and isinstance(e.value, StorageError)
        assert image.read_bytes() == before
    with pytest.raises(StorageError, match="no record of 7 tokens"):
        b.read_record((7, 1))
    with pytest.raises(StorageError, match="keeps float rings in memory"):
        SoftwareDevice(SMALL).read_record(key)


def test_scheduler_on_an_image_equals_plain_run_across_restarts(model, tmp_path):
    """Conversations on a small card (evictions), the device restarted between requests: every
    token equals the run without reuse, and the restarted device holds what it held (and, as
    the board does, the records deleted since whose regions were not reused yet: valid
    snapshots of their tokens)."""
    image = tmp_path / "card.img"
    rng = np.random.default_rng(3)
    reqs = []
    for i in range(12):
        sid = f"s{i % 3}"
        first = i < 3
        reqs.append((sid, ([BOS] if first else []) + [int(t) for t in rng.integers(
            1, 256, size=int(rng.integers(2, 12)))], int(rng.integers(1, 4))))
    sessions, outs, held, paths = None, [], [], []
    for sid, toks, n in reqs:
        dev = device(image=image, regions=4)
        now = dev.holdings()
        assert set(held) <= {h.key for h in now}
        assert all(dev.key_of(h.tokens) == h.key for h in now)
        sched = Scheduler(model, dev, chunk=5, sessions=sessions)
        outs.append(sched.request(sid, toks, n))
        paths.append(sched.events[-1]["path"])
        sessions = sched.sessions
        held = [h.key for h in dev.holdings()]
        dev.close()
    assert outs == plain_run(model, reqs, fixed, chunk=5)
    assert paths.count("hit") >= 4 and paths[:3] == ["first"] * 3
