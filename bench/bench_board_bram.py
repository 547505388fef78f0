"""Block RAM budget of the board top per numerics: does a device fit the ULX3S-85F's 208 DP16KD?

The board top (:class:`~ringkv.boards.ulx3s.ULX3STop`, default shape, 4096 regions, P=4, M=8)
is synthesized by yosys alone (the board build's own script through amaranth-boards' platform,
``synth_ecp5 -noflatten -run begin:map_gates``: every block keeps its module, and synthesis stops
once memories and multipliers are mapped, before the logic mapping; no placement: a few
minutes against most of an hour for the bitstream build,
:func:`ringkv.boards.synth.synth_board_cells`)
in the board's numerics (``ringkv-fx1c``: ``TRAINED_CONFIG``) and in ``ringkv-fx2``. What is
reported is yosys' cell count after technology mapping: the DP16KD per block (the attention
core's ring banks and exp tables, token memory, directory, DMA, link) and in all, against the
LFE5U-85F's 208. ``board.fx2_fits`` is 1 when fx2's total is at most 208 (nextpnr's packing
never needs fewer DP16KD than yosys maps), 0 otherwise.
"""

import dataclasses
import time

from bench.run import table

TITLE = "Block RAM budget of the board top: ringkv-fx1c (the board's numerics) and ringkv-fx2"

DP16KD_AVAILABLE = 208      # LFE5U-85F
#: the smoke run (``run(smoke=True)``): the reduced board top of ``make gatesim`` (every block,
#: small: 4 regions, P=2, M=4) in both numerics, through the same yosys flow
SMOKE_TOP = {"regions": 4, "lanes": 2, "macs": 4}


def blocks(modules: dict) -> dict:
    """DP16KD per block of ``RingKVTop`` (``<top>.top.<block>...`` module names; ``top`` for the
    top's own memories, ``board`` for the rest of the board design)."""
    out = {}
    for name, cells in modules.items():
        n = cells.get("DP16KD", 0)
        if not n:
            continue
        parts = name.split(".")
        if "top" not in parts[1:]:
            block = "board"
        else:
            i = parts.index("top", 1)
            block = parts[i + 1] if i + 1 < len(parts) else "top"
        out[block] = out.get(block, 0) + n
    return out


def run(smoke: bool = False):
    from ringkv.boards.synth import synth_board_cells
    from ringkv.boards.ulx3s import ULX3STop
    from ringkv.defs.config import TRAINED_CONFIG
    from ringkv.sim.cocotb_run import BUILD_ROOT
    from ringkv.sim.gatesim import SMOKE_CONFIG
    results = []
    base, top_kwargs = (SMOKE_CONFIG, SMOKE_TOP) if smoke else (TRAINED_CONFIG, {})
    configs = {"fx1c": base,
               "fx2": dataclasses.replace(base, numerics="ringkv-fx2", qkv_fracs=())}
    for short, config in configs.items():
        t0 = time.monotonic()
        top = ULX3STop(config, **top_kwargs)
        where = BUILD_ROOT / (f"board_synth_smoke_{short}" if smoke else f"board_synth_{short}")
        r = synth_board_cells(top, where, through_ram=True)
        total = r["total"].get("DP16KD", 0)
        results.append({"name": f"board.dp16kd.{short}", "value": total, "unit": "DP16KD",
                        "params": {"numerics": config.numerics, "available": DP16KD_AVAILABLE,
                                   "per_block": blocks(r["modules"]),
                                   "mult18x18d": r["total"].get("MULT18X18D", 0),
                                   "regions": top.top.regions,
                                   "lanes": top_kwargs.get("lanes", 4),
                                   "macs": top_kwargs.get("macs", 8),
                                   "tool": "yosys synth_ecp5 -noflatten -run begin:map_gates "
                                           "(through the block RAM and DSP mapping; no "
                                           "logic mapping, no place and route)",
                                   "yosys_cpu_s": r["yosys_cpu_s"],
                                   "seconds": round(time.monotonic() - t0, 1)}})
    fx2 = results[-1]
    results.append({"name": "board.fx2_fits", "unit": "",
                    "value": int(fx2["value"] <= DP16KD_AVAILABLE),
                    "params": {"dp16kd": fx2["value"], "available": DP16KD_AVAILABLE}})
    return results


def markdown(results):
    by = {r["name"]: r for r in results}
    a, b = by["board.dp16kd.fx1c"], by["board.dp16kd.fx2"]
    names = sorted(set(a["params"]["per_block"]) | set(b["params"]["per_block"]))
    rows = [[n, a["params"]["per_block"].get(n, 0), b["params"]["per_block"].get(n, 0)]
            for n in names]
    rows.append(["**total**", f"**{a['value']}**", f"**{b['value']}**"])
    rows.append(["available (LFE5U-85F)", DP16KD_AVAILABLE, DP16KD_AVAILABLE])
    fits = by["board.fx2_fits"]["value"]
    return (f"The board top (`ULX3STop`: default shape, {a['params']['regions']} regions, "
            f"P={a['params']['lanes']}, M={a['params']['macs']}) synthesized by yosys alone "
            f"({a['params']['tool']}; yosys CPU time {a['params']['yosys_cpu_s']:.0f} s and "
            f"{b['params']['yosys_cpu_s']:.0f} s): DP16KD per block. `ringkv-fx1c` is the "
            f"board build's numerics (the placed and routed figures are in the ULX3S-85F "
            f"section); `ringkv-fx2` doubles the ring banks. `board.fx2_fits` = {fits}: an fx2 "
            f"device at the default shape needs {b['value']} of {DP16KD_AVAILABLE} DP16KD"
            f"{'' if fits else ' and does not fit'}.\n\n"
            + table(["block", "`ringkv-fx1c` DP16KD", "`ringkv-fx2` DP16KD"], rows))
