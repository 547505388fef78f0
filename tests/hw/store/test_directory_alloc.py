"""The directory's allocators (hw/store/directory_alloc.py) against Python models, on random
operation sequences, in both table forms (block RAM, and the registers of the formal build)."""

import random

import pytest
from amaranth.sim import Simulator

from ringkv.hw.store.directory_alloc import FreeLinks, RegionAllocator


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


class RegionModel:
    """FIFO A as ``[a_next, regions)``, FIFO B as a ring of rows read one clock late."""

    def __init__(self, regions, b_threshold):
        self.n, self.thr = regions, b_threshold
        self.rows = [0] * regions
        self.reset()
        self.rdata = 0           # the row read at the last edge (not transparent)

    def reset(self):
        self.a_next = self.b_rd = self.b_wr = self.b_level = 0

    def use_b(self):
        return self.b_level != 0 and (self.a_next == self.n or self.b_level >= self.thr)

    def region(self):
        return self.rdata if self.use_b() else self.a_next % self.n

    def available(self):
        return self.a_next != self.n or self.b_level != 0

    def edge(self, op, arg=None):
        self.rdata = self.rows[self.b_rd]
        if op == "free":
            self.rows[self.b_wr] = arg
            self.b_wr, self.b_level = (self.b_wr + 1) % self.n, self.b_level + 1
        elif op == "skip":
            self.rows[self.b_wr] = self.a_next
            self.b_wr, self.b_level = (self.b_wr + 1) % self.n, self.b_level + 1
            self.a_next += 1
        elif op in ("take", "take_a"):
            if op == "take_a" or not self.use_b():
                self.a_next += 1
            else:
                self.b_rd, self.b_level = (self.b_rd + 1) % self.n, self.b_level - 1
        elif op == "reset":
            self.reset()


@pytest.mark.parametrize("formal", [False, True])
@pytest.mark.parametrize("b_threshold", [1, 4, 8])
def test_region_allocator_matches_model(formal, b_threshold):
    """Random takes (by the policy, or from A as a rebuild does), frees of live regions, skips
    and resets: every clock ``region``, ``available`` and ``a_next`` equal the model's, and the
    regions taken are never two at once the same (each is in exactly one place)."""
    regions = 8
    dut = RegionAllocator(regions=regions, b_threshold=b_threshold, formal=formal)
    model = RegionModel(regions, b_threshold)
    rng = random.Random(b_threshold + 10 * formal)
    done = {"take": 0, "take_a": 0, "free": 0, "skip": 0, "reset": 0}

    async def bench(ctx):
        live = []
        last = None
        for clock in range(1500):
            assert ctx.get(dut.a_next) == model.a_next, clock
            assert ctx.get(dut.available) == model.available(), clock
            if model.available():
                assert ctx.get(dut.region) == model.region(), clock
            # the table's read follows b_rd one clock late: the directory never takes in the
            # clock right after an operation, so neither does this test
            choices = ["idle"]
            if last is None and model.available():
                choices += ["take"] * 3
            if last is None and model.a_next != regions:
                choices += ["take_a", "skip"]
            if live:
                choices += ["free"] * 3
            if rng.random() < 0.01:
                choices = ["reset"]
            op = rng.choice(choices)
            arg = None
            for name in ("take", "from_a", "skip", "free", "reset"):
                ctx.set(getattr(dut, name), 0)
            if op in ("take", "take_a"):
                got = ctx.get(dut.region) if op == "take" else model.a_next
                assert got not in live
                live.append(got)
                ctx.set(dut.take, 1)
                ctx.set(dut.from_a, op == "take_a")
            elif op == "free":
                arg = live.pop(rng.randrange(len(live)))
                ctx.set(dut.free, 1)
                ctx.set(dut.free_region, arg)
            elif op == "skip":
                ctx.set(dut.skip, 1)
            elif op == "reset":
                ctx.set(dut.reset, 1)
                live.clear()
            if op != "idle":
                done[op] += 1
            model.edge(op, arg)
            last = None if op == "idle" else op
            await ctx.tick()

    run(dut, bench)
    assert min(done.values()) > 0, done


@pytest.mark.parametrize("formal", [False, True])
def test_free_links_match_model(formal):
    """The reset sweep fills the table, then random takes and frees: every clock ``link`` (two
    clocks after the last operation: the table's read is registered) and ``available`` equal
    the model's; no link is handed out twice while live."""
    links = 8
    dut = FreeLinks(links=links, formal=formal)
    rng = random.Random(3 + formal)
    counts = {"take": 0, "free": 0, "sweep": 0}

    async def bench(ctx):
        for sweep in range(3):
            free = list(range(links)) if formal and sweep == 0 else None
            if free is None:
                for i in range(links):
                    ctx.set(dut.fill, 1)
                    ctx.set(dut.fill_index, i)
                    ctx.set(dut.reset, i == links - 1)
                    await ctx.tick()
                ctx.set(dut.fill, 0)
                ctx.set(dut.reset, 0)
                free = list(range(links))
                counts["sweep"] += 1
            live = []
            quiet = 0
            for clock in range(400):
                assert ctx.get(dut.available) == bool(free)
                if free and quiet >= 1:
                    assert ctx.get(dut.link) == free[0], clock
                op = rng.choice(["idle"] + (["take"] * 2 if free and quiet >= 1 else [])
                                + (["free"] * 2 if live else []))
                ctx.set(dut.take, op == "take")
                ctx.set(dut.free, op == "free")
                if op == "take":
                    live.append(free.pop(0))
                elif op == "free":
                    link = live.pop(rng.randrange(len(live)))
                    ctx.set(dut.free_link, link)
                    free.append(link)
                if op != "idle":
                    counts[op] += 1
                quiet = 0 if op != "idle" else quiet + 1
                await ctx.tick()
            ctx.set(dut.take, 0)
            ctx.set(dut.free, 0)

    run(dut, bench)
    assert counts["take"] > 100 and counts["free"] > 100 and counts["sweep"] >= 2


def test_parameter_errors():
    with pytest.raises(ValueError, match=r"^regions must be a power of two"):
        RegionAllocator(regions=6, b_threshold=3)
    with pytest.raises(ValueError, match=r"^b_threshold must be between 1 and 8"):
        RegionAllocator(regions=8, b_threshold=9)
    with pytest.raises(ValueError, match=r"^links must be a power of two"):
        FreeLinks(links=12)
