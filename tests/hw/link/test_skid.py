"""The stream register slice (hw/link/skid.py): order, throughput, latency and the stream rules
under random idle and backpressure; ``i.ready`` and the outputs are registers."""

import random

import pytest
from amaranth.sim import Simulator

from ringkv.hw.link.framing import PayloadByte
from ringkv.hw.link.skid import StreamRegister
from ringkv.sim.streams import stream_get_n, stream_put_all


def rtl_pass(payloads, *, shape=16, idle=0.0, stall=0.0, seed=0):
    """Push ``payloads`` through a :class:`StreamRegister`; return what came out, the clocks it
    took, and the stream-rule violations seen on ``o`` (valid dropped or payload changed
    before a transfer)."""
    dut = StreamRegister(shape)
    rng_in, rng_out = random.Random(seed), random.Random(seed + 1)
    out, clocks, broken = [], [0], []

    async def producer(ctx):
        await stream_put_all(ctx, dut.i, payloads, rng=rng_in, idle=idle)

    async def consumer(ctx):
        out.extend(await stream_get_n(ctx, dut.o, len(payloads), rng=rng_out, stall=stall))

    async def watch(ctx):
        held = None
        async for _, _, valid, ready, payload in ctx.tick().sample(dut.o.valid, dut.o.ready,
                                                                    dut.o.payload):
            clocks[0] += 1
            if held is not None and (not valid or payload != held):
                broken.append(clocks[0])
            held = payload if valid and not ready else None

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.add_testbench(watch, background=True)
    sim.run()
    return out, clocks[0], broken


@pytest.mark.parametrize("idle,stall", [(0.0, 0.0), (0.3, 0.0), (0.0, 0.5), (0.4, 0.4)])
def test_order_and_stream_rules(idle, stall):
    rng = random.Random(5)
    payloads = [rng.randrange(1 << 16) for _ in range(400)]
    out, _, broken = rtl_pass(payloads, idle=idle, stall=stall, seed=int(10 * idle + stall))
    assert out == payloads
    assert broken == []


def test_full_rate_one_clock_latency():
    """No idle, no stall: one transfer per clock, the first payload out a clock after it went
    in (n payloads in n + 1 clocks, plus the testbench's first clock)."""
    payloads = list(range(100))
    out, clocks, _ = rtl_pass(payloads)
    assert out == payloads
    assert clocks <= len(payloads) + 2


def test_struct_payload():
    payloads = [{"data": b, "last": int(b == 255)} for b in range(256)]
    out, _, broken = rtl_pass([PayloadByte.const(p) for p in payloads],
                              shape=PayloadByte, idle=0.2, stall=0.3, seed=3)
    assert [(v.data, v.last) for v in out] == [(p["data"], p["last"]) for p in payloads]
    assert broken == []
