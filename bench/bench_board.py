"""The full top on the ULX3S-85F: bitstream build, Fmax, slack, utilisation, build time; and
the gate-level simulation of the board top (``make gatesim``): simulator speed and the smoke
scenario's wall time.

The build takes 45-120 minutes here at 60 MHz (single-threaded WASM tools). Set
``RINGKV_BENCH_BOARD_REPORT=1`` to read the figures of the last ``ringkv build`` (its
``figures.json``, or nextpnr's ``report.json``) instead of building again, or
``RINGKV_BENCH_BOARD_KEEP=1`` to keep the build figures already in ``bench/results.json``
(no build, no report needed: only the gate-level figures are measured again); with
``RINGKV_BENCH_BOARD_ADD_SEED=1`` as well, the last ``ringkv build`` (another placement seed of
the same design) joins the seed sweep, ``board.slack_pct_min_seeds`` (the worst slack over the
seeds built).

The build's figures carry their parameters: the system clock (``target_mhz``), the clock
nextpnr placed and routed against (``constrained_mhz``), the placement seed, the shape, and the
SDRAM's part, CAS latency, capture (``read_delay``) and clock phase (``sdram``).

The gate-level smoke (:func:`ringkv.sim.gatesim.smoke`, on its cached build, at the board's
default system clock) runs here unless
``RINGKV_BENCH_GATESIM_REPORT=1``: then the figures of the last ``make gatesim`` are read
(``build/gatesim-run/figures.json``, written by it); ``RINGKV_BENCH_GATESIM_KEEP=1`` keeps the
gate-level figures already in ``bench/results.json`` (a new board build recorded without the
hour-long smoke; the figures keep their own parameters); ``RINGKV_BENCH_GATESIM_SKIP=1`` leaves
the gate-level figures out of the group (the build figures alone; the table then says so). Its
figures, with the system clock the netlist ran at (``sys_mhz``, ``sys_hz``), are
``board.gatesim_cycles_per_s``
(board clock cycles the netlist simulated per second of wall time, the device's own cycle
counter over the two simulator sessions) and ``board.gatesim_scenario_s`` (the scenario's wall
time, both sessions, without the build).
"""

import json
import os

from bench.run import table

TITLE = "Whole device on the ULX3S-85F (board build)"
#: the smoke run (``run(smoke=True)``): the bitstream of the reduced board top of ``make
#: gatesim`` (every block, small) in its own build folder, and the gate-level smoke as usual
SMOKE_TOP = {"regions": 4, "lanes": 2, "macs": 4}


def _gatesim() -> list[dict]:
    from ringkv.boards.build import _REPO
    where = _REPO / "build" / "gatesim-run"
    if os.environ.get("RINGKV_BENCH_GATESIM_SKIP"):
        return []
    if os.environ.get("RINGKV_BENCH_GATESIM_KEEP"):
        kept = _kept(("board.gatesim_cycles_per_s", "board.gatesim_scenario_s"))
        if len(kept) != 2:
            raise RuntimeError("RINGKV_BENCH_GATESIM_KEEP: no gate-level figures in "
                               "bench/results.json to keep")
        return kept
    if os.environ.get("RINGKV_BENCH_GATESIM_REPORT"):
        fig = json.loads((where / "figures.json").read_text())
    else:
        from ringkv.sim.gatesim import SMOKE_CONFIG, SMOKE_TOP, smoke
        ok, fig = smoke(where)
        fig = {"ok": ok, **fig, "config": SMOKE_CONFIG.__dict__, "top": SMOKE_TOP}
    if not fig["ok"]:
        raise RuntimeError(f"the gate-level smoke scenario failed: {fig}")
    params = {k: fig[k] for k in ("sys_mhz", "sys_hz", "sdram_read_delay", "config", "top",
                                  "cycles", "build_s", "when", "load_avg", "cores") if k in fig}
    return [{"name": "board.gatesim_cycles_per_s", "value": fig["cycles_per_s"],
             "unit": "cycles/s", "params": params},
            {"name": "board.gatesim_scenario_s", "value": fig["scenario_s"], "unit": "s",
             "params": params}]


def _kept(names) -> list[dict]:
    """The records ``names`` of the board group already in ``bench/results.json``."""
    from bench.run import RESULTS
    if not RESULTS.exists():
        return []
    return [{k: v for k, v in r.items() if k != "group"}
            for r in json.loads(RESULTS.read_text())
            if r.get("group") == "board" and r["name"] in names]


def _design(params) -> str:
    """What makes two builds the same design for the seed sweep: configuration, storage
    mode, constraint and every cell count."""
    return json.dumps({k: params.get(k) for k in ("config", "regions", "sd_mode",
                                                   "constrained_mhz", "utilization")},
                      sort_keys=True)


def _seed_sweep(fmax_record, build=None) -> list[dict]:
    """``board.slack_pct_min_seeds``: the worst slack over the placement seeds built for this
    design (the kept sweep's seeds whose design equals ``fmax_record``'s, plus ``build``, the
    figures of another seed's ``ringkv build``)."""
    design = _design(fmax_record["params"])
    seeds = {}
    for r in _kept(("board.slack_pct_min_seeds",)):
        if r["params"].get("design") == design:
            seeds.update(r["params"]["by_seed"])
    p = fmax_record["params"]
    seeds[str(p.get("seed", 1))] = {"fmax_mhz": fmax_record["value"],
                                    "slack_pct": round(100 * (1 - p["target_mhz"]
                                                              / fmax_record["value"]), 2)}
    if build is not None:
        if _design(build) != design:
            raise RuntimeError("RINGKV_BENCH_BOARD_ADD_SEED: the last build is another design "
                               "than the recorded board.fmax (configuration, constraint or "
                               "cell counts differ)")
        seeds[str(build.get("seed", 1))] = {"fmax_mhz": build["fmax_mhz"],
                                            "slack_pct": build["slack_pct"]}
    seeds = dict(sorted(seeds.items(), key=lambda kv: int(kv[0])))
    return [{"name": "board.slack_pct_min_seeds",
             "value": min(v["slack_pct"] for v in seeds.values()), "unit": "%",
             "params": {"by_seed": seeds, "design": design}}]


def run(smoke: bool = False):
    from ringkv.boards.build import build, report_figures
    from ringkv.boards.ulx3s import ULX3STop
    if smoke:
        from ringkv.boards.build import _REPO
        from ringkv.sim.gatesim import SMOKE_CONFIG
        r = build("ulx3s-85f", config=SMOKE_CONFIG, **SMOKE_TOP,
                  build_dir=_REPO / "build" / "ulx3s-85f-smoke")
    elif os.environ.get("RINGKV_BENCH_BOARD_KEEP"):
        from bench.run import RESULTS
        kept = _kept(("board.fmax", "board.slack_pct", "board.build_s"))
        if not kept:
            raise RuntimeError("RINGKV_BENCH_BOARD_KEEP: no board build figures in "
                               f"{RESULTS} to keep")
        other = None
        if os.environ.get("RINGKV_BENCH_BOARD_ADD_SEED"):
            from ringkv.boards.build import _REPO
            other = json.loads((_REPO / "build" / "ulx3s-85f" / "figures.json").read_text())
        return kept + _seed_sweep(kept[0], other) + _gatesim()
    elif os.environ.get("RINGKV_BENCH_BOARD_REPORT"):
        from ringkv.boards.build import _REPO
        where = _REPO / "build" / "ulx3s-85f"
        if (where / "figures.json").exists():
            r = json.loads((where / "figures.json").read_text())
        else:
            r = report_figures(where, ULX3STop())
    else:
        r = build("ulx3s-85f")
    params = {k: r[k] for k in ("board", "target_mhz", "constrained_mhz", "utilization",
                                "config", "regions", "uart_baud", "sd_mode", "sd_mhz",
                                "sd_spi_mhz", "sdram") if k in r}
    params["seed"] = r.get("seed", 1)
    out = [{"name": "board.fmax", "value": r["fmax_mhz"], "unit": "MHz", "params": params},
           {"name": "board.slack_pct", "value": r["slack_pct"], "unit": "%",
            "params": {"target_mhz": r["target_mhz"], "fmax_mhz": r["fmax_mhz"],
                       "definition": "1 - target / fmax"}}]
    if "build_s" in r:
        out.append({"name": "board.build_s", "value": r["build_s"], "unit": "s",
                    "params": {"phase_s": r["phase_s"]}})
    return out + _seed_sweep(out[0]) + _gatesim()


def markdown(results):
    by = {x["name"]: x for x in results}
    r = by["board.fmax"]
    p = r["params"]
    u = p["utilization"]
    cfg = ", ".join(f"{k}={v}" for k, v in p["config"].items())
    rows = [[k, u[k]["used"], u[k]["available"], f"{100 * u[k]['used'] / u[k]['available']:.1f} %"]
            for k in ("TRELLIS_COMB", "TRELLIS_FF", "DP16KD", "MULT18X18D", "EHXPLLL",
                      "TRELLIS_IO") if k in u]
    return (f"`make bitstream BOARD=ulx3s-85f`: `RingKVTop` ({cfg}; {p['regions']} storage "
            f"regions) + UART at {p['uart_baud']} baud + SD card in "
            f"{'native 4-bit' if p.get('sd_mode') == 'sd4' else 'SPI'} mode at "
            f"{p.get('sd_mhz', p.get('sd_spi_mhz'))} MHz" + _sdram_text(p.get("sdram"))
            + ", PLL from the 25 MHz oscillator. Placed and routed, not "
            f"out of context. System clock: **{r['value']:.2f} MHz achieved for "
            f"{p['target_mhz']} MHz** (nextpnr report, placement seed {p.get('seed', 1)}"
            + (f"; placed and routed against {p['constrained_mhz']} MHz, an over-constraint "
               f"that makes nextpnr work for margin" if p.get("constrained_mhz", 0)
               > p["target_mhz"] else "") + ")"
            + (f", slack **{by['board.slack_pct']['value']:.1f} %** of the period (target "
               f"10 %)" if "board.slack_pct" in by else "")
            + (f"; build {by['board.build_s']['value'] / 60:.0f} min ("
               + ", ".join(f"{k} {v / 60:.1f}" for k, v in
                           by['board.build_s']['params']['phase_s'].items())
               + " min)" if "board.build_s" in by else "")
            + ".\n\n" + table(["cell", "used", "available", "share"], rows)
            + _seeds_markdown(by)
            + _gatesim_markdown(by))


def _sdram_text(sdram) -> str:
    """The SDRAM's parameters of a build, for the sentence that describes the top."""
    if not sdram:
        return ""
    return (f" + SDRAM ({sdram['part']}, CL {sdram['cl']}, read delay {sdram['read_delay']}, "
            f"its clock {sdram['phase_deg']}° behind the system clock)")


def _seeds_markdown(by) -> str:
    if "board.slack_pct_min_seeds" not in by:
        return ""
    r = by["board.slack_pct_min_seeds"]
    seeds = r["params"]["by_seed"]
    return ("\n\nPlacement seeds built for this design (same netlist, same constraint): "
            + "; ".join(f"seed {k}: {v['fmax_mhz']:.2f} MHz (slack {v['slack_pct']:.1f} %)"
                        for k, v in seeds.items())
            + f"; worst slack **{r['value']:.1f} %** (`board.slack_pct_min_seeds`).")


def _gatesim_markdown(by) -> str:
    if "board.gatesim_cycles_per_s" not in by:
        return ("\n\n`make gatesim` (the gate-level board top at its pins): no figure recorded "
                "(`RINGKV_BENCH_GATESIM_SKIP`); see `docs/BOARD.md`.\n")
    r = by["board.gatesim_cycles_per_s"]
    p = r["params"]
    cfg = ", ".join(f"{k}={v}" for k, v in p["config"].items())
    mhz = p.get("sys_hz", 0) / 1e6
    clock = "the system clock not recorded"
    if mhz:
        clock = f"system clock {mhz:g} MHz" + (
            f", SDRAM read delay {p['sdram_read_delay']}"
            if p.get("sdram_read_delay") is not None else "")
        build = by.get("board.fmax", {}).get("params", {}).get("target_mhz")
        if build and abs(mhz - build) > 0.01:
            clock += f", not the {build:g} MHz of the build above"
    return (f"\n\n`make gatesim`: the `synth_ecp5` netlist of the ULX3S top ({cfg}; "
            f"{p['top']}; {clock}) on Verilator with yosys' ECP5 cell models, at its pins: "
            f"the smoke scenario passed in "
            f"**{by['board.gatesim_scenario_s']['value'] / 60:.1f} min** "
            f"of wall time ({p['cycles']} board clock cycles, "
            f"**{r['value']} cycles/s**; build {p.get('build_s', 0) / 60:.1f} min, cached "
            f"after the first run"
            + (f"; load average {p['load_avg']} on {p['cores']} cores over the run"
               if "load_avg" in p else "") + ").\n")
