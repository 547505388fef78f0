"""The device's own directory recovery (``hw/commands/recovery.py``) in the Amaranth simulator.

The top with the sector-level storage model over crafted images, against the golden
:func:`ringkv.host.record.plan_recovery` bit for bit: the figures of ``STORAGE_STATUS``
(scanned, live, freed, next_seq), the storage commands (one header read per region, one more
per duplicate key, nothing else), and the whole directory (every link's ``DIR_READ`` equals the
golden directory's after replaying the plan's commands, FIFO levels included). Stores: random
(duplicates, zero-token records, torn headers at ``TORN_OFFSETS``, random headers with valid
magic and version, foreign configuration, wrapping sequence numbers) and the boundaries (empty
card, all records, all duplicates, sequence wrap at 2**32 - 1), with random idle and
backpressure on the storage port. Then: requests during the scan (``NOT_READY`` with progress,
the rest answers), a storage failure (``FAILED`` with the error, retry by
``STORAGE_REBUILD``), and the promise at import (a record with a good header and a bad payload
is inserted, then a miss, then dropped).
"""

import random
from dataclasses import replace

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from top_helpers import CFG, make_top, req

from ringkv.defs.directory import Op as DirOp
from ringkv.defs.protocol import (
    DIR_RESPONSE,
    RECOVERY_STATUS,
    RESPONSES,
    SNAPSHOT_RESPONSE,
    Op,
    RecoveryState,
    Status,
)
from ringkv.defs.record import SECTOR, SEQ_MOD, RecordLayout, RecordStatus
from ringkv.host.device.ops import pack_tokens
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.host.record import (
    HeaderInfo,
    RecordInfo,
    encode_header,
    plan_rebuild,
    plan_recovery,
    scan_headers,
)
from ringkv.hw.storage.port import StorageError, StorageOp
from ringkv.sim.storage_faults import MEDIA, RANDOM_KINDS, TORN_OFFSETS, random_header, torn_header
from ringkv.sim.top_bench import image_for, run_top

REGIONS = 8
LAY = RecordLayout(CFG)
FOREIGN = replace(CFG, window=16)


def header(config=CFG, *, count, prefix_hash, seq):
    """A valid header sector (the scan reads no payload: its CRC is a fixed stand-in)."""
    return encode_header(config, count=count, ring_head=(count - 1) % config.window if count
                         else 0, prefix_hash=prefix_hash, commit_seq=seq % SEQ_MOD,
                         payload_crc=0x1234_5678 if count else 0)


def random_store(rng, regions=REGIONS, *, base=None, keys=4, medium=None):
    """Header sectors of a random store: sequence numbers on an arc from ``base``."""
    base = rng.randrange(SEQ_MOD) if base is None else base
    medium = rng.choice(list(MEDIA.values())) if medium is None else medium
    pool = [(rng.randrange(1, CFG.max_tokens + 1), rng.getrandbits(64)) for _ in range(keys)]
    out = []
    for _ in range(regions):
        kind = rng.choices(["empty", "valid", "zero", "torn", "random", "foreign"],
                           [3, 8, 1, 2, 1, 1])[0]
        count, h = rng.choice(pool)
        seq = base + rng.randrange(4 * regions)
        if kind == "empty":
            out.append(bytes([medium]) * SECTOR)
        elif kind == "valid":
            out.append(header(count=count, prefix_hash=h, seq=seq))
        elif kind == "zero":
            out.append(header(count=0, prefix_hash=h, seq=seq))
        elif kind == "torn":
            out.append(torn_header(header(count=count, prefix_hash=h, seq=seq),
                                   rng.choice(TORN_OFFSETS), medium))
        elif kind == "random":
            out.append(random_header(rng, rng.choice(RANDOM_KINDS), CFG))
        else:
            out.append(header(FOREIGN, count=count, prefix_hash=h, seq=seq))
    return out


def boundary_stores(rng):
    """``{name: header sectors}``: the boundary cases."""
    key = (7, 0xDEAD_BEEF_0BAD_F00D)
    return {
        "empty_erased": [b"\xff" * SECTOR] * REGIONS,
        "empty_zeroed": [bytes(SECTOR)] * REGIONS,
        "full": [header(count=1 + r, prefix_hash=rng.getrandbits(64), seq=100 + r)
                 for r in range(REGIONS)],
        # every region the same key; the newest commit in the middle, older ones both sides
        "all_duplicates": [header(count=key[0], prefix_hash=key[1],
                                  seq=(SEQ_MOD - 8 + (r * 5) % REGIONS) % SEQ_MOD)
                           for r in range(REGIONS)],
        # a key re-exported across the wrap: 2**32 - 1 then 0 then 1; equal sequences too
        "wrap": [header(count=key[0], prefix_hash=key[1], seq=s)
                 for s in (SEQ_MOD - 1, 0, SEQ_MOD - 2, 1, 1)]
                + [header(count=3, prefix_hash=5, seq=SEQ_MOD - 1)]
                + [b"\xff" * SECTOR] * (REGIONS - 6),
    }


def write_store(image, headers):
    for r, sector in enumerate(headers):
        image.write(LAY.region_lba(r), sector)


async def status(ctx, link):
    frame = await link.request(ctx, Op.STORAGE_STATUS)
    assert Status(frame.status) == Status.OK
    return RECOVERY_STATUS.unpack(frame.payload)


async def wait_ready(ctx, link, limit=200):
    for _ in range(limit):
        st = await status(ctx, link)
        if st["state"] != RecoveryState.SCANNING.value:
            return st
        await ctx.tick().repeat(200)
    raise AssertionError("recovery did not end")


async def read_directory(ctx, link, links):
    out = []
    for link_no in range(links):
        frame = await link.request(ctx, Op.DIR_READ, req(Op.DIR_READ, link=link_no))
        out.append(DIR_RESPONSE.unpack(frame.payload))
    return out


def golden_directory(plan, links=REGIONS, now0=0):
    """The directory after replaying the plan's commands (``now`` as the device counts)."""
    g = GoldenDirectory(buckets=max(REGIONS // 2, 2), links=links, regions=REGIONS)
    now = now0
    g.command({"op": DirOp.CLEAR, "now": now})
    found = None
    for cmd in plan.commands:
        now += 1
        if cmd[0] == "lookup":
            r = g.command({"op": DirOp.LOOKUP, "count": cmd[1], "hash": cmd[2], "now": now})
            found = r["link"]
        elif cmd[0] == "delete":
            g.command({"op": DirOp.DELETE, "link": found, "now": now})
        else:
            g.command({"op": DirOp.INSERT_EXISTING, "count": cmd[1], "hash": cmd[2],
                       "region": cmd[3], "now": now})
    return g


def golden_reads(g):
    out = []
    for link_no in range(g.links):
        r = g.command({"op": DirOp.READ, "link": link_no})
        out.append({"dir_status": r["status"], "evicted": 0, "link": r["link"],
                    "region": r["region"], "count": r["count"], "hash": r["hash"],
                    "stamp": r["stamp"], "prev": r["prev"], "next": r["next"], "victim": 0,
                    "expired": 0})
    return out


def check(st, plan, dir_reads, alloc, log, g):
    assert st["state"] == RecoveryState.READY.value and st["error"] == 0
    assert (st["scanned"], st["regions"], st["live"], st["freed"], st["next_seq"]) == (
        REGIONS, REGIONS, plan.live, plan.freed, plan.next_seq)
    assert dir_reads == golden_reads(g)
    live = sorted((d["count"], d["hash"], d["region"]) for d in dir_reads if d["dir_status"] == 0)
    assert live == sorted((c, h, r) for c, h, r, _ in plan.inserts)
    assert alloc["commit_seq"] == plan.next_seq and alloc["live"] == plan.live
    assert alloc["fifo_b"] == len(g.fifo_b) and alloc["fifo_a"] == REGIONS - g.a_next
    # one header read per region, one more per duplicate key, in the plan's order; no write
    assert all(op == StorageOp.READ and n == 1 for op, _, n in log)
    assert [lba // LAY.sectors_per_region for _, lba, _ in log] == plan.reads


def as_scan(infos):
    """Header infos as the host's deep scan would see them if every payload checked out."""
    return [RecordInfo(i.region, i.status, i.message, i.count, i.prefix_hash, i.commit_seq)
            for i in infos]


def same_as_host(plan, infos):
    """The device's plan equals the host's (``seq_newest``) rule on the same valid records."""
    host = plan_rebuild(as_scan(infos))
    assert [x for x in plan.inserts] == host.inserts
    assert (plan.frees, plan.next_seq, sorted(plan.reasons)) == (
        host.frees, host.next_seq, sorted(host.reasons))


def run_stores(stores):
    """One simulator, STORAGE_REBUILD between stores, random idle and stalls on the storage
    port: the device equals the golden plan on each store."""
    top = make_top(regions=REGIONS)
    image = image_for(top)
    log = []
    write_store(image, stores[0][1])

    async def scenario(ctx, link):
        for i, (name, headers) in enumerate(stores):
            now0 = 0
            if i:
                write_store(image, headers)
                log.clear()
                now0 = RESPONSES[Op.ALLOC_STATUS].unpack(
                    (await link.request(ctx, Op.ALLOC_STATUS)).payload)["dir_now"]
                frame = await link.request(ctx, Op.STORAGE_REBUILD)
                assert Status(frame.status) == Status.OK, name
                assert RECOVERY_STATUS.unpack(frame.payload)["state"] == 0
            st = await wait_ready(ctx, link)
            infos = scan_headers(CFG, image.read, REGIONS)
            plan = plan_recovery(infos)
            scan_log = list(log)
            alloc = RESPONSES[Op.ALLOC_STATUS].unpack(
                (await link.request(ctx, Op.ALLOC_STATUS)).payload)
            reads = await read_directory(ctx, link, REGIONS)
            g = golden_directory(plan, now0=now0)
            check(st, plan, reads, alloc, scan_log, g)
            same_as_host(plan, infos)

    run_top(top, image, scenario, storage_rng=random.Random(3), storage_idle=0.1,
            storage_stall=0.3, storage_log=log)


def test_recovery_matches_golden_plan():
    """The boundaries (all records, all duplicates, the wrap; the empty card is the next
    test's and the sweep's) and a random store across the wrap at 2**32 - 1."""
    rng = random.Random(1212)
    stores = boundary_stores(rng)
    run_stores([(name, stores[name]) for name in ("full", "all_duplicates", "wrap")]
               + [("random", random_store(rng, base=SEQ_MOD - 20))])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_recovery_matches_golden_plan_sweep(seed):
    rng = random.Random(seed)
    stores = boundary_stores(rng)
    run_stores([(name, stores[name]) for name in ("empty_erased", "empty_zeroed")]
               + [(f"random{i}", random_store(rng, base=b, keys=rng.choice((1, 2, 4))))
                  for i, b in enumerate((None, SEQ_MOD - 20, 0x7FFF_FFF0, None, None))])


@settings(max_examples=examples(fast=60, thorough=600))
@given(rng=st.randoms(use_true_random=False))
def test_device_rule_equals_host_rule(rng):
    """The golden device rule (running newest, duplicates against the stored winner) gives the
    host's records and next commit (seq_newest) on stores whose sequences lie on an arc
    shorter than half the circle -- here arcs up to 2**31 - 1 wide, wrapping or not."""
    regions = rng.choice((1, 2, 8, 64))
    base = rng.choice((0, SEQ_MOD - 1, SEQ_MOD - regions, rng.randrange(SEQ_MOD)))
    width = rng.choice((regions, 1 << 16, (1 << 31) - 1))
    infos = []
    for r in range(regions):
        status = rng.choice([RecordStatus.OK] * 4 + [RecordStatus.EMPTY, RecordStatus.BAD_HEADER])
        if status is RecordStatus.OK:
            count = rng.choice((0, 1, 2, 3)) if rng.random() < 0.9 else 5
            infos.append(HeaderInfo(r, status, count, rng.randrange(3) if count else 0,
                                    (base + rng.randrange(width)) % SEQ_MOD))
        else:
            infos.append(HeaderInfo(r, status, message="x"))
    rng.shuffle(infos)
    same_as_host(plan_recovery(infos), infos)


def test_requests_during_scan_and_storage_failure():
    """During the power-on scan QUERY, EXPORT, DIR_READ and SECTOR_READ answer NOT_READY with
    the progress record, PING, VERSION and TOKENS_* answer as usual. The card then fails in
    the middle of a STORAGE_REBUILD: FAILED with the storage error, QUERY and EXPORT answer
    it, the directory is readable; once the card answers again a STORAGE_REBUILD recovers."""
    rng = random.Random(5)
    store = boundary_stores(rng)["full"]
    top = make_top(regions=REGIONS)
    image = image_for(top)
    write_store(image, store)
    plan = plan_recovery(scan_headers(CFG, image.read, REGIONS))
    card = {"gone": False, "reads": 0}

    def dead():
        card["reads"] += 1
        return card["gone"] and card["reads"] > 3

    async def not_ready(ctx, link, op, payload, state):
        frame = await link.request(ctx, op, payload)
        assert Status(frame.status) == Status.NOT_READY, op
        st = RECOVERY_STATUS.unpack(frame.payload)
        assert st["state"] == state.value and st["regions"] == REGIONS
        return st

    async def scenario(ctx, link):
        assert ctx.get(top.recovering)
        st = await not_ready(ctx, link, Op.QUERY, req(Op.QUERY, n=1), RecoveryState.SCANNING)
        progress = [st["scanned"]]
        frame = await link.request(ctx, Op.PING, b"abc")
        assert (Status(frame.status), frame.payload) == (Status.OK, b"abc")
        assert Status((await link.request(ctx, Op.VERSION)).status) == Status.OK
        frame = await link.request(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=2)
                                   + pack_tokens(CFG, [1, 2]))
        assert Status(frame.status) == Status.OK
        for op, payload in ((Op.EXPORT, req(Op.EXPORT, n=1)),
                            (Op.DIR_READ, req(Op.DIR_READ, link=0)),
                            (Op.SECTOR_READ, req(Op.SECTOR_READ, lba=0)),
                            (Op.STORAGE_REBUILD, b"")):
            await ctx.tick().repeat(300)
            progress.append((await not_ready(ctx, link, op, payload,
                                             RecoveryState.SCANNING))["scanned"])
        assert progress == sorted(progress) and progress[-1] > progress[0]
        st = await wait_ready(ctx, link)
        assert (st["live"], st["next_seq"]) == (plan.live, plan.next_seq)
        assert st["cycles"] > REGIONS * SECTOR
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=2))
        assert Status(frame.status) == Status.MISS
        # the card goes: the scan fails with the storage error, never hangs
        card.update(gone=True, reads=0)
        assert Status((await link.request(ctx, Op.STORAGE_REBUILD)).status) == Status.OK
        st = await wait_ready(ctx, link)
        assert (st["state"], st["error"], st["scanned"]) == (
            RecoveryState.FAILED.value, StorageError.TIMEOUT.value, 3)
        for op in (Op.QUERY, Op.EXPORT):
            await not_ready(ctx, link, op, req(op, n=2), RecoveryState.FAILED)
        frame = await link.request(ctx, Op.DIR_READ, req(Op.DIR_READ, link=0))
        assert Status(frame.status) == Status.OK
        # it comes back: a rebuild recovers everything
        card["gone"] = False
        assert Status((await link.request(ctx, Op.STORAGE_REBUILD)).status) == Status.OK
        st = await wait_ready(ctx, link)
        assert (st["state"], st["error"], st["live"], st["next_seq"]) == (
            RecoveryState.READY.value, 0, plan.live, plan.next_seq)

    run_top(top, image, scenario, storage_dead=dead, wait_ready=False)


def test_bad_payload_is_inserted_then_a_miss_then_dropped():
    """The scan reads headers only: a record with a good header and a corrupt payload is
    inserted; its QUERY is a miss (BAD_PAYLOAD_CRC, rings emptied) that drops it, never a
    wrong answer."""
    top = make_top(regions=REGIONS)
    image = image_for(top)
    tokens = [5, 6, 7]
    from ringkv.defs.hash import hash_seed
    from ringkv.host.golden.hash import sequence_hash
    h = sequence_hash(tokens, hash_seed(CFG))
    write_store(image, [header(count=3, prefix_hash=h, seq=9)])
    image.write(1, pack_tokens(CFG, tokens).ljust(SECTOR, b"\0"))

    async def scenario(ctx, link):
        st = await status(ctx, link)
        assert (st["live"], st["next_seq"]) == (1, 10)
        await link.request(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=3)
                           + pack_tokens(CFG, tokens))
        for record_status in (RecordStatus.BAD_PAYLOAD_CRC.value, 0xFF):
            frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=3))
            r = SNAPSHOT_RESPONSE.unpack(frame.payload)
            assert (Status(frame.status), r["record_status"]) == (Status.MISS, record_status)

    run_top(top, image, scenario)
