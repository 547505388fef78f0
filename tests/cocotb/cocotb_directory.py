"""cocotb on Verilator: the cache directory against its golden model, random ops, idle/stall.

Run by ``tests/hw/store/test_directory_cocotb.py`` through :func:`ringkv.sim.cocotb_run.run_cocotb`.
"""

import random
from collections import Counter

import cocotb

from ringkv.defs.directory import Op, Status
from ringkv.host.golden.directory import GoldenDirectory, random_commands
from ringkv.hw.store.directory import command_layout, layout_fields, response_layout
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import check_commands


def _probe(g):
    """Read every link, then fill up without eviction: reveals the whole final state."""
    reads = [{"op": Op.READ.value, "link": n} for n in range(g.links)]
    fills = [{"op": Op.INSERT.value, "count": 1, "hash": 0x5A5A, "now": 0}
             for _ in range(g.links + 1)]
    return reads + fills


@cocotb.test(timeout_time=20, timeout_unit="sec")
async def random_operations(dut):
    p = cocotb_params()
    params = p["directory"]
    rng = random.Random(p["seed"])
    cmd_fields = layout_fields(command_layout(params["count_width"], params["hash_width"],
                                              params["stamp_width"]))
    resp_fields = layout_fields(response_layout(params["count_width"], params["hash_width"],
                                                params["stamp_width"]))
    golden = GoldenDirectory(**params)
    cmds, expected = random_commands(rng, golden, p["ops"])
    final = _probe(golden)
    cmds += final
    expected += [golden.command(c) for c in final]

    await check_commands(dut, cmd_fields, resp_fields, cmds, expected, seed=p["seed"],
                         idle=p["idle"], stall=p["stall"])

    # The run must have covered what it claims to (a test that cannot fail is a defect).
    ops = Counter((Op(r["op"]).name if r["op"] < 8 else "BAD", Status(r["status"]).name)
                  for r in expected[:p["ops"]])
    evictions = sum(r["evicted"] for r in expected)
    expired = sum(r["expired"] for r in expected)
    dut._log.info(f"{len(cmds)} commands; {evictions} evictions; {expired} expired; "
                  f"hits at chain position > 0: {golden.deep_hits}; {sorted(ops.items())}")
    for key in [("LOOKUP", "OK"), ("LOOKUP", "MISS"), ("LOOKUP", "BAD_COUNT"), ("INSERT", "OK"),
                ("INSERT", "FULL"), ("DELETE", "OK"), ("DELETE", "NOT_LIVE"),
                ("DELETE", "BAD_LINK"), ("TOUCH", "OK"), ("READ", "OK"), ("EXPIRE", "OK"),
                ("INSERT_EXISTING", "OK"), ("INSERT_EXISTING", "BAD_REGION"), ("CLEAR", "OK"),
                ("BAD", "BAD_OP")]:
        assert ops[key] > 0, f"workload never produced {key}"
    assert evictions > 0 and expired > 0 and golden.deep_hits > 0
