"""SD card controller in SPI mode, behind the storage port (``hw/storage/port.py``).

After reset the controller initialises the card at the slow clock (``init_half_period`` clocks
per SCLK half period; <= 400 kHz on a real card): 80 clocks with CS high, ``CMD0`` (expects R1 =
idle), ``CMD8`` (``0x1AA``: voltage check and echo; "illegal command" marks an SD v1 card),
``ACMD41`` (``CMD55`` + ``CMD41`` with HCS on v2 cards) until the card leaves the idle state,
``CMD58`` (OCR: CCS = block addressing), and ``CMD16`` (512-byte blocks) on byte-addressed
cards; then it switches to the fast clock (``half_period``). Every command carries a correct CRC7
(``lib.crc`` CRC7_MMC) and every data block a CRC16 (CRC16_XMODEM), checked on reads.

Storage commands: a read of one sector is ``CMD17``, of several ``CMD18`` ... ``CMD12``; a write
of one sector ``CMD24``, of several ``CMD25`` with ``0xFC`` block tokens and the ``0xFD`` stop
token; after each written block the data-response token is checked and the busy phase awaited.
The status is sent after the last byte (for writes: after the card's busy phase).

Errors, never hangs: R1 not seen within ``resp_timeout`` bytes, no data token within
``token_timeout`` bytes, busy for more than ``busy_timeout`` bytes -> ``TIMEOUT`` (and the card
is initialised again before the next command); R1 error bits, error tokens, write errors ->
``CARD``; CRC16 mismatch on a read or a CRC-rejected write -> ``CRC``; ``count == 0`` ->
``RANGE``; initialisation failed (no card, unusable card, ``ACMD41`` still idle after
``init_retries`` tries) -> ``NOT_READY``. A failed transfer stops its data phase early.

Throughput: one byte per ``16 * half_period`` clocks in data phases (the SPI engine starts the
next byte in the clock the previous one ends, so the 1-bit-per-SCLK limit is reached within the
block); per block add the token, CRC and (writes) the card's busy time, per command the command
bytes and R1 latency. See ``docs/BENCHMARKS.md`` for measured figures.
Backpressure: ``rdata`` may stall (the SPI clock pauses between bytes); ``wdata`` may be late
(same). Latency of a read: command (7 bytes) + card latency to the data token.

Structure: every byte on the bus -- command, R1, tokens, data, CRC, busy polls -- goes through
the :class:`~ringkv.hw.storage.sdphy.SPIByteEngine` of ``hw/storage/sdphy.py`` (SCLK and the shift
register); the state machine here decides what to send and what an answer means. The command frame
and the CRC7/CRC16 processors are the ones the native controller uses (``hw/storage/sdphy.py`` says
why the rest is not shared).

Ports: ``storage`` (In :class:`StoragePortSignature`), ``spi`` (``sclk``, ``mosi``, ``cs_n`` out;
``miso`` in; mode 0), ``ready`` (card initialised), ``sdhc`` (block-addressed card),
``card_type`` (:class:`~ringkv.hw.storage.CardType`: SDHC/SDXC or SDSC from ``sdhc`` once
initialised, else ``UNKNOWN``). The controller does not read the CSD: the capacity is
unknown in SPI mode (``STORAGE_INFO`` reports 0 sectors).
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
from .sdphy import SPIByteEngine, command_frame
from .sdphy import crc7 as sd_crc7
from .sdphy import crc16 as sd_crc16

__all__ = ["SPISignature", "SDSPIController"]


class SPISignature(wiring.Signature):
    """SPI bus, controller side: ``sclk``, ``mosi``, ``cs_n`` out, ``miso`` in."""

    def __init__(self):
        super().__init__({"sclk": Out(1), "mosi": Out(1, init=1), "cs_n": Out(1, init=1),
                          "miso": In(1, init=1)})


class _After(enum.Enum, shape=4):
    CMD0 = 0
    CMD8 = 1
    CMD8_R7 = 2
    CMD55 = 3
    CMD41 = 4
    CMD58 = 5
    OCR = 6
    CMD16 = 7
    READ = 8
    WRITE = 9
    CMD12 = 10


class SDSPIController(wiring.Component):
    """SD card controller in SPI mode; see the module docstring for protocol and timing."""

    def __init__(self, *, init_half_period: int = 63, half_period: int = 1,
                 resp_timeout: int = 16, token_timeout: int = 1 << 16,
                 busy_timeout: int = 1 << 20, init_retries: int = 1 << 12):
        check_int("init_half_period", init_half_period, low=1)
        check_int("half_period", half_period, low=1)
        check_int("resp_timeout", resp_timeout, low=2)
        check_int("token_timeout", token_timeout, low=2)
        check_int("busy_timeout", busy_timeout, low=2)
        check_int("init_retries", init_retries, low=1)
        if half_period > init_half_period:
            raise ValueError(f"half_period ({half_period}) must not exceed init_half_period "
                             f"({init_half_period})")
        self._init_half_period, self._half_period = init_half_period, half_period
        self._resp_timeout, self._token_timeout = resp_timeout, token_timeout
        self._busy_timeout, self._init_retries = busy_timeout, init_retries
        super().__init__({
            "storage": In(StoragePortSignature()),
            "spi": Out(SPISignature()),
            "ready": Out(1),
            "sdhc": Out(1),
            "card_type": Out(CardType),
        })

    @property
    def half_period(self):
        return self._half_period

    @property
    def init_half_period(self):
        return self._init_half_period

    def elaborate(self, platform):
        m = Module()
        st = self.storage
        spi = self.spi
        m.d.comb += self.card_type.eq(Mux(self.ready, Mux(self.sdhc, CardType.SDHC,
                                                          CardType.SDSC), CardType.UNKNOWN))

        # ---- PHY pieces (hw/storage/sdphy.py) ----------------------------------------------------
        fast = Signal()
        m.submodules.engine = engine = SPIByteEngine(init_half_period=self._init_half_period,
                                                     half_period=self._half_period)
        start = engine.start              # comb: begin a byte with tx_next (free or done)
        tx_next = engine.tx
        done, rx, free = engine.done, engine.rx, ~engine.busy
        m.d.comb += [engine.fast.eq(fast), engine.miso.eq(spi.miso),
                     spi.sclk.eq(engine.sclk), spi.mosi.eq(engine.mosi)]
        m.submodules.crc7 = crc7 = sd_crc7(8)
        m.submodules.crc16 = crc16 = sd_crc16(8)

        # ---- controller state ------------------------------------------------------------------
        cmd_idx = Signal(6)
        cmd_arg = Signal(32)
        after = Signal(_After)
        byte_i = Signal(3)                # byte of the command frame / response
        skip = Signal()                   # skip one byte before R1 (CMD12's stuff byte)
        r1 = Signal(8)
        resp32 = Signal(32)
        wait = Signal(range(max(self._resp_timeout, self._token_timeout,
                                self._busy_timeout) + 1))
        retries = Signal(range(self._init_retries + 1))
        v2 = Signal()
        op = Signal(StorageOp)
        lba = Signal(32)
        blocks = Signal(16)               # blocks left after the current one
        multi = Signal()
        nbytes = Signal(range(SECTOR_BYTES + 3))
        todo = Signal(range(SECTOR_BYTES + 1))
        err = Signal(StorageError)
        pending = Signal()                # a storage command waits for the init to finish
        rbuf_valid = Signal()
        rbuf = Signal(8)
        crc_rx = Signal(16)
        after_busy = Signal()             # 0: next write block / stop, 1: deselect
        in_cmd = Signal()                 # a storage command is being served (status owed)

        m.d.comb += [st.rdata.valid.eq(rbuf_valid), st.rdata.payload.eq(rbuf)]
        with m.If(st.rdata.ready):
            m.d.sync += rbuf_valid.eq(0)

        def send_cmd(index, arg, then):
            m.d.sync += [cmd_idx.eq(index), cmd_arg.eq(arg), after.eq(then), byte_i.eq(0),
                         skip.eq(index == 12)]
            m.next = "COMMAND_PREAMBLE"

        def fail(code):
            m.d.sync += err.eq(code)
            m.next = "FAIL"

        addr = Mux(self.sdhc, lba, lba << 9)

        with m.FSM(name="sd"):
            with m.State("POWERUP"):
                # >= 74 clocks with CS and MOSI high: ten 0xFF bytes
                m.d.comb += [spi.cs_n.eq(1), tx_next.eq(0xFF), start.eq(free)]
                with m.If(done):
                    m.d.sync += nbytes.eq(nbytes + 1)
                    with m.If(nbytes == 9):
                        m.d.sync += [retries.eq(0), v2.eq(0), self.sdhc.eq(0)]
                        send_cmd(0, 0, _After.CMD0)
            with m.State("COMMAND_PREAMBLE"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF), start.eq(free),
                             crc7.start.eq(1)]
                with m.If(done):
                    m.next = "COMMAND_SEND"
            with m.State("COMMAND_SEND"):
                frame = Signal(8)
                word = command_frame(cmd_idx, cmd_arg)
                with m.Switch(byte_i):
                    for i in range(5):
                        with m.Case(i):
                            m.d.comb += frame.eq(word.word_select(4 - i, 8))
                    with m.Default():
                        m.d.comb += frame.eq(Cat(Const(1, 1), crc7.crc))
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(frame), start.eq(free),
                             crc7.data.eq(frame), crc7.valid.eq(free & (byte_i < 5))]
                with m.If(done):
                    m.d.sync += byte_i.eq(byte_i + 1)
                    with m.If(byte_i == 5):
                        m.d.sync += [wait.eq(0), byte_i.eq(0)]
                        m.next = "R1_WAIT"
            with m.State("R1_WAIT"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF), start.eq(free)]
                with m.If(done):
                    with m.If(skip):
                        m.d.sync += skip.eq(0)
                    with m.Elif(~rx[7]):
                        m.d.sync += [r1.eq(rx), byte_i.eq(0)]
                        m.next = "DISPATCH"
                    with m.Elif(wait == self._resp_timeout - 1):
                        fail(StorageError.TIMEOUT)
                    with m.Else():
                        m.d.sync += wait.eq(wait + 1)
            with m.State("GET_FOUR_BYTES"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF), start.eq(free)]
                with m.If(done):
                    m.d.sync += [resp32.eq(Cat(rx, resp32[:24])), byte_i.eq(byte_i + 1)]
                    with m.If(byte_i == 3):
                        m.next = "DISPATCH"
            with m.State("DISPATCH"):
                m.d.comb += spi.cs_n.eq(0)
                init_fail = StorageError.NOT_READY
                with m.Switch(after):
                    with m.Case(_After.CMD0):
                        with m.If(r1 == 0x01):
                            send_cmd(8, 0x1AA, _After.CMD8)
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.CMD8):
                        with m.If(r1[2]):            # illegal command: SD v1
                            send_cmd(55, 0, _After.CMD55)
                        with m.Elif(r1 == 0x01):
                            m.d.sync += [after.eq(_After.CMD8_R7), byte_i.eq(0)]
                            m.next = "GET_FOUR_BYTES"
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.CMD8_R7):
                        with m.If(resp32[:12] == 0x1AA):
                            m.d.sync += v2.eq(1)
                            send_cmd(55, 0, _After.CMD55)
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.CMD55):
                        with m.If(r1[1:] == 0):
                            send_cmd(41, Mux(v2, 0x4000_0000, 0), _After.CMD41)
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.CMD41):
                        with m.If(r1 == 0x00):
                            with m.If(v2):
                                send_cmd(58, 0, _After.CMD58)
                            with m.Else():
                                send_cmd(16, SECTOR_BYTES, _After.CMD16)
                        with m.Elif((r1 == 0x01) & (retries != self._init_retries - 1)):
                            m.d.sync += retries.eq(retries + 1)
                            send_cmd(55, 0, _After.CMD55)
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.CMD58):
                        with m.If(r1 == 0x00):
                            m.d.sync += [after.eq(_After.OCR), byte_i.eq(0)]
                            m.next = "GET_FOUR_BYTES"
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.OCR):
                        m.d.sync += self.sdhc.eq(resp32[30])
                        with m.If(resp32[30]):
                            m.d.sync += [self.ready.eq(1), fast.eq(1)]
                            m.next = "DESELECT"
                        with m.Else():
                            send_cmd(16, SECTOR_BYTES, _After.CMD16)
                    with m.Case(_After.CMD16):
                        with m.If(r1 == 0x00):
                            m.d.sync += [self.ready.eq(1), fast.eq(1)]
                            m.next = "DESELECT"
                        with m.Else():
                            fail(init_fail)
                    with m.Case(_After.READ):
                        with m.If(r1 == 0x00):
                            m.d.sync += wait.eq(0)
                            m.next = "READ_TOKEN"
                        with m.Else():
                            fail(StorageError.CARD)
                    with m.Case(_After.WRITE):
                        with m.If(r1 == 0x00):
                            m.next = "WRITE_GAP"
                        with m.Else():
                            fail(StorageError.CARD)
                    with m.Case(_After.CMD12):
                        m.d.sync += [wait.eq(0), after_busy.eq(1)]
                        m.next = "BUSY"
            # ---- idle: accept a storage command ------------------------------------------------
            with m.State("IDLE"):
                m.d.comb += st.cmd.ready.eq(~pending)
                with m.If(pending):
                    with m.If(self.ready):
                        m.d.sync += pending.eq(0)
                        m.next = "EXEC"
                    with m.Else():
                        m.d.sync += [pending.eq(0), err.eq(StorageError.NOT_READY),
                                     in_cmd.eq(1)]
                        m.next = "STATUS"
                with m.Elif(st.cmd.valid):
                    p = st.cmd.payload
                    m.d.sync += [op.eq(p.op), lba.eq(p.lba), blocks.eq(p.count - 1),
                                 multi.eq(p.count > 1), err.eq(StorageError.OK)]
                    with m.If(p.count == 0):
                        m.d.sync += [err.eq(StorageError.RANGE), in_cmd.eq(1)]
                        m.next = "STATUS"
                    with m.Elif(~self.ready):
                        # (re)initialise first: a card inserted later, or one that timed out
                        m.d.sync += [pending.eq(1), fast.eq(0), nbytes.eq(0)]
                        m.next = "POWERUP"
                    with m.Else():
                        m.next = "EXEC"
            with m.State("EXEC"):
                m.d.sync += in_cmd.eq(1)
                with m.If(op == StorageOp.READ):
                    send_cmd(Mux(multi, 18, 17), addr, _After.READ)
                with m.Else():
                    send_cmd(Mux(multi, 25, 24), addr, _After.WRITE)
            # ---- reads ---------------------------------------------------------------------------
            with m.State("READ_TOKEN"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF), start.eq(free),
                             crc16.start.eq(1)]
                with m.If(done):
                    with m.If(rx == 0xFE):
                        m.d.sync += [todo.eq(SECTOR_BYTES), nbytes.eq(0)]
                        m.next = "READ_DATA"
                    with m.Elif(rx[4:] == 0):          # data error token
                        fail(StorageError.CARD)
                    with m.Elif(wait == self._token_timeout - 1):
                        fail(StorageError.TIMEOUT)
                    with m.Else():
                        m.d.sync += wait.eq(wait + 1)
            with m.State("READ_DATA"):
                can_store = ~rbuf_valid | st.rdata.ready
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF),
                             start.eq((todo != 0) & (free | (done & can_store)))]
                with m.If(start & (free | done)):
                    m.d.sync += todo.eq(todo - 1)
                with m.If(done):
                    with m.If(can_store):
                        m.d.sync += [rbuf.eq(rx), rbuf_valid.eq(1), nbytes.eq(nbytes + 1)]
                        m.d.comb += [crc16.valid.eq(1), crc16.data.eq(rx)]
                        with m.If(nbytes == SECTOR_BYTES - 1):
                            m.d.sync += byte_i.eq(0)
                            m.next = "READ_CRC"
                    with m.Else():
                        m.next = "READ_HOLD"
            with m.State("READ_HOLD"):
                m.d.comb += spi.cs_n.eq(0)
                with m.If(~rbuf_valid | st.rdata.ready):
                    m.d.sync += [rbuf.eq(rx), rbuf_valid.eq(1), nbytes.eq(nbytes + 1)]
                    m.d.comb += [crc16.valid.eq(1), crc16.data.eq(rx)]
                    with m.If(nbytes == SECTOR_BYTES - 1):
                        m.d.sync += byte_i.eq(0)
                        m.next = "READ_CRC"
                    with m.Else():
                        m.next = "READ_DATA"
            with m.State("READ_CRC"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF), start.eq(free)]
                with m.If(done):
                    m.d.sync += [crc_rx.eq(Cat(rx, crc_rx[:8])), byte_i.eq(byte_i + 1)]
                    with m.If(byte_i == 1):
                        m.next = "READ_CHECK"
            with m.State("READ_CHECK"):
                m.d.comb += spi.cs_n.eq(0)
                with m.If(crc_rx != crc16.crc):
                    with m.If(multi):
                        m.d.sync += err.eq(StorageError.CRC)
                        send_cmd(12, 0, _After.CMD12)
                    with m.Else():
                        fail(StorageError.CRC)
                with m.Elif(blocks != 0):
                    m.d.sync += [blocks.eq(blocks - 1), wait.eq(0)]
                    m.next = "READ_TOKEN"
                with m.Elif(multi):
                    send_cmd(12, 0, _After.CMD12)
                with m.Else():
                    m.next = "DESELECT"
            # ---- writes --------------------------------------------------------------------------
            with m.State("WRITE_GAP"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF), start.eq(free),
                             crc16.start.eq(1)]
                with m.If(done):
                    m.next = "WRITE_TOKEN"
            with m.State("WRITE_TOKEN"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(Mux(multi, 0xFC, 0xFE)),
                             start.eq(free)]
                with m.If(done):
                    m.d.sync += todo.eq(SECTOR_BYTES)
                    m.next = "WRITE_DATA"
            with m.State("WRITE_DATA"):
                take = (todo != 0) & (free | done)
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(st.wdata.payload),
                             st.wdata.ready.eq(take), start.eq(take & st.wdata.valid),
                             crc16.valid.eq(take & st.wdata.valid),
                             crc16.data.eq(st.wdata.payload)]
                with m.If(take & st.wdata.valid):
                    m.d.sync += todo.eq(todo - 1)
                with m.If((todo == 0) & done):
                    m.d.sync += byte_i.eq(0)
                    m.next = "WRITE_CRC"
            with m.State("WRITE_CRC"):
                m.d.comb += [spi.cs_n.eq(0), start.eq(free),
                             tx_next.eq(Mux(byte_i == 0, crc16.crc[8:], crc16.crc[:8]))]
                with m.If(done):
                    m.d.sync += byte_i.eq(byte_i + 1)
                    with m.If(byte_i == 1):
                        m.next = "WRITE_RESPONSE"
            with m.State("WRITE_RESPONSE"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF), start.eq(free)]
                with m.If(done):
                    m.d.sync += [wait.eq(0), after_busy.eq(0)]
                    with m.If(rx[:5] == 0b00101):
                        m.next = "BUSY"
                    with m.Elif(rx[:5] == 0b01011):
                        m.d.sync += err.eq(StorageError.CRC)
                        m.next = "WRITE_ABORT"
                    with m.Else():
                        m.d.sync += err.eq(StorageError.CARD)
                        m.next = "WRITE_ABORT"
            with m.State("WRITE_ABORT"):
                # wait out the busy phase, then stop a multi-block write
                m.d.comb += spi.cs_n.eq(0)
                m.d.sync += [blocks.eq(0), wait.eq(0), after_busy.eq(0)]
                m.next = "BUSY"
            with m.State("BUSY"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF), start.eq(free)]
                with m.If(done):
                    with m.If(rx != 0x00):
                        with m.If(after_busy):
                            m.next = "DESELECT"
                        with m.Elif(blocks != 0):
                            m.d.sync += blocks.eq(blocks - 1)
                            m.next = "WRITE_GAP"
                        with m.Elif(multi):
                            m.next = "WRITE_STOP"
                        with m.Else():
                            m.next = "DESELECT"
                    with m.Elif(wait == self._busy_timeout - 1):
                        fail(StorageError.TIMEOUT)
                    with m.Else():
                        m.d.sync += wait.eq(wait + 1)
            with m.State("WRITE_STOP"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFD), start.eq(free)]
                with m.If(done):
                    m.next = "WRITE_STOP_GAP"
            with m.State("WRITE_STOP_GAP"):
                m.d.comb += [spi.cs_n.eq(0), tx_next.eq(0xFF), start.eq(free)]
                with m.If(done):
                    m.d.sync += [wait.eq(0), after_busy.eq(1)]
                    m.next = "BUSY"
            # ---- end of a transaction ----------------------------------------------------------
            with m.State("FAIL"):
                with m.If(err == StorageError.TIMEOUT):
                    m.d.sync += [self.ready.eq(0), fast.eq(0)]
                with m.If(err == StorageError.NOT_READY):
                    m.d.sync += [self.ready.eq(0), fast.eq(0)]
                m.next = "DESELECT"
            with m.State("DESELECT"):
                m.d.comb += [spi.cs_n.eq(1), tx_next.eq(0xFF), start.eq(free)]
                with m.If(done):
                    m.next = "STATUS"
                    with m.If(~in_cmd):
                        m.next = "IDLE"
            with m.State("STATUS"):
                m.d.comb += [st.status.valid.eq(~rbuf_valid), st.status.payload.error.eq(err)]
                with m.If(st.status.ready & ~rbuf_valid):
                    m.d.sync += in_cmd.eq(0)
                    m.next = "IDLE"
        return m
