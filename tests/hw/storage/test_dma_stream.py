"""The DMA engine's byte-stream pieces (hw/storage/dma_stream.py) against Python models: the record
cursor's loop nest, the export write pipeline (random issue, random backpressure, flush) and
the token checker. The engine's record tap is tested in test_dma.py."""

import random

import pytest
from amaranth.sim import Simulator

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import SECTOR, RecordLayout
from ringkv.hw.storage.dma_stream import (
    ByteSource,
    RecordCursor,
    RecordSegment,
    TokenChecker,
    WritePipeline,
)

SMALL = RingKVConfig(layers=2, q_heads=2, kv_heads=2, head_dim=4, window=8, token_width=12,
                     max_tokens=50)
SMALL2 = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx2"})
ONE = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=2, window=2, token_width=8,
                   max_tokens=9)


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def kv_addresses(config, count, head):
    """The ring port byte addresses of a record's K/V area, in record order (the model)."""
    lay = RecordLayout(config)
    W, D, EB, LH = config.window, config.head_dim, lay.elem_bytes, config.layers * config.kv_heads
    v = min(count, W)
    slots = [(head - v + 1 + t) % W for t in range(v)]

    def addr(lh, kind, slot, dim, b):
        return b + EB * (dim + D * (slot + W * (kind + 2 * lh)))
    k = [addr(lh, 0, s, d, b) for lh in range(LH) for s in slots for d in range(D)
         for b in range(EB)]
    vv = [addr(lh, 1, s, d, b) for lh in range(LH) for d in range(D) for s in slots
          for b in range(EB)]
    return k + vv


@pytest.mark.parametrize("config", [SMALL, SMALL2, ONE])
def test_cursor_walks_the_record_order(config):
    """Token bytes, K/V byte addresses and header offsets step by step, with idle clocks
    between steps and a restart in the middle of a segment, equal the model's."""
    dut = RecordCursor(config)
    lay = RecordLayout(config)
    rng = random.Random(7 + config.window)
    walked = []

    async def bench(ctx):
        for count in (0, 1, config.window - 1, config.window, config.window + 1,
                      config.max_tokens, rng.randrange(config.max_tokens + 1)):
            head = rng.randrange(config.window)
            v = min(count, config.window)
            ctx.set(dut.valid_slots, v)
            ctx.set(dut.first_slot, (head + 1 - v) % config.window)
            toks = [(i, b) for i in range(count) for b in range(lay.token_bytes)]
            for seg, want in ((RecordSegment.TOK, toks),
                              (RecordSegment.KV, kv_addresses(config, count, head)),
                              (RecordSegment.HDR, list(range(SECTOR)) + [0, 1])):
                ctx.set(dut.segment, seg)
                for attempt in range(2):      # the first attempt is cut short by a restart
                    ctx.set(dut.start, 1)
                    await ctx.tick()
                    ctx.set(dut.start, 0)
                    stop = rng.randrange(len(want) + 1) if attempt == 0 else len(want)
                    for i, expect in enumerate(want[:stop]):
                        got = {RecordSegment.TOK: (ctx.get(dut.token_index),
                                                   ctx.get(dut.token_byte)),
                               RecordSegment.KV: ctx.get(dut.ring_addr),
                               RecordSegment.HDR: ctx.get(dut.hdr_pos)}[seg]
                        assert got == expect, (count, seg, i)
                        if seg != RecordSegment.HDR:
                            assert ctx.get(dut.hdr_pos) == i % SECTOR
                        while rng.random() < 0.2:
                            await ctx.tick()
                        ctx.set(dut.step, 1)
                        await ctx.tick()
                        ctx.set(dut.step, 0)
                walked.append(count)

    run(dut, bench)
    assert len(walked) == 7 * 3


@pytest.mark.parametrize("seed,ready", [(1, 0.9), (2, 0.5), (3, 0.1)])
def test_write_pipeline_matches_model(seed, ready):
    """Random bytes from the four sources, issued whenever ``room`` allows (and sometimes
    not), against random ``wdata`` backpressure: the stream carries the issued bytes in order
    (token byte ``sel`` of the word read one clock later, ring data two clocks later, CRC byte
    ``sel`` of ``crc`` one clock later), the tap the payload ones, the header output the
    constants issued with ``hdr``; ``room`` never lets the FIFO overflow; a flush drops every
    byte in flight and queued and leaves the pipeline empty."""
    config = SMALL                               # two bytes per token
    dut = WritePipeline(config)
    rng = random.Random(seed)
    sent, tapped, expect, expect_tap = [], [], [], []
    hdr_seen, expect_hdr = [], []

    async def bench(ctx):
        ring_pipe = [0, 0]                       # ring data two clocks after the read
        token_next = crc_next = 0
        flushes = 0
        for clock in range(1500):
            flush = clock % 500 == 499
            issue = not flush and ctx.get(dut.room) and rng.random() < 0.8
            ctx.set(dut.flush, flush)
            ctx.set(dut.issue, issue)
            ctx.set(dut.wdata.ready, rng.random() < ready)
            ctx.set(dut.token_word, token_next)
            ctx.set(dut.ring_rdata, ring_pipe[0])
            ctx.set(dut.crc, crc_next)
            token_next, ring_read = rng.randrange(1 << 16), rng.randrange(256)
            crc_next = rng.randrange(1 << 32)
            if issue:
                source = rng.choice(list(ByteSource))
                const, hdr = rng.randrange(256), rng.random() < 0.5
                sel = rng.randrange(4 if source == ByteSource.CRC else 2)
                ctx.set(dut.source, source)
                ctx.set(dut.const, const)
                ctx.set(dut.sel, sel)
                ctx.set(dut.hdr, hdr)
                byte = {ByteSource.CONST: const, ByteSource.TOKEN: (token_next >> 8 * sel) & 255,
                        ByteSource.RING: ring_read,
                        ByteSource.CRC: (crc_next >> 8 * sel) & 255}[source]
                expect.append(byte)
                if source in (ByteSource.TOKEN, ByteSource.RING):
                    expect_tap.append(byte)
                if source == ByteSource.CONST and hdr:
                    expect_hdr.append(byte)
            if ctx.get(dut.wdata.valid) and ctx.get(dut.wdata.ready):
                sent.append(ctx.get(dut.wdata.payload))
            if ctx.get(dut.tap_valid):
                tapped.append(ctx.get(dut.tap_byte))
            if ctx.get(dut.hdr_valid):
                hdr_seen.append(ctx.get(dut.hdr_byte))
            ring_pipe = [ring_pipe[1], ring_read]
            await ctx.tick()
            if flush:
                ctx.set(dut.flush, 0)
                ctx.set(dut.issue, 0)
                assert ctx.get(dut.empty) and not ctx.get(dut.wdata.valid)
                # what was lost: the bytes still in flight or queued at the flush
                expect[:] = expect[:len(sent)]
                expect_tap[:] = expect_tap[:len(tapped)]
                flushes += 1
        ctx.set(dut.issue, 0)
        ctx.set(dut.wdata.ready, 1)
        for _ in range(8):
            if ctx.get(dut.wdata.valid):
                sent.append(ctx.get(dut.wdata.payload))
            if ctx.get(dut.tap_valid):
                tapped.append(ctx.get(dut.tap_byte))
            ctx.set(dut.ring_rdata, ring_pipe[0])
            ring_pipe = [ring_pipe[1], 0]
            await ctx.tick()
        assert ctx.get(dut.empty) and flushes == 3

    run(dut, bench)
    assert sent == expect and tapped == expect_tap
    assert hdr_seen == expect_hdr           # every one, a clock after its issue (even at a flush)
    assert len(sent) > 600 * ready


def test_write_pipeline_room_and_latency():
    """With ``wdata.ready`` low the FIFO takes four bytes: ``room`` drops after the fourth
    issue; the first byte is on ``wdata`` three clocks after its issue."""
    dut = WritePipeline(SMALL)

    async def bench(ctx):
        ctx.set(dut.source, ByteSource.CONST)
        issued = 0
        for clock in range(8):
            room = ctx.get(dut.room)
            ctx.set(dut.issue, room)
            ctx.set(dut.const, 10 + clock)
            issued += room
            await ctx.tick()
            if clock == 2:
                assert ctx.get(dut.wdata.valid) and ctx.get(dut.wdata.payload) == 10
            if clock < 2:
                assert not ctx.get(dut.wdata.valid)
        assert issued == 4 and not ctx.get(dut.room) and not ctx.get(dut.empty)

    run(dut, bench)


def test_token_checker_matches_model():
    """Random stored bytes, most equal to token memory's: ``mismatch`` rises exactly two
    clocks after the check of a differing byte, stays up, and ``clear`` drops it."""
    dut = TokenChecker(SMALL)
    rng = random.Random(5)
    rises = []

    async def bench(ctx):
        pending = None          # (check clock, byte, sel) awaiting the token word
        model = 0
        history = []
        for clock in range(600):
            clear = clock % 97 == 0
            check = rng.random() < 0.7
            byte, sel = rng.randrange(256), rng.randrange(2)
            word = rng.randrange(1 << 16)
            if pending is not None and rng.random() < 0.9:
                # make most checked bytes agree with the word
                b, s = pending[1], pending[2]
                word = (word & ~(0xFF << 8 * s)) | (b << 8 * s)
            ctx.set(dut.clear, clear)
            ctx.set(dut.check, check)
            ctx.set(dut.byte, byte)
            ctx.set(dut.sel, sel)
            ctx.set(dut.token_word, word)
            differs = pending is not None and ((word >> 8 * pending[2]) & 255) != pending[1]
            history.append(model)
            assert ctx.get(dut.mismatch) == model, clock
            if differs:
                model = 1
                rises.append(clock)
            elif clear:
                model = 0
            pending = (clock, byte, sel) if check else None
            await ctx.tick()

    run(dut, bench)
    assert len(rises) > 20
