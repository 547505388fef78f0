"""The SDRAM self-test in the Amaranth simulator: :class:`SdramBist` on a port of a real
:class:`~ringkv.hw.sdram.controller.SdramController`, the pins on the strict pin-level model
(:class:`~ringkv.sim.sdram_model.SdramModel`, with its faults), for
``tests/hw/sdram/test_bist.py``."""

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from ringkv.hw.sdram.bist import BistSignature, SdramBist
from ringkv.hw.sdram.controller import SdramController
from ringkv.hw.sdram.phy import SdramPinsSignature
from ringkv.hw.sdram.widener import PortWidener

from .sdram_model import SdramModel, add_controller_clocks, amaranth_sdram, model_for_controller
from .streams import tick_until

__all__ = ["BistTop", "run_bist"]


class BistTop(wiring.Component):
    """:class:`SdramBist` on port 0 of a one-port controller (at half rate through a
    :class:`~ringkv.hw.sdram.widener.PortWidener`, as on the board): ports ``bist`` (the
    test's command and result), ``pins``, ``ready``."""

    def __init__(self, controller: dict, *, clocks_per_ms: int = 100, _bug=None):
        self.ctrl = SdramController(**controller)
        self.bist_block = SdramBist(self.ctrl.chip, bl=self.ctrl.bl,
                                    count_bits=controller.get("count_bits", 12),
                                    clocks_per_ms=clocks_per_ms, _bug=_bug)
        self.widener = None
        if self.ctrl.rate == 2:
            self.widener = PortWidener(self.ctrl.addr_bits,
                                       len(self.ctrl.port[0].cmd.payload.count))
        super().__init__({"bist": In(BistSignature()),
                          "pins": Out(SdramPinsSignature(self.ctrl.chip)), "ready": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.ctrl, m.submodules.bist = self.ctrl, self.bist_block
        if self.widener is None:
            wiring.connect(m, self.bist_block.port, self.ctrl.port[0])
        else:
            m.submodules.widener = self.widener
            wiring.connect(m, self.bist_block.port, self.widener.narrow)
            wiring.connect(m, self.widener.wide, self.ctrl.port[0])
        wiring.connect(m, wiring.flipped(self.bist), self.bist_block.bist)
        wiring.connect(m, wiring.flipped(self.pins), self.ctrl.pins)
        m.d.comb += self.ready.eq(self.ctrl.ready)
        return m


def run_bist(top: BistTop, tests: int, words: int, pause_ms: int = 0, *,
             model: SdramModel | None = None, max_cycles: int = 400_000) -> dict:
    """One ``SDRAM_TEST`` on ``top``: the result's fields (``failed`` as an int) and
    ``model``."""
    model = model_for_controller(top.ctrl) if model is None else model
    out = {}
    sim = Simulator(top)
    domain = add_controller_clocks(sim, top.ctrl)
    sim.add_testbench(amaranth_sdram(model, top.pins, domain=domain,
                                     pin_delay=top.ctrl.read_delay), background=True)

    async def bench(ctx):
        cmd, res = top.bist.cmd, top.bist.result
        ctx.set(cmd.payload.tests, tests)
        ctx.set(cmd.payload.words, words)
        ctx.set(cmd.payload.pause_ms, pause_ms)
        ctx.set(cmd.valid, 1)
        await tick_until(ctx, cmd.ready)
        ctx.set(cmd.valid, 0)
        ctx.set(res.ready, 1)
        for _ in range(max_cycles):
            await ctx.tick()
            if ctx.get(res.valid):
                break
        else:
            raise TimeoutError(f"no self-test result after {max_cycles} clocks")
        for name in ("failed", "address", "expected", "got", "errors", "words", "chip_words",
                     "cycles"):
            out[name] = ctx.get(getattr(res.payload, name))
    sim.add_testbench(bench)
    sim.run()
    out["model"] = model
    return out
