"""The refresher: an AUTO REFRESH every refresh interval, with all banks closed first.

Golden model: :func:`ringkv.host.golden.sdram.refresh_interval`.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int
from ringkv.defs.sdram import Cmd, SdramTiming

__all__ = ["Refresher", "REFRESH_BUGS", "MAX_POSTPONED"]

REFRESH_BUGS = ("refresh_interval", "trfc")
#: refreshes owed before the timer stops counting more (the request is already up)
MAX_POSTPONED = 8


class Refresher(wiring.Component):
    """Counts ``interval`` clocks per refresh from ``enable``; while one is owed it raises
    ``req``. When the controller answers ``grant`` (every bank idle and free to precharge) it
    takes the bus (``active``): PRECHARGE ALL, ``tRP``, AUTO REFRESH, ``tRFC``; ``active``
    falls in the first clock the bus is free again.

    A late refresh does not shift the next: the timer runs on, and up to ``MAX_POSTPONED``
    owed refreshes are kept, so ``refreshes`` commands always span at most
    ``refreshes * interval`` clocks plus the longest wait for a grant.
    """

    enable: In(1)
    grant: In(1)
    req: Out(1)
    active: Out(1)
    cmd: Out(4, init=Cmd.INHIBIT.value)
    a: Out(13)

    def __init__(self, timing: SdramTiming, interval: int, *, _bug=None):
        check_int("Refresh interval", interval, low=timing.rp + timing.rfc + 2)
        if _bug is not None and _bug not in REFRESH_BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {REFRESH_BUGS}")
        self._t, self._bug = timing, _bug
        self._interval = 2 * interval if _bug == "refresh_interval" else interval
        super().__init__()

    interval = property(lambda self: self._interval)

    def elaborate(self, platform):
        m = Module()
        t = self._t
        rfc = t.rfc - 1 if self._bug == "trfc" else t.rfc
        timer = Signal(range(self._interval), init=self._interval - 1)
        owed = Signal(range(MAX_POSTPONED + 1))
        wait = Signal(range(max(t.rp, rfc) + 1))
        tick = Signal()
        done = Signal()
        with m.If(self.enable):
            m.d.sync += timer.eq(Mux(timer == 0, self._interval - 1, timer - 1))
            m.d.comb += tick.eq(timer == 0)
        m.d.sync += owed.eq(owed + (tick & (owed != MAX_POSTPONED)) - done)
        m.d.comb += [self.req.eq(owed != 0), self.cmd.eq(Cmd.INHIBIT.value)]
        with m.If(wait != 0):
            m.d.sync += wait.eq(wait - 1)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.req & self.grant):
                    m.d.comb += [self.active.eq(1), self.cmd.eq(Cmd.PRECHARGE.value),
                                 self.a.eq(1 << 10)]
                    m.d.sync += wait.eq(t.rp - 1)
                    m.next = "PRECHARGED"
            with m.State("PRECHARGED"):
                m.d.comb += self.active.eq(1)
                with m.If(wait == 0):
                    m.d.comb += self.cmd.eq(Cmd.REFRESH.value)
                    m.d.sync += wait.eq(rfc - 1)
                    m.next = "REFRESHING"
            with m.State("REFRESHING"):
                with m.If(wait == 0):
                    m.d.comb += done.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += self.active.eq(1)
        return m
