"""cocotb on Verilator: the DMA harness with the record MAC (``DmaHarness(..., mac=True)``):
sealed exports and imports against the golden sealed record (``host/record/codec.py`` with keys,
``hashlib`` as the MAC's reference), with random idle and backpressure on every stream."""

import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, Timer

from ringkv.defs.config import RingKVConfig
from ringkv.defs.mac import KEY_ID_BYTES, KEY_SLOTS
from ringkv.defs.record import SECTOR, RecordLayout, RecordStatus, put_field, ring_elements
from ringkv.host.record import (
    crc32,
    encode_record,
    import_record,
    ring_dtype,
    ring_image,
    rings_from_image,
)
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import StreamSink, StreamSource, pack_fields, unpack_fields
from ringkv.sim.sector_model import CocotbStorageServer, SectorImage

P = cocotb_params()
CONFIG = RingKVConfig(**P["config"])
REGIONS = P["regions"]
CMD = [("op", 2), ("region", 16), ("count", 32), ("hash", 64), ("seq", 32), ("kind", 8),
       ("sealed", 1), ("slot", 2)]
RESP = [("status", 4), ("count", 32), ("hash", 64), ("seq", 32), ("key_id", 16)]
KEY_WRITE = [("slot", 8), ("index", 6), ("data", 8), ("clear", 1)]
EXPORT, IMPORT = 0, 1


async def setup(dut, image, rng, p):
    d = dut
    for name in ("tap__we", "tap__meta_we", "tok_append__valid", "tok_clear"):
        getattr(d, name).value = 0
    src = StreamSource(d, "cmd", d.clk, idle=p, rng=random.Random(rng.random()))
    sink = StreamSink(d, "resp", d.clk, stall=p, rng=random.Random(rng.random()))
    keys = StreamSource(d, "key_write", d.clk, idle=p, rng=random.Random(rng.random()))
    d.rst.value = 1
    for _ in range(3):
        await RisingEdge(d.clk)
    d.rst.value = 0
    server = CocotbStorageServer(d, "storage", d.clk, image, rng=random.Random(rng.random()),
                                 idle=p, stall=p)
    cocotb.start_soon(server.run())
    return src, sink, keys


async def load(d, rings, count, head, tokens):
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
        d.tap__meta_whead.value = head
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


async def read_rings(d):
    out = bytearray(ring_elements(CONFIG) * ring_dtype(CONFIG).itemsize)
    for i in range(len(out)):
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


async def op(src, sink, op, region, **fields):
    await src.send(pack_fields(CMD, {"op": op, "region": region, **fields}))
    r = unpack_fields(RESP, await sink.recv())
    return RecordStatus(r["status"]), r["count"], r["hash"], r["seq"], r["key_id"]


def random_state(rng, count):
    c = CONFIG
    shape = (c.layers, c.kv_heads, 2, c.window, c.head_dim)
    dt = ring_dtype(c)
    rings = np.frombuffer(rng.randbytes(int(np.prod(shape)) * dt.itemsize),
                          dtype=dt).reshape(shape).copy()
    return rings, count, rng.randrange(c.window), [rng.randrange(1 << c.token_width)
                                                   for _ in range(count)]


@cocotb.test(timeout_time=400, timeout_unit="ms")
async def sealed_round_trips(dut):
    """Random snapshots sealed under random slots: each export is byte-exact with the golden
    sealed record, its import under the slot restores the rings, and the record with its tag
    changed (header CRC recomputed) is BAD_MAC with every ring empty; an export under the one
    unset slot is NO_KEY and writes nothing."""
    Clock(dut.clk, 10, unit="ns").start()
    rng = random.Random(P.get("seed", 1))
    lay = RecordLayout(CONFIG)
    image = SectorImage(sectors=REGIONS * lay.sectors_per_region)
    image.write(0, rng.randbytes(image.sectors * SECTOR))
    src, sink, key_src = await setup(dut, image, rng, 0.25)
    keys = {s: (0x200 + s, rng.randbytes(32)) for s in range(KEY_SLOTS - 1)}
    for slot, (key_id, key) in keys.items():
        raw = key_id.to_bytes(KEY_ID_BYTES, "little") + key
        for i, b in enumerate(raw):
            await key_src.send(pack_fields(KEY_WRITE, {"slot": slot, "index": i, "data": b}))
    for trial in range(P.get("trials", 4)):
        count = rng.choice([0, 1, CONFIG.window, rng.randrange(CONFIG.max_tokens + 1)])
        rings, count, head, tokens = random_state(rng, count)
        region, slot = rng.randrange(REGIONS), rng.randrange(KEY_SLOTS - 1)
        h, seq = rng.getrandbits(64), trial + 1
        await load(dut, rings, count, head, tokens)
        before = bytes(image[:])
        st = await op(src, sink, EXPORT, region, hash=h, seq=seq, sealed=1, slot=KEY_SLOTS - 1)
        assert st[0] is RecordStatus.NO_KEY and bytes(image[:]) == before, trial
        st = await op(src, sink, EXPORT, region, hash=h, seq=seq, sealed=1, slot=slot)
        assert st == (RecordStatus.OK, count, h, seq, keys[slot][0]), (trial, st)
        expect = bytearray(before)
        base = lay.region_lba(region) * SECTOR
        for off, data in encode_record(CONFIG, tokens, rings, count=count, ring_head=head,
                                       prefix_hash=h, commit_seq=seq, key=keys[slot][1],
                                       key_id=keys[slot][0]):
            expect[base + off * SECTOR:base + off * SECTOR + len(data)] = data
        assert bytes(image[:]) == bytes(expect), f"trial {trial}: image differs from golden"
        stale = random_state(rng, 0)[0]
        await load(dut, stale, 2, 1, tokens)
        st = await op(src, sink, IMPORT, region, count=count, hash=h, sealed=1, slot=slot)
        assert st == (RecordStatus.OK, count, h, seq, keys[slot][0]), (trial, st)
        got, meta = await read_rings(dut)
        want = stale.copy()
        import_record(CONFIG, image.read, region, count=count, prefix_hash=h,
                      session_tokens=tokens, rings=want, keys=dict([keys[slot]]), sealed=True)
        assert (got == want).all() and meta == [(count, head)] * len(meta), trial
        header = bytearray(image.read(lay.region_lba(region), 1))
        header[308 + rng.randrange(16)] ^= 1 << rng.randrange(8)
        put_field(header, "header_crc", crc32(bytes(header[:SECTOR - 4])))
        image.write(lay.region_lba(region), bytes(header))
        await load(dut, stale, 2, 1, tokens)
        st = await op(src, sink, IMPORT, region, count=count, hash=h, sealed=1, slot=slot)
        assert st[0] is RecordStatus.BAD_MAC, (trial, st)
        got, meta = await read_rings(dut)
        assert meta == [(0, CONFIG.window - 1) if count else (2, 1)] * len(meta), (trial, meta)
