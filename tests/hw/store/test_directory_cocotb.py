"""Cache directory: cocotb on Verilator against the golden model (tests/cocotb/)."""

from conftest import requires_verilator

from ringkv.hw.store.directory import CacheDirectory
from ringkv.sim.cocotb_run import run_cocotb

# Small enough for long chains (8 buckets), eviction by links and by regions, stamp wrap-around.
CONFIG = dict(buckets=8, links=16, regions=16, count_width=24, hash_width=64, stamp_width=8,
              b_threshold=4)


@requires_verilator
def test_directory_cocotb_20000_random_ops():
    dut = CacheDirectory(**CONFIG)
    run_cocotb(dut, toplevel="directory", test_module="cocotb_directory",
               params={"directory": dut.params(), "ops": 20000, "seed": 7, "idle": 0.3,
                       "stall": 0.3})
