"""Drive an SDRAM controller's ports in the Amaranth simulator, with the pin-level model on its
pins: the shared harness of the SDRAM tests and the ``sdram`` bench group.

``run_traffic(controller, scripts, ...)`` runs one script of operations per port (``("w",
addr, words, masks)``, ``("r", addr, nwords)``, in 16-bit words whatever the controller's
rate), each port with its own random idle and backpressure, then ``tail`` idle clocks, and
returns what every read returned (16-bit words), the model and the clocks it took.

A half-rate controller (``rate`` 2) runs with its ``fast_domain`` clocked at twice the
controller's clock, every other edge on the controller's (periods of whole femtoseconds, so
that the simulator sees the edges at one instant), the model on the fast clock; two words
travel in each port transfer (the even address's in the low half).
"""

import random
from dataclasses import dataclass, field

from amaranth.sim import Simulator

from .sdram_model import SdramModel, add_controller_clocks, amaranth_sdram, model_for_controller
from .streams import stream_get, stream_put, tick_until

__all__ = ["run_traffic", "TrafficResult", "random_script"]


@dataclass
class TrafficResult:
    reads: list = field(default_factory=list)        # per port: [(addr, [words])]
    model: SdramModel | None = None
    cycles: int = 0                                   # controller clocks, from ready to the
                                                      # last read word
    start: int = 0
    busy_words: int = 0


def random_script(rng: random.Random, chip, bl: int, n: int, *, max_bursts=4,
                  region: int | None = None, write_share=0.5, masks=True):
    """``n`` random operations of 1..max_bursts bursts, in ``region`` words (all the chip)."""
    words = chip.words if region is None else region
    out = []
    for _ in range(n):
        count = rng.randrange(1, max_bursts + 1)
        addr = rng.randrange(0, max(1, words - count * bl)) & ~(bl - 1)
        if rng.random() < write_share:
            data = [rng.randrange(1 << 16) for _ in range(count * bl)]
            mask = [rng.choice((0, 0, 0, 1, 2, 3)) if masks else 0 for _ in data]
            out.append(("w", addr, data, mask))
        else:
            out.append(("r", addr, count * bl))
    return out


def run_traffic(ctrl, scripts, *, model: SdramModel | None = None, seed=0, idle=0.0,
                stall=0.0, max_cycles=50_000, vcd=None,
                wait_ready=False, tail=0, pin_delay=None) -> TrafficResult:
    """Run ``scripts[p]`` on ``ctrl.port[p]`` after the power-up; returns a
    :class:`TrafficResult`. A port's read data is collected concurrently with its commands.
    ``pin_delay``: the model's (:class:`~ringkv.sim.sdram_model.PinDelay`; None: the
    controller's ``read_delay``, the phase it is built for)."""
    # 16-bit words a port transfer: the controller's rate, unless its ports are narrowed
    rate = len(ctrl.port[0].r.payload) // 16
    if model is None:
        model = model_for_controller(ctrl, seed=seed)
    res = TrafficResult(reads=[[] for _ in scripts], model=model)
    rng = random.Random(seed)
    done = {"benches": 0}
    bl = ctrl.bl
    clock = {"n": 0}

    sim = Simulator(ctrl)
    pin_domain = add_controller_clocks(sim, ctrl)
    if pin_delay is None:
        pin_delay = getattr(ctrl, "read_delay", 0)
    sim.add_testbench(amaranth_sdram(model, ctrl.pins, pin_delay=pin_delay,
                                     domain=pin_domain), background=True)

    async def counter(ctx):
        async for _ in ctx.tick():
            clock["n"] += 1

    sim.add_process(counter)

    async def ready(ctx):
        await tick_until(ctx, ctrl.ready)
        res.start = clock["n"]

    sim.add_testbench(ready)

    def port_benches(p, script):
        port = ctrl.port[p]
        prng = random.Random(rng.randrange(1 << 30))
        reads = [op for op in script if op[0] == "r"]
        writes = [op for op in script if op[0] == "w"]

        async def commands(ctx):
            if wait_ready:
                await tick_until(ctx, ctrl.ready)
            for op in script:
                count = (op[2] if op[0] == "r" else len(op[2])) // bl
                await stream_put(ctx, port.cmd, {"addr": op[1], "write": op[0] == "w",
                                                 "count": count}, rng=prng, idle=idle)
            done["benches"] += 1

        async def wdata(ctx):
            for op in writes:
                for k in range(0, len(op[2]), rate):
                    word = sum(w << 16 * i for i, w in enumerate(op[2][k:k + rate]))
                    mask = sum(m << 2 * i for i, m in enumerate(op[3][k:k + rate]))
                    await stream_put(ctx, port.w, {"data": word, "mask": mask}, rng=prng,
                                     idle=idle)
            done["benches"] += 1

        async def rdata(ctx):
            for op in reads:
                got = []
                for _ in range(op[2] // rate):
                    word = await stream_get(ctx, port.r, rng=prng, stall=stall)
                    got.extend(word >> 16 * i & 0xFFFF for i in range(rate))
                res.reads[p].append((op[1], got))
            done["benches"] += 1

        return commands, wdata, rdata

    for p, script in enumerate(scripts):
        for bench in port_benches(p, script):
            sim.add_testbench(bench)

    async def limit(ctx):
        for _ in range(max_cycles):
            await ctx.tick()
        raise TimeoutError(f"traffic not done after {max_cycles} clocks")

    sim.add_testbench(limit, background=True)

    async def idle_tail(ctx):
        # the model keeps checking (refresh, tRAS max) for ``tail`` clocks after the traffic
        await tick_until(ctx, ctrl.ready)
        while done["benches"] < 3 * len(scripts):
            await ctx.tick()
        for _ in range(tail):
            await ctx.tick()

    sim.add_testbench(idle_tail)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()
    res.cycles = clock["n"] - res.start
    return res
