"""cocotb test of the generated hash engine Verilog against the golden chained hash."""

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from ringkv.host.golden.hash import prefix_hashes
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import StreamSink, StreamSource, pack_fields, unpack_fields


def _sequences(rng, count, token_width):
    """Random lengths with the boundaries: 1, 2, long runs, max-value and zero tokens."""
    top = (1 << token_width) - 1
    for index in range(count):
        if index % 97 == 0:
            length = rng.randint(100, 400)
        else:
            length = rng.choice([1, 1, 2, 3, rng.randint(1, 24)])
        kind = index % 7
        if kind == 0:
            yield [top] * length
        elif kind == 1:
            yield [0] * length
        else:
            yield [rng.randint(0, top) for _ in range(length)]


@cocotb.test(timeout_time=900, timeout_unit="sec")
async def random_sequences(dut):
    p = cocotb_params()
    tw, hw, cw = p["token_width"], p["hash_width"], p["count_width"]
    seed, rounds = p["seed"], p["rounds"]
    rng = random.Random(p.get("rng", 1))
    in_fields = [("token", tw), ("first", 1), ("last", 1)]
    out_fields = [("hash", hw), ("count", cw), ("last", 1)]

    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    source = StreamSource(dut, "i", dut.clk, idle=p["idle"], rng=random.Random(rng.random()))
    sink = StreamSink(dut, "o", dut.clk, stall=p["stall"], rng=random.Random(rng.random()))
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    sequences = list(_sequences(rng, p["sequences"], tw))
    expected = []
    for seq in sequences:
        hashes = prefix_hashes(seq, seed, width=hw, rounds=rounds)
        for k, h in enumerate(hashes):
            expected.append({"hash": h, "count": (k + 1) % (1 << cw),
                             "last": int(k == len(seq) - 1)})

    async def drive():
        for seq in sequences:
            for k, t in enumerate(seq):
                await source.send(pack_fields(in_fields, {
                    "token": t, "first": int(k == 0), "last": int(k == len(seq) - 1)}))

    driver = cocotb.start_soon(drive())
    for n, want in enumerate(expected):
        got = unpack_fields(out_fields, await sink.recv())
        assert got == want, f"output {n}: got {got}, want {want}"
    await driver
    dut._log.info("%d sequences, %d tokens equal to the golden hash", len(sequences),
                  len(expected))
