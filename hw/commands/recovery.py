"""Dispatcher unit: the device's own directory recovery (STORAGE_REBUILD, STORAGE_STATUS).

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop` with a
**background scanner**: an FSM beside the dispatcher's that starts at reset (and again on
``STORAGE_REBUILD``) and rebuilds the directory from the record headers, while the dispatcher
goes on answering every request that does not need the directory or the store.

The scan, in region order (the golden model is :func:`ringkv.host.record.plan_recovery`)::

    CLEAR ─► for r in 0 .. regions-1:
               HEADER(r)  (DMA: one sector, the import's header checks)
                 STORAGE error ─────────────────────────────────► FAILED
                 OK, count 0: newest, freed      OK, count > 0: newest, LOOKUP(count, hash)
                 EMPTY: -      other: freed        miss ─► INSERT_EXISTING(r)
                                                   hit  ─► HEADER(r0) again (its sequence)
                                                          new wins: DELETE(r0's link),
                                                                    INSERT_EXISTING(r)
             commit_seq := newest + 1 (1 with no valid header) ─► READY

* ``newest`` is the running newest commit sequence in serial-number order
  (``seq_newer(s, newest)``: ``0 < (s - newest) mod 2**32 < 2**31``), over every valid header;
  it equals :func:`ringkv.defs.record.seq_newest` whenever the store's sequence numbers lie on
  an arc shorter than half the circle (the store's invariant; the argument is in
  ``docs/blocks/record-format.md``).
* A duplicate key is resolved against the stored winner by reading its header again (no
  per-region sequence memory: no block RAM; one more sector read per duplicate): the new
  record wins unless the stored one is newer, so equal sequences go to the later region.
* The payload is not read: its CRC and the tokens stay verified at import (``QUERY``), where a
  record that cannot verify is a miss and is deleted (its region freed).

While the scan runs the requests of :data:`~ringkv.defs.protocol.RECOVERY_SCAN_GATED` (the
directory, raw sectors, a second rebuild) and :data:`~ringkv.defs.protocol.RECOVERY_GATED`
(``QUERY``, ``EXPORT``) answer ``NOT_READY`` with the :data:`RECOVERY_STATUS` record (progress
``scanned`` / ``regions``); after a failed scan (the storage port reported an error: card
gone, timeout) ``QUERY`` and ``EXPORT`` keep answering ``NOT_READY`` with ``state = FAILED``
and the storage error, until a ``STORAGE_REBUILD`` succeeds. Every other request answers as
usual, at the same clocks.

Latency: per region, the header read (the storage port's latency plus 512 bytes at its pace,
~524 clocks on a port with no wait states) plus ~10 clocks for a live record (lookup and
insert-existing), plus a second header read for a duplicate key. No hang: every wait is a
directory command (bounded) or a DMA command (answered once the storage port answers: the
storage contract ends a dead card in an error).
"""

from amaranth import Mux, Signal

from ringkv.defs import protocol as defs
from ringkv.defs.protocol import RECOVERY_GATED, RECOVERY_SCAN_GATED, RECOVERY_STATUS, Op

from ..enums import shaped
from ..storage.dma import DmaOp, RecordStatus
from ..storage.port import StorageError
from ..store.directory import Op as DirOp
from ..store.directory import Status as DirStatus
from .dispatch import CommandUnit, pack_layout

__all__ = ["RecoveryUnit", "RecoveryState", "RECOVERY_STATUS"]

#: :class:`ringkv.defs.protocol.RecoveryState` as a 2-bit shape.
RecoveryState = shaped(defs.RecoveryState, 2, module=__name__)


def _seq_newer(a, b):
    """``a`` newer than ``b`` in serial-number order (:func:`ringkv.defs.record.seq_newer`)."""
    diff = (a - b)[:32]
    return (diff != 0) & ~diff[31]


class RecoveryUnit(CommandUnit):
    OPS = (Op.STORAGE_REBUILD, Op.STORAGE_STATUS)

    def signals(self, d):
        m, regions = d.m, d.top.regions
        self.state = Signal(RecoveryState, init=RecoveryState.SCANNING)
        self.error = Signal(StorageError)
        self.scanned = Signal(range(regions + 1))
        self.live = Signal(range(regions + 1))
        self.freed = Signal(range(regions + 1))
        self.cycles = Signal(64)
        self.start = Signal()
        self.region = Signal(range(regions))
        self.old_region = Signal(24)
        self.link = Signal(16)
        self.rec_count = Signal(32)
        self.rec_hash = Signal(64)
        self.rec_seq = Signal(32)
        self.newest = Signal(32)
        self.have_newest = Signal()
        scanning = self.state == RecoveryState.SCANNING
        m.d.comb += d.scan_busy.eq(scanning)
        # the answer to every NOT_READY (and to STORAGE_STATUS / STORAGE_REBUILD)
        self.fields = dict(state=self.state.as_value(), error=self.error.as_value(),
                           scanned=self.scanned, regions=regions, live=self.live,
                           freed=self.freed, next_seq=d.commit_seq, cycles=self.cycles)
        m.d.comb += d.not_ready_word.eq(pack_layout(RECOVERY_STATUS, **self.fields))
        # Which gate applies to the request is decoded from ``op`` a clock ahead (``early``:
        # ``op`` is final in DECODE); only the scan's state is read in DISPATCH. ``not_ready``
        # decides every DISPATCH case, and the op decode in front of it was on the longest
        # paths into the units' registers at the board's 60 MHz (docs/BOARD.md).
        op = d.op.as_value()
        # (the sets in a fixed order: iterated in hash order, they gave the RTLIL a different
        # text in each Python process, so a rebuild of one commit was not the same netlist)
        gated = d.early(op.matches(*sorted(o.value for o in RECOVERY_GATED)))
        scan_gated = d.early(op.matches(*sorted(o.value
                                                for o in RECOVERY_SCAN_GATED - RECOVERY_GATED)))
        m.d.comb += d.not_ready.eq((gated & (self.state != RecoveryState.READY))
                                   | (scan_gated & scanning))
        with m.If(scanning):
            m.d.sync += self.cycles.eq(self.cycles + 1)
            # the storage port's error code of the scan's failing transfer
            st = d.top.initiator.status
            with m.If(st.valid & st.ready & (st.payload.error != StorageError.OK)):
                m.d.sync += self.error.eq(st.payload.error)

    def responses(self, d):
        return {Op.STORAGE_STATUS: self.fields, Op.STORAGE_REBUILD: self.fields}

    def dispatch(self, d):
        m = d.m
        with m.Case(Op.STORAGE_STATUS.value):
            d.ok_fixed(Op.STORAGE_STATUS)
        with m.Case(Op.STORAGE_REBUILD.value):
            # (answered NOT_READY while a scan runs: see signals)
            m.d.comb += self.start.eq(1)
            d.ok_fixed(Op.STORAGE_REBUILD)

    def background(self, d):
        m, regions = d.m, d.top.regions
        resp, dresp = d.dma_resp, d.dresp
        with m.FSM(name="recovery", init="SCAN_CLEAR"):
            with m.State("SCAN_IDLE"):
                with m.If(self.start):
                    m.d.sync += [self.state.eq(RecoveryState.SCANNING),
                                 self.error.eq(StorageError.OK), self.scanned.eq(0),
                                 self.live.eq(0), self.freed.eq(0), self.cycles.eq(0),
                                 self.region.eq(0), self.have_newest.eq(0)]
                    m.next = "SCAN_CLEAR"
            d.dir_call("SCAN_CLEAR", "SCAN_HEADER", op=DirOp.CLEAR)
            d.dma_call("SCAN_HEADER", "SCAN_HEADER_DONE", op=DmaOp.HEADER, region=self.region)
            with m.State("SCAN_HEADER_DONE"):
                m.d.sync += [self.rec_count.eq(resp.count), self.rec_hash.eq(resp.hash),
                             self.rec_seq.eq(resp.seq)]
                with m.Switch(resp.status):
                    with m.Case(RecordStatus.STORAGE):
                        m.next = "SCAN_FAILED"
                    with m.Case(RecordStatus.OK):
                        with m.If(~self.have_newest | _seq_newer(resp.seq, self.newest)):
                            m.d.sync += [self.newest.eq(resp.seq), self.have_newest.eq(1)]
                        with m.If(resp.count == 0):
                            m.d.sync += self.freed.eq(self.freed + 1)
                            m.next = "SCAN_NEXT"
                        with m.Else():
                            m.next = "SCAN_LOOKUP"
                    with m.Case(RecordStatus.EMPTY):
                        m.next = "SCAN_NEXT"
                    with m.Default():
                        m.d.sync += self.freed.eq(self.freed + 1)
                        m.next = "SCAN_NEXT"
            d.dir_call("SCAN_LOOKUP", "SCAN_LOOKED_UP", op=DirOp.LOOKUP, count=self.rec_count,
                       hash=self.rec_hash)
            with m.State("SCAN_LOOKED_UP"):
                m.d.sync += [self.link.eq(dresp.link), self.old_region.eq(dresp.region)]
                with m.If(dresp.status == DirStatus.OK):
                    m.next = "SCAN_OLD"
                with m.Else():
                    m.next = "SCAN_INSERT"
            d.dma_call("SCAN_OLD", "SCAN_OLD_DONE", op=DmaOp.HEADER, region=self.old_region)
            with m.State("SCAN_OLD_DONE"):
                # the stored winner's header again: the later record wins unless it is older
                new_wins = (resp.status != RecordStatus.OK) | ~_seq_newer(resp.seq, self.rec_seq)
                with m.If(resp.status == RecordStatus.STORAGE):
                    m.next = "SCAN_FAILED"
                with m.Else():
                    m.d.sync += self.freed.eq(self.freed + 1)
                    with m.If(new_wins):
                        m.d.sync += self.live.eq(self.live - 1)
                        m.next = "SCAN_DELETE"
                    with m.Else():
                        m.next = "SCAN_NEXT"
            d.dir_call("SCAN_DELETE", "SCAN_INSERT", op=DirOp.DELETE, link=self.link)
            d.dir_call("SCAN_INSERT", "SCAN_INSERTED", op=DirOp.INSERT_EXISTING,
                       count=self.rec_count, hash=self.rec_hash, region=self.region)
            with m.State("SCAN_INSERTED"):
                with m.If(dresp.status == DirStatus.OK):
                    m.d.sync += self.live.eq(self.live + 1)
                with m.Else():                      # FULL: fewer links than records
                    m.d.sync += self.freed.eq(self.freed + 1)
                m.next = "SCAN_NEXT"
            with m.State("SCAN_NEXT"):
                m.d.sync += self.scanned.eq(self.scanned + 1)
                with m.If(self.region == regions - 1):
                    m.next = "SCAN_DONE"
                with m.Else():
                    m.d.sync += self.region.eq(self.region + 1)
                    m.next = "SCAN_HEADER"
            with m.State("SCAN_DONE"):
                m.d.sync += [d.commit_seq.eq(Mux(self.have_newest, self.newest + 1, 1)),
                             self.state.eq(RecoveryState.READY)]
                m.next = "SCAN_IDLE"
            with m.State("SCAN_FAILED"):
                m.d.sync += self.state.eq(RecoveryState.FAILED)
                m.next = "SCAN_IDLE"


