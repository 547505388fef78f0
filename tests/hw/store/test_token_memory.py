"""Token memory: append, indexed write, clear, count load, overflow, read ports."""

import random

import pytest
from amaranth.sim import Simulator

from ringkv.hw.store.token_memory import TokenMemory, TokenReadSignature


def test_parameter_errors():
    with pytest.raises(ValueError, match=r"^max_tokens must be a positive integer, not 0$"):
        TokenMemory(0, 16)
    with pytest.raises(TypeError, match=r"^token_width must be an integer, not 'x'$"):
        TokenMemory(8, "x")
    with pytest.raises(TypeError, match=r"^read_ports must be an integer, not True$"):
        TokenMemory(8, 16, True)
    with pytest.raises(ValueError, match=r"^token_width must be between 1 and 32, not 33$"):
        TokenMemory(8, 33)
    assert TokenReadSignature(8, 16) == TokenReadSignature(8, 16) != TokenReadSignature(8, 15)


def test_against_reference():
    rng = random.Random(4)
    dut = TokenMemory(max_tokens=24, token_width=12, read_ports=2)
    model, count, overflow = [0] * 24, 0, 0
    log = []
    want = [0, 0]             # each read port's data: the last word read, held while en is low

    async def bench(ctx):
        nonlocal count, overflow
        overflows = 0
        for step in range(600):
            op = rng.choice(["append", "append", "write", "idle", "clear", "load"])
            ctx.set(dut.append.valid, op == "append")
            ctx.set(dut.write.en, op == "write")
            ctx.set(dut.clear, op == "clear")
            ctx.set(dut.count_we, op == "load")
            token, addr = rng.randrange(1 << 12), rng.randrange(24)
            ctx.set(dut.append.payload, token)
            ctx.set(dut.write.addr, addr)
            ctx.set(dut.write.data, token)
            new_count = rng.randrange(30)
            ctx.set(dut.set_count, new_count)
            issued = []
            for i in range(2):
                port = dut.read_port(i)
                en = rng.random() < 0.7
                raddr = rng.randrange(24)
                ctx.set(port.en, en)
                ctx.set(port.addr, raddr)
                issued.append(raddr if en else None)
            await ctx.tick()
            # the reads see the memory before this clock's write (not transparent); a port
            # without a read holds its word, whatever was written since
            for i, raddr in enumerate(issued):
                if raddr is not None:
                    want[i] = model[raddr]
                log.append((ctx.get(dut.read_port(i).data), want[i], raddr is None))
            if op == "append":
                if count == 24:
                    overflow = 1
                else:
                    model[count] = token
                    count += 1
            elif op == "write":
                model[addr] = token
            elif op == "clear":
                count, overflow = 0, 0
            elif op == "load":
                count = min(new_count, 24)
            assert ctx.get(dut.count) == count, step
            assert ctx.get(dut.overflow) == overflow, step
            overflows += overflow
        assert overflows > 0

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert sum(held for *_, held in log) > 300
    assert all(got == w for got, w, _ in log)
