"""Rebuild after power loss against the directory/allocator's golden model: full storage evicts
by the allocator's policy, and the scan of the image rebuilds exactly the live directory."""

import random

import numpy as np

from ringkv.defs.config import RingKVConfig
from ringkv.defs.directory import Op, Status
from ringkv.defs.record import SECTOR, RecordLayout, RecordStatus
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.host.record import encode_record, rebuild, scan_image

CONFIG = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=4, window=4, token_width=8,
                      max_tokens=64)


class Image:
    def __init__(self, regions):
        self.lay = RecordLayout(CONFIG)
        self.data = bytearray(regions * self.lay.sectors_per_region * SECTOR)

    def read(self, lba, n):
        return bytes(self.data[lba * SECTOR:(lba + n) * SECTOR])

    def export(self, region, tokens, seq, hash_value, *, upto=None):
        rings = np.full((1, 1, 2, 4, 4), seq & 0xFF, dtype=np.uint8)
        writes = encode_record(CONFIG, tokens, rings, count=len(tokens),
                               ring_head=(len(tokens) - 1) % 4, prefix_hash=hash_value,
                               commit_seq=seq)
        base = self.lay.region_lba(region) * SECTOR
        for i, (off, data) in enumerate(writes):
            if upto is not None and i >= upto:
                return
            self.data[base + off * SECTOR:base + off * SECTOR + len(data)] = data


def test_full_storage_evicts_lru_and_rebuild_matches_directory():
    rng = random.Random(9)
    regions = 8
    d = GoldenDirectory(buckets=8, links=regions, regions=regions)
    img = Image(regions)
    seq, now = 0, 0
    sessions = {}
    inserted = evictions = 0
    for _ in range(30):
        now += 1
        if sessions and rng.random() < 0.3:          # a hit refreshes the LRU stamp
            key = rng.choice(sorted(sessions))
            r = d.command({"op": Op.LOOKUP, "count": key[0], "hash": key[1], "now": now})
            assert r["status"] == Status.OK.value
            continue
        tokens = [rng.randrange(256) for _ in range(rng.randrange(1, 12))]
        key = (len(tokens), rng.getrandbits(64))
        r = d.command({"op": Op.INSERT, "evict": 1, "count": key[0], "hash": key[1],
                       "now": now})
        assert r["status"] == Status.OK.value
        assert r["evicted"] == (inserted >= regions)  # storage full: the LRU snapshot goes
        evictions += r["evicted"]
        inserted += 1
        seq += 1
        img.export(r["region"], tokens, seq, key[1])
        sessions[key] = r["region"]
        sessions = {k: v for k, v in sessions.items()
                    if any(row["count"] == k[0] and row["hash"] == k[1]
                           for row in d.live.values())}
    assert evictions >= 5
    live = sorted((row["count"], row["hash"], row["region"]) for row in d.live.values())
    # power loss: a fresh directory is rebuilt from the image alone
    infos = scan_image(CONFIG, img.read, regions)
    inserts, frees, next_seq = rebuild(infos)
    assert sorted((c, h, r) for c, h, r, _ in inserts) == live
    assert next_seq == seq + 1
    fresh = GoldenDirectory(buckets=8, links=regions, regions=regions)
    for count, h, region, _ in inserts:
        r = fresh.command({"op": Op.INSERT_EXISTING, "count": count, "hash": h,
                           "region": region, "now": 1})
        assert r["status"] == Status.OK.value
    for count, h, region in live:
        r = fresh.command({"op": Op.LOOKUP, "count": count, "hash": h, "now": 2})
        assert (r["status"], r["region"]) == (Status.OK.value, region)


def test_torn_export_into_evicted_region():
    """The new export reuses an evicted snapshot's region and is cut before its header: the
    region holds neither (payload CRC fails), the other snapshots survive."""
    img = Image(3)
    for region in range(3):
        img.export(region, [region + 1] * 5, region + 1, 100 + region)
    img.export(1, [9] * 5, 4, 200, upto=1)
    infos = scan_image(CONFIG, img.read, 3)
    assert [i.status for i in infos] == [RecordStatus.OK, RecordStatus.BAD_PAYLOAD_CRC,
                                         RecordStatus.OK]
    inserts, frees, next_seq = rebuild(infos)
    assert [(c, h, r) for c, h, r, _ in inserts] == [(5, 100, 0), (5, 102, 2)]
    assert frees == [1] and next_seq == 4


def test_zero_token_records_are_not_inserted():
    img = Image(2)
    img.export(0, [], 1, 5)
    infos = scan_image(CONFIG, img.read, 2)
    assert infos[0].status is RecordStatus.OK
    assert rebuild(infos)[:2] == ([], [0, 1])
