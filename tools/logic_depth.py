"""Rank the register-to-register paths of a synthesized ECP5 netlist, in minutes instead of a
place and route's half hour.

Usage: ``python tools/logic_depth.py build/ulx3s-85f/ringkv_ulx3s.json [--top 40] [--paths]
[--only NAME]``: the board build's yosys output (``write_json`` after ``synth_ecp5``; a board
build writes it a few minutes in, long before nextpnr's report). One line per distinct (start
register, end register) pair, worst first: the estimated arrival at the end register, the
cells on the path and the two registers' names (``--paths``: every net on the path).

**An estimate, not timing analysis.** Each cell adds a fixed delay (LUT4 0.35 ns, the slice
muxes PFUMX/L6MUX21 0.25 ns, a CCU2C 0.5 ns through its LUT inputs and 0.05 ns along the
carry chain, flip-flop clock-to-out 0.6 ns, a ``DP16KD`` without output register 5.8 ns
clock-to-out) and each net ``0.8 + 0.2 * log2(1 + fanout)`` ns; the dedicated slice and carry
connections cost 0.05 ns. Placement is unknown, so the absolute figures are not nextpnr's (on
the netlist of the 50.49 MHz build, 19.8 ns critical path, the worst estimate was 29.8 ns):
use it to see which paths lead and whether a change shortened them, then confirm with
``ringkv build``.
"""

import argparse
import json
import math
import re
import sys
from collections import defaultdict

__all__ = ["rank", "main"]

CELL_DELAY = {"LUT4": 0.35, "PFUMX": 0.25, "L6MUX21": 0.25, "CCU2C": 0.5,
              "TRELLIS_DPR16X4": 0.6, "MULT18X18D": 4.0, "ALU54B": 4.0}
FF_CLK_Q, RAM_CLK_Q, FAST = 0.6, 5.8, 0.05
SETUP = {"DI": 0.1, "M": 0.1, "CE": 0.3, "LSR": 0.4}
DEDICATED = {("LUT4", "Z", "PFUMX"), ("PFUMX", "Z", "L6MUX21"), ("CCU2C", "COUT", "CCU2C")}
_DERIVED = re.compile(r"_(LUT4|TRELLIS_FF|PFUMX|L6MUX21|CCU2C|TRELLIS_DPR16X4|DP16KD|"
                      r"MULT18X18D)_.*$")


def net_delay(fanout: int) -> float:
    return 0.8 + 0.2 * math.log2(1 + fanout)


def _top_module(netlist):
    mods = netlist["modules"]
    tops = [m for m in mods.values() if m.get("attributes", {}).get("top")]
    return tops[0] if tops else max(mods.values(), key=lambda m: len(m.get("cells", {})))


def rank(netlist: dict, only: str | None = None):
    """``[(arrival_ns, levels, start, end, [(arrival, cell type, fanout, net), ...])]``, worst
    first, one per distinct (start register, end register) pair."""
    mod = _top_module(netlist)
    names = {}
    for name, net in mod["netnames"].items():
        hide = net.get("hide_name", 0)
        for bit in net["bits"]:
            if isinstance(bit, int):
                cur = names.get(bit)
                if (cur is None or (cur[1] and not hide)
                        or (cur[1] == hide and len(name) < len(cur[0]))):
                    names[bit] = (name, hide)
    cells = mod["cells"]
    driver, fanout, inputs = {}, defaultdict(int), defaultdict(list)
    for cname, cell in cells.items():
        dirs = cell.get("port_directions", {})
        for port, bits in cell["connections"].items():
            for bit in bits:
                if not isinstance(bit, int):
                    continue
                if dirs.get(port) == "output":
                    driver[bit] = (cname, port)
                else:
                    fanout[bit] += 1
                    inputs[cname].append((port, bit))
    arrival, via = {}, {}

    def launch(bit):
        cname, port = driver[bit]
        typ = cells[cname]["type"]
        if typ == "TRELLIS_FF":
            return FF_CLK_Q
        if typ == "DP16KD":
            return RAM_CLK_Q
        return 0.0 if typ not in CELL_DELAY else None

    def settle(bit):
        stack = [bit]
        while stack:
            x = stack[-1]
            if x in arrival:
                stack.pop()
                continue
            if x not in driver or launch(x) is not None:
                arrival[x], via[x] = (launch(x) if x in driver else 0.0), None
                stack.pop()
                continue
            cname, port = driver[x]
            typ = cells[cname]["type"]
            ins = inputs[cname]
            if typ == "TRELLIS_DPR16X4":
                ins = [(p, y) for p, y in ins if p.startswith("RAD")]
            elif typ == "CCU2C" and port == "S0":
                ins = [(p, y) for p, y in ins if p[-1] == "0" or p == "CIN"]
            pending = [y for _, y in ins if y not in arrival]
            if pending:
                stack.extend(pending)
                continue
            best, best_in, best_port = 0.0, None, None
            for p, y in ins:
                src = driver.get(y)
                fast = (p == "CIN" or (src is not None
                                       and (cells[src[0]]["type"], src[1], typ) in DEDICATED))
                t = arrival[y] + (FAST if fast else net_delay(fanout[y]))
                if t > best:
                    best, best_in, best_port = t, y, p
            delay = CELL_DELAY[typ]
            if typ == "CCU2C" and best_port == "CIN":
                delay = FAST if port == "COUT" else 0.3
            arrival[x], via[x] = best + delay, best_in
            stack.pop()
        return arrival[bit]

    def short(bit):
        return _DERIVED.sub("", names.get(bit, ("?", 1))[0])

    ends = []
    for cname, cell in cells.items():
        typ = cell["type"]
        if typ not in ("TRELLIS_FF", "DP16KD", "TRELLIS_DPR16X4"):
            continue
        for port, bit in inputs[cname]:
            if ((typ == "TRELLIS_FF" and port not in SETUP)
                    or (typ == "TRELLIS_DPR16X4" and port.startswith("RAD"))
                    or (typ == "DP16KD" and port.startswith(("CLK", "RST")))):
                continue
            t = settle(bit) + net_delay(fanout[bit]) + SETUP.get(port, 0.5)
            ends.append((t, cname, port, bit))
    ends.sort(key=lambda e: -e[0])
    seen, out = set(), []
    for t, cname, port, bit in ends:
        chain, x = [], bit
        while x is not None:
            chain.append(x)
            x = via.get(x)
        q = cells[cname]["connections"].get("Q", [])
        end = short(q[0]) if q and isinstance(q[0], int) else f"{short(bit)}.{port}"
        start = short(chain[-1])
        if (start, end) in seen:
            continue
        seen.add((start, end))
        if only and not any(only in names.get(x, ("",))[0] for x in chain):
            continue
        path = [(arrival[x], cells[driver[x][0]]["type"] if x in driver else "-", fanout[x],
                 names.get(x, ("?", 1))[0]) for x in reversed(chain)]
        out.append((t, len(chain), start, end, path))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="logic_depth.py", description=__doc__.splitlines()[0])
    parser.add_argument("netlist", help="yosys JSON of the synthesized design")
    parser.add_argument("--top", type=int, default=40, help="paths to list (default 40)")
    parser.add_argument("--paths", action="store_true", help="every net of each path")
    parser.add_argument("--only", default=None, help="only paths through a net named so")
    args = parser.parse_args(argv)
    with open(args.netlist) as f:
        ranked = rank(json.load(f), only=args.only)
    for t, levels, start, end, path in ranked[:args.top]:
        print(f"{t:6.2f} ns {levels:3d} cells  {start} -> {end}")
        if args.paths:
            for at, typ, fo, net in path:
                print(f"          {at:6.2f}  {typ:10s} fanout {fo:4d}  {net[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
