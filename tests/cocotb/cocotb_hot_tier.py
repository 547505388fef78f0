"""cocotb on Verilator: the hot tier against its golden model, random ops, idle/stall.

Run by ``tests/hw/store/test_hot_tier_cocotb.py`` through :func:`ringkv.sim.cocotb_run.run_cocotb`.
"""

import random

import cocotb

from ringkv.defs.hot_tier import Op, Status
from ringkv.host.golden.hot_tier import GoldenHotTier, random_commands
from ringkv.hw.store.hot_tier import command_layout, layout_fields, response_layout
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import check_commands


@cocotb.test(timeout_time=20, timeout_unit="sec")
async def random_operations(dut):
    p = cocotb_params()
    params = p["hot_tier"]
    golden = GoldenHotTier(**params)
    cmds, expected = random_commands(random.Random(p["seed"]), golden, p["ops"],
                                     region_pool=2 * params["slots"] + 1)
    # The final state: every slot read back, and the count of valid ones.
    final = [{"op": Op.READ.value, "slot": s} for s in range(golden.slots)]
    final.append({"op": Op.COUNT.value})
    cmds += final
    expected += [golden.command(c) for c in final]
    await check_commands(dut, layout_fields(command_layout(params["stamp_width"])),
                         layout_fields(response_layout(params["stamp_width"])), cmds, expected,
                         seed=p["seed"], idle=p["idle"], stall=p["stall"])

    # The run must have covered what it claims to (a test that cannot fail is a defect).
    statuses = {Status(r["status"]).name for r in expected}
    dut._log.info(f"{len(cmds)} commands; {golden.evictions} evictions; {sorted(statuses)}")
    assert statuses == {status.name for status in Status}
    assert golden.evictions > 0
