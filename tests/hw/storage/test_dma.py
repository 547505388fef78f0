"""DMA engine in the Amaranth simulator against the golden record model (host/record/codec.py)."""

import functools
import random

import numpy as np
import pytest
from amaranth.sim import Simulator
from dma_helpers import load_state, new_image, rand_rings, read_state
from dma_helpers import simulate as simulate_with

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.record import SECTOR, RecordLayout, RecordStatus
from ringkv.host.record import (
    check_header,
    encode_payload,
    encode_record,
    import_record,
    rebuild,
    scan_image,
)
from ringkv.hw.attention.ring_port import RingPortSignature
from ringkv.hw.storage.dma import DmaEngine, DmaOp
from ringkv.hw.storage.dma_stream import RecordSegment
from ringkv.hw.storage.port import StorageOp
from ringkv.sim.sector_model import serve_storage
from ringkv.sim.streams import stream_get, stream_put

# background testbenches (the storage server, the card) are abandoned when the body ends
#: the engine alone (no MAC): every test here is an open transfer
simulate = functools.partial(simulate_with, mac=False)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

SMALL = RingKVConfig(layers=2, q_heads=2, kv_heads=1, head_dim=8, window=8, token_width=16,
                     max_tokens=600)
TINY = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=4, window=4, token_width=8,
                    max_tokens=40)
# numerics ringkv-fx2: int16 K/V, two bytes per element on the ring port and in the record
SMALL2 = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx2"})
TINY2 = RingKVConfig(**{**TINY.__dict__, "numerics": "ringkv-fx2"})
# numerics ringkv-fx1c: fx1's bytes, per-layer fractions in the digest and the header
SMALLC = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx1c",
                         "qkv_fracs": ((5, 4, 6), (4, 6, 3))})


async def dma_op(ctx, h, op, region, *, count=0, hash=0, seq=0, rng=None, idle=0.0):
    await stream_put(ctx, h.cmd, {"op": op, "region": region, "count": count, "hash": hash,
                                  "seq": seq}, rng=rng, idle=idle)
    resp = await stream_get(ctx, h.resp, rng=rng, stall=idle)
    return RecordStatus(resp.status.value), resp.count, resp.hash, resp.seq


def random_session(config, rng, count=None):
    count = rng.randrange(0, 3 * config.window) if count is None else count
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]
    return rand_rings(config, rng), count, rng.randrange(config.window), tokens


def valid_slots(config, count, head):
    v = min(count, config.window)
    return [(head - v + 1 + t) % config.window for t in range(v)]


# --- parameters ----------------------------------------------------------------------------

def test_parameter_errors():
    with pytest.raises(TypeError, match=r"^config must be a RingKVConfig, not 3$"):
        DmaEngine(3, 4)
    with pytest.raises(ValueError, match=r"^regions must be between 1 and 65535, not 0$"):
        DmaEngine(SMALL, 0)
    with pytest.raises(TypeError, match=r"^regions must be an integer, not 2\.0$"):
        DmaEngine(SMALL, 2.0)
    with pytest.raises(ValueError, match=r"^base_lba must be a non-negative integer, not -1$"):
        DmaEngine(SMALL, 2, base_lba=-1)
    with pytest.raises(ValueError, match=r"^window must be a positive power of two, not 12$"):
        DmaEngine(RingKVConfig(window=12), 2)
    with pytest.raises(ValueError, match=r"^head_dim must be a positive power of two, not 48$"):
        DmaEngine(RingKVConfig(head_dim=48), 2)
    with pytest.raises(ValueError, match=r"^token_width must be at most 32, not 40$"):
        DmaEngine(RingKVConfig(token_width=40), 2)
    with pytest.raises(ValueError, match=r"^regions must be between 1 and 65535, not 70000$"):
        DmaEngine(TINY, 70000)
    sig = RingPortSignature.for_config(DEFAULT_CONFIG)
    assert sig == DmaEngine(DEFAULT_CONFIG, 4).signature.members["ring"].signature
    assert sig.members["ring_addr"].shape == 32
    with pytest.raises(ValueError, match=r"^layers \* kv_heads must be at most 256, not 320$"):
        DmaEngine(RingKVConfig(layers=160, q_heads=2, kv_heads=2, head_dim=2, window=2,
                               max_tokens=4), 2)


# --- export is bit-exact with the golden encoder ---------------------------------------------

@pytest.mark.parametrize("config,count,seed,width", [
    (SMALL, 0, 0, 1), (SMALL, 1, 1, 1), (SMALL, 7, 2, 1), (SMALL, 8, 3, 1), (SMALL, 300, 4, 1),
    (TINY, 40, 5, 1), (TINY, 3, 6, 1),
    (SMALL2, 0, 7, 1), (SMALL2, 5, 8, 1), (SMALL2, 300, 9, 1), (TINY2, 40, 10, 1),
    (SMALL, 0, 50, 4), (SMALL, 7, 51, 4), (TINY, 40, 52, 4), (SMALL2, 300, 53, 4),
    # max_tokens: the token segment as long as it gets (1,200 bytes), the segment counters'
    # full width
    (SMALL, 600, 11, 1), (SMALL, 600, 54, 4),
])
def test_export_bit_exact(config, count, seed, width):
    """The export's sector writes equal the golden encoder's, the header last; on a port of
    bytes and on a wide one (the write pipeline's bytes four to a word)."""
    rng = random.Random(seed)
    image = new_image(config, 3, rng)
    before = bytes(image[:])
    rings, count, head, tokens = random_session(config, rng, count)
    log = []

    async def body(ctx, h, rng):
        await load_state(ctx, h, config, rings, count, head, tokens)
        return await dma_op(ctx, h, DmaOp.EXPORT, 2, hash=0xFEED0000 + seed, seq=seed + 10,
                            rng=rng, idle=0.3)

    res = simulate(config, 3, image, body, seed=seed, idle=0.3, stall=0.3, log=log,
                   width=width)
    assert res["value"] == (RecordStatus.OK, count, 0xFEED0000 + seed, seed + 10)
    lay = RecordLayout(config)
    expect = bytearray(before)
    writes = encode_record(config, tokens, rings, count=count, ring_head=head,
                           prefix_hash=0xFEED0000 + seed, commit_seq=seed + 10)
    base = lay.region_lba(2) * SECTOR
    for off, data in writes:
        expect[base + off * SECTOR:base + off * SECTOR + len(data)] = data
    assert bytes(image[:]) == bytes(expect)
    # the header is the last write
    assert log[-1] == (StorageOp.WRITE, lay.region_lba(2), 1)


# --- round trip and import checks ---------------------------------------------------------

SLOW = pytest.mark.slow


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("config,seed", [(SMALL, 10), pytest.param(SMALL, 11, marks=SLOW),
                                         (TINY, 12), pytest.param(TINY, 13, marks=SLOW),
                                         (SMALL2, 14), (TINY2, 15)])
def test_round_trip(config, seed, width):
    """Export, wipe, import, verify: the rings and metadata come back; on a storage port of
    bytes and on a wide one (``width`` 4: the import's K/V area a word a clock through the
    K/V writer into four-byte ring writes)."""
    rng = random.Random(seed)
    image = new_image(config, 2, rng)
    rings, count, head, tokens = random_session(config, rng)

    async def body(ctx, h, rng):
        await load_state(ctx, h, config, rings, count, head, tokens)
        exp = await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=99, seq=3, rng=rng, idle=0.2)
        # wipe the rings and metadata, then import
        await load_state(ctx, h, config, np.zeros_like(rings), 0, 0, tokens)
        imp = await dma_op(ctx, h, DmaOp.IMPORT, 1, count=count, hash=99, rng=rng, idle=0.2)
        ver = await dma_op(ctx, h, DmaOp.VERIFY, 1)
        return exp, imp, ver, await read_state(ctx, h, config)

    res = simulate(config, 2, image, body, seed=seed, idle=0.2, stall=0.2, width=width)
    exp, imp, ver, (got, meta) = res["value"]
    assert exp[0] is RecordStatus.OK and imp == (RecordStatus.OK, count, 99, 3)
    assert ver == (RecordStatus.OK, count, 99, 3)
    assert meta == [(count, head)] * (config.layers * config.kv_heads)
    for s in range(config.window):
        want = rings[:, :, :, s, :] if s in valid_slots(config, count, head) else 0
        assert (got[:, :, :, s, :] == want).all()


def write_golden(config, image, region, rng, count=None, *, hash=5, seq=1, other=None):
    rings, count, head, tokens = random_session(other or config, rng, count)
    lay = RecordLayout(config)
    for off, data in encode_record(other or config, tokens, rings, count=count, ring_head=head,
                                   prefix_hash=hash, commit_seq=seq):
        image.write(lay.region_lba(region) + off, data)
    return rings, count, head, tokens


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("config", [SMALL, SMALL2])
def test_import_checks_match_golden(config, width):
    """Flipped bits, wrong tokens, wrong hash, empty and out-of-range regions, foreign config
    (the other numerics): the gateware's status equals the golden import's, and nothing changes
    but on success."""
    rng = random.Random(20)
    image = new_image(config, 4)
    rings, count, head, tokens = write_golden(config, image, 0, rng, 20, hash=7, seq=4)
    other = RingKVConfig(**{**config.__dict__, "numerics": "ringkv-fx2"
                            if config.numerics == "ringkv-fx1" else "ringkv-fx1"})
    write_golden(config, image, 1, rng, 5, other=other)
    lay = RecordLayout(config)
    base = 0
    flips = [base + 3, base + 9, base + 20, base + 50, base + 57, base + 61, base + 66, base + 78,
             base + 90, base + 510, SECTOR + 17, lay.kv_sector * SECTOR + 5,
             lay.kv_sector * SECTOR + 200]
    bad_tokens = list(tokens)
    bad_tokens[13] ^= 0x100
    cases = [("ok", None, tokens, 20, 7), ("tokens", None, bad_tokens, 20, 7),
             ("hash", None, tokens, 20, 8), ("count", None, tokens, 19, 7)]
    cases += [(f"flip{p}", p, tokens, 20, 7) for p in flips]

    headers = []

    async def body(ctx, h, rng):
        out = []
        stale = rand_rings(config, rng)
        for name, pos, session, req_count, req_hash in cases:
            if pos is not None:
                image.write(0, bytes(image[0:pos]) + bytes([image[pos] ^ 0x10]))
            await load_state(ctx, h, config, stale, 3, 2, session)
            st = await dma_op(ctx, h, DmaOp.IMPORT, 0, count=req_count, hash=req_hash)
            out.append((name, st[0], await read_state(ctx, h, config)))
            if name == "ok" or pos is not None and pos < SECTOR:
                headers.append((name, await dma_op(ctx, h, DmaOp.HEADER, 0),
                                check_header(config, image.read(0, 1), 0)))
            if pos is not None:
                image.write(0, bytes(image[0:pos]) + bytes([image[pos] ^ 0x10]))
        out.append(("empty", (await dma_op(ctx, h, DmaOp.VERIFY, 2))[0], None))
        out.append(("range", (await dma_op(ctx, h, DmaOp.VERIFY, 4))[0], None))
        out.append(("foreign", (await dma_op(ctx, h, DmaOp.IMPORT, 1, count=5, hash=5))[0],
                    None))
        for region in (1, 2):
            headers.append((region, await dma_op(ctx, h, DmaOp.HEADER, region),
                            check_header(config, image.read(RecordLayout(config)
                                                            .region_lba(region), 1), region)))
        return out, stale

    res = simulate(config, 4, image, body, seed=21, width=width)
    out, stale = res["value"]
    by_name = {name: (st, state) for name, st, state in out}
    assert by_name["ok"][0] is RecordStatus.OK
    assert by_name["tokens"][0] is RecordStatus.TOKEN_MISMATCH
    assert by_name["hash"][0] is RecordStatus.NOT_THIS
    assert by_name["count"][0] is RecordStatus.NOT_THIS
    assert by_name["empty"][0] is RecordStatus.EMPTY
    assert by_name["range"][0] is RecordStatus.BAD_REQUEST
    assert by_name["foreign"][0] is RecordStatus.FOREIGN_CONFIG
    # the header-only check (the device's recovery scan) equals the golden check_header
    assert len(headers) == 13 and {g.status for _, _, g in headers} >= {
        RecordStatus.OK, RecordStatus.EMPTY, RecordStatus.BAD_HEADER, RecordStatus.FOREIGN_CONFIG}
    for name, got, want in headers:
        assert got[0] is want.status, name
        if want.valid:
            assert got[1:] == (want.count, want.prefix_hash, want.commit_seq), name
    for name, pos, session, req_count, req_hash in cases:
        if pos is not None:
            image.write(0, bytes(image[0:pos]) + bytes([image[pos] ^ 0x10]))
        golden_rings = stale.copy()
        want, _, meta = import_record(config, image.read, 0, count=req_count, prefix_hash=req_hash,
                                      session_tokens=session, rings=golden_rings)
        if pos is not None:
            image.write(0, bytes(image[0:pos]) + bytes([image[pos] ^ 0x10]))
        st, (got, got_meta) = by_name[name]
        assert st is want, name
        assert (got == golden_rings).all(), name
        assert got_meta == [meta or (3, 2)] * (config.layers * config.kv_heads), name
        if name.startswith("flip"):
            assert st is not RecordStatus.OK


def test_export_refuses_inconsistent_metadata():
    config = SMALL
    rng = random.Random(30)
    image = new_image(config, 2)
    rings, count, head, tokens = random_session(config, rng, 50)
    log = []

    async def body(ctx, h, rng):
        await load_state(ctx, h, config, rings, count, head, tokens, meta_heads=[head, head ^ 1])
        return await dma_op(ctx, h, DmaOp.EXPORT, 0, hash=1, seq=1)

    res = simulate(config, 2, image, body, log=log)
    assert res["value"][0] is RecordStatus.BAD_REQUEST
    assert log == [] and not any(image[:])


@pytest.mark.parametrize("width", [1, 4])
def test_storage_error_is_reported(width):
    config = TINY
    rng = random.Random(31)
    image = new_image(config, 2)
    rings, count, head, tokens = random_session(config, rng, 10)

    async def body(ctx, h, rng):
        await load_state(ctx, h, config, rings, count, head, tokens)
        a = await dma_op(ctx, h, DmaOp.EXPORT, 0, hash=1, seq=1)
        b = await dma_op(ctx, h, DmaOp.IMPORT, 0, count=10, hash=1)
        return a[0], b[0], await read_state(ctx, h, config)

    res = simulate(config, 2, image, body, dead=True, width=width)
    a, b, (got, meta) = res["value"]
    assert a is RecordStatus.STORAGE and b is RecordStatus.STORAGE
    assert (got == rings).all() and meta == [(10, head)]


@pytest.mark.parametrize("seed,width", [(33, 1), pytest.param(34, 1, marks=pytest.mark.slow),
                                        (35, 4)])
def test_early_error_mid_export_leaves_nothing_behind(seed, width):
    """The storage answers an error in the middle of an export's data (the export datapath's
    read pipeline and FIFO hold bytes then): STORAGE; the next export on a healthy medium is
    bit-exact (no byte of the failed one left in the pipeline)."""
    config = SMALL
    rng = random.Random(seed)
    image = new_image(config, 2, rng)
    rings, count, head, tokens = random_session(config, rng, config.window + 3)
    lay = RecordLayout(config)
    tok_bytes = -(-count * lay.token_bytes // SECTOR) * SECTOR
    error_after = tok_bytes + rng.randrange(1, 200)     # within the KV payload (256 B)

    async def body(ctx, h, rng):
        await load_state(ctx, h, config, rings, count, head, tokens)
        a = await dma_op(ctx, h, DmaOp.EXPORT, 0, hash=5, seq=1, rng=rng, idle=0.3)
        b = await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=6, seq=2, rng=rng, idle=0.3)
        return a[0], b

    res = simulate(config, 2, image, body, seed=seed, idle=0.3, stall=0.3,
                   error_after=error_after, width=width)
    a, b = res["value"]
    assert a is RecordStatus.STORAGE
    assert b == (RecordStatus.OK, count, 6, 2)
    base = lay.region_lba(1) * SECTOR
    for off, data in encode_record(config, tokens, rings, count=count, ring_head=head,
                                   prefix_hash=6, commit_seq=2):
        assert bytes(image[base + off * SECTOR:base + off * SECTOR + len(data)]) == data


@pytest.mark.parametrize("at", [1, 6, 130, 255, 256, 300])
def test_early_error_mid_wide_import_empties_the_rings(at):
    """On a wide port the storage ends an open import's K/V read early (``CARD`` after ``at``
    bytes of it, its last whole word: the K/V writer holds a chunk, or one fills; or in the
    padding after the last K/V word, 256 and 300): STORAGE,
    the rings empty (count 0, head W - 1), or unchanged when no K/V word came (``at`` < 4:
    the import's rule, nothing written before the K/V phase changes nothing); the same import
    again brings the record back exactly."""
    config = SMALL
    rng = random.Random(60 + at)
    image = new_image(config, 2, rng)
    rings, count, head, tokens = random_session(config, rng, config.window + 3)
    lay = RecordLayout(config)
    armed = [True]

    def fail(op, lba, n):
        if op == StorageOp.READ and lba == lay.region_lba(0) + lay.kv_sector and armed[0]:
            armed[0] = False
            return at
        return None

    async def body(ctx, h, rng):
        await load_state(ctx, h, config, rings, count, head, tokens)
        a = await dma_op(ctx, h, DmaOp.EXPORT, 0, hash=5, seq=1)
        await load_state(ctx, h, config, rand_rings(config, rng), 2, 1, tokens)
        b = await dma_op(ctx, h, DmaOp.IMPORT, 0, count=count, hash=5)
        after_b = await read_state(ctx, h, config)
        c = await dma_op(ctx, h, DmaOp.IMPORT, 0, count=count, hash=5)
        return a[0], b[0], after_b[1], c, await read_state(ctx, h, config)

    res = simulate(config, 2, image, body, seed=at, stall=0.2, width=4, fail=fail)
    a, b, meta_b, c, (got, meta) = res["value"]
    LH = config.layers * config.kv_heads
    assert a is RecordStatus.OK and b is RecordStatus.STORAGE
    # fewer than 4 bytes: no whole word came, no K/V byte was written, nothing changed
    assert meta_b == [(0, config.window - 1) if at >= 4 else (2, 1)] * LH
    assert c == (RecordStatus.OK, count, 5, 1) and meta == [(count, head)] * LH
    for s in valid_slots(config, count, head):
        assert (got[:, :, :, s, :] == rings[:, :, :, s, :]).all()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("seed", [40, pytest.param(41, marks=pytest.mark.slow),
                                  pytest.param(42, marks=pytest.mark.slow)])
def test_power_cut_keeps_previous_snapshot(seed):
    """Export snapshot A, then a longer B into another region with the power failing at a
    random byte; after the restart the rebuild scan finds A valid and B not."""
    config = SMALL
    rng = random.Random(seed)
    image = new_image(config, 3)
    rings, count, head, tokens = random_session(config, rng, 30)
    lay = RecordLayout(config)

    async def export_a(ctx, h, rng):
        await load_state(ctx, h, config, rings, count, head, tokens)
        return await dma_op(ctx, h, DmaOp.EXPORT, 0, hash=11, seq=1)

    assert simulate(config, 3, image, export_a, seed=seed)["value"][0] is RecordStatus.OK
    rings_b, count_b, head_b, tokens_b = random_session(config, rng, 31)
    total = lay.record_bytes(count_b)
    cut = rng.randrange(total)

    async def export_b(ctx, h, rng):
        await load_state(ctx, h, config, rings_b, count_b, head_b, tokens_b)
        return await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=12, seq=2)

    res = simulate(config, 3, image, export_b, seed=seed, cut_after=cut)
    assert "cut" in res and "value" not in res
    # power back: the gateware verify scan and the golden scan agree
    async def scan(ctx, h, rng):
        return [await dma_op(ctx, h, DmaOp.VERIFY, r) for r in range(3)]

    got = simulate(config, 3, image, scan, seed=seed)["value"]
    infos = scan_image(config, image.read, 3)
    assert [g[0] for g in got] == [i.status for i in infos]
    assert got[0] == (RecordStatus.OK, 30, 11, 1)
    assert got[1][0] is not RecordStatus.OK
    inserts, frees, next_seq = rebuild(infos)
    assert inserts == [(30, 11, 0, 1)] and frees == [1, 2]


@pytest.mark.parametrize("config", [SMALL, SMALL2, SMALLC])
def test_with_attention_core(config):
    """The DMA against the real attention core's ring port (hw/attention/core.py, in the config's
    numerics: one byte per element for fx1 and fx1c, two for fx2): import a golden record into
    the core's rings, export it again: the new record is the golden encoding (for fx1c, with the
    fractions in its header); a record of the same shape in fx1 is foreign."""
    from amaranth import Module
    from amaranth.lib import wiring

    from ringkv.hw.attention.core import AttentionCore
    from ringkv.hw.store.token_memory import TokenMemory

    rng = random.Random(50)
    image = new_image(config, 2, rng)
    rings, count, head, tokens = write_golden(config, image, 0, rng, 21, hash=0x77, seq=1)

    class Top(wiring.Component):
        def __init__(self):
            self.dma = DmaEngine(config, 2)
            self.core = AttentionCore(layers=config.layers, q_heads=config.q_heads,
                                      kv_heads=config.kv_heads, head_dim=config.head_dim,
                                      window=config.window, lanes=2, macs=2,
                                      numerics=config.numerics, qkv_fracs=config.qkv_fracs)
            self.tmem = TokenMemory(config.max_tokens, config.token_width, read_ports=1)
            sig = self.dma.signature.members
            super().__init__({"cmd": sig["cmd"], "resp": sig["resp"],
                              "storage": sig["storage"],
                              "tok": wiring.In(wiring.Signature({
                                  "valid": wiring.Out(1),
                                  "payload": wiring.Out(config.token_width)}))})

        def elaborate(self, platform):
            m = Module()
            m.submodules.dma, m.submodules.core = self.dma, self.core
            m.submodules.tmem = self.tmem
            wiring.connect(m, wiring.flipped(self.cmd), self.dma.cmd)
            wiring.connect(m, wiring.flipped(self.resp), self.dma.resp)
            wiring.connect(m, wiring.flipped(self.storage), self.dma.storage)
            wiring.connect(m, self.dma.tokens, self.tmem.read_port(0))
            wiring.connect(m, self.dma.ring, self.core.ring)
            m.d.comb += [self.tmem.append.valid.eq(self.tok.valid),
                         self.tmem.append.payload.eq(self.tok.payload)]
            return m

    top = Top()
    sim = Simulator(top)
    sim.add_clock(1e-8)
    out = {}

    async def server(ctx):
        await serve_storage(ctx, top.storage, image)

    async def bench(ctx):
        ctx.set(top.tok.valid, 1)
        for t in tokens:
            ctx.set(top.tok.payload, t)
            await ctx.tick()
        ctx.set(top.tok.valid, 0)
        out["imp"] = await dma_op(ctx, top, DmaOp.IMPORT, 0, count=count, hash=0x77)
        out["meta"] = [(ctx.get(top.core.ring.meta_count), ctx.get(top.core.ring.meta_head))]
        out["exp"] = await dma_op(ctx, top, DmaOp.EXPORT, 1, hash=0x77, seq=2)
        if config is SMALLC:    # region 0 now holds an fx1 record of the same shape
            write_golden(config, image, 0, random.Random(51), 21, hash=0x78, seq=3,
                         other=SMALL)
            out["foreign"] = await dma_op(ctx, top, DmaOp.IMPORT, 0, count=21, hash=0x78)

    sim.add_testbench(server, background=True)
    sim.add_testbench(bench)
    sim.run()
    assert out["imp"] == (RecordStatus.OK, count, 0x77, 1)
    assert out["exp"] == (RecordStatus.OK, count, 0x77, 2)
    lay = RecordLayout(config)
    for off, data in encode_record(config, tokens, rings, count=count, ring_head=head,
                                   prefix_hash=0x77, commit_seq=2):
        assert image.read(lay.region_lba(1) + off, len(data) // SECTOR) == data
    if config is SMALLC:
        # the gateware wrote the fractions into its header (the template's constant bytes)
        assert image.read(lay.region_lba(1), 1)[116:123] == bytes([5, 4, 6, 4, 6, 3, 0])
        assert out["foreign"][0] == RecordStatus.FOREIGN_CONFIG


async def tap_until_response(ctx, h, rng, seen):
    """Record every byte on the engine's ``record_tap`` until the response; return it."""
    tap = h.dma.record_tap
    while True:
        *_, valid, seg, pos, byte, rvalid = await ctx.tick().sample(
            tap.valid, tap.segment, tap.pos, tap.byte, h.resp.valid)
        if valid:
            seen.append((seg, pos if seg == RecordSegment.HDR else None, byte))
        if rvalid and rng.random() > 0.2:
            break
    ctx.set(h.resp.ready, 1)
    (payload,) = (await ctx.tick().sample(h.resp.payload))[2:]
    ctx.set(h.resp.ready, 0)
    return RecordStatus(payload.status.value)


@pytest.mark.parametrize("config,count,seed", [(SMALL, 11, 50), (SMALL2, 3, 51), (TINY, 0, 52)])
def test_record_tap_carries_the_record(config, count, seed):
    """The engine's ``record_tap`` (where a consumer of the record's bytes attaches): an export
    shows the golden record's token bytes, K/V bytes and header bytes 0..507 in write order
    (tokens, K/V, header); an import the header's 512 bytes, then the tokens, then the K/V
    bytes; each byte once, its segment named, header bytes with their offset; random stalls on
    every stream."""
    rng = random.Random(seed)
    image = new_image(config, 2, rng)
    rings, _, head, _ = random_session(config, rng)
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]
    tok, kv = encode_payload(config, tokens, rings, count, head)
    writes = encode_record(config, tokens, rings, count=count, ring_head=head, prefix_hash=77,
                           commit_seq=4)
    header = dict(writes)[0]
    seen = {"export": [], "import": []}

    async def body(ctx, h, rng):
        await load_state(ctx, h, config, rings, count, head, tokens)
        statuses = []
        for name, op in (("export", DmaOp.EXPORT), ("import", DmaOp.IMPORT)):
            await stream_put(ctx, h.cmd, {"op": op, "region": 1, "count": count, "hash": 77,
                                          "seq": 4}, rng=rng, idle=0.2)
            statuses.append(await tap_until_response(ctx, h, rng, seen[name]))
        return statuses

    res = simulate(config, 2, image, body, seed=seed, idle=0.2, stall=0.2)
    assert res["value"] == [RecordStatus.OK] * 2

    def area(items, seg):
        return bytes(b for s, _, b in items if s == seg)

    def in_order(items, order):
        segs = [s for s, _, _ in items]
        return segs == sorted(segs, key=order.index)

    exp, imp = seen["export"], seen["import"]
    assert in_order(exp, [RecordSegment.TOK, RecordSegment.KV, RecordSegment.HDR])
    assert area(exp, RecordSegment.TOK) == tok and area(exp, RecordSegment.KV) == kv
    assert area(exp, RecordSegment.HDR) == header[:SECTOR - 4]
    assert [p for s, p, _ in exp if s == RecordSegment.HDR] == list(range(SECTOR - 4))
    assert in_order(imp, [RecordSegment.HDR, RecordSegment.TOK, RecordSegment.KV])
    assert area(imp, RecordSegment.HDR) == header
    assert [p for s, p, _ in imp if s == RecordSegment.HDR] == list(range(SECTOR))
    assert area(imp, RecordSegment.TOK) == tok and area(imp, RecordSegment.KV) == kv


MID = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=16, token_width=16,
                   max_tokens=600)
MID2 = RingKVConfig(**{**MID.__dict__, "numerics": "ringkv-fx2"})


@pytest.mark.parametrize("config", [MID, MID2])
def test_wide_port_clocks(config):
    """Exact clocks of an export and an open import at the storage port's peak, on a port of
    bytes and on a wide one: the wide import reads its K/V sectors a word a clock (384 clocks
    less a sector), gives 3 clocks back (the unpacker's and the K/V writer's latencies), and
    waits for the K/V writer's last chunk where no padding words hide it (its input register
    and ``v - 1`` clocks, less those words); the export takes 3 clocks more (its bytes packed
    into words)."""
    from bench.bench_storage import dma_cycles
    lay = RecordLayout(config)
    per_slot = 2 * config.layers * config.kv_heads * config.head_dim * lay.elem_bytes
    for count in (1, 3, 16, 300):
        narrow, wide = dma_cycles(config, count), dma_cycles(config, count, width=4)
        v = min(count, config.window)
        kv_sectors = -(-v * per_slot // SECTOR)
        pad_words = (kv_sectors * SECTOR - v * per_slot) // 4
        assert wide["export"] == narrow["export"] + 3, count
        assert wide["import"] == (narrow["import"] - 384 * kv_sectors + 3
                                  + max(0, v - pad_words)), count
