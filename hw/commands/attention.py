"""Dispatcher unit: the attention core and its rings (ATTN_*, RING_CLEAR, RING_READ, SESSION_BEGIN).

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop`.

* ``ATTN_DECODE`` / ``ATTN_PREFILL``: the response header goes out first, then the request's
  q/k/v bytes stream into the core (one ``ATTEND`` command per KV head, beats of M elements of
  EB bytes) while its int16 outputs stream out as little-endian bytes, both with backpressure.
* ``RING_CLEAR`` empties one layer's rings or all; ``SESSION_BEGIN`` empties the token memory
  and every ring (a new resident session).
* ``RING_READ`` reads bytes of the byte-addressed ring port or per-ring metadata (count u32,
  head u16): 4 clocks per item (the ring port's read latency is two clocks).
"""

from amaranth import Cat, Mux, Signal

from ringkv.defs.protocol import (
    META_BYTES,
    REQUESTS,
    RING_CLEAR_ALL,
    RING_ELEMENTS,
    RING_META,
    Op,
    attn_in_bytes,
    attn_out_bytes,
)
from ringkv.defs.record import ring_bytes as ring_space_bytes

from ..attention.core import AttnOp
from ..protocol import Status
from .dispatch import CommandUnit

__all__ = ["AttentionUnit"]


class AttentionUnit(CommandUnit):
    OPS = (Op.SESSION_BEGIN, Op.RING_CLEAR, Op.ATTN_DECODE, Op.ATTN_PREFILL, Op.RING_READ)
    BODIES = {"RING": "RING_READ_ISSUE", "ATTN": "ATTEND_RUN"}

    def signals(self, d):
        Hkv, M, EB = d.config.kv_heads, d.at.macs, d.layout.elem_bytes
        self.a_layer = Signal(8)
        self.a_count = Signal(16)
        self.a_kvh = Signal(range(Hkv + 1))
        self.a_inflight = Signal()
        self.a_done = Signal(range(Hkv + 1))
        self.a_beat = Signal(8 * M * EB)       # one ``i`` beat: M elements of EB bytes
        self.a_fill = Signal(range(M * EB + 1))
        self.a_obuf = Signal(16 * M)
        self.a_ofull = Signal()
        self.a_opos = Signal(range(2 * M))
        self.a_sent = Signal(17)
        self.a_clear_op = Signal(AttnOp)
        self.rr_word = Signal(48)
        self.rr_pos = Signal(range(META_BYTES))

    def dispatch(self, d):
        m, arg, c, top = d.m, d.arg, d.config, d.top
        L = c.layers
        R = c.layers * c.kv_heads
        ring_bytes = ring_space_bytes(c)       # the byte-addressed ring port's space
        per_token_in = attn_in_bytes(c, 1)
        per_token_out = attn_out_bytes(c, 1)
        with m.Case(Op.SESSION_BEGIN.value):
            m.d.comb += d.tm.clear.eq(1)
            m.d.sync += self.a_clear_op.eq(AttnOp.CLEAR_ALL)
            m.next = "RING_CLEAR"
        with m.Case(Op.RING_CLEAR.value):
            layer = arg(Op.RING_CLEAR, "layer")
            with m.If(d.early(layer == RING_CLEAR_ALL)):
                m.d.sync += [self.a_clear_op.eq(AttnOp.CLEAR_ALL), self.a_layer.eq(0)]
                m.next = "RING_CLEAR"
            with m.Elif(d.early(layer < L)):
                m.d.sync += [self.a_clear_op.eq(AttnOp.CLEAR), self.a_layer.eq(layer)]
                m.next = "RING_CLEAR"
            with m.Else():
                d.reject(Status.BAD_ARG)
        for o in (Op.ATTN_DECODE, Op.ATTN_PREFILL):
            with m.Case(o.value):
                layer = arg(o, "layer")
                count = arg(o, "count")
                in_len = REQUESTS[o].size + count * per_token_in
                with m.If(d.early(d.length != in_len)):
                    d.reject(Status.BAD_LENGTH)
                with m.Elif(d.early((layer >= L) | (count == 0)
                                    | (count * per_token_out > 0xFFFF)
                                    | ((count != 1) if o == Op.ATTN_DECODE else 0))):
                    d.reject(Status.BAD_ARG)
                with m.Else():
                    m.d.sync += [self.a_layer.eq(layer), self.a_count.eq(count),
                                 self.a_kvh.eq(0), self.a_inflight.eq(0), self.a_done.eq(0),
                                 self.a_fill.eq(0), self.a_ofull.eq(0), self.a_opos.eq(0),
                                 self.a_sent.eq(0)]
                    d.respond(Status.OK, d.early((count * per_token_out)[:16]), "ATTN")
        with m.Case(Op.RING_READ.value):
            addr = arg(Op.RING_READ, "addr")
            n = arg(Op.RING_READ, "n")
            what = arg(Op.RING_READ, "what")
            with m.If(d.early(what == RING_ELEMENTS)):
                with m.If(d.early((addr + n > ring_bytes) | (n > top.max_payload))):
                    d.reject(Status.BAD_ARG)
                with m.Else():
                    m.d.sync += d.tok_i.eq(addr)
                    d.respond(Status.OK, n, "RING")
            with m.Elif(d.early(what == RING_META)):
                with m.If(d.early((addr + n > R) | (n * META_BYTES > top.max_payload))):
                    d.reject(Status.BAD_ARG)
                with m.Else():
                    m.d.sync += d.tok_i.eq(addr)
                    d.respond(Status.OK, d.early((n * META_BYTES)[:16]), "RING")
            with m.Else():
                d.reject(Status.BAD_ARG)

    def states(self, d):
        m, at, dec, enc, arg = d.m, d.at, d.dec, d.enc, d.arg
        Hkv, M, EB = d.config.kv_heads, d.at.macs, d.layout.elem_bytes
        # ---- ring clear (SESSION_BEGIN, RING_CLEAR) ----
        d.attn_cmd("RING_CLEAR", "RING_CLEAR_DONE", self.a_clear_op, self.a_layer)
        with m.State("RING_CLEAR_DONE"):
            d.respond(Status.OK)

        # ---- ATTN_DECODE / ATTN_PREFILL: header sent, then stream both ways ----
        a_kvh, a_inflight, a_done = self.a_kvh, self.a_inflight, self.a_done
        a_fill, a_beat, a_obuf = self.a_fill, self.a_beat, self.a_obuf
        a_ofull, a_opos, a_sent = self.a_ofull, self.a_opos, self.a_sent
        with m.State("ATTEND_RUN"):
            # one ATTEND command per KV head, in order
            m.d.comb += [at.cmd.valid.eq((a_kvh != Hkv) & ~a_inflight),
                         at.cmd.payload.op.eq(AttnOp.ATTEND),
                         at.cmd.payload.layer.eq(self.a_layer),
                         at.cmd.payload.kv_head.eq(a_kvh),
                         at.cmd.payload.count.eq(self.a_count),
                         at.status.ready.eq(1)]
            with m.If(at.cmd.valid & at.cmd.ready):
                m.d.sync += [a_inflight.eq(1), a_kvh.eq(a_kvh + 1)]
            with m.If(at.status.valid):
                m.d.sync += [a_inflight.eq(0), a_done.eq(a_done + 1)]
            # payload bytes -> beats of M elements of EB bytes (little-endian elements,
            # element 0 at the LSB: the byte order of the payload is the beat's bit order)
            MB = M * EB
            m.d.comb += [dec.data.ready.eq(a_fill != MB),
                         at.i.valid.eq(a_fill == MB), at.i.payload.eq(a_beat)]
            with m.If(dec.data.valid & dec.data.ready):
                m.d.sync += [a_beat.word_select(a_fill[:max(1, (MB - 1).bit_length())]
                                                if MB > 1 else 0, 8)
                             .eq(dec.data.payload.data),
                             a_fill.eq(a_fill + 1)]
            with m.If(at.i.valid & at.i.ready):
                m.d.sync += a_fill.eq(0)
            # output beats -> little-endian int16 bytes
            m.d.comb += at.o.ready.eq(~a_ofull)
            with m.If(at.o.valid & ~a_ofull):
                m.d.sync += [a_obuf.eq(at.o.payload), a_ofull.eq(1), a_opos.eq(0)]
            m.d.comb += [enc.data.valid.eq(a_ofull),
                         enc.data.payload.eq(a_obuf.word_select(a_opos, 8))]
            with m.If(enc.data.valid & enc.data.ready):
                m.d.sync += [a_opos.eq(a_opos + 1), a_sent.eq(a_sent + 1)]
                with m.If(a_opos == 2 * M - 1):
                    m.d.sync += a_ofull.eq(0)
            with m.If((a_done == Hkv) & (a_sent == d.rlen) & ~a_ofull):
                m.next = "IDLE"

        # ---- RING_READ: 4 clocks per item (a byte of the byte-addressed ring port, or the
        # metadata of a ring) ----
        tok_i, rr_pos, rr_word = d.tok_i, self.rr_pos, self.rr_word
        with m.State("RING_READ_ISSUE"):
            what = arg(Op.RING_READ, "what")
            m.d.comb += d.ring.ring_re.eq(what == RING_ELEMENTS)
            m.d.sync += rr_pos.eq(0)
            m.next = "RING_READ_WAIT"
        with m.State("RING_READ_WAIT"):            # ring data: two clocks after ring_re
            m.next = "RING_READ_CAPTURE"
        with m.State("RING_READ_CAPTURE"):
            what = arg(Op.RING_READ, "what")
            m.d.sync += rr_word.eq(Mux(what == RING_ELEMENTS, d.ring.ring_rdata,
                                       Cat(d.ring.meta_count, d.ring.meta_head)))
            m.next = "RING_READ_SEND"
        with m.State("RING_READ_SEND"):
            what = arg(Op.RING_READ, "what")
            m.d.comb += [enc.data.valid.eq(1),
                         enc.data.payload.eq(rr_word.word_select(rr_pos, 8))]
            with m.If(enc.data.ready):
                m.d.sync += [d.idx.eq(d.idx + 1), rr_pos.eq(rr_pos + 1)]
                with m.If(d.idx == d.rlen - 1):
                    m.next = "IDLE"
                with m.Elif((what == RING_ELEMENTS) | (rr_pos == META_BYTES - 1)):
                    m.d.sync += tok_i.eq(tok_i + 1)
                    m.next = "RING_READ_ISSUE"
