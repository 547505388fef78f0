"""A sealed RingKVTop (``sealed=True``) in the Amaranth simulator: record keys and tenants.

KEY_SET / KEY_CLEAR and their refusals, the tenant seed registers against the golden
``tenant_seed``, tenant slots on QUERY, QUERY_PREFIX and EXPORT (refused without a key,
isolated between tenants), no key byte in any response of any opcode, the open build's
answers to the key opcodes, the MAC arbiter, and sealed records end to end (the tag the DMA
writes on export and checks on import, under the tenant's key).
"""

import random

import numpy as np
import pytest
from amaranth import Elaboratable, Mux
from amaranth.sim import Simulator
from conftest import requires_yices, requires_yowasp
from top_helpers import CFG, REGIONS, key_set_req, make_top, req, sreq

from ringkv.defs.hash import hash_seed
from ringkv.defs.mac import KEY_SLOTS, PERSON_RECORD, PERSON_SEED, PERSONS
from ringkv.defs.protocol import (
    DIR_RESPONSE,
    NO_RECORD,
    PREFIX_RESPONSE,
    RECOVERY_STATUS,
    REQUESTS,
    RESPONSES,
    RING_CLEAR_ALL,
    RING_ELEMENTS,
    RING_META,
    SNAPSHOT_RESPONSE,
    Op,
    RecoveryState,
    Status,
    build_requests,
)
from ringkv.defs.record import RecordLayout, RecordStatus
from ringkv.host.device.interface import QueryResult
from ringkv.host.device.ops import pack_attn, pack_tokens
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.host.golden.hash import sequence_hash
from ringkv.host.golden.mac import mac, tenant_seed
from ringkv.host.golden.prefix import query_prefix as golden_query_prefix
from ringkv.host.record import encode_record, import_record
from ringkv.hw.commands.keys import MacArbiter
from ringkv.hw.seal.key_slots import KeySlots
from ringkv.hw.seal.mac import MacCore
from ringkv.hw.storage.dma import DmaOp
from ringkv.sim.cocotb_run import BUILD_ROOT
from ringkv.sim.formal import bmc
from ringkv.sim.streams import stream_get, stream_put
from ringkv.sim.top_bench import image_for, run_top

DIGEST = CFG.digest()
RNG = random.Random(0x5EA1)
KEY_A, KEY_B, KEY_C = (bytes(RNG.getrandbits(8) for _ in range(32)) for _ in range(3))
ID_A, ID_B, ID_C = 7, 0x1234, 0xFFFF
SLOT_A, SLOT_B, SLOT_C = 0, 1, 3

def rand_qkv(rng, count):
    q = rng.integers(-128, 128, size=(count, CFG.q_heads, CFG.head_dim))
    k = rng.integers(-128, 128, size=(count, CFG.kv_heads, CFG.head_dim))
    v = rng.integers(-128, 128, size=(count, CFG.kv_heads, CFG.head_dim))
    return q, k, v


async def fill_session(ctx, link, tokens, rng):
    """A session of ``tokens``: token memory and every layer's rings hold them."""
    await link.call(ctx, Op.SESSION_BEGIN)
    await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=len(tokens))
                    + pack_tokens(CFG, tokens))
    for layer in range(CFG.layers):
        await link.call(ctx, Op.ATTN_PREFILL, pack_attn(CFG, layer, *rand_qkv(rng,
                                                                             len(tokens))))


def key_state(ctx, top):
    """The key slots' status and the seed registers."""
    return (ctx.get(top.key_slots.set), [ctx.get(top.key_slots.key_ids[k]) for k in
                                         range(KEY_SLOTS)],
            [ctx.get(s) for s in top.tenant_seeds])


async def device_state(ctx, link, n_tokens):
    toks = await link.call(ctx, Op.TOKENS_READ, req(Op.TOKENS_READ, offset=0, n=n_tokens))
    meta = await link.call(ctx, Op.RING_READ, req(Op.RING_READ, addr=0, n=4, what=RING_META))
    alloc = await link.call(ctx, Op.ALLOC_STATUS)
    dirs = [(await link.request(ctx, Op.DIR_READ, req(Op.DIR_READ, link=k))).payload
            for k in range(REGIONS)]
    return toks, meta, alloc[:-4], dirs


# ---------------------------------------------------------------------------------------------
def test_build_parameter_and_layouts():
    """``sealed`` is a bool; the sealed layouts append ``slot``; the open build leaves the MAC
    and the key slots out and keeps the open layouts."""
    with pytest.raises(TypeError, match=r"^sealed must be a bool, not 1$"):
        make_top(sealed=1)
    open_top, sealed_top = make_top(), make_top(sealed=True)
    assert not open_top.sealed and sealed_top.sealed
    assert not hasattr(open_top, "key_slots") and not hasattr(open_top, "mac")
    assert "seed_in" not in open_top.hasher.signature.members
    assert isinstance(sealed_top.key_slots, KeySlots) and isinstance(sealed_top.mac, MacCore)
    sealed = build_requests(True)
    for op in (Op.QUERY, Op.QUERY_PREFIX, Op.EXPORT):
        assert sealed[op].fields == REQUESTS[op].fields + (("slot", 1),)
        assert build_requests(False)[op] is REQUESTS[op]
    assert Op.KEY_SET not in build_requests(False) and Op.KEY_SET in sealed
    assert RESPONSES[Op.KEY_SET].size == RESPONSES[Op.KEY_CLEAR].size == 0


def test_open_build_refuses_key_ops():
    """An open build has no key slots: KEY_SET and KEY_CLEAR are ``UNKNOWN_OP`` (drained), a
    sealed-layout QUERY is ``BAD_LENGTH``, and the device works on."""
    top = make_top()

    async def scenario(ctx, link):
        await link.call(ctx, Op.KEY_SET, key_set_req(0, ID_A, KEY_A), Status.UNKNOWN_OP)
        await link.call(ctx, Op.KEY_CLEAR, req(Op.KEY_CLEAR, slot=0), Status.UNKNOWN_OP)
        await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=1)
                        + pack_tokens(CFG, [5]))
        await link.call(ctx, Op.QUERY, sreq(Op.QUERY, n=1, slot=0), Status.BAD_LENGTH)
        await link.call(ctx, Op.QUERY, req(Op.QUERY, n=1), Status.MISS)
        assert await link.call(ctx, Op.PING, b"ok") == b"ok"

    run_top(top, image_for(top), scenario)


def test_key_set_seeds_and_refusals():
    """KEY_SET answers ``OK`` with no payload and leaves the slot's seed register equal to the
    golden ``tenant_seed(key, config digest)``; a bad frame (length short, long or below the
    fixed part, slot past the slots, key id 0) is refused with its status and changes nothing
    (set bits, key ids, seeds; a slot already set stays set); KEY_CLEAR erases a slot, and a
    slot rewritten with another key gets that key's seed."""
    top = make_top(sealed=True)

    async def scenario(ctx, link):
        assert key_state(ctx, top) == (0, [0] * KEY_SLOTS, [0] * KEY_SLOTS)
        assert await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_A, ID_A, KEY_A)) == b""
        assert await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_C, ID_C, KEY_C)) == b""
        set_, ids, seeds = key_state(ctx, top)
        assert set_ == (1 << SLOT_A) | (1 << SLOT_C)
        assert (ids[SLOT_A], ids[SLOT_C]) == (ID_A, ID_C)
        assert seeds[SLOT_A] == tenant_seed(KEY_A, DIGEST)
        assert seeds[SLOT_C] == tenant_seed(KEY_C, DIGEST)
        before = key_state(ctx, top)
        good = key_set_req(SLOT_A, ID_B, KEY_B)
        bad = [
            (good[:-1], Status.BAD_LENGTH),                  # 31 key bytes
            (good + b"\0", Status.BAD_LENGTH),               # 33 key bytes
            (good[:2], Status.BAD_LENGTH),                   # below the fixed part
            (b"", Status.BAD_LENGTH),
            (key_set_req(KEY_SLOTS, ID_B, KEY_B), Status.BAD_ARG),
            (key_set_req(0xFF, ID_B, KEY_B), Status.BAD_ARG),
            (key_set_req(SLOT_A, 0, KEY_B), Status.BAD_ARG),         # KEY_ID_NONE
            (key_set_req(SLOT_B, 0, KEY_B), Status.BAD_ARG),
        ]
        for payload, status in bad:
            assert await link.call(ctx, Op.KEY_SET, payload, status) == b""
            assert key_state(ctx, top) == before, (payload.hex(), status)
        for payload, status in [(b"", Status.BAD_LENGTH), (b"\0\0", Status.BAD_LENGTH),
                                (bytes([KEY_SLOTS]), Status.BAD_ARG)]:
            await link.call(ctx, Op.KEY_CLEAR, payload, status)
            assert key_state(ctx, top) == before
        # the device still answers, and a good frame after the bad ones works
        assert await link.call(ctx, Op.PING, b"k") == b"k"
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_B, ID_B, KEY_B))
        assert key_state(ctx, top)[2][SLOT_B] == tenant_seed(KEY_B, DIGEST)
        # KEY_CLEAR: the slot's set bit and key id go
        assert await link.call(ctx, Op.KEY_CLEAR, req(Op.KEY_CLEAR, slot=SLOT_C)) == b""
        set_, ids, _ = key_state(ctx, top)
        assert set_ == (1 << SLOT_A) | (1 << SLOT_B) and ids[SLOT_C] == 0
        # rewriting a slot: the new key's id and seed
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_A, ID_C, KEY_C))
        set_, ids, seeds = key_state(ctx, top)
        assert ids[SLOT_A] == ID_C and seeds[SLOT_A] == tenant_seed(KEY_C, DIGEST)

    run_top(top, image_for(top), scenario, rng=random.Random(4), idle=0.2, stall=0.3)


def test_sealed_ops_refused_without_key():
    """QUERY, QUERY_PREFIX and EXPORT name a tenant slot: without a key ``NO_KEY``, past the
    slots ``BAD_ARG``, in the open layout ``BAD_LENGTH``; each refusal changes nothing (tokens,
    ring metadata, allocator, directory). Once the slot is set the same requests run."""
    top = make_top(sealed=True)
    rng = np.random.default_rng(5)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=6)]

    async def scenario(ctx, link):
        await fill_session(ctx, link, tokens, rng)
        before = await device_state(ctx, link, 6)
        refusals = [
            (Op.QUERY, sreq(Op.QUERY, n=6, slot=SLOT_A), Status.NO_KEY),
            (Op.QUERY_PREFIX, sreq(Op.QUERY_PREFIX, n=6, slot=SLOT_A), Status.NO_KEY),
            (Op.EXPORT, sreq(Op.EXPORT, n=6, slot=SLOT_A), Status.NO_KEY),
            (Op.EXPORT, sreq(Op.EXPORT, n=6, slot=KEY_SLOTS - 1), Status.NO_KEY),
            (Op.QUERY, sreq(Op.QUERY, n=6, slot=KEY_SLOTS), Status.BAD_ARG),
            (Op.QUERY_PREFIX, sreq(Op.QUERY_PREFIX, n=6, slot=0xFF), Status.BAD_ARG),
            (Op.EXPORT, sreq(Op.EXPORT, n=6, slot=KEY_SLOTS), Status.BAD_ARG),
            (Op.QUERY, req(Op.QUERY, n=6), Status.BAD_LENGTH),
            (Op.QUERY_PREFIX, req(Op.QUERY_PREFIX, n=6), Status.BAD_LENGTH),
            (Op.EXPORT, req(Op.EXPORT, n=6), Status.BAD_LENGTH),
        ]
        for op, payload, status in refusals:
            assert await link.call(ctx, op, payload, status) == b""
        assert await device_state(ctx, link, 6) == before
        # a key in another slot does not open this one
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_B, ID_B, KEY_B))
        for op, payload, status in refusals[:3]:
            await link.call(ctx, op, payload, status)
        assert await device_state(ctx, link, 6) == before
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_A, ID_A, KEY_A))
        r = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.EXPORT, sreq(
            Op.EXPORT, n=6, slot=SLOT_A)))
        assert r["hash"] == sequence_hash(tokens, tenant_seed(KEY_A, DIGEST))
        # cleared again: refused again
        await link.call(ctx, Op.KEY_CLEAR, req(Op.KEY_CLEAR, slot=SLOT_A))
        await link.call(ctx, Op.QUERY, sreq(Op.QUERY, n=6, slot=SLOT_A), Status.NO_KEY)

    run_top(top, image_for(top), scenario)


def test_tenants_are_isolated():
    """Tenant A's record is a miss for tenant B's QUERY and QUERY_PREFIX on the same tokens
    (another seed: other directory keys) and a hit for A; B's export of the same tokens is a
    record of its own. QUERY_PREFIX's fields and cycles equal the golden model's with the
    tenant's seed (one more argument byte than the open build); HASH_QUERY keeps the open
    seed."""
    top = make_top(sealed=True)
    rng = np.random.default_rng(6)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=10)]
    seed_a, seed_b = tenant_seed(KEY_A, DIGEST), tenant_seed(KEY_B, DIGEST)
    g = GoldenDirectory(buckets=top.buckets, links=top.links, regions=top.regions)

    async def prefix(ctx, link, n, slot, seed):
        frame = await link.request(ctx, Op.QUERY_PREFIX, sreq(Op.QUERY_PREFIX, n=n, slot=slot))
        status, want = golden_query_prefix(tokens, seed, n, g)
        got = PREFIX_RESPONSE.unpack(frame.payload)
        want = dict(want, cycles=want["cycles"] + 1)        # the slot byte
        assert (Status(frame.status), got) == (status, want)
        return status, got

    async def scenario(ctx, link):
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_A, ID_A, KEY_A))
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_B, ID_B, KEY_B))
        await fill_session(ctx, link, tokens, rng)
        r = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.EXPORT, sreq(
            Op.EXPORT, n=10, slot=SLOT_A)))
        assert r["hash"] == sequence_hash(tokens, seed_a) != sequence_hash(tokens, seed_b)
        g.command({"op": 1, "count": 10, "hash": r["hash"], "now": 1, "evict": 1})
        # B: a miss on the same tokens, by QUERY (the directory misses: no DMA) ...
        frame = await link.request(ctx, Op.QUERY, sreq(Op.QUERY, n=10, slot=SLOT_B))
        r = SNAPSHOT_RESPONSE.unpack(frame.payload)
        assert Status(frame.status) is Status.MISS and r["record_status"] == NO_RECORD
        assert r["hash"] == sequence_hash(tokens, seed_b)
        # ... and by QUERY_PREFIX at every length
        for n in (10, 5, 1):
            status, got = await prefix(ctx, link, n, SLOT_B, seed_b)
            assert status is Status.MISS and got["count"] == 0
        # A: a hit by QUERY_PREFIX, then QUERY imports
        status, got = await prefix(ctx, link, 10, SLOT_A, seed_a)
        assert status is Status.HIT and got["count"] == 10
        await link.call(ctx, Op.SESSION_BEGIN)
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=10)
                        + pack_tokens(CFG, tokens))
        await link.call(ctx, Op.QUERY, sreq(Op.QUERY, n=10, slot=SLOT_A), Status.HIT)
        # B's export of the same tokens: a second record, under B's key
        r = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.EXPORT, sreq(
            Op.EXPORT, n=10, slot=SLOT_B)))
        assert r["hash"] == sequence_hash(tokens, seed_b) and r["region"] == 1
        alloc = RESPONSES[Op.ALLOC_STATUS].unpack(await link.call(ctx, Op.ALLOC_STATUS))
        assert alloc["live"] == 2
        # HASH_QUERY hashes with the open seed, after tenant requests too
        h = RESPONSES[Op.HASH_QUERY].unpack(await link.call(ctx, Op.HASH_QUERY, req(
            Op.HASH_QUERY, n=10)))["hash"]
        assert h == sequence_hash(tokens, hash_seed(CFG))

    dma_cmds = []

    async def watch_dma(ctx):
        """Every command the DMA takes: its op, ``sealed`` and ``slot``."""
        cmd = top.dma.cmd
        async for _, _, valid, ready, p in ctx.tick().sample(cmd.valid, cmd.ready, cmd.payload):
            if valid and ready:
                dma_cmds.append((DmaOp(p.op), p.sealed, p.slot))

    run_top(top, image_for(top), scenario, monitors=[watch_dma])
    # the power-on scan's HEADER reads are open; the tenants' transfers are sealed, under
    # the request's slot: A's export, A's import, B's export
    assert [c for c in dma_cmds if c[0] is not DmaOp.HEADER] == [
        (DmaOp.EXPORT, 1, SLOT_A), (DmaOp.IMPORT, 1, SLOT_A), (DmaOp.EXPORT, 1, SLOT_B)]
    headers = [c for c in dma_cmds if c[0] is DmaOp.HEADER]
    assert len(headers) == REGIONS and all(c[1:] == (0, 0) for c in headers)


def _windows(key: bytes, width: int = 4):
    for k in (key, key[::-1]):
        for i in range(len(k) - width + 1):
            yield k[i:i + width]


def test_no_key_material_in_any_response():
    """Every opcode of :class:`Op` is sent to a sealed device holding three keys (valid
    requests, so that each does its work: exports, hits, sector reads of the records, the
    recovery scan, ...), and no response payload holds any 4 consecutive bytes of a key, in
    either order.

    Why this holds by construction, not by chance: a key's only storage is ``KeySlots``' LUT
    RAM, and that RAM's only read port (``KeyReadSignature``) belongs to the MAC core, whose
    message buffer it feeds and whose only output is a BLAKE2s tag. The dispatcher never
    stores a key: ``KEY_SET``'s key bytes go from the frame decoder's data stream into the
    slots' write port, and both key opcodes answer with a status and no payload. What leaves
    the MAC is a record's tag (written to storage) or a tenant seed (the MAC of the public
    configuration digest); recovering a key from either is a key-recovery attack on keyed
    BLAKE2s. The test is the system-level check that no other path exists."""
    top = make_top(sealed=True)
    image = image_for(top)
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=7)]
    lay = RecordLayout(CFG)
    payloads, ops = [], set()

    async def call(ctx, link, op, payload=b"", status=Status.OK):
        frame = await link.request(ctx, op, payload)
        assert Status(frame.status) is status, (op, Status(frame.status))
        payloads.append(frame.payload)
        ops.add(op)
        return frame.payload

    async def scenario(ctx, link):
        for slot, kid, key in ((SLOT_A, ID_A, KEY_A), (SLOT_B, ID_B, KEY_B),
                               (SLOT_C, ID_C, KEY_C)):
            await call(ctx, link, Op.KEY_SET, key_set_req(slot, kid, key))
        await call(ctx, link, Op.KEY_SET, key_set_req(SLOT_A, 0, KEY_A), Status.BAD_ARG)
        await call(ctx, link, Op.KEY_SET, key_set_req(SLOT_A, ID_A, KEY_A)[:-3],
                   Status.BAD_LENGTH)
        await call(ctx, link, Op.PING, bytes(range(40)))
        for op in (Op.VERSION, Op.CONFIG_DIGEST, Op.STATS, Op.STATS_CLEAR, Op.SESSION_BEGIN):
            await call(ctx, link, op)
        await call(ctx, link, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=6)
                   + pack_tokens(CFG, tokens[:6]))
        await call(ctx, link, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=6)
                   + pack_tokens(CFG, tokens[:6]))
        await call(ctx, link, Op.TOKENS_READ, req(Op.TOKENS_READ, offset=0, n=6))
        await call(ctx, link, Op.HASH_QUERY, req(Op.HASH_QUERY, n=6))
        for layer in range(CFG.layers):
            await call(ctx, link, Op.ATTN_PREFILL, pack_attn(CFG, layer, *rand_qkv(rng, 6)))
        await call(ctx, link, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=1)
                   + pack_tokens(CFG, tokens[6:]))
        for layer in range(CFG.layers):
            await call(ctx, link, Op.ATTN_DECODE, pack_attn(CFG, layer, *rand_qkv(rng, 1)))
        for slot in (SLOT_A, SLOT_B):
            await call(ctx, link, Op.EXPORT, sreq(Op.EXPORT, n=7, slot=slot))
        r = SNAPSHOT_RESPONSE.unpack(await call(ctx, link, Op.QUERY, sreq(
            Op.QUERY, n=7, slot=SLOT_A), Status.HIT))
        await call(ctx, link, Op.QUERY_PREFIX, sreq(Op.QUERY_PREFIX, n=7, slot=SLOT_B),
                   Status.HIT)
        await call(ctx, link, Op.QUERY, sreq(Op.QUERY, n=7, slot=SLOT_C), Status.MISS)
        await call(ctx, link, Op.IMPORT, b"", Status.UNKNOWN_OP)
        # (a build without the SDRAM self-test: refused as any op it does not execute)
        await call(ctx, link, Op.SDRAM_TEST, req(Op.SDRAM_TEST, tests=1, words=0, pause_ms=0),
                   Status.UNKNOWN_OP)
        await call(ctx, link, Op.RING_READ, req(Op.RING_READ, addr=0, n=512, what=RING_ELEMENTS))
        await call(ctx, link, Op.RING_READ, req(Op.RING_READ, addr=0, n=4, what=RING_META))
        d = DIR_RESPONSE.unpack(await call(ctx, link, Op.DIR_LOOKUP, req(
            Op.DIR_LOOKUP, count=7, hash=r["hash"])))
        await call(ctx, link, Op.DIR_READ, req(Op.DIR_READ, link=d["link"]))
        await call(ctx, link, Op.DIR_TOUCH, req(Op.DIR_TOUCH, link=d["link"]))
        await call(ctx, link, Op.DIR_EXPIRE, req(Op.DIR_EXPIRE, max_age=1 << 30))
        new = DIR_RESPONSE.unpack(await call(ctx, link, Op.DIR_INSERT, req(
            Op.DIR_INSERT, count=3, hash=12345, region=0, flags=1)))
        await call(ctx, link, Op.DIR_DELETE, req(Op.DIR_DELETE, link=new["link"]))
        for s in range(lay.sectors_per_region):       # tenant A's record, every sector
            await call(ctx, link, Op.SECTOR_READ, req(Op.SECTOR_READ, lba=lay.region_lba(0) + s))
        await call(ctx, link, Op.SECTOR_READ, req(Op.SECTOR_READ, lba=lay.region_lba(1)))
        await call(ctx, link, Op.STORAGE_INFO)
        await call(ctx, link, Op.STORAGE_REBUILD)
        while True:
            st = RECOVERY_STATUS.unpack(await call(ctx, link, Op.STORAGE_STATUS))
            if st["state"] == RecoveryState.READY.value:
                break
        await call(ctx, link, Op.DIR_CLEAR, req(Op.DIR_CLEAR, next_seq=9))
        await call(ctx, link, Op.ALLOC_STATUS)
        await call(ctx, link, Op.RING_CLEAR, req(Op.RING_CLEAR, layer=RING_CLEAR_ALL))
        await call(ctx, link, Op.KEY_CLEAR, req(Op.KEY_CLEAR, slot=SLOT_C))
        await call(ctx, link, Op.STATS)

    run_top(top, image, scenario)
    assert ops == set(Op)
    assert sum(map(len, payloads)) > 4_000
    for key in (KEY_A, KEY_B, KEY_C):
        for w in _windows(key):
            assert not any(w in p for p in payloads), w.hex()


# -- the sealed records (the DMA's part) ---------------------------------------------------------

def test_sealed_export_is_the_golden_sealed_record():
    """A sealed EXPORT writes the golden sealed record: key id of the slot, the tag of
    ``encode_record(..., key=, key_id=)``; it verifies under the tenant's key only."""
    top = make_top(sealed=True)
    image = image_for(top)
    rng = np.random.default_rng(8)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=9)]
    lay = RecordLayout(CFG)

    async def scenario(ctx, link):
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_B, ID_B, KEY_B))
        await fill_session(ctx, link, tokens, rng)
        r = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.EXPORT, sreq(
            Op.EXPORT, n=9, slot=SLOT_B)))
        rings = np.zeros((CFG.layers, CFG.kv_heads, 2, CFG.window, CFG.head_dim),
                         dtype=np.uint8)
        status, header, _ = import_record(
            CFG, image.read, r["region"], count=9, prefix_hash=r["hash"],
            session_tokens=tokens, rings=rings, sealed=True, keys={ID_B: KEY_B})
        assert status is RecordStatus.OK
        assert header.key_id == ID_B and any(header.mac_tag)
        status, _, _ = import_record(
            CFG, image.read, r["region"], count=9, prefix_hash=r["hash"],
            session_tokens=tokens, rings=rings.copy(), sealed=True, keys={ID_B: KEY_A})
        assert status is RecordStatus.BAD_MAC
        base = lay.region_lba(r["region"])
        assert image.read(base, 1)[308:324] == header.mac_tag

    run_top(top, image, scenario)


def test_sealed_import_takes_only_the_tenants_verified_record():
    """A sealed QUERY imports a record only if it is sealed under the slot's key id and its
    tag verifies: the golden sealed record is a HIT; an open record, one sealed under another
    key id and one whose tag is forged are MISSes (``NO_KEY``, ``BAD_MAC``), stored under the
    tenant's directory key so that only the DMA's checks can refuse them."""
    top = make_top(sealed=True)
    image = image_for(top)
    rng = np.random.default_rng(9)
    lay = RecordLayout(CFG)
    seed_a = tenant_seed(KEY_A, DIGEST)
    rings = rng.integers(-128, 128, size=(CFG.layers, CFG.kv_heads, 2, CFG.window,
                                          CFG.head_dim))
    cases = []
    for region, (key, key_id) in enumerate([(KEY_A, ID_A), (None, 0), (KEY_B, ID_B),
                                            (KEY_B, ID_A)]):
        tokens = [int(t) for t in rng.integers(0, 1 << 16, size=5)]
        h = sequence_hash(tokens, seed_a)
        for offset, data in encode_record(CFG, tokens, rings, count=5, ring_head=4,
                                          prefix_hash=h, commit_seq=region + 1, key=key,
                                          key_id=key_id):
            image.write(lay.region_lba(region) + offset, data)
        cases.append((tokens, h))
    want = [RecordStatus.OK, RecordStatus.NO_KEY, RecordStatus.NO_KEY, RecordStatus.BAD_MAC]

    async def scenario(ctx, link):
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_A, ID_A, KEY_A))
        for (tokens, h), status in zip(cases, want):
            await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=5)
                            + pack_tokens(CFG, tokens))
            frame = await link.request(ctx, Op.QUERY, sreq(Op.QUERY, n=5, slot=SLOT_A))
            r = SNAPSHOT_RESPONSE.unpack(frame.payload)
            assert r["hash"] == h and r["dir_status"] == 0      # the directory hit
            assert r["record_status"] == status.value, (r, status)
            # asked again: a NO_KEY record is still in the directory (another key's record:
            # kept, LRU ages it out); a forged one (BAD_MAC) was freed: a directory miss
            frame = await link.request(ctx, Op.QUERY, sreq(Op.QUERY, n=5, slot=SLOT_A))
            r = SNAPSHOT_RESPONSE.unpack(frame.payload)
            if status is RecordStatus.BAD_MAC:
                assert r["dir_status"] != 0 and r["record_status"] == NO_RECORD, r
            else:
                assert r["dir_status"] == 0 and r["record_status"] == status.value, r

    run_top(top, image, scenario)


def test_no_key_record_stays_for_its_tenant():
    """A record refused with ``NO_KEY`` stays in the directory, so one tenant's request never
    frees another tenant's record. Slot B holds A's key bytes under another key id, so B's
    seed, and with it B's directory keys, are A's: B's QUERY_PREFIX finds A's entry (a probe
    does not verify), B's QUERY of it is a MISS with ``NO_KEY`` (decided at the header) that
    leaves the entry where it was (its link and region, one live record), twice, and then
    A's QUERY is a HIT. B's QUERY refreshes the entry's stamp: the directory's LOOKUP does
    that on every hit, before the DMA reads the header (``docs/blocks/directory.md``)."""
    top = make_top(sealed=True)
    rng = np.random.default_rng(13)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=10)]

    async def dir_read(ctx, link, k):
        return DIR_RESPONSE.unpack(await link.call(ctx, Op.DIR_READ, req(Op.DIR_READ, link=k)))

    async def scenario(ctx, link):
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_A, ID_A, KEY_A))
        await link.call(ctx, Op.KEY_SET, key_set_req(SLOT_B, ID_B, KEY_A))
        await fill_session(ctx, link, tokens, rng)
        e = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.EXPORT, sreq(
            Op.EXPORT, n=10, slot=SLOT_A)))
        assert e["hash"] == sequence_hash(tokens, tenant_seed(KEY_A, DIGEST))
        p = PREFIX_RESPONSE.unpack(await link.call(ctx, Op.QUERY_PREFIX, sreq(
            Op.QUERY_PREFIX, n=10, slot=SLOT_B), Status.HIT))
        assert (p["count"], p["hash"], p["link"], p["region"]) == (10, e["hash"], e["link"],
                                                                    e["region"])
        before = await dir_read(ctx, link, e["link"])
        for _ in range(2):
            frame = await link.request(ctx, Op.QUERY, sreq(Op.QUERY, n=10, slot=SLOT_B))
            r = SNAPSHOT_RESPONSE.unpack(frame.payload)
            assert Status(frame.status) is Status.MISS
            assert (r["dir_status"], r["record_status"], r["link"], r["region"]) == (
                0, RecordStatus.NO_KEY.value, e["link"], e["region"]), r
            after = await dir_read(ctx, link, e["link"])
            assert (after["count"], after["hash"], after["region"]) == (10, e["hash"],
                                                                       e["region"])
            assert after["stamp"] > before["stamp"]          # the lookup's refresh
            before = after
        alloc = RESPONSES[Op.ALLOC_STATUS].unpack(await link.call(ctx, Op.ALLOC_STATUS))
        assert alloc["live"] == 1
        r = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.QUERY, sreq(
            Op.QUERY, n=10, slot=SLOT_A), Status.HIT))
        assert (r["link"], r["region"], r["record_status"]) == (e["link"], e["region"],
                                                                RecordStatus.OK.value)

    run_top(top, image_for(top), scenario)


# -- the MAC arbiter -----------------------------------------------------------------------------

def test_mac_arbiter_shares_the_core():
    """Two users send random messages through one MAC core behind :class:`MacArbiter` with
    random idle and stalls, asking at the same time; each gets the golden tag of each of its
    own messages (its key slot, its person), in order."""
    from amaranth import Module
    from amaranth.lib import wiring

    class Bench(wiring.Component):
        def __init__(self):
            self.arb, self.core, self.slots = MacArbiter(), MacCore(), KeySlots()
            super().__init__({"a": wiring.In(self.arb.dma.signature.flip()),
                              "b": wiring.In(self.arb.seed.signature.flip()),
                              "kw": wiring.In(self.slots.write.signature.flip())})

        def elaborate(self, platform):
            m = Module()
            m.submodules.arb, m.submodules.core = self.arb, self.core
            m.submodules.slots = self.slots
            wiring.connect(m, wiring.flipped(self.a), self.arb.dma)
            wiring.connect(m, wiring.flipped(self.b), self.arb.seed)
            wiring.connect(m, wiring.flipped(self.kw), self.slots.write)
            wiring.connect(m, self.core.key, self.slots.read)
            wiring.connect(m, self.arb.core.cmd, self.core.cmd)
            wiring.connect(m, self.arb.core.i, self.core.i)
            wiring.connect(m, self.core.o, self.arb.core.o)
            return m

    dut = Bench()
    rng = random.Random(12)
    keys = {s: bytes(rng.getrandbits(8) for _ in range(32)) for s in range(KEY_SLOTS)}
    msgs = {u: [(rng.randrange(KEY_SLOTS), rng.randrange(len(PERSONS)),
                 bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 31, 64, 65, 130]))))
                for _ in range(6)] for u in "ab"}
    got = {"a": [], "b": []}

    async def user(ctx, name):
        port = getattr(dut, name)
        r = random.Random(ord(name))
        for _ in range(200):        # the keys are written first
            await ctx.tick()
        for slot, person, msg in msgs[name]:
            await stream_put(ctx, port.cmd, {"person": person, "slot": slot,
                                             "empty": not msg}, rng=r, idle=0.3)
            for i, byte in enumerate(msg):
                await stream_put(ctx, port.i, {"data": byte, "last": i == len(msg) - 1},
                                 rng=r, idle=0.2)
            tag = await stream_get(ctx, port.o, rng=r, stall=0.4)
            got[name].append(int(tag).to_bytes(16, "little"))

    async def writer(ctx):
        for slot, key in keys.items():
            for index, byte in enumerate((slot + 1).to_bytes(2, "little") + key):
                await stream_put(ctx, dut.kw, {"slot": slot, "index": index, "data": byte,
                                               "clear": 0})

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(writer, background=True)

    async def user_a(ctx):
        await user(ctx, "a")

    async def user_b(ctx):
        await user(ctx, "b")

    sim.add_testbench(user_a)
    sim.add_testbench(user_b)
    sim.run()
    for name in "ab":
        assert got[name] == [mac(keys[s], msg, person=PERSONS[p]) for s, p, msg in msgs[name]]
    assert PERSONS == (PERSON_RECORD, PERSON_SEED)


# -- the host driver -----------------------------------------------------------------------------

def test_fpga_device_tenants(caplog):
    """``FpgaDevice(sealed=True)``: the SoftwareDevice's sealed API over the link into a
    sealed top. Keys come from a KeyRing and go into device slots on first use; tenant A's
    export is a hit for A (QUERY and QUERY_PREFIX) and a miss for B; a tenant without a key
    raises KeyRequired before anything is sent; a device that lost its slots (KEY_CLEAR
    here, a reset on a board) gets the key again and the request is repeated; no key is
    logged. On an open build, writing a key is a ConfigError."""
    import logging

    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    from ringkv.host.errors import ConfigError, KeyRequired
    from ringkv.host.keys import KeyRing
    from ringkv.sim.top_bench import SimPort

    caplog.set_level(logging.DEBUG)
    ring = KeyRing({ID_A: KEY_A, ID_B: KEY_B}, "test")
    tenants = {"a": ID_A, "b": ID_B}
    rng = np.random.default_rng(10)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=10)]
    hash_a = sequence_hash(tokens, tenant_seed(KEY_A, DIGEST))
    hash_b = sequence_hash(tokens, tenant_seed(KEY_B, DIGEST))
    with pytest.raises(TypeError, match=r"^keys must be a KeyRing \(ringkv.host.keys."
                                        r"load_keys\), not dict$"):
        FpgaDevice(None, CFG, sealed=True, keys={ID_A: KEY_A})
    top = make_top(sealed=True)
    with SimPort(top, image_for(top)) as port:
        dev = FpgaDevice(Link(port, timeout=120, retries=0), CFG, max_payload=1024,
                         sealed=True, keys=ring, tenants=tenants)
        dev.wait_ready()
        assert "KeyRing" not in repr(dev) and KEY_A.hex() not in repr(dev)
        sent, request = [], dev.link.request

        def counted(op, *args, **kw):
            sent.append(op)
            return request(op, *args, **kw)
        dev.link.request = counted
        with pytest.raises(KeyRequired, match=r"^sealed device: tenant 'c' has no key "
                                              r"\(unknown tenant\)$"):
            dev.query(tokens, tenant="c")
        assert sent == []                               # refused before anything is sent
        dev.write_tokens(tokens)
        for layer in range(CFG.layers):
            dev.prefill(layer, *(rng.standard_normal((10, heads, CFG.head_dim)) * 0.5
                                 for heads in (CFG.q_heads, CFG.kv_heads, CFG.kv_heads)))
        assert dev.export(tokens, tenant="a")[0] == (10, hash_a)
        assert dev._slots == {ID_A: 0}
        assert dev.query(tokens, tenant="b") == QueryResult(False, 10, hash_b, "no record")
        assert dev.query_prefix(tokens + [1, 2], 12, tenant="b").hit is False
        assert dev._slots == {ID_A: 0, ID_B: 1}
        assert dev.query(tokens, tenant="a") == QueryResult(True, 10, hash_a, "")
        assert dev.import_(QueryResult(True, 10, hash_a, ""), tenant="a") > 0
        got = dev.query_prefix(tokens + [1, 2], 12, tenant="a")
        assert (got.hit, got.count, got.prefix_hash) == (True, 10, hash_a)
        # the device loses slot 0: NO_KEY, the key is written again, the query repeated
        dev.link.request(Op.KEY_CLEAR, REQUESTS[Op.KEY_CLEAR].pack(slot=0))
        del sent[:]
        assert dev.query(tokens, tenant="a").hit
        assert sent.count(Op.KEY_SET) == 1 and sent.count(Op.QUERY) == 2
        # a key given later, with its tenants
        dev.set_key(ID_C, KEY_C, tenants=["c"])
        assert dev.query(tokens, tenant="c").hit is False
    text = caplog.text
    for key in (KEY_A, KEY_B, KEY_C):
        assert key.hex() not in text and key.hex().upper() not in text
    assert "key id 7 written to device slot 0" in text
    top = make_top()
    with SimPort(top, image_for(top)) as port:
        dev = FpgaDevice(Link(port, timeout=120, retries=0), CFG, max_payload=1024,
                         sealed=True, keys=ring, tenants=tenants)
        with pytest.raises(ConfigError, match=r"^the device is an open build: it has no key "
                                              r"slots$"):
            dev.query(tokens, tenant="a")
        assert dev.is_sealed_build() is False
    # the other way round: an open driver on a sealed build is told so, not a bare BAD_LENGTH
    top = make_top(sealed=True)
    with SimPort(top, image_for(top)) as port:
        dev = FpgaDevice(Link(port, timeout=120, retries=0), CFG, max_payload=1024)
        dev.wait_ready()
        assert dev.is_sealed_build() is True
        dev.write_tokens(tokens)
        for call in (lambda: dev.query(tokens), lambda: dev.query_prefix(tokens, 10),
                     lambda: dev.export(tokens)):
            with pytest.raises(ConfigError, match=r"^the device refused (QUERY|QUERY_PREFIX|"
                                                  r"EXPORT)'s open layout: it is a sealed "
                                                  r"build") as e:
                call()
            assert "--sealed" in e.value.hint


def test_fpga_device_no_key_keeps_the_record():
    """``FpgaDevice`` over a sealed top: tenant B's key id holds tenant A's key bytes (the
    same seed, the same directory keys), so B's ``query`` and ``query_prefix`` of A's record
    reach it and miss with "no key"; the record stays (one live directory entry, its region),
    and A's ``query`` then hits, as on the software device."""
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    from ringkv.host.keys import KeyRing
    from ringkv.sim.top_bench import SimPort

    ring = KeyRing({ID_A: KEY_A, ID_B: KEY_A}, "test")
    rng = np.random.default_rng(14)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=10)]
    hash_a = sequence_hash(tokens, tenant_seed(KEY_A, DIGEST))
    top = make_top(sealed=True)
    with SimPort(top, image_for(top)) as port:
        dev = FpgaDevice(Link(port, timeout=120, retries=0), CFG, max_payload=1024,
                         sealed=True, keys=ring, tenants={"a": ID_A, "b": ID_B})
        dev.wait_ready()
        dev.write_tokens(tokens)
        for layer in range(CFG.layers):
            dev.prefill(layer, *(rng.standard_normal((10, heads, CFG.head_dim)) * 0.5
                                 for heads in (CFG.q_heads, CFG.kv_heads, CFG.kv_heads)))
        assert dev.export(tokens, tenant="a")[0] == (10, hash_a)
        [(count, h, region)] = dev.directory()
        assert (count, h) == (10, hash_a)
        assert dev.query(tokens, tenant="b") == QueryResult(False, 10, hash_a, "no key")
        got = dev.query_prefix(tokens + [1, 2], 12, tenant="b")
        assert (got.hit, got.count, got.reason) == (False, 0, "no key")
        assert dev.directory() == [(10, hash_a, region)]
        assert dev.query(tokens, tenant="a") == QueryResult(True, 10, hash_a, "")


# -- the MAC arbiter, model-checked --------------------------------------------------------------

class ArbiterHarness(Elaboratable):
    """:class:`MacArbiter` with every input free (both users' streams and aborts, the core's
    ready and valid signals: any idle, backpressure and timing the core might have) and the
    ownership the users see, tracked from their own transfers: a user owns the core from its
    ``cmd`` transfer until its tag's transfer or its ``abort``."""

    def __init__(self, bug=None):
        from amaranth import Signal
        self.dut = MacArbiter(_bug=bug)
        self.free = {}
        for user in ("dma", "seed"):
            for name in ("cmd_valid", "i_valid", "i_data", "o_ready", "abort"):
                self.free[f"{user}_{name}"] = Signal(8 if name == "i_data" else 1,
                                                     name=f"{user}_{name}")
        for name in ("cmd_ready", "i_ready", "o_valid"):
            self.free[f"core_{name}"] = Signal(name=f"core_{name}")

    def ports(self):
        return list(self.free.values())

    def elaborate(self, platform):
        from amaranth import Module, ResetSignal, Signal
        from amaranth.hdl import Assert, Assume
        m = Module()
        m.submodules.dut = dut = self.dut
        f = self.free
        owns = {}
        for user in ("dma", "seed"):
            port = getattr(dut, user)
            m.d.comb += [port.cmd.valid.eq(f[f"{user}_cmd_valid"]),
                         port.i.valid.eq(f[f"{user}_i_valid"]),
                         port.i.payload.data.eq(f[f"{user}_i_data"]),
                         port.o.ready.eq(f[f"{user}_o_ready"]),
                         port.abort.eq(f[f"{user}_abort"])]
            own = owns[user] = Signal(name=f"{user}_owns")
            with m.If(port.cmd.valid & port.cmd.ready):
                m.d.sync += own.eq(1)
            with m.Elif(own & ((port.o.valid & port.o.ready) | port.abort)):
                m.d.sync += own.eq(0)
        m.d.comb += [dut.core.cmd.ready.eq(f["core_cmd_ready"]),
                     dut.core.i.ready.eq(f["core_i_ready"]),
                     dut.core.o.valid.eq(f["core_o_valid"]), Assume(~ResetSignal())]
        a, b = dut.dma, dut.seed
        core = dut.core
        m.d.comb += [
            Assert(~(owns["dma"] & owns["seed"])),
            Assert(~(a.cmd.ready & b.cmd.ready)),
            Assert(~core.cmd.valid | ~(owns["dma"] | owns["seed"])),
            Assert(~a.i.ready | owns["dma"]), Assert(~b.i.ready | owns["seed"]),
            Assert(~a.o.valid | owns["dma"]), Assert(~b.o.valid | owns["seed"]),
            Assert(core.i.valid == ((owns["dma"] & a.i.valid) | (owns["seed"] & b.i.valid))),
            Assert(~core.i.valid | (core.i.payload.data == Mux(owns["seed"], b.i.payload.data,
                                                               a.i.payload.data))),
        ]
        return m


@requires_yowasp
@requires_yices
@pytest.mark.parametrize("bug,verdict", [(None, "PASS"), ("no_lock", "FAIL"),
                                         ("shared_tag", "FAIL")])
def test_mac_arbiter_formal(bug, verdict):
    """Every run of up to 12 clocks (the arbiter's state is two bits: every ownership
    sequence is reached within a few): one owner at a time, one ``cmd.ready`` at a time, no
    new message while one is owned, ``i.ready``/``o.valid`` only to the owner, the core's
    bytes the owner's. The broken variants fail."""
    workdir = BUILD_ROOT / "formal" / f"mac_arbiter_{bug or 'ok'}"
    assert bmc(ArbiterHarness(bug), workdir, 12) == verdict
