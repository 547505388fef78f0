"""DMA harness on Verilator via cocotb (tests/cocotb/cocotb_dma.py; with the record MAC,
tests/cocotb/cocotb_dma_mac.py)."""

from dataclasses import asdict

import pytest
from conftest import requires_verilator

from ringkv.defs.config import RingKVConfig
from ringkv.sim.cocotb_run import run_cocotb
from ringkv.sim.ring_model import DmaHarness

CONFIGS = {
    "small": (RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=8, window=16,
                           token_width=16, max_tokens=700), 3, 8),
    "odd": (RingKVConfig(layers=3, q_heads=3, kv_heads=1, head_dim=4, window=8, token_width=12,
                         max_tokens=90), 2, 16),
    # numerics ringkv-fx2: int16 K/V, two bytes per element on the ring port and in records
    "fx2": (RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=8, window=16,
                         token_width=16, max_tokens=300, numerics="ringkv-fx2"), 3, 6),
}


@requires_verilator
@pytest.mark.parametrize("name", ["small", pytest.param("fx2", marks=pytest.mark.slow),
                                  pytest.param("odd", marks=pytest.mark.slow)])
def test_dma_cocotb(name):
    config, regions, trials = CONFIGS[name]
    run_cocotb(DmaHarness(config, regions), toplevel="dma_harness", test_module="cocotb_dma",
               build_name=f"dma_harness_{name}",
               params={"config": asdict(config), "regions": regions, "trials": trials,
                       "seed": len(name), "cuts": 3})


@requires_verilator
def test_sealed_dma_cocotb():
    """The DMA harness with the record MAC on Verilator (tests/cocotb/cocotb_dma_mac.py):
    sealed exports and imports against the golden sealed record, a forged tag, an unset
    slot."""
    config = RingKVConfig(layers=1, q_heads=2, kv_heads=1, head_dim=8, window=8,
                          token_width=16, max_tokens=100)
    run_cocotb(DmaHarness(config, 2, mac=True), toplevel="dma_harness",
               test_module="cocotb_dma_mac", build_name="dma_harness_sealed",
               params={"config": asdict(config), "regions": 2, "trials": 4, "seed": 3})
