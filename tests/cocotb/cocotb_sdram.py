"""cocotb on Verilator: the SDRAM controller on the pin-level model, random traffic on two ports
with idle and backpressure, every read against the golden model."""

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from ringkv.defs.sdram import CHIPS
from ringkv.host.golden.sdram import SdramGolden
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import StreamSink, StreamSource, pack_fields
from ringkv.sim.sdram_model import CocotbSdram, SdramModel

P = cocotb_params()
WDATA = [("data", 16), ("mask", 2)]


def command_fields(chip):
    return [("addr", (chip.words - 1).bit_length()), ("write", 1), ("count", 12)]


async def port_traffic(dut, p, rng, ops, golden, bl, failures, fields):
    cmd = StreamSource(dut, f"port__{p}__cmd", dut.clk, idle=0.3, rng=rng)
    w = StreamSource(dut, f"port__{p}__w", dut.clk, idle=0.3, rng=rng)
    r = StreamSink(dut, f"port__{p}__r", dut.clk, stall=0.3, rng=rng)
    writes = [op for op in ops if op[0] == "w"]

    async def wdata():
        for op in writes:
            for word, mask in zip(op[2], op[3]):
                await w.send(pack_fields(WDATA, {"data": word, "mask": mask}))

    async def rdata():
        for op in ops:
            if op[0] == "w":
                golden.write(op[1], op[2], op[3])
            else:
                got = await r.recv_n(op[2])
                if not golden.matches(op[1], got):
                    failures.append((p, op[1]))

    tasks = [cocotb.start_soon(wdata()), cocotb.start_soon(rdata())]
    for op in ops:
        n = len(op[2]) if op[0] == "w" else op[2]
        await cmd.send(pack_fields(fields, {"addr": op[1], "write": op[0] == "w",
                                         "count": n // bl}))
    for task in tasks:
        await task


@cocotb.test(timeout_time=2, timeout_unit="ms")
async def random_traffic(dut):
    chip = CHIPS[P["chip"]].scaled(power_up_ns=P["power_up_ns"])
    bl, tck = P["bl"], P["tck_ns"]
    Clock(dut.clk, tck, unit="ns").start()
    model = SdramModel(chip, tck, seed=P["seed"])
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    cocotb.start_soon(CocotbSdram(dut, "pins", model).run())
    rng = random.Random(P["seed"])
    failures = []
    tasks = []
    for p in range(P["ports"]):
        ops, base = [], p * (chip.words // P["ports"])
        for _ in range(P["ops"]):
            addr = (base + rng.randrange(16) * rng.choice((1, chip.cols, chip.cols * 4))
                    + rng.randrange(0, 64, bl)) & ~(bl - 1)
            n = bl * rng.randrange(1, 4)
            if rng.random() < 0.55:
                data = [rng.randrange(1 << 16) for _ in range(n)]
                ops.append(("w", addr, data, [rng.choice((0, 0, 1, 2)) for _ in data]))
            else:
                ops.append(("r", addr, n))
        tasks.append(cocotb.start_soon(port_traffic(dut, p, random.Random(rng.random()), ops,
                                                    SdramGolden(), bl, failures,
                                                    command_fields(chip))))
    for task in tasks:
        await task
    assert failures == [], failures
    assert model.violations == [] and model.ready
    dut._log.info("%d clocks, %d commands, %d data words", model.cycle,
                  len(model.commands), len(model.data_clocks))
