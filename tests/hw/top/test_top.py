"""RingKVTop in the Amaranth simulator: every op through byte frames, against golden models."""

import os
import random
from pathlib import Path

import numpy as np
import pytest
from top_helpers import CFG, CFG2, LANES, REGIONS, make_top, req

from ringkv.defs.config import RingKVConfig
from ringkv.defs.hash import hash_seed
from ringkv.defs.protocol import (
    DIR_RESPONSE,
    FLAG_EXISTING,
    NO_RECORD,
    RESPONSES,
    RING_CLEAR_ALL,
    RING_ELEMENTS,
    RING_META,
    SNAPSHOT_RESPONSE,
    STORAGE_INFO,
    CardType,
    Op,
    Status,
    StorageError,
    StorageKind,
    attn_out_bytes,
)
from ringkv.defs.record import RecordLayout, RecordStatus, elem_bytes, header_template
from ringkv.host.device.frames import encode_request
from ringkv.host.device.ops import pack_attn, pack_tokens, unpack_attn, unpack_tokens
from ringkv.host.golden.fixed import FixedRingCore
from ringkv.host.golden.hash import sequence_hash
from ringkv.host.record import rings_from_image
from ringkv.hw.top import RingKVTop
from ringkv.sim import cycle_signature
from ringkv.sim.top_bench import image_for, run_top

CYCLES = Path(__file__).resolve().parents[2] / "data" / "top_cycles"


@pytest.fixture(autouse=True)
def same_cycles(request):
    """Every scenario's response bytes leave at the clocks recorded in ``data/top_cycles``
    (``ringkv.sim.cycle_signature``; ``RINGKV_UPDATE_CYCLES=1`` rewrites them)."""
    with cycle_signature.recording() as rec:
        yield
    if not rec.runs:
        return
    path = CYCLES / f"{request.node.name}.json"
    if os.environ.get("RINGKV_UPDATE_CYCLES") == "1":
        cycle_signature.save(path, rec.runs)
        return
    want = cycle_signature.load(path)
    assert want is not None, f"no cycle signature {path.name}: run with RINGKV_UPDATE_CYCLES=1"
    diff = cycle_signature.compare(want, rec.runs)
    assert diff is None, f"response timing changed: {diff}"


def rand_qkv(rng, count, config=CFG):
    lim = 1 << (8 * elem_bytes(config) - 1)       # the full int8 / int16 range
    q = rng.integers(-lim, lim, size=(count, config.q_heads, config.head_dim))
    k = rng.integers(-lim, lim, size=(count, config.kv_heads, config.head_dim))
    v = rng.integers(-lim, lim, size=(count, config.kv_heads, config.head_dim))
    return q, k, v


def golden_attend(core, layer, q, k, v):
    c = core
    g = c.group
    out = np.zeros((len(k), c.q_heads, c.head_dim), dtype=np.int64)
    for h in range(c.kv_heads):
        out[:, h * g:(h + 1) * g] = core.attend(layer, h, q[:, h * g:(h + 1) * g], k[:, h],
                                                v[:, h])
    return out


async def attend(ctx, link, layer, q, k, v, op=Op.ATTN_PREFILL, config=CFG):
    payload = await link.call(ctx, op, pack_attn(config, layer, q, k, v))
    assert len(payload) == attn_out_bytes(config, len(k))
    return unpack_attn(config, payload, len(k))


async def read_rings(ctx, link, config=CFG):
    """Signed ring elements (RING_READ counts bytes of the byte-addressed port) and meta."""
    c = config
    total = c.layers * c.kv_heads * 2 * c.window * c.head_dim * elem_bytes(c)
    elems = b""
    for addr in range(0, total, 512):
        n = min(512, total - addr)
        elems += await link.call(ctx, Op.RING_READ,
                            req(Op.RING_READ, addr=addr, n=n, what=RING_ELEMENTS))
    rings = rings_from_image(c, elems, signed=True)
    raw = await link.call(ctx, Op.RING_READ,
                     req(Op.RING_READ, addr=0, n=c.layers * c.kv_heads, what=RING_META))
    meta = [(int.from_bytes(raw[i:i + 4], "little"), int.from_bytes(raw[i + 4:i + 6], "little"))
            for i in range(0, len(raw), 6)]
    return rings, meta


# ---------------------------------------------------------------------------------------------
def test_parameter_checks():
    with pytest.raises(TypeError, match=r"^config must be a RingKVConfig, not 3$"):
        RingKVTop(3)
    with pytest.raises(ValueError, match=r"^regions must be a power of two between 2 and "
                                         r"32768, not 3$"):
        RingKVTop(CFG, regions=3)
    with pytest.raises(ValueError, match=r"^links must be a power of two between 2 and 32768, "
                                         r"not 5$"):
        RingKVTop(CFG, links=5)
    with pytest.raises(ValueError, match=r"^max_payload must be between 1 and 65535, "
                                         r"not 0$"):
        RingKVTop(CFG, max_payload=0)
    with pytest.raises(ValueError, match=r"^max_payload must be at least 68 bytes \(one "
                                         r"attention token of this config\), not 40$"):
        RingKVTop(CFG, max_payload=40, lanes=2, macs=4)
    # numerics ringkv-fx2: one attention token is twice the q/k/v bytes
    with pytest.raises(ValueError, match=r"^max_payload must be at least 132 bytes \(one "
                                         r"attention token of this config\), not 100$"):
        RingKVTop(CFG2, max_payload=100, lanes=2, macs=4)
    with pytest.raises(ValueError, match=r"^unknown numerics 'ringkv-fx7' \(known: ringkv-fx1, "
                                         r"ringkv-fx1c, ringkv-fx2\): no record layout for it$"):
        RingKVTop(RingKVConfig(**{**CFG.__dict__, "numerics": "ringkv-fx7"}))
    with pytest.raises(TypeError, match=r"^storage_kind must be a StorageKind, not 2$"):
        RingKVTop(CFG, storage_kind=2)
    with pytest.raises(ValueError, match=r"^sd_clock_hz must be between 0 and 4294967295, "
                                         r"not -1$"):
        RingKVTop(CFG, sd_clock_hz=-1)
    with pytest.raises(TypeError, match=r"^regions must be an integer, not 4\.0$"):
        RingKVTop(CFG, regions=4.0)


def test_storage_info():
    """STORAGE_INFO: the build's storage parameters, the controller's state as driven on the
    top's ``storage_info`` port, and every failed storage operation counted with its error
    (here a SECTOR_READ on a dead medium, twice); SECTOR_READ works again afterwards."""
    top = make_top(storage_kind=StorageKind.SD_NATIVE, sd_clock_hz=20_000_000)
    image = image_for(top)
    dead = [False]
    info = top.storage_info

    async def get(ctx, link):
        return STORAGE_INFO.unpack(await link.call(ctx, Op.STORAGE_INFO))

    async def scenario(ctx, link):
        r = await get(ctx, link)
        assert r == dict(kind=StorageKind.SD_NATIVE.value, card_type=CardType.UNKNOWN.value,
                         initialised=0, bus_width=4, high_speed=0, last_error=0, errors=0,
                         sd_clock_hz=20_000_000, sectors=0, hot_slots=0, hot_residents=0,
                         hot_slot_sectors=0, hot_slot_tokens=0)
        ctx.set(info.ready, 1)
        ctx.set(info.card_type, CardType.SDHC.value)
        ctx.set(info.high_speed, 1)
        ctx.set(info.sectors, (1 << 32) + 1024)       # a 2 TiB SDXC card: 33 bits
        r = await get(ctx, link)
        assert (r["card_type"], r["initialised"], r["high_speed"], r["sectors"]) == (
            CardType.SDHC.value, 1, 1, (1 << 32) + 1024)
        dead[0] = True
        for _ in range(2):
            await link.call(ctx, Op.SECTOR_READ, req(Op.SECTOR_READ, lba=3),
                       status=Status.STORAGE_ERROR)
        dead[0] = False
        assert len(await link.call(ctx, Op.SECTOR_READ, req(Op.SECTOR_READ, lba=3))) == 512
        ctx.set(info.card_type, CardType.SDSC.value)
        r = await get(ctx, link)
        assert (r["last_error"], r["errors"], r["card_type"]) == (
            StorageError.TIMEOUT.value, 2, CardType.SDSC.value)

    run_top(top, image, scenario, storage_dead=lambda: dead[0])
    # without a controller (the default): kind NONE, bus width 0, no clock
    top = make_top()

    async def plain(ctx, link):
        r = await get(ctx, link)
        assert (r["kind"], r["bus_width"], r["sd_clock_hz"], r["sectors"]) == (
            StorageKind.NONE.value, 0, 0, 0)

    run_top(top, image_for(top), plain)


def test_identity_and_tokens():
    top = make_top()
    image = image_for(top)
    rng = random.Random(1)
    tokens = [rng.randrange(1 << 16) for _ in range(40)]

    async def scenario(ctx, link):
        assert await link.call(ctx, Op.PING, b"hello") == b"hello"
        assert await link.call(ctx, Op.PING) == b""
        ver = RESPONSES[Op.VERSION].unpack(await link.call(ctx, Op.VERSION))
        assert ver["regions"] == REGIONS and ver["max_payload"] == 1024
        assert ver["sectors_per_region"] == RecordLayout(CFG).sectors_per_region
        cd = RESPONSES[Op.CONFIG_DIGEST].unpack(await link.call(ctx, Op.CONFIG_DIGEST))
        assert cd["digest"] == CFG.digest()
        assert cd["fields"] == header_template(CFG)[80:116]
        # tokens: append in two parts, read back, hash every interesting prefix
        r = await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=25)
                       + pack_tokens(CFG, tokens[:25]))
        assert RESPONSES[Op.TOKENS_APPEND].unpack(r)["count"] == 25
        r = await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=15)
                       + pack_tokens(CFG, tokens[25:]))
        assert RESPONSES[Op.TOKENS_APPEND].unpack(r)["count"] == 40
        got = await link.call(ctx, Op.TOKENS_READ, req(Op.TOKENS_READ, offset=3, n=30))
        assert unpack_tokens(CFG, got) == tokens[3:33]
        for n in (0, 1, 17, 40):
            r = await link.call(ctx, Op.HASH_QUERY, req(Op.HASH_QUERY, n=n))
            assert RESPONSES[Op.HASH_QUERY].unpack(r)["hash"] == sequence_hash(
                tokens[:n], hash_seed(CFG))
        # TOKENS_WRITE replaces from an offset and sets the count
        r = await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=10, n=2)
                       + pack_tokens(CFG, [7, 8]))
        assert RESPONSES[Op.TOKENS_WRITE].unpack(r)["count"] == 12
        got = await link.call(ctx, Op.TOKENS_READ, req(Op.TOKENS_READ, offset=0, n=12))
        assert unpack_tokens(CFG, got) == tokens[:10] + [7, 8]
        st = RESPONSES[Op.STATS].unpack(await link.call(ctx, Op.STATS))
        assert st["frames"] == 14 and st["frame_errors"] == 0 and st["cycles"] > 0

    run_top(top, image, scenario)


def test_export_query_hit_miss_corrupt():
    """The snapshot store end to end: export, resume by query (HIT, rings restored
    bit-exactly), unknown prefix (MISS), corrupted record (MISS, dropped from the directory,
    rings emptied)."""
    top = make_top()
    image = image_for(top)
    lay = RecordLayout(CFG)
    rng = np.random.default_rng(2)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    golden = FixedRingCore(CFG.layers, CFG.q_heads, CFG.kv_heads, CFG.head_dim, CFG.window,
                           LANES)
    h12 = sequence_hash(tokens, hash_seed(CFG))

    async def scenario(ctx, link):
        await link.call(ctx, Op.SESSION_BEGIN)
        await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=12)
                   + pack_tokens(CFG, tokens))
        for layer in range(CFG.layers):
            q, k, v = rand_qkv(rng, 12)
            out = await attend(ctx, link, layer, q, k, v)
            assert np.array_equal(out, golden_attend(golden, layer, q, k, v))
        # export: region 0 from FIFO A, commit sequence 1
        r = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.EXPORT, req(Op.EXPORT, n=12)))
        assert (r["record_status"], r["region"], r["count"], r["hash"], r["seq"]) == (
            RecordStatus.OK.value, 0, 12, h12, 1)
        assert r["bytes"] == 12 * 2 + 2 * CFG.layers * CFG.kv_heads * CFG.window * CFG.head_dim
        # the stored record is the golden encoding of the golden rings
        from ringkv.host.record import import_record
        rings = np.zeros_like(golden.rings)
        status, header, meta = import_record(
            CFG, lambda lba, n: image.read(lba, n), 0, count=12, prefix_hash=h12,
            session_tokens=tokens, rings=rings)
        assert status is RecordStatus.OK and meta == (12, int(golden.head[0]))
        assert np.array_equal(rings & 0xFF, golden.rings & 0xFF)
        # a new session wipes the rings' metadata and the tokens; the query restores both
        await link.call(ctx, Op.SESSION_BEGIN)
        _, meta = await read_rings(ctx, link)
        assert meta == [(0, CFG.window - 1)] * (CFG.layers * CFG.kv_heads)
        await link.call(ctx, Op.RING_CLEAR, req(Op.RING_CLEAR, layer=RING_CLEAR_ALL))
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=12)
                   + pack_tokens(CFG, tokens))
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=12))
        assert Status(frame.status) == Status.HIT
        r = SNAPSHOT_RESPONSE.unpack(frame.payload)
        assert (r["record_status"], r["region"], r["count"], r["hash"], r["seq"]) == (
            RecordStatus.OK.value, 0, 12, h12, 1)
        got_rings, meta = await read_rings(ctx, link)
        assert np.array_equal(got_rings, golden.rings)
        assert meta == [(int(golden.count[i]), int(golden.head[i]))
                        for i in range(CFG.layers * CFG.kv_heads)]
        # the restored state computes on bit-exactly
        q, k, v = rand_qkv(rng, 1)
        out = await attend(ctx, link, 0, q, k, v, op=Op.ATTN_DECODE)
        assert np.array_equal(out, golden_attend(golden, 0, q, k, v))
        # an unknown prefix: the directory misses, the DMA does not run
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=5))
        assert Status(frame.status) == Status.MISS
        assert SNAPSHOT_RESPONSE.unpack(frame.payload)["record_status"] == NO_RECORD
        # corrupt one KV byte of the stored record: a directory hit, but a MISS
        lba = lay.region_lba(0) + lay.kv_sector
        sector = bytearray(image.read(lba, 1))
        sector[5] ^= 0x10
        image.write(lba, bytes(sector))
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=12))
        assert Status(frame.status) == Status.MISS
        r = SNAPSHOT_RESPONSE.unpack(frame.payload)
        assert r["record_status"] == RecordStatus.BAD_PAYLOAD_CRC.value and r["dir_status"] == 0
        _, meta = await read_rings(ctx, link)
        assert meta == [(0, CFG.window - 1)] * (CFG.layers * CFG.kv_heads)   # cleared, never stale
        # ... and the record is dropped from the directory, its region freed to FIFO B
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=12))
        assert Status(frame.status) == Status.MISS
        assert SNAPSHOT_RESPONSE.unpack(frame.payload)["record_status"] == NO_RECORD
        al = RESPONSES[Op.ALLOC_STATUS].unpack(await link.call(ctx, Op.ALLOC_STATUS))
        assert (al["fifo_a"], al["fifo_b"], al["live"], al["commit_seq"]) == (
            REGIONS - 1, 1, 0, 2)
        st = RESPONSES[Op.STATS].unpack(await link.call(ctx, Op.STATS))
        assert (st["queries"], st["hits"], st["exports"]) == (4, 1, 1)
        assert st["dma_cycles"] > 0 and st["attn_cycles"] > 0 and st["dir_cycles"] > 0

    run_top(top, image, scenario)


def test_errors_change_nothing():
    """Frame errors, unknown/unimplemented ops, wrong lengths and out-of-range arguments get
    their status, and the device state (tokens, rings, directory, allocator) is unchanged."""
    top = make_top()
    image = image_for(top)
    rng = np.random.default_rng(3)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=6)]

    async def state(ctx, link):
        toks = await link.call(ctx, Op.TOKENS_READ, req(Op.TOKENS_READ, offset=0, n=6))
        rings = await read_rings(ctx, link)
        alloc = await link.call(ctx, Op.ALLOC_STATUS)
        d = await link.request(ctx, Op.DIR_READ, req(Op.DIR_READ, link=0))
        return toks, rings[0].tobytes(), rings[1], alloc[:-4], d.status, d.payload

    async def scenario(ctx, link):
        await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=6)
                   + pack_tokens(CFG, tokens))
        q, k, v = rand_qkv(rng, 6)
        await attend(ctx, link, 1, q, k, v)
        alloc = await link.call(ctx, Op.ALLOC_STATUS)
        await link.call(ctx, Op.EXPORT, req(Op.EXPORT, n=6), Status.BAD_ARG)   # layer 0: 0
        assert await link.call(ctx, Op.ALLOC_STATUS) == alloc
        await attend(ctx, link, 0, q, k, v)
        await link.call(ctx, Op.EXPORT, req(Op.EXPORT, n=6))
        before = await state(ctx, link)
        # frame layer: bad CRC (answered with the op and seq received), unknown opcode
        frame = bytearray(encode_request(Op.TOKENS_APPEND, 77, req(Op.TOKENS_APPEND, n=1)
                                         + b"\x01\x02"))
        frame[-1] ^= 1
        await link.send(ctx, bytes(frame))
        err = await link.receive(ctx)
        assert (err.op, err.seq, Status(err.status)) == (Op.TOKENS_APPEND.value, 77,
                                                          Status.BAD_CRC)
        await link.send(ctx, encode_request(0x7E, 78, b"xyz"))
        err = await link.receive(ctx)
        assert (err.op, err.seq, Status(err.status)) == (0x7E, 78, Status.UNKNOWN_OP)
        # ops of Op the gateware does not implement
        await link.call(ctx, Op.IMPORT, req(Op.QUERY, n=6), Status.UNKNOWN_OP)
        # lengths
        await link.call(ctx, Op.VERSION, b"\0", Status.BAD_LENGTH)
        await link.call(ctx, Op.QUERY, b"\1\0\0", Status.BAD_LENGTH)
        await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=2) + b"\1\2\3",
                   Status.BAD_LENGTH)
        await link.call(ctx, Op.TOKENS_WRITE, b"\0\0", Status.BAD_LENGTH)
        q, k, v = rand_qkv(rng, 2)
        await link.call(ctx, Op.ATTN_PREFILL, pack_attn(CFG, 0, q, k, v)[:-1],
                   Status.BAD_LENGTH)
        await link.call(ctx, Op.DIR_CLEAR, b"\0\0", Status.BAD_LENGTH)
        await link.call(ctx, Op.STORAGE_REBUILD, b"\0", Status.BAD_LENGTH)
        # arguments out of range
        await link.call(ctx, Op.ATTN_PREFILL, pack_attn(CFG, CFG.layers, q, k, v),
                   Status.BAD_ARG)
        await link.call(ctx, Op.ATTN_DECODE, pack_attn(CFG, 0, q, k, v), Status.BAD_ARG)
        await link.call(ctx, Op.ATTN_PREFILL, req(Op.ATTN_PREFILL, layer=0, count=0),
                   Status.BAD_ARG)
        await link.call(ctx, Op.RING_CLEAR, req(Op.RING_CLEAR, layer=CFG.layers),
                   Status.BAD_ARG)
        await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=59)
                   + pack_tokens(CFG, [0] * 59), Status.BAD_ARG)
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=7, n=1)
                   + pack_tokens(CFG, [0]), Status.BAD_ARG)
        await link.call(ctx, Op.TOKENS_READ, req(Op.TOKENS_READ, offset=5, n=2), Status.BAD_ARG)
        await link.call(ctx, Op.HASH_QUERY, req(Op.HASH_QUERY, n=7), Status.BAD_ARG)
        await link.call(ctx, Op.QUERY, req(Op.QUERY, n=0), Status.BAD_ARG)
        await link.call(ctx, Op.QUERY, req(Op.QUERY, n=7), Status.BAD_ARG)
        await link.call(ctx, Op.EXPORT, req(Op.EXPORT, n=5), Status.BAD_ARG)   # rings hold 6
        await link.call(ctx, Op.DIR_INSERT, req(Op.DIR_INSERT, count=1, hash=1, region=REGIONS,
                                                 flags=FLAG_EXISTING), Status.BAD_ARG)
        await link.call(ctx, Op.DIR_DELETE, req(Op.DIR_DELETE, link=REGIONS), Status.BAD_ARG)
        await link.call(ctx, Op.RING_READ, req(Op.RING_READ, addr=0, n=5, what=RING_META),
                   Status.BAD_ARG)
        await link.call(ctx, Op.RING_READ, req(Op.RING_READ, addr=0, n=1, what=2),
                   Status.BAD_ARG)
        total = RecordLayout(CFG).sectors_per_region * REGIONS
        await link.call(ctx, Op.SECTOR_READ, req(Op.SECTOR_READ, lba=total), Status.BAD_ARG)
        # directory-level refusals carry the directory's status
        p = await link.call(ctx, Op.DIR_DELETE, req(Op.DIR_DELETE, link=3), Status.BAD_ARG)
        assert DIR_RESPONSE.unpack(p)["dir_status"] == 5          # NOT_LIVE
        assert await state(ctx, link) == before
        st = RESPONSES[Op.STATS].unpack(await link.call(ctx, Op.STATS))
        assert st["frame_errors"] == 2 and st["rejected"] == 25

    run_top(top, image, scenario)


def test_fuzz_then_ping_and_snapshot():
    """Random bytes (with SYNCs, truncated and corrupted frames) never hang the device; after
    the line goes idle a ping and a stored snapshot still work."""
    top = make_top(timeout=300)
    image = image_for(top)
    rng = np.random.default_rng(4)
    pyrng = random.Random(4)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=5)]

    async def scenario(ctx, link):
        await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=5)
                   + pack_tokens(CFG, tokens))
        for layer in range(CFG.layers):
            q, k, v = rand_qkv(rng, 5)
            await attend(ctx, link, layer, q, k, v)
        await link.call(ctx, Op.EXPORT, req(Op.EXPORT, n=5))
        junk = bytearray()
        for _ in range(40):
            kind = pyrng.randrange(4)
            if kind == 0:
                junk += bytes(pyrng.randrange(256) for _ in range(pyrng.randrange(1, 12)))
            elif kind == 1:
                junk += bytes([0xA5]) + bytes(pyrng.randrange(256) for _ in range(4))
            else:
                frame = bytearray(encode_request(pyrng.choice([Op.PING, Op.STATS, Op.VERSION]),
                                                 pyrng.randrange(256),
                                                 bytes(pyrng.randrange(256) for _ in range(3))))
                frame[pyrng.randrange(1, len(frame))] ^= 1 << pyrng.randrange(8)
                junk += frame if kind == 2 else frame[:pyrng.randrange(1, len(frame))]
        await link.send(ctx, bytes(junk))
        await ctx.tick().repeat(2000)           # longer than the decoder's timeout
        link.events.clear()
        assert await link.call(ctx, Op.PING, b"alive") == b"alive"
        await link.call(ctx, Op.SESSION_BEGIN)
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=5)
                   + pack_tokens(CFG, tokens))
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=5))
        assert Status(frame.status) == Status.HIT

    run_top(top, image, scenario, rng=pyrng, idle=0.2, stall=0.3)


def test_scheduler_on_fpga_device_and_rebuild():
    """The seed-001 scheduler and the numpy model run unchanged on FpgaDevice over the link
    into the simulated gateware, token for token equal to the software device with the core's
    bit-exact model; after a "power cycle" (a new top on the same image) the device's own
    recovery restores the directory (the host-driven deep check agrees) and a session resumes
    by import."""
    from ringkv.host.device.fpga import ConfigMismatch, FpgaDevice
    from ringkv.host.device.link import Link
    from ringkv.host.device.software import SoftwareDevice
    from ringkv.host.model.transformer import FixedBackend, Model
    from ringkv.host.scheduler import Scheduler
    from ringkv.sim.top_bench import SimPort

    model = Model(CFG, hidden=32, ffn=48, seed=5)
    plan = [("a", [256, 1, 2, 3, 4, 5], 3), ("b", [256, 9, 8], 2), ("a", [7], 2)]
    soft = Scheduler(model, SoftwareDevice(CFG, attention=FixedBackend(CFG, lanes=LANES)),
                     chunk=4)
    want = [soft.request(*r) for r in plan]
    top = make_top()
    image = image_for(top)
    with SimPort(top, image) as port:
        dev = FpgaDevice(Link(port, timeout=120, retries=0), CFG, max_payload=1024)
        dev.check_config()
        assert dev.wait_ready()["live"] == 0
        sched = Scheduler(model, dev, chunk=4)
        got = [sched.request(*r) for r in plan]
        assert got == want
        assert [e["path"] for e in sched.events] == ["first", "first", "hit"]
        assert sched.events[2]["imported_bytes"] > 0
        key_a = sched.sessions["a"].key
        with pytest.raises(ConfigMismatch, match=r"^device configuration differs from the "
                           r"host's: window: 8 != 16 \(device != host\)$"):
            FpgaDevice(dev.link, RingKVConfig(**{**CFG.__dict__, "window": 16}),
                       max_payload=1024).check_config()
    # power cycle: a fresh device on the same storage image
    top2 = make_top()
    with SimPort(top2, image) as port:
        dev = FpgaDevice(Link(port, timeout=120, retries=0), CFG, max_payload=1024)
        st = dev.wait_ready()
        # every live snapshot is back; a replaced one whose region was not reused yet is
        # still a valid record of its prefix, so the recovery finds it too (harmless: a hit
        # on it is verified like any other)
        recovered = dev.directory()
        rebuilt = {(c, h) for c, h, _ in recovered}
        assert {s.key for s in sched.sessions.values()} <= rebuilt and len(rebuilt) == 3
        assert dev.stats()["alloc"]["commit_seq"] == st["next_seq"]
        # the host's deep check (payloads too) agrees, and rebuilding from it changes nothing
        inserts, frees, next_seq = dev.rebuild()
        assert [(c, h, r) for c, h, r, _ in inserts] == recovered
        assert next_seq == st["next_seq"] and dev.directory() == recovered
        tokens_a = sched.sessions["a"].tokens
        result = dev.query(tokens_a)
        assert result.hit and (result.count, result.prefix_hash) == key_a
        assert dev.read_tokens(0, len(tokens_a)) == tokens_a
        assert dev.n == len(tokens_a)


def test_export_evicts_lru_and_reexport_retires_old_record():
    """Full storage: an export evicts the least recently used snapshot (a query hit counts as a
    use) and the evicted session then misses. Re-exporting a key writes a new record in another
    region first and retires the old one only after the new header is committed (a power cut in
    between leaves the old snapshot valid), so with every region live the re-export also needs
    an eviction."""
    top = make_top()
    image = image_for(top)
    rng = np.random.default_rng(7)
    sessions = [[int(t) for t in rng.integers(0, 1 << 16, size=6)] for _ in range(REGIONS + 1)]

    async def compute(ctx, link, tokens):
        await link.call(ctx, Op.SESSION_BEGIN)
        await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=len(tokens))
                   + pack_tokens(CFG, tokens))
        q, k, v = rand_qkv(rng, len(tokens))
        for layer in range(CFG.layers):
            await attend(ctx, link, layer, q, k, v)

    async def export(ctx, link, tokens):
        return SNAPSHOT_RESPONSE.unpack(
            await link.call(ctx, Op.EXPORT, req(Op.EXPORT, n=len(tokens))))

    async def query(ctx, link, tokens):
        await link.call(ctx, Op.SESSION_BEGIN)
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=len(tokens))
                   + pack_tokens(CFG, tokens))
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=len(tokens)))
        return Status(frame.status), SNAPSHOT_RESPONSE.unpack(frame.payload)

    async def alloc(ctx, link):
        a = RESPONSES[Op.ALLOC_STATUS].unpack(await link.call(ctx, Op.ALLOC_STATUS))
        return a["fifo_a"], a["fifo_b"], a["live"]

    async def scenario(ctx, link):
        first = sessions[:REGIONS]
        for tokens in first:
            await compute(ctx, link, tokens)
            assert (await export(ctx, link, tokens))["record_status"] == RecordStatus.OK.value
        assert await alloc(ctx, link) == (0, 0, REGIONS)
        # session 0 is used again: session 1 is now the least recently used
        assert (await query(ctx, link, first[0]))[0] == Status.HIT
        await compute(ctx, link, sessions[REGIONS])
        r = await export(ctx, link, sessions[REGIONS])
        assert r["record_status"] == RecordStatus.OK.value
        assert await alloc(ctx, link) == (0, 0, REGIONS)
        status, r1 = await query(ctx, link, first[1])
        assert status == Status.MISS and r1["record_status"] == NO_RECORD
        regions, seqs = set(), {}
        for i in (0, 2, 3, REGIONS):
            status, r = await query(ctx, link, sessions[i])
            assert status == Status.HIT, i
            regions.add(r["region"])
            seqs[i] = r["seq"]
        assert regions == set(range(REGIONS))
        # re-export the resident session (the last hit, REGIONS) with unchanged rings: the
        # LRU (session 0) is evicted for the new record, then the old record is retired
        rings_before = await read_rings(ctx, link)
        new = await export(ctx, link, sessions[REGIONS])
        assert new["record_status"] == RecordStatus.OK.value and new["seq"] > seqs[REGIONS]
        assert await alloc(ctx, link) == (0, 1, REGIONS - 1)
        assert (await query(ctx, link, first[0]))[0] == Status.MISS
        status, r = await query(ctx, link, sessions[REGIONS])
        assert status == Status.HIT and (r["seq"], r["region"]) == (new["seq"], new["region"])
        rings_after = await read_rings(ctx, link)
        assert np.array_equal(rings_after[0], rings_before[0])
        assert rings_after[1] == rings_before[1]
        for i in (2, 3):
            assert (await query(ctx, link, sessions[i]))[0] == Status.HIT

    run_top(top, image, scenario)


@pytest.mark.slow       # the whole top again in the other numerics; make test keeps fx2's
                        # FpgaDevice path below, and the cores' own fx2 tests
def test_fx2_attention_export_query_ring_read():
    """Numerics ringkv-fx2 through the whole top: int16 q/k/v in ATTN payloads (M*2 bytes per
    beat) bit-exact with the golden core, an export that is the golden fx2 record, a resume by
    query that restores the int16 rings (RING_READ counts bytes), a foreign fx1 record refused,
    and byte-exact argument checks."""
    from ringkv.host.record import encode_record, import_record
    top = make_top(CFG2)
    image = image_for(top)
    lay = RecordLayout(CFG2)
    rng = np.random.default_rng(12)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    golden = FixedRingCore(CFG2.layers, CFG2.q_heads, CFG2.kv_heads, CFG2.head_dim,
                           CFG2.window, LANES, numerics="ringkv-fx2")
    h12 = sequence_hash(tokens, hash_seed(CFG2))
    ring_bytes = CFG2.layers * CFG2.kv_heads * 2 * CFG2.window * CFG2.head_dim * 2
    # an fx1 record of other tokens, made for this device's hash, put in region 3 below
    other = [int(t) for t in rng.integers(0, 1 << 16, size=5)]
    h5 = sequence_hash(other, hash_seed(CFG2))
    for off, data in encode_record(CFG, other, np.zeros((2, 2, 2, 8, 8), dtype=np.uint8),
                                   count=5, ring_head=4, prefix_hash=h5, commit_seq=1):
        image.write(lay.region_lba(3) + off, data)

    async def scenario(ctx, link):
        await link.call(ctx, Op.SESSION_BEGIN)
        await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=12)
                   + pack_tokens(CFG2, tokens))
        for layer in range(CFG2.layers):
            for _ in range(2):          # 6 tokens a frame: 4 + 6 * 128 bytes fit 1024
                q, k, v = rand_qkv(rng, 6, CFG2)
                assert np.abs(k).max() > 127
                out = await attend(ctx, link, layer, q, k, v, config=CFG2)
                assert np.array_equal(out, golden_attend(golden, layer, q, k, v))
        got_rings, _ = await read_rings(ctx, link, CFG2)
        assert np.array_equal(got_rings, golden.rings)
        r = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.EXPORT, req(Op.EXPORT, n=12)))
        assert (r["record_status"], r["region"], r["count"], r["hash"], r["seq"]) == (
            RecordStatus.OK.value, 0, 12, h12, 1)
        assert r["bytes"] == 12 * 2 + 2 * 2 * CFG2.layers * CFG2.kv_heads * CFG2.window * 8
        rings = np.zeros(golden.rings.shape, dtype=np.uint16)
        status, _, meta = import_record(CFG2, image.read, 0, count=12, prefix_hash=h12,
                                        session_tokens=tokens, rings=rings)
        assert status is RecordStatus.OK and meta == (12, int(golden.head[0]))
        assert np.array_equal(rings, golden.rings & 0xFFFF)
        # resume: a new session, then QUERY imports the int16 rings
        await link.call(ctx, Op.SESSION_BEGIN)
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=12)
                   + pack_tokens(CFG2, tokens))
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=12))
        assert Status(frame.status) == Status.HIT
        got_rings, meta = await read_rings(ctx, link, CFG2)
        assert np.array_equal(got_rings, golden.rings)
        assert meta == [(12, int(golden.head[0]))] * (CFG2.layers * CFG2.kv_heads)
        q, k, v = rand_qkv(rng, 1, CFG2)
        out = await attend(ctx, link, 1, q, k, v, op=Op.ATTN_DECODE, config=CFG2)
        assert np.array_equal(out, golden_attend(golden, 1, q, k, v))
        # RING_READ addresses bytes: the last byte is the high byte of the last element
        last = await link.call(ctx, Op.RING_READ, req(Op.RING_READ, addr=ring_bytes - 1, n=1,
                                                       what=RING_ELEMENTS))
        assert last == bytes([(int(golden.rings[-1, -1, -1, -1, -1]) >> 8) & 0xFF])
        await link.call(ctx, Op.RING_READ, req(Op.RING_READ, addr=ring_bytes - 1, n=2,
                                                what=RING_ELEMENTS), Status.BAD_ARG)
        # an fx1-sized ATTN payload is the wrong length for this device
        await link.call(ctx, Op.ATTN_DECODE, pack_attn(CFG, 0, q, k & 0x7F, v & 0x7F),
                   Status.BAD_LENGTH)
        # the fx1 record in region 3 is refused as foreign (and dropped)
        await link.call(ctx, Op.DIR_INSERT, req(Op.DIR_INSERT, count=5, hash=h5, region=3,
                                                 flags=FLAG_EXISTING))
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=5)
                   + pack_tokens(CFG2, other))
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=5))
        assert Status(frame.status) == Status.MISS
        r = SNAPSHOT_RESPONSE.unpack(frame.payload)
        assert r["record_status"] == RecordStatus.FOREIGN_CONFIG.value and r["dir_status"] == 0

    run_top(top, image, scenario)


def test_fx2_fpga_device_attention_and_snapshot():
    """FpgaDevice on an fx2 top: prefill and decode quantize/dequantize with ringkv-fx2 and
    equal FixedBackend in fx2; snapshot() combines RING_READ bytes into the int16 rings."""
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    from ringkv.host.model.transformer import FixedBackend
    from ringkv.sim.top_bench import SimPort

    rng = np.random.default_rng(21)
    soft = FixedBackend(CFG2, lanes=LANES)
    top = make_top(CFG2)
    with SimPort(top, image_for(top)) as port:
        dev = FpgaDevice(Link(port, timeout=120, retries=0), CFG2, max_payload=1024)
        dev.check_config()
        for layer in range(CFG2.layers):
            q = rng.standard_normal((5, CFG2.q_heads, CFG2.head_dim)) * 3
            k = rng.standard_normal((5, CFG2.kv_heads, CFG2.head_dim)) * 3
            v = rng.standard_normal((5, CFG2.kv_heads, CFG2.head_dim)) * 3
            np.testing.assert_array_equal(dev.prefill(layer, q, k, v),
                                          soft.prefill(layer, q, k, v))
        q = rng.standard_normal((CFG2.q_heads, CFG2.head_dim))
        k, v = (rng.standard_normal((CFG2.kv_heads, CFG2.head_dim)) for _ in range(2))
        np.testing.assert_array_equal(dev.decode(0, q, k, v), soft.decode(0, q, k, v))
        rings, meta = dev.snapshot()
        want_rings, want_count, want_head = soft.snapshot()
        assert np.abs(want_rings).max() > 127             # int16 values, beyond int8
        np.testing.assert_array_equal(rings, want_rings)
        assert meta == [(int(c), int(h)) for c, h in zip(want_count, want_head)]
