"""cocotb on Verilator: the UART against the golden line model, ±2 % baud, stalls and idle.

Run by ``tests/hw/link/test_uart.py`` through :func:`ringkv.sim.cocotb_run.run_cocotb`.
"""

import random
from fractions import Fraction

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge

from ringkv.host.golden.uart import decode_line, line_levels
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import StreamSink, StreamSource


async def _reset(dut):
    Clock(dut.clk, 40, unit="ns").start()
    dut.rx.value = 1
    dut.rst.value = 1
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0


@cocotb.test(timeout_time=200, timeout_unit="ms")
async def receive_skewed(dut):
    p = cocotb_params()
    divisor = Fraction(p["num"], p["den"])
    rng = random.Random(p["seed"])
    await _reset(dut)
    for skew in (-0.02, -0.01, 0.0, 0.01, 0.02):
        data = bytes([0x00, 0xFF] + [rng.randrange(256) for _ in range(p["bytes"])])
        levels = line_levels(data, float(divisor) * (1 + skew), gap_bits=2.0, rng=rng)
        sink = StreamSink(dut, "o", dut.clk, stall=0.6, rng=rng)
        got = []

        async def collect(sink=sink, got=got, n=len(data)):  # noqa: B008
            for _ in range(n):
                got.append(await sink.recv())

        task = cocotb.start_soon(collect())
        for level in levels:
            dut.rx.value = level
            await RisingEdge(dut.clk)
        await ClockCycles(dut.clk, 50)
        assert bytes(got) == data, f"skew {skew}"
        task.cancel()
        dut.o__ready.value = 0
    assert int(dut.framing_errors.value) == 0 and int(dut.overruns.value) == 0


@cocotb.test(timeout_time=200, timeout_unit="ms")
async def transmit_with_idle(dut):
    p = cocotb_params()
    divisor = Fraction(p["num"], p["den"])
    rng = random.Random(p["seed"] + 1)
    await _reset(dut)
    data = bytes([0x00, 0xFF, 0xA5] + [rng.randrange(256) for _ in range(p["bytes"])])
    source = StreamSource(dut, "i", dut.clk, idle=0.3, rng=rng)
    levels = []
    done = False

    async def probe():
        while not done:
            await ReadOnly()
            levels.append(int(dut.tx.value))
            await RisingEdge(dut.clk)

    task = cocotb.start_soon(probe())
    await source.send_all(data)
    await ClockCycles(dut.clk, int(12 * divisor))
    done = True
    await task
    assert decode_line(levels, float(divisor)) == data
