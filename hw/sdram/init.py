"""The SDRAM's power-up sequence in gateware.

Golden model: :func:`ringkv.host.golden.sdram.init_commands`.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from ringkv.defs.checks import check_int
from ringkv.defs.sdram import Cmd, SdramChip, SdramTiming

__all__ = ["SdramInit", "INIT_BUGS"]

#: deliberately broken variants (private knob ``_bug``), each caught by the pin-level model
INIT_BUGS = ("power_up", "no_precharge", "refreshes", "no_mode", "tmrd")


class SdramInit(wiring.Component):
    """Power-up: ``power_up`` clocks of INHIBIT, PRECHARGE ALL, ``tRP``, ``refreshes`` times
    (AUTO REFRESH, ``tRFC``), LOAD MODE REGISTER (``mode``), ``tMRD``, then ``done``.

    Ports: ``cmd``/``ba``/``a`` the command of this clock (INHIBIT when none), ``done`` high
    from the first clock the bus is free for the controller. Takes
    ``power_up + rp + refreshes * rfc + mrd + 1`` clocks after reset; nothing to back-press.
    """

    cmd: Out(4, init=Cmd.INHIBIT.value)
    a: Out(13)
    done: Out(1)

    def __init__(self, chip: SdramChip, timing: SdramTiming, *, mode: int, refreshes: int,
                 _bug=None):
        check_int("Refreshes", refreshes, low=chip.init_refreshes, high=64)
        if _bug is not None and _bug not in INIT_BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {INIT_BUGS}")
        self._t, self._mode, self._bug = timing, mode, _bug
        self._refreshes = refreshes - 1 if _bug == "refreshes" else refreshes
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        t, bug = self._t, self._bug
        power_up = t.power_up // 2 if bug == "power_up" else t.power_up
        mrd = t.mrd - 1 if bug == "tmrd" else t.mrd
        wait = Signal(range(max(power_up, t.rp, t.rfc, t.mrd) + 2), init=power_up)
        left = Signal(range(self._refreshes + 1), init=self._refreshes)
        m.d.comb += self.cmd.eq(Cmd.INHIBIT.value)
        with m.If(wait != 0):
            m.d.sync += wait.eq(wait - 1)
        with m.FSM():
            with m.State("POWER_UP"):
                with m.If(wait == 0):
                    if bug == "no_precharge":
                        m.next = "REFRESH"
                    else:
                        m.d.comb += [self.cmd.eq(Cmd.PRECHARGE.value), self.a.eq(1 << 10)]
                        m.d.sync += wait.eq(t.rp - 1)
                        m.next = "REFRESH"
            with m.State("REFRESH"):
                with m.If(wait == 0):
                    with m.If(left != 0):
                        m.d.comb += self.cmd.eq(Cmd.REFRESH.value)
                        m.d.sync += [wait.eq(t.rfc - 1), left.eq(left - 1)]
                    with m.Else():
                        if bug == "no_mode":
                            m.next = "DONE"
                        else:
                            m.d.comb += [self.cmd.eq(Cmd.MODE.value), self.a.eq(self._mode)]
                            m.d.sync += wait.eq(mrd - 1)
                            m.next = "MODE"
            with m.State("MODE"):
                with m.If(wait == 0):
                    m.d.comb += self.done.eq(1)
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
        return m
