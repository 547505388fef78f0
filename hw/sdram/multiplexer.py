"""The command multiplexer: which command goes on the bus in each clock.

No golden model of its own: what it issues is checked against every rule of the chip by the
pin-level model (``ringkv.sim.sdram_model``) and its order by the data the ports read back.
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int
from ringkv.defs.sdram import (
    Cmd,
    SdramTiming,
    check_burst_length,
    check_cas_latency,
    check_rate,
)

from .bank import issue_layout

__all__ = ["Multiplexer", "BankRequestSignature", "MUX_BUGS"]

MUX_BUGS = ("trrd", "turnaround")


class BankRequestSignature(wiring.Signature):
    """What a bank machine asks of the multiplexer (from the bank machine's side)."""

    def __init__(self, layout: data.StructLayout):
        super().__init__({"want_act": Out(1), "want_pre": Out(1), "col_ready": Out(1),
                          "head": Out(layout)})


class Multiplexer(wiring.Component):
    """Chooses the command of each clock, by priority:

    1. the power-up sequence (``init_*``) until ``init_done``;
    2. the refresher while ``ref_active``;
    3. READ/WRITE of the oldest burst (the bank at the head of ``order``), when its bank is
       ``col_ready``, its port can take it (``wr_ok``: a whole burst of write data waits;
       ``rd_ok``: room for a whole burst of read data) and the data bus allows it: ``BL``
       clocks after the last READ/WRITE, ``CL + BL`` after a READ for a WRITE (the SDRAM's
       read data must leave the bus before the controller drives it);
    4. ACTIVE or PRECHARGE for a bank that wants one, the oldest burst's bank first, then by
       bank number; ACTIVE also ``tRRD`` after the last ACTIVE.

    Column commands are thus issued in the order the bursts were taken, so read data comes
    back in order; row commands of younger bursts go ahead (look-ahead), which is what hides
    ``tRP`` and ``tRCD`` of the next bank behind the current burst. Combinational: ``issue``
    is the command of this clock; ``col_port``/``col_write`` name the burst of a column command.

    ``rate`` 2 (a half-rate PHY): ``timing``, ``bl``, ``cl`` and ``read_delay`` are the SDRAM's
    (its clock, its words); the multiplexer chooses one command a clock, which the PHY issues
    in the first of the clock's two SDRAM clocks, and every interval above is rounded up to
    whole clocks of the multiplexer (a burst of ``bl`` words takes ``bl / 2`` of them).
    """

    def __init__(self, timing: SdramTiming, *, banks: int, ports: int, bl: int, cl: int,
                 layout: data.StructLayout, bank_bits: int, addr_bits: int,
                 read_delay: int = 0, rate: int = 1, _bug=None):
        check_int("Banks", banks, low=1, high=8)
        check_int("Ports", ports, low=1, high=16)
        check_burst_length(bl)
        check_cas_latency(cl)
        check_rate(rate, bl)
        if _bug is not None and _bug not in MUX_BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {MUX_BUGS}")
        self._t, self._banks, self._ports, self._bl, self._cl = timing, banks, ports, bl, cl
        self._bank_bits, self._bug, self._read_delay = bank_bits, _bug, read_delay
        self._rate = rate
        super().__init__({
            "init_cmd": In(4), "init_a": In(addr_bits), "init_done": In(1),
            "ref_active": In(1), "ref_cmd": In(4), "ref_a": In(addr_bits),
            "banks": In(BankRequestSignature(layout)).array(banks),
            "order_valid": In(1), "order_bank": In(max(bank_bits, 1)),
            "wr_ok": In(ports), "rd_ok": In(ports),
            "issue": Out(issue_layout(bank_bits, addr_bits)),
            "col_port": Out(max((ports - 1).bit_length(), 1)), "col_write": Out(1),
            "col": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        t, cl, rate = self._t, self._cl, self._rate

        def ck(sdram_clocks):       # in clocks of the multiplexer, rounded up
            return -(-sdram_clocks // rate)

        bl = ck(self._bl)           # clocks of a burst on the data bus
        # (with read_delay the SDRAM takes the WRITE's data as late as its commands, but its
        # last read word reaches the FPGA's pins a clock later: one clock more before the FPGA
        # drives DQ)
        read_to_write = bl if self._bug == "turnaround" else ck(cl + self._bl + self._read_delay)
        rrd = ck(t.rrd)
        issue = self.issue
        rd_wait = Signal(range(max(bl, 2)))
        wr_wait = Signal(range(read_to_write + 1))
        rrd_wait = Signal(range(max(rrd, 2)))
        for c in (rd_wait, wr_wait, rrd_wait):
            with m.If(c != 0):
                m.d.sync += c.eq(c - 1)

        head = Signal.like(self.banks[0].head)
        head_col_ready = Signal()
        for b in range(self._banks):
            with m.If(self.order_bank == b):
                m.d.comb += [head.eq(self.banks[b].head),
                             head_col_ready.eq(self.banks[b].col_ready)]
        port_ok = Mux(head.write, self.wr_ok.bit_select(head.port, 1),
                      self.rd_ok.bit_select(head.port, 1))
        bus_ok = Mux(head.write, wr_wait == 0, rd_wait == 0)
        col = self.order_valid & head_col_ready & port_ok & bus_ok

        # row commands: the oldest burst's bank first, then by number (the last If wins)
        row_cmd = Signal(4, init=Cmd.INHIBIT.value)
        row_bank = Signal(max(self._bank_bits, 1))
        row_a = Signal.like(issue.a)
        order = list(reversed(range(self._banks)))
        act_ok = (rrd_wait == 0) if self._bug != "trrd" else C(1)
        for b in order:
            bank = self.banks[b]
            with m.If(bank.want_pre):
                m.d.comb += [row_cmd.eq(Cmd.PRECHARGE.value), row_bank.eq(b), row_a.eq(0)]
            with m.Elif(bank.want_act & act_ok):
                m.d.comb += [row_cmd.eq(Cmd.ACTIVE.value), row_bank.eq(b),
                             row_a.eq(bank.head.row)]
        for b in range(self._banks):
            bank = self.banks[b]
            with m.If((self.order_valid & (self.order_bank == b))
                      & (bank.want_pre | (bank.want_act & act_ok))):
                m.d.comb += [row_cmd.eq(Mux(bank.want_pre, Cmd.PRECHARGE.value,
                                            Cmd.ACTIVE.value)),
                             row_bank.eq(b), row_a.eq(Mux(bank.want_pre, 0, bank.head.row))]

        with m.If(~self.init_done):
            m.d.comb += [issue.cmd.eq(self.init_cmd), issue.a.eq(self.init_a)]
        with m.Elif(self.ref_active):
            m.d.comb += [issue.cmd.eq(self.ref_cmd), issue.a.eq(self.ref_a)]
        with m.Elif(col):
            m.d.comb += [issue.cmd.eq(Mux(head.write, Cmd.WRITE.value, Cmd.READ.value)),
                         issue.ba.eq(self.order_bank), issue.a.eq(head.col),
                         self.col.eq(1), self.col_port.eq(head.port),
                         self.col_write.eq(head.write)]
            with m.If(head.write):
                m.d.sync += [rd_wait.eq(bl - 1), wr_wait.eq(bl - 1)]
            with m.Else():
                m.d.sync += [rd_wait.eq(bl - 1), wr_wait.eq(read_to_write - 1)]
        with m.Else():
            m.d.comb += [issue.cmd.eq(row_cmd), issue.ba.eq(row_bank), issue.a.eq(row_a)]
            with m.If(row_cmd == Cmd.ACTIVE.value):
                m.d.sync += rrd_wait.eq(rrd - 1)
        return m
