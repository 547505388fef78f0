"""The PHY on the board's pins: with the ULX3S platform's SDRAM resource its registers are the
ECP5's I/O cells' (checked in the netlist the platform would synthesize; nothing is built)."""

import re
from collections import Counter

import pytest
from amaranth import ClockDomain, Elaboratable, Module

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
