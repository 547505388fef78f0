"""cocotb test of the generated attention core Verilog against the bit-exact golden model.

Random operation scripts (decode steps through many wrap-arounds, chunked prefill below, at and
above W, GQA groups, clears, rejected commands, ring and meta port traffic) with random idle
cycles on ``cmd``/``i`` and random backpressure on ``o``/``status``.
"""

import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge, Timer

from ringkv.defs.numerics import numerics_of
from ringkv.host.golden.fixed import FixedRingCore, run_ops
from ringkv.sim.attention_sim import accepted_attends, random_ops, token_beats
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import StreamSink, StreamSource, pack_fields, unpack_fields

CMD = [("op", 2), ("layer", 8), ("kv_head", 8), ("count", 16)]
STATUS = [("op", 2), ("err", 2), ("count", 32)]


async def run(dut, p, ops, rng, idle, stall):
    M, G, d = p["macs"], p["group"], p["head_dim"]
    ew = numerics_of(p.get("numerics")).elem_bits
    checker = FixedRingCore(**p["model"])
    accepted = accepted_attends(checker, ops)
    beats, n_out = [], 0
    for op, ok in zip(ops, accepted):
        if ok:
            for t in range(len(op[6])):
                beats += token_beats(op[5][t], op[6][t], op[7][t], M)
            n_out += len(op[6]) * G * d // M
    n_cmds = sum(op[0] == "cmd" for op in ops)
    cmd_src = StreamSource(dut, "cmd", dut.clk, idle=idle, rng=random.Random(rng.random()))
    in_src = StreamSource(dut, "i", dut.clk, idle=idle, rng=random.Random(rng.random()))
    out_sink = StreamSink(dut, "o", dut.clk, stall=stall, rng=random.Random(rng.random()))
    st_sink = StreamSink(dut, "status", dut.clk, stall=stall, rng=random.Random(rng.random()))
    res = {"outputs": [], "status": [], "reads": []}
    words = []

    async def feed_inputs():
        for beat in beats:
            await in_src.send(sum((x & ((1 << ew) - 1)) << (ew * j) for j, x in enumerate(beat)))

    async def drain_outputs():
        for _ in range(n_out):
            w = await out_sink.recv()
            words.append([((w >> (16 * j)) & 0xFFFF) for j in range(M)])

    async def drain_status():
        for _ in range(n_cmds):
            s = unpack_fields(STATUS, await st_sink.recv())
            res["status"].append((s["op"], s["err"], s["count"]))

    tasks = [cocotb.start_soon(feed_inputs()), cocotb.start_soon(drain_outputs()),
             cocotb.start_soon(drain_status())]
    for op in ops:
        if op[0] == "cmd":
            await cmd_src.send(pack_fields(CMD, dict(zip(("op", "layer", "kv_head", "count"),
                                                         op[1:5]))))
            continue
        while True:
            await RisingEdge(dut.clk)
            await ReadOnly()
            if not int(dut.busy.value):
                break
        await RisingEdge(dut.clk)
        if op[0] in ("ring_write", "ring_read"):
            dut.ring__ring_addr.value = op[1]
            if op[0] == "ring_write":
                dut.ring__ring_wdata.value = op[2]
                dut.ring__ring_we.value = 1
            else:
                dut.ring__ring_re.value = 1
            await RisingEdge(dut.clk)
            dut.ring__ring_we.value = 0
            dut.ring__ring_re.value = 0
            if op[0] == "ring_read":
                await RisingEdge(dut.clk)       # ring data: two clocks after ring_re
                await ReadOnly()
                res["reads"].append(int(dut.ring__ring_rdata.value))
                await RisingEdge(dut.clk)
        elif op[0] == "meta_write":
            dut.ring__meta_ring.value = op[1]
            dut.ring__meta_wcount.value = op[2]
            dut.ring__meta_whead.value = op[3]
            dut.ring__meta_we.value = 1
            await RisingEdge(dut.clk)
            dut.ring__meta_we.value = 0
        else:
            dut.ring__meta_ring.value = op[1]
            await Timer(1, unit="ns")
            res["reads"].append((int(dut.ring__meta_count.value), int(dut.ring__meta_head.value)))
    for task in tasks:
        await task
    flat = np.array(words, dtype=np.int64).reshape(-1)
    flat = np.where(flat >= 32768, flat - 65536, flat)
    pos = 0
    for op, ok in zip(ops, accepted):
        if ok:
            size = len(op[6]) * G * d
            res["outputs"].append(flat[pos:pos + size].reshape(len(op[6]), G, d))
            pos += size
    return res


@cocotb.test(timeout_time=3000, timeout_unit="sec")
async def random_scripts(dut):
    p = cocotb_params()
    rng = random.Random(p.get("seed", 1))
    Clock(dut.clk, 10, unit="ns").start()
    for name in ("ring_we", "ring_re", "meta_we", "ring_addr", "ring_wdata", "meta_ring",
                 "meta_wcount", "meta_whead"):
        getattr(dut, f"ring__{name}").value = 0
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    model = FixedRingCore(**p["model"])
    for rnd, (idle, stall) in enumerate(p["pressure"]):
        ops = random_ops(rng, p, p["steps"])
        got = await run(dut, p, ops, rng, idle, stall)
        want = run_ops(model, ops)
        assert got["status"] == want["status"], f"round {rnd}: status"
        assert got["reads"] == want["reads"], f"round {rnd}: port reads"
        assert len(got["outputs"]) == len(want["outputs"])
        for j, (a, b) in enumerate(zip(got["outputs"], want["outputs"])):
            assert np.array_equal(a, b), f"round {rnd}, attend {j}: output differs\n{a}\n{b}"
        dut._log.info("round %d: %d ops, %d attends OK", rnd, len(ops), len(want["outputs"]))
