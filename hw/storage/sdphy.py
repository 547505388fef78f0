"""SD card PHY pieces: the bus-level parts of the two SD controllers.

The controllers (``hw/storage/sdnative.py``, native mode with the 4-bit bus, and
``hw/storage/sdspi.py``, SPI mode) keep the card protocol -- initialisation, which command follows
which answer, errors, the storage port -- in one state machine each; the bit- and byte-level work
on the pins lives here, one small component per job, shaped like the PHY of LiteSDCard (clocker,
command writer, command reader, data reader and writer):

==================== ================== ===========================================================
piece                used by            job
==================== ================== ===========================================================
:func:`command_frame` both              the 40 bits ``01 | index | argument`` before the CRC7
:func:`crc7`,        both               ``lib.crc`` CRC7_MMC / CRC16_XMODEM at the bus width
:func:`crc16`                           (1 bit per line in native mode, 8 bits in SPI mode)
:class:`SDClocker`   native             SD CLK: divider, rise/fall strobes, stop while not ``run``
:class:`SDCmdWriter` native             a 48-bit command on CMD with its CRC7
:class:`SDCmdReader` native             a 48- or 136-bit response on CMD, CRC7, timeout
:class:`SDDataPHY`   native             4-bit data blocks: reader (CRC16 check) and writer (CRC16,
                                        CRC status token, busy)
:class:`SPIByteEngine` SPI              SCLK divider and the 8-bit shift register (mode 0)
==================== ================== ===========================================================

What is shared and what is not, and why. Both modes frame a command the same way (start and
transmission bits, 6-bit index, 32-bit argument, CRC7, end bit) and protect data with the same
CRC16, so :func:`command_frame`, :func:`crc7` and :func:`crc16` serve both. The rest differs on
the wire and is not shared: in native mode CMD and DAT0-3 are separate lines with their own
bit-serial state machines running in parallel (read data may start while the response is still
on CMD), SD CLK runs free and the controller stops it to wait; in SPI mode everything --
command, R1, tokens, data, busy -- goes through one byte-wide full-duplex shift register whose
SCLK runs only while a byte is exchanged. An SPI R1 is one byte without CRC, a native response
48 or 136 bits with a CRC7 and the full card status; SPI busy is a ``0x00`` byte, native busy
DAT0 low at an SD clock edge. A common clocker or response parser would have to carry both
behaviours behind a mode switch and add logic to each controller.

Timing in native mode (the controller's module docstring has the full account): outputs change
in the system clock in which SD CLK falls (``fall``), inputs are sampled in the system clock
in which it rises (``rise``); every wait counts SD clocks (``rise``), never system clocks.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.crc import catalog
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int

from .port import SECTOR_BYTES, StorageError

__all__ = ["command_frame", "crc7", "crc16", "SDClocker", "SDCmdWriter", "SDCmdReader",
           "SDDataPHY", "SPIByteEngine", "SWITCH_BLOCK_BYTES"]

#: Bytes in the ``CMD6`` switch-function status block (512 bits).
SWITCH_BLOCK_BYTES = 64


def command_frame(index, arg):
    """The first 40 bits of an SD command, most significant first on the wire: start bit 0,
    transmission bit 1, the 6-bit ``index``, the 32-bit ``arg`` (a value of 40 bits; the CRC7
    and the end bit follow it)."""
    return Cat(arg, index, Const(0b01, 2))


def crc7(data_width):
    """A ``lib.crc`` processor for the command CRC7 (CRC7_MMC: polynomial 0x09, MSB first), fed
    ``data_width`` bits a clock."""
    return catalog.CRC7_MMC(data_width=data_width).create()


def crc16(data_width):
    """A ``lib.crc`` processor for the data CRC16 (CRC16_XMODEM: polynomial 0x1021, MSB first,
    initial 0; ``match_detected`` on the residue after the CRC itself), ``data_width`` bits a
    clock."""
    return catalog.CRC16_XMODEM(data_width=data_width).create()


def _pin(width):
    return wiring.Signature({"o": Out(width), "oe": Out(1), "i": In(width, init=(1 << width) - 1)})


class SDClocker(wiring.Component):
    """SD CLK for native mode: a register toggled every ``half`` system clocks, where ``half``
    is ``init_half_period`` while ``fast`` is 0, then ``half_period``, or ``hs_half_period``
    (when given) while ``hs`` is 1.

    ``fall`` / ``rise`` (combinational) mark the system clock in which ``clk`` goes low / high.
    ``run`` (combinational input) allows the next rising edge: while it is 0, ``clk`` stops low
    (after completing a high phase) and the divider holds at 0, so a rising edge follows in the
    first clock ``run`` is 1 again. Latency: ``run`` to ``rise`` 0 clocks once the low phase has
    lasted ``half`` clocks. Throughput: one SD clock per ``2 * half`` system clocks while
    ``run`` stays 1; ``run`` is the backpressure (the controller drops it to wait).
    """

    def __init__(self, *, init_half_period: int, half_period: int,
                 hs_half_period: int | None = None):
        check_int("init_half_period", init_half_period, low=1)
        check_int("half_period", half_period, low=1)
        if hs_half_period is not None:
            check_int("hs_half_period", hs_half_period, low=1)
        self._init_half_period, self._half_period = init_half_period, half_period
        self._hs_half_period = hs_half_period
        super().__init__({"fast": In(1), "hs": In(1), "run": In(1),
                          "clk": Out(1), "rise": Out(1), "fall": Out(1)})

    def elaborate(self, platform):
        m = Module()
        hp = self._hs_half_period or self._half_period
        half = Mux(self.fast, Mux(self.hs, hp - 1, self._half_period - 1),
                   self._init_half_period - 1)
        div = Signal(range(max(self._init_half_period, self._half_period, hp)))
        tick = div == 0
        m.d.comb += [self.fall.eq(tick & self.clk), self.rise.eq(tick & ~self.clk & self.run)]
        with m.If(~tick):
            m.d.sync += div.eq(div - 1)
        with m.Elif(self.fall):
            m.d.sync += [self.clk.eq(0), div.eq(half)]
        with m.Elif(self.rise):
            m.d.sync += [self.clk.eq(1), div.eq(half)]
        return m


class SDCmdWriter(wiring.Component):
    """A command on CMD (native mode): 48 bits, each driven from a falling SD CLK edge.

    ``start`` (one clock, while ``busy`` is 0) takes ``index`` and ``arg``; from the next
    ``fall`` on, ``cmd_o`` carries :func:`command_frame`, the CRC7 (``lib.crc``, bit serial)
    and the end bit, with ``cmd_oe`` high; the 49th ``fall`` releases CMD (``cmd_oe`` 0,
    ``cmd_o`` 1) and ends ``busy``. ``busy`` is high from the clock after ``start`` to that
    release: a response receiver waits for it to fall before it looks for a start bit.
    Latency: the first bit from the first ``fall`` after ``start``; throughput: one bit per SD
    clock, a command every 49 SD clocks at most (``start`` is taken only while idle).
    """

    def __init__(self):
        super().__init__({"start": In(1), "index": In(6), "arg": In(32), "fall": In(1),
                          "busy": Out(1), "cmd_o": Out(1), "cmd_oe": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = crc7(1)
        word = Signal(40)
        i = Signal(range(49))
        m.d.comb += crc.data.eq(word[39])
        with m.FSM(name="cmd_tx") as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [word.eq(command_frame(self.index, self.arg)), i.eq(0)]
                    m.d.comb += crc.start.eq(1)
                    m.next = "SEND"
            with m.State("SEND"):
                with m.If(self.fall):
                    m.d.sync += [i.eq(i + 1), self.cmd_oe.eq(1)]
                    with m.If(i < 40):
                        m.d.sync += [self.cmd_o.eq(word[39]), word.eq(word << 1)]
                        m.d.comb += crc.valid.eq(1)
                    with m.Elif(i < 47):
                        crc_bit = (46 - i).as_unsigned()[:3]
                        m.d.sync += self.cmd_o.eq(crc.crc.bit_select(crc_bit, 1))
                    with m.Elif(i == 47):
                        m.d.sync += self.cmd_o.eq(1)
                    with m.Else():
                        m.d.sync += [self.cmd_oe.eq(0), self.cmd_o.eq(1)]
                        m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m


class SDCmdReader(wiring.Component):
    """A response on CMD (native mode), each bit sampled at a rising SD CLK edge.

    ``start`` (one clock) arms it; ``r2`` (held while armed) selects a 136-bit response (R2:
    CID/CSD) instead of 48 bits. While ``tx_busy`` (the command still going out) it neither
    counts nor looks for the start bit; then the first 0 on ``cmd_i`` starts the response, and
    ``resp_timeout`` SD clocks without one end in ``timeout``. ``done`` is high for one clock,
    the clock after the last bit (or the timeout); a ``start`` in that clock arms it again at
    once.

    Outputs, valid with ``done``: ``arg`` (bits 39..8 of a 48-bit response: card status, RCA,
    OCR, echo), ``index`` (bits 45..40), ``transmission`` (bit 46, 0 from a card), ``end_bit``
    (bit 0), ``crc_error`` (the received CRC7 differs from the one computed, over bits 47..8,
    or over the register for R2), ``csd_v2`` and ``c_size`` (an R2 carrying a CSD: structure
    version 2.0, and its 22-bit ``C_SIZE``). Between responses they hold their last values.
    Throughput: one bit per SD clock; no backpressure (the controller holds SD CLK while it
    acts on ``done``).
    """

    def __init__(self, *, resp_timeout: int):
        check_int("resp_timeout", resp_timeout, low=2)
        self._resp_timeout = resp_timeout
        super().__init__({"start": In(1), "r2": In(1), "rise": In(1), "cmd_i": In(1),
                          "tx_busy": In(1), "done": Out(1), "timeout": Out(1),
                          "arg": Out(32), "index": Out(6), "transmission": Out(1),
                          "end_bit": Out(1), "crc_error": Out(1), "csd_v2": Out(1),
                          "c_size": Out(22)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = crc7(1)
        cmd_in, r2 = self.cmd_i, self.r2
        rsr = Signal(48)                  # the last 48 bits received
        i = Signal(range(137))
        wait = Signal(range(self._resp_timeout + 1))
        length = Mux(r2, 136, 48)
        crc_first = Mux(r2, 8, 0)
        m.d.comb += crc.data.eq(cmd_in)
        with m.FSM(name="cmd_rx") as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [wait.eq(0), self.timeout.eq(0)]
                    m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(self.rise):
                    with m.If(~cmd_in & ~self.tx_busy):
                        m.d.sync += [i.eq(1), rsr.eq(0)]
                        m.d.comb += [crc.start.eq(1), crc.valid.eq(~r2)]
                        m.next = "BITS"
                    with m.Elif(~self.tx_busy):
                        m.d.sync += wait.eq(wait + 1)
                        with m.If(wait == self._resp_timeout - 1):
                            m.d.sync += self.timeout.eq(1)
                            m.next = "DONE"
            with m.State("BITS"):
                with m.If(self.rise):
                    m.d.sync += [rsr.eq(Cat(cmd_in, rsr[:47])), i.eq(i + 1)]
                    m.d.comb += crc.valid.eq((i >= crc_first) & (i < length - 8))
                    with m.If(r2 & (i == 9)):
                        m.d.sync += self.csd_v2.eq(Cat(cmd_in, rsr[0]) == 0b01)
                    with m.If(r2 & (i == 87)):
                        m.d.sync += self.c_size.eq(Cat(cmd_in, rsr[:21]))
                    with m.If(i == length - 1):
                        m.next = "DONE"
            with m.State("DONE"):
                with m.If(self.start):
                    m.d.sync += [wait.eq(0), self.timeout.eq(0)]
                    m.next = "WAIT"
                with m.Else():
                    m.next = "IDLE"
        m.d.comb += [self.done.eq(fsm.ongoing("DONE")),
                     self.arg.eq(rsr[8:40]), self.index.eq(rsr[40:46]),
                     self.transmission.eq(rsr[46]), self.end_bit.eq(rsr[0]),
                     self.crc_error.eq(rsr[1:8] != crc.crc)]
        return m


class SDDataPHY(wiring.Component):
    """Data blocks on DAT0-3 (native mode, 4-bit bus): a reader and a writer.

    The two share the four bit-serial CRC16s (``lib.crc`` CRC16_XMODEM, one per DAT line) and
    one SD clock counter for their timeouts: the bus carries data in one direction at a time,
    so a reader and a writer with their own would only add registers.

    Reader (inputs sampled at ``rise``). ``rd_start`` (one clock) arms it: it waits for a start
    bit on DAT0 (``data_timeout`` SD clocks, counted once ``tx_busy`` is 0, i.e. from the read
    command's end bit; then ``rd_timeout``), takes ``2 * 512`` nibbles (``2 * 64`` with
    ``short``, the ``CMD6`` status block), the 16 CRC nibbles and the end nibble, and holds
    ``rd_done`` with ``rd_ok`` (all four CRC16s match, end bits 1, start bits 0 on all lines)
    until ``rd_start`` (arms again at once) or ``rd_stop`` (back to idle; also aborts a block).
    With ``to_port`` the bytes go out on ``rdata`` (a one-byte buffer; ``rd_stall`` is high in
    the clock where the next nibble would complete a byte that cannot be stored: the
    controller stops SD CLK); without, bytes 13 and 16 of the block give ``sw_hs_support``
    (bit 1 of byte 13: high speed supported) and ``sw_result`` (low nibble of byte 16: the
    function group 1 selection).

    Writer (outputs change at ``fall``). While ``wr_accept`` is 1, ``wdata`` fills a one-byte
    buffer (``wr_byte_valid``; ``wr_flush`` drops a byte left from an aborted write); the
    controller counts a block's 512 bytes and drops ``wr_accept`` after the last. ``wr_start``
    sends a block: start nibble 0, the 1024 nibbles (``wr_stall`` is high while the next one is
    due but its byte is not there), the four CRC16s, the end nibble F; it releases DAT and
    takes the card's CRC status token on DAT0 (within ``resp_timeout`` SD clocks) and waits out
    its busy phase (DAT0 low, at most ``busy_timeout`` SD clocks). ``wr_done`` is then high for
    one clock (a ``wr_start`` in it sends the next block at once) with ``wr_result``: OK, CRC
    (token ``101`` "CRC error", or no end bit), CARD (any other token), TIMEOUT (no token, busy
    too long).

    Throughput: 4 bits per SD clock in a block, both ways; backpressure: ``rd_stall`` and
    ``wr_stall`` (the controller stops SD CLK while either is high), ``wdata.ready``.
    Latency: a read byte is on ``rdata`` in the clock after the rising edge of its low nibble.
    """

    def __init__(self, *, resp_timeout: int, data_timeout: int, busy_timeout: int):
        check_int("resp_timeout", resp_timeout, low=2)
        check_int("data_timeout", data_timeout, low=2)
        check_int("busy_timeout", busy_timeout, low=2)
        self._resp_timeout, self._data_timeout = resp_timeout, data_timeout
        self._busy_timeout = busy_timeout
        super().__init__({
            "rise": In(1), "fall": In(1), "tx_busy": In(1),
            "dat_i": In(4, init=0xF), "dat_o": Out(4), "dat_oe": Out(1),
            # reader
            "rd_start": In(1), "rd_stop": In(1), "short": In(1), "to_port": In(1),
            "rd_done": Out(1), "rd_ok": Out(1), "rd_timeout": Out(1), "rd_stall": Out(1),
            "sw_hs_support": Out(1), "sw_result": Out(4),
            "rdata": Out(stream.Signature(8)),
            # writer
            "wdata": In(stream.Signature(8)),
            "wr_accept": In(1), "wr_flush": In(1), "wr_start": In(1),
            "wr_done": Out(1), "wr_result": Out(StorageError), "wr_stall": Out(1),
            "wr_byte_valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        dat_in = self.dat_i
        crcs = []
        for k in range(4):
            m.submodules[f"crc16_{k}"] = c = crc16(1)
            crcs.append(c)
        crc_start = Signal()
        crc_valid = Signal()
        crc_data = Signal(4)
        for k, c in enumerate(crcs):
            m.d.comb += [c.start.eq(crc_start), c.valid.eq(crc_valid), c.data.eq(crc_data[k])]
        crc_match = Cat(c.match_detected for c in crcs).all()
        wait = Signal(range(max(self._data_timeout, self._busy_timeout,
                                self._resp_timeout) + 1))
        self._reader(m, dat_in, crc_start, crc_valid, crc_data, crc_match, wait)
        self._writer(m, dat_in, crcs, crc_start, crc_valid, crc_data, wait)
        return m

    def _reader(self, m, dat_in, crc_start, crc_valid, crc_data, crc_match, wait):
        cnt = Signal(range(2 * SECTOR_BYTES))
        hi = Signal(4)
        badstart = Signal()
        rbuf = self.rdata.payload
        rbuf_valid = self.rdata.valid
        last = Mux(self.short, 2 * SWITCH_BLOCK_BYTES - 1, 2 * SECTOR_BYTES - 1)
        with m.If(self.rdata.ready):
            m.d.sync += rbuf_valid.eq(0)
        with m.FSM(name="dat_rx") as fsm:
            with m.State("IDLE"):
                with m.If(self.rd_start):
                    m.d.sync += [wait.eq(0), self.rd_timeout.eq(0)]
                    m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(self.rd_stop):
                    m.next = "IDLE"
                with m.Elif(self.rise):
                    with m.If(~dat_in[0]):
                        m.d.sync += [cnt.eq(0), badstart.eq(dat_in != 0)]
                        m.d.comb += crc_start.eq(1)
                        m.next = "DATA"
                    with m.Elif(~self.tx_busy):
                        # N_AC counts from the command's end bit
                        m.d.sync += wait.eq(wait + 1)
                        with m.If(wait == self._data_timeout - 1):
                            m.d.sync += [self.rd_timeout.eq(1), self.rd_ok.eq(0)]
                            m.next = "DONE"
            with m.State("DATA"):
                with m.If(self.rd_stop):
                    m.next = "IDLE"
                with m.Elif(self.rise):
                    m.d.sync += cnt.eq(cnt + 1)
                    m.d.comb += [crc_valid.eq(1), crc_data.eq(dat_in)]
                    with m.If(~cnt[0]):
                        m.d.sync += hi.eq(dat_in)
                    with m.Elif(self.to_port):
                        m.d.sync += [rbuf.eq(Cat(dat_in, hi)), rbuf_valid.eq(1)]
                    with m.If(~self.to_port & (cnt == 2 * 13 + 1)):
                        m.d.sync += self.sw_hs_support.eq(dat_in[1])
                    with m.If(~self.to_port & (cnt == 2 * 16 + 1)):
                        m.d.sync += self.sw_result.eq(dat_in)
                    with m.If(cnt == last):
                        m.d.sync += cnt.eq(0)
                        m.next = "CRC"
            with m.State("CRC"):
                with m.If(self.rd_stop):
                    m.next = "IDLE"
                with m.Elif(self.rise):
                    m.d.sync += cnt.eq(cnt + 1)
                    m.d.comb += [crc_valid.eq(1), crc_data.eq(dat_in)]
                    with m.If(cnt == 15):
                        m.next = "END"
            with m.State("END"):
                with m.If(self.rd_stop):
                    m.next = "IDLE"
                with m.Elif(self.rise):
                    m.d.sync += self.rd_ok.eq(crc_match & (dat_in == 0xF) & ~badstart)
                    m.next = "DONE"
            with m.State("DONE"):
                with m.If(self.rd_start):
                    m.d.sync += [wait.eq(0), self.rd_timeout.eq(0)]
                    m.next = "WAIT"
                with m.Elif(self.rd_stop):
                    m.next = "IDLE"
        m.d.comb += [self.rd_done.eq(fsm.ongoing("DONE")),
                     self.rd_stall.eq(fsm.ongoing("DATA") & cnt[0] & self.to_port & rbuf_valid
                                      & ~self.rdata.ready)]

    def _writer(self, m, dat_in, crcs, crc_start, crc_valid, crc_data, wait):
        wbyte = Signal(8)
        wbyte_valid = self.wr_byte_valid
        lo = Signal(4)
        cnt = Signal(range(2 * SECTOR_BYTES))
        token = Signal(3)
        result = self.wr_result
        m.d.comb += self.wdata.ready.eq(self.wr_accept & ~wbyte_valid)
        with m.If(self.wdata.valid & self.wdata.ready):
            m.d.sync += [wbyte.eq(self.wdata.payload), wbyte_valid.eq(1)]
        crc_nibble = Signal(4)
        m.d.comb += crc_nibble.eq(Cat(c.crc.bit_select(~cnt[:4], 1) for c in crcs))
        with m.FSM(name="dat_tx") as fsm:
            with m.State("IDLE"):
                with m.If(self.wr_start):
                    m.next = "START"
            with m.State("START"):
                with m.If(self.fall):
                    m.d.sync += [self.dat_oe.eq(1), self.dat_o.eq(0), cnt.eq(0)]
                    m.d.comb += crc_start.eq(1)
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(self.fall):
                    m.d.sync += cnt.eq(cnt + 1)
                    m.d.comb += crc_valid.eq(1)
                    with m.If(~cnt[0]):
                        m.d.sync += [self.dat_o.eq(wbyte[4:]), lo.eq(wbyte[:4]),
                                     wbyte_valid.eq(0)]
                        m.d.comb += crc_data.eq(wbyte[4:])
                    with m.Else():
                        m.d.sync += self.dat_o.eq(lo)
                        m.d.comb += crc_data.eq(lo)
                    with m.If(cnt == 2 * SECTOR_BYTES - 1):
                        m.d.sync += cnt.eq(0)
                        m.next = "CRC"
            with m.State("CRC"):
                with m.If(self.fall):
                    m.d.sync += [cnt.eq(cnt + 1), self.dat_o.eq(crc_nibble)]
                    with m.If(cnt == 15):
                        m.next = "END"
            with m.State("END"):
                with m.If(self.fall):
                    m.d.sync += self.dat_o.eq(0xF)
                    m.next = "RELEASE"
            with m.State("RELEASE"):
                with m.If(self.fall):
                    m.d.sync += [self.dat_oe.eq(0), wait.eq(0)]
                    m.next = "TOKEN"
            with m.State("TOKEN"):
                with m.If(self.rise):
                    with m.If(~dat_in[0]):
                        m.d.sync += cnt.eq(0)
                        m.next = "STATUS"
                    with m.Else():
                        m.d.sync += wait.eq(wait + 1)
                        with m.If(wait == self._resp_timeout - 1):
                            m.d.sync += result.eq(StorageError.TIMEOUT)
                            m.next = "DONE"
            with m.State("STATUS"):
                with m.If(self.rise):
                    m.d.sync += [cnt.eq(cnt + 1), token.eq(Cat(dat_in[0], token[:2]))]
                    with m.If(cnt == 3):
                        m.d.sync += wait.eq(0)
                        with m.If(~dat_in[0]):                  # no end bit
                            m.d.sync += result.eq(StorageError.CRC)
                            m.next = "DONE"
                        with m.Elif(token == 0b010):
                            m.next = "BUSY"
                        with m.Elif(token == 0b101):
                            m.d.sync += result.eq(StorageError.CRC)
                            m.next = "DONE"
                        with m.Else():
                            m.d.sync += result.eq(StorageError.CARD)
                            m.next = "DONE"
            with m.State("BUSY"):
                with m.If(self.rise):
                    with m.If(dat_in[0]):
                        m.d.sync += result.eq(StorageError.OK)
                        m.next = "DONE"
                    with m.Else():
                        m.d.sync += wait.eq(wait + 1)
                        with m.If(wait == self._busy_timeout - 1):
                            m.d.sync += result.eq(StorageError.TIMEOUT)
                            m.next = "DONE"
            with m.State("DONE"):
                with m.If(self.wr_start):
                    m.next = "START"
                with m.Else():
                    m.next = "IDLE"
        with m.If(self.wr_flush):
            m.d.sync += wbyte_valid.eq(0)
        m.d.comb += [self.wr_done.eq(fsm.ongoing("DONE")),
                     self.wr_stall.eq(fsm.ongoing("DATA") & ~cnt[0] & ~wbyte_valid)]


class SPIByteEngine(wiring.Component):
    """SPI mode 0 byte exchange: SCLK and the 8-bit shift register.

    SCLK is ``sclk``, toggled every ``half`` system clocks while a byte is exchanged (each SCLK
    half period takes the ``half`` current when it begins: ``init_half_period`` while ``fast``
    is 0, ``half_period`` after); it rests low between bytes. ``start`` (combinational) begins
    a byte with ``tx`` when the engine is free (``busy`` 0) or in the clock the current byte
    ends (``done``, the clock of its last falling edge), so bytes follow back to back: 16 *
    ``half`` clocks each. ``mosi`` carries ``tx`` MSB first (1 while idle); ``miso`` is sampled
    into ``rx`` in the clock SCLK rises; ``rx`` holds the whole byte with ``done`` and after
    it, until the next byte's first rising edge.
    """

    def __init__(self, *, init_half_period: int, half_period: int):
        check_int("init_half_period", init_half_period, low=1)
        check_int("half_period", half_period, low=1)
        self._init_half_period, self._half_period = init_half_period, half_period
        super().__init__({"fast": In(1), "start": In(1), "tx": In(8), "miso": In(1, init=1),
                          "busy": Out(1), "done": Out(1), "rx": Out(8),
                          "sclk": Out(1), "mosi": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        half = Mux(self.fast, self._half_period - 1, self._init_half_period - 1)
        div = Signal(range(max(self._init_half_period, self._half_period)))
        busy, done, sclk, rx = self.busy, self.done, self.sclk, self.rx
        bitcnt = Signal(3)
        shift = Signal(8)
        m.d.comb += [done.eq(busy & (div == 0) & sclk & (bitcnt == 7)),
                     self.mosi.eq(Mux(busy, shift[7], 1))]
        with m.If(busy):
            with m.If(div != 0):
                m.d.sync += div.eq(div - 1)
            with m.Elif(~sclk):
                m.d.sync += [sclk.eq(1), rx.eq(Cat(self.miso, rx[:7])), div.eq(half)]
            with m.Else():
                m.d.sync += [sclk.eq(0), shift.eq(shift << 1), bitcnt.eq(bitcnt + 1),
                             div.eq(half)]
                with m.If(bitcnt == 7):
                    m.d.sync += busy.eq(0)
        with m.If(self.start & (~busy | done)):
            m.d.sync += [shift.eq(self.tx), busy.eq(1), bitcnt.eq(0), div.eq(half)]
        return m
