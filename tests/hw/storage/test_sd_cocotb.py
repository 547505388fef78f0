"""SD-SPI controller (and the whole board storage path) on Verilator via cocotb."""

from dataclasses import asdict

import pytest
from conftest import requires_verilator

from ringkv.defs.config import RingKVConfig
from ringkv.hw.storage.sdspi import SDSPIController
from ringkv.sim.cocotb_run import run_cocotb
from ringkv.sim.ring_model import DmaHarness

FAST = dict(init_half_period=2, half_period=1, resp_timeout=16, token_timeout=200,
            busy_timeout=200, init_retries=8)


@requires_verilator
@pytest.mark.slow       # the SPI variant (not the bitstream's default) on Verilator: make test has
                        # its Amaranth-simulator tests (test_sdspi.py) and the 4-bit controller here
@pytest.mark.parametrize("transfers", [1, 6])
def test_sd_controller_cocotb(transfers):
    run_cocotb(SDSPIController(**FAST), toplevel="sd_spi", test_module="cocotb_sd",
               params={"seed": 3 + transfers, "transfers": transfers})


@requires_verilator
@pytest.mark.slow
def test_sd_system_cocotb():
    """DMA -> SD-SPI controller -> bit-level card model: export, power cycle, import."""
    config = RingKVConfig(layers=2, q_heads=2, kv_heads=1, head_dim=8, window=8, token_width=16,
                          max_tokens=300)
    run_cocotb(DmaHarness(config, 2, sd=FAST), toplevel="sd_system",
               test_module="cocotb_sd_system", params={"config": asdict(config), "regions": 2})
