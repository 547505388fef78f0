"""RingKVTop on Verilator via cocotb (tests/cocotb/cocotb_top.py)."""

from dataclasses import asdict

import pytest
from conftest import requires_verilator

from ringkv.host.config import RingKVConfig
from ringkv.hw.top import RingKVTop
from ringkv.sim.cocotb_run import run_cocotb

CFG = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=8, window=8, max_tokens=64)


@requires_verilator
@pytest.mark.slow        # ~2.5 min, mostly the Verilator build of the whole top
def test_top_cocotb():
    top = RingKVTop(CFG, regions=4, lanes=2, macs=4, max_payload=1024)
    run_cocotb(top, toplevel="ringkv_top", test_module="cocotb_top",
               build_name="ringkv_top_small",
               params={"config": asdict(CFG), "regions": 4, "lanes": 2, "seed": 7})
