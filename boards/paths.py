"""The latest endpoints of a routed build, from nextpnr's detailed timing report.

nextpnr's ``--report`` names one critical path per clock. With ``--detailed-timing-report``
(``ringkv build`` passes it) the report also lists, for every net into a timing endpoint (a
flip-flop's ``DI``/``M``/``CE``/``LSR``, a block RAM's address, data and write-enable pins, a
distributed RAM's write port), that endpoint's data arrival: the latest and earliest path from
any launching register, clock-to-out, logic and routing included, to the pin (a pin's setup
time, 0 on a flip-flop's data input and up to 0.14 ns on a block RAM's, comes on top). This
module ranks those endpoints against a clock and folds the bits of one register or one RAM
into one line (``pay_left_TRELLIS_FF_Q_18`` into ``pay_left``, ``kv_mem.0.13`` into
``kv_mem``), so that the blocks to cut show at a glance.

Unlike ``tools/logic_depth.py``'s estimate on the synthesized netlist, these are the placed and
routed figures of the very build; but they name ends, not starts: ``tools/logic_depth.py
--only NAME`` on the build's netlist lists the starts of a register's deepest paths.

Usage: ``python -m ringkv.boards.paths build/ulx3s-85f/report.json [--mhz 60]
[--margin-pct 10] [--top 30] [--clock NAME]``. ``--mhz`` defaults to the ``target_mhz`` of the
``figures.json`` beside the report (the system clock ``ringkv build`` was asked for), else to
the clock's constraint in the report.
"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from ringkv.host.errors import ArgumentParser, UsageError, run_main

__all__ = ["endpoints", "groups", "group_name", "main"]

_FF_BIT = re.compile(r"_TRELLIS_FF_Q(_\d+)?$")
_RAM_TILE = re.compile(r"(\$\d+)?(\.\d+)+$")
_PIN_BIT = re.compile(r"\d+$")


def group_name(cell: str, port: str) -> tuple[str, str]:
    """``(register or memory, pin kind)`` of an endpoint: the bit's or the tile's index taken
    off the cell name, the bit index off the pin (``DIA12`` -> ``DIA``)."""
    base = _FF_BIT.sub("", cell)
    if base == cell:
        base = _RAM_TILE.sub("", cell)
    return base, _PIN_BIT.sub("", port)


def endpoints(report: dict, clock: str | None = None) -> tuple[str, list]:
    """``(clock event, [(latest arrival ns, cell, port), ...])``, latest first, for the
    endpoints clocked by ``clock`` (a substring of the event, e.g. ``por_clk``; default: the
    clock with the most endpoints). Raises ``ValueError`` when the report has no detailed
    timings (a build without ``--detailed-timing-report``) or no endpoint on that clock."""
    nets = report.get("detailed_net_timings")
    if nets is None:
        raise ValueError("the report has no detailed net timings: nextpnr ran without "
                         "--detailed-timing-report")
    by_event = defaultdict(list)
    for net in nets:
        for end in net.get("endpoints", []):
            by_event[end["event"]].append((float(end["delay"][1]), end["cell"], end["port"]))
    events = [e for e in by_event if e != "<async>"]
    if clock is not None:
        events = [e for e in events if clock in e]
    if not events:
        known = ", ".join(sorted(by_event)) or "none"
        raise ValueError(f"no endpoint on clock {clock!r} in the report (clocks: {known})")
    event = max(events, key=lambda e: len(by_event[e]))
    return event, sorted(by_event[event], key=lambda e: (-e[0], e[1], e[2]))


def groups(ends: list, limit_ns: float) -> list[dict]:
    """The endpoints folded by :func:`group_name`, latest first: ``{"name", "pin", "worst_ns",
    "late" (endpoints later than ``limit_ns``), "bits"}``."""
    folded = {}
    for t, cell, port in ends:
        key = group_name(cell, port)
        g = folded.setdefault(key, {"name": key[0], "pin": key[1], "worst_ns": t, "late": 0,
                                    "bits": 0})
        g["worst_ns"] = max(g["worst_ns"], t)
        g["bits"] += 1
        g["late"] += t > limit_ns
    return sorted(folded.values(), key=lambda g: (-g["worst_ns"], g["name"], g["pin"]))


def _target_mhz(report_path: Path, report: dict, event: str) -> float:
    figures = report_path.with_name("figures.json")
    if figures.exists():
        target = json.loads(figures.read_text()).get("target_mhz")
        if target:
            return float(target)
    for name, clk in report.get("fmax", {}).items():
        if name in event:
            return float(clk["constraint"])
    raise UsageError(f"no clock target for {event}: pass --mhz")


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m ringkv.boards.paths",
                            description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="nextpnr's report.json of a routed build")
    parser.add_argument("--mhz", type=float, default=None,
                        help="the clock to rank against (default: the build's target)")
    parser.add_argument("--margin-pct", type=float, default=10.0,
                        help="an endpoint is late past (1 - margin) of the period (default 10)")
    parser.add_argument("--top", type=int, default=30, help="groups to list (default 30)")
    parser.add_argument("--clock", default=None,
                        help="a substring of the clock's name (default: the busiest clock)")
    args = parser.parse_args(argv)
    if args.mhz is not None and args.mhz <= 0:
        raise UsageError("--mhz must be positive")
    if not 0 <= args.margin_pct < 100:
        raise UsageError("--margin-pct must be in [0, 100)")
    try:
        report = json.loads(args.report.read_text())
    except FileNotFoundError:
        raise UsageError(f"no such report: {args.report}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{args.report} is not JSON: {e}") from None
    try:
        event, ends = endpoints(report, args.clock)
    except ValueError as e:
        raise UsageError(str(e)) from None
    mhz = args.mhz or _target_mhz(args.report, report, event)
    period = 1000.0 / mhz
    limit = period * (1 - args.margin_pct / 100)
    late = sum(t > limit for t, _, _ in ends)
    print(f"{event}: {len(ends):,} endpoints; against {mhz:g} MHz ({period:.2f} ns) with "
          f"{args.margin_pct:g} % margin, {late:,} arrive later than {limit:.2f} ns; "
          f"the latest {ends[0][0]:.2f} ns ({ends[0][1]}.{ends[0][2]})")
    print(f"{'latest ns':>9}  {'late':>5}  {'bits':>5}  endpoint")
    for g in groups(ends, limit)[:args.top]:
        print(f"{g['worst_ns']:9.2f}  {g['late']:5d}  {g['bits']:5d}  {g['name']}.{g['pin']}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, prog="ringkv.boards.paths"))
