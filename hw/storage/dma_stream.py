"""The DMA engine's byte-stream pieces: where a record's bytes come from and go to.

A record moves between storage and the rings one byte per clock. These pieces carry the bytes;
:class:`~ringkv.hw.storage.dma.DmaEngine`'s sequencer issues the storage commands and decides, per
clock, whether a byte moves.

* :class:`RecordCursor`: the loop nest of a segment (:class:`RecordSegment`): the byte's
  offset in the header sector, the token index and byte, and the ring port's byte address in the
  record's K/V order.
* :class:`WritePipeline`: export's read pipeline: one byte issued per clock (a constant, a byte
  of the token read one clock earlier, the ring port's byte two clocks later, or a byte of the
  header CRC a clock later) into a 4-entry FIFO that feeds the storage port's ``wdata`` stream.
* :class:`TokenChecker`: import's comparison of the stored tokens with token memory.
* :data:`RecordTap`: the record's bytes, in both directions, at the one point where the
  engine's CRCs read them; see ``docs/blocks/dma.md`` for where a consumer (a MAC) attaches.

Import's K/V bytes need no piece of their own: the storage port's read byte is the ring port's
write byte, written in the clock it is accepted.
"""

from amaranth import Cat, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ringkv.defs.checks import check_type
from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import RecordLayout

__all__ = ["RecordSegment", "RecordTap", "ByteSource", "RecordCursor", "WritePipeline",
           "TokenChecker"]


class RecordSegment(enum.Enum, shape=2):
    """A storage transfer of a record: the header sector, the token area or the K/V area."""
    HDR = 0
    TOK = 1
    KV = 2


class ByteSource(enum.Enum, shape=2):
    """Where :class:`WritePipeline` takes an issued byte from."""
    CONST = 0        #: ``const`` (header bytes, padding)
    TOKEN = 1        #: byte ``sel`` of the token memory's read data (read issued this clock)
    RING = 2         #: the ring port's read data (read issued this clock)
    CRC = 3          #: byte ``sel`` of ``crc`` as it is a clock after the issue (the header CRC)


#: One byte of a record on its way between storage and the rings (``docs/blocks/dma.md``).
#: ``valid``: a byte passes this clock; ``segment``: which area; ``pos``: its offset in the
#: header sector (header bytes only); ``byte``: the byte.
RecordTap = data.StructLayout({"valid": 1, "segment": RecordSegment, "pos": 9, "byte": 8})


def _layout(config):
    check_type("config", config, RingKVConfig)
    return RecordLayout(config)


class RecordCursor(wiring.Component):
    """The loop nest of one segment: which byte of the header, token or ring comes next.

    Ports: ``segment`` (In :class:`RecordSegment`), ``valid_slots`` (In: ``min(count,
    window)``), ``first_slot`` (In: the oldest valid slot, ``head + 1 - valid_slots`` modulo the
    window; both held through a segment, ``valid_slots`` taken at ``start``), ``start`` (In 1:
    restart the segment at the next edge), ``step`` (In 1: advance by
    one byte at the next edge; not together with ``start``), ``hdr_pos`` (Out 9: bytes stepped
    since ``start``, modulo 512: the header byte's offset), ``token_index`` and ``token_byte``
    (Out: the token and its byte, little-endian), ``ring_addr`` (Out 32: the ring port's byte
    address, ``element * EB + byte``).

    K/V order (the record format's): K of every ring, slots oldest first, ``dim`` fastest; then
    V of every ring column-wise (``dim`` outer, slots inner); the ``EB`` bytes of an element
    innermost. Outputs are registers: latency 1 from ``start``/``step``; one step per clock; no
    backpressure.
    """

    def __init__(self, config: RingKVConfig):
        self._config, self._layout = config, _layout(config)
        c, lay = config, self._layout
        super().__init__({
            "segment": In(RecordSegment), "valid_slots": In(range(c.window + 1)),
            "first_slot": In(range(c.window)), "start": In(1), "step": In(1),
            "hdr_pos": Out(9), "token_index": Out(range(c.max_tokens + 1)),
            "token_byte": Out(range(max(lay.token_bytes, 2))), "ring_addr": Out(32)})

    def elaborate(self, platform):
        m = Module()
        c, lay = self._config, self._layout
        LH, W, D = c.layers * c.kv_heads, c.window, c.head_dim
        TB, EB = lay.token_bytes, lay.elem_bytes
        seg, v, s0 = self.segment, self.valid_slots, self.first_slot
        tok_i, tok_b, hdr_pos = self.token_index, self.token_byte, self.hdr_pos
        lh = Signal(range(max(LH, 2)))
        t = Signal(range(W + 1))
        dim = Signal(range(D))
        slot = Signal(range(W))
        kind = Signal()
        # ``valid_slots - 1``, taken at ``start``: the subtraction off the step's path
        t_last = Signal(range(W + 1))
        # byte of the element, innermost (no counter at all for one byte per element)
        elem_b = Signal(range(EB)) if EB > 1 else None
        m.d.comb += self.ring_addr.eq(Cat(elem_b if EB > 1 else [], dim, slot, kind,
                                          lh[:ceil_log2(LH)] if LH > 1 else []))

        with m.If(self.start):
            m.d.sync += [tok_i.eq(0), tok_b.eq(0), lh.eq(0), t.eq(0), dim.eq(0), slot.eq(s0),
                         kind.eq(0), hdr_pos.eq(0), t_last.eq(v - 1),
                         *([elem_b.eq(0)] if EB > 1 else [])]
        with m.If(self.step):
            with m.If(seg == RecordSegment.TOK):
                with m.If(tok_b == TB - 1):
                    m.d.sync += [tok_b.eq(0), tok_i.eq(tok_i + 1)]
                with m.Else():
                    m.d.sync += tok_b.eq(tok_b + 1)
            if EB > 1:
                with m.Elif((seg == RecordSegment.KV) & (elem_b != EB - 1)):
                    m.d.sync += elem_b.eq(elem_b + 1)  # the next byte of the same element
            with m.Elif(seg == RecordSegment.KV):
                if EB > 1:
                    m.d.sync += elem_b.eq(0)
                next_slot = Signal.like(slot, name="next_slot")
                m.d.comb += next_slot.eq(slot + 1)
                last_t, last_dim, last_lh = t == t_last, dim == D - 1, lh == LH - 1
                with m.If(kind == 0):      # K: lh, t, dim (dim fastest)
                    with m.If(last_dim):
                        m.d.sync += [dim.eq(0), t.eq(t + 1), slot.eq(next_slot)]
                        with m.If(last_t):
                            m.d.sync += [t.eq(0), slot.eq(s0), lh.eq(lh + 1)]
                            with m.If(last_lh):
                                m.d.sync += [lh.eq(0), kind.eq(1)]
                    with m.Else():
                        m.d.sync += dim.eq(dim + 1)
                with m.Else():             # V: lh, dim, t (t fastest): column-wise
                    with m.If(last_t):
                        m.d.sync += [t.eq(0), slot.eq(s0), dim.eq(dim + 1)]
                        with m.If(last_dim):
                            m.d.sync += [dim.eq(0), lh.eq(lh + 1)]
                    with m.Else():
                        m.d.sync += [t.eq(t + 1), slot.eq(next_slot)]
            m.d.sync += hdr_pos.eq(hdr_pos + 1)
        return m


class WritePipeline(wiring.Component):
    """Export's byte pipeline: issue -> stage 1 -> stage 2 -> FIFO -> ``wdata``.

    Ports: ``issue`` (In 1), ``source`` (In :class:`ByteSource`), ``const`` (In 8), ``sel`` (In:
    the token's byte, or the CRC's), ``hdr`` (In 1: a ``CONST`` byte the header CRC covers)
    describe the byte issued this clock; the token memory's and the ring port's reads for it are
    issued in the same clock by whoever drives them, and their data come in on ``token_word``
    (one clock later) and ``ring_rdata`` (two clocks later); ``crc`` (In 32) is read a clock
    after a ``CRC`` byte's issue. ``wdata`` (Out stream of bytes) to the storage port. ``room``
    (Out 1): a byte may be issued this clock (the FIFO, 4 entries, has room for every byte in
    flight). ``empty`` (Out 1): nothing in flight or queued. ``flush`` (In 1): drop every byte in
    flight and queued (a failed transfer). ``tap_valid``, ``tap_byte`` (Out): a payload byte
    (``TOKEN``, ``RING``) entering the FIFO. ``hdr_valid``, ``hdr_byte`` (Out): a byte issued
    with ``hdr``, the clock after its issue (the header CRC's input: the header encoder's byte
    crosses a register before the CRC, and the CRC, a clock behind its bytes, still has all of
    them when the first ``CRC`` byte, issued right after the last, reads it).

    Latency: a byte enters the FIFO two clocks after its issue and is on ``wdata`` the clock
    after. Throughput: one byte per clock while ``wdata.ready`` stays high (issue while
    ``room``). Backpressure: ``wdata.ready`` low fills the FIFO and drops ``room``.
    """

    def __init__(self, config: RingKVConfig):
        lay = _layout(config)
        self._token_bytes = lay.token_bytes
        super().__init__({
            "issue": In(1), "source": In(ByteSource), "const": In(8),
            "sel": In(range(max(lay.token_bytes, 4))), "hdr": In(1), "crc": In(32),
            "token_word": In(8 * lay.token_bytes), "ring_rdata": In(8), "flush": In(1),
            "wdata": Out(stream.Signature(8)), "room": Out(1), "empty": Out(1),
            "tap_valid": Out(1), "tap_byte": Out(8), "hdr_valid": Out(1), "hdr_byte": Out(8)})

    def elaborate(self, platform):
        m = Module()
        TB = self._token_bytes
        wfifo = fifo.SyncFIFO(width=8, depth=4)
        m.submodules.wfifo = ResetInserter(self.flush)(wfifo)
        b_valid = Signal()
        b_src = Signal(2)                 # ByteSource of the issued byte
        b_const = Signal(8)
        b_sel = Signal(range(max(TB, 4)))
        b_crc = Signal()
        b_hdr = Signal()
        b2_valid, b2_ring, b2_crc, b2_byte = Signal(), Signal(), Signal(), Signal(8)
        # A token byte's word is taken into a register (``b2_word``) the clock it comes and
        # its byte selected in stage 2, beside the ring's byte: the token memory's block RAM
        # has no output register (5.8 ns clock-to-out), and its word through the byte select
        # into ``b2_byte`` in the same clock was 16.5 ns of the half-rate board build at 60 MHz.
        b2_tok = Signal()
        b2_sel = Signal.like(b_sel)
        b2_word = Signal.like(self.token_word)
        m.d.sync += [b2_valid.eq(b_valid), b2_ring.eq(b_src == ByteSource.RING),
                     b2_tok.eq(b_src == ByteSource.TOKEN), b2_sel.eq(b_sel),
                     b2_word.eq(self.token_word), b2_crc.eq(b_crc),
                     b2_byte.eq(Mux(b_src == ByteSource.CRC,
                                    self.crc.word_select(b_sel[:2], 8), b_const))]
        m.d.comb += [self.hdr_valid.eq(b_valid & b_hdr), self.hdr_byte.eq(b_const)]
        b_data = Signal(8)
        m.d.comb += b_data.eq(Mux(b2_ring, self.ring_rdata,
                                  Mux(b2_tok, b2_word.word_select(b2_sel, 8), b2_byte)))
        m.d.comb += [wfifo.w_en.eq(b2_valid), wfifo.w_data.eq(b_data),
                     self.wdata.valid.eq(wfifo.r_rdy), self.wdata.payload.eq(wfifo.r_data),
                     wfifo.r_en.eq(self.wdata.ready),
                     self.room.eq((wfifo.level + b_valid + b2_valid) < 4),
                     self.empty.eq(~b_valid & ~b2_valid & (wfifo.level == 0)),
                     self.tap_valid.eq(b2_valid & b2_crc), self.tap_byte.eq(b_data)]
        m.d.sync += b_valid.eq(0)
        with m.If(self.issue):
            m.d.sync += b_valid.eq(1)
            m.d.sync += [b_src.eq(self.source), b_hdr.eq(self.hdr & (self.source
                                                                   == ByteSource.CONST))]
            with m.If(self.source == ByteSource.CONST):
                m.d.sync += [b_const.eq(self.const), b_crc.eq(0)]
            with m.Elif(self.source == ByteSource.CRC):
                m.d.sync += [b_crc.eq(0), b_sel.eq(self.sel)]
            with m.Else():
                m.d.sync += [b_crc.eq(1), b_sel.eq(self.sel)]
        with m.If(self.flush):
            m.d.sync += [b_valid.eq(0), b2_valid.eq(0)]
        return m


class TokenChecker(wiring.Component):
    """Import's token comparison: each stored token byte against token memory's.

    Ports: ``clear`` (In 1: forget a mismatch, at the next edge), ``check`` (In 1), ``byte`` (In
    8: the stored byte), ``sel`` (In: its byte within the token) for the token whose read was
    issued to token memory in the same clock; ``token_word`` (In: token memory's read data, one
    clock later); ``mismatch`` (Out 1: a byte differed since the last ``clear``).

    Latency: ``mismatch`` rises two clocks after the ``check`` of a differing byte. One byte per
    clock; no backpressure.

    Token memory's block RAM has no output register (5.8 ns clock-to-out): the byte of its word
    that ``sel`` names is taken into a register the clock the word comes, and compared with the
    stored byte from registers the clock after. ``mismatch`` is that compare OR'd with the
    mismatch seen before (a flip-flop), so it still rises two clocks after the ``check``.
    """

    def __init__(self, config: RingKVConfig):
        lay = _layout(config)
        super().__init__({"clear": In(1), "check": In(1), "byte": In(8),
                          "sel": In(range(max(lay.token_bytes, 2))),
                          "token_word": In(8 * lay.token_bytes), "mismatch": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cmp_valid = Signal()
        cmp_byte = Signal(8)
        cmp_sel = Signal.like(self.sel)
        m.d.sync += cmp_valid.eq(self.check)
        with m.If(self.check):
            m.d.sync += [cmp_byte.eq(self.byte), cmp_sel.eq(self.sel)]
        # the block RAM's output through the byte select, the compare and the OR into the
        # sticky flip-flop was the half-rate board build's longest path (16.6 ns at 60 MHz):
        # the selected byte is registered first (``got``), the compare made from registers
        got, got_valid, want = Signal(8), Signal(), Signal(8)
        m.d.sync += [got.eq(self.token_word.word_select(cmp_sel, 8)), want.eq(cmp_byte),
                     got_valid.eq(cmp_valid)]
        differ = got_valid & (got != want)
        seen = Signal()                          # ``mismatch`` a clock ago, less a clear
        m.d.sync += seen.eq((seen | differ) & ~self.clear)
        m.d.comb += self.mismatch.eq(seen | differ)
        return m
