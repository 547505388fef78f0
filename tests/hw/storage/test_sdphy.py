"""The SD PHY pieces (``hw/storage/sdphy.py``) on their own, each against a Python model of what is
on the wire: the frame and CRCs from the card models' own CRC code (``ringkv.sim.sd4_model``),
SD CLK phase lengths, and a mode-0 SPI target. Random gaps between SD clock edges and random
backpressure throughout; boundaries at every timeout."""

import random

import pytest
from amaranth.sim import Simulator

from ringkv.hw.storage.port import StorageError
from ringkv.hw.storage.sdphy import (
    SDClocker,
    SDCmdReader,
    SDCmdWriter,
    SDDataPHY,
    SPIByteEngine,
    command_frame,
)
from ringkv.sim.sd4_model import crc7, crc16_lines


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    out = {}

    async def tb(ctx):
        out["value"] = await bench(ctx)

    sim.add_testbench(tb)
    sim.run()
    return out["value"]


def _bits(value, n):
    return [(value >> (n - 1 - i)) & 1 for i in range(n)]


def frame_bits(head):
    """48 bits on CMD: ``head`` (40 bits), its CRC7, the end bit."""
    return _bits(head, 40) + _bits(crc7(head, 40), 7) + [1]


def command_bits(index, arg):
    """A command from the host: start bit 0, transmission bit 1."""
    return frame_bits((0b01 << 38) | (index << 32) | arg)


def response_bits(index, arg):
    """An R1/R6/R7 response from the card: start bit 0, transmission bit 0."""
    return frame_bits((index << 32) | arg)


# ---- clocker ------------------------------------------------------------------------------------

@pytest.mark.parametrize("hs", [None, 1])
def test_clocker_phases(hs):
    """With ``run`` held, SD CLK is high for ``half`` and low for ``half`` system clocks
    (init, normal and high-speed ``half``); with ``run`` random, the high phase is still
    ``half`` and the low phase ends in the first clock ``run`` is 1 once it has lasted
    ``half``. ``rise``/``fall`` mark exactly the clocks in which the level changes."""
    init, half = 5, 3
    dut = SDClocker(init_half_period=init, half_period=half, hs_half_period=hs)
    rng = random.Random(4)

    async def bench(ctx):
        prev, length, phases = 0, 0, []
        fast = hs_on = 0
        for cycle in range(4000):
            if cycle % 500 == 0:
                fast, hs_on = cycle // 500 % 3 != 0, cycle // 1000 % 2
            run_ = int(cycle < 2000 or rng.random() < 0.4)
            ctx.set(dut.fast, fast)
            ctx.set(dut.hs, hs_on)
            ctx.set(dut.run, run_)
            clk, rise, fall = ctx.get(dut.clk), ctx.get(dut.rise), ctx.get(dut.fall)
            assert clk == prev
            assert not (rise and fall)
            assert not rise or run_
            want = init if not fast else (hs if hs and hs_on else half)
            length += 1
            if rise or fall:
                phases.append((clk, length, want, cycle >= 2000))
                length = 0
            await ctx.tick()
            assert ctx.get(dut.clk) == (prev ^ (rise | fall))
            prev = ctx.get(dut.clk)
        return phases

    phases = run(dut, bench)
    assert len(phases) > 300
    # skip the first phase after a change of `half` (it was loaded with the old one)
    steady = [p for a, b in zip(phases, phases[1:]) for p in [b] if a[2] == b[2]]
    for level, length, want, random_run in steady:
        if level == 1 or not random_run:
            assert length == want, (level, length, want)
        else:
            assert length >= want
    assert any(level == 0 and length > want for level, length, want, _ in steady)


# ---- command writer -----------------------------------------------------------------------------

def test_command_frame_layout():
    from amaranth import Const
    value = Const.cast(command_frame(Const(17, 6), Const(0x1234_5678, 32))).value
    assert _bits(value, 40) == _bits((0b01 << 38) | (17 << 32) | 0x1234_5678, 40)


@pytest.mark.parametrize("p", [1.0, 0.3])
def test_cmd_writer_frames(p):
    """Commands back to back (boundary indices and arguments, then random ones) with random
    gaps between falling edges: 48 bits per command on ``cmd_o`` with ``cmd_oe``, the frame
    and CRC7 the card model computes, then CMD released and ``busy`` low."""
    dut = SDCmdWriter()
    rng = random.Random(int(p * 10))
    cmds = [(0, 0), (63, 0xFFFF_FFFF), (8, 0x1AA), (41, 0x40FF_8000)]
    cmds += [(rng.randrange(64), rng.getrandbits(32)) for _ in range(6)]

    async def bench(ctx):
        got = []
        for index, arg in cmds:
            assert ctx.get(dut.busy) == 0
            ctx.set(dut.index, index)
            ctx.set(dut.arg, arg)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            ctx.set(dut.index, rng.randrange(64))          # taken at start: may change
            bits = []
            while ctx.get(dut.busy):
                fall = rng.random() < p
                ctx.set(dut.fall, fall)
                await ctx.tick()
                ctx.set(dut.fall, 0)
                if fall and ctx.get(dut.cmd_oe):
                    bits.append(ctx.get(dut.cmd_o))
            assert (ctx.get(dut.cmd_oe), ctx.get(dut.cmd_o)) == (0, 1)
            got.append(bits)
        return got

    assert run(dut, bench) == [command_bits(i, a) for i, a in cmds]


# ---- command reader -----------------------------------------------------------------------------

T_RESP = 10


def r2_bits(register_top120):
    body = register_top120 & ((1 << 120) - 1)
    reg = (body << 8) | (crc7(body, 120) << 1) | 1
    return [0, 0] + [1] * 6 + _bits(reg, 128)


async def receive(ctx, dut, rng, bits, *, r2=0, latency=2, tx_clocks=3, p=0.5):
    """Arm the reader, keep ``tx_busy`` for ``tx_clocks`` clocks (CMD noise meanwhile), then
    send ``latency`` idle bits and ``bits`` at random rising edges; wait for ``done``."""
    ctx.set(dut.r2, r2)
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    ctx.set(dut.tx_busy, 1)
    for _ in range(tx_clocks):
        ctx.set(dut.rise, rng.random() < p)
        ctx.set(dut.cmd_i, rng.getrandbits(1))
        await ctx.tick()
    ctx.set(dut.tx_busy, 0)
    stream = [1] * latency + list(bits)
    cycles = 0
    while not ctx.get(dut.done):
        rise = rng.random() < p
        ctx.set(dut.rise, rise)
        ctx.set(dut.cmd_i, stream.pop(0) if rise and stream else 1)
        await ctx.tick()
        cycles += 1
        assert cycles < 10_000
    ctx.set(dut.rise, 0)
    return {name: ctx.get(getattr(dut, name)) for name in
            ("timeout", "arg", "index", "transmission", "end_bit", "crc_error", "csd_v2",
             "c_size")}


def test_cmd_reader_responses():
    """R1 frames (random, with a bad CRC bit, a bad end bit), R2 carrying a CSD 2.0 and 1.0,
    and the timeout at its boundary: a start bit in the ``resp_timeout``-th SD clock after
    the command is taken, one clock later is a timeout."""
    dut = SDCmdReader(resp_timeout=T_RESP)
    rng = random.Random(7)

    async def bench(ctx):
        out = []
        for _ in range(5):
            index, arg = rng.randrange(64), rng.getrandbits(32)
            bits = response_bits(index, arg)
            r = await receive(ctx, dut, rng, bits, latency=rng.randrange(T_RESP))
            out.append(r == {**r, "timeout": 0, "arg": arg, "index": index, "transmission": 0,
                             "end_bit": 1, "crc_error": 0})
        bits = response_bits(3, 0xABCD_0500)
        bits[41] ^= 1                                       # a CRC bit
        r = await receive(ctx, dut, rng, bits)
        out.append((r["crc_error"], r["end_bit"]) == (1, 1))
        bits = response_bits(3, 0xABCD_0500)
        bits[47] = 0
        r = await receive(ctx, dut, rng, bits)
        out.append((r["crc_error"], r["end_bit"]) == (0, 0))
        for c_size in (0, 0x3F_FFFF, rng.getrandbits(22)):
            csd_top = (1 << 118) | (c_size << 40) | rng.getrandbits(40)   # CSD bits 127..8
            r = await receive(ctx, dut, rng, r2_bits(csd_top), r2=1)
            out.append((r["csd_v2"], r["c_size"], r["crc_error"], r["timeout"]) ==
                       (1, c_size, 0, 0))
        r = await receive(ctx, dut, rng, r2_bits(rng.getrandbits(118)), r2=1)  # CSD 1.0
        out.append((r["csd_v2"], r["crc_error"]) == (0, 0))
        frame = response_bits(9, 1)
        r = await receive(ctx, dut, rng, frame, latency=T_RESP - 1)
        out.append((r["timeout"], r["index"], r["crc_error"]) == (0, 9, 0))
        r = await receive(ctx, dut, rng, frame, latency=T_RESP)
        out.append(r["timeout"] == 1)
        return out

    assert run(dut, bench) == [True] * 13


# ---- data reader --------------------------------------------------------------------------------

def block_nibbles(data, *, start=0x0, end=0xF):
    """A data block on a 4-bit bus: start nibble, data (high nibble first), the 16 CRC
    nibbles of the four lines (each line's CRC16, MSB first), end nibble."""
    crcs = crc16_lines(data, 4)
    nibbles = [start]
    for byte in data:
        nibbles += [byte >> 4, byte & 0xF]
    for j in range(16):
        nibbles.append(sum(((crcs[k] >> (15 - j)) & 1) << k for k in range(4)))
    return nibbles + [end]


DATA_T = 40


def data_phy():
    return SDDataPHY(resp_timeout=T_RESP, data_timeout=DATA_T, busy_timeout=30)


async def read_block(ctx, dut, rng, nibbles, *, latency=3, p=0.5, stall=0.3, to_port=True,
                     short=False):
    """Arm the reader, send ``nibbles`` after ``latency`` idle clocks at random rising edges
    (never while ``rd_stall``), take ``rdata`` with random stalls; return (ok, timeout, bytes)
    at ``rd_done``."""
    ctx.set(dut.to_port, to_port)
    ctx.set(dut.short, short)
    ctx.set(dut.rd_start, 1)
    await ctx.tick()
    ctx.set(dut.rd_start, 0)
    stream = [0xF] * latency + list(nibbles)
    got = bytearray()
    cycles = 0
    while not ctx.get(dut.rd_done) or ctx.get(dut.rdata.valid):
        ready = rng.random() >= stall
        ctx.set(dut.rdata.ready, ready)
        rise = rng.random() < p and not ctx.get(dut.rd_stall) and not ctx.get(dut.rd_done)
        ctx.set(dut.rise, rise)
        ctx.set(dut.dat_i, stream.pop(0) if rise and stream else 0xF)
        if ready and ctx.get(dut.rdata.valid):
            got.append(ctx.get(dut.rdata.payload))
        await ctx.tick()
        cycles += 1
        assert cycles < 20_000
    ctx.set(dut.rise, 0)
    ctx.set(dut.rdata.ready, 0)
    return ctx.get(dut.rd_ok), ctx.get(dut.rd_timeout), bytes(got)


def test_data_reader_blocks():
    """Blocks with random data and random rdata backpressure (no byte lost: the reader stalls
    SD CLK), a wrong CRC bit, a bad end nibble, a start bit missing on one line, the data
    timeout at its boundary, and the ``CMD6`` status block (64 bytes, not on ``rdata``)."""
    dut = data_phy()
    rng = random.Random(11)

    async def bench(ctx):
        out = []
        for stall in (0.0, 0.5, 0.9):
            data = rng.randbytes(512)
            out.append(await read_block(ctx, dut, rng, block_nibbles(data), stall=stall)
                       == (1, 0, data))
        data = rng.randbytes(512)
        bad = block_nibbles(data)
        bad[1 + rng.randrange(1024)] ^= 1 << rng.randrange(4)
        out.append((await read_block(ctx, dut, rng, bad))[:2] == (0, 0))
        out.append((await read_block(ctx, dut, rng, block_nibbles(data, end=0x7)))[:2]
                   == (0, 0))
        out.append((await read_block(ctx, dut, rng, block_nibbles(data, start=0x2)))[:2]
                   == (0, 0))
        ok = await read_block(ctx, dut, rng, block_nibbles(data), latency=DATA_T - 1)
        out.append(ok == (1, 0, data))
        out.append((await read_block(ctx, dut, rng, block_nibbles(data), latency=DATA_T))[:2]
                   == (0, 1))
        for support, result in ((1, 1), (0, 0xF)):
            status = bytearray(rng.randbytes(64))
            status[13] = (status[13] & ~2) | (support << 1)
            status[16] = (status[16] & 0xF0) | result
            r = await read_block(ctx, dut, rng, block_nibbles(bytes(status)), to_port=False,
                                 short=True)
            out.append(r == (1, 0, b"") and (ctx.get(dut.sw_hs_support),
                                             ctx.get(dut.sw_result)) == (support, result))
        return out

    assert run(dut, bench) == [True] * 10


def test_data_reader_stop():
    """``rd_stop`` in the middle of a block returns the reader to idle (no ``rd_done``); it
    reads the next block normally."""
    dut = data_phy()
    rng = random.Random(2)

    async def bench(ctx):
        ctx.set(dut.to_port, 1)
        ctx.set(dut.rd_start, 1)
        await ctx.tick()
        ctx.set(dut.rd_start, 0)
        ctx.set(dut.rdata.ready, 1)
        for nibble in [0xF, 0x0] + [0x5] * 100:
            ctx.set(dut.rise, 1)
            ctx.set(dut.dat_i, nibble)
            await ctx.tick()
        ctx.set(dut.rise, 0)
        ctx.set(dut.rd_stop, 1)
        await ctx.tick()
        ctx.set(dut.rd_stop, 0)
        for _ in range(5):
            ctx.set(dut.rise, 1)
            ctx.set(dut.dat_i, 0x0)
            await ctx.tick()
            assert not ctx.get(dut.rd_done)
        ctx.set(dut.rise, 0)
        await ctx.tick()
        data = rng.randbytes(512)
        return await read_block(ctx, dut, rng, block_nibbles(data)) == (1, 0, data)

    assert run(dut, bench)


# ---- data writer --------------------------------------------------------------------------------

async def write_block(ctx, dut, rng, data, card, *, p=0.5, idle=0.3):
    """Send ``data`` through ``wdata`` (random gaps) and one block on DAT at random SD clock
    edges (a rising edge never while ``wr_stall``); ``card`` is the list of DAT0 bits the card
    sends at the rising edges after the host releases DAT. Return (nibbles driven, result)."""
    sent, nibbles, clk, started, released = 0, [], 0, False, False
    cycles = 0
    card = list(card)
    while True:
        ctx.set(dut.wr_accept, sent < len(data))          # the controller counts the block
        valid = rng.random() >= idle
        ctx.set(dut.wdata.valid, valid)
        ctx.set(dut.wdata.payload, data[min(sent, len(data) - 1)] if valid else 0)
        take = valid and ctx.get(dut.wdata.ready)
        assert not take or sent < len(data)
        start = not started and ctx.get(dut.wr_byte_valid)
        ctx.set(dut.wr_start, start)
        started |= start
        edge = started and not start and rng.random() < p
        fall = edge and clk == 1
        rise = edge and clk == 0 and not ctx.get(dut.wr_stall)
        ctx.set(dut.fall, fall)
        ctx.set(dut.rise, rise)
        dat0 = card.pop(0) if rise and released and card else 1
        ctx.set(dut.dat_i, 0xE | dat0)
        done, result = ctx.get(dut.wr_done), ctx.get(dut.wr_result)
        await ctx.tick()
        cycles += 1
        assert cycles < 20_000
        sent += take
        clk ^= fall | rise
        if fall and ctx.get(dut.dat_oe):
            nibbles.append(ctx.get(dut.dat_o))
        released |= started and fall and not ctx.get(dut.dat_oe)
        if done:
            for s in (dut.wdata.valid, dut.wr_start, dut.fall, dut.rise, dut.wr_accept):
                ctx.set(s, 0)
            ctx.set(dut.dat_i, 0xF)
            await ctx.tick()
            return nibbles, result, sent


def token(bits3, *, gap=1, busy=3, end=1):
    return [1] * gap + [0] + list(bits3) + [end] + [0] * busy + [1]


def test_data_writer_blocks():
    """Blocks from random ``wdata`` with random gaps: the nibbles on DAT are the block the card
    model's CRC16 gives; the CRC status token decides the result (accepted then busy -> OK,
    ``101`` -> CRC, ``110`` -> CARD, no end bit -> CRC), no token within ``resp_timeout`` and
    busy for ``busy_timeout`` SD clocks -> TIMEOUT, each at its boundary; no byte is taken
    while ``wr_accept`` is 0."""
    dut = data_phy()
    rng = random.Random(5)
    cases = [(token((0, 1, 0)), StorageError.OK),
             (token((0, 1, 0), gap=T_RESP - 1, busy=29), StorageError.OK),
             (token((1, 0, 1)), StorageError.CRC),
             (token((1, 1, 0)), StorageError.CARD),
             (token((0, 1, 0), end=0), StorageError.CRC),
             (token((0, 1, 0), gap=T_RESP), StorageError.TIMEOUT),
             (token((0, 1, 0), busy=30), StorageError.TIMEOUT)]

    async def bench(ctx):
        out = []
        for card, _ in cases:
            data = rng.randbytes(512)
            nibbles, result, sent = await write_block(ctx, dut, rng, data, card,
                                                      idle=rng.choice([0.0, 0.5, 0.95]))
            out.append((nibbles == block_nibbles(data), StorageError(result), sent))
        return out

    assert run(dut, bench) == [(True, want, 512) for _, want in cases]


# ---- SPI byte engine ----------------------------------------------------------------------------

@pytest.mark.parametrize("gap", [0.0, 0.6])
def test_spi_engine_against_target(gap):
    """Bytes exchanged with a mode-0 SPI target model (samples MOSI at rising SCLK, shifts MISO
    after falling SCLK): the target receives ``tx``, ``rx`` holds the target's byte after
    ``done``; back to back, each byte takes 16 * half clocks (init, then fast)."""
    dut = SPIByteEngine(init_half_period=3, half_period=1)
    rng = random.Random(int(gap * 10) + 1)
    tx = [0x00, 0xFF, 0x80, 0x01] + [rng.getrandbits(8) for _ in range(24)]
    reply = [rng.getrandbits(8) for _ in tx]

    async def bench(ctx):
        got_rx, target_in, done_at = [], [], []
        shift_in, nbits, out_i = 0, 0, 0
        prev_sclk, cycle, i = 0, 0, 0
        while len(got_rx) < len(tx):
            ctx.set(dut.fast, i >= 8)
            want = i < len(tx) and rng.random() >= gap
            ctx.set(dut.start, want)
            ctx.set(dut.tx, tx[i] if want else 0)
            busy, done = ctx.get(dut.busy), ctx.get(dut.done)
            if not busy:
                assert ctx.get(dut.mosi) == 1
            sclk, mosi = ctx.get(dut.sclk), ctx.get(dut.mosi)
            if sclk and not prev_sclk:                      # target: sample at the rise
                shift_in, nbits = (shift_in << 1) | mosi, nbits + 1
                if nbits == 8:
                    target_in.append(shift_in)
                    shift_in, nbits = 0, 0
            if not sclk and prev_sclk and nbits == 0:       # target: next byte after 8 bits
                out_i += 1
            bit = 7 - nbits if not sclk else 8 - nbits
            miso = (reply[out_i] >> bit) & 1 if out_i < len(reply) and bit < 8 else 1
            ctx.set(dut.miso, miso)
            prev_sclk = sclk
            if done:
                done_at.append(cycle)
            took = want and (not busy or done)
            await ctx.tick()
            if done:
                got_rx.append(ctx.get(dut.rx))
            i += took
            cycle += 1
            assert cycle < 10_000
        return got_rx, target_in, done_at

    got_rx, target_in, done_at = run(dut, bench)
    assert got_rx == reply
    assert target_in == tx
    if gap == 0.0:
        spacing = [b - a for a, b in zip(done_at, done_at[1:])]
        assert spacing[:6] == [16 * 3] * 6
        # `fast` rises as byte 7 starts: each SCLK half period takes the `half` current when
        # it begins, so only that byte's first one is slow
        assert spacing[6] == 3 + 15 * 1
        assert set(spacing[7:]) == {16}


def test_sdphy_parameter_errors():
    with pytest.raises(ValueError, match=r"^resp_timeout must be at least 2, not 1$"):
        SDCmdReader(resp_timeout=1)
    with pytest.raises(ValueError, match=r"^half_period must be a positive integer, not 0$"):
        SDClocker(init_half_period=2, half_period=0)
    with pytest.raises(TypeError):
        SPIByteEngine(init_half_period=2.5, half_period=1)
