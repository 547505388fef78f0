"""Longest stored prefix (device side): QUERY_PREFIX against its golden model, and
the record kind (turn snapshot / checkpoint) through EXPORT, the record format and the listing.

The directory's PROBE run alone is tested in ``tests/hw/store/test_directory.py``; the whole top on
Verilator with backpressure in ``tests/hw/top/test_top_cocotb.py`` (slow: the Verilator build).
Here: the golden model, the top in the Amaranth simulator against it, the record kind in the golden
format, and the host's ``FpgaDevice.query_prefix`` / ``export(checkpoint=)`` over the link into
the simulated top.
"""

import random

import numpy as np
import pytest

from ringkv.defs.config import RingKVConfig
from ringkv.defs.hash import hash_seed
from ringkv.defs.protocol import (
    DIR_RESPONSE,
    PREFIX_RESPONSE,
    REQUESTS,
    RESPONSES,
    Op,
    Status,
)
from ringkv.defs.record import RecordKind, RecordLayout, RecordStatus
from ringkv.host.device.ops import pack_tokens
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.host.golden.prefix import prefix_keys, query_prefix
from ringkv.host.record import (
    decode_header,
    encode_record,
    format_listing,
    fsck_report,
    kind_name,
    scan_image,
)
from ringkv.hw.top import RingKVTop
from ringkv.sim.top_bench import image_for, run_top

CFG = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=8, window=8, max_tokens=64)
SEED = hash_seed(CFG)
REGIONS = 8          # links 8, buckets 4


def make_top(**kw):
    return RingKVTop(CFG, **{"regions": REGIONS, "lanes": 2, "macs": 4, "max_payload": 1024,
                             **kw})


def golden_dir(top):
    return GoldenDirectory(buckets=top.buckets, links=top.links, regions=top.regions)


def req(op, **fields):
    return REQUESTS[op].pack(**fields)


async def query_prefix_rtl(ctx, link, n):
    frame = await link.request(ctx, Op.QUERY_PREFIX, req(Op.QUERY_PREFIX, n=n))
    status = Status(frame.status)
    return status, (PREFIX_RESPONSE.unpack(frame.payload) if frame.payload else {})


# -- golden model --------------------------------------------------------------------------------

def test_golden_prefix_cases():
    """The golden model's own rules: longest hit wins, same hash with another count and same
    bucket do not hit, BAD_ARG and NOT_READY, no stamp changes."""
    tokens = list(range(100, 140))
    keys = dict(prefix_keys(tokens, SEED, 40))
    g = GoldenDirectory(buckets=4, links=8, regions=8)
    assert query_prefix(tokens, SEED, 40, g)[0] is Status.MISS
    for c in (3, 12, 25):
        g.command({"op": 1, "count": c, "hash": keys[c], "now": c})
    g.command({"op": 1, "count": 13, "hash": keys[12], "now": 50})   # same hash, other count
    before = {n: dict(row) for n, row in g.live.items()}
    status, r = query_prefix(tokens, SEED, 40, g)
    assert status is Status.HIT and (r["count"], r["hash"]) == (25, keys[25])
    assert query_prefix(tokens, SEED, 24, g)[1]["count"] == 12
    assert query_prefix(tokens, SEED, 11, g)[1]["count"] == 3
    status, r = query_prefix(tokens, SEED, 2, g)
    assert status is Status.MISS and r["count"] == r["hash"] == r["link"] == 0
    assert g.live == before
    assert query_prefix(tokens, SEED, 0, g) == (Status.BAD_ARG, {})
    assert query_prefix(tokens, SEED, 41, g) == (Status.BAD_ARG, {})
    assert query_prefix([], SEED, 1, g) == (Status.BAD_ARG, {})
    assert query_prefix(tokens, SEED, 5, g, ready=False) == (Status.NOT_READY, {})


# -- the top in the Amaranth simulator -----------------------------------------------------------

def test_query_prefix_top_against_golden():
    """Boundary and random cases through byte frames, with idle on rx and stall on tx; every
    field and the cycle count equal the golden model's.

    Cases: NOT_READY during the power-on scan; an empty token memory (n = 0 and n = 1);
    nothing stored; several stored prefixes of one conversation (answers at several n); a key
    planted in the same bucket and the same hash with another count (collisions); the whole
    sequence stored; n = 1; n = max_tokens; random directories and random n."""
    top = make_top()
    image = image_for(top)
    rng = random.Random(16)
    tokens = [rng.randrange(1 << 16) for _ in range(CFG.max_tokens)]
    keys = dict(prefix_keys(tokens, SEED, CFG.max_tokens))
    g = golden_dir(top)
    checked = []

    async def check(ctx, link, n, memory):
        want_status, want = query_prefix(memory, SEED, n, g)
        status, got = await query_prefix_rtl(ctx, link, n)
        assert (status, got) == (want_status, want), n
        checked.append((n, status, got.get("count"), got.get("probes")))

    async def insert(ctx, link, count, h):
        now = RESPONSES[Op.ALLOC_STATUS].unpack(await link.call(ctx, Op.ALLOC_STATUS))["dir_now"]
        r = DIR_RESPONSE.unpack(await link.call(ctx, Op.DIR_INSERT, req(
            Op.DIR_INSERT, count=count, hash=h, region=0, flags=1)))
        want = g.command({"op": 1, "count": count, "hash": h, "now": now, "evict": 1})
        assert (r["link"], r["region"]) == (want["link"], want["region"])

    async def scenario(ctx, link):
        # the power-on scan is still running: NOT_READY, like QUERY
        frame = await link.request(ctx, Op.QUERY_PREFIX, req(Op.QUERY_PREFIX, n=1))
        assert Status(frame.status) is Status.NOT_READY
        while ctx.get(top.recovering):
            await ctx.tick()
        # empty token memory
        for n in (0, 1):
            await check(ctx, link, n, [])
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=40)
                   + pack_tokens(CFG, tokens[:40]))
        memory = tokens[:40]
        await check(ctx, link, 40, memory)                       # nothing stored
        await check(ctx, link, 41, memory)                       # beyond the token memory
        # several prefixes of one conversation, a same-hash other-count key, the same bucket
        for c in (1, 9, 20, 33):
            await insert(ctx, link, c, keys[c])
        await insert(ctx, link, 21, keys[20])
        same_bucket = (rng.getrandbits(62) << 2 | keys[33] & 3)
        await insert(ctx, link, 34, same_bucket)
        for n in (40, 34, 33, 32, 21, 20, 19, 9, 8, 2, 1):
            await check(ctx, link, n, memory)
        await insert(ctx, link, 40, keys[40])                    # the whole sequence
        await check(ctx, link, 40, memory)
        # n = max_tokens
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=CFG.max_tokens)
                   + pack_tokens(CFG, tokens))
        memory = tokens
        await insert(ctx, link, CFG.max_tokens, keys[CFG.max_tokens])
        await check(ctx, link, CFG.max_tokens, memory)
        # random: refill the directory (evictions), random n
        for _ in range(3):
            for _ in range(rng.randrange(2, 6)):
                c = rng.randrange(1, CFG.max_tokens + 1)
                await insert(ctx, link, c, keys[c] if rng.random() < 0.7
                             else rng.getrandbits(64))
            for _ in range(3):
                await check(ctx, link, rng.randrange(1, CFG.max_tokens + 1), memory)
        # a probe is not a use: the stamps are those of the inserts (golden unchanged by probes)
        for n in range(top.links):
            frame = await link.request(ctx, Op.DIR_READ, req(Op.DIR_READ, link=n))
            if n in g.live:
                assert DIR_RESPONSE.unpack(frame.payload)["stamp"] == g.live[n]["stamp"]

    run_top(top, image, scenario, rng=random.Random(3), idle=0.2, stall=0.3, wait_ready=False)
    statuses = {s for _, s, _, _ in checked}
    assert statuses == {Status.HIT, Status.MISS, Status.BAD_ARG}
    assert any(p and p > 1 for _, _, _, p in checked)       # chains walked past their head


# -- record kind ---------------------------------------------------------------------------------

def _snapshot(rng, config, count):
    c = config
    rings = np.array(rng.integers(0, 256, size=(c.layers, c.kv_heads, 2, c.window, c.head_dim)),
                     dtype=np.uint8)
    return [int(t) for t in rng.integers(0, 1 << 16, size=count)], rings


def test_record_kind_golden():
    """The kind is a header field under the header CRC; records of every kind decode, old
    records (0) are turn snapshots; the listing and fsck name the kind."""
    rng = np.random.default_rng(1)
    lay = RecordLayout(CFG)
    span = lay.sectors_per_region * 512
    image = bytearray(3 * span)
    for region, kind in ((0, RecordKind.TURN), (1, RecordKind.CHECKPOINT), (2, 7)):
        tokens, rings = _snapshot(rng, CFG, 10 + region)
        for off, data in encode_record(CFG, tokens, rings, count=10 + region, ring_head=3,
                                       prefix_hash=region, commit_seq=region + 1, kind=kind):
            image[region * span + off * 512:region * span + off * 512 + len(data)] = data
    header = bytes(image[span:span + 512])
    assert header[94:96] == b"\x01\x00" and decode_header(header, CFG).kind == 1
    flipped = bytearray(header)
    flipped[94] ^= 1
    with pytest.raises(Exception, match="header CRC"):
        decode_header(bytes(flipped), CFG)

    def read(lba, n):
        return bytes(image[lba * 512:(lba + n) * 512])

    infos = scan_image(CFG, read, 3)
    assert [(i.status, i.kind) for i in infos] == [(RecordStatus.OK, 0), (RecordStatus.OK, 1),
                                                   (RecordStatus.OK, 7)]
    rows = format_listing(infos).splitlines()
    assert rows[0].split()[7] == "kind"
    # kind, key id (open: no key) and state; the unknown kind 7 is named by its number
    assert [row.split()[6:9] for row in rows[1:3]] == [["turn", "open", "live"],
                                                       ["checkpoint", "open", "live"]]
    assert rows[3].split()[6:10] == ["kind", "7", "open", "live"]
    assert rows[1].split()[2] == "10" and rows[2].split()[2] == "11"       # token counts
    report, _ = fsck_report(infos)
    assert "count      11  hash 0x0000000000000001  seq 2  checkpoint" in report
    assert [kind_name(k) for k in (0, 1, 9)] == ["turn", "checkpoint", "kind 9"]


# -- the host: FpgaDevice.query_prefix over the link into the simulated top ---------------------

def valid_slots_equal(got, want):
    """Equal ring metadata and equal K/V in the valid slots (an import writes only those)."""
    assert got[1] == want[1]
    count, head = want[1][0]
    v = min(count, CFG.window)
    slots = [(head - v + 1 + t) % CFG.window for t in range(v)]
    np.testing.assert_array_equal(got[0][:, :, :, slots], want[0][:, :, :, slots])


def test_fpga_device_query_prefix():
    """A conversation stores a checkpoint after its 5-token "system prompt" and a turn snapshot
    of 12 tokens; a new conversation with the same 5 tokens gets the checkpoint (rings and
    token memory hold exactly those 5), the first one its 12 (limit 12) or the checkpoint
    (limit 11); a planted directory entry of a longer prefix whose record does not verify
    is retried down to the checkpoint; unrelated tokens miss. EXPORT's kind reaches the
    record headers (kind 2 is BAD_ARG)."""
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import DeviceError, Link
    from ringkv.sim.top_bench import SimPort

    rng = np.random.default_rng(8)
    first = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    second = first[:5] + [int(t) for t in rng.integers(0, 1 << 16, size=6)]
    qkv = [tuple(rng.standard_normal((12, h, CFG.head_dim)) * 2
                 for h in (CFG.q_heads, CFG.kv_heads, CFG.kv_heads)) for _ in range(CFG.layers)]
    top = make_top()
    image = image_for(top)
    lay = RecordLayout(CFG)
    with SimPort(top, image) as port:
        dev = FpgaDevice(Link(port, timeout=120, retries=0), CFG, max_payload=1024)
        dev.wait_ready()

        def compute(n):
            dev.reset()
            dev.write_tokens(first[:n])
            for layer, (q, k, v) in enumerate(qkv):
                dev.prefill(layer, q[:n], k[:n], v[:n])
            return dev.snapshot()

        want5 = compute(5)
        with pytest.raises(DeviceError) as info:       # an unknown kind: nothing written
            dev.link.request(Op.EXPORT, req(Op.EXPORT, n=5, kind=2))
        assert info.value.status is Status.BAD_ARG
        key5, _ = dev.export(first[:5], checkpoint=True)
        want12 = compute(12)
        key12, _ = dev.export(first[:12])
        # the second conversation: its longest stored prefix is the checkpoint
        dev.reset()
        r = dev.query_prefix(second, len(second))
        assert (r.hit, r.count, r.prefix_hash) == (True, 5, key5[1])
        assert dev.import_(r) > 0
        valid_slots_equal(dev.snapshot(), want5)
        assert dev.stats()["alloc"]["token_count"] == 5
        assert dev.read_tokens(0, 5) == first[:5]
        # the first conversation, whole or one short of its snapshot
        assert dev.query_prefix(first, 12).count == 12
        valid_slots_equal(dev.snapshot(), want12)
        assert dev.query_prefix(first, 11).count == 5
        # a planted entry for the second conversation's 9-token prefix: its region holds no
        # record of that key, QUERY 9 misses (and drops it); the retry finds the checkpoint
        h9 = dict(prefix_keys(second, SEED, 9))[9]
        dev._call(Op.DIR_INSERT, count=9, hash=h9, region=0, flags=1)
        r = dev.query_prefix(second, len(second))
        assert (r.hit, r.count) == (True, 5)
        assert (9, h9) not in {(c, h) for c, h, _ in dev.directory()}
        # nothing shared
        r = dev.query_prefix([7, 7, 7], 3)
        assert (r.hit, r.count, r.reason) == (False, 0, "no stored prefix")
        assert dev.query_prefix(first, 0) == r
        headers = {key: decode_header(dev.read_sectors(lay.region_lba(region), 1), CFG).kind
                   for key, region in (((c, h), region) for c, h, region in dev.directory())}
        assert headers == {key5: RecordKind.CHECKPOINT.value, key12: RecordKind.TURN.value}
