"""Port arbiter: commands from several ports, with random idle and backpressure, split into
bursts exactly as the golden model splits them, a command's bursts together, ports in turn."""

import random

from amaranth.sim import Simulator
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from ringkv.defs.sdram import CHIPS
from ringkv.host.golden.sdram import split_command
from ringkv.hw.sdram.arbiter import PortArbiter
from ringkv.sim.streams import stream_get, stream_put

CHIP = CHIPS["AS4C32M16SB-7"]


@settings(max_examples=examples(fast=3, thorough=30), deadline=None)
@given(seed=st.integers(0, 2**30), ports=st.integers(1, 3), bl=st.sampled_from((1, 2, 8)))
def test_bursts_match_golden_split(seed, ports, bl):
    rng = random.Random(seed)
    dut = PortArbiter(CHIP, ports=ports, bl=bl, count_bits=4)
    cmds = [[(rng.randrange(CHIP.words), rng.random() < 0.5, rng.randrange(0, 6))
             for _ in range(5)] for _ in range(ports)]
    total = sum(c for port in cmds for _, _, c in port)
    got = []

    def feeder(p):
        async def bench(ctx):
            for addr, write, count in cmds[p]:
                await stream_put(ctx, dut.i[p], {"addr": addr, "write": write, "count": count},
                                 rng=rng, idle=0.4)
        return bench

    async def sink(ctx):
        ctx.set(dut.pause, 0)
        for _ in range(total):
            if rng.random() < 0.1:
                ctx.set(dut.pause, 1)
                await ctx.tick().repeat(3)
                ctx.set(dut.pause, 0)
            got.append(await stream_get(ctx, dut.o, rng=rng, stall=0.4))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for p in range(ports):
        sim.add_testbench(feeder(p))
    sim.add_testbench(sink)
    sim.run()

    # group the bursts back into commands: consecutive bursts of one port and direction
    per_port = {p: [] for p in range(ports)}
    for b in got:
        per_port[b.port].append((b.bank, b.row, b.col, b.write))
    for p in range(ports):
        want = []
        for addr, write, count in cmds[p]:
            want += [(*burst, int(write)) for burst in split_command(CHIP, bl, addr, count)]
        assert per_port[p] == want
    # a command's bursts leave together: the port changes only at a command boundary
    boundaries = sum(1 for a, b in zip(got, got[1:]) if a.port != b.port)
    assert boundaries <= sum(1 for port in cmds for *_, c in port if c) - 1 if got else True
