"""A bit-level SD card model in native mode (1- and 4-bit bus), backed by an image file, to
verify ``hw/storage/sdnative.py``.

:class:`SDCard4` is the card's protocol, one call of :meth:`SDCard4.clock` per rising edge of
SD CLK (it takes the host's drive of CMD and DAT0-3 sampled at that edge and decides what the
card drives in the next clock cycle, from the following falling edge: default-speed timing).
It is independent of any simulator; two adapters put it on pins: :func:`amaranth_sd4_card`
(Amaranth simulator) and :class:`CocotbSD4Card` (cocotb on Verilator); once high speed is
switched on (``CMD6``) they change the card's outputs right after the rising edge instead, as
the SD specification's high-speed timing has it.

It follows the SD Physical Layer Simplified Specification (states idle, ready, ident, stby,
tran, data, rcv, prg) and is strict where a sloppy host would get away on some cards:

* it ignores everything until it has seen >= 74 clocks after power-up;
* it checks the CRC7 of every command: a bad one is not answered, and ``COM_CRC_ERROR`` is set
  in the next response (the host sees a timeout); so are unknown commands and commands not
  allowed in the current state (``ILLEGAL_COMMAND``), as a real card does in native mode;
* it checks the CRC16 of every written block on every DAT line (CRC status token "negative"
  ``101`` otherwise) and the start and end bits;
* it records protocol violations in :attr:`SDCard4.violations` (a command less than 8 clocks
  after the previous response (N_CC / N_RC), write data less than 2 clocks after the response
  (N_WR), the host driving a line while the card drives it, a missing end bit); tests assert
  the list stays empty;
* responses come ``ncr`` clocks after the command's end bit (2..64 in the SD spec), read data
  ``nac`` clocks after the read command's end bit (possibly while the response is still being
  sent, as the SD spec allows) and ``block_gap`` clocks between the blocks of a multi-block read;
  a write block's CRC status token starts 2 clocks after its end bit and is followed by
  ``busy_clocks`` clocks of busy (DAT0 low); R1b commands (``CMD7``, ``CMD12``) are busy for
  ``busy_clocks`` after their response;
* ``CMD6`` answers the 512-bit switch status; ``high_speed`` says whether function 1 of group 1
  (high speed) is supported;
* ``sdhc=False`` makes an SDSC card (``ACMD41`` answers CCS = 0), ``v2=False`` a v1 card (no
  answer to ``CMD8``).

The CSD (``csd_version``, by default 2.0 for an SDHC card and 1.0 for an SDSC card, as real
cards have it) gives the capacity from the image size: version 2.0 ``C_SIZE`` in units of 1024
sectors, version 1.0 ``C_SIZE`` with ``C_SIZE_MULT`` = 7 and ``READ_BL_LEN`` = 9 (units of 512
sectors), both rounded up (:attr:`SDCard4.sectors`, :func:`csd_sectors` decodes either); a
read or write beyond the image gets ``OUT_OF_RANGE`` in its response.

Written blocks go to the :class:`~ringkv.sim.sector_model.SectorImage` at once (a power cut after
``cut_after`` data bytes raises :class:`~ringkv.sim.sector_model.PowerCut`, leaving the block
being written torn). ``dead`` = ``"high"`` (no card / card gone: nothing driven, the pull-ups
read 1) or ``"low"`` (DAT lines stuck low: busy forever); a card that comes back after being
dead has been power-cycled. Injected faults: ``bad_read_crc`` (the next N read blocks carry a
wrong CRC16 on DAT2), ``bad_resp_crc`` (the next N responses a wrong CRC7), ``bad_write_bus``
(a bit of each of the next N written blocks flips on the bus: the card answers "CRC error"),
``write_error``
(the next N written blocks get the CRC status "write error" ``110``), ``fail_next`` (R1 error
bits the next data command is answered with, not executing it), ``die_after`` (the card is
pulled out, ``dead = "high"``, after that many more clocks).
"""

from collections import deque

from amaranth.lib.crc import catalog

from .sector_model import PowerCut, SectorImage

__all__ = ["SDCard4", "amaranth_sd4_card", "CocotbSD4Card", "crc7", "crc16_lines",
           "R1_ERRORS", "csd_sectors"]

_CRC7 = catalog.CRC7_MMC()
_CRC16 = catalog.CRC16_XMODEM()

OUT_OF_RANGE = 1 << 31
BLOCK_LEN_ERROR = 1 << 29
COM_CRC_ERROR = 1 << 23
ILLEGAL_COMMAND = 1 << 22
ERROR = 1 << 19
APP_CMD = 1 << 5
READY_FOR_DATA = 1 << 8
#: card status bits that are errors (reported in R1)
R1_ERRORS = 0xFDF80008
_CLEAR_ON_READ = 0xFDF80008
_STATES = {"idle": 0, "ready": 1, "ident": 2, "stby": 3, "tran": 4, "data": 5, "rcv": 6,
           "prg": 7}


def csd_sectors(csd: int) -> int:
    """Capacity in 512-byte sectors of a 128-bit CSD register, version 1.0 or 2.0 (SD Physical
    Layer Simplified Specification, 5.3.2 and 5.3.3)."""
    version = csd >> 126
    if version == 1:
        return (((csd >> 48) & 0x3F_FFFF) + 1) * 1024
    if version == 0:
        c_size, mult, bl_len = (csd >> 62) & 0xFFF, (csd >> 47) & 7, (csd >> 80) & 0xF
        return ((c_size + 1) << (mult + 2 + bl_len)) // 512
    raise ValueError(f"CSD structure version {version} is reserved")


def crc7(value: int, bits: int) -> int:
    """CRC7 (SD) of the ``bits`` most significant... of ``value`` taken as a ``bits``-bit string
    (``bits`` a multiple of 8)."""
    return _CRC7.compute(value.to_bytes(bits // 8, "big"))


def _bits(value: int, n: int) -> list[int]:
    return [(value >> (n - 1 - i)) & 1 for i in range(n)]


def _crc16_bits(bits) -> int:
    crc = 0
    for b in bits:
        fb = ((crc >> 15) & 1) ^ b
        crc = (crc << 1) & 0xFFFF
        if fb:
            crc ^= 0x1021
    return crc


def crc16_lines(data: bytes, width: int) -> list[int]:
    """The CRC16 of each DAT line when ``data`` goes over a ``width``-bit bus (MSB first)."""
    lines = [[] for _ in range(width)]
    for chunk in _chunks(data, width):
        for k in range(width):
            lines[k].append((chunk >> k) & 1)
    return [_crc16_bits(line) for line in lines]


def _chunks(data: bytes, width: int):
    per = 8 // width
    mask = (1 << width) - 1
    for byte in data:
        for i in range(per):
            yield (byte >> (8 - width * (i + 1))) & mask


class SDCard4:
    """SD card in native mode; :meth:`clock` is one rising edge of SD CLK."""

    def __init__(self, image: SectorImage, *, high_speed=True, sdhc=True, v2=True, ncr=2,
                 nac=4, block_gap=2, init_polls=3, busy_clocks=8, rca=0x5A3C, cut_after=None,
                 dead=None, bad_read_crc=0, bad_resp_crc=0, bad_write_bus=0, write_error=0,
                 fail_next=0, die_after=None, csd_version=None):
        self.image = image
        self.csd_version = csd_version if csd_version is not None else (2 if sdhc else 1)
        if self.csd_version not in (1, 2):
            raise ValueError(f"csd_version must be 1 or 2, not {csd_version!r}")
        self.high_speed_supported = high_speed
        self.sdhc, self.v2 = sdhc, v2
        self.ncr, self.nac, self.block_gap = ncr, nac, block_gap
        self.init_polls, self.busy_clocks = init_polls, busy_clocks
        self.new_rca = rca
        self.cut_after = cut_after
        self.dead = dead
        self.bad_read_crc, self.bad_resp_crc = bad_read_crc, bad_resp_crc
        self.write_error, self.fail_next = write_error, fail_next
        self.bad_write_bus = bad_write_bus
        self.die_after = die_after
        unit = 1024 if self.csd_version == 2 else 512
        self.csize = (image.sectors + unit - 1) // unit - 1
        if self.csd_version == 1 and self.csize > 0xFFF:
            raise ValueError(f"{image.sectors} sectors do not fit a version 1.0 CSD "
                             f"(at most 2097152)")
        self.log = []              # (index, arg, app) of every command with a good CRC
        self.violations = []
        self.crc_errors = 0        # commands and written blocks with a bad CRC
        self.clocks = 0
        self.cmd_out = None        # what the card drives now (None: high impedance)
        self.dat_out = None        # (mask of lines driven, value) or None
        self._gone = False
        self.power_cycle()

    def power_cycle(self):
        """Power off and on: the card forgets everything but its image."""
        self.awake_clocks = 0
        self.state = "idle"
        self.status = 0
        self.app = False
        self.rca = 0
        self.width = 1
        self.high_speed = False
        self.polls = 0
        self.ccs = False
        self.cmd_q, self.dat_q = deque(), deque()
        self.cmd_rx = None
        self.dat_rx = None
        self.last_end = -100       # clock of the last response's (or command's) end bit
        self.resp_end = -100
        self.rd_lba = self.wr_lba = 0
        self.rd_multi = self.wr_multi = False
        self.cmd_out = None
        self.dat_out = None

    @property
    def sectors(self):
        """The capacity the CSD reports (the image size rounded up to the CSD's unit)."""
        return (self.csize + 1) * (1024 if self.csd_version == 2 else 512)

    # --- one clock ----------------------------------------------------------------------------
    def clock(self, cmd_oe: int, cmd_o: int, dat_oe: int, dat_o: int):
        """A rising edge of SD CLK: the host drives CMD (``cmd_oe``/``cmd_o``) and DAT0-3
        (``dat_oe``/``dat_o``). Afterwards :attr:`cmd_out` / :attr:`dat_out` hold what the card
        drives in the next clock cycle (from the falling edge)."""
        if self.die_after is not None:
            self.die_after -= 1
            if self.die_after <= 0:
                self.dead, self.die_after = "high", None
        if self.dead:
            self._gone = True
            self.cmd_out = None
            self.dat_out = (0xF, 0) if self.dead == "low" else None
            return
        if self._gone:
            self._gone = False
            self.power_cycle()
        self.clocks += 1
        if cmd_oe and self.cmd_out is not None:
            self.violations.append(f"clock {self.clocks}: CMD driven by host and card")
        if dat_oe and self.dat_out is not None:
            self.violations.append(f"clock {self.clocks}: DAT driven by host and card")
        cmd = (cmd_o if cmd_oe else 1) & (1 if self.cmd_out is None else self.cmd_out)
        dat = dat_o if dat_oe else 0xF
        if self.dat_out is not None:
            mask, value = self.dat_out
            dat &= value | (~mask & 0xF)
        if self.awake_clocks < 74:
            self.awake_clocks += 1
        else:
            self._cmd_bit(cmd)
            self._dat_bits(dat)
        if self.state == "data" and self.rd_multi and len(self.dat_q) < 8:
            self._queue_read_block(self.block_gap)
        self.cmd_out = self.cmd_q.popleft() if self.cmd_q else None
        self.dat_out = self.dat_q.popleft() if self.dat_q else None
        if self.dat_out is None and not self.dat_q:
            if self.state == "prg":
                self.state = "rcv" if self.wr_multi else "tran"
            elif self.state == "data" and not self.rd_multi:
                self.state = "tran"

    # --- commands -----------------------------------------------------------------------------
    def _cmd_bit(self, cmd):
        if self.cmd_rx is None:
            if cmd == 0 and self.cmd_out is None:
                if self.cmd_q:
                    self.violations.append(f"clock {self.clocks}: command during a response")
                elif self.clocks - self.last_end <= 8:
                    self.violations.append(f"clock {self.clocks}: command "
                                           f"{self.clocks - self.last_end - 1} clocks after the "
                                           f"previous end bit (N_CC/N_RC >= 8)")
                self.cmd_rx = [0]
            return
        self.cmd_rx.append(cmd)
        if len(self.cmd_rx) == 48:
            frame = int("".join(map(str, self.cmd_rx)), 2)
            self.cmd_rx = None
            self.last_end = self.clocks
            self._command(frame)

    def _command(self, frame):
        if not (frame >> 46) & 1 or not frame & 1:
            self.violations.append(f"clock {self.clocks}: bad transmission or end bit")
            return
        index, arg = (frame >> 40) & 0x3F, (frame >> 8) & 0xFFFF_FFFF
        if crc7(frame >> 8, 40) != (frame >> 1) & 0x7F:
            self.crc_errors += 1
            self.status |= COM_CRC_ERROR
            self.app = False
            return
        app, self.app = self.app, False
        self.log.append((index, arg, app))
        st = self.state
        mine = arg >> 16 == self.rca
        if index == 0:
            self.power_cycle()
            self.awake_clocks = 74
            self.last_end = self.clocks
            return
        if app and index == 41 and st in ("idle", "ready"):
            if arg & 0x00FF_8000:
                self.polls += 1
                if self.polls > self.init_polls and (arg & (1 << 30) or not self.sdhc):
                    self.state = "ready"
                    self.ccs = self.sdhc and self.v2
            ocr = 0x00FF_8000
            if self.state == "ready":
                ocr |= (1 << 31) | ((1 << 30) if self.ccs else 0)
            self._respond(self._frame48(0x3F, ocr, crc=False))
            return
        if app and index == 6 and st == "tran":
            if arg & 3 not in (0, 2):
                return self._illegal()
            r = self._r1(index)
            self.width = 4 if arg & 3 == 2 else 1
            return self._respond(r)
        if index == 8 and st == "idle" and self.v2:
            return self._respond(self._frame48(8, arg & 0xFFF))
        if index == 55 and (st in ("idle", "ready") or mine):
            self.app = True
            return self._respond(self._r1(index, APP_CMD))
        if index == 2 and st == "ready":
            self.state = "ident"
            cid = (0x1B << 120) | (0x534D << 104) | (int.from_bytes(b"RKV4 ", "big") << 64) \
                | (0x10 << 56) | (0x12345678 << 24) | (0x14B << 8)
            return self._respond(self._r2(cid))
        if index == 3 and st in ("ident", "stby"):
            self.state = "stby"
            self.rca = self.new_rca
            s = self.status
            packed = (((s >> 23) & 1) << 15) | (((s >> 22) & 1) << 14) | (((s >> 19) & 1) << 13) \
                | (_STATES["ident"] << 9 if st == "ident" else s & 0x1FFF) | READY_FOR_DATA
            self.status &= ~_CLEAR_ON_READ
            return self._respond(self._frame48(3, (self.rca << 16) | packed))
        if index == 9 and st == "stby" and mine:
            return self._respond(self._r2(self._csd()))
        if index == 7 and st == "stby" and mine:
            r = self._r1(index)
            self.state = "tran"
            return self._respond(r, busy=True)
        if index == 13 and st in ("stby", "tran", "data", "rcv", "prg") and mine:
            return self._respond(self._r1(index))
        if index == 16 and st == "tran":
            extra = 0 if arg == 512 else BLOCK_LEN_ERROR
            return self._respond(self._r1(index, extra))
        if index == 6 and st == "tran":
            r = self._r1(index)
            self._respond(r)
            self._queue_block(self._switch(arg), self.nac)
            self.state = "data"
            self.rd_multi = False
            return None
        if index in (17, 18, 24, 25) and st == "tran":
            return self._data_command(index, arg)
        if index == 12 and st in ("data", "rcv", "prg"):
            r = self._r1(index)
            if st == "data":
                # the data stops two clocks after the end bit of CMD12
                keep = [self.dat_q.popleft() for _ in range(min(2, len(self.dat_q)))]
                self.dat_q.clear()
                self.dat_q.extend(keep)
                if keep and keep[-1] is not None and keep[-1][1] != 0xF:
                    self.dat_q.append((0xF, 0xF))
                self.state = "tran"
                self.rd_multi = False
                return self._respond(r)
            self.dat_rx = None                 # a block being received is dropped
            self.wr_multi = False
            self.state = "prg"
            return self._respond(r, busy=True)
        return self._illegal()

    def _illegal(self):
        self.status |= ILLEGAL_COMMAND
        self.app = False

    def _data_command(self, index, arg):
        if self.fail_next:
            bits, self.fail_next = self.fail_next, 0
            return self._respond(self._r1(index, bits))
        lba = arg if self.ccs else arg // 512
        if lba >= self.image.sectors:
            return self._respond(self._r1(index, OUT_OF_RANGE))
        r = self._r1(index)
        self._respond(r)
        if index in (17, 18):
            self.state = "data"
            self.rd_lba, self.rd_multi = lba, index == 18
            self._queue_read_block(self.nac)
        else:
            self.state = "rcv"
            self.wr_lba, self.wr_multi = lba, index == 25
        return None

    # --- responses ----------------------------------------------------------------------------
    def _r1(self, index, extra=0):
        s = self.status | extra | (_STATES[self.state] << 9) | READY_FOR_DATA
        if self.app or index == 55:
            s |= APP_CMD
        self.status &= ~_CLEAR_ON_READ
        return self._frame48(index, s)

    def _frame48(self, index, arg, crc=True):
        head = (index << 32) | arg           # start 0, transmission 0
        c = crc7(head, 40) if crc else 0x7F
        return _bits((head << 8) | (c << 1) | 1, 48)

    def _r2(self, reg128):
        reg = (reg128 & ~0xFF) | (crc7(reg128 >> 8, 120) << 1) | 1
        return _bits((0x3F << 128) | reg, 136)

    def _respond(self, bits, busy=False):
        if self.bad_resp_crc:
            self.bad_resp_crc -= 1
            bits = list(bits)
            bits[-3] ^= 1                    # a CRC7 bit
        self.cmd_q.extend([None] * self.ncr)
        self.cmd_q.extend(bits)
        self.resp_end = self.last_end = self.clocks + self.ncr + len(bits)
        if busy:
            self.dat_q.clear()
            self.dat_q.extend([(1, 0)] * (self.ncr + len(bits) + self.busy_clocks))

    def _csd(self):
        speed = 0x5A if self.high_speed else 0x32
        if self.csd_version == 1:
            # CSD 1.0: TAAC, NSAC, READ_BL_LEN 9, C_SIZE, C_SIZE_MULT 7, ERASE_BLK_EN,
            # SECTOR_SIZE, R2W_FACTOR, WRITE_BL_LEN 9
            return ((0x26 << 112) | (speed << 96) | (0x5F5 << 84) | (9 << 80)
                    | (self.csize << 62) | (7 << 47) | (1 << 46) | (0x7F << 39) | (2 << 26)
                    | (9 << 22))
        csd = (1 << 126) | (0x0E << 112) | (speed << 96) | (0x5B5 << 84) | (9 << 80) \
            | (self.csize << 48) | (1 << 46) | (0x7F << 39) | (2 << 26) | (9 << 22)
        return csd

    def _switch(self, arg):
        set_mode = arg >> 31
        fn = arg & 0xF
        support1 = 0x8003 if self.high_speed_supported else 0x8001
        if fn == 0xF:
            result = 1 if self.high_speed else 0
        elif fn in (0, 1) and (fn == 0 or self.high_speed_supported):
            result = fn
            if set_mode:
                self.high_speed = fn == 1
        else:
            result = 0xF
        status = (100 << 496)
        for group in range(2, 7):
            status |= 0x8001 << (400 + 16 * (group - 1))
        status |= support1 << 400
        status |= result << 376
        for group in range(2, 7):
            status |= (0 if (arg >> (4 * (group - 1))) & 0xF in (0, 0xF) else 0xF) \
                << (376 + 4 * (group - 1))
        return status.to_bytes(64, "big")

    # --- data ---------------------------------------------------------------------------------
    def _queue_block(self, data, gap, bad_crc=False):
        w = self.width
        mask = (1 << w) - 1
        self.dat_q.extend([None] * gap)
        self.dat_q.append((mask, 0))
        self.dat_q.extend((mask, c) for c in _chunks(data, w))
        crcs = crc16_lines(data, w)
        if bad_crc:
            crcs[w - 2 if w > 1 else 0] ^= 0x0100
        for i in range(16):
            self.dat_q.append((mask, sum(((crcs[k] >> (15 - i)) & 1) << k for k in range(w))))
        self.dat_q.append((mask, mask))

    def _queue_read_block(self, gap):
        if self.rd_lba >= self.image.sectors:
            # a multi-block read past the last sector: no more data, the card stays in the
            # data state until CMD12 (which reports OUT_OF_RANGE)
            self.status |= OUT_OF_RANGE
            return
        bad = self.bad_read_crc > 0
        if bad:
            self.bad_read_crc -= 1
        self._queue_block(self.image.read(self.rd_lba, 1), gap, bad)
        self.rd_lba += 1

    def _dat_bits(self, dat):
        if self.state != "rcv" or self.dat_q or self.dat_out is not None:
            return
        w = self.width
        mask = (1 << w) - 1
        if self.dat_rx is None:
            if dat & 1:
                return
            if dat & mask:
                self.violations.append(f"clock {self.clocks}: start bit not on every DAT line")
            if self.clocks - self.resp_end <= 2:
                self.violations.append(f"clock {self.clocks}: write data "
                                       f"{self.clocks - self.resp_end - 1} clocks after the "
                                       f"response (N_WR >= 2)")
            self.dat_rx = {"chunks": [], "bytes": bytearray(), "acc": 0, "n": 0}
            return
        rx = self.dat_rx
        rx["chunks"].append(dat & mask)
        per = 8 // w
        total = 512 * per
        if len(rx["chunks"]) <= total:
            rx["acc"] = (rx["acc"] << w) | (dat & mask)
            rx["n"] += 1
            if rx["n"] == per:
                rx["bytes"].append(rx["acc"])
                rx["acc"], rx["n"] = 0, 0
                if self.cut_after is not None:
                    if self.cut_after == 0:
                        self.image.write(self.wr_lba, bytes(rx["bytes"][:-1]))
                        raise PowerCut(f"power cut in sector {self.wr_lba}")
                    self.cut_after -= 1
            return
        if len(rx["chunks"]) < total + 17:
            return
        self.dat_rx = None
        chunks = rx["chunks"]
        if chunks[-1] != mask:
            self.violations.append(f"clock {self.clocks}: write block without end bit")
        data = bytes(rx["bytes"])
        if self.bad_write_bus:
            self.bad_write_bus -= 1
            data = bytes([data[0] ^ 0x10]) + data[1:]
        got = [sum(((chunks[total + i] >> k) & 1) << (15 - i) for i in range(16))
               for k in range(w)]
        self.dat_q.append(None)
        if got != crc16_lines(data, w):
            self.crc_errors += 1
            token = 0b101
        elif self.write_error:
            self.write_error -= 1
            token = 0b110
        else:
            token = 0b010
            self.image.write(self.wr_lba, data)
            self.wr_lba += 1
        self.dat_q.extend((1, b) for b in (0, token >> 2, (token >> 1) & 1, token & 1, 1))
        if token == 0b010:
            self.dat_q.extend([(1, 0)] * self.busy_clocks)
            self.state = "prg"
        elif not self.wr_multi:
            self.state = "tran"


# --- adapters ---------------------------------------------------------------------------------

def _card_inputs(card, cmd_o, cmd_oe, dat_o, dat_oe):
    cmd = 1 if card.cmd_out is None else card.cmd_out
    if cmd_oe:
        cmd &= cmd_o
    dat = dat_o if dat_oe else 0xF
    if card.dat_out is not None:
        mask, value = card.dat_out
        dat &= value | (~mask & 0xF)
    return cmd, dat


async def amaranth_sd4_card(ctx, bus, card: SDCard4):
    """Put ``card`` on the pins ``bus`` (``clk``, ``cmd.o/oe/i``, ``dat.o/oe/i``) of an
    Amaranth design (run as a background testbench).

    Acts on every change of ``bus.clk``: at a rising edge the card takes the host's drive; its
    own drive changes at the falling edge in default speed, right after the rising edge in high
    speed (as a real card's outputs do; visible to the design at its next clock edge, as with
    an output delay below one system clock).
    """
    ctx.set(bus.cmd.i, 1)
    ctx.set(bus.dat.i, 0xF)
    while True:
        await ctx.changed(bus.clk)
        clk = ctx.get(bus.clk)
        cmd_o, cmd_oe = ctx.get(bus.cmd.o), ctx.get(bus.cmd.oe)
        dat_o, dat_oe = ctx.get(bus.dat.o), ctx.get(bus.dat.oe)
        if clk:
            card.clock(cmd_oe, cmd_o, dat_oe, dat_o)
        if bool(clk) == card.high_speed:
            cmd, dat = _card_inputs(card, cmd_o, cmd_oe, dat_o, dat_oe)
            ctx.set(bus.cmd.i, cmd)
            ctx.set(bus.dat.i, dat)


class CocotbSD4Card:
    """The same card on the pins of a Verilated design: ``cocotb.start_soon(card.run())``;
    ``prefix`` names the bus (``{prefix}__clk``, ``{prefix}__cmd__o`` ...)."""

    def __init__(self, dut, prefix, card: SDCard4):
        def pin(name):
            return getattr(dut, f"{prefix}__{name}")
        self.clk = pin("clk")
        self.cmd_o, self.cmd_oe, self.cmd_i = pin("cmd__o"), pin("cmd__oe"), pin("cmd__i")
        self.dat_o, self.dat_oe, self.dat_i = pin("dat__o"), pin("dat__oe"), pin("dat__i")
        self.card = card
        self.cmd_i.value = 1
        self.dat_i.value = 0xF

    async def run(self):
        from cocotb.triggers import Edge
        card = self.card
        edge = Edge(self.clk)
        while True:
            await edge
            cmd_o, cmd_oe = int(self.cmd_o.value), int(self.cmd_oe.value)
            dat_o, dat_oe = int(self.dat_o.value), int(self.dat_oe.value)
            clk = int(self.clk.value)
            if clk:
                card.clock(cmd_oe, cmd_o, dat_oe, dat_o)
            if bool(clk) == card.high_speed:
                cmd, dat = _card_inputs(card, cmd_o, cmd_oe, dat_o, dat_oe)
                self.cmd_i.value = cmd
                self.dat_i.value = dat
