"""The PHY on the board's pins: with the ULX3S platform's SDRAM resource its registers are the
ECP5's I/O cells' (checked in the netlist the platform would synthesize; nothing is built)."""

import re
from collections import Counter

import pytest
from amaranth import ClockDomain, ClockSignal, Elaboratable, Module

from ringkv.defs.sdram import DEFAULT_CHIP
from ringkv.hw.sdram.controller import SdramController

ulx3s = pytest.importorskip("amaranth_boards.ulx3s")


class PadsTop(Elaboratable):
    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain()
        m.domains.sdram = ClockDomain(reset_less=True)   # the PLL's 90-degree output
        pads = platform.request("sdram", 0, dir="-")
        m.submodules.ctrl = SdramController(DEFAULT_CHIP, tck_ns=1000 / 60, cl=2, bl=8,
                                            pads=pads)
        return m


def test_pins_use_the_io_cells_registers():
    plan = ulx3s.ULX3S_85F_Platform().prepare(PadsTop(), name="sdram_pads")
    cells = Counter(re.findall(r"cell \\(\w+) ", plan.files["sdram_pads.il"]))
    # DQ in: one input register per bit; the SDRAM clock: one ODDRX1F
    assert cells["IFS1P3DX"] == 16 and cells["ODDRX1F"] == 1
    # out: CKE, CS#, RAS#, CAS#, WE#, BA[2], A[13], DQM[2] and DQ[16] with their enables
    assert cells["OFS1P3DX"] >= 22 + 2 * 16


class HalfRatePadsTop(Elaboratable):
    """The half-rate controller on the pads, each domain's clock from its own input pin (so
    that the netlist names which clock every I/O register takes)."""

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain()
        m.domains.sync2x = ClockDomain(reset_less=True)
        m.domains.sdram = ClockDomain(reset_less=True)
        m.d.comb += [ClockSignal("sync2x").eq(platform.request("clk25", 0).i),
                     ClockSignal("sync").eq(platform.request("button_fire", 0).i),
                     ClockSignal("sdram").eq(platform.request("button_fire", 1).i)]
        pads = platform.request("sdram", 0, dir="-")
        m.submodules.ctrl = SdramController(DEFAULT_CHIP, tck_ns=1000 / 60, cl=3, bl=8,
                                            pads=pads, rate=2)
        return m


def test_half_rate_pins_use_the_io_cells_registers_on_the_fast_clock():
    plan = ulx3s.ULX3S_85F_Platform().prepare(HalfRatePadsTop(), name="sdram_half")
    il = plan.files["sdram_half.il"]
    cells = Counter(re.findall(r"cell \\(\w+) ", il))
    assert cells["IFS1P3DX"] == 16 and cells["ODDRX1F"] == 1
    assert cells["OFS1P3DX"] >= 22 + 2 * 16
    clocks = Counter(re.search(r"connect \\SCLK (\S+)", body).group(1) for body in
                     re.findall(r"cell \\(?:OFS1P3DX|IFS1P3DX) \S+\n(.*?)\n  end", il, re.S))
    # every pin register on the fast clock but the SDRAM clock's own output enable
    assert clocks["\\sync2x_clk"] == cells["IFS1P3DX"] + cells["OFS1P3DX"] - 1
    assert clocks["\\sdram_clk"] == 1 and "\\sync_clk" not in clocks
