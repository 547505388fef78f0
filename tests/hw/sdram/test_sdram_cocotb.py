"""SDRAM controller on Verilator (cocotb), on the pin-level model through its cocotb adapter."""

import pytest
from conftest import requires_verilator

from ringkv.defs.sdram import CHIPS
from ringkv.hw.sdram.controller import SdramController
from ringkv.sim.cocotb_run import run_cocotb

PARAMS = dict(chip="MT48LC16M16A2-6A", power_up_ns=1000, tck_ns=10.0, cl=2, bl=8, ports=2)


def build(params):
    chip = CHIPS[params["chip"]].scaled(power_up_ns=params["power_up_ns"])
    return SdramController(chip, tck_ns=params["tck_ns"], cl=params["cl"], bl=params["bl"],
                           ports=params["ports"])


@requires_verilator
@pytest.mark.slow       # the Verilator build alone takes about 2 minutes on 2 busy cores: over the
                        # fast tier's budget for this subsystem; the Amaranth-simulator tests run
                        # the same controller on the same model in make test
def test_sdram_cocotb_smoke():
    """Two ports, 30 random operations each (overwrites, byte masks, row misses, refreshes)."""
    run_cocotb(build(PARAMS), toplevel="sdram_controller", test_module="cocotb_sdram",
               params={**PARAMS, "seed": 1, "ops": 30})


@requires_verilator
@pytest.mark.slow       # the same on another chip, CAS latency and burst length, longer
@pytest.mark.parametrize("chip, cl, bl, tck", [("AS4C32M16SB-7", 3, 4, 7.0),
                                               ("IS42S16160G-7", 2, 2, 7.5)])
def test_sdram_cocotb_other_chips(chip, cl, bl, tck):
    params = dict(PARAMS, chip=chip, cl=cl, bl=bl, tck_ns=tck)
    run_cocotb(build(params), toplevel="sdram_controller", test_module="cocotb_sdram",
               params={**params, "seed": 7, "ops": 120},
               build_name=f"sdram_controller_{chip}_{cl}_{bl}")
