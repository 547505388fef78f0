"""A bit-level SD card model in SPI mode, backed by an image file, to verify
``hw/storage/sdspi.py``.

:class:`SDCardSPI` is the card's protocol at byte level (full duplex: the byte the card sends
in a slot is fixed before it sees the byte it receives). It is strict where a sloppy controller
would get away on some cards and not on others:

* it ignores everything until it has seen >= 74 clocks with CS high after power-up;
* it checks the CRC7 of every command (R1 "CRC error" otherwise) and the CRC16 of every written
  block (data response "CRC error");
* it answers only after ``ncr`` filler bytes, holds ``ACMD41`` in the idle state for
  ``init_polls`` polls, needs ``CMD55`` before ``ACMD41``, reports "illegal command" for
  commands it does not know (and for ``CMD8`` when it is an SD v1 card);
* it inserts ``read_latency`` filler bytes before each read data token, sends one stuff byte
  with bit 7 clear after ``CMD12`` (a controller that does not skip it takes it for the R1),
  and stays busy for ``busy_bytes`` bytes after each written block and after the stop token.

SDHC cards (``sdhc=True``) are block addressed; SDSC cards byte addressed (and need ``CMD16``).
Written blocks go to the :class:`~ringkv.sim.sector_model.SectorImage` at once (a power cut
after ``cut_after`` data bytes raises :class:`~ringkv.sim.sector_model.PowerCut`, leaving the
block being written torn). ``dead`` = ``"high"`` (MISO stuck high: no card / card gone) or
``"low"`` (stuck low: busy forever) makes the card stop answering, at any time.

Two bit-level adapters drive the SPI pins (mode 0: sample MOSI on the rising SCLK edge, change
MISO after it): :func:`amaranth_sd_card` for the Amaranth simulator and
:class:`CocotbSDCard` for cocotb.
"""

from collections import deque

from amaranth.lib.crc import catalog

from .sector_model import PowerCut, SectorImage

__all__ = ["SDCardSPI", "amaranth_sd_card", "CocotbSDCard"]

_CRC7 = catalog.CRC7_MMC()
_CRC16 = catalog.CRC16_XMODEM()


def crc7_byte(frame5: bytes) -> int:
    return (_CRC7.compute(frame5) << 1) | 1


class SDCardSPI:
    """Byte-level SPI-mode SD card; :meth:`exchange` is one byte slot."""

    def __init__(self, image: SectorImage, *, sdhc=True, v2=True, ncr=1, init_polls=3,
                 read_latency=2, busy_bytes=3, cut_after=None, dead=None, bad_read_crc=0):
        self.image = image
        self.sdhc, self.v2 = sdhc, v2
        self.ncr, self.init_polls, self.read_latency = ncr, init_polls, read_latency
        self.busy_bytes = busy_bytes
        self.cut_after = cut_after
        self.dead = dead
        self.bad_read_crc = bad_read_crc   # the next N read blocks carry a wrong CRC16
        self.out = deque()
        self.clocks_cs_high = 0
        self.awake = False
        self.idle = True
        self.initialised = False
        self.app = False
        self.frame = bytearray()
        self.mode = "cmd"          # cmd, read, write_single, write_multi
        self.rx_block = None
        self.rd_lba = 0
        self.wr_lba = 0
        self.polls = 0
        self.log = []
        self.crc_errors = 0
        self.block_len_set = False

    def power_cycle(self):
        """Power off and on: the card forgets everything but its image."""
        self.out.clear()
        self.clocks_cs_high = 0
        self.awake, self.idle, self.initialised, self.app = False, True, False, False
        self.frame = bytearray()
        self.mode = "cmd"
        self.rx_block = None
        self.block_len_set = False

    # --- byte slots ---------------------------------------------------------------------------
    def peek(self) -> int:
        """The byte the card sends in the next slot (call at the start of a slot)."""
        if self.mode == "read" and len(self.out) < 4:
            self._queue_read_block()
        return self.out[0] if self.out else 0xFF

    def exchange(self, mosi: int) -> int:
        """End of a byte slot with CS low: returns the byte the card sent (``peek``), takes
        ``mosi``."""
        miso = self.out.popleft() if self.out else 0xFF
        self._receive(mosi)
        return miso

    def deselected_clock(self):
        """One SCLK cycle with CS high."""
        self.clocks_cs_high += 1
        if self.clocks_cs_high >= 74:
            self.awake = True

    def _respond(self, *data):
        self.out.extend([0xFF] * self.ncr)
        self.out.extend(data)

    def _r1(self):
        return 0x01 if self.idle else 0x00

    def _receive(self, byte):
        if self.mode in ("write_single", "write_multi"):
            self._receive_write(byte)
            return
        if not self.frame:
            if byte & 0xC0 != 0x40:
                return
        self.frame.append(byte)
        if len(self.frame) == 6:
            frame, self.frame = bytes(self.frame), bytearray()
            self._command(frame)

    def _command(self, frame):
        index = frame[0] & 0x3F
        arg = int.from_bytes(frame[1:5], "big")
        self.log.append((index, arg))
        if not self.awake:
            return
        if crc7_byte(frame[:5]) != frame[5]:
            self.crc_errors += 1
            self.out.clear()
            self._respond(self._r1() | 0x08)
            return
        app, self.app = self.app, False
        if self.mode == "read":
            if index == 12:
                self.mode = "cmd"
                self.out.clear()
                self.out.extend([0x5A, 0x00, *([0x00] * self.busy_bytes)])
                return
            if index != 0:
                return               # a running multi-block read only listens for CMD12 / CMD0
            self.mode = "cmd"        # CMD0 resets the card in any state
            self.out.clear()
        if index == 0:
            self.idle, self.initialised = True, False
            self.polls = 0
            self.out.clear()
            self._respond(0x01)
        elif index == 8:
            if not self.v2:
                self._respond(0x05)
            else:
                self._respond(self._r1(), 0x00, 0x00, (arg >> 8) & 0x0F, arg & 0xFF)
        elif index == 55:
            self.app = True
            self._respond(self._r1())
        elif index == 41 and app:
            hcs = bool(arg & 0x4000_0000)
            if self.sdhc and not hcs:
                self._respond(self._r1())       # an SDHC card never leaves idle without HCS
                return
            self.polls += 1
            if self.polls > self.init_polls:
                self.idle, self.initialised = False, True
            self._respond(self._r1())
        elif index == 58:
            ocr = 0x00FF8000 | (0x8000_0000 if self.initialised else 0)
            if self.initialised and self.sdhc:
                ocr |= 0x4000_0000
            self._respond(self._r1(), *ocr.to_bytes(4, "big"))
        elif index == 16:
            self.block_len_set = arg == 512
            self._respond(self._r1() | (0 if arg == 512 else 0x40))
        elif self.idle:
            self._respond(0x05)
        elif index in (17, 18, 24, 25):
            lba = self._lba(arg)
            if lba is None:
                self._respond(0x20)             # address error
                return
            self._respond(0x00)
            if index in (17, 18):
                self.rd_lba = lba
                self._queue_read_block()
                if index == 18:
                    self.mode = "read"
            else:
                self.wr_lba = lba
                self.mode = "write_single" if index == 24 else "write_multi"
                self.rx_block = None
        elif index == 12:
            self._respond(0x00)
        else:
            self._respond(0x04)

    def _lba(self, arg):
        if self.sdhc:
            lba = arg
        else:
            if arg % 512 or not self.block_len_set:
                return None
            lba = arg // 512
        return lba if lba < self.image.sectors else None

    def _queue_read_block(self):
        if self.rd_lba >= self.image.sectors:
            self.out.extend([0xFF] * self.read_latency + [0x08])    # error token: out of range
            return
        data = self.image.read(self.rd_lba, 1)
        self.out.extend([0xFF] * self.read_latency + [0xFE])
        self.out.extend(data)
        crc = _CRC16.compute(data)
        if self.bad_read_crc:
            self.bad_read_crc -= 1
            crc ^= 0x0100
        self.out.extend(crc.to_bytes(2, "big"))
        self.rd_lba += 1

    def _receive_write(self, byte):
        if self.rx_block is None:
            if self.out:
                return                    # still answering (R1, data response, busy)
            if byte == 0xFE and self.mode == "write_single":
                self.rx_block = bytearray()
            elif byte == 0xFC and self.mode == "write_multi":
                self.rx_block = bytearray()
            elif byte == 0xFD and self.mode == "write_multi":
                self.mode = "cmd"
                self.out.extend([0xFF] + [0x00] * self.busy_bytes)
            return
        self.rx_block.append(byte)
        if len(self.rx_block) <= 512 and self.cut_after is not None:
            if self.cut_after == 0:
                self.image.write(self.wr_lba, bytes(self.rx_block[:-1]))
                raise PowerCut(f"power cut in sector {self.wr_lba}")
            self.cut_after -= 1
        if len(self.rx_block) == 514:
            data, crc = bytes(self.rx_block[:512]), int.from_bytes(self.rx_block[512:], "big")
            self.rx_block = None
            if _CRC16.compute(data) != crc:
                self.crc_errors += 1
                self.out.extend([0x0B])
            else:
                self.image.write(self.wr_lba, data)
                self.wr_lba += 1
                self.out.extend([0x05] + [0x00] * self.busy_bytes)
            if self.mode == "write_single":
                self.mode = "cmd"


async def amaranth_sd_card(ctx, spi, card: SDCardSPI):
    """Drive ``spi.miso`` of an Amaranth design from ``card`` (run as a background testbench).

    Samples ``sclk``, ``cs_n`` and ``mosi`` at every clock and acts on SCLK rising edges: MOSI
    is taken, and MISO moves to the next bit right after the edge the controller sampled it on.
    """
    prev_sclk, prev_cs = 0, 1
    bit, byte_in, byte_out = 0, 0, 0xFF
    ctx.set(spi.miso, 1)
    async for _, _, sclk, cs_n, mosi in ctx.tick().sample(spi.sclk, spi.cs_n, spi.mosi):
        rising = sclk and not prev_sclk
        if cs_n:
            if rising:
                card.deselected_clock()
            bit, byte_in, miso = 0, 0, 1
        else:
            if prev_cs:
                bit, byte_in = 0, 0
                byte_out = card.peek()
            if rising:
                byte_in = (byte_in << 1) | mosi
                bit += 1
                if bit == 8:
                    card.exchange(byte_in)
                    bit, byte_in = 0, 0
                    byte_out = card.peek()
            miso = (byte_out >> (7 - bit)) & 1
        if card.dead == "high":
            miso = 1
        elif card.dead == "low":
            miso = 0
        ctx.set(spi.miso, miso)
        prev_sclk, prev_cs = sclk, cs_n


class CocotbSDCard:
    """The same card on the pins of a Verilated design: ``cocotb.start_soon(card.run())``."""

    def __init__(self, dut, prefix, card: SDCardSPI):
        self.sclk = getattr(dut, f"{prefix}__sclk")
        self.mosi = getattr(dut, f"{prefix}__mosi")
        self.miso = getattr(dut, f"{prefix}__miso")
        self.cs_n = getattr(dut, f"{prefix}__cs_n")
        self.card = card
        self.miso.value = 1

    def _drive(self, value):
        if self.card.dead == "high":
            value = 1
        elif self.card.dead == "low":
            value = 0
        self.miso.value = value

    async def run(self):
        from cocotb.triggers import Edge, First, RisingEdge
        card = self.card
        rise, cs_edge = RisingEdge(self.sclk), Edge(self.cs_n)
        bit, byte_in, byte_out = 0, 0, 0xFF
        while True:
            fired = await First(rise, cs_edge)
            if int(self.cs_n.value):
                if fired is rise:
                    card.deselected_clock()
                bit, byte_in = 0, 0
                self._drive(1)
                continue
            if fired is not rise:             # just selected: first bit of the pending byte
                bit, byte_in = 0, 0
                byte_out = card.peek()
                self._drive((byte_out >> 7) & 1)
                continue
            byte_in = (byte_in << 1) | int(self.mosi.value)
            bit += 1
            if bit == 8:
                card.exchange(byte_in)
                bit, byte_in = 0, 0
                byte_out = card.peek()
            self._drive((byte_out >> (7 - bit)) & 1)
