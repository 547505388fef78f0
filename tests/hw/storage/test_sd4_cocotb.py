"""SD native 4-bit controller on Verilator via cocotb, against the bit-level 4-bit card model."""

from dataclasses import asdict

import pytest
from conftest import requires_verilator

from ringkv.defs.config import RingKVConfig
from ringkv.hw.storage.sdnative import SDNativeController
from ringkv.sim.cocotb_run import run_cocotb
from ringkv.sim.ring_model import DmaHarness

FAST = dict(init_half_period=2, half_period=1, hs_half_period=1, resp_timeout=64,
            data_timeout=400, busy_timeout=400, init_retries=8)


@requires_verilator
@pytest.mark.parametrize("transfers", [3, pytest.param(12, marks=pytest.mark.slow)])
def test_sd4_controller_cocotb(transfers):
    run_cocotb(SDNativeController(**FAST), toplevel="sd_native", test_module="cocotb_sd4",
               params={"seed": 3 + transfers, "transfers": transfers,
                       "cards": 1 if transfers < 10 else 2})


@requires_verilator
@pytest.mark.slow
def test_sd4_system_cocotb():
    """DMA -> SD native controller -> bit-level 4-bit card: export, power cycle, import."""
    config = RingKVConfig(layers=2, q_heads=2, kv_heads=1, head_dim=8, window=8, token_width=16,
                          max_tokens=300)
    run_cocotb(DmaHarness(config, 2, sd4=FAST), toplevel="sd4_system",
               test_module="cocotb_sd_system",
               params={"config": asdict(config), "regions": 2, "mode": "sd4"})
