"""Dispatcher unit: the snapshot store (QUERY and EXPORT).

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop`.

* ``QUERY n``: hash the first n tokens, look ``(n, hash)`` up, and on a directory hit have the
  DMA verify and import the record; ``HIT`` only if everything matched. A record that can never
  verify (empty, foreign format or configuration, bad header, stale, bad payload CRC, bad tag)
  is deleted from the directory (its region returns to the allocator); a token mismatch (a
  hash collision), a storage error (maybe transient) or ``NO_KEY`` (a record under another key
  id: another tenant may hold its key, so one tenant's request must not free it) keeps it, and
  LRU ages it out. The LOOKUP has refreshed its stamp, as on every directory hit.
* ``EXPORT n kind``: ``kind`` (:class:`~ringkv.defs.record.RecordKind`: 0 turn snapshot, 1
  checkpoint; another value is ``BAD_ARG``) goes into the record header. Every ring must hold
  the n tokens with one head (checked first: a refusal changes nothing); hash, look up the
  old record of the key, insert (evicting the LRU snapshot when full), DMA export with the
  commit sequence number, then retire the old record; an export that fails is undone. The
  sequence number advances modulo 2**32 on each committed export.

In a sealed build both carry a tenant key slot
(:meth:`~ringkv.hw.commands.dispatch.Dispatcher.tenant`: ``BAD_ARG`` past the slots, ``NO_KEY`` for
a slot without a key, before anything else): the hash starts from the tenant's seed, and the DMA
transfer is a sealed one under that slot.
"""

from amaranth import Mux, Signal

from ringkv.defs.protocol import NO_RECORD, RESPONSES, Op
from ringkv.defs.record import RecordKind

from ..protocol import Status
from ..storage.dma import DmaOp, RecordStatus
from ..storage.dma import RecordKind as HwRecordKind
from ..store.directory import Op as DirOp
from ..store.directory import Status as DirStatus
from .dispatch import CommandUnit

__all__ = ["SnapshotUnit"]


class SnapshotUnit(CommandUnit):
    OPS = (Op.QUERY, Op.EXPORT)

    def signals(self, d):
        c, lay = d.config, d.layout
        self.s_n = Signal(32)
        self.s_rec = Signal(8)
        self.s_dir = Signal(4)
        self.s_link = Signal(16)
        self.s_region = Signal(24)
        self.s_seq = Signal(32)
        self.s_old_hit = Signal()
        self.s_old_link = Signal(16)
        self.s_bad = Signal()
        self.s_prev_head = Signal(16)
        self.s_cycles = Signal(32)
        self.s_kind = Signal(HwRecordKind)
        valid_slots = Mux(self.s_n < c.window, self.s_n, c.window)
        self.s_bytes = (self.s_n * lay.token_bytes
                        + valid_slots * (2 * c.layers * c.kv_heads * c.head_dim * lay.elem_bytes))

    def responses(self, d):
        fields = dict(record_status=self.s_rec, dir_status=self.s_dir, link=self.s_link,
                      region=self.s_region, count=self.s_n, hash=d.hash_val, bytes=self.s_bytes,
                      cycles=self.s_cycles, seq=self.s_seq)
        return {Op.QUERY: fields, Op.EXPORT: fields}

    def dispatch(self, d):
        m, tm, arg = d.m, d.tm, d.arg
        with m.Case(Op.QUERY.value), d.tenant(Op.QUERY):
            n = arg(Op.QUERY, "n")
            with m.If(d.early((n == 0) | (n > tm.count))):
                d.reject(Status.BAD_ARG)
            with m.Else():
                m.d.sync += [d.h_n.eq(n), d.h_i.eq(0), self.s_n.eq(n), self.s_rec.eq(NO_RECORD),
                             self.s_dir.eq(DirStatus.MISS), self.s_link.eq(0),
                             self.s_region.eq(0), self.s_seq.eq(0)]
                m.next = "QUERY_HASH"
        with m.Case(Op.EXPORT.value), d.tenant(Op.EXPORT):
            n = arg(Op.EXPORT, "n")
            kind = arg(Op.EXPORT, "kind")
            # (that every ring holds n tokens is checked by EXPORT_RINGS, ring 0 included:
            # not here, where the ring port's metadata read would lengthen the dispatch path)
            with m.If(d.early((n == 0) | (n > tm.count)
                              | (kind > max(k.value for k in RecordKind)))):
                d.reject(Status.BAD_ARG)
            with m.Else():
                m.d.sync += [d.h_n.eq(n), d.h_i.eq(0), self.s_n.eq(n), self.s_rec.eq(NO_RECORD),
                             self.s_dir.eq(DirStatus.MISS), self.s_link.eq(0),
                             self.s_region.eq(0), self.s_seq.eq(d.commit_seq), d.tok_i.eq(0),
                             self.s_bad.eq(0), self.s_kind.eq(kind)]
                m.next = "EXPORT_RINGS"

    def states(self, d):
        m, dresp, dma_resp, hash_val = d.m, d.dresp, d.dma_resp, d.hash_val
        R = d.config.layers * d.config.kv_heads
        s_n, s_rec, s_dir, s_link, s_region = (self.s_n, self.s_rec, self.s_dir, self.s_link,
                                               self.s_region)
        # ---- QUERY: hash, lookup, verify + import ----
        d.hash_call("QUERY_HASH", "QUERY_LOOKUP")
        d.dir_call("QUERY_LOOKUP", "QUERY_LOOKED_UP", op=DirOp.LOOKUP, count=s_n, hash=hash_val)
        with m.State("QUERY_LOOKED_UP"):
            m.d.sync += [s_dir.eq(dresp.status), s_link.eq(dresp.link),
                         s_region.eq(dresp.region), d.queries.eq(d.queries + 1)]
            with m.If(dresp.status == DirStatus.OK):
                m.next = "QUERY_IMPORT"
            with m.Else():
                m.next = "QUERY_DONE"
        d.dma_call("QUERY_IMPORT", "QUERY_IMPORTED", op=DmaOp.IMPORT, region=s_region, count=s_n,
                   hash=hash_val, **d.dma_tenant())
        with m.State("QUERY_IMPORTED"):
            status = dma_resp.status
            m.d.sync += [s_rec.eq(status), self.s_seq.eq(dma_resp.seq)]
            # kept: a hash collision, a storage fault, another key id's record (not ours to free)
            drop = ((status != RecordStatus.OK) & (status != RecordStatus.TOKEN_MISMATCH)
                    & (status != RecordStatus.STORAGE) & (status != RecordStatus.NO_KEY))
            with m.If(status == RecordStatus.OK):
                m.d.sync += d.hits.eq(d.hits + 1)
            with m.If(drop):
                m.next = "QUERY_DROP"
            with m.Else():
                m.next = "QUERY_DONE"
        d.dir_call("QUERY_DROP", "QUERY_DONE", op=DirOp.DELETE, link=s_link)
        with m.State("QUERY_DONE"):
            m.d.sync += self.s_cycles.eq(d.cycles - d.cycles_at)
            hit = (s_dir == DirStatus.OK) & (s_rec == RecordStatus.OK)
            d.respond(Mux(hit, Status.HIT, Status.MISS), RESPONSES[Op.QUERY].size)

        # ---- EXPORT: rings agree, hash, lookup old, insert, DMA export, retire ----
        with m.State("EXPORT_RINGS"):
            # every ring must hold the n tokens, with the same head (the DMA checks this
            # too, but after the directory insert: checked here, a refusal changes nothing).
            # ``meta_ring`` is the dispatcher's item index ``tok_i``, and the port's metadata
            # is registered (read one clock later): at ``tok_i = k`` it is ring k - 1's, so
            # the check runs over ``tok_i = 1 .. R`` (R + 1 clocks)
            s_ring = d.tok_i
            with m.If((s_ring != 0)
                      & ((d.ring.meta_count != s_n)
                         | ((d.ring.meta_head != self.s_prev_head) & (s_ring != 1)))):
                m.d.sync += self.s_bad.eq(1)
            m.d.sync += [s_ring.eq(s_ring + 1), self.s_prev_head.eq(d.ring.meta_head)]
            with m.If(s_ring == R):
                m.next = "EXPORT_RINGS_OK"
        with m.State("EXPORT_RINGS_OK"):
            with m.If(self.s_bad):
                m.d.sync += [d.rstatus.eq(Status.BAD_ARG), d.rlen.eq(0)]
                m.d.comb += d.rejecting.eq(1)
                m.next = "RESPOND_HEADER"
            with m.Else():
                m.next = "EXPORT_HASH"
        d.hash_call("EXPORT_HASH", "EXPORT_LOOKUP")
        d.dir_call("EXPORT_LOOKUP", "EXPORT_LOOKED_UP", op=DirOp.LOOKUP, count=s_n, hash=hash_val)
        with m.State("EXPORT_LOOKED_UP"):
            m.d.sync += [self.s_old_hit.eq(dresp.status == DirStatus.OK),
                         self.s_old_link.eq(dresp.link)]
            m.next = "EXPORT_INSERT"
        d.dir_call("EXPORT_INSERT", "EXPORT_INSERTED", op=DirOp.INSERT, count=s_n, hash=hash_val,
                   evict=1)
        with m.State("EXPORT_INSERTED"):
            m.d.sync += [s_dir.eq(dresp.status), s_link.eq(dresp.link),
                         s_region.eq(dresp.region)]
            with m.If(dresp.evicted & (dresp.victim == self.s_old_link)):
                m.d.sync += self.s_old_hit.eq(0)       # the old record was the LRU victim
            with m.If(dresp.status == DirStatus.OK):
                m.next = "EXPORT_WRITE"
            with m.Else():
                m.next = "EXPORT_DONE"
        d.dma_call("EXPORT_WRITE", "EXPORT_WRITTEN", op=DmaOp.EXPORT, region=s_region, count=s_n,
                   hash=hash_val, seq=self.s_seq, kind=self.s_kind, **d.dma_tenant())
        with m.State("EXPORT_WRITTEN"):
            m.d.sync += s_rec.eq(dma_resp.status)
            with m.If(dma_resp.status == RecordStatus.OK):
                m.d.sync += [d.commit_seq.eq(d.commit_seq + 1), d.exports.eq(d.exports + 1)]
                with m.If(self.s_old_hit):
                    m.next = "EXPORT_RETIRE"
                with m.Else():
                    m.next = "EXPORT_DONE"
            with m.Else():
                m.next = "EXPORT_UNDO"
        d.dir_call("EXPORT_RETIRE", "EXPORT_DONE", op=DirOp.DELETE, link=self.s_old_link)
        d.dir_call("EXPORT_UNDO", "EXPORT_DONE", op=DirOp.DELETE, link=s_link)
        with m.State("EXPORT_DONE"):
            m.d.sync += self.s_cycles.eq(d.cycles - d.cycles_at)
            status = Mux(s_dir != DirStatus.OK, d.dir_to_status(s_dir),
                         Mux(s_rec == RecordStatus.OK, Status.OK,
                             Mux(s_rec == RecordStatus.STORAGE, Status.STORAGE_ERROR,
                                 Status.INTERNAL)))
            d.respond(status, RESPONSES[Op.EXPORT].size)
