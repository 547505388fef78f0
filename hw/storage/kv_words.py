"""Import's K/V area four bytes a clock: record-order words in, ring-port writes out.

The record format stores K row by row (``for ring, for t, for dim``) and V column by column
(``for ring, for dim, for t``; ``docs/blocks/record-format.md``), while the attention core
keeps both row-wise: a bank word holds ``M`` dimensions of one slot. A K word of four record
bytes is therefore four consecutive ring-port bytes at a four-aligned address, and goes
straight through. Four consecutive V bytes are one dimension of four *slots* (``EB`` = 1), or
of two (``EB`` = 2), in four bank words; no single write can take them. The :class:`KvWordWriter`
turns V around in a small double buffer:

* a **chunk** is the ``C = 4 / EB`` columns (dimensions) that make four bytes of one slot; it
  is ``4 v`` record bytes (``v`` = valid slots), so exactly ``v`` input words, and never shares
  a word with the next chunk;
* the fill writes each input byte into the column it belongs to: column ``j`` of a chunk holds
  ``L = v * EB`` bytes, split over four byte-wide **sub-banks** by the byte's position modulo 4,
  so the (up to four) bytes of an input word, which may run over one or more column
  boundaries when ``L`` is not a multiple of 4, always land in different sub-banks; each
  byte's column and position are registers, the next word's computed a word ahead (the
  sub-banks' write enables start at flip-flops);
* the drain reads, for one slot a clock, the ``EB`` bytes of each of the ``C`` columns (four
  bytes in four different sub-banks) and writes them as one four-byte ring-port write;
* two buffers: one chunk fills while the previous one drains, so V moves at four bytes a
  clock too, and the last chunk drains ``v`` clocks after its last word.

The sub-banks are ``16 / EB`` byte-wide memories of ``2 * ceil(W * EB / 4)`` entries with an
asynchronous read (the ECP5's distributed RAM, ``TRELLIS_DPR16X4``): 1 KiB of buffer at
``W`` = 128.

Golden model: :func:`ringkv.host.golden.kv_words.kv_word_writes` (the writes, in order); the
tests also apply the writes to a ring image and compare it with the record codec's rings
(``tests/hw/storage/test_kv_words.py``).
"""

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ringkv.defs.checks import check_type
from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import RecordLayout

__all__ = ["KvWordWriter", "KvWrite", "KV_WORDS_BUGS", "kv_words_supported"]

#: One ring-port write of the wide path: ``addr`` (the ring port's byte address of the
#: first byte, a multiple of 4) and ``data`` (four bytes, the first in the low byte).
KvWrite = data.StructLayout({"addr": 32, "data": 32})

#: deliberately broken variants (private knob ``_bug``): ``one_buffer`` (the fill waits for
#: the drain of the one buffer: right data, more clocks), ``column_wrap`` (a byte past the end
#: of a column stays in it instead of going to the next), ``sub_bank`` (the sub-bank chosen by
#: the position modulo 2: bytes overwrite each other), ``v_as_k`` (V passes straight through
#: like K: the column order lands in the rows)
KV_WORDS_BUGS = ("one_buffer", "column_wrap", "sub_bank", "v_as_k")


def _sub(pos, mod):
    """The sub-bank of a position in its column: modulo 4 (the broken ``sub_bank``: 2)."""
    return pos[:2] if mod == 4 else pos[:1]


def kv_words_supported(config: RingKVConfig) -> bool:
    """Whether the K/V area can move four bytes a clock: a K row (``head_dim * EB`` bytes)
    is whole four-byte words, so every K word and every V chunk starts four-aligned."""
    check_type("config", config, RingKVConfig)
    return (config.head_dim * RecordLayout(config).elem_bytes) % 4 == 0


class KvWordWriter(wiring.Component):
    """A record's K/V area, four bytes a clock, as four-byte ring-port writes.

    Ports:

    * ``start`` (In 1), with ``valid_slots`` (In: ``v = min(count, W)``, at least 1) and
      ``first_slot`` (In: the oldest valid slot): begin a K/V area; forgets anything buffered
      (a word taken in its clock too).
    * ``flush`` (In 1): drop everything buffered or in flight (a failed transfer), a word
      taken in its clock too.
    * ``words`` (In stream of 32 bits): the K/V area's bytes in record order, four a transfer,
      the first in the low byte (``LH * v * d * EB / 4`` words of K, then as many of V).
    * ``writes`` (Out stream of :data:`KvWrite`): the ring-port writes, one per input word; K
      in the input's order, V a chunk at a time (slots oldest first), a chunk after its last
      word. Every byte of the valid slots is written once; nothing else is.
    * ``idle`` (Out 1): no whole chunk waiting to drain and no write pending (a chunk still
      filling does not count: ``idle`` after the area's last word means every write is out).

    Latency: a word taken is registered first (an input register: the handshake stays off
    the column arithmetic); a K word is on ``writes`` two clocks after it is taken; a V
    chunk's first write three clocks after its last word is taken (the input register, its
    buffer marked full, then the output register), its last ``v - 1`` clocks after that.
    Throughput: one word a clock each way (``words.ready`` stays high while ``writes.ready``
    does). Backpressure:
    ``writes.ready`` low holds the output, then the drain, then ``words``; nothing is lost.
    """

    def __init__(self, config: RingKVConfig, *, _bug=None):
        check_type("config", config, RingKVConfig)
        if not kv_words_supported(config):
            raise ValueError(f"the K/V area cannot move four bytes a clock: a K row is "
                             f"{config.head_dim * RecordLayout(config).elem_bytes} bytes, "
                             f"not a multiple of 4")
        if _bug is not None and _bug not in KV_WORDS_BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {KV_WORDS_BUGS}")
        self._config, self._bug = config, _bug
        self._eb = RecordLayout(config).elem_bytes
        W = config.window
        super().__init__({
            "start": In(1), "flush": In(1),
            "valid_slots": In(range(W + 1)), "first_slot": In(range(W)),
            "words": In(stream.Signature(32)), "writes": Out(stream.Signature(KvWrite)),
            "idle": Out(1)})

    @property
    def config(self) -> RingKVConfig:
        return self._config

    def elaborate(self, platform):
        m = Module()
        c, EB, bug = self._config, self._eb, self._bug
        W, D, LH = c.window, c.head_dim, c.layers * c.kv_heads
        C = 4 // EB                         # columns (dimensions) of a chunk
        ROW_WORDS = D * EB // 4             # words of a K row
        CHUNKS = D // C                     # chunks of a ring's V
        DEPTH = -(-W * EB // 4)             # entries of a sub-bank, one buffer
        NB = 1 if bug == "one_buffer" else 2
        MOD = 2 if bug == "sub_bank" else 4

        reset = Signal()
        m.d.comb += reset.eq(self.start | self.flush)

        # ---- the area's parameters, latched at start
        v = Signal(range(W + 1))
        s0 = Signal(range(W))
        # a column's bytes, L = v * EB, and its multiples up to 4 L (registered: the bytes of
        # a word cross at most four column ends)
        Lx = [Signal(range(4 * W * EB + 1), name=f"L{n}") for n in range(5)]
        with m.If(self.start):
            m.d.sync += [v.eq(self.valid_slots), s0.eq(self.first_slot),
                         *(Lx[n].eq(self.valid_slots * (n * EB)) for n in range(1, 5))]

        def col_step(x, name, mult=Lx):
            """(column ends crossed, position in the column) of position ``x`` of the
            current column (``x < L + 4``), for a column of ``mult[1]`` bytes."""
            if bug == "column_wrap":
                return Const(0, 3), x
            dj = Signal(3, name=f"{name}_dj")
            m.d.comb += dj.eq(sum((x >= mult[n]).as_unsigned() for n in range(1, 5)))
            pos = Signal(range(W * EB + 4), name=f"{name}_pos")
            m.d.comb += pos.eq(x - Array(mult)[dj])
            return dj, pos

        def wrap_slot(base, t):
            """(base + t) mod W for base < W, t < W."""
            s = base + t
            return Mux(s >= W, s - W, s)[:max(ceil_log2(W), 1)] if W > 1 else Const(0, 1)

        def ring_addr(lh, kind, slot, byte_in_row):
            """The ring port's byte address ((lh*2 + kind)*W + slot)*D*EB + byte_in_row."""
            return (((lh * 2 + kind) * W + slot) * (D * EB) + byte_in_row)

        # ---- the output register
        out_valid = Signal()
        out = Signal(KvWrite)
        m.d.comb += [self.writes.valid.eq(out_valid), self.writes.payload.eq(out)]
        out_free = Signal()
        m.d.comb += out_free.eq(~out_valid | self.writes.ready)
        with m.If(self.writes.valid & self.writes.ready):
            m.d.sync += out_valid.eq(0)

        # ---- the fill side: where the next input word belongs
        in_v = Signal()                     # in the V half of the area
        lh = Signal(range(max(LH, 2)))
        t = Signal(range(W + 1))            # K: the slot index (oldest = 0)
        o = Signal(range(max(ROW_WORDS, 2)))    # K: the word of the row
        chunk = Signal(range(max(CHUNKS, 2)))   # V: the chunk of the ring
        w = Signal(range(W + 1))            # V: the word of the chunk
        # V: each byte of the next word, its column in the chunk and its position in the
        # column, registered (the write enables start at flip-flops; the next word's are
        # computed from these, a word ahead)
        k_col = [Signal(range(C + 4), name=f"col{k}") for k in range(4)]
        k_pos = [Signal(range(W * EB + 4), name=f"pos{k}") for k in range(4)]
        fsel = Signal(range(NB))            # V: the buffer being filled
        # a buffer holds a whole chunk not yet drained; which chunk it is
        full = Signal(NB)
        b_lh = [Signal(range(max(LH, 2)), name=f"buf{b}_lh") for b in range(NB)]
        b_chunk = [Signal(range(max(CHUNKS, 2)), name=f"buf{b}_chunk") for b in range(NB)]

        # the sub-banks: column jj, position modulo 4 rr
        banks = {}
        for jj in range(C):
            for rr in range(4):
                mem = memory.Memory(shape=8, depth=NB * DEPTH, init=[])
                m.submodules[f"col{jj}_sub{rr}"] = mem
                banks[jj, rr] = (mem.write_port(), mem.read_port(domain="comb"))

        # a chunk's first word: byte k at position k of column 0; when a column is shorter
        # than a word (L = v * EB < 4 bytes) at k mod L of column k // L. At ``start`` from
        # the input's ``v``, by a table on the few short lengths (the general step's
        # multiplies and compares, from the DMA's ``v``, were the import's longest path)
        def first_word(length):
            if bug == "column_wrap":
                length = 4
            return [x for k in range(4) for x in (k_col[k].eq(k // length),
                                                   k_pos[k].eq(k % length))]

        def load_first_word(slots):
            """The first word's columns and positions, for ``slots`` valid slots."""
            with m.Switch(slots):
                for v_in in range(1, 4):
                    if v_in * EB < 4:
                        with m.Case(v_in):
                            m.d.sync += first_word(v_in * EB)
                with m.Default():
                    m.d.sync += first_word(4)
        with m.If(self.start):
            load_first_word(self.valid_slots)

        words_ok = Signal()
        v_pass = bug == "v_as_k"
        with m.If(~in_v | v_pass):
            m.d.comb += words_ok.eq(out_free)
        with m.Else():
            m.d.comb += words_ok.eq(~full.bit_select(fsel, 1) if NB > 1 else ~full[0])
        # The input words pass a register first (``in_valid``, ``in_word``): the storage
        # port's handshake, which comes through the tier and the DMA, ends there, and the
        # column arithmetic below starts at flip-flops only (the handshake through the next
        # word's positions was the half-rate board build's longest path, 17.1 ns at 60 MHz).
        # ``words.ready`` is the register's room (empty, or its word taken this clock):
        # still a word a clock. (Not gated by ``start``/``flush``: a word taken in their
        # clock is dropped with the rest; the DMA never offers one then, and its ready stays
        # off their paths.)
        in_valid = Signal()
        in_word = Signal(32)
        take = Signal()
        m.d.comb += [take.eq(in_valid & words_ok),
                     self.words.ready.eq(~in_valid | words_ok)]
        with m.If(take):
            m.d.sync += in_valid.eq(0)
        with m.If(self.words.valid & self.words.ready):
            m.d.sync += [in_valid.eq(1), in_word.eq(self.words.payload)]

        k_slot = Signal(range(W))
        m.d.comb += k_slot.eq(wrap_slot(s0, t))
        last_lh = lh == LH - 1

        # drain side signals, driven below; the output register's K load comes first
        drain_go = Signal()

        with m.If(take & (~in_v | v_pass)):
            # K (or, broken, V) straight through
            m.d.sync += [out_valid.eq(1), out.data.eq(in_word)]
            if v_pass:
                m.d.sync += out.addr.eq(Mux(in_v, ring_addr(lh, 1, k_slot, o * 4),
                                            ring_addr(lh, 0, k_slot, o * 4)))
            else:
                m.d.sync += out.addr.eq(ring_addr(lh, 0, k_slot, o * 4))
            with m.If(o == ROW_WORDS - 1):
                m.d.sync += o.eq(0)
                with m.If(t == v - 1):
                    m.d.sync += t.eq(0)
                    with m.If(last_lh):
                        m.d.sync += [lh.eq(0), in_v.eq(1)]
                    with m.Else():
                        m.d.sync += lh.eq(lh + 1)
                with m.Else():
                    m.d.sync += t.eq(t + 1)
            with m.Else():
                m.d.sync += o.eq(o + 1)
        with m.Elif(take):
            # V: each byte into its column's sub-bank
            for k in range(4):
                byte = in_word[8 * k:8 * k + 8]
                for (jj, rr), (wp, _) in banks.items():
                    sel = (k_col[k] == jj) & (_sub(k_pos[k], MOD) == rr)
                    with m.If(sel):
                        addr = k_pos[k][2:] if DEPTH > 1 else Const(0, 1)
                        if NB > 1:
                            addr = Cat(addr[:max(ceil_log2(DEPTH), 1)], fsel) \
                                if DEPTH > 1 else fsel
                        m.d.comb += [wp.en.eq(1), wp.addr.eq(addr), wp.data.eq(byte)]
            # byte 0 of the next word
            for k in range(4):                 # the next word's bytes: four positions on
                ndj, npos = col_step(k_pos[k] + 4, f"next{k}")
                m.d.sync += [k_col[k].eq(k_col[k] + ndj), k_pos[k].eq(npos)]
            with m.If(w == v - 1):           # the chunk's last word: hand it to the drain
                m.d.sync += w.eq(0)
                load_first_word(v)
                for b in range(NB):
                    with m.If(fsel == b):
                        m.d.sync += [full[b].eq(1), b_lh[b].eq(lh), b_chunk[b].eq(chunk)]
                if NB > 1:
                    m.d.sync += fsel.eq(~fsel)
                with m.If(chunk == CHUNKS - 1):
                    m.d.sync += chunk.eq(0)
                    with m.If(~last_lh):
                        m.d.sync += lh.eq(lh + 1)
                with m.Else():
                    m.d.sync += chunk.eq(chunk + 1)
            with m.Else():
                m.d.sync += w.eq(w + 1)

        # ---- the drain: one slot of the oldest full buffer a clock
        dsel = Signal(range(NB))
        dt = Signal(range(W + 1))           # the slot index being drained
        d_full = full.bit_select(dsel, 1) if NB > 1 else full[0]
        d_lh = Mux(dsel, b_lh[1], b_lh[0]) if NB > 1 else b_lh[0]
        d_chunk = Mux(dsel, b_chunk[1], b_chunk[0]) if NB > 1 else b_chunk[0]
        m.d.comb += drain_go.eq(d_full & out_free & ~(take & (~in_v | v_pass)))
        # the slot's EB bytes never cross a four-byte boundary (EB divides 4): one entry of
        # every sub-bank
        d_pos = Signal(range(W * EB + 1))
        m.d.comb += d_pos.eq(dt * EB)
        d_addr = d_pos[2:] if DEPTH > 1 else Const(0, 1)
        if NB > 1:
            d_addr = Cat(d_addr[:max(ceil_log2(DEPTH), 1)], dsel) if DEPTH > 1 else dsel
        for _, rp in banks.values():
            m.d.comb += rp.addr.eq(d_addr)
        gathered = []
        for jj in range(C):
            for b in range(EB):
                got = Signal(8, name=f"dbyte{jj}_{b}")
                for rr in range(4):
                    with m.If(_sub(d_pos + b, MOD) == rr):
                        m.d.comb += got.eq(banks[jj, rr][1].data)
                gathered.append(got)
        with m.If(drain_go):
            d_slot = wrap_slot(s0, dt)
            m.d.sync += [out_valid.eq(1), out.data.eq(Cat(*gathered)),
                         out.addr.eq(ring_addr(d_lh, 1, d_slot, d_chunk * 4))]
            with m.If(dt == v - 1):
                m.d.sync += dt.eq(0)
                for b in range(NB):
                    with m.If(dsel == b):
                        m.d.sync += full[b].eq(0)
                if NB > 1:
                    m.d.sync += dsel.eq(~dsel)
            with m.Else():
                m.d.sync += dt.eq(dt + 1)

        m.d.comb += self.idle.eq(~in_valid & ~out_valid & (full == 0))

        with m.If(reset):
            m.d.sync += [in_valid.eq(0), out_valid.eq(0), in_v.eq(0), lh.eq(0), t.eq(0), o.eq(0),
                         chunk.eq(0), w.eq(0), fsel.eq(0), full.eq(0),
                         dsel.eq(0), dt.eq(0)]
        return m
