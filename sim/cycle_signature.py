"""Cycle signature of the top's byte link: the clock at which every response byte leaves.

A change to the gateware that must keep its timing (a refactor, a split into sub-components)
shows here first: the scenarios of ``tests/hw/top/test_top.py`` run as usual, and while a
:func:`recording` is active every simulation started by :func:`ringkv.sim.top_bench.run_top`
or :class:`ringkv.sim.top_bench.SimPort` is watched by a background process that samples the
``rx`` and ``tx`` handshakes at each clock edge. :func:`signature` turns one simulation into
a list of *segments*: runs of response bytes on consecutive clocks.

* A :func:`run_top` simulation is deterministic: a segment is ``[clock, "hex bytes"]``, the
  clock absolute (clock 0 is the first edge after reset).
* A :class:`SimPort` simulation is fed by a host thread, so when a request arrives depends on
  the wall clock. A segment is ``[clock, bytes]``: the clock relative to the last request byte
  accepted before it, and the number of bytes, not their values (the sequence numbers and the
  device's clock counter differ from run to run). ``STORAGE_STATUS`` responses are left out:
  the host polls it while the power-on recovery scan runs, a varying number of times.

The signatures are checked in (``tests/data/top_cycles/<test>.json``); setting
``RINGKV_UPDATE_CYCLES=1`` rewrites them when a change of timing is intended.
"""

import json
import threading
from contextlib import contextmanager
from pathlib import Path

from ringkv.defs.protocol import RESPONSE_FLAG, Op

__all__ = ["Recorder", "recording", "tap", "signature", "compare", "load", "save"]

_lock = threading.Lock()
_active: list["Recorder"] = []


class Recorder:
    """Collects one entry per simulation started while it is active (:attr:`runs`)."""

    def __init__(self):
        self.runs: list[dict] = []


@contextmanager
def recording():
    """``with recording() as rec:`` -- every top simulation started inside is watched."""
    rec = Recorder()
    with _lock:
        _active.append(rec)
    try:
        yield rec
    finally:
        with _lock:
            _active.remove(rec)


def tap(sim, top, *, relative: bool) -> None:
    """Add the watcher to ``sim`` (a simulator of ``top``) if a recording is active."""
    with _lock:
        recorders = list(_active)
    if not recorders:
        return
    run = {"relative": relative, "rx": [], "tx": []}
    for rec in recorders:
        rec.runs.append(run)
    rx, tx = top.rx, top.tx

    async def watch(ctx):
        clock = 0
        async for _, _, rxv, rxr, txv, txr, byte in ctx.tick().sample(
                rx.valid, rx.ready, tx.valid, tx.ready, tx.payload):
            if rxv and rxr:
                run["rx"].append(clock)
            if txv and txr:
                run["tx"].append((clock, byte))
            clock += 1

    sim.add_testbench(watch, background=True)


def signature(run: dict) -> list[list]:
    """The segments ``[clock, "hex"]`` of one recorded simulation (see the module doc)."""
    events = run["tx"]
    if run["relative"]:
        rx = run["rx"]
        kept, i = [], 0
        for frame in _frames(events):
            if frame[1][1] & ~RESPONSE_FLAG == Op.STORAGE_STATUS.value:
                continue
            for clock, byte in frame:
                while i < len(rx) and rx[i] < clock:
                    i += 1
                if i:
                    kept.append((clock - rx[i - 1], clock, byte))
        events_rel = kept
    else:
        events_rel = [(clock, clock, byte) for clock, byte in events]
    segments: list[list] = []
    last = None
    for shown, clock, byte in events_rel:
        if last is None or clock != last + 1:
            segments.append([shown, 0 if run["relative"] else ""])
        if run["relative"]:
            segments[-1][1] += 1
        else:
            segments[-1][1] += f"{byte:02x}"
        last = clock
    return segments


def _frames(events):
    """Split response bytes ``(clock, byte)`` into frames: SYNC, op, seq, status, a 16-bit
    little-endian length, the payload and a 16-bit CRC."""
    i = 0
    while i + 6 <= len(events):
        length = events[i + 4][1] | events[i + 5][1] << 8
        yield events[i:i + 8 + length]
        i += 8 + length


def load(path) -> list | None:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else None


def save(path, runs: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = [signature(r) for r in runs]
    path.write_text("[\n" + ",\n".join(json.dumps(s, separators=(",", ":")) for s in data)
                    + "\n]\n")


def compare(want: list, runs: list[dict]) -> str | None:
    """``None`` if the recorded ``runs`` have the signature ``want``, else the first difference
    in words."""
    got = [signature(r) for r in runs]
    if len(got) != len(want):
        return f"{len(got)} simulations, the signature has {len(want)}"
    for n, (g, w) in enumerate(zip(got, want)):
        for i, (gs, ws) in enumerate(zip(g, w)):
            if list(gs) != list(ws):
                return (f"simulation {n}, response segment {i}: {str(gs[1])[:32]} at clock "
                        f"{gs[0]}, expected {str(ws[1])[:32]} at clock {ws[0]}")
        if len(g) != len(w):
            return f"simulation {n}: {len(g)} response segments, expected {len(w)}"
    return None
