"""Recovery after power cuts takes nothing from a record that fails its checks.

Golden level (the scan and rebuild of ``host/record/scan.py`` with the golden directory standing in
for the device): a power cut at every byte of the header sector on an erased (0xFF) and on a
zeroed card, then rebuild, a new export and queries of the old and new snapshots; a valid
record at the end of the sequence; two records of one key on both sides of the wrap; regions
of random bytes with a valid magic and version. The DMA's VERIFY (the gateware's record checks,
Amaranth simulator) agrees with the golden scan on the same torn and random headers. The same
cases on the Verilator top end to end: ``tests/system/test_recovery_system.py``.
"""

import random
from collections import Counter

import numpy as np
import pytest
from amaranth.sim import Simulator

from ringkv.defs.config import RingKVConfig
from ringkv.defs.directory import Op as DirOp
from ringkv.defs.directory import Status as DirStatus
from ringkv.defs.protocol import REQUESTS, Op
from ringkv.defs.record import (
    SECTOR,
    SEQ_MOD,
    RecordLayout,
    RecordStatus,
    seq_newer,
    seq_next,
)
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.host.record import (
    RecordInfo,
    encode_record,
    format_listing,
    fsck_report,
    import_record,
    main,
    plan_rebuild,
    rebuild,
    scan_image,
)
from ringkv.sim.storage_faults import (
    MEDIA,
    RANDOM_KINDS,
    TORN_OFFSETS,
    random_header,
    torn_header,
)

# background testbenches (the storage server) are abandoned when the body ends
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

CONFIG = RingKVConfig(layers=1, q_heads=2, kv_heads=1, head_dim=4, window=4, token_width=8,
                      max_tokens=40)
LAY = RecordLayout(CONFIG)
REGIONS = 4
SPAN = LAY.sectors_per_region * SECTOR
TOP = SEQ_MOD - 1


class Card:
    """A card image of ``REGIONS`` regions, unwritten bytes reading ``medium``."""

    def __init__(self, medium=0x00):
        self.data = bytearray([medium]) * (REGIONS * SPAN)
        self.reads = []

    def read(self, lba, n):
        self.reads.append((lba, n))
        return bytes(self.data[lba * SECTOR:(lba + n) * SECTOR])

    def write(self, region, writes):
        for off, data in writes:
            at = region * SPAN + off * SECTOR
            self.data[at:at + len(data)] = data

    def header(self, region):
        return bytes(self.data[region * SPAN:region * SPAN + SECTOR])

    def set_header(self, region, data):
        self.data[region * SPAN:region * SPAN + SECTOR] = data

    def scan(self):
        return scan_image(CONFIG, self.read, REGIONS)


def snapshot(rng, count):
    tokens = [rng.randrange(256) for _ in range(count)]
    rings = np.frombuffer(rng.randbytes(CONFIG.window * CONFIG.head_dim * 2),
                          dtype=np.uint8).reshape(1, 1, 2, CONFIG.window, CONFIG.head_dim).copy()
    return tokens, rings, (count - 1) % CONFIG.window


def record(snap, key_hash, seq):
    tokens, rings, head = snap
    return encode_record(CONFIG, tokens, rings, count=len(tokens), ring_head=head,
                         prefix_hash=key_hash, commit_seq=seq)


def valid(rings, count, head):
    """The valid slots of ``rings`` (what an import restores), oldest first."""
    v = min(count, CONFIG.window)
    slots = [(head - v + 1 + t) % CONFIG.window for t in range(v)]
    return rings[:, :, :, slots, :]


def query(card, directory, snap, key_hash):
    """The device's QUERY in golden form: directory lookup, then the verified import.
    Returns the record's header (a hit) or None (a miss)."""
    tokens, rings, head = snap
    r = directory.command({"op": DirOp.LOOKUP, "count": len(tokens), "hash": key_hash,
                           "now": 9})
    if r["status"] != DirStatus.OK.value:
        return None
    got = np.zeros_like(rings)
    status, h, meta = import_record(CONFIG, card.read, r["region"], count=len(tokens),
                                    prefix_hash=key_hash, session_tokens=tokens, rings=got)
    if status is not RecordStatus.OK:
        return None
    assert meta == (len(tokens), head)
    assert np.array_equal(valid(got, len(tokens), head), valid(rings, len(tokens), head))
    return h


def recover(card):
    """Power back on: scan, rebuild (never raising), the directory re-filled as the device's
    DIR_CLEAR + DIR_INSERT(existing) would be. Returns (plan, directory)."""
    plan = plan_rebuild(card.scan())
    # the DIR_CLEAR request the host sends: next_seq must fit its 4 bytes
    REQUESTS[Op.DIR_CLEAR].pack(next_seq=plan.next_seq)
    assert 0 <= plan.next_seq < SEQ_MOD
    directory = GoldenDirectory(buckets=8, links=REGIONS, regions=REGIONS)
    for count, h, region, _ in plan.inserts:
        r = directory.command({"op": DirOp.INSERT_EXISTING, "count": count, "hash": h,
                               "region": region, "now": 1})
        assert r["status"] == DirStatus.OK.value
    return plan, directory


def export(card, directory, snap, key_hash, seq):
    """EXPORT in golden form: the allocator's region (LRU eviction), the whole record."""
    r = directory.command({"op": DirOp.INSERT, "evict": 1, "count": len(snap[0]),
                           "hash": key_hash, "now": 5})
    assert r["status"] == DirStatus.OK.value
    card.write(r["region"], record(snap, key_hash, seq))
    return r["region"]


# --- a power cut at every byte of the header sector ------------------------------------------

@pytest.mark.parametrize("medium", sorted(MEDIA))
def test_power_cut_at_every_header_byte(medium):
    """Session snapshot A (6 tokens, seq 1) is exported; the session goes on to B (9 tokens)
    whose export is cut k bytes into its header sector, for every k in 0..511, on an erased
    and on a zeroed card. After each: the rebuild does not raise and takes nothing from B's
    header (next_seq 2, B's region freed), A hits with identical rings, B misses; a new export
    of B gets seq 2 and then both hit; a second power cycle keeps both and continues at 3."""
    byte = MEDIA[medium]
    rng = random.Random(17)
    snap_a = snapshot(rng, 6)
    snap_b = (snap_a[0] + [rng.randrange(256) for _ in range(3)], *snapshot(rng, 9)[1:])
    ha, hb = 0xA0A0, 0xB0B0
    card = Card(byte)
    directory = GoldenDirectory(buckets=8, links=REGIONS, regions=REGIONS)
    region_a = export(card, directory, snap_a, ha, 1)
    writes_b = record(snap_b, hb, 2)
    r = directory.command({"op": DirOp.INSERT, "evict": 1, "count": 9, "hash": hb, "now": 6})
    region_b = r["region"]
    card.write(region_b, writes_b[:-1])                 # the payload, then the torn header
    full = writes_b[-1][1]
    base = bytes(card.data)
    outcomes = Counter()
    for k in range(SECTOR):
        card.data[:] = base
        torn = torn_header(full, k, byte)
        card.set_header(region_b, torn)
        complete = torn == full                         # the cut missed nothing that mattered
        plan, d = recover(card)
        want = [(6, ha, region_a, 1)] + ([(9, hb, region_b, 2)] if complete else [])
        assert plan.inserts == want, k
        assert plan.next_seq == (3 if complete else 2), k
        if not complete:
            assert region_b in plan.frees
        assert query(card, d, snap_a, ha) is not None, k
        if complete:
            outcomes["complete"] += 1
            continue
        status = card.scan()[region_b].status
        outcomes[status.name] += 1
        assert (region_b in plan.reasons) == (status is not RecordStatus.EMPTY), k
        assert query(card, d, snap_b, hb) is None, k
        # the device goes on: B again, in the freed region, with the next sequence number
        assert export(card, d, snap_b, hb, plan.next_seq) == region_b
        assert query(card, d, snap_b, hb).commit_seq == 2
        assert query(card, d, snap_a, ha).commit_seq == 1
        plan2, d2 = recover(card)
        assert sorted((c, h, s) for c, h, _, s in plan2.inserts) == [(6, ha, 1), (9, hb, 2)]
        assert plan2.next_seq == 3
        assert query(card, d2, snap_a, ha) and query(card, d2, snap_b, hb)
    # every kind of tear was met: no magic, magic without version, a failing header CRC
    assert {"EMPTY", "BAD_VERSION", "BAD_HEADER"} <= set(outcomes), outcomes
    assert sum(outcomes.values()) == SECTOR


def test_torn_commit_seq_on_an_erased_card_is_not_taken():
    """The issue's case: cut 12..15 bytes into the header on an erased card, so commit_seq reads
    0xFFFFFFFF (or partly so). The old rebuild took it and asked for next_seq 2**32."""
    rng = random.Random(3)
    card = Card(0xFF)
    snap = snapshot(rng, 5)
    card.write(0, record(snap, 7, 41))
    writes = record(snapshot(rng, 8), 8, 42)
    card.write(1, writes[:-1])
    for k in (12, 13, 14, 15):
        card.set_header(1, torn_header(writes[-1][1], k, 0xFF))
        infos = card.scan()
        assert infos[1].status is RecordStatus.BAD_HEADER
        assert (infos[1].count, infos[1].prefix_hash, infos[1].commit_seq) == (0, 0, 0)
        inserts, frees, next_seq = rebuild(infos)
        assert inserts == [(5, 7, 0, 41)] and frees == [1, 2, 3] and next_seq == 42
        assert "4294967295" not in format_listing(infos)


# --- the sequence's end: 2**32 - 1 is followed by 0 -----------------------------------------

def test_valid_record_at_the_end_of_the_sequence():
    """A valid record with commit_seq 0xFFFFFFFF: the next export gets 0, and a newer record of
    the same key at 0 wins over it at the next rebuild, wherever the two lie; then 1."""
    rng = random.Random(5)
    snap = snapshot(rng, 7)
    for region_old, region_new in ((0, 1), (2, 0)):
        card = Card()
        card.write(region_old, record(snap, 99, TOP))
        plan, d = recover(card)
        assert plan.inserts == [(7, 99, region_old, TOP)] and plan.next_seq == 0
        # the same key re-exported (the device's EXPORT writes a new record, then retires the
        # old one in the directory; on storage the old record stays until its region is reused)
        card.write(region_new, record(snap, 99, plan.next_seq))
        plan, d = recover(card)
        assert plan.inserts == [(7, 99, region_new, 0)], (region_old, region_new)
        assert plan.next_seq == 1
        assert region_old in plan.frees and "superseded by commit 0" in plan.reasons[region_old]
        assert query(card, d, snap, 99).commit_seq == 0


@pytest.mark.parametrize("seqs", [(TOP - 1, 1), (1, TOP - 1), (TOP, 0), (0, TOP),
                                  (TOP - 1, TOP, 0, 1), (1, 0, TOP, TOP - 1)])
def test_records_of_one_key_across_the_wrap(seqs):
    """Records of one key on both sides of the wrap (0xFFFFFFFE vs 1, ...): the one after the
    wrap is newer and wins, whatever the region order; next_seq follows it."""
    rng = random.Random(len(seqs))
    snap = snapshot(rng, 9)
    card = Card(0xFF)
    for region, seq in enumerate(seqs):
        card.write(region, record(snap, 5, seq))
    newest = max(seqs, key=lambda s: (s + 2) % SEQ_MOD)            # 1 after the wrap
    plan, d = recover(card)
    assert plan.inserts == [(9, 5, seqs.index(newest), newest)]
    assert plan.next_seq == seq_next(newest)
    assert query(card, d, snap, 5).commit_seq == newest
    for region, seq in enumerate(seqs):
        if seq != newest:
            assert seq_newer(newest, seq) and region in plan.frees


def test_rebuild_does_not_depend_on_scan_order_and_ties_are_deterministic():
    rng = random.Random(11)
    for _ in range(300):
        start = rng.randrange(SEQ_MOD)
        infos = []
        for region in range(rng.randrange(1, 12)):
            if rng.random() < 0.25:          # whatever a bad header said must not matter
                infos.append(RecordInfo(region, rng.choice([RecordStatus.BAD_HEADER,
                                                            RecordStatus.BAD_VERSION,
                                                            RecordStatus.EMPTY])))
                continue
            infos.append(RecordInfo(region, RecordStatus.OK, count=rng.randrange(1, 3),
                                    prefix_hash=rng.randrange(2),
                                    commit_seq=(start + rng.randrange(50)) % SEQ_MOD))
        want = rebuild(infos)
        shuffled = infos[:]
        rng.shuffle(shuffled)
        assert rebuild(shuffled) == want
        inserts, frees, next_seq = want
        assert sorted([r for _, _, r, _ in inserts] + frees) == list(range(len(infos)))
        seqs = [i.commit_seq for i in infos if i.valid]
        if seqs:
            assert all(seq_newer(next_seq, s) for s in seqs)
        else:
            assert next_seq == 1
        for count, h, region, seq in inserts:
            same = [i for i in infos if i.valid and (i.count, i.prefix_hash) == (count, h)]
            assert all(not seq_newer(i.commit_seq, seq) for i in same)
            ties = [i.region for i in same if i.commit_seq == seq]
            assert region == max(ties)             # equal sequence numbers: highest region


# --- random bytes with a valid magic and version ------------------------------------------

@pytest.mark.parametrize("kind", RANDOM_KINDS)
def test_random_headers_are_freed_and_never_read_past(kind):
    """Regions of random bytes with a valid magic and version (random CRC, a valid CRC over
    random config fields, or this config's constant bytes with random counts, heads and
    lengths under a valid CRC), many seeds: the scan never raises and never reads outside the
    region, the region is freed with its reason, and nothing of it reaches the rebuild."""
    statuses = set()
    for seed in range(150):
        rng = random.Random(seed)
        card = Card(rng.choice([0x00, 0xFF]))
        seq_a = rng.choice([TOP, 0, rng.randrange(SEQ_MOD)])
        snap = snapshot(rng, 3)
        card.write(0, record(snap, 1, seq_a))
        card.data[SPAN:2 * SPAN] = rng.randbytes(SPAN)          # payload sectors random too
        card.set_header(1, random_header(rng, kind, CONFIG))
        card.reads.clear()
        plan, d = recover(card)
        for lba, n in card.reads:                              # one region at a time
            region = lba // LAY.sectors_per_region
            assert n >= 0 and lba + n <= (region + 1) * LAY.sectors_per_region, (seed, lba, n)
        info = card.scan()[1]
        statuses.add(info.status)
        assert info.status not in (RecordStatus.OK, RecordStatus.EMPTY), seed
        assert 1 in plan.frees and plan.reasons[1].startswith(info.status.name)
        assert plan.inserts == [(3, 1, 0, seq_a)] and plan.next_seq == seq_next(seq_a)
        assert query(card, d, snap, 1) is not None
        region = export(card, d, snapshot(rng, 4), 2, plan.next_seq)
        assert region != 0
        assert recover(card)[0].next_seq == seq_next(seq_next(seq_a))
    want = {"random": {RecordStatus.BAD_HEADER}, "random_crc": {RecordStatus.FOREIGN_CONFIG},
            "template_crc": {RecordStatus.BAD_HEADER}}[kind]
    assert statuses == want


def test_valid_header_over_a_random_payload_is_freed():
    rng = random.Random(8)
    for seed in range(50):
        card = Card(0xFF)
        snap = snapshot(rng, rng.randrange(1, 40))
        writes = record(snap, seed, rng.randrange(SEQ_MOD))
        card.write(2, writes[-1:])                  # the header only: a random payload
        card.data[2 * SPAN + SECTOR:3 * SPAN] = rng.randbytes(SPAN - SECTOR)
        plan = plan_rebuild(card.scan())
        assert plan.inserts == [] and plan.next_seq == 1
        assert plan.reasons[2].startswith("BAD_PAYLOAD_CRC")


# --- inspection: ls and fsck ---------------------------------------------------------------

def test_listing_and_fsck_show_reasons_and_age_across_the_wrap(tmp_path, capsys):
    from ringkv.cli import main as cli
    rng = random.Random(21)
    card = Card(0xFF)
    snap = snapshot(rng, 6)
    card.write(0, record(snap, 3, TOP))                         # superseded by region 1
    card.write(1, record(snap, 3, 0))
    writes = record(snapshot(rng, 7), 4, 1)
    card.write(2, writes[:-1])
    card.set_header(2, torn_header(writes[-1][1], 13, 0xFF))    # torn: commit_seq 0xFF..
    infos = card.scan()
    listing = format_listing(infos)
    rows = {line.split()[0]: line for line in listing.splitlines()[1:-1]}
    assert rows["0"].split()[1:6] == ["OK", "6", "0x0000000000000003", str(TOP), "1"]
    assert "superseded by commit 0 in region 1" in rows["0"]
    assert rows["1"].split()[1:6] == ["OK", "6", "0x0000000000000003", "0", "0"]
    assert rows["2"].split()[1:5] == ["BAD_HEADER", "-", "-", "-"]
    assert "torn header" in rows["2"] and "4294967295" not in rows["2"]
    assert rows["0"].split()[7] == "open"                         # key: an open record
    assert rows["0"].split()[8] == "superseded" and rows["2"].split()[7] == "torn"
    assert listing.splitlines()[-1] == ("4 regions, 3 shown, 2 valid, 1 live, 2 to free; next "
                                        "commit sequence 1")
    report, problems = fsck_report(infos)
    assert problems == 1                       # the torn header; superseded is normal
    assert "region     1  count       6  hash 0x0000000000000003  seq 0" in report
    assert "region     0  superseded by commit 0 in region 1" in report
    assert "region     2  BAD_HEADER: torn header (its write was cut: no header CRC)  [torn]" \
        in report
    assert "repairable: 1 torn" in report

    # the command line, on an image file of the default layout (a small config's regions
    # are not that layout: scan them with python -m ringkv.host.record's own layout)
    from ringkv.defs.config import DEFAULT_CONFIG
    lay = RecordLayout(DEFAULT_CONFIG)
    span = lay.sectors_per_region * SECTOR
    image = bytearray(b"\xff" * (3 * span))
    big = (list(range(20)), np.zeros((4, 2, 2, 128, 64), dtype=np.uint8))
    for off, data in encode_record(DEFAULT_CONFIG, *big, count=20, ring_head=19,
                                   prefix_hash=0xC0FFEE, commit_seq=TOP):
        image[off * SECTOR:off * SECTOR + len(data)] = data
    path = tmp_path / "card.img"
    path.write_bytes(image)
    assert cli(["storage", "fsck", str(path)]) == 0
    out = capsys.readouterr().out
    assert "clean" in out and "next commit sequence: 0" in out
    assert cli(["storage", "ls", str(path)]) == 0
    assert "0x0000000000c0ffee" in capsys.readouterr().out
    writes = encode_record(DEFAULT_CONFIG, *big, count=20, ring_head=19, prefix_hash=1,
                           commit_seq=0)
    for off, data in writes[:-1]:
        at = span + off * SECTOR
        image[at:at + len(data)] = data
    image[span:span + SECTOR] = torn_header(writes[-1][1], 14, 0xFF)
    path.write_bytes(image)
    assert cli(["storage", "fsck", str(path)]) == 1
    out = capsys.readouterr().out
    assert "region     1  BAD_HEADER: torn header" in out
    assert "repairable: 1 torn" in out and "next commit sequence: 0" in out
    assert main([str(path), "--fsck", "--regions", "1"]) == 0     # region 0 alone is clean
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli(["storage", "--help"])
    assert e.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "0 clean (superseded records are normal), 1 repairable" in help_text
    assert cli(["storage", "fsck", str(tmp_path / "no-such.img")]) == 2
    assert "ringkv: cannot read " in capsys.readouterr().err


# --- the gateware's record checks (DMA VERIFY) agree on the same bytes ---------------------

def dma_verify(writes, headers):
    """The DMA's VERIFY status (Amaranth simulator) of region 0 holding the payload of
    ``writes`` under each ``(medium, header)`` in turn, the rest of the region ``medium``."""
    from ringkv.hw.storage.dma import DmaOp
    from ringkv.sim.ring_model import DmaHarness
    from ringkv.sim.sector_model import SectorImage, serve_storage
    from ringkv.sim.streams import stream_get, stream_put

    image = SectorImage(sectors=REGIONS * LAY.sectors_per_region)
    h = DmaHarness(CONFIG, REGIONS)
    sim = Simulator(h)
    sim.add_clock(1e-8)
    got = []

    async def bench(ctx):
        for medium, header in headers:
            image.write(0, bytes([medium]) * SPAN)
            for off, data in writes[:-1]:
                image.write(off, data)
            image.write(0, header)
            await stream_put(ctx, h.cmd, {"op": DmaOp.VERIFY, "region": 0, "count": 0,
                                          "hash": 0, "seq": 0})
            resp = await stream_get(ctx, h.resp)
            got.append(RecordStatus(resp.status.value))

    async def server(ctx):
        await serve_storage(ctx, h.storage, image)

    sim.add_testbench(server, background=True)
    sim.add_testbench(bench)
    sim.run()
    return got


def check_dma_agrees(writes, headers):
    for (medium, header), status in zip(headers, dma_verify(writes, headers), strict=True):
        card = Card(medium)
        card.write(0, writes[:-1])
        card.set_header(0, header)
        want = card.scan()[0].status
        assert status is want, (medium, header.hex())
        assert (status is RecordStatus.OK) == (header == writes[-1][1]), (medium, header.hex())


def test_dma_verify_agrees_with_the_golden_scan_on_torn_and_random_headers():
    """The checks the device applies to a record (the DMA's VERIFY in the Amaranth simulator,
    which a device-side recovery would use) give the golden scan's status on torn headers
    (representative offsets, both media) and on random headers with a valid magic and
    version: OK only for the whole header."""
    rng = random.Random(31)
    writes = record(snapshot(rng, 9), 0x77, 5)
    headers = [(medium, torn_header(writes[-1][1], k, medium))
               for medium in sorted(MEDIA.values()) for k in TORN_OFFSETS]
    headers += [(0xFF, random_header(rng, kind, CONFIG)) for kind in RANDOM_KINDS
                for _ in range(4)]
    headers.append((0xFF, writes[-1][1]))
    check_dma_agrees(writes, headers)


@pytest.mark.slow       # 1024 VERIFYs in the Amaranth simulator: a few minutes
def test_dma_verify_agrees_at_every_header_byte():
    rng = random.Random(32)
    writes = record(snapshot(rng, 9), 0x77, TOP)
    check_dma_agrees(writes, [(medium, torn_header(writes[-1][1], k, medium))
                              for medium in sorted(MEDIA.values()) for k in range(SECTOR)])
