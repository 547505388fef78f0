"""Tiered storage: the SD card behind an SDRAM hot tier, as one storage-port target.

The DMA engine (``hw/storage/dma.py``) drives ``storage`` exactly as it drives the SD card; this
block sends each transfer to the card (``card``, the persistence point), to the SDRAM sector
store (``sdram``, ``hw/storage/sdram_store.py``) or, for writes, to both, and keeps a
:class:`~ringkv.hw.store.hot_tier.HotTier` (card region -> SDRAM slot) inside. The golden model
is :class:`ringkv.host.golden.tiered.GoldenTieredStorage`; the block's document is
``docs/blocks/tiered_storage.md``.

Regions are the record regions of the card layout: region ``r`` is the ``sectors_per_region``
sectors from card sector ``base_lba + r * sectors_per_region``; its SDRAM slot ``s`` is the same
number of sectors from SDRAM sector ``sdram_base + s * sectors_per_region``. A transfer is *in
a region* when it lies wholly inside one (``offset + count <= sectors_per_region``).

Rules (the invariant they keep: every byte a read returns from SDRAM is the card's byte):

* **Reads.** A read in region ``r`` whose copy is committed (``LOOKUP`` hits) and whose
  sectors lie inside one of the copy's *written extents* is served from the SDRAM slot; any
  other read goes to the card.
* **Writes in a region** go to both tiers (the write bytes teed, one byte per clock). The first
  write into ``r`` that finds no write of ``r`` pending ``ALLOC``\\ s a reserved slot (which drops
  ``r``'s old copy; a write of another region still pending is ``ABORT``\\ ed first) and starts the
  copy's extents with its own sectors; later writes of ``r`` add theirs (appended to an extent
  they continue, else a free one of ``EXTENTS``; when none is left the pending copy is
  ``ABORT``\\ ed and the write goes to the card alone). A write that includes the region's first
  sector (the header: the DMA writes it last) ``COMMIT``\\ s the copy when both tiers answered
  ``OK``, and stores its extents; any error on either tier ``ABORT``\\ s it.
* **A write not in one region** that touches the record area (it spans regions) ``CLEAR``\\ s the
  hot tier and goes to the card; a transfer outside the record area, or of ``count == 0``,
  goes to the card and changes nothing here.
* **Status.** The initiator gets the card's status: the card is the persistence point, and an
  SDRAM failure only costs the copy (``ABORT``), never an export the card holds.
* **Dropped records.** A region on ``drop`` (the directory deleted its record: ``RingKVTop``
  sends the region of every ``DELETE`` the directory answers ``OK``) is ``DROP``\\ ped from the
  hot tier, its slot freed, and a pending write of that region forgotten. Not needed for the
  invariant (a copy equals the card until its region is written again, and that write drops
  it first); it gives the slot back to live records.
* **Residents.** A request on ``residents_req`` is answered on ``residents`` with the hot
  tier's ``COUNT`` (committed copies), for ``STORAGE_INFO``.
* **Reset** (a power cut) sweeps the hot tier empty: afterwards every read goes to the card, as
  without this block, until writes commit copies again.
* **Compact slots** (``kv_sector`` and ``slot_token_sectors`` T given): a slot holds only the
  region's first ``1 + T`` sectors (the header and T token sectors) and its sectors from
  ``kv_sector`` (the K/V); the *gap* ``[1 + T, kv_sector)`` is never in SDRAM and a slot is
  ``sectors_per_region - (kv_sector - 1 - T)`` sectors. A read touching the gap goes to the card
  (no LOOKUP); a write touching it cannot be recorded: a pending write of another region is
  ``ABORT``\\ ed, the region's own copy (pending or committed) ``DROP``\\ ped, and the write
  goes to the card alone. Extents are kept in region (card) offsets, so they never contain a
  gap sector; only the SDRAM sector maps (offset ``o >= kv_sector`` to slot offset
  ``o - (kv_sector - 1 - T)``).

Latency (exact; the golden model's ``Route.setup`` and ``finish``): from the command's
transfer to the backend's ``cmd.valid`` a transfer spends ``log2(regions) + 2`` clocks here
(the region and offset by a restoring division by ``sectors_per_region``, one quotient bit per
clock, then the decision), plus 1 + its clocks for each hot-tier command (a read in a region:
its ``LOOKUP``, and 3 clocks for the extents on a hit; a write's ``ALLOC`` and 1 clock, an
``ABORT`` of another pending write, a ``CLEAR``). A write to both tiers gives its status 3
clocks after the later backend status, 6 when it commits or aborts. A transfer to one
backend: its write data is connected straight through, its read data goes through a register
slice (a clock more to the first word), its status is taken into a register (an OK one once
the backend offers no read word) and given a clock after the backend's, or, for an OK status,
after the last read word's transfer to the initiator if that is later. The table for each
case is in ``docs/blocks/tiered_storage.md``.

Throughput and backpressure: one transfer (a byte, or a word at ``width=4``) per clock in both
directions; the tee holds each transfer in a register per tier and takes the next when both
have taken theirs (or answered: a tier whose status came early no longer gates the other).
Every stream may stall at any time. ``cmd`` is taken only when idle; ``status`` holds until
taken. ``drop`` and ``residents_req`` are taken only when idle and no ``cmd`` is offered
(``cmd`` first, then ``drop``): a DROP keeps the block 4 clocks (idle again 4 clocks after the
drop's transfer), a COUNT gives ``residents.valid`` ``slots + 4`` clocks after the request's
transfer and holds until it is taken; a command offered meanwhile waits.
"""

from types import SimpleNamespace

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, enum, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int, check_pow2
from ringkv.defs.hot_tier import COUNT_FIELD_WIDTH, MAX_SLOTS

from ..link.skid import StreamRegister
from ..store.hot_tier import HotTier, Op, Status
from .port import STORAGE_WIDTHS, StorageError, StorageOp, StoragePortSignature
from .port_width import StorageWidener

__all__ = ["TieredStorage", "EXTENTS", "BUGS"]

#: Written extents recorded per copy: the DMA's export writes three (tokens, K/V, header).
EXTENTS = 3

#: Deliberately broken variants (private knob ``_bug``), each caught by
#: ``tests/hw/storage/test_tiered.py``: ``extents`` (a committed copy serves every read in its
#: region, written or not), ``stale`` (a write into a region with a committed copy goes to the
#: card alone and leaves the copy), ``error`` (a write error does not abort: the copy commits
#: anyway), ``span`` (a write over two regions leaves the hot tier as it is), ``address`` (the
#: SDRAM sector of a slot is one too far), ``early`` (every write commits, not only the one that
#: includes the header sector); with compact slots: ``gap_read`` (a read touching the gap is
#: looked up as any other), ``gap_write`` (a write touching the gap is teed and recorded as any
#: other), ``gap_keep`` (a write touching the gap goes to the card without dropping the
#: region's committed copy), ``gap_address`` (a K/V sector's slot offset is not moved down by
#: the gap); ``drop_ignored`` (a region on ``drop`` is taken and nothing is done: the copy of a
#: deleted record keeps its slot); the read slice's: ``slice_early`` (an OK status is given
#: while the slice still holds read words), ``slice_stale`` (words left in the slice after an
#: error status are offered to the next transfer).
BUGS = ("extents", "stale", "error", "span", "address", "early", "gap_read", "gap_write",
        "gap_keep", "gap_address", "drop_ignored", "slice_early", "slice_stale")


class _State(enum.Enum, shape=4):
    IDLE = 0
    DIVIDE = 1
    DECIDE = 2
    HT_SEND = 3
    HT_WAIT = 4
    EXT_READ = 5
    EXT_CHECK = 6
    CARD = 7
    SDRAM = 8
    BOTH = 9
    SETTLE = 10
    STATUS = 11
    RESIDENTS = 12
    EXT_SERVE = 13


class _After(enum.Enum, shape=3):
    """Where an ABORT or CLEAR leads."""
    ALLOC = 0       # the pending write of another region aborted: now ALLOC this one
    CARD = 1        # to the card alone
    STATUS = 2      # a failed write's abort: answer
    DROP = 3        # the pending write of another region aborted: now DROP this one (gap)
    IDLE = 4        # a request besides the storage port's (drop, residents): back to idle


def _extent_layout(offset_bits):
    return data.StructLayout({"lo": offset_bits, "hi": offset_bits})


def _through(m, source, sink):
    """Connect stream ``source`` to ``sink`` combinationally (under the current condition)."""
    m.d.comb += [sink.valid.eq(source.valid), sink.payload.eq(source.payload),
                 source.ready.eq(sink.ready)]


class TieredStorage(wiring.Component):
    """A storage-port target over the SD card (``card``) and an SDRAM hot tier (``sdram``).

    Parameters
    ----------
    regions : int
        Record regions, a power of two, 2..32768 (the directory's and the DMA's ``regions``).
    sectors_per_region : int
        1..65535 (``RecordLayout.sectors_per_region``).
    base_lba : int
        Card sector of region 0 (the DMA's ``base_lba``).
    slots : int
        SDRAM slots (copies held), 2..1024.
    sdram_base : int
        SDRAM-store sector of slot 0.
    stamp_width : int
        The hot tier's LRU stamp width (1..32); the stamp counts accepted commands.
    kv_sector : int or None
        The region offset of the K/V area (``RecordLayout.kv_sector``), 1..sectors_per_region;
        needed only with ``slot_token_sectors``.
    slot_token_sectors : int or None
        Compact slots: the token sectors a slot holds, 0..kv_sector - 1 (T; the slot holds
        the header, T token sectors and the sectors from ``kv_sector``). ``None`` (default):
        all of them, a slot is ``sectors_per_region`` sectors.
    width : int
        Bytes a transfer on ``storage`` and ``sdram``: 1, or 4 (the SDRAM store's wide port at
        half rate, for the four-byte import); ``card`` stays a port of bytes, behind a
        :class:`~ringkv.hw.storage.port_width.StorageWidener` inside.
    formal : bool
        Build the tables as registers (the hot tier's and :attr:`extent_rows`) for a formal
        harness's properties (small configurations).

    Ports
    -----
    storage : In(StoragePortSignature(width))
        The target side, for the DMA.
    card : Out(StoragePortSignature()), sdram : Out(StoragePortSignature(width))
        Initiator sides: the SD controller (or the sector model), the SDRAM sector store.
    drop : In(stream.Signature(log2(regions)))
        Regions whose record the directory deleted: their copies are dropped.
    residents_req : In(stream.Signature(1)), residents : Out(stream.Signature(16))
        A request (its payload unused), answered with the number of committed copies.

    Latency, throughput and backpressure: see the module's docstring.
    """

    def __init__(self, *, regions: int, sectors_per_region: int, base_lba: int = 0,
                 slots: int = 256, sdram_base: int = 0, stamp_width: int = 32,
                 kv_sector: int | None = None, slot_token_sectors: int | None = None,
                 width: int = 1, formal=False, _bug=None, _full=False, _extents_init=None):
        check_pow2("regions", regions, low=2, high=32768)
        check_int("sectors_per_region", sectors_per_region, low=1, high=65535)
        check_int("base_lba", base_lba, low=0)
        check_int("slots", slots, low=2, high=MAX_SLOTS)
        check_int("sdram_base", sdram_base, low=0)
        check_int("stamp_width", stamp_width, low=1, high=32)
        if kv_sector is not None:
            check_int("kv_sector", kv_sector, low=1, high=sectors_per_region)
        if slot_token_sectors is not None:
            if kv_sector is None:
                raise ValueError("slot_token_sectors needs kv_sector")
            check_int("slot_token_sectors", slot_token_sectors, low=0, high=kv_sector - 1)
        # the gap [gap_lo, gap_hi) of region offsets a slot does not hold (empty: none)
        if slot_token_sectors is None:
            gap_lo = gap_hi = sectors_per_region
        else:
            gap_lo, gap_hi = 1 + slot_token_sectors, kv_sector
        slot_sectors = sectors_per_region - (gap_hi - gap_lo)
        if base_lba + regions * sectors_per_region > 1 << 32:
            raise ValueError(f"{regions} regions of {sectors_per_region} sectors from "
                             f"{base_lba} do not fit in 32-bit sector addresses")
        if sdram_base + slots * slot_sectors > 1 << 32:
            raise ValueError(f"{slots} slots of {slot_sectors} sectors from "
                             f"{sdram_base} do not fit in 32-bit sector addresses")
        if width not in STORAGE_WIDTHS:
            raise ValueError(f"width must be one of {STORAGE_WIDTHS} bytes, not {width!r}")
        if _bug is not None and _bug not in BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {BUGS}")
        self._width = width
        self._regions, self._spr, self._base = regions, sectors_per_region, base_lba
        self._slots, self._sdram_base, self._stamp_width = slots, sdram_base, stamp_width
        self._kv_sector, self._slot_tokens = kv_sector, slot_token_sectors
        self._gap_lo, self._gap_hi, self._slot_sectors = gap_lo, gap_hi, slot_sectors
        self._bug = _bug
        self._formal = bool(formal)
        # ``_full`` (formal): the hot tier starts with slot s valid for region s, and the
        # extents registers with ``_extents_init`` (per slot, a list of (lo, hi)): a reachable
        # state from which a short check reaches reads and writes of committed copies
        self.hot = HotTier(regions=regions, slots=slots, stamp_width=stamp_width, formal=formal,
                           _full=_full)
        ob = sectors_per_region.bit_length()
        shape = data.ArrayLayout(_extent_layout(ob), EXTENTS)
        init = [[{"lo": lo, "hi": hi} for lo, hi in
                 (list(row) + [(0, 0)] * EXTENTS)[:EXTENTS]]
                for row in (_extents_init or [[]] * slots)]
        #: formal builds: the copies' extents as registers, one per slot (else a block RAM),
        #: so that a harness's properties can name them
        self.extent_rows = ([Signal(shape, name=f"extents{s}", init=init[s])
                             for s in range(slots)] if formal else None)
        super().__init__({
            "storage": In(StoragePortSignature(width)),
            "card": Out(StoragePortSignature()),
            "sdram": Out(StoragePortSignature(width)),
            "drop": In(stream.Signature(max(regions.bit_length() - 1, 1))),
            "residents_req": In(stream.Signature(1)),
            "residents": Out(stream.Signature(COUNT_FIELD_WIDTH)),
        })

    regions = property(lambda self: self._regions)
    sectors_per_region = property(lambda self: self._spr)
    base_lba = property(lambda self: self._base)
    slots = property(lambda self: self._slots)
    sdram_base = property(lambda self: self._sdram_base)
    stamp_width = property(lambda self: self._stamp_width)
    kv_sector = property(lambda self: self._kv_sector)
    slot_token_sectors = property(lambda self: self._slot_tokens)
    #: sectors per slot: ``sectors_per_region`` less the gap
    slot_sectors = property(lambda self: self._slot_sectors)
    width = property(lambda self: self._width)

    def params(self) -> dict:
        """The parameters the golden model takes."""
        return dict(regions=self._regions, sectors_per_region=self._spr, base_lba=self._base,
                    slots=self._slots, sdram_base=self._sdram_base,
                    stamp_width=self._stamp_width, kv_sector=self._kv_sector,
                    slot_token_sectors=self._slot_tokens)

    def _extents(self, m, shape):
        """The extents table: one synchronous, non-transparent read port and one write port
        (a block RAM; registers in a formal build). Returns ``(read, write)`` with the
        ``addr``/``data`` (and ``en``) members of ``lib.memory``'s ports."""
        if self.extent_rows is None:
            m.submodules.ext_mem = mem = memory.Memory(shape=shape, depth=self._slots, init=[])
            return mem.read_port(transparent_for=()), mem.write_port()
        n = range(self._slots)
        read = SimpleNamespace(addr=Signal(n, name="ext_raddr"),
                               data=Signal(shape, name="ext_rdata"))
        write = SimpleNamespace(addr=Signal(n, name="ext_waddr"),
                                data=Signal(shape, name="ext_wdata"), en=Signal(name="ext_we"))
        rows = Array(row.as_value() for row in self.extent_rows)
        m.d.sync += read.data.eq(rows[read.addr])
        with m.If(write.en):
            m.d.sync += rows[write.addr].eq(write.data.as_value())
        return read, write

    def elaborate(self, platform):
        m = Module()
        m.submodules.hot = hot = self.hot
        st, card, sd = self.storage, self.card, self.sdram
        if self._width != 1:
            # the card's controller moves bytes: a widener between it and the wide logic
            m.submodules.card_widener = widener = StorageWidener()
            wiring.connect(m, widener.narrow, wiring.flipped(self.card))
            card = widener.wide
        nr, spr, bug = self._regions, self._spr, self._bug
        qb = nr.bit_length() - 1                 # region bits; the division's steps
        ob = spr.bit_length()                    # an offset or an extent bound, 0..spr
        area = nr * spr
        ext = _extent_layout(ob)

        state = Signal(_State)
        after = Signal(_After)
        now = Signal(self._stamp_width)

        # ---- the command, its region and offset ------------------------------------------
        op = Signal(StorageOp)
        lba = Signal(32)
        count = Signal(16)
        rel = Signal(33)                         # lba - base_lba (bit 32: below the area)
        rem = Signal(range(max(area, 2)))        # the division's remainder -> the offset
        divisor = Signal(range(spr << max(qb - 1, 0) + 1))
        region = Signal(qb)
        step = Signal(range(qb + 1))
        offset = Signal(ob)
        end = Signal(ob + 17)                    # offset + count
        m.d.comb += [offset.eq(rem), end.eq(offset + count)]
        inside = Signal()                        # the first sector is in the record area
        m.d.comb += inside.eq(~rel[32] & (rel[:32] < area))
        single = Signal()                        # the whole transfer is in one region
        m.d.comb += single.eq(inside & (count != 0) & (end <= spr))
        gap = self._gap_hi - self._gap_lo
        in_gap = Signal()                        # some sector is in the gap (compact slots)
        if gap:
            m.d.comb += in_gap.eq((offset < self._gap_hi) & (end > self._gap_lo))
        touches = Signal()                       # some sector is in the record area
        last = Signal(34)
        m.d.comb += [last.eq(lba + count),
                     touches.eq((count != 0) & (lba < self._base + area)
                                & (last > self._base))]

        # ---- the pending write (a reserved slot) and the copies' extents -----------------
        pending = Signal()
        pend_region = Signal(qb)
        pend_slot = Signal(range(self._slots))
        pend_ext = [Signal(ext, name=f"pend_ext{i}") for i in range(EXTENTS)]
        is_header = Signal()                     # the write includes the region's sector 0
        m.d.comb += is_header.eq(offset == 0)
        ext_r, ext_w = self._extents(m, data.ArrayLayout(ext, EXTENTS))
        slot = Signal(range(self._slots))        # the slot a read is served from
        # the read lies in one of its extents: each extent's two bounds, checked
        within = [Signal(name=f"within{i}_{b}") for i in range(EXTENTS) for b in ("lo", "hi")]
        served_q = Signal()
        m.d.comb += served_q.eq(Cat(*(within[2 * i] & within[2 * i + 1]
                                      for i in range(EXTENTS))).any())

        # where the write's sectors go among the pending extents
        append = [Signal(name=f"append{i}") for i in range(EXTENTS)]
        free = [Signal(name=f"free{i}") for i in range(EXTENTS)]
        for i, e in enumerate(pend_ext):
            m.d.comb += [append[i].eq((e.hi != 0) & (e.hi == offset)),
                         free[i].eq(e.hi == 0)]
        fits = Signal()
        m.d.comb += fits.eq(Cat(*append, *free).any())

        # The write's place among the extents is decided in DECIDE and recorded a clock later
        # (the first of BOTH, which waits for both backends and so lasts more than a clock
        # before SETTLE reads the extents): the compares start at the division's remainder,
        # finished the clock before, and through the priority into the nine extent registers'
        # enables they were among the half-rate board build's longest paths (15.5 ns at
        # 60 MHz). ``app_q``/``free_q``: which extent the write continues or takes (one-hot).
        app_q = [Signal(name=f"app_q{i}") for i in range(EXTENTS)]
        free_q = [Signal(name=f"free_q{i}") for i in range(EXTENTS)]
        record_now = Signal()
        any_app = Cat(*append).any()
        m.d.sync += [*(q.eq(append[i] & ~(Cat(*append[:i]).any() if i else Const(0)))
                       for i, q in enumerate(app_q)),
                     *(q.eq(~any_app & free[i] & ~(Cat(*free[:i]).any() if i else Const(0)))
                       for i, q in enumerate(free_q)),
                     record_now.eq(0)]
        with m.If(record_now):
            for i in range(EXTENTS):
                with m.If(app_q[i]):
                    m.d.sync += pend_ext[i].hi.eq(end)
                with m.If(free_q[i]):
                    m.d.sync += [pend_ext[i].lo.eq(offset), pend_ext[i].hi.eq(end)]

        def record_extent():
            """Append the write's sectors to the first extent it continues, else the first
            free one (``fits`` is high), at the next clock."""
            m.d.sync += record_now.eq(1)

        # ---- hot-tier commands ------------------------------------------------------------
        ht_op = Signal(Op)
        ht_region = Signal(qb)
        ht_slot = Signal(range(self._slots))
        resp = hot.o.payload
        m.d.comb += [hot.i.payload.op.eq(ht_op), hot.i.payload.region.eq(ht_region),
                     hot.i.payload.slot.eq(ht_slot), hot.i.payload.now.eq(now),
                     hot.i.valid.eq(state == _State.HT_SEND),
                     hot.o.ready.eq(state == _State.HT_WAIT)]

        def hot_command(o, r, s=0, then=_After.CARD):
            m.d.sync += [ht_op.eq(o), ht_region.eq(r), ht_slot.eq(s), after.eq(then),
                         state.eq(_State.HT_SEND)]

        # ---- the backends' commands: held until taken -------------------------------------
        card_cmd_valid = Signal()
        sd_cmd_valid = Signal()
        sd_lba = Signal(32)
        slot_lba = Signal(32)
        slot_offset = Signal(ob)                 # the offset in the slot (below the gap or not)
        if gap and bug != "gap_address":
            m.d.comb += slot_offset.eq(Mux(offset >= self._gap_hi, offset - gap, offset))
        else:
            m.d.comb += slot_offset.eq(offset)
        # the slots' first sectors, registered with the slots themselves (from the hot tier's
        # response): the multiply stays off the path from the state into the SDRAM command's
        # address (one of the half-rate board build's longest, 16.7 ns at 60 MHz)
        slot_base = Signal(32)
        pend_base = Signal(32)

        def slot_first(s):
            """``sdram_base + s * slot_sectors``: shifted copies of ``s``, one a set bit of the
            constant, added in a balanced tree of carry chains. Yosys maps ``s * constant``
            onto a MULT18X18D, whose 5.3 ns put these registers at the margin's edge (15.0 ns
            at 60 MHz in the half-rate board build)."""
            s = s[:len(slot)]
            terms = [s << i for i in range(self._slot_sectors.bit_length())
                     if self._slot_sectors >> i & 1]
            if self._sdram_base:
                terms.append(Const(self._sdram_base, 32))
            while len(terms) > 1:                # a balanced tree of adders
                terms = [a + b for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) & ~1:]
            return terms[0] if terms else Const(0, 32)
        m.d.comb += slot_lba.eq(Mux(state == _State.EXT_SERVE, slot_base, pend_base)
                                + slot_offset + (1 if bug == "address" else 0))
        m.d.comb += [card.cmd.valid.eq(card_cmd_valid), card.cmd.payload.op.eq(op),
                     card.cmd.payload.lba.eq(lba), card.cmd.payload.count.eq(count),
                     sd.cmd.valid.eq(sd_cmd_valid), sd.cmd.payload.op.eq(op),
                     sd.cmd.payload.lba.eq(sd_lba), sd.cmd.payload.count.eq(count)]
        with m.If(card.cmd.valid & card.cmd.ready):
            m.d.sync += card_cmd_valid.eq(0)
        with m.If(sd.cmd.valid & sd.cmd.ready):
            m.d.sync += sd_cmd_valid.eq(0)

        def to_card():
            m.d.sync += [card_cmd_valid.eq(1), state.eq(_State.CARD), rd_open.eq(1)]

        # ---- the tee (writes to both) and the two statuses --------------------------------
        card_done = Signal()
        sd_done = Signal()
        card_err = Signal(StorageError)          # the initiator's status (STATUS gives it)
        sd_err = Signal(StorageError)
        c_buf_valid = Signal()
        s_buf_valid = Signal()
        buf = Signal(8 * self._width)

        # ---- a transfer to one backend: read data through a register slice, the status
        # registered. Passed straight through, the read data's ready and the status were
        # handshakes across this block, the DMA (whose ``ready`` terms depend on its state,
        # its unpacker and the status's error) and the backend's FIFO and status registers
        # in one clock: the half-rate board build's longest paths (16.5 ns at 60 MHz into
        # the card's status register, 15.7 into the DMA's counters and the SDRAM's read
        # FIFO). The slice (``rd``, two entries) adds a clock to a read's first word; the
        # backend's status is taken into ``card_err`` (an OK status once the backend offers
        # no read word) and given (state STATUS) once the slice is empty: a clock after the
        # later of the backend's status and the last word's transfer to the initiator. An
        # error status is taken and given at once; words left in the slice then are dropped
        # (``rd_open`` low: the slice drains, the initiator sees none).
        m.submodules.rdata_slice = rd = StreamRegister(8 * self._width)
        # (a register set on the way into CARD/SDRAM and cleared on leaving STATUS, not a
        # decode of the state: the initiator's ``rdata.valid`` comes from two flip-flops)
        rd_open = Signal()                       # the slice's words are the initiator's
        m.d.comb += [st.rdata.payload.eq(rd.o.payload),
                     st.rdata.valid.eq(rd.o.valid & rd_open),
                     rd.o.ready.eq(st.rdata.ready | ~rd_open)]

        def take_status(backend):
            m.d.comb += backend.status.ready.eq(
                ~backend.rdata.valid | (backend.status.payload.error != StorageError.OK))
            with m.If(backend.status.valid & backend.status.ready):
                m.d.sync += [card_err.eq(backend.status.payload.error), state.eq(_State.STATUS)]

        idle = state == _State.IDLE
        residents = Signal(COUNT_FIELD_WIDTH)
        m.d.comb += [st.cmd.ready.eq(idle),
                     self.drop.ready.eq(idle & ~st.cmd.valid),
                     self.residents_req.ready.eq(idle & ~st.cmd.valid & ~self.drop.valid),
                     self.residents.payload.eq(residents),
                     self.residents.valid.eq(state == _State.RESIDENTS)]
        with m.Switch(state):
            with m.Case(_State.IDLE):
                with m.If(st.cmd.valid):
                    p = st.cmd.payload
                    m.d.sync += [op.eq(p.op), lba.eq(p.lba), count.eq(p.count),
                                 rel.eq(p.lba - self._base), rem.eq(p.lba - self._base),
                                 divisor.eq(spr << max(qb - 1, 0)), step.eq(0),
                                 region.eq(0), now.eq(now + 1), state.eq(_State.DIVIDE)]
                with m.Elif(self.drop.valid):
                    if bug != "drop_ignored":
                        hot_command(Op.DROP, self.drop.payload, 0, _After.IDLE)
                with m.Elif(self.residents_req.valid):
                    hot_command(Op.COUNT, 0, 0, _After.IDLE)

            with m.Case(_State.RESIDENTS):
                with m.If(self.residents.ready):
                    m.d.sync += state.eq(_State.IDLE)

            with m.Case(_State.DIVIDE):
                # restoring division of ``rel`` by ``spr``, one quotient bit per clock (only
                # meaningful when ``inside``: then the quotient is below ``regions``)
                with m.If(rem >= divisor):
                    m.d.sync += [rem.eq(rem - divisor),
                                 region.eq(Cat(Const(1, 1), region[:-1]) if qb > 1
                                           else Const(1, 1))]
                with m.Else():
                    m.d.sync += region.eq(Cat(Const(0, 1), region[:-1]) if qb > 1
                                          else Const(0, 1))
                m.d.sync += [divisor.eq(divisor >> 1), step.eq(step + 1)]
                with m.If(step == qb - 1):
                    m.d.sync += state.eq(_State.DECIDE)
                with m.If(~inside):
                    m.d.sync += rem.eq(0)        # keep the registers small and defined

            with m.Case(_State.DECIDE):
                with m.If(op == StorageOp.READ):
                    with m.If(single & (~in_gap | (bug == "gap_read"))):
                        hot_command(Op.LOOKUP, region)
                    with m.Else():
                        to_card()
                with m.Elif(single & in_gap & (bug != "gap_write")):
                    # compact slots: a write into the gap cannot be recorded
                    with m.If(pending & (pend_region != region)):
                        hot_command(Op.ABORT, pend_region, pend_slot,
                                    _After.CARD if bug == "gap_keep" else _After.DROP)
                    with m.Elif(bug == "gap_keep"):
                        m.d.sync += pending.eq(0)
                        to_card()
                    with m.Else():
                        hot_command(Op.DROP, region)
                with m.Elif(single):
                    with m.If(pending & (pend_region == region)):
                        with m.If(fits):
                            record_extent()
                            m.d.sync += [sd_lba.eq(slot_lba), card_cmd_valid.eq(1),
                                         sd_cmd_valid.eq(1), state.eq(_State.BOTH)]
                        with m.Else():
                            hot_command(Op.ABORT, pend_region, pend_slot, _After.CARD)
                    with m.Elif(pending):
                        hot_command(Op.ABORT, pend_region, pend_slot, _After.ALLOC)
                    with m.Else():
                        # (the broken variant ``stale`` looks the region up first and writes a
                        # region whose copy is committed on the card alone: the copy stays)
                        hot_command(Op.LOOKUP if bug == "stale" else Op.ALLOC, region)
                with m.Elif(touches & (bug != "span")):
                    hot_command(Op.CLEAR, 0, 0, _After.CARD)
                with m.Else():
                    to_card()

            with m.Case(_State.HT_SEND):
                with m.If(hot.i.ready):
                    m.d.sync += state.eq(_State.HT_WAIT)

            with m.Case(_State.HT_WAIT):
                with m.If(hot.o.valid):
                    ok = resp.status == Status.OK
                    with m.Switch(ht_op):
                        with m.Case(Op.LOOKUP):
                            with m.If(op == StorageOp.READ):
                                with m.If(ok):
                                    m.d.sync += [slot.eq(resp.slot), state.eq(_State.EXT_READ),
                                                 slot_base.eq(slot_first(resp.slot))]
                                with m.Else():
                                    to_card()
                            with m.Else():
                                # only the ``stale`` variant looks up before a write
                                with m.If(ok):
                                    to_card()
                                with m.Else():
                                    hot_command(Op.ALLOC, region)
                        with m.Case(Op.ALLOC):
                            with m.If(ok):
                                m.d.sync += [pending.eq(1), pend_region.eq(region),
                                             pend_slot.eq(resp.slot),
                                             pend_base.eq(slot_first(resp.slot)),
                                             pend_ext[0].lo.eq(offset), pend_ext[0].hi.eq(end),
                                             state.eq(_State.EXT_READ)]
                                for e in pend_ext[1:]:
                                    m.d.sync += e.eq(0)
                            with m.Else():
                                to_card()                # FULL: no copy, none to drop
                        with m.Case(Op.COMMIT):
                            m.d.sync += state.eq(_State.STATUS)
                        with m.Default():                # ABORT, CLEAR, DROP, COUNT
                            with m.If(after != _After.IDLE):
                                m.d.sync += pending.eq(0)
                            with m.Switch(after):
                                with m.Case(_After.IDLE):
                                    # a directory's DROP (forgetting a pending write of its
                                    # region), or the residents' COUNT
                                    with m.If(ht_op == Op.COUNT):
                                        m.d.sync += [residents.eq(resp.count),
                                                     state.eq(_State.RESIDENTS)]
                                    with m.Else():
                                        with m.If(pend_region == ht_region):
                                            m.d.sync += pending.eq(0)
                                        m.d.sync += state.eq(_State.IDLE)
                                with m.Case(_After.ALLOC):
                                    hot_command(Op.ALLOC, region)
                                with m.Case(_After.DROP):
                                    hot_command(Op.DROP, region)
                                with m.Case(_After.CARD):
                                    to_card()
                                with m.Default():
                                    m.d.sync += state.eq(_State.STATUS)

            with m.Case(_State.EXT_READ):
                with m.If(op == StorageOp.WRITE):
                    # after an ALLOC: the slot's sector is known one clock later
                    m.d.sync += [sd_lba.eq(slot_lba), card_cmd_valid.eq(1),
                                 sd_cmd_valid.eq(1), state.eq(_State.BOTH)]
                with m.Else():
                    m.d.sync += state.eq(_State.EXT_CHECK)

            with m.Case(_State.EXT_CHECK):
                # registered, each bound's compare on its own: the compares start at the block
                # RAM's output and would run on into the backends' command valids (the tier's
                # longest path at 60 MHz); the AND and OR of them come a clock later
                m.d.sync += [*(x.eq(Const(1) if bug == "extents" else cond) for x, cond in
                               zip(within, [c for e in ext_r.data
                                            for c in (e.lo <= offset, end <= e.hi)])),
                             state.eq(_State.EXT_SERVE)]

            with m.Case(_State.EXT_SERVE):
                with m.If(served_q):
                    m.d.sync += [sd_lba.eq(slot_lba), sd_cmd_valid.eq(1),
                                 state.eq(_State.SDRAM), rd_open.eq(1)]
                with m.Else():
                    to_card()

            # A transfer to one backend: its write data straight through, its read data
            # through the register slice, its status into ``card_err`` (the SDRAM's for a
            # read served from there) and given from STATUS.
            with m.Case(_State.CARD):
                _through(m, st.wdata, card.wdata)
                _through(m, card.rdata, rd.i)
                take_status(card)

            with m.Case(_State.SDRAM):
                _through(m, sd.rdata, rd.i)
                take_status(sd)

            with m.Case(_State.BOTH):
                c_free = ~c_buf_valid | card.wdata.ready | card_done
                s_free = ~s_buf_valid | sd.wdata.ready | sd_done
                m.d.comb += [st.wdata.ready.eq(c_free & s_free & ~(card_done & sd_done)),
                             card.wdata.valid.eq(c_buf_valid & ~card_done),
                             card.wdata.payload.eq(buf),
                             sd.wdata.valid.eq(s_buf_valid & ~sd_done),
                             sd.wdata.payload.eq(buf),
                             card.status.ready.eq(~card_done), sd.status.ready.eq(~sd_done)]
                with m.If(card.wdata.valid & card.wdata.ready):
                    m.d.sync += c_buf_valid.eq(0)
                with m.If(sd.wdata.valid & sd.wdata.ready):
                    m.d.sync += s_buf_valid.eq(0)
                with m.If(st.wdata.valid & st.wdata.ready):
                    m.d.sync += [buf.eq(st.wdata.payload), c_buf_valid.eq(~card_done),
                                 s_buf_valid.eq(~sd_done)]
                with m.If(card.status.valid & card.status.ready):
                    m.d.sync += [card_done.eq(1), card_err.eq(card.status.payload.error),
                                 c_buf_valid.eq(0)]
                with m.If(sd.status.valid & sd.status.ready):
                    m.d.sync += [sd_done.eq(1), sd_err.eq(sd.status.payload.error),
                                 s_buf_valid.eq(0)]
                with m.If(card_done & sd_done):
                    m.d.sync += [card_done.eq(0), sd_done.eq(0), state.eq(_State.SETTLE)]

            with m.Case(_State.SETTLE):
                both_ok = (card_err == StorageError.OK) & (sd_err == StorageError.OK)
                commit = (is_header | (bug == "early")) & (both_ok | (bug == "error"))
                with m.If(commit):
                    m.d.comb += [ext_w.addr.eq(pend_slot), ext_w.en.eq(1)]
                    for i, e in enumerate(pend_ext):
                        m.d.comb += ext_w.data[i].eq(e)
                    m.d.sync += pending.eq(0)
                    hot_command(Op.COMMIT, pend_region, pend_slot)
                with m.Elif(~both_ok & (bug != "error")):
                    hot_command(Op.ABORT, pend_region, pend_slot, _After.STATUS)
                with m.Else():
                    m.d.sync += state.eq(_State.STATUS)

            with m.Case(_State.STATUS):
                m.d.comb += [st.status.valid.eq(~rd.o.valid | (card_err != StorageError.OK)
                                                | (bug == "slice_early")),
                             st.status.payload.error.eq(card_err)]
                with m.If(st.status.valid & st.status.ready):
                    m.d.sync += [rd_open.eq(bug == "slice_stale"), state.eq(_State.IDLE)]

        m.d.comb += ext_r.addr.eq(Mux(state == _State.HT_WAIT, resp.slot, slot))
        return m
