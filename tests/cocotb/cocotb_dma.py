"""cocotb on Verilator: DMA harness (DMA engine + ring model + token memory) against the golden
record model, with the sector-level storage model serving the storage port from an image."""

import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge, Timer
from cocotb.utils import get_sim_time

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import SECTOR, RecordLayout, RecordStatus, kv_bytes_of, ring_elements
from ringkv.host.record import (
    encode_record,
    import_record,
    rebuild,
    ring_dtype,
    ring_image,
    rings_from_image,
    scan_image,
)
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import StreamSink, StreamSource, pack_fields, unpack_fields
from ringkv.sim.sector_model import CARD_PACES, CocotbStorageServer, SectorImage

P = cocotb_params()
CONFIG = RingKVConfig(**P["config"])
REGIONS = P["regions"]
CMD = [("op", 2), ("region", 16), ("count", 32), ("hash", 64), ("seq", 32)]
RESP = [("status", 4), ("count", 32), ("hash", 64), ("seq", 32)]
EXPORT, IMPORT, VERIFY = 0, 1, 2


class Bench:
    def __init__(self, dut, image, seed, p):
        self.dut, self.image, self.p = dut, image, p
        self.rng = random.Random(seed)
        self.src = StreamSource(dut, "cmd", dut.clk, idle=p, rng=random.Random(seed + 1))
        self.sink = StreamSink(dut, "resp", dut.clk, stall=p, rng=random.Random(seed + 2))
        self.server = None
        self.task = None

    def start_server(self, **kw):
        self.server = CocotbStorageServer(self.dut, "storage", self.dut.clk, self.image,
                                          rng=random.Random(self.rng.random()), idle=self.p,
                                          stall=self.p, **kw)
        self.task = cocotb.start_soon(self.server.run())

    async def reset(self):
        d = self.dut
        for name in ("tap__we", "tap__meta_we", "tok_append__valid", "tok_clear"):
            getattr(d, name).value = 0
        d.rst.value = 1
        for _ in range(3):
            await RisingEdge(d.clk)
        d.rst.value = 0

    async def load(self, rings, count, head, tokens, meta_heads=None):
        d = self.dut
        d.tap__we.value = 1
        for i, byte in enumerate(ring_image(CONFIG, rings)):
            d.tap__addr.value = i
            d.tap__wdata.value = int(byte)
            await RisingEdge(d.clk)
        d.tap__we.value = 0
        d.tap__meta_we.value = 1
        for layer in range(CONFIG.layers * CONFIG.kv_heads):
            d.tap__meta_ring.value = layer
            d.tap__meta_wcount.value = count
            d.tap__meta_whead.value = meta_heads[layer] if meta_heads else head
            await RisingEdge(d.clk)
        d.tap__meta_we.value = 0
        d.tok_clear.value = 1
        await RisingEdge(d.clk)
        d.tok_clear.value = 0
        d.tok_append__valid.value = 1
        for tok in tokens:
            d.tok_append__payload.value = tok
            await RisingEdge(d.clk)
        d.tok_append__valid.value = 0

    async def read_rings(self):
        d = self.dut
        n = ring_elements(CONFIG) * ring_dtype(CONFIG).itemsize      # the ring port's bytes
        out = bytearray(n)
        for i in range(n):
            d.tap__addr.value = i
            await RisingEdge(d.clk)
            await Timer(1, "ns")
            out[i] = int(d.tap__rdata.value)
        meta = []
        for layer in range(CONFIG.layers * CONFIG.kv_heads):
            d.tap__meta_ring.value = layer
            await Timer(1, "ns")
            meta.append((int(d.tap__meta_rcount.value), int(d.tap__meta_rhead.value)))
        return rings_from_image(CONFIG, out), meta

    async def op(self, op, region, count=0, hash=0, seq=0):
        await self.src.send(pack_fields(CMD, {"op": op, "region": region, "count": count,
                                              "hash": hash, "seq": seq}))
        r = unpack_fields(RESP, await self.sink.recv())
        return RecordStatus(r["status"]), r["count"], r["hash"], r["seq"]


def random_state(rng, count=None):
    c = CONFIG
    count = rng.choice([0, 1, c.window - 1, c.window, c.window + 1,
                        rng.randrange(c.max_tokens + 1)]) if count is None else count
    shape = (c.layers, c.kv_heads, 2, c.window, c.head_dim)
    dt = ring_dtype(c)             # element words: uint8 (ringkv-fx1) or uint16 (ringkv-fx2)
    rings = np.frombuffer(rng.randbytes(int(np.prod(shape)) * dt.itemsize),
                          dtype=dt).reshape(shape)
    tokens = [rng.randrange(1 << c.token_width) for _ in range(count)]
    return rings.copy(), count, rng.randrange(c.window), tokens


def valid_slots(count, head):
    v = min(count, CONFIG.window)
    return [(head - v + 1 + t) % CONFIG.window for t in range(v)]


def new_image(rng):
    lay = RecordLayout(CONFIG)
    image = SectorImage(sectors=REGIONS * lay.sectors_per_region)
    image.write(0, rng.randbytes(image.sectors * SECTOR))
    return image


@cocotb.test(timeout_time=400, timeout_unit="ms")
async def round_trips(dut):
    """Many random snapshots: export is byte-exact with the golden encoder, import restores the
    valid ring slots, head and count exactly, verify agrees; random idle/backpressure."""
    Clock(dut.clk, 10, unit="ns").start()
    rng = random.Random(P.get("seed", 1))
    image = new_image(rng)
    bench = Bench(dut, image, rng.randrange(1 << 30), p=0.25)
    await bench.reset()
    bench.start_server()
    lay = RecordLayout(CONFIG)
    for trial in range(P.get("trials", 8)):
        rings, count, head, tokens = random_state(rng)
        region = rng.randrange(REGIONS)
        h, seq = rng.getrandbits(64), trial + 1
        await bench.load(rings, count, head, tokens)
        before = bytes(image[:])
        st = await bench.op(EXPORT, region, hash=h, seq=seq)
        assert st == (RecordStatus.OK, count, h, seq), (trial, st)
        expect = bytearray(before)
        base = lay.region_lba(region) * SECTOR
        for off, data in encode_record(CONFIG, tokens, rings, count=count, ring_head=head,
                                       prefix_hash=h, commit_seq=seq):
            expect[base + off * SECTOR:base + off * SECTOR + len(data)] = data
        assert bytes(image[:]) == bytes(expect), f"trial {trial}: image differs from golden"
        stale, _, _, _ = random_state(rng, 0)
        await bench.load(stale, 5, 1, tokens)
        st = await bench.op(IMPORT, region, count=count, hash=h)
        assert st == (RecordStatus.OK, count, h, seq), (trial, st)
        got, meta = await bench.read_rings()
        assert meta == [(count, head)] * (CONFIG.layers * CONFIG.kv_heads)
        for s in range(CONFIG.window):
            want = rings if s in valid_slots(count, head) else stale
            assert (got[:, :, :, s, :] == want[:, :, :, s, :]).all(), (trial, s)
        assert (await bench.op(VERIFY, region)) == (RecordStatus.OK, count, h, seq)


@cocotb.test(timeout_time=400, timeout_unit="ms")
async def a_paced_card_costs_exactly_its_clocks(dut):
    """The storage model at the SD native controller's pace (``CARD_PACES["sd4"]``, ``ringkv
    sim --card-pace sd4``): an export and an import of the same snapshot take exactly the
    pace's clocks more than at a byte a clock, summed over the commands the DMA issued (the
    model's log), and give the same record and the same rings."""
    Clock(dut.clk, 10, unit="ns").start()
    rng = random.Random(P.get("seed", 1) + 100)
    image = new_image(rng)
    bench = Bench(dut, image, rng.randrange(1 << 30), p=0.0)
    await bench.reset()
    pace = CARD_PACES["sd4"]
    rings, count, head, tokens = random_state(rng, CONFIG.window + 3)
    h = rng.getrandbits(64)
    clocks, logs, images, busy = {}, {}, {}, {}
    for paced in (None, pace):
        bench.start_server(pace=paced)
        for op in (EXPORT, IMPORT):
            await bench.load(rings, count, head, tokens)
            start, t0 = len(bench.server.log), get_sim_time("ns")
            st = await bench.op(op, 1, count=count, hash=h, seq=9)
            assert st == (RecordStatus.OK, count, h, 9), (paced, op, st)
            clocks[paced, op] = round((get_sim_time("ns") - t0) / 10)
            logs[paced, op] = bench.server.log[start:]
        # the server's statistics: its commands and sectors, and the clocks it was busy
        for name, op in (("write", EXPORT), ("read", IMPORT)):
            stats = bench.server.stats[name]
            assert stats["commands"] == len(logs[paced, op])
            assert stats["sectors"] == sum(n for _, _, n in logs[paced, op])
            busy[paced, op] = stats["clocks"]
        images[paced] = bytes(image[:])
        got, meta = await bench.read_rings()
        assert meta == [(count, head)] * (CONFIG.layers * CONFIG.kv_heads)
        assert all((got[:, :, :, s, :] == rings[:, :, :, s, :]).all()
                   for s in valid_slots(count, head))
        bench.task.cancel()
    assert images[None] == images[pace]
    for op, extra in ((EXPORT, pace.write_clocks), (IMPORT, pace.read_clocks)):
        assert logs[None, op] == logs[pace, op] and logs[pace, op]
        want = sum(extra(n) for _, _, n in logs[pace, op])
        assert clocks[pace, op] - clocks[None, op] == want, (op, clocks, want, logs[pace, op])
        assert busy[pace, op] - busy[None, op] == want, (op, busy, want)
        assert 0 < busy[None, op] < clocks[None, op]
        dut._log.info("paced %s: %d clocks (a byte a clock: %d), %d commands", op,
                      clocks[pace, op], clocks[None, op], len(logs[pace, op]))


@cocotb.test(timeout_time=400, timeout_unit="ms")
async def corruption_is_a_miss(dut):
    """Random bit flips anywhere in a record's meaningful bytes: the gateware's status equals the
    golden import's, never OK, and the rings are unchanged or emptied (count 0)."""
    Clock(dut.clk, 10, unit="ns").start()
    rng = random.Random(P.get("seed", 1) + 100)
    image = new_image(rng)
    bench = Bench(dut, image, rng.randrange(1 << 30), p=0.1)
    await bench.reset()
    bench.start_server()
    lay = RecordLayout(CONFIG)
    rings, count, head, tokens = random_state(rng, CONFIG.window + 3)
    await bench.load(rings, count, head, tokens)
    assert (await bench.op(EXPORT, 0, hash=77, seq=9))[0] is RecordStatus.OK
    tok_end = SECTOR + count * lay.token_bytes
    kv0 = lay.kv_sector * SECTOR
    spots = ([rng.randrange(0, 116) for _ in range(6)] + [rng.randrange(508, 512)]
             + [rng.randrange(SECTOR, tok_end) for _ in range(3)]
             + [rng.randrange(kv0, kv0 + kv_bytes_of(CONFIG, count)) for _ in range(4)])
    for pos in spots:
        bit = 1 << rng.randrange(8)
        raw = bytearray(image.read(pos // SECTOR, 1))
        raw[pos % SECTOR] ^= bit
        image.write(pos // SECTOR, bytes(raw))
        stale, _, _, _ = random_state(rng, 0)
        await bench.load(stale, 3, 2, tokens)
        st = (await bench.op(IMPORT, 0, count=count, hash=77))[0]
        golden = stale.copy()
        want, _, meta = import_record(CONFIG, image.read, 0, count=count, prefix_hash=77,
                                      session_tokens=tokens, rings=golden)
        got, got_meta = await bench.read_rings()
        assert st is want and st is not RecordStatus.OK, (pos, st, want)
        rings_n = CONFIG.layers * CONFIG.kv_heads
        assert (got == golden).all() and got_meta == [meta or (3, 2)] * rings_n, pos
        raw[pos % SECTOR] ^= bit
        image.write(pos // SECTOR, bytes(raw))


@cocotb.test(timeout_time=400, timeout_unit="ms")
async def power_cut_during_export(dut):
    """Export A; then export B with the power failing at a random byte; the FPGA restarts
    (reset) on the same image: the verify scan and the golden rebuild keep A, free B."""
    Clock(dut.clk, 10, unit="ns").start()
    rng = random.Random(P.get("seed", 1) + 200)
    lay = RecordLayout(CONFIG)
    for _ in range(P.get("cuts", 3)):
        image = new_image(rng)
        bench = Bench(dut, image, rng.randrange(1 << 30), p=0.2)
        await bench.reset()
        bench.start_server()
        # (a zero-token snapshot is valid but never re-inserted: nothing to resume)
        rings, count, head, tokens = random_state(rng, rng.randrange(1, CONFIG.max_tokens))
        await bench.load(rings, count, head, tokens)
        assert (await bench.op(EXPORT, 0, hash=5, seq=1))[0] is RecordStatus.OK
        rings_b, count_b, head_b, tokens_b = random_state(rng, count + 1)
        await bench.load(rings_b, count_b, head_b, tokens_b)
        bench.task.cancel()
        bench.start_server(cut_after=rng.randrange(lay.record_bytes(count_b)))
        await bench.src.send(pack_fields(CMD, {"op": EXPORT, "region": 1, "hash": 6, "seq": 2}))
        while bench.server.cut is None:
            await RisingEdge(dut.clk)
        # power cycle: the FPGA loses its state, the image keeps what was written
        bench.task.cancel()
        bench = Bench(dut, image, rng.randrange(1 << 30), p=0.2)
        await bench.reset()
        bench.start_server()
        got = [await bench.op(VERIFY, r) for r in range(REGIONS)]
        infos = scan_image(CONFIG, image.read, REGIONS)
        assert [g[0] for g in got] == [i.status for i in infos]
        assert got[0] == (RecordStatus.OK, count, 5, 1) and got[1][0] is not RecordStatus.OK
        inserts, frees, _ = rebuild(infos)
        assert inserts == [(count, 5, 0, 1)] and 1 in frees
        bench.task.cancel()
        await ReadOnly()
        await RisingEdge(dut.clk)
