"""The 16-bit port on a half-rate controller (``hw/sdram/widener.py``), on the pin-level model,
against the golden model."""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from sdram_helpers import port_scripts, run, small

from ringkv.hw.sdram.arbiter import UserPortSignature
from ringkv.hw.sdram.controller import SdramController
from ringkv.hw.sdram.phy import SdramPinsSignature
from ringkv.hw.sdram.widener import WIDENER_BUGS, PortWidener


class NarrowedController(wiring.Component):
    """A half-rate controller whose ports are each behind a :class:`PortWidener`: what the
    traffic harness drives (``port``, ``pins``, ``ready`` and the controller's parameters)."""

    def __init__(self, _bug=None, **kw):
        self.ctrl = ctrl = SdramController(rate=2, **kw)
        for name in ("chip", "tck_ns", "sdram_tck_ns", "bl", "rate", "fast_domain",
                     "read_delay"):
            setattr(self, name, getattr(ctrl, name))
        count_bits = len(ctrl.port[0].cmd.payload.count)
        self.wideners = [PortWidener(ctrl.addr_bits, count_bits, _bug=_bug)
                         for _ in range(ctrl.ports)]
        super().__init__({
            "port": In(UserPortSignature(ctrl.addr_bits, count_bits)).array(ctrl.ports),
            "pins": Out(SdramPinsSignature(ctrl.chip)), "ready": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.ctrl = self.ctrl
        for p, wide in enumerate(self.wideners):
            m.submodules[f"widener{p}"] = wide
            wiring.connect(m, wiring.flipped(self.port[p]), wide.narrow)
            wiring.connect(m, wide.wide, self.ctrl.port[p])
        wiring.connect(m, wiring.flipped(self.pins), self.ctrl.pins)
        m.d.comb += self.ready.eq(self.ctrl.ready)
        return m


@pytest.mark.parametrize("bl, idle, stall, seed", [(8, 0.0, 0.0, 1), (8, 0.3, 0.5, 2),
                                                   (2, 0.5, 0.3, 3)])
def test_narrow_ports_against_golden(bl, idle, stall, seed):
    """Two 16-bit ports on the half-rate controller (60 MHz, the SDRAM at 120): random writes
    with byte masks and reads, overlapping, with idle and backpressure, read what the golden
    model says, and the pin-level model finds no violation."""
    chip = small(refreshes=8, refresh_ns=8 * 2500)
    dut = NarrowedController(chip=chip, tck_ns=1000 / 60, cl=3, bl=bl, ports=2)
    assert len(dut.port[0].r.payload) == 16
    scripts = port_scripts(random.Random(seed), chip, bl, 2, 20)
    result, bad = run(dut, scripts, seed=seed, idle=idle, stall=stall)
    assert bad == 0 and result.model.violations == []
    assert sum(len(r) for r in result.reads) == sum(op[0] == "r" for sc in scripts for op in sc)


@pytest.mark.parametrize("bug", WIDENER_BUGS)
def test_broken_widener_caught(bug):
    """The comparison can fail: a widener with its halves in the wrong order reads wrong
    words; the same traffic through the correct one reads right."""
    chip = small(refreshes=8, refresh_ns=8 * 2500)
    rng = random.Random(4)
    data = [rng.randrange(1 << 16) for _ in range(32)]
    scripts = [[("w", 512, data, [0] * 32), ("r", 512, 32)]]
    kw = dict(chip=chip, tck_ns=1000 / 60, cl=3, bl=8, ports=1)
    _, bad = run(NarrowedController(_bug=bug, **kw), scripts, strict=False)
    assert bad > 0
    _, bad = run(NarrowedController(**kw), scripts)
    assert bad == 0
