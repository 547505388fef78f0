"""Hot tier: cocotb on Verilator against the golden model (tests/cocotb/)."""

import pytest
from conftest import requires_verilator

from ringkv.hw.store.hot_tier import HotTier
from ringkv.sim.cocotb_run import run_cocotb

# Slots not a power of two, more regions than slots (eviction), stamps that wrap.
CONFIG = dict(regions=16, slots=5, stamp_width=8)


@requires_verilator
@pytest.mark.slow     # the Amaranth-simulator tests check the same against the golden model
def test_hot_tier_cocotb_20000_random_ops():
    dut = HotTier(**CONFIG)
    run_cocotb(dut, toplevel="hot_tier", test_module="cocotb_hot_tier",
               params={"hot_tier": dut.params(), "ops": 20000, "seed": 7, "idle": 0.3,
                       "stall": 0.3})
