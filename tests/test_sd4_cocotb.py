"""SD native 4-bit controller on Verilator via cocotb, against the bit-level 4-bit card model."""

import pytest
from conftest import requires_verilator

from ringkv.hw.sdnative import SDNativeController
from ringkv.sim.cocotb_run import run_cocotb

FAST = dict(init_half_period=2, half_period=1, hs_half_period=1, resp_timeout=64,
            data_timeout=400, busy_timeout=400, init_retries=8)


@requires_verilator
@pytest.mark.parametrize("transfers", [3, pytest.param(12, marks=pytest.mark.slow)])
def test_sd4_controller_cocotb(transfers):
    run_cocotb(SDNativeController(**FAST), toplevel="sd_native", test_module="cocotb_sd4",
               params={"seed": 3 + transfers, "transfers": transfers,
                       "cards": 1 if transfers < 10 else 2})
