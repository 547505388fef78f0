"""Dispatcher unit: raw storage access (SECTOR_READ) and the medium's description
(STORAGE_INFO).

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop`. The top's
storage port belongs to the DMA except while a ``SECTOR_READ`` runs: the sector is read into a
512-byte buffer (at the storage port's pace; four bytes a row on a wide port,
``RingKVTop(storage_width=4)``), then sent after 2 clocks at a byte a clock (from a register,
the next row read while one is sent). A storage error or a short sector answers
``STORAGE_ERROR``.

``STORAGE_INFO`` answers at once (no storage command) with the build's storage parameters
(``storage_kind``, the bus width it implies, ``sd_clock_hz``), the controller's state on the
top's ``storage_info`` port (initialised, card type, high speed, capacity) and the storage
port's error record: every status with an error that passes the port (the DMA's transfers,
the recovery scan's, ``SECTOR_READ``'s) sets ``last_error`` and counts in ``errors``
(saturating). With an SDRAM hot tier (``RingKVTop(tier=...)``) it first asks the tiered
storage for its residents (the hot tier's ``COUNT``: ``slots + 4`` clocks, more while a storage
transfer runs) and reports them with the tier's parameters.

The same unit sends the tiered storage the region of every record the directory deletes
(every ``DELETE`` the directory answers ``OK``, whoever asked: ``DIR_DELETE``, a ``QUERY``
whose record can never verify, an ``EXPORT`` retiring the key's older record), from a
one-deep register: a delete that finds the register still full replaces it, and the older
region's copy stays (it still equals the card; its slot ages out by LRU).
"""

from amaranth import Const, Mux, Signal
from amaranth.lib import memory

from ringkv.defs.protocol import Op, StorageKind

from ..protocol import Status
from ..storage.port import SECTOR_BYTES, StorageError, StorageOp
from ..store.directory import Op as DirOp
from ..store.directory import Status as DirStatus
from .dispatch import CommandUnit

__all__ = ["StorageUnit"]


class StorageUnit(CommandUnit):
    OPS = (Op.SECTOR_READ, Op.STORAGE_INFO)
    BODIES = {"SECTOR": "SECTOR_READ_ISSUE"}

    def signals(self, d):
        m = d.m
        st, ds = d.top.initiator, d.dma.storage
        # registers, set and cleared with the dispatcher's state (SECTOR_COMMAND and
        # SECTOR_DATA), not decoded from it: the storage port's muxes and the SD controller
        # behind them see flip-flops
        self.st_top = st_top = Signal()
        self.top_cmd_valid, self.top_rready = top_cmd_valid, top_rready = Signal(), Signal()
        self.top_lba = Signal(32)
        m.d.comb += [
            st.cmd.valid.eq(Mux(st_top, top_cmd_valid, ds.cmd.valid)),
            st.cmd.payload.eq(ds.cmd.payload),
            ds.cmd.ready.eq(st.cmd.ready & ~st_top),
            st.wdata.valid.eq(ds.wdata.valid & ~st_top),
            st.wdata.payload.eq(ds.wdata.payload),
            ds.wdata.ready.eq(st.wdata.ready & ~st_top),
            ds.rdata.valid.eq(st.rdata.valid & ~st_top),
            ds.rdata.payload.eq(st.rdata.payload),
            st.rdata.ready.eq(Mux(st_top, top_rready, ds.rdata.ready)),
            ds.status.valid.eq(st.status.valid & ~st_top),
            ds.status.payload.eq(st.status.payload),
            st.status.ready.eq(Mux(st_top, 1, ds.status.ready)),
        ]
        with m.If(st_top):
            m.d.comb += [st.cmd.payload.op.eq(StorageOp.READ), st.cmd.payload.lba.eq(self.top_lba),
                         st.cmd.payload.count.eq(1)]
        # the sector buffer, a byte a row; on a wide storage port a word a row (four bytes,
        # the first low), read back a byte at a time (``sec_byte``)
        self.wide = wide = len(st.rdata.payload) == 32
        if wide:
            m.submodules.sector = sector = memory.Memory(shape=32, depth=SECTOR_BYTES // 4,
                                                        init=[])
            self.sec_wr = sector.write_port()
            self.sec_rd = sector.read_port(transparent_for=())
            self.sec_word = Signal(32)              # the row being sent (SECTOR_READ)
            self.sec_sel = Signal(2)                 # its byte being sent
            self.sec_byte = self.sec_word.word_select(self.sec_sel, 8)
        else:
            m.submodules.sector = sector = memory.Memory(shape=8, depth=SECTOR_BYTES, init=[])
            self.sec_wr = sector.write_port()
            self.sec_rd = sector.read_port(transparent_for=())
            self.sec_word = Signal(8)               # the byte being sent (SECTOR_READ)
            self.sec_byte = self.sec_word
        self.sec_row = Signal(range(SECTOR_BYTES // (4 if wide else 1)))  # the next row read
        self.sec_err = Signal()
        # the storage port's error record (STORAGE_INFO)
        self.last_error = Signal(StorageError)
        self.errors = Signal(32)
        error = st.status.payload.error
        with m.If(st.status.valid & st.status.ready & (error != StorageError.OK)):
            m.d.sync += [self.last_error.eq(error),
                         self.errors.eq(self.errors + (self.errors != 0xFFFF_FFFF))]
        self.residents = Signal(16)             # the tier's committed copies (STORAGE_INFO)

    def background(self, d):
        if d.top.tier is None:
            return
        tier = d.top.tier_storage
        # the directory's deletes: their regions to the tiered storage's ``drop``
        m, r = d.m, d.dr.o
        drop_valid = Signal()
        drop_region = Signal(len(tier.drop.payload))
        with m.If(tier.drop.ready):
            m.d.sync += drop_valid.eq(0)
        with m.If(r.valid & r.ready & (r.payload.op == DirOp.DELETE)
                  & (r.payload.status == DirStatus.OK)):
            m.d.sync += [drop_valid.eq(1), drop_region.eq(r.payload.region)]
        m.d.comb += [tier.drop.valid.eq(drop_valid), tier.drop.payload.eq(drop_region)]

    def responses(self, d):
        top = d.top
        info = top.storage_info
        width = {StorageKind.NONE: 0, StorageKind.SD_SPI: 1, StorageKind.SD_NATIVE: 4}
        hot = {}
        if top.tier is not None:
            t = top.tier["slot_token_sectors"]
            hot = dict(hot_slots=top.tier["slots"], hot_residents=self.residents,
                       hot_slot_sectors=top.tier["slot_sectors"],
                       hot_slot_tokens=d.layout.token_sectors_max if t is None else t)
        return {Op.STORAGE_INFO: dict(
            kind=top.storage_kind.value, card_type=info.card_type.as_value(),
            initialised=info.ready, bus_width=width[top.storage_kind],
            high_speed=info.high_speed, last_error=self.last_error.as_value(),
            errors=self.errors, sd_clock_hz=top.sd_clock_hz, sectors=info.sectors, **hot)}

    def dispatch(self, d):
        m, top = d.m, d.top
        region_sectors = top.regions * d.layout.sectors_per_region
        with m.Case(Op.SECTOR_READ.value):
            lba = d.arg(Op.SECTOR_READ, "lba")
            with m.If(d.early(lba >= region_sectors)):
                d.reject(Status.BAD_ARG)
            with m.Else():
                m.d.sync += [self.top_lba.eq(d.early(top.base_lba + lba)), d.idx.eq(0),
                             self.sec_err.eq(0), self.st_top.eq(1), self.top_cmd_valid.eq(1)]
                m.next = "SECTOR_COMMAND"
        with m.Case(Op.STORAGE_INFO.value):
            if top.tier is None:
                d.ok_fixed(Op.STORAGE_INFO)
            else:
                m.next = "INFO_RESIDENTS"

    def states(self, d):
        m, enc, idx, st = d.m, d.enc, d.idx, d.top.initiator
        sec_wr, sec_rd = self.sec_wr, self.sec_rd
        if d.top.tier is not None:
            tier = d.top.tier_storage
            with m.State("INFO_RESIDENTS"):
                m.d.comb += tier.residents_req.valid.eq(1)
                with m.If(tier.residents_req.ready):
                    m.next = "INFO_RESIDENTS_W"
            with m.State("INFO_RESIDENTS_W"):
                m.d.comb += tier.residents.ready.eq(1)
                with m.If(tier.residents.valid):
                    m.d.sync += self.residents.eq(tier.residents.payload)
                    d.ok_fixed(Op.STORAGE_INFO)
        with m.State("SECTOR_COMMAND"):
            with m.If(st.cmd.ready):
                m.d.sync += [self.top_cmd_valid.eq(0), self.top_rready.eq(1)]
                m.next = "SECTOR_DATA"
        with m.State("SECTOR_DATA"):
            # the storage contract: count*512 bytes, then one status (early on an error);
            # top_rready is ``idx != SECTOR_BYTES``, kept as a register
            step = 4 if self.wide else 1             # bytes a transfer
            m.d.comb += [sec_wr.addr.eq(idx >> 2 if self.wide else idx),
                         sec_wr.data.eq(st.rdata.payload)]
            with m.If(st.rdata.valid & (idx != SECTOR_BYTES)):
                m.d.comb += sec_wr.en.eq(1)
                m.d.sync += idx.eq(idx + step)
                with m.If(idx == SECTOR_BYTES - step):
                    m.d.sync += self.top_rready.eq(0)
            with m.If(st.status.valid):
                m.d.sync += [self.st_top.eq(0), self.top_rready.eq(0)]
                with m.If((st.status.payload.error != StorageError.OK)
                          | (idx != SECTOR_BYTES)):
                    d.respond(Status.STORAGE_ERROR)
                with m.Else():
                    d.respond(Status.OK, SECTOR_BYTES, "SECTOR")
        # The bytes leave from ``sec_word``, a register loaded from the sector buffer (a block
        # RAM without an output register: its 5.6 ns clock-to-out through the byte select into
        # the response encoder and the link's TX register was the half-rate board build's
        # critical path); the next row is read as a row is loaded (the read port holds its data
        # while ``en`` is low), so after ISSUE and LOAD the sector goes out a byte a clock; the
        # read after the last row wraps to row 0 and is never used.
        R = 4 if self.wide else 1                   # bytes a row
        with m.State("SECTOR_READ_ISSUE"):
            m.d.comb += [sec_rd.addr.eq(0), sec_rd.en.eq(1)]
            m.d.sync += self.sec_row.eq(1)
            m.next = "SECTOR_READ_LOAD"
        with m.State("SECTOR_READ_LOAD"):
            m.d.comb += [sec_rd.addr.eq(self.sec_row), sec_rd.en.eq(1)]
            m.d.sync += [self.sec_word.eq(sec_rd.data), self.sec_row.eq(self.sec_row + 1)]
            if self.wide:
                m.d.sync += self.sec_sel.eq(0)
            m.next = "SECTOR_READ_SEND"
        with m.State("SECTOR_READ_SEND"):
            m.d.comb += [sec_rd.addr.eq(self.sec_row), sec_rd.en.eq(0), enc.data.valid.eq(1),
                         enc.data.payload.eq(self.sec_byte)]
            with m.If(enc.data.ready):
                m.d.sync += idx.eq(idx + 1)
                if self.wide:
                    m.d.sync += self.sec_sel.eq(self.sec_sel + 1)
                with m.If(idx == SECTOR_BYTES - 1):
                    m.next = "IDLE"
                with m.Elif(self.sec_sel == R - 1 if self.wide else Const(1)):
                    m.d.comb += sec_rd.en.eq(1)
                    m.d.sync += [self.sec_word.eq(sec_rd.data),
                                 self.sec_row.eq(self.sec_row + 1)]
