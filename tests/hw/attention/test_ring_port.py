"""The ring port's arbiter (hw/attention/ring_port.py) against a Python model, on random
stimulus."""

import random

import pytest
from amaranth.sim import Simulator

from ringkv.hw.attention.ring_port import RingPortArbiter, RingPortSignature, RingReadSignature

SIG = RingPortSignature(layers=2, kv_heads=2, head_dim=8, window=8, elem_bytes=2)
WIDTHS = {"ring_addr": 32, "ring_re": 1, "ring_we": 1, "ring_wdata": 32, "ring_wide": 1,
          "meta_ring": 8, "meta_we": 1, "meta_wcount": 32, "meta_whead": 16}
READ_IN = ("ring_addr", "ring_re", "meta_ring")
BACK = {"ring_rdata": 8, "meta_count": 32, "meta_head": 16}


def model(owns, dma, reader, core_back, core_back_before):
    """What the core sees and what each initiator reads back: the byte at once, the metadata
    registered (the core's values of the clock before)."""
    core = {name: (dma[name] if owns else reader[name]) for name in READ_IN}
    core.update(ring_we=dma["ring_we"] & owns, meta_we=dma["meta_we"] & owns,
                ring_wdata=dma["ring_wdata"], ring_wide=dma["ring_wide"],
                meta_wcount=dma["meta_wcount"], meta_whead=dma["meta_whead"])
    back = dict(core_back_before, ring_rdata=core_back["ring_rdata"])
    return core, back, dict(back)


def test_signatures():
    assert SIG.ring_bytes == 2 * 2 * 2 * 8 * 8 * 2
    assert SIG == RingPortSignature(2, 2, 8, 8, 2) != RingPortSignature(2, 2, 8, 8, 1)
    assert set(RingReadSignature().members) == set(READ_IN) | set(BACK)
    assert set(SIG.members) == set(WIDTHS) | set(BACK)
    with pytest.raises(TypeError, match=r"^port must be a RingPortSignature, not 3$"):
        RingPortArbiter(3)


def test_arbiter_matches_model():
    """Random owner, random values on every member: each clock the core's inputs and both
    initiators' read data equal the model's (combinational but for the registered metadata)."""
    dut = RingPortArbiter(SIG)
    rng = random.Random(27)
    checked = []

    async def bench(ctx):
        before = {n: 0 for n in BACK}
        for _ in range(300):
            owns = rng.randrange(2)
            dma = {n: rng.randrange(1 << w) for n, w in WIDTHS.items()}
            reader = {n: rng.randrange(1 << WIDTHS[n]) for n in READ_IN}
            back = {n: rng.randrange(1 << w) for n, w in BACK.items()}
            ctx.set(dut.dma_owns, owns)
            for n, v in dma.items():
                ctx.set(getattr(dut.dma, n), v)
            for n, v in reader.items():
                ctx.set(getattr(dut.reader, n), v)
            for n, v in back.items():
                ctx.set(getattr(dut.core, n), v)
            want_core, want_dma, want_reader = model(owns, dma, reader, back, before)
            assert {n: ctx.get(getattr(dut.core, n)) for n in WIDTHS} == want_core
            assert {n: ctx.get(getattr(dut.dma, n)) for n in BACK} == want_dma
            assert {n: ctx.get(getattr(dut.reader, n)) for n in BACK} == want_reader
            checked.append(owns)
            before = back
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(checked) == 300 and 0 < sum(checked) < 300
