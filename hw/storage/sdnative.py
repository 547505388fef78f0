"""SD card controller in native mode with the 4-bit bus, behind the storage port
(``hw/storage/port.py``).

Bus and clock. ``sd.clk`` is a register toggled every ``half_period`` system clocks (SD CLK =
f_sys / (2 * half_period); ``init_half_period`` during initialisation, <= 400 kHz on a real
card; ``hs_half_period`` once the card has granted high speed). Following the SD spec's
default-speed timing, the controller changes ``cmd.o``/``dat.o`` (registers) in the system clock
in which SD CLK falls, and samples ``cmd.i``/``dat.i`` in the system clock in which SD CLK rises
(the value the card launched after the previous falling edge). In high-speed mode the card
launches after the rising edge; the same sampling point then takes that bit one SD clock later,
which holds as long as the card's output delay (<= 14 ns) plus the board's round trip stays
below one SD clock period minus the input setup time. The controller stops SD CLK (low) when
it must wait: ``rdata`` stalled when the next nibble would complete a byte that cannot be
stored, ``wdata`` late when the next nibble to send is not there yet, and while its own state
machine acts on a finished response or block (the SD spec lets the host stop SD CLK at any time in
native mode; the card only sees a longer clock cycle). Every timeout counts SD clocks, so a
stalled initiator never causes one.

Initialisation (after reset, and before the next command after a timeout or a failed
initialisation): 80 clocks with CMD high, ``CMD0``, ``CMD8`` (``0x1AA``: a card that does not
answer is SD v1, which is SDSC: not supported, ``NOT_READY``), ``ACMD41`` with HCS until the
card is ready (``init_retries`` tries; a card answering CCS = 0, SDSC, is ``NOT_READY``),
``CMD2``, ``CMD3`` (the card's RCA), ``CMD9`` (CSD version 2: ``C_SIZE`` gives the capacity,
exposed on ``sectors`` and checked against every command: ``RANGE``), ``CMD7`` (select, R1b),
``ACMD6`` (4-bit bus), and when ``hs_half_period`` is given, ``CMD6`` (switch function):
check mode first, and only if function 1 of group 1 is supported, set mode; only if the card
reports it switched does the controller use ``hs_half_period`` (``high_speed`` = 1). Then
``half_period`` (or ``hs_half_period``).

Transfers: one sector is ``CMD17`` / ``CMD24``, several ``CMD18`` / ``CMD25`` ... ``CMD12``
(R1b). A write ends with ``CMD13`` (card status) after the last busy phase: its status is OK
only when the card, still there, reports no error from programming the data (a card pulled out
while busy reads as "not busy" on the pulled-up DAT0; ``CMD13`` then times out). Every command
carries its CRC7 (``lib.crc`` CRC7_MMC, bit serial); every response's CRC7 is checked (not R3's,
which has none), as are its index, transmission and end bits and the card status error bits.
Data blocks carry a CRC16 per DAT line (four ``lib.crc`` CRC16_XMODEM, bit serial), checked on
reads (the residue) and sent on writes; after each written block the CRC status token on DAT0 is
checked and the busy phase (DAT0 low) awaited.
Read data may arrive while the command's response is still being received (N_AC may be as
short as 2 clocks): the response and data receivers run in parallel.

Errors, never hangs: no response within ``resp_timeout`` SD clocks, no read data within
``data_timeout`` (both counted from the command's end bit), no CRC status token within
``resp_timeout``, busy for more than ``busy_timeout`` -> ``TIMEOUT`` (the card is initialised
again before the next command); card status error bits in a response -> ``CARD`` (an
``OUT_OF_RANGE`` in ``CMD12``'s response after a read is ignored: cards set it when a
multi-block read reaches the last sector), a write CRC status "write error" -> ``CARD``; a bad
response CRC7/index/end bit (the card may or may not have taken the command: it is initialised
again before the next one), a read CRC16 mismatch, or a write CRC status "CRC error" -> ``CRC``;
``count == 0`` or sectors beyond the card's capacity -> ``RANGE`` (without a card command);
initialisation failed -> ``NOT_READY``. A failed multi-block transfer is stopped with ``CMD12``;
its status is sent at once.

Throughput: 4 bits per SD clock within a block; per block add the start, CRC and end bits (18
clocks) and, for reads, the card's gap between blocks (N_AC), for writes the CRC status token,
the card's busy time and 2 clocks (N_WR); per command 8 idle clocks (N_CC), the command (48
clocks), the card's response latency and the response (48 clocks); ``CMD12`` after a multi-block
transfer and ``CMD13`` after a write the same again. See ``docs/BENCHMARKS.md``
(``storage.sd4.*``).
Backpressure: ``rdata`` may stall, ``wdata`` may be late (SD CLK stops, see above).
Latency of a read: 8 + 48 clocks (command) + N_AC + 1 (start bit) + 2 (first byte) SD clocks.

Structure: the state machine here (initialisation, the commands of a transfer, errors, the
storage port) drives the PHY pieces of ``hw/storage/sdphy.py``, which do the work on the pins:
:class:`~ringkv.hw.storage.sdphy.SDClocker` (SD CLK and its stop),
:class:`~ringkv.hw.storage.sdphy.SDCmdWriter` (commands with CRC7),
:class:`~ringkv.hw.storage.sdphy.SDCmdReader` (responses, CRC7, the CSD fields) and
:class:`~ringkv.hw.storage.sdphy.SDDataPHY` (data blocks both ways, CRC16s, CRC status, busy).

Ports: ``storage`` (In :class:`StoragePortSignature`), ``sd`` (:class:`SDBusSignature`: ``clk``
out, ``cmd.o/oe/i``, ``dat.o/oe/i`` 4 bits), ``ready`` (card initialised), ``sdhc`` (the card
is SDHC/SDXC; always with ``ready``: only those are supported), ``high_speed`` (high speed
granted and used), ``sectors`` (capacity in 512-byte sectors, from the CSD), ``card_type``
(:class:`~ringkv.hw.storage.CardType` from the OCR's CCS bit in the card's ready answer to
``ACMD41``: an SDSC card is reported as such although it is not initialised; ``UNKNOWN``
from the start of each initialisation until that answer).
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int

from .port import (
    SECTOR_BYTES,
    CardType,
    StorageError,
    StorageOp,
    StoragePortSignature,
)
from .sdphy import SDClocker, SDCmdReader, SDCmdWriter, SDDataPHY

__all__ = ["SDBusSignature", "SDNativeController"]

#: card status bits that are errors: OUT_OF_RANGE .. LOCK_UNLOCK_FAILED (not CARD_IS_LOCKED),
#: COM_CRC_ERROR, ILLEGAL_COMMAND, CARD_ECC_FAILED, CC_ERROR, ERROR, AKE_SEQ_ERROR
R1_ERRORS = 0xFDF8_0008
_OUT_OF_RANGE = 1 << 31


def _pin(width):
    return wiring.Signature({"o": Out(width), "oe": Out(1), "i": In(width, init=(1 << width) - 1)})


class SDBusSignature(wiring.Signature):
    """SD bus in native mode, host side: ``clk`` out; ``cmd`` and ``dat`` (4 lines) each with
    ``o``, ``oe`` out and ``i`` in (the inputs read 1 when nothing drives them: pull-ups)."""

    def __init__(self):
        super().__init__({"clk": Out(1), "cmd": Out(_pin(1)), "dat": Out(_pin(4))})


class _Resp(enum.Enum, shape=3):
    NONE = 0
    R1 = 1        # also R6, R7: 48 bits, CRC7, index
    R1B = 2
    R2 = 3        # 136 bits, CRC7 over the register
    R3 = 4        # 48 bits, no CRC, index 111111


class _After(enum.Enum, shape=5):
    CMD0 = 0
    CMD8 = 1
    CMD55 = 2
    ACMD41 = 3
    CMD2 = 4
    CMD3 = 5
    CMD9 = 6
    CMD7 = 7
    CMD55B = 8
    ACMD6 = 9
    CMD6C = 10
    CMD6S = 11
    READ = 12
    WRITE = 13
    CMD12 = 14
    CMD13 = 15


class SDNativeController(wiring.Component):
    """SD card controller, native 4-bit mode; see the module docstring."""

    def __init__(self, *, init_half_period: int = 50, half_period: int = 1,
                 hs_half_period: int | None = None, resp_timeout: int = 64,
                 data_timeout: int = 1 << 21, busy_timeout: int = 1 << 23,
                 init_retries: int = 1 << 12):
        check_int("init_half_period", init_half_period, low=1)
        check_int("half_period", half_period, low=1)
        if hs_half_period is not None:
            check_int("hs_half_period", hs_half_period, low=1)
            if hs_half_period > half_period:
                raise ValueError(f"hs_half_period ({hs_half_period}) must not exceed "
                                 f"half_period ({half_period})")
        check_int("resp_timeout", resp_timeout, low=2)
        check_int("data_timeout", data_timeout, low=2)
        check_int("busy_timeout", busy_timeout, low=2)
        check_int("init_retries", init_retries, low=1)
        if half_period > init_half_period:
            raise ValueError(f"half_period ({half_period}) must not exceed init_half_period "
                             f"({init_half_period})")
        self._init_half_period, self._half_period = init_half_period, half_period
        self._hs_half_period = hs_half_period
        self._resp_timeout, self._data_timeout = resp_timeout, data_timeout
        self._busy_timeout, self._init_retries = busy_timeout, init_retries
        super().__init__({
            "storage": In(StoragePortSignature()),
            "sd": Out(SDBusSignature()),
            "ready": Out(1),
            "sdhc": Out(1),
            "high_speed": Out(1),
            "sectors": Out(33),
            "card_type": Out(CardType),
        })

    @property
    def half_period(self):
        return self._half_period

    @property
    def init_half_period(self):
        return self._init_half_period

    @property
    def hs_half_period(self):
        return self._hs_half_period

    def elaborate(self, platform):
        m = Module()
        st = self.storage
        sd = self.sd

        # ---- PHY pieces (hw/storage/sdphy.py) ----------------------------------------------------
        fast = Signal()
        m.submodules.clocker = clocker = SDClocker(
            init_half_period=self._init_half_period, half_period=self._half_period,
            hs_half_period=self._hs_half_period)
        rise, fall, run = clocker.rise, clocker.fall, clocker.run
        m.d.comb += [clocker.fast.eq(fast), clocker.hs.eq(self.high_speed),
                     sd.clk.eq(clocker.clk)]

        cmd_idx = Signal(6)
        cmd_arg = Signal(32)
        m.submodules.cmd_writer = cmd_w = SDCmdWriter()
        m.d.comb += [cmd_w.index.eq(cmd_idx), cmd_w.arg.eq(cmd_arg), cmd_w.fall.eq(fall),
                     sd.cmd.o.eq(cmd_w.cmd_o), sd.cmd.oe.eq(cmd_w.cmd_oe)]
        tx_go, tx_busy = cmd_w.start, cmd_w.busy

        rx_r2 = Signal()                  # the response due is 136 bits
        m.submodules.cmd_reader = cmd_r = SDCmdReader(resp_timeout=self._resp_timeout)
        m.d.comb += [cmd_r.r2.eq(rx_r2), cmd_r.rise.eq(rise), cmd_r.cmd_i.eq(sd.cmd.i),
                     cmd_r.tx_busy.eq(tx_busy)]
        rx_go, rx_done, rx_timeout = cmd_r.start, cmd_r.done, cmd_r.timeout
        resp_arg, resp_idx = cmd_r.arg, cmd_r.index

        d_short = Signal()                # 64-byte block (CMD6 status) instead of 512
        d_to_port = Signal()
        m.submodules.data = dat = SDDataPHY(resp_timeout=self._resp_timeout,
                                            data_timeout=self._data_timeout,
                                            busy_timeout=self._busy_timeout)
        m.d.comb += [dat.rise.eq(rise), dat.fall.eq(fall), dat.tx_busy.eq(tx_busy),
                     dat.dat_i.eq(sd.dat.i), sd.dat.o.eq(dat.dat_o), sd.dat.oe.eq(dat.dat_oe),
                     dat.short.eq(d_short), dat.to_port.eq(d_to_port)]
        wiring.connect(m, dat.rdata, wiring.flipped(st.rdata))
        wiring.connect(m, wiring.flipped(st.wdata), dat.wdata)
        d_go, d_stop, d_done = dat.rd_start, dat.rd_stop, dat.rd_done
        w_go, t_done, t_result = dat.wr_start, dat.wr_done, dat.wr_result
        # the bytes of the block being written: wdata is let in up to 512 of them
        w_accept = Signal()               # comb: the FSM lets wdata in for this block
        w_taken = Signal(range(SECTOR_BYTES + 1))
        m.d.comb += dat.wr_accept.eq(w_accept & (w_taken != SECTOR_BYTES))
        with m.If(st.wdata.valid & st.wdata.ready):
            m.d.sync += w_taken.eq(w_taken + 1)
        dat_in = sd.dat.i

        # ---- controller state -------------------------------------------------------------
        resp = Signal(_Resp)
        after = Signal(_After)
        wait = Signal(range(max(self._busy_timeout, 81) + 1))
        retries = Signal(range(self._init_retries + 1))
        rca = Signal(16)
        op = Signal(StorageOp)
        lba = Signal(32)
        count = Signal(16)
        blocks = Signal(16)               # blocks left after the current one
        multi = Signal()
        err = Signal(StorageError)
        pending = Signal()                # a storage command waits for the init to finish
        in_cmd = Signal()                 # a storage command is being served (status owed)
        resp_bad = Signal()               # comb: CRC/index/framing of the response wrong
        resp_err = Signal()               # comb: card status error bits
        fsm_wait = Signal()               # comb: the FSM needs a cycle: hold the clock
        lost = Signal()                   # the card's state is unknown: initialise again

        m.d.comb += resp_bad.eq(
            ((resp == _Resp.R1) | (resp == _Resp.R1B) | (resp == _Resp.R2))
            & cmd_r.crc_error
            | ((resp == _Resp.R1) | (resp == _Resp.R1B)) & (resp_idx != cmd_idx)
            | (resp != _Resp.R2) & cmd_r.transmission
            | ~cmd_r.end_bit)
        err_mask = Mux(after == _After.CMD12, R1_ERRORS & ~_OUT_OF_RANGE, R1_ERRORS)
        m.d.comb += resp_err.eq((resp_arg & err_mask) != 0)


        def send_cmd(index, arg, kind, then):
            m.d.sync += [cmd_idx.eq(index), cmd_arg.eq(arg), resp.eq(kind), after.eq(then),
                         wait.eq(0)]
            m.next = "GAP"

        def fail(code):
            m.d.sync += err.eq(code)
            m.next = "FAIL"

        with m.FSM(name="sd") as fsm:
            # ---- initialisation ----------------------------------------------------------------
            with m.State("POWERUP"):
                m.d.sync += [fast.eq(0), self.ready.eq(0), self.sdhc.eq(0),
                             self.high_speed.eq(0), wait.eq(0),
                             self.card_type.eq(CardType.UNKNOWN)]
                m.next = "CLOCKS"
            with m.State("CLOCKS"):
                # >= 74 clocks with CMD high
                with m.If(rise):
                    m.d.sync += wait.eq(wait + 1)
                    with m.If(wait == 79):
                        m.d.sync += [retries.eq(0), rca.eq(0)]
                        send_cmd(0, 0, _Resp.NONE, _After.CMD0)
            with m.State("GAP"):
                # N_CC / N_RC: 8 clocks between a response (or command) and the next command
                with m.If(rise):
                    m.d.sync += wait.eq(wait + 1)
                    with m.If(wait == 7):
                        m.d.comb += [tx_go.eq(1), rx_go.eq(resp != _Resp.NONE)]
                        m.d.sync += rx_r2.eq(resp == _Resp.R2)
                        m.next = "CMD"
            with m.State("CMD"):
                with m.If(resp == _Resp.NONE):
                    with m.If(~tx_busy):
                        m.next = "DISPATCH"
                with m.Elif(rx_done):
                    m.d.comb += fsm_wait.eq(1)
                    with m.If(rx_timeout):
                        with m.If(self.ready):
                            fail(StorageError.TIMEOUT)
                        with m.Else():
                            fail(StorageError.NOT_READY)
                    with m.Elif(resp_bad):
                        with m.If(self.ready):
                            # the card may or may not have taken the command: initialise it
                            # again before the next one
                            m.d.sync += lost.eq(1)
                            fail(StorageError.CRC)
                        with m.Else():
                            fail(StorageError.NOT_READY)
                    with m.Else():
                        m.next = "DISPATCH"
            with m.State("DISPATCH"):
                m.d.comb += fsm_wait.eq(1)
                init_fail = StorageError.NOT_READY
                with m.Switch(after):
                    with m.Case(_After.CMD0):
                        send_cmd(8, 0x1AA, _Resp.R1, _After.CMD8)
                    with m.Case(_After.CMD8):
                        with m.If(resp_arg[:12] == 0x1AA):
                            send_cmd(55, 0, _Resp.R1, _After.CMD55)
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.CMD55):
                        with m.If(resp_err):
                            fail(init_fail)
                        with m.Else():
                            send_cmd(41, 0x40FF_8000, _Resp.R3, _After.ACMD41)
                    with m.Case(_After.ACMD41):
                        with m.If(resp_arg[31]):
                            m.d.sync += self.card_type.eq(Mux(resp_arg[30], CardType.SDHC,
                                                              CardType.SDSC))
                            with m.If(resp_arg[30]):
                                send_cmd(2, 0, _Resp.R2, _After.CMD2)
                            with m.Else():
                                fail(init_fail)          # SDSC: not supported
                        with m.Elif(retries != self._init_retries - 1):
                            m.d.sync += retries.eq(retries + 1)
                            send_cmd(55, 0, _Resp.R1, _After.CMD55)
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.CMD2):
                        send_cmd(3, 0, _Resp.R1, _After.CMD3)
                    with m.Case(_After.CMD3):
                        # R6: RCA, then status bits 23, 22, 19, 12..0
                        with m.If(resp_arg[13:16] != 0):
                            fail(init_fail)
                        with m.Else():
                            m.d.sync += rca.eq(resp_arg[16:])
                            send_cmd(9, Cat(Const(0, 16), resp_arg[16:]), _Resp.R2,
                                     _After.CMD9)
                    with m.Case(_After.CMD9):
                        with m.If(cmd_r.csd_v2):
                            m.d.sync += self.sectors.eq((cmd_r.c_size + 1) << 10)
                            send_cmd(7, Cat(Const(0, 16), rca), _Resp.R1B, _After.CMD7)
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.CMD7):
                        with m.If(resp_err):
                            fail(init_fail)
                        with m.Else():
                            m.d.sync += wait.eq(0)
                            m.next = "INIT_BUSY"
                    with m.Case(_After.CMD55B):
                        with m.If(resp_err):
                            fail(init_fail)
                        with m.Else():
                            send_cmd(6, 2, _Resp.R1, _After.ACMD6)
                    with m.Case(_After.ACMD6):
                        with m.If(resp_err):
                            fail(init_fail)
                        with m.Else():
                            if self._hs_half_period is not None:
                                m.d.comb += d_go.eq(1)
                                m.d.sync += [d_short.eq(1), d_to_port.eq(0)]
                                send_cmd(6, 0x00FF_FFF1, _Resp.R1, _After.CMD6C)
                            else:
                                m.next = "INIT_DONE"
                    with m.Case(_After.CMD6C, _After.CMD6S):
                        with m.If(resp_err):
                            m.d.comb += d_stop.eq(1)
                            fail(init_fail)
                        with m.Else():
                            m.next = "SWITCH_DATA"
                    with m.Case(_After.READ):
                        with m.If(resp_err):
                            m.d.comb += d_stop.eq(1)
                            fail(StorageError.CARD)
                        with m.Else():
                            m.next = "READ_BLOCK"
                    with m.Case(_After.WRITE):
                        with m.If(resp_err):
                            fail(StorageError.CARD)
                        with m.Else():
                            m.d.sync += [wait.eq(0), w_taken.eq(0)]
                            m.next = "WRITE_NWR"
                    with m.Case(_After.CMD13):
                        # after a write: the card is still there and reports no error from
                        # programming the data
                        with m.If(resp_err):
                            m.d.sync += err.eq(StorageError.CARD)
                        m.next = "STATUS"
                    with m.Case(_After.CMD12):
                        with m.If(resp_err & (err == StorageError.OK)):
                            m.d.sync += err.eq(StorageError.CARD)
                        m.d.sync += wait.eq(0)
                        m.next = "STOP_BUSY"
            with m.State("INIT_BUSY"):
                # CMD7 is R1b: wait while DAT0 is low
                with m.If(rise):
                    m.d.sync += wait.eq(wait + 1)
                    with m.If(dat_in[0]):
                        send_cmd(55, Cat(Const(0, 16), rca), _Resp.R1, _After.CMD55B)
                    with m.Elif(wait == self._busy_timeout - 1):
                        fail(StorageError.NOT_READY)
            with m.State("SWITCH_DATA"):
                with m.If(d_done):
                    m.d.comb += [fsm_wait.eq(1), d_stop.eq(1)]
                    with m.If(~dat.rd_ok):
                        fail(StorageError.NOT_READY)
                    with m.Elif((after == _After.CMD6C) & dat.sw_hs_support & (dat.sw_result == 1)):
                        m.d.comb += d_go.eq(1)
                        send_cmd(6, 0x80FF_FFF1, _Resp.R1, _After.CMD6S)
                    with m.Else():
                        with m.If((after == _After.CMD6S) & (dat.sw_result == 1)):
                            m.d.sync += self.high_speed.eq(1)
                        m.next = "INIT_DONE"
            with m.State("INIT_DONE"):
                m.d.sync += [self.ready.eq(1), self.sdhc.eq(1), fast.eq(1)]
                m.next = "STATUS"
                with m.If(~in_cmd):
                    m.next = "IDLE"
            # ---- idle: accept a storage command ------------------------------------------------
            with m.State("IDLE"):
                m.d.comb += st.cmd.ready.eq(~pending)
                with m.If(pending):
                    m.d.sync += [pending.eq(0), in_cmd.eq(1)]
                    with m.If(self.ready):
                        m.next = "EXEC"
                    with m.Else():
                        m.d.sync += err.eq(StorageError.NOT_READY)
                        m.next = "STATUS"
                with m.Elif(st.cmd.valid):
                    p = st.cmd.payload
                    m.d.sync += [op.eq(p.op), lba.eq(p.lba), count.eq(p.count),
                                 blocks.eq(p.count - 1), multi.eq(p.count > 1),
                                 err.eq(StorageError.OK)]
                    with m.If(p.count == 0):
                        m.d.sync += [err.eq(StorageError.RANGE), in_cmd.eq(1)]
                        m.next = "STATUS"
                    with m.Elif(~self.ready):
                        # (re)initialise first: a card inserted later, or one that timed out
                        m.d.sync += pending.eq(1)
                        m.next = "POWERUP"
                    with m.Else():
                        m.d.sync += in_cmd.eq(1)
                        m.next = "EXEC"
            with m.State("EXEC"):
                m.d.comb += dat.wr_flush.eq(1)    # nothing left from an aborted write
                with m.If(lba + count > self.sectors):
                    m.d.sync += err.eq(StorageError.RANGE)
                    m.next = "STATUS"
                with m.Elif(op == StorageOp.READ):
                    m.d.comb += d_go.eq(1)
                    m.d.sync += [d_short.eq(0), d_to_port.eq(1)]
                    send_cmd(Mux(multi, 18, 17), lba, _Resp.R1, _After.READ)
                with m.Else():
                    send_cmd(Mux(multi, 25, 24), lba, _Resp.R1, _After.WRITE)
            # ---- reads ---------------------------------------------------------------------------
            with m.State("READ_BLOCK"):
                with m.If(d_done):
                    m.d.comb += fsm_wait.eq(1)
                    with m.If(dat.rd_timeout):
                        m.d.comb += d_stop.eq(1)
                        fail(StorageError.TIMEOUT)
                    with m.Elif(~dat.rd_ok):
                        m.d.comb += d_stop.eq(1)
                        with m.If(multi):
                            m.d.sync += err.eq(StorageError.CRC)
                            send_cmd(12, 0, _Resp.R1B, _After.CMD12)
                        with m.Else():
                            fail(StorageError.CRC)
                    with m.Elif(blocks != 0):
                        m.d.sync += blocks.eq(blocks - 1)
                        m.d.comb += d_go.eq(1)
                    with m.Elif(multi):
                        m.d.comb += d_stop.eq(1)
                        send_cmd(12, 0, _Resp.R1B, _After.CMD12)
                    with m.Else():
                        m.d.comb += d_stop.eq(1)
                        m.next = "STATUS"
            # ---- writes --------------------------------------------------------------------------
            with m.State("WRITE_NWR"):
                # N_WR: at least 2 clocks after the response (or the busy phase)
                m.d.comb += w_accept.eq(1)
                with m.If(rise):
                    m.d.sync += wait.eq(wait + 1)
                with m.If((wait >= 2) & dat.wr_byte_valid):
                    m.d.comb += w_go.eq(1)
                    m.next = "WRITE_BLOCK"
            with m.State("WRITE_BLOCK"):
                m.d.comb += w_accept.eq(1)
                with m.If(t_done):
                    m.d.comb += fsm_wait.eq(1)
                    m.d.sync += [wait.eq(0), w_taken.eq(0)]
                    with m.If(t_result == StorageError.TIMEOUT):
                        fail(StorageError.TIMEOUT)
                    with m.Elif(t_result != StorageError.OK):
                        m.d.sync += err.eq(t_result)
                        with m.If(multi):
                            send_cmd(12, 0, _Resp.R1B, _After.CMD12)
                        with m.Else():
                            m.next = "STATUS"
                    with m.Elif(blocks != 0):
                        m.d.sync += blocks.eq(blocks - 1)
                        m.next = "WRITE_NWR"
                    with m.Elif(multi):
                        send_cmd(12, 0, _Resp.R1B, _After.CMD12)
                    with m.Else():
                        send_cmd(13, Cat(Const(0, 16), rca), _Resp.R1, _After.CMD13)
            with m.State("STOP_BUSY"):
                # CMD12 is R1b: after a write the card programs while DAT0 is low
                with m.If(rise):
                    m.d.sync += wait.eq(wait + 1)
                    with m.If(dat_in[0]):
                        with m.If((op == StorageOp.WRITE) & (err == StorageError.OK)):
                            send_cmd(13, Cat(Const(0, 16), rca), _Resp.R1, _After.CMD13)
                        with m.Else():
                            m.next = "STATUS"
                    with m.Elif(wait == self._busy_timeout - 1):
                        fail(StorageError.TIMEOUT)
            # ---- end of a transaction ----------------------------------------------------------
            with m.State("FAIL"):
                m.d.comb += d_stop.eq(1)
                m.d.sync += lost.eq(0)
                with m.If((err == StorageError.TIMEOUT) | (err == StorageError.NOT_READY) | lost):
                    m.d.sync += [self.ready.eq(0), self.sdhc.eq(0), fast.eq(0),
                                 self.high_speed.eq(0)]
                m.next = "STATUS"
                with m.If(~in_cmd):
                    m.next = "IDLE"
            with m.State("STATUS"):
                m.d.comb += [st.status.valid.eq(~dat.rdata.valid), st.status.payload.error.eq(err)]
                with m.If(st.status.ready & ~dat.rdata.valid):
                    m.d.sync += in_cmd.eq(0)
                    m.next = "IDLE"
        # a finished block holds SD CLK until the state machine that consumes it has (one
        # system clock); elsewhere (a short block done while the response is still due, a data
        # timeout) it waits without stopping the clock, so the response still arrives
        d_consumer = fsm.ongoing("READ_BLOCK") | fsm.ongoing("SWITCH_DATA")
        m.d.comb += run.eq(~dat.rd_stall & ~dat.wr_stall & ~fsm_wait & ~rx_done
                           & ~(d_done & d_consumer) & ~t_done)
        return m
