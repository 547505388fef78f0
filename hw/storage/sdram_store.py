"""Sector storage in SDRAM: a storage-port target (``hw/storage/port.py``) over one user port of
the SDRAM controller (``hw/sdram/controller.py``), so that the DMA engine moves records to and
from the SDRAM hot tier exactly as to the SD card (issue #35).

Layout: sector ``lba`` is the 256 16-bit words from word address ``base + lba * 256``; byte
``2 * i`` of the sector is the **low** byte of word ``i`` and byte ``2 * i + 1`` its high byte
(little endian, the order the byte stream and the ring port already use). The golden model is
:func:`ringkv.host.golden.sdram.sector_words` (the words of a sector) over a sector image
(``ringkv.sim.sector_model.SectorImage``: what the port reads back).

Protocol (the storage port's): ``count == 0`` or ``lba + count > sectors`` gets ``RANGE`` at
once, with no data phase and no SDRAM command. Otherwise a read hands over ``count * 512``
bytes, a write takes them, and the status ``OK`` follows the last byte. The SDRAM has no
errors to report and no busy phase: a write's status goes out once the controller has taken the
command of the last burst, which the store gives only after that burst's words are in the
controller's write FIFO. From then on the data is what a read returns: the controller issues
column commands in the order its arbiter took the bursts, so any command it takes later (on
this port, or on another port once the arbiter has taken it after this one) sees the new
words; the SDRAM cells themselves hold them ``tWR`` after the WRITE burst, a few clocks later.

Throughput: one byte per clock on ``rdata``/``wdata``, the port's peak, half of what the
SDRAM's 16-bit bus moves; with ``width=4`` (half rate only) a 32-bit port word a clock, the
wide storage port (``docs/blocks/sdram_store.md``). Reads keep bursts in flight ahead: the
store asks for a burst as soon as the controller's read FIFO (``fifo_depth`` words) has room
for it beyond every word already asked for, so the FIFO holds up to ``2 * fifo_depth`` clocks
of bytes in reserve over a refresh or a row change. Writes pair two bytes into a word (``mask``
0) and ask for a burst once its ``bl`` words are in the write FIFO. Exact clocks:
``docs/blocks/sdram_store.md``.

Latency: the status of a ``RANGE`` command is valid the clock after the command's transfer; a
read's first byte is handed over ``CL + 10`` clocks after it from an open row (the store's state
and command registers, the controller's ``CL + 7``, the byte register), 2 clocks more from a
closed bank at 60 MHz (``tRCD``), 4 more after a row miss (measured,
``tests/hw/storage/test_sdram_store.py``). A write of ``count`` sectors takes
``count * 512 + 5`` clocks from its command to its status, a read ``count * 512`` plus its
first byte's latency plus 1, with no byte waiting inside the transfer.

Backpressure: ``rdata.ready`` and ``wdata.valid`` may drop at any clock, for any time. Because
a read burst is asked for only when the read FIFO has room for it and a write burst only when
its data is in the write FIFO, a burst never waits in the controller's bank queues for this
port, so a stalled initiator never holds back the SDRAM's refresh (the controller's refresh
waits for empty bank queues). ``cmd`` is taken only when idle; ``status`` holds until taken.
"""

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int, check_pow2, check_type
from ringkv.defs.sdram import DEFAULT_CHIP, SdramChip, check_burst_length, check_rate
from ringkv.hw.sdram.arbiter import UserPortSignature

from .port import SECTOR_BYTES, STORAGE_WIDTHS, StorageError, StorageOp, StoragePortSignature

__all__ = ["SdramSectorStore", "SECTOR_WORDS", "BUGS"]

#: 16-bit SDRAM words per 512-byte sector
SECTOR_WORDS = SECTOR_BYTES // 2

#: deliberately broken variants (private knob ``_bug``), each caught by
#: ``tests/hw/storage/test_sdram_store.py``: ``address`` (sector ``lba`` at ``lba + 1``),
#: ``byte_order`` (the high byte of a word first, both ways), ``range`` (one sector past the
#: end is taken), ``eager`` (every burst asked for at once: read bursts without room in the
#: read FIFO, write bursts before their data, so a stalled initiator holds back the refresh)
BUGS = ("address", "byte_order", "range", "eager")


class _State(enum.Enum, shape=2):
    IDLE = 0
    READ = 1
    WRITE = 2
    STATUS = 3


class SdramSectorStore(wiring.Component):
    """512-byte sectors in SDRAM behind a storage port.

    Parameters
    ----------
    chip : SdramChip
        The SDRAM (its size gives the address width).
    bl, count_bits, fifo_depth
        The controller's burst length, command count width and FIFO depth (defaults as
        :class:`~ringkv.hw.sdram.controller.SdramController`'s); :meth:`for_controller` takes
        them from a controller.
    sectors : int
        Capacity in sectors (default: every sector from ``base`` to the chip's end).
    base : int
        Word address of sector 0, a multiple of 256.
    rate : int
        The controller's (1, or 2 at half rate: its port words are 32 bits, four bytes of the
        sector in the same little-endian order, byte ``4 * i`` in the low byte of port word
        ``i``). The byte stream is the same.
    width : int
        Bytes a storage transfer: 1, or 4 at rate 2 (``StoragePortSignature(width=4)``: a
        port word a transfer, no byte loop).

    Ports
    -----
    storage : In(StoragePortSignature)
        The sector port (target side): ``cmd``, ``wdata``, ``rdata``, ``status``.
    sdram : Out(UserPortSignature)
        To one ``SdramController.port[i]``: commands, write words, read words.

    Latency, throughput and backpressure are in the module's docstring.
    """

    def __init__(self, chip: SdramChip = DEFAULT_CHIP, *, bl: int = 8, count_bits: int = 12,
                 fifo_depth: int | None = None, sectors: int | None = None, base: int = 0,
                 rate: int = 1, width: int = 1, _bug=None):
        check_type("Chip", chip, SdramChip)
        check_burst_length(bl)
        check_rate(rate, bl)
        check_int("Count width", count_bits, low=1, high=24, unit=" bits")
        fifo_depth = max(4 * bl // rate, 16) if fifo_depth is None else fifo_depth
        check_pow2("FIFO depth", fifo_depth, low=max(2 * bl // rate, 2), high=4096)
        check_int("Base", base, low=0, high=chip.words - SECTOR_WORDS)
        if base % SECTOR_WORDS:
            raise ValueError(f"Base must be a multiple of {SECTOR_WORDS} words, not {base!r}")
        room = (chip.words - base) // SECTOR_WORDS
        sectors = room if sectors is None else sectors
        check_int("Sectors", sectors, low=1, high=room)
        if width not in (1, 2 * rate) or width not in STORAGE_WIDTHS:
            raise ValueError(f"Width must be 1 byte, or 4 (a port word) at rate 2, not "
                             f"{width!r} at rate {rate}")
        if _bug is not None and _bug not in BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {BUGS}")
        self._width = width
        self._chip, self._bl, self._count_bits = chip, bl, count_bits
        self._fifo_depth, self._sectors, self._base, self._bug = fifo_depth, sectors, base, _bug
        self._rate = rate
        self._addr_bits = (chip.words - 1).bit_length()
        super().__init__({
            "storage": In(StoragePortSignature(width)),
            "sdram": Out(UserPortSignature(self._addr_bits, count_bits, rate)),
        })

    @classmethod
    def for_controller(cls, controller, *, sectors: int | None = None, base: int = 0, **kw):
        """A store for one of ``controller``'s ports (its chip, burst length, count width and
        FIFO depth)."""
        count_bits = len(controller.port[0].cmd.payload.count)
        return cls(controller.chip, bl=controller.bl, count_bits=count_bits,
                   fifo_depth=controller.fifo_depth, sectors=sectors, base=base,
                   rate=getattr(controller, "rate", 1), **kw)

    chip = property(lambda self: self._chip)
    bl = property(lambda self: self._bl)
    sectors = property(lambda self: self._sectors)
    base = property(lambda self: self._base)
    fifo_depth = property(lambda self: self._fifo_depth)
    rate = property(lambda self: self._rate)
    width = property(lambda self: self._width)

    def elaborate(self, platform):
        m = Module()
        st, sd = self.storage, self.sdram
        bl, depth, bug = self._bl, self._fifo_depth, self._bug
        bl_log = bl.bit_length() - 1
        nb = 2 * self._rate                     # bytes of a port word
        bl_words = bl // self._rate             # port words of a burst
        bl_words_log = bl_words.bit_length() - 1
        max_count = (1 << self._count_bits) - 1
        state = Signal(_State)
        error = Signal(StorageError)

        # the next burst's word address, bursts not yet asked for, bytes not yet moved
        addr = Signal(self._addr_bits)
        bursts_left = Signal(16 + 8 - bl_log)
        bytes_left = Signal(16 + 9)

        # ---- command ---------------------------------------------------------------------------
        cmd = st.cmd.payload
        limit = self._sectors + (1 if bug == "range" else 0)
        out_of_range = (cmd.count == 0) | (cmd.lba + cmd.count > limit)
        first = cmd.lba + (1 if bug == "address" else 0)
        m.d.comb += st.cmd.ready.eq(state == _State.IDLE)
        with m.If(st.cmd.valid & st.cmd.ready):
            m.d.sync += [
                addr.eq(self._base + Cat(Const(0, 8), first[:self._addr_bits - 8])),
                bursts_left.eq(cmd.count << (8 - bl_log)),
                bytes_left.eq(cmd.count << 9),
            ]
            with m.If(out_of_range):
                m.d.sync += [error.eq(StorageError.RANGE), state.eq(_State.STATUS)]
            with m.Elif(cmd.op == StorageOp.READ):
                m.d.sync += [error.eq(StorageError.OK), state.eq(_State.READ)]
            with m.Else():
                m.d.sync += [error.eq(StorageError.OK), state.eq(_State.WRITE)]

        # ---- the controller's commands: one at a time, its payload held until taken ---------
        sd_count = Signal(self._count_bits)
        sd_write = Signal()
        sd_valid = Signal()
        m.d.comb += [sd.cmd.valid.eq(sd_valid), sd.cmd.payload.addr.eq(addr),
                     sd.cmd.payload.write.eq(sd_write), sd.cmd.payload.count.eq(sd_count)]
        sd_taken = sd.cmd.valid & sd.cmd.ready
        with m.If(sd_taken):
            m.d.sync += [sd_valid.eq(0), addr.eq(addr + (sd_count << bl_log)),
                         bursts_left.eq(bursts_left - sd_count)]

        def smallest(*values):
            out = values[0]
            for v in values[1:]:
                out = Mux(v < out, v, out)
            return out

        def ask(count):
            m.d.sync += [sd_valid.eq(1), sd_count.eq(count)]

        # ---- read: bursts asked for while the read FIFO has room, words to bytes --------------
        # ``asked``: words asked for and not yet taken from ``sdram.r`` -- never more than the
        # controller's read FIFO holds, so a queued read burst never waits for FIFO room
        asked = Signal(range(depth + 1))
        room = Signal(range(depth + 1))
        m.d.comb += room.eq(depth - asked)
        room_bursts = room >> bl_words_log
        sw = self._width                        # bytes a storage transfer
        per = nb // sw                          # storage transfers a port word
        word = Signal(8 * nb)
        have = Signal()          # ``word`` holds a byte (a transfer) to send
        at = Signal(range(max(per, 2)))         # ... transfer number ``at`` of it
        last = (at == per - 1) if per > 1 else Const(1)
        r_take = Signal()
        in_order = [word[8 * k:8 * k + 8] for k in range(nb)]
        in_order = in_order[::-1] if bug == "byte_order" else in_order
        pieces = [Cat(*in_order[sw * k:sw * k + sw]) for k in range(per)]
        m.d.comb += [st.rdata.valid.eq(have),
                     st.rdata.payload.eq(Array(pieces)[at] if per > 1 else pieces[0])]
        byte_out = st.rdata.valid & st.rdata.ready
        m.d.comb += [r_take.eq((state == _State.READ) & (~have | (last & byte_out))),
                     sd.r.ready.eq(r_take)]
        r_taken = r_take & sd.r.valid
        m.d.sync += asked.eq(asked + Mux(sd_taken & ~sd_write, sd_count << bl_words_log, 0)
                             - r_taken)
        with m.If(r_taken):
            m.d.sync += [word.eq(sd.r.payload), have.eq(1), at.eq(0)]
        with m.Elif(byte_out):
            m.d.sync += [at.eq(at + 1), have.eq(~last)]
        with m.If(byte_out):
            m.d.sync += bytes_left.eq(bytes_left - sw)

        if bug == "eager":
            room_bursts = Const(max_count)
        with m.If(state == _State.READ):
            with m.If(~sd_valid & (bursts_left != 0) & (room_bursts != 0)):
                ask(smallest(bursts_left, room_bursts, Const(max_count)))
            with m.If(byte_out & (bytes_left == sw)):
                m.d.sync += state.eq(_State.STATUS)

        # ---- write: bytes to words, a burst asked for once its words are in the FIFO ---------
        # a word's first transfers, and how many of them are in
        early = [Signal(8 * sw, name=f"w_piece{k}") for k in range(per - 1)]
        got = Signal(range(max(per, 2)))
        got_last = (got == per - 1) if per > 1 else Const(1)
        w_full = Signal()        # ``w_word`` waits for ``sdram.w``
        w_word = Signal(8 * nb)
        w_col = Signal(range(bl_words))
        ready_bursts = Signal(range(depth // bl_words + 2))  # complete bursts not yet asked for
        m.d.comb += [sd.w.valid.eq(w_full), sd.w.payload.data.eq(w_word),
                     sd.w.payload.mask.eq(0),
                     st.wdata.ready.eq((state == _State.WRITE) & (bytes_left != 0)
                                       & (~got_last | ~w_full | sd.w.ready))]
        byte_in = st.wdata.valid & st.wdata.ready
        w_taken = sd.w.valid & sd.w.ready
        with m.If(w_taken):
            m.d.sync += [w_full.eq(0), w_col.eq(w_col + 1 if bl_words > 1 else 0)]
        with m.If(byte_in):
            m.d.sync += bytes_left.eq(bytes_left - sw)
            with m.If(got_last):
                whole = Cat(*early, st.wdata.payload)
                if bug == "byte_order":
                    whole = Cat(*[whole[8 * k:8 * k + 8] for k in range(nb)][::-1])
                m.d.sync += [w_word.eq(whole), w_full.eq(1), got.eq(0)]
            with m.Else():
                for k in range(per - 1):
                    with m.If(got == k):
                        m.d.sync += early[k].eq(st.wdata.payload)
                m.d.sync += got.eq(got + 1)
        burst_done = w_taken & (w_col == bl_words - 1)
        m.d.sync += ready_bursts.eq(ready_bursts + burst_done
                                    - Mux(sd_taken & sd_write, sd_count, 0))
        with m.If(state == _State.WRITE):
            if bug == "eager":
                with m.If(~sd_valid & (bursts_left != 0)):
                    ask(smallest(bursts_left, Const(max_count)))
                    m.d.sync += sd_write.eq(1)
                with m.If(~sd_valid & (bursts_left == 0) & (bytes_left == 0) & ~w_full):
                    m.d.sync += state.eq(_State.STATUS)
            else:
                with m.If(~sd_valid & (ready_bursts != 0)):
                    ask(smallest(ready_bursts, Const(max_count)))
                    m.d.sync += sd_write.eq(1)
                with m.If((bursts_left == 0) | (sd_taken & (bursts_left == sd_count))):
                    m.d.sync += state.eq(_State.STATUS)
        with m.Else():
            m.d.sync += sd_write.eq(0)

        # ---- status ------------------------------------------------------------------------------
        m.d.comb += [st.status.valid.eq(state == _State.STATUS),
                     st.status.payload.error.eq(error)]
        with m.If(st.status.valid & st.status.ready):
            m.d.sync += state.eq(_State.IDLE)
        return m
