"""The SDR SDRAM controller: PHY, power-up sequence, refresher, one bank machine per bank,
the command multiplexer and the port arbiter with each port's data FIFOs.

Golden model: :class:`ringkv.host.golden.sdram.SdramGolden` (what the ports read back);
the pin-level model :class:`ringkv.sim.sdram_model.SdramModel` checks the chip's rules.
"""

import math

from amaranth import *
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int, check_pow2, check_type
from ringkv.defs.sdram import (
    DEFAULT_CHIP,
    SdramChip,
    check_burst_length,
    check_cas_latency,
    check_rate,
    mode_register,
)

from .arbiter import PortArbiter, UserPortSignature
from .bank import BANK_BUGS, BankMachine, chunk_layout
from .init import INIT_BUGS, SdramInit
from .multiplexer import MUX_BUGS, Multiplexer
from .phy import SdramPhy, SdramPinsSignature
from .refresher import REFRESH_BUGS, Refresher

__all__ = ["SdramController", "BUGS", "refresh_interval_clocks", "read_latency"]

#: every deliberately broken variant (private knob ``_bug``), each caught by the pin-level
#: model or by the data read back (tests/hw/sdram/test_controller.py)
BUGS = (*INIT_BUGS, *REFRESH_BUGS, *BANK_BUGS, *MUX_BUGS, "burst_length", "cas_latency", "dqm")

#: the refresher runs this much faster than the datasheet's average interval, so that refreshes
#: that wait for a grant still make ``refreshes`` per refresh period
REFRESH_MARGIN = 7 / 8


def refresh_interval_clocks(chip: SdramChip, tck_ns: float) -> int:
    """Clocks between refreshes: the datasheet's average (64 ms / 8192) times 7/8."""
    return math.floor(chip.refresh_ns / chip.refreshes / tck_ns * REFRESH_MARGIN)


def read_latency(cl: int, read_delay: int = 0, rate: int = 1) -> int:
    """Clocks from the READ's issue in the multiplexer to its first word in the PHY's input
    register: the command register, the PHY's output register, then ``CL``, and
    ``read_delay`` more when the input register takes the word an edge later (an SDRAM clock
    lagging by nearly a period: ``docs/blocks/sdram.md``, "The clock and its phase").

    At ``rate`` 2 (``CL`` and ``read_delay`` in SDRAM clocks) to the PHY's ``rdata`` register
    holding the burst's first two words: the command register, the PHY's output register in
    the middle of the next clock, ``CL + read_delay`` SDRAM clocks, and the pairing of
    :func:`~ringkv.hw.sdram.phy.half_rate_read_even` (half a clock more when the first word
    comes at a fast edge between the controller's)."""
    check_rate(rate)
    if rate == 1:
        return cl + 2 + read_delay
    return -(-(5 + cl + read_delay) // 2)


class SdramController(wiring.Component):
    """An SDR SDRAM controller for one x16 chip with ``ports`` stream-shaped burst ports.

    Parameters
    ----------
    chip : SdramChip
        Geometry and timings (``ringkv.defs.sdram.CHIPS``).
    tck_ns : float
        The controller's clock period; every timing is rounded up to whole clocks of it.
    cl : int
        CAS latency, 2 or 3 (the chip must allow it at the SDRAM clock, ``tck_ns / rate``).
    bl : int
        Burst length, 1, 2, 4 or 8 16-bit words (sequential bursts): a transfer is whole
        bursts; at ``rate`` 2 at least 2.
    rate : int
        1: the SDRAM clock is the controller's, one 16-bit word a clock. 2: a half-rate PHY
        (``docs/blocks/sdram.md``, "Half rate"): the SDRAM and the PHY's registers run at twice
        the controller's clock, in the domain ``fast_domain`` (every other edge of it on the
        controller's, from the same PLL), and the ports move two words a clock (32 bits, the
        word at the even address in the low half). The bank machines, the multiplexer, the
        refresher and the power-up sequence run at the controller's clock and issue one command
        a clock, in the first of its two SDRAM clocks.
    ports : int
        User ports (``port[i]``, each a flipped :class:`UserPortSignature`).
    count_bits : int
        Width of a command's burst count.
    queue_depth : int
        Bursts each bank machine holds (the look-ahead).
    fifo_depth : int
        Words of each port's write and read FIFO (a power of two, at least ``2 * bl``).
    read_delay : int
        0, or 1: the PHY's input register takes each read word one edge later than ``CL``
        after the READ (for an SDRAM clock that lags the system clock by nearly a whole
        period, where no phase lets it take the word after ``CL``: the board at 60 MHz,
        ``docs/BOARD.md``); the read latency and the read-to-write turnaround grow by one
        clock. On the pin model: ``amaranth_sdram(..., pin_delay=1)``.
    pads : optional
        The board's SDRAM resource (``platform.request("sdram", 0, dir="-")``): the PHY then
        uses the I/O cells' registers and drives the SDRAM clock from the ``sdram`` domain (the
        PLL output 90 degrees behind ``sync``); see :class:`~.phy.SdramPhy`.

    Ports
    -----
    port[i].cmd : stream {addr, write, count}
        ``addr`` in 16-bit words (row | bank | column), its low ``log2(bl)`` bits ignored;
        ``count`` bursts of ``bl`` words. Taken one command at a time, round robin.
    port[i].w : stream {data, mask}
        The write data of the port's write commands, in order (``16 * rate`` bits a transfer);
        ``mask`` bit set: that byte is not written (DQM).
    port[i].r : stream of ``16 * rate`` bits
        The read data of the port's read commands, in order.
    pins : SdramPinsSignature
        To the SDRAM (through the PHY's registers).
    ready : 1
        The power-up sequence is done (commands are taken before; they wait).

    Latency, throughput, backpressure
    ---------------------------------
    A read of an open row has its first word on ``r`` ``cl + 7`` clocks (``cl + 8`` with
    ``read_delay`` 1) after the command's
    transfer (arbiter 1, bank queue 1, the bank machine's registered decision 1, command
    register 1, PHY output 1, ``cl`` to the PHY's
    input register, read FIFO 2), measured; a closed bank adds ``tRCD``, another open row
    PRECHARGE and ``tRP`` too. The data bus carries one word a clock:
    bursts follow each other without a gap while they hit open rows or rows the bank machines
    opened ahead, and the only gaps are ``CL + BL - BL`` clocks between a READ and a following
    WRITE, refreshes, and row misses on one bank (``docs/blocks/sdram.md`` has the measured
    efficiency). Backpressure: a READ is issued only when its port's read FIFO has room for the
    whole burst and a WRITE only when the whole burst of write data is in the port's write
    FIFO, so the SDRAM never waits inside a burst; a port that withholds its write data or its
    ``r.ready`` holds back the bursts behind its own (column commands keep their order) and,
    for as long as it does, the refresh.
    """

    def __init__(self, chip: SdramChip = DEFAULT_CHIP, *, tck_ns: float = 20.0, cl: int = 3,
                 bl: int = 8, ports: int = 1, count_bits: int = 12, queue_depth: int = 4,
                 fifo_depth: int | None = None, init_refreshes: int | None = None,
                 read_delay: int = 0, rate: int = 1, fast_domain: str = "sync2x", pads=None,
                 _bug=None):
        check_type("Chip", chip, SdramChip)
        check_cas_latency(cl)
        check_burst_length(bl)
        check_rate(rate, bl)
        chip.timing(tck_ns)             # a number, and positive
        timing = chip.timing(tck_ns / rate)
        if tck_ns / rate < chip.min_tck(cl):
            raise ValueError(f"{chip.name} at CAS latency {cl} needs an SDRAM clock period of "
                             f"at least {chip.min_tck(cl)} ns, not {tck_ns / rate:g}")
        check_int("Ports", ports, low=1, high=16)
        check_int("Count width", count_bits, low=1, high=24, unit=" bits")
        check_int("Queue depth", queue_depth, low=1, high=64)
        fifo_depth = max(4 * bl // rate, 16) if fifo_depth is None else fifo_depth
        check_pow2("FIFO depth", fifo_depth, low=max(2 * bl // rate, 2), high=4096)
        check_int("Read delay", read_delay, low=0, high=1, unit=" clocks")
        init_refreshes = chip.init_refreshes if init_refreshes is None else init_refreshes
        check_int("Init refreshes", init_refreshes, low=chip.init_refreshes, high=64)
        if _bug is not None and _bug not in BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {BUGS}")
        self._chip, self._timing, self._tck_ns, self._cl, self._bl = chip, timing, tck_ns, cl, bl
        self._ports, self._count_bits, self._queue_depth = ports, count_bits, queue_depth
        self._fifo_depth, self._init_refreshes, self._bug = fifo_depth, init_refreshes, _bug
        self._pads, self._read_delay = pads, read_delay
        self._rate, self._fast = rate, fast_domain
        self._addr_bits = (chip.words - 1).bit_length()
        super().__init__({
            "port": In(UserPortSignature(self._addr_bits, count_bits, rate)).array(ports),
            "pins": Out(SdramPinsSignature(chip)),
            "ready": Out(1),
        })

    chip = property(lambda self: self._chip)
    #: the chip's timings in SDRAM clocks
    timing = property(lambda self: self._timing)
    #: the controller's clock period
    tck_ns = property(lambda self: self._tck_ns)
    #: the SDRAM's clock period (``tck_ns / rate``)
    sdram_tck_ns = property(lambda self: self._tck_ns / self._rate)
    rate = property(lambda self: self._rate)
    fast_domain = property(lambda self: self._fast)
    cl = property(lambda self: self._cl)
    read_delay = property(lambda self: self._read_delay)
    bl = property(lambda self: self._bl)
    ports = property(lambda self: self._ports)
    addr_bits = property(lambda self: self._addr_bits)
    fifo_depth = property(lambda self: self._fifo_depth)

    def elaborate(self, platform):
        m = Module()
        chip, t, cl, bl, bug = self._chip, self._timing, self._cl, self._bl, self._bug
        rate = self._rate
        tc = t.at_rate(rate)        # in controller clocks
        wide = 16 * rate            # bits of a port's word
        nb, npo = chip.banks, self._ports
        port_bits = (npo - 1).bit_length()
        bank_bits, addr_bits = chip.bank_bits, chip.addr_bits

        mode_bl = bl // 2 if bug == "burst_length" and bl > 1 else (
            2 if bug == "burst_length" else bl)
        mode_cl = (5 - cl) if bug == "cas_latency" else cl
        m.submodules.init = init = SdramInit(
            chip, tc, mode=mode_register(mode_cl, mode_bl), refreshes=self._init_refreshes,
            _bug=bug if bug in INIT_BUGS else None)
        m.submodules.refresher = ref = Refresher(
            tc, refresh_interval_clocks(chip, self._tck_ns),
            _bug=bug if bug in REFRESH_BUGS else None)
        m.submodules.arbiter = arb = PortArbiter(chip, ports=npo, bl=bl,
                                                 count_bits=self._count_bits)
        layout = chunk_layout(chip.row_bits, chip.col_bits, port_bits)
        banks = []
        for b in range(nb):
            bank = BankMachine(b, t, bl=bl, row_bits=chip.row_bits, col_bits=chip.col_bits,
                               bank_bits=bank_bits, addr_bits=addr_bits, port_bits=port_bits,
                               depth=self._queue_depth, rate=rate,
                               _bug=bug if bug in BANK_BUGS else None)
            m.submodules[f"bank{b}"] = bank
            banks.append(bank)
        m.submodules.mux = mux = Multiplexer(t, banks=nb, ports=npo, bl=bl, cl=cl,
                                             read_delay=self._read_delay,
                                             layout=layout, bank_bits=bank_bits,
                                             addr_bits=addr_bits, rate=rate,
                                             _bug=bug if bug in MUX_BUGS else None)
        m.submodules.phy = phy = SdramPhy(chip, pads=self._pads, rate=rate,
                                          fast_domain=self._fast, read_cl=cl,
                                          read_delay=self._read_delay)
        wiring.connect(m, wiring.flipped(self.pins), phy.pins)
        # the order of the bursts, its head registered (as the bank machines' decisions are: a
        # burst is seen by both two clocks after it enters)
        m.submodules.order = order = fifo.SyncFIFOBuffered(width=max(bank_bits, 1),
                                                           depth=nb * self._queue_depth)

        # power-up, refresh; the grant registered (every bank idle and free to precharge in
        # the clock before: no bank can leave that state while a refresh is owed, as the
        # arbiter holds the bursts back)
        grant = Signal()
        m.d.sync += grant.eq(ref.req & Cat(b.idle & b.pre_ok for b in banks).all())
        m.d.comb += [
            self.ready.eq(init.done),
            mux.init_cmd.eq(init.cmd), mux.init_a.eq(init.a), mux.init_done.eq(init.done),
            ref.enable.eq(init.done),
            ref.grant.eq(grant),
            mux.ref_active.eq(ref.active), mux.ref_cmd.eq(ref.cmd), mux.ref_a.eq(ref.a),
            arb.pause.eq(ref.req & ~ref.active),
        ]
        # ports' commands -> arbiter -> bank queues, and the order of the bursts
        for p in range(npo):
            wiring.connect(m, wiring.flipped(self.port[p].cmd), arb.i[p])
        target_ready = Signal()
        for b, bank in enumerate(banks):
            m.d.comb += [bank.req.payload.row.eq(arb.o.payload.row),
                         bank.req.payload.col.eq(arb.o.payload.col),
                         bank.req.payload.write.eq(arb.o.payload.write),
                         bank.req.payload.port.eq(arb.o.payload.port),
                         bank.issued.eq(mux.issue)]
            with m.If(arb.o.payload.bank == b):
                m.d.comb += [bank.req.valid.eq(arb.o.valid & order.w_rdy),
                             target_ready.eq(bank.req.ready)]
            m.d.comb += [mux.banks[b].want_act.eq(bank.want_act),
                         mux.banks[b].want_pre.eq(bank.want_pre),
                         mux.banks[b].col_ready.eq(bank.col_ready),
                         mux.banks[b].head.eq(bank.head)]
        m.d.comb += [
            arb.o.ready.eq(target_ready & order.w_rdy),
            order.w_en.eq(arb.o.valid & arb.o.ready), order.w_data.eq(arb.o.payload.bank),
            mux.order_valid.eq(order.r_rdy), mux.order_bank.eq(order.r_data),
            order.r_en.eq(mux.col),
        ]

        # write data: each port's FIFO; a WRITE takes bl / rate words from it, one a clock, the
        # first with the command
        depth = self._fifo_depth
        bl = bl // rate             # from here on: a burst's clocks, a port's words
        wfifos, rfifos = [], []
        for p in range(npo):
            w = fifo.SyncFIFO(width=wide + wide // 8, depth=depth)
            r = fifo.SyncFIFOBuffered(width=wide, depth=depth)
            m.submodules[f"wfifo{p}"], m.submodules[f"rfifo{p}"] = w, r
            wfifos.append(w)
            rfifos.append(r)
            port = self.port[p]
            m.d.comb += [w.w_data.eq(port.w.payload), w.w_en.eq(port.w.valid),
                         port.w.ready.eq(w.w_rdy),
                         port.r.payload.eq(r.r_data), port.r.valid.eq(r.r_rdy),
                         r.r_en.eq(port.r.ready),
                         mux.wr_ok[p].eq(w.r_level >= bl)]

        wleft = Signal(range(bl))
        wport = Signal(max(port_bits, 1))
        start_write = mux.col & mux.col_write
        writing = start_write | (wleft != 0)
        wsel = Mux(start_write, mux.col_port, wport)
        wword = Signal(wide + wide // 8)
        for p in range(npo):
            with m.If(writing & (wsel == p)):
                m.d.comb += [wfifos[p].r_en.eq(1), wword.eq(wfifos[p].r_data)]
        with m.If(start_write):
            m.d.sync += [wleft.eq(bl - 1), wport.eq(mux.col_port)]
        with m.Elif(wleft != 0):
            m.d.sync += wleft.eq(wleft - 1)

        # the command register: what the multiplexer chose, with its write data
        m.d.sync += [
            phy.dfi.cmd.eq(mux.issue.cmd), phy.dfi.ba.eq(mux.issue.ba),
            phy.dfi.a.eq(mux.issue.a),
            phy.dfi.dq_o.eq(wword[:wide]), phy.dfi.dq_oe.eq(writing),
            phy.dfi.dqm.eq(Mux(~init.done, (1 << wide // 8) - 1,
                               Mux(writing, 0 if bug == "dqm" else wword[wide:], 0))),
        ]

        # read data: a READ's bl words reach the PHY's input register read_latency() clocks
        # after it; a delay line carries (valid, port) to route them to their FIFO
        rleft = Signal(range(bl))
        rport = Signal(max(port_bits, 1))
        start_read = mux.col & ~mux.col_write
        reading = start_read | (rleft != 0)
        rsel = Mux(start_read, mux.col_port, rport)
        with m.If(start_read):
            m.d.sync += [rleft.eq(bl - 1), rport.eq(mux.col_port)]
        with m.Elif(rleft != 0):
            m.d.sync += rleft.eq(rleft - 1)
        latency = read_latency(cl, self._read_delay, rate)
        line_valid = [Signal(name=f"rd_valid{k}") for k in range(latency)]
        line_port = [Signal(max(port_bits, 1), name=f"rd_port{k}") for k in range(latency)]
        m.d.sync += [line_valid[0].eq(reading), line_port[0].eq(rsel)]
        for k in range(1, len(line_valid)):
            m.d.sync += [line_valid[k].eq(line_valid[k - 1]), line_port[k].eq(line_port[k - 1])]
        arrive, arrive_port = line_valid[-1], line_port[-1]
        for p in range(npo):
            # credit: room in the FIFO beyond the words already on their way
            reserved = Signal(range(depth + 1), name=f"rd_reserved{p}")
            issue_p = start_read & (mux.col_port == p)
            arrive_p = arrive & (arrive_port == p)
            m.d.sync += reserved.eq(reserved + Mux(issue_p, bl, 0) - arrive_p)
            m.d.comb += [rfifos[p].w_data.eq(phy.dfi.rdata), rfifos[p].w_en.eq(arrive_p)]
            # registered: the room of the clock before, less a READ issued in it (a word read
            # by the port makes room a clock later; an arriving word was already reserved)
            room = Signal(range(depth + 1), name=f"rd_room{p}")
            rd_ok = Signal(name=f"rd_ok{p}")
            m.d.comb += [room.eq(depth - rfifos[p].w_level - reserved), mux.rd_ok[p].eq(rd_ok)]
            m.d.sync += rd_ok.eq(Mux(issue_p, room >= 2 * bl, room >= bl))
        return m
