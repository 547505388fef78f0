"""The bank machine: one per bank, with its queue of bursts and its open row.

Golden model: :class:`ringkv.host.golden.sdram.BankGolden` (the same decisions, clock by clock).
"""

from amaranth import *
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int
from ringkv.defs.sdram import Cmd, SdramTiming, check_burst_length, check_rate

__all__ = ["BankMachine", "chunk_layout", "issue_layout", "BANK_BUGS"]

#: deliberately broken variants (private knob ``_bug``): each breaks one of the model's rules
BANK_BUGS = ("trcd", "trp", "tras", "trc", "twr", "closed_bank", "open_bank")


def chunk_layout(row_bits: int, col_bits: int, port_bits: int) -> data.StructLayout:
    """One burst of ``BL`` words for one bank: its row, first column, direction and port."""
    return data.StructLayout({"row": row_bits, "col": col_bits, "write": 1,
                              "port": max(port_bits, 1)})


def issue_layout(bank_bits: int, addr_bits: int) -> data.StructLayout:
    """The command issued on the bus in a clock, as every bank machine sees it."""
    return data.StructLayout({"cmd": 4, "ba": max(bank_bits, 1), "a": addr_bits})


class BankMachine(wiring.Component):
    """One bank's queue of bursts (``req``, a FIFO of ``depth``) and its row state.

    Each clock it says what its oldest burst needs: ``want_act`` (no row open, ``tRP`` and
    ``tRC`` passed), ``want_pre`` (another row open, ``tRAS``, ``tWR`` and the last read burst
    passed) or ``col_ready`` (its row open and ``tRCD`` passed); ``head`` is that burst. The
    multiplexer decides; ``issued`` is what went on the bus in this clock (for any bank), and
    the machine updates its row and its counters from that alone, so its state is the bus's.
    A READ/WRITE to this bank pops the burst. Open-page policy: a row stays open until another
    row or a refresh needs the bank. ``idle``: queue empty; ``pre_ok``: PRECHARGE allowed now.

    ``rate`` 2 (a half-rate PHY: ``docs/blocks/sdram.md``, "Half rate"): ``timing`` and ``bl``
    are the SDRAM's (its clock, its words), the machine runs at half the SDRAM clock and issues
    every command in the first SDRAM clock of its own; each interval is rounded up to whole
    clocks of the machine (the write recovery counted from the burst's last word, in the
    second SDRAM clock of a clock).

    Latency: a burst to the open row is ``col_ready`` two clocks after it enters an empty queue
    (the decisions are registered; none is made in the clock after a command to this bank);
    a row miss costs PRECHARGE, ``tRP``, ACTIVE, ``tRCD`` (each ACTIVE/PRECHARGE may issue
    while other banks transfer). ``req.ready`` is low while the queue is full.
    """

    def __init__(self, index: int, timing: SdramTiming, *, bl: int, row_bits: int,
                 col_bits: int, bank_bits: int, addr_bits: int, port_bits: int = 0,
                 depth: int = 4, rate: int = 1, _bug=None):
        check_int("Bank", index, low=0)
        check_burst_length(bl)
        check_rate(rate, bl)
        check_int("Queue depth", depth, low=1, high=64)
        if _bug is not None and _bug not in BANK_BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {BANK_BUGS}")
        self._index, self._t, self._bl, self._depth, self._bug = index, timing, bl, depth, _bug
        self._rate = rate
        self._row_bits, self._bank_bits = row_bits, bank_bits
        layout = chunk_layout(row_bits, col_bits, port_bits)
        super().__init__({
            "req": In(wiring.Signature({"valid": Out(1), "ready": In(1),
                                        "payload": Out(layout)})),
            "issued": In(issue_layout(bank_bits, addr_bits)),
            "head": Out(layout), "want_act": Out(1), "want_pre": Out(1), "col_ready": Out(1),
            "idle": Out(1), "pre_ok": Out(1), "open": Out(1), "row": Out(row_bits),
        })

    def elaborate(self, platform):
        m = Module()
        t, bl, bug = self._t, self._bl, self._bug
        m.submodules.queue = queue = fifo.SyncFIFO(width=len(self.head.as_value()),
                                                   depth=self._depth)
        m.d.comb += [
            queue.w_data.eq(self.req.payload), queue.w_en.eq(self.req.valid),
            self.req.ready.eq(queue.w_rdy),
            self.idle.eq(~queue.r_rdy),
        ]

        # clocks until ACTIVE (tRP after PRECHARGE, tRC after ACTIVE), READ/WRITE (tRCD) and
        # PRECHARGE (tRAS after ACTIVE, the burst after READ, tWR after the last write word)
        # are allowed; loaded with need - 1 in the clock of the command, allowed at zero
        # (in clocks of the machine: SDRAM clocks / rate, rounded up)
        def ck(sdram_clocks):
            return -(-sdram_clocks // self._rate)

        rcd = ck(t.rcd) - 1 if bug == "trcd" else ck(t.rcd)
        rp = ck(t.rp) - 1 if bug == "trp" else ck(t.rp)
        ras = 1 if bug == "tras" else ck(t.ras)
        rc = 1 if bug == "trc" else ck(t.rc)
        wr_pre = ck(bl) if bug == "twr" else ck(bl - 1 + t.wr)
        bl = ck(bl)         # a READ's burst, to its end
        to_act = Signal(range(max(rp, rc, 2)))
        to_col = Signal(range(max(rcd, 2)))
        to_pre = Signal(range(max(ras, bl, wr_pre, 2)))

        def load(counter, need):
            # keep the larger of what is left and the new requirement
            left = Mux(counter != 0, counter - 1, 0)
            return counter.eq(Mux(left > need - 1, left, need - 1))

        for c in (to_act, to_col, to_pre):
            with m.If(c != 0):
                m.d.sync += c.eq(c - 1)

        issued = self.issued
        mine = issued.ba == self._index if self._bank_bits else C(1)
        cmd = issued.cmd
        with m.If(cmd == Cmd.ACTIVE.value):
            with m.If(mine):
                m.d.sync += [self.open.eq(1), self.row.eq(issued.a[:self._row_bits]),
                             load(to_col, rcd), load(to_pre, ras), load(to_act, rc)]
        with m.If(mine & (cmd == Cmd.READ.value)):
            m.d.sync += load(to_pre, bl)
        with m.If(mine & (cmd == Cmd.WRITE.value)):
            m.d.sync += load(to_pre, wr_pre)
        m.d.comb += queue.r_en.eq(mine & ((cmd == Cmd.READ.value) | (cmd == Cmd.WRITE.value)))
        with m.If((cmd == Cmd.PRECHARGE.value) & (mine | issued.a[10])):
            if bug == "closed_bank":
                # PRECHARGE ALL (a refresh) leaves the machine believing its row open
                with m.If(mine):
                    m.d.sync += self.open.eq(0)
            else:
                m.d.sync += self.open.eq(0)
            m.d.sync += load(to_act, rp)

        # The decisions are registered: what the machine says in a clock was computed in the
        # clock before, from its state then, so that the queue's read and the row compare do not
        # run on through the multiplexer's choice into every bank's counters (the controller's
        # longest path at 60 MHz). They stay exact: the counters only count down, so "zero
        # next clock" is "at most one now"; the row, the queue's head and the counters change
        # otherwise only by a command to this bank, and in the clock after one the machine says
        # nothing (a burst that enters an empty queue is seen one clock later, too).
        head = Signal.like(self.head)
        m.d.comb += head.eq(queue.r_data)
        hit = self.open & (self.row == head.row)
        touched = (((cmd == Cmd.ACTIVE.value) | (cmd == Cmd.PRECHARGE.value)
                    | (cmd == Cmd.READ.value) | (cmd == Cmd.WRITE.value)) & mine
                   | ((cmd == Cmd.PRECHARGE.value) & issued.a[10]))
        ask = queue.r_rdy & ~touched
        if bug == "open_bank":
            # a row miss opens the new row without closing the old one
            want_pre, want_act = C(0), ask & ~hit & (to_act <= 1)
        else:
            want_pre = ask & self.open & ~hit & (to_pre <= 1)
            want_act = ask & ~self.open & (to_act <= 1)
        m.d.sync += [
            self.head.eq(head),
            self.col_ready.eq(ask & hit & (to_col <= 1)),
            self.want_pre.eq(want_pre),
            self.want_act.eq(want_act),
        ]
        m.d.comb += self.pre_ok.eq(to_pre == 0)
        return m
