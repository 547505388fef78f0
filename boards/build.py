"""``ringkv build --board ulx3s-85f``: bitstream, utilisation and Fmax from nextpnr's report.

Uses ``amaranth-boards``' ``ULX3S_85F_Platform`` with the PyPI yowasp tools (yosys,
nextpnr-ecp5, ecppack; :mod:`ringkv.sim.toolchain` sets ``YOSYS``/``NEXTPNR_ECP5``/``ECPPACK``
and ``OPENFPGALOADER=true`` so the build never tries to program). nextpnr gets the PLL output's
clock constraint from the design and writes ``report.json``; the build fails if timing is not
met. The yosys script runs :data:`ringkv.boards.synth.AFTER_READ` after reading the design.
Load the bitstream with ``openFPGALoader --board ulx3s build/ulx3s-85f/ringkv_ulx3s.bit``.
"""

import argparse
import json
import sys
from pathlib import Path

from ringkv.sim.toolchain import setup_environ

from .synth import AFTER_READ

__all__ = ["build", "main", "BOARDS"]

BOARDS = {"ulx3s-85f": "ULX3S_85F_Platform"}
_REPO = Path(__file__).resolve().parent.parent


def build(board: str = "ulx3s-85f", *, sys_mhz: float = 40.0, regions: int = 4096,
          build_dir=None, seed: int = 1, storage: str = "sd4") -> dict:
    """Build the bitstream; return ``{"fmax_mhz", "target_mhz", "utilization", "bitstream"}``."""
    if board not in BOARDS:
        raise ValueError(f"unknown board {board!r}; known: {sorted(BOARDS)}")
    setup_environ()
    import amaranth_boards.ulx3s as ulx3s

    from .ulx3s import ULX3STop
    platform = getattr(ulx3s, BOARDS[board])()
    build_dir = Path(build_dir or _REPO / "build" / board)
    top = ULX3STop(sys_mhz=sys_mhz, regions=regions, storage=storage)
    name = "ringkv_ulx3s"
    platform.build(top, name=name, build_dir=str(build_dir), do_program=False,
                   script_after_read="\n".join(AFTER_READ),
                   nextpnr_opts=f"--report report.json --seed {seed}")
    return report_figures(build_dir, top, board=board, name=name)


def report_figures(build_dir, top, *, board="ulx3s-85f", name="ringkv_ulx3s") -> dict:
    """The figures of a finished build, read from nextpnr's ``report.json``."""
    build_dir = Path(build_dir)
    report = json.loads((build_dir / "report.json").read_text())
    fmax = report.get("fmax", {})
    clock = max(fmax.values(), key=lambda c: c["constraint"]) if fmax else None
    util = {k: v for k, v in report.get("utilization", {}).items()
            if k in ("TRELLIS_COMB", "TRELLIS_FF", "DP16KD", "MULT18X18D", "EHXPLLL",
                     "TRELLIS_IO")}
    return {"board": board, "fmax_mhz": round(clock["achieved"], 2) if clock else None,
            "target_mhz": round(clock["constraint"], 2) if clock else None,
            "utilization": util, "bitstream": str(build_dir / f"{name}.bit"),
            "config": dict(top.config.__dict__), "regions": top.top.regions,
            "uart_baud": top.baud, "sd_mode": top.storage,
            # the SD clock in either mode (the key predates the native mode)
            "sd_spi_mhz": round(top.sys_hz / 2 / top.sd_half / 1e6, 3)}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="ringkv build", description=__doc__.splitlines()[0])
    parser.add_argument("--board", default="ulx3s-85f", choices=sorted(BOARDS))
    parser.add_argument("--sys-mhz", type=float, default=40.0)
    parser.add_argument("--regions", type=int, default=4096)
    parser.add_argument("--storage", default="sd4", choices=["sd4", "spi"],
                        help="SD card mode: native 4-bit (default) or SPI")
    args = parser.parse_args(argv)
    result = build(args.board, sys_mhz=args.sys_mhz, regions=args.regions,
                   storage=args.storage)
    print(json.dumps(result, indent=1))
    print(f"timing: {result['fmax_mhz']} MHz achieved for {result['target_mhz']} MHz; "
          f"bitstream {result['bitstream']}")
    return 0 if result["fmax_mhz"] and result["fmax_mhz"] >= result["target_mhz"] else 1


if __name__ == "__main__":
    sys.exit(main())
