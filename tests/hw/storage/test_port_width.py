"""Bytes and words on storage streams (hw/storage/port_width.py): the two converters against
the reshaped stream, with random idle and stalls and at full rate; the wide port on the
sector model of a byte target (sim/sector_model.py): sectors written and read as words equal
the image, a range error, transfers ended early by an error at any byte, and a clean transfer
after each."""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from ringkv.hw.storage.port import StorageError, StorageOp, StoragePortSignature
from ringkv.hw.storage.port_width import BytesToWords, StorageWidener, WordsToBytes
from ringkv.sim.sector_model import SectorImage, serve_storage


def _pump(dut, items, *, idle, stall, seed, clear_at=None):
    """Offer ``items`` on ``dut.i`` (random idle), take ``dut.o`` (random stall); returns
    (outputs, the clock of each output). ``clear_at``: pulse ``clear`` before offering that
    item (after the outputs of the items before it are out)."""
    rng = random.Random(seed)
    out, clocks = [], []
    want = len(items) * (4 if isinstance(dut, WordsToBytes) else 1)
    want //= (1 if isinstance(dut, WordsToBytes) else 4)

    async def bench(ctx):
        i, clock = 0, 0
        while len(out) < want:
            if clear_at is not None and i == clear_at:
                ctx.set(dut.i.valid, 0)
                ctx.set(dut.clear, 1)
                await ctx.tick()
                ctx.set(dut.clear, 0)
                clock += 1
                i += 1
                continue
            offer = i < len(items) and not (idle and rng.random() < idle)
            take = not (stall and rng.random() < stall)
            ctx.set(dut.i.valid, offer)
            if offer:
                ctx.set(dut.i.payload, items[i])
            ctx.set(dut.o.ready, take)
            if offer and ctx.get(dut.i.ready):
                i += 1
            if take and ctx.get(dut.o.valid):
                out.append(ctx.get(dut.o.payload))
                clocks.append(clock)
            await ctx.tick()
            clock += 1
            assert clock < 20 * len(items) + 50

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out, clocks


@pytest.mark.parametrize("idle,stall", [(0, 0), (0.3, 0), (0, 0.3), (0.4, 0.4)])
def test_words_to_bytes(idle, stall):
    rng = random.Random(1)
    words = [rng.randrange(1 << 32) for _ in range(60)]
    out, clocks = _pump(WordsToBytes(), words, idle=idle, stall=stall, seed=2)
    assert out == [w >> (8 * k) & 0xFF for w in words for k in range(4)]
    if not idle and not stall:         # a byte a clock from the first, no bubble
        assert clocks == list(range(1, 1 + 4 * len(words)))


@pytest.mark.parametrize("idle,stall", [(0, 0), (0.3, 0), (0, 0.3), (0.4, 0.4)])
def test_bytes_to_words(idle, stall):
    rng = random.Random(3)
    data = bytes(rng.randrange(256) for _ in range(240))
    out, clocks = _pump(BytesToWords(), list(data), idle=idle, stall=stall, seed=4)
    assert out == [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]
    if not idle and not stall:         # a word every four clocks, the clock after its last byte
        assert clocks == [4 * k + 4 for k in range(len(data) // 4)]


def test_clear_drops_a_partial_word():
    """Six bytes, a clear, then eight: the clear drops the two bytes of the partial word, so
    the words are the first four bytes' and the last eight's."""
    data = list(range(1, 7)) + [None] + list(range(0x10, 0x18))
    out, _ = _pump(BytesToWords(), data, idle=0, stall=0, seed=5, clear_at=6)
    assert out == [0x04030201, 0x13121110, 0x17161514]


class _WideTop(wiring.Component):
    def __init__(self):
        super().__init__({"port": In(StoragePortSignature(4)),
                          "narrow": Out(StoragePortSignature())})

    def elaborate(self, platform):
        m = Module()
        m.submodules.w = w = StorageWidener()
        wiring.connect(m, wiring.flipped(self.port), w.wide)
        wiring.connect(m, w.narrow, wiring.flipped(self.narrow))
        return m


async def wide_transfer(ctx, port, op, lba, count, words=None, *, rng, idle=0.0, stall=0.0):
    """One transfer on a wide initiator port: returns (status error, the words read or the
    number written). Keeps ``status.ready`` high through the data phase and stops at an
    error status, as the storage port's protocol asks of an initiator."""
    ctx.set(port.cmd.valid, 1)
    ctx.set(port.cmd.payload, {"op": op, "lba": lba, "count": count})
    await ctx.tick().until(port.cmd.ready)
    ctx.set(port.cmd.valid, 0)
    ctx.set(port.status.ready, 1)
    got, n, total = [], 0, count * 128
    while True:
        if ctx.get(port.status.valid):
            error = ctx.get(port.status.payload.error)
            await ctx.tick()
            ctx.set(port.status.ready, 0)
            ctx.set(port.wdata.valid, 0)
            ctx.set(port.rdata.ready, 0)
            return error, (got if op == StorageOp.READ else n)
        if op == StorageOp.READ:
            take = not (stall and rng.random() < stall)
            ctx.set(port.rdata.ready, take)
            if take and ctx.get(port.rdata.valid):
                got.append(ctx.get(port.rdata.payload))
        else:
            offer = n < total and not (idle and rng.random() < idle)
            ctx.set(port.wdata.valid, offer)
            if offer:
                ctx.set(port.wdata.payload, words[n])
                if ctx.get(port.wdata.ready):
                    n += 1
        await ctx.tick()


def _words(data):
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]


def test_widener_on_a_byte_target(tmp_path):
    """Writes and reads of 1 to 3 sectors as words on the sector model (random idle and
    stalls on both sides): the image holds the words' bytes in order, reads give them back;
    a command out of range gets RANGE without data; reads and writes ended early by the
    target at bytes that leave partial words (1, 2, 3, 513 bytes in) give CARD, and the next
    transfer is exact."""
    image = SectorImage(tmp_path / "card.img", sectors=16)
    dut = _WideTop()
    rng = random.Random(6)
    fails = {}

    def fail(op, lba, count):
        return fails.pop((op, lba), None)

    results, written = [], {}

    async def target(ctx):
        await serve_storage(ctx, dut.narrow, image, rng=random.Random(7), idle=0.3,
                            stall=0.3, fail=fail)

    async def bench(ctx):
        for lba, count in ((0, 1), (3, 2), (9, 3), (15, 1)):
            data = bytes(rng.randrange(256) for _ in range(512 * count))
            err, n = await wide_transfer(ctx, dut.port, StorageOp.WRITE, lba, count,
                                         _words(data), rng=rng, idle=0.3)
            results.append(("write", lba, err, n))
            written[lba] = data
        for lba, data in written.items():
            err, got = await wide_transfer(ctx, dut.port, StorageOp.READ, lba,
                                           len(data) // 512, rng=rng, stall=0.3)
            results.append(("read", lba, err, got == _words(data)))
        err, got = await wide_transfer(ctx, dut.port, StorageOp.READ, 15, 2, rng=rng)
        results.append(("range", err, got))
        for at in (1, 2, 3, 513):
            fails[(StorageOp.READ, 3)] = at
            err, got = await wide_transfer(ctx, dut.port, StorageOp.READ, 3, 2, rng=rng)
            results.append(("early read", at, err, len(got)))
            err, got = await wide_transfer(ctx, dut.port, StorageOp.READ, 9, 1, rng=rng)
            results.append(("after", at, err, got == _words(written[9][:512])))
            fails[(StorageOp.WRITE, 12)] = at
            err, n = await wide_transfer(ctx, dut.port, StorageOp.WRITE, 12, 2,
                                         _words(bytes(1024)), rng=rng)
            results.append(("early write", at, err))
            err, got = await wide_transfer(ctx, dut.port, StorageOp.READ, 0, 1, rng=rng)
            results.append(("after write", at, err, got == _words(written[0])))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(target, background=True)
    sim.add_testbench(bench)
    sim.run()
    OK, RANGE, CARD = StorageError.OK, StorageError.RANGE, StorageError.CARD
    assert results[:4] == [("write", lba, OK, 128 * c) for lba, c in ((0, 1), (3, 2), (9, 3),
                                                                     (15, 1))]
    assert results[4:8] == [("read", lba, OK, True) for lba in (0, 3, 9, 15)]
    assert results[8] == ("range", RANGE, [])
    for k, at in enumerate((1, 2, 3, 513)):
        early_read, after, early_write, after_write = results[9 + 4 * k:13 + 4 * k]
        assert early_read == ("early read", at, CARD, at // 4)
        assert after == ("after", at, OK, True)
        assert early_write == ("early write", at, CARD)
        assert after_write == ("after write", at, OK, True)
    assert image.read(3, 2) == written[3] and image.read(9, 3) == written[9]


def test_widener_holds_a_status_that_comes_with_the_last_byte():
    """A byte target that raises its status in the clock of its last byte (the protocol's
    "after the last byte" at its tightest): the wide side gets the word first, then the
    status; with the status an unfinished word (an early error after 6 bytes) is dropped,
    so the next transfer starts clean."""
    dut = StorageWidener()
    got = []

    async def bench(ctx):
        w, n = dut.wide, dut.narrow
        ctx.set(w.rdata.ready, 1)
        ctx.set(w.status.ready, 1)
        for data, error in ((b"\x01\x02\x03\x04", StorageError.OK),
                            (b"\x11\x12\x13\x14\x15\x16", StorageError.CARD),
                            (b"\x21\x22\x23\x24", StorageError.OK)):
            ctx.set(n.cmd.ready, 1)
            ctx.set(w.cmd.valid, 1)
            await ctx.tick()
            ctx.set(w.cmd.valid, 0)
            ctx.set(n.cmd.ready, 0)
            for k, byte in enumerate(data):
                ctx.set(n.rdata.valid, 1)
                ctx.set(n.rdata.payload, byte)
                if k == len(data) - 1:              # the status with the last byte
                    ctx.set(n.status.valid, 1)
                    ctx.set(n.status.payload, {"error": error})
                if ctx.get(w.rdata.valid):
                    got.append(("word", ctx.get(w.rdata.payload)))
                await ctx.tick()
            ctx.set(n.rdata.valid, 0)
            for _ in range(4):
                if ctx.get(w.rdata.valid):
                    got.append(("word", ctx.get(w.rdata.payload)))
                if ctx.get(w.status.valid):
                    got.append(("status", StorageError(ctx.get(w.status.payload.error))))
                    await ctx.tick()
                    ctx.set(n.status.valid, 0)
                    break
                await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == [("word", 0x04030201), ("status", StorageError.OK),
                   ("word", 0x14131211), ("status", StorageError.CARD),
                   ("word", 0x24232221), ("status", StorageError.OK)]
