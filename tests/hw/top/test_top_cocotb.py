"""RingKVTop on Verilator via cocotb (tests/cocotb/cocotb_top.py)."""

from dataclasses import asdict

import pytest
from conftest import requires_verilator

from ringkv.defs.config import RingKVConfig
from ringkv.hw.top import RingKVTop
from ringkv.sim.cocotb_run import run_cocotb

CFG = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=8, window=8, max_tokens=64)


CFG2 = RingKVConfig(**{**CFG.__dict__, "numerics": "ringkv-fx2"})   # int16 q/k/v


@requires_verilator
@pytest.mark.slow        # ~2.5 min each, mostly the Verilator build of the whole top
@pytest.mark.parametrize("config,name,max_payload", [(CFG, "small", 1024),
                                                     (CFG2, "small_fx2", 2048)])
def test_top_cocotb(config, name, max_payload):
    top = RingKVTop(config, regions=4, lanes=2, macs=4, max_payload=max_payload)
    run_cocotb(top, toplevel="ringkv_top", test_module="cocotb_top",
               build_name=f"ringkv_top_{name}",
               params={"config": asdict(config), "regions": 4, "lanes": 2, "seed": 7})


@requires_verilator
@pytest.mark.slow        # shares the "small" build above; ~1 min of simulation besides
def test_prefix_cocotb():
    """QUERY_PREFIX on Verilator against its golden model, with backpressure on the response
    stream (tests/cocotb/cocotb_prefix.py)."""
    top = RingKVTop(CFG, regions=4, lanes=2, macs=4, max_payload=1024)
    run_cocotb(top, toplevel="ringkv_top", test_module="cocotb_prefix",
               build_name="ringkv_top_small",
               params={"config": asdict(CFG), "regions": 4, "links": top.links,
                       "buckets": top.buckets, "seed": 16})


@requires_verilator
@pytest.mark.slow        # its own Verilator build of the sealed top (the MAC, the key slots)
def test_top_sealed_cocotb():
    """A sealed top on Verilator (tests/cocotb/cocotb_top_sealed.py): KEY_SET and its
    refusals, NO_KEY, tenant A's record a miss for tenant B and a hit for A, with random idle
    and stalls on the link and the storage port."""
    top = RingKVTop(CFG, regions=4, lanes=2, macs=4, max_payload=1024, sealed=True)
    run_cocotb(top, toplevel="ringkv_top", test_module="cocotb_top_sealed",
               build_name="ringkv_top_small_sealed",
               params={"config": asdict(CFG), "regions": 4, "seed": 9})
