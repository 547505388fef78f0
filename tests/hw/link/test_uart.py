"""UART: bit-exact transmitter waveform, loopback, baud tolerance, framing errors, overrun."""

import random
from fractions import Fraction

import pytest
from amaranth import Elaboratable, Module
from amaranth.sim import Simulator
from conftest import requires_verilator

from ringkv.host.golden.uart import decode_line, line_levels, tx_levels
from ringkv.hw.link.uart import UART, UARTReceiver, UARTTransmitter, baud_error, divisor_for
from ringkv.sim.streams import stream_get, stream_put

ULX3S = Fraction(25, 3)        # 25 MHz / 3 Mbaud


def test_parameter_errors():
    with pytest.raises(TypeError, match=r"^Divisor must be an int or a Fraction, not 8\.5$"):
        UARTTransmitter(8.5)
    with pytest.raises(TypeError, match=r"^Divisor must be an int or a Fraction, not True$"):
        UARTReceiver(True)
    with pytest.raises(ValueError,
                       match=r"^Divisor must be at least 4 clock cycles per bit, not 3$"):
        UART(3)
    with pytest.raises(ValueError, match=r"^Divisor must be at least 4 clock cycles per bit, "
                                         r"not Fraction\(7, 2\)$"):
        UARTTransmitter(Fraction(7, 2))
    with pytest.raises(ValueError, match=r"^Divisor denominator must be at most 65536"):
        UARTReceiver(Fraction(10**9 + 7, 10**6 + 3))
    with pytest.raises(ValueError, match=r"^FIFO depth must be a positive integer, not 0$"):
        UARTReceiver(8, fifo_depth=0)
    assert UART(ULX3S).divisor == ULX3S
    assert UARTReceiver(5, fifo_depth=3).fifo_depth == 3


def test_divisor_helpers():
    assert divisor_for(25_000_000, 3_000_000) == ULX3S
    assert divisor_for(48_000_000, 3_000_000) == 16
    assert baud_error(25_000_000, 3_000_000, ULX3S) == 0.0
    assert baud_error(25_000_000, 3_000_000, 8) == pytest.approx(0.041666, abs=1e-5)
    assert baud_error(25_000_000, 3_000_000, 9) == pytest.approx(-0.074074, abs=1e-5)


@pytest.mark.parametrize("divisor", [5, ULX3S, Fraction(33, 5)])
def test_tx_waveform_bit_exact(divisor):
    rng = random.Random(str(divisor))
    data = bytes([0x00, 0xFF, 0x55, 0xAA] + [rng.randrange(256) for _ in range(12)])
    dut = UARTTransmitter(divisor)
    expected = tx_levels(data, divisor)
    levels = []

    async def source(ctx):
        for byte in data:      # always valid: back-to-back characters
            await stream_put(ctx, dut.i, byte)

    async def probe(ctx):
        while ctx.get(dut.tx):
            await ctx.tick()
        for _ in range(len(expected) + 20):
            levels.append(ctx.get(dut.tx))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(source, background=True)
    sim.add_testbench(probe)
    sim.run()
    assert levels[:len(expected)] == expected
    assert levels[len(expected):] == [1] * 20       # line idle afterwards


class _Loopback(Elaboratable):
    def __init__(self, uart):
        self.uart = uart

    def elaborate(self, platform):
        m = Module()
        m.submodules.uart = self.uart
        m.d.comb += self.uart.rx.eq(self.uart.tx)
        return m


@pytest.mark.parametrize("divisor", [ULX3S, 4])
def test_loopback_random_backpressure(divisor):
    rng = random.Random(1)
    data = bytes([0, 255] + [rng.randrange(256) for _ in range(60)])
    uart = UART(divisor, fifo_depth=4)
    got = []

    async def source(ctx):
        for byte in data:
            await stream_put(ctx, uart.i, byte, rng=rng, idle=0.5)

    async def sink(ctx):
        for _ in data:
            got.append(await stream_get(ctx, uart.o, rng=rng, stall=0.7))
        assert ctx.get(uart.framing_errors) == 0
        assert ctx.get(uart.overruns) == 0

    sim = Simulator(_Loopback(uart))
    sim.add_clock(1e-6)
    sim.add_testbench(source, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert bytes(got) == data


async def _collect(ctx, stream, got, *, rng=None, stall=0.0):
    """Background sink: read ``stream`` forever into ``got`` with random stalls."""
    while True:
        ready = not (rng and rng.random() < stall)
        ctx.set(stream.ready, ready)
        _, _, valid, payload = await ctx.tick().sample(stream.valid, stream.payload)
        if ready and valid:
            got.append(payload)


def _drive_rx(dut, levels, *, stall=0.0, seed=0, counters=None):
    """Drive ``dut.rx`` with ``levels`` while a sink with random stalls reads ``o``; put the
    error counters at the end into ``counters`` if given."""
    got = []
    rng = random.Random(seed)

    async def line(ctx):
        for level in levels:
            ctx.set(dut.rx, level)
            await ctx.tick()
        await ctx.tick().repeat(40)
        if counters is not None:
            counters["framing"] = ctx.get(dut.framing_errors)
            counters["overruns"] = ctx.get(dut.overruns)

    async def sink(ctx):
        await _collect(ctx, dut.o, got, rng=rng, stall=stall)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(line)
    sim.add_testbench(sink, background=True)
    sim.run()
    return bytes(got)


@pytest.mark.parametrize("skew", [-0.02, 0.0, 0.02, -0.08, 0.08])
def test_rx_baud_tolerance(skew):
    """±2 % is received exactly; ±8 % (beyond any 8N1 receiver's margin) is not."""
    rng = random.Random(int(skew * 1000))
    data = bytes([0x00, 0xFF, 0x80, 0x01] + [rng.randrange(256) for _ in range(40)])
    period = float(ULX3S) * (1 + skew)
    levels = line_levels(data, period, gap_bits=1.5, rng=rng)
    dut = UARTReceiver(ULX3S)
    got = _drive_rx(dut, levels, stall=0.5, seed=3)
    if abs(skew) <= 0.02:
        assert got == data
    else:
        assert got != data


def test_rx_framing_errors_and_glitch():
    rng = random.Random(7)
    data = bytes(rng.randrange(256) for _ in range(24))
    stops = [rng.random() < 0.3 for _ in data]
    stops[0] = False
    stop_bits = [0 if bad else 1 for bad in stops]
    period = float(ULX3S)
    levels = line_levels(data, period, gap_bits=1.0, stop_bits=stop_bits)
    levels = [1] * 20 + [0] + [1] * 30 + levels          # a one-cycle glitch first
    expected = decode_line(levels, period)
    assert expected == bytes(b for b, bad in zip(data, stops) if not bad)
    counts = {}
    assert _drive_rx(UARTReceiver(ULX3S), levels, counters=counts) == expected
    assert counts == {"framing": sum(stops), "overruns": 0}


def test_rx_break_is_one_error():
    levels = [1] * 10 + [0] * 400 + [1] * 40 + line_levels(b"\x42", 5.0)
    counts = {}
    assert _drive_rx(UARTReceiver(5), levels, counters=counts) == b"\x42"
    assert counts == {"framing": 1, "overruns": 0}


def test_rx_overrun_drops_new_bytes():
    data = bytes(range(10, 17))
    levels = line_levels(data, 6.0)
    dut = UARTReceiver(6, fifo_depth=4)
    result = {}

    async def bench(ctx):
        for level in levels:
            ctx.set(dut.rx, level)
            await ctx.tick()
        result["overruns"] = ctx.get(dut.overruns)
        result["got"] = [await stream_get(ctx, dut.o) for _ in range(4)]
        await ctx.tick().repeat(3)
        result["left"] = ctx.get(dut.o.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert result == {"overruns": 3, "got": [10, 11, 12, 13], "left": 0}


@requires_verilator
def test_cocotb_uart():
    from ringkv.sim.cocotb_run import run_cocotb
    run_cocotb(UART(ULX3S), toplevel="uart", test_module="cocotb_uart",
               params={"num": 25, "den": 3, "seed": 1, "bytes": 60})
