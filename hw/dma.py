"""The DMA engine: snapshot export (rings + tokens -> storage) and import (storage -> rings).

The record layout is ``host/record.py``'s (``docs/blocks/record-format.md``); this
engine is bit-exact with its golden ``encode_record`` / ``import_record``.

**Export** (``op = EXPORT``, region ``r``): reads the metadata of every ring (all
``layers * kv_heads`` rings must agree on count and head, else ``BAD_REQUEST``), then writes
three storage transfers: the tokens
(read from token memory) to region sectors ``1..``, the KV area (K in token order, V column-wise,
read from the ring port) to sectors ``kv_sector..``, and last the header to sector 0, built on
the fly with the payload CRC and its own CRC. A power cut before the header is written leaves no
valid header in the region, so the previous snapshot (in another region) stays the newest.

**Import** (``op = IMPORT``, region, ``count`` and ``hash`` from the directory's hit): reads the
header and checks magic, version, header CRC, config (digest and fields, against constants built
from the engine's :class:`RingKVConfig`), field consistency, and that count and hash are the
requested ones; then streams the stored tokens and compares each with token memory **before**
any KV is written; then streams K and V into the ring port while computing the payload CRC, and
finally writes the metadata (count, head) of every ring. Failures before the KV phase change
nothing; a payload CRC failure (or storage error) in the KV phase writes count 0 to every
ring, so the rings are empty: a miss, never a stale or corrupt cache.

**Verify** (``op = VERIFY``, region): the import's checks without count/hash/token comparison and
without writing the rings: the directory rebuild scan uses it (host-driven, see
``docs/blocks/storage.md``). The response carries the record's count, hash and commit sequence.

**Header** (``op = HEADER``, region): the header sector only, with the import's header checks
(magic, version and header size, header CRC, config digest and fields, field consistency):
``OK`` with the record's count, hash and commit sequence, or the first failing check's status.
The device's power-on recovery (``hw/cmd_recovery.py``) scans with it: one sector read per
region, the payload left to the import's checks.

The ring port is byte-addressed (``element * EB + byte``, ``EB`` bytes per element from the
configuration's numerics): the KV loops step over elements as above with the byte of the element
innermost, so a record's bytes of one element are consecutive and little-endian (the record
format's order) and both directions move one byte per clock whatever ``EB``.

Throughput: one byte per clock on the storage port's data streams (its peak) in every data phase,
with a 4-entry FIFO behind a two-stage read pipeline (the ring port's read latency is two
clocks, the token port's one; the token byte waits a clock in a register). The payload CRC
runs one clock behind its bytes (a register between the byte and the CRC: the board build's
critical path ran from the attention core's banks through the byte mux into the CRC). Overhead per
transfer: three storage commands (tokens, KV, header), ``2 * layers * kv_heads`` clocks of
metadata reads and a few clocks per state change; see ``docs/BENCHMARKS.md`` for exact counts.
Backpressure: ``cmd`` is accepted only when idle; ``resp`` holds until taken; every storage
stream may stall at any time. The ring and token ports have fixed latency and no backpressure.
"""

from amaranth import Cat, Module, Mux, ResetInserter, Signal, Value
from amaranth.lib import crc, data, enum, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ringkv.defs import record as record_defs
from ringkv.defs.checks import check_int, check_pow2, check_type
from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import (
    CONST_RANGES,
    HEADER_OFFSETS,
    RECORD_CRC,
    RECORD_STATUS_BITS,
    SECTOR,
    RecordLayout,
    header_template,
)

from .enums import shaped
from .ring_port import RingPortSignature
from .storage import StorageError, StorageOp, StoragePortSignature
from .token_memory import TokenReadSignature

__all__ = ["DmaOp", "DmaCommand", "DmaResponse", "DmaEngine", "RecordStatus", "RecordKind"]

#: :class:`ringkv.defs.record.RecordStatus` as a 4-bit shape (export, import, verify results).
RecordStatus = shaped(record_defs.RecordStatus, RECORD_STATUS_BITS, module=__name__)
#: ``kind`` of a record: any byte, the known ones named (:class:`ringkv.defs.record.RecordKind`).
RecordKind = shaped(record_defs.RecordKind, 8, module=__name__)
_RECORD_CRC = crc.Algorithm(**RECORD_CRC.algorithm_kwargs())


class DmaOp(enum.Enum, shape=2):
    EXPORT = 0
    IMPORT = 1
    VERIFY = 2
    HEADER = 3


#: ``kind``: the record's :class:`~ringkv.defs.record.RecordKind` value, written by EXPORT into
#: the header (offset 94); the import's checks ignore it (the header CRC covers it).
DmaCommand = data.StructLayout({"op": DmaOp, "region": 16, "count": 32, "hash": 64, "seq": 32,
                                "kind": RecordKind})
DmaResponse = data.StructLayout({"status": RecordStatus, "count": 32, "hash": 64, "seq": 32})


class _Seg(enum.Enum, shape=2):
    HDR = 0
    TOK = 1
    KV = 2


class DmaEngine(wiring.Component):
    """Snapshot DMA between the ring port / token memory and a storage port.

    Parameters: ``config`` (:class:`RingKVConfig`; ``window`` and ``head_dim`` powers of two,
    ``token_width`` <= 32), ``regions`` (storage regions, region ``r`` at sector
    ``base_lba + r * sectors_per_region``), ``base_lba``.

    Ports: ``cmd`` (In stream of :data:`DmaCommand`), ``resp`` (Out stream of
    :data:`DmaResponse`), ``storage`` (Out :class:`StoragePortSignature`), ``ring`` (Out
    :class:`RingPortSignature`), ``tokens`` (Out :class:`TokenReadSignature`), ``busy``.
    """

    def __init__(self, config: RingKVConfig, regions: int, base_lba: int = 0):
        check_type("config", config, RingKVConfig)
        check_int("regions", regions, low=1, high=(1 << 16) - 1)
        check_int("base_lba", base_lba, low=0)
        check_pow2("window", config.window)
        check_pow2("head_dim", config.head_dim)
        check_int("token_width", config.token_width, high=32)
        layout = RecordLayout(config)
        if base_lba + regions * layout.sectors_per_region > 1 << 32:
            raise ValueError(f"{regions} regions of {layout.sectors_per_region} sectors do not "
                             f"fit in 32-bit sector addresses")
        if config.layers * config.kv_heads > 256:
            raise ValueError(f"layers * kv_heads must be at most 256, not "
                             f"{config.layers * config.kv_heads}")
        if max(layout.kv_sectors_max, layout.token_sectors_max) >= 1 << 16:
            raise ValueError("a record area must be less than 65536 sectors")
        self._config, self._regions, self._base_lba, self._layout = (config, regions, base_lba,
                                                                     layout)
        super().__init__({
            "cmd": In(stream.Signature(DmaCommand)),
            "resp": Out(stream.Signature(DmaResponse)),
            "storage": Out(StoragePortSignature()),
            "ring": Out(RingPortSignature.for_config(config)),
            "tokens": Out(TokenReadSignature(config.max_tokens, config.token_width)),
            "busy": Out(1),
        })

    @property
    def config(self):
        return self._config

    @property
    def regions(self):
        return self._regions

    @property
    def layout(self):
        return self._layout

    def elaborate(self, platform):
        m = Module()
        c, lay = self._config, self._layout
        LH, W, D = c.layers * c.kv_heads, c.window, c.head_dim
        TB = lay.token_bytes
        EB = lay.elem_bytes
        KV_PER_SLOT = 2 * LH * D * EB     # KV bytes per valid slot
        template = header_template(c)

        st = self.storage
        # --- request and record registers ------------------------------------------------
        op = Signal(DmaOp)
        region = Signal(16)
        req_count = Signal(32)
        req_hash = Signal(64)
        req_seq = Signal(32)
        req_kind = Signal(RecordKind)
        base_lba = Signal(32)
        n = Signal(32)                    # token count of the snapshot
        head = Signal(range(W))
        status = Signal(RecordStatus)
        kv_started = Signal()
        # header fields captured on import
        hd_seq, hd_hash, hd_count, hd_head = Signal(32), Signal(64), Signal(32), Signal(32)
        hd_tok, hd_k, hd_v, hd_pcrc = Signal(32), Signal(32), Signal(32), Signal(32)
        bad_magic, bad_version, bad_config = Signal(), Signal(), Signal()
        tok_bad = Signal()

        v = Signal(range(W + 1))
        m.d.comb += v.eq(Mux(n < W, n, W))
        tok_payload = Signal(34)
        kv_payload = Signal(32)
        m.d.comb += [tok_payload.eq(n * TB), kv_payload.eq(v * KV_PER_SLOT)]
        tok_sectors = Signal(16)
        kv_sectors = Signal(16)
        m.d.comb += [tok_sectors.eq((tok_payload + SECTOR - 1) >> 9),
                     kv_sectors.eq((kv_payload + SECTOR - 1) >> 9)]
        s0 = Signal(range(W))
        m.d.comb += s0.eq(head + 1 - v)          # oldest valid slot, mod W (W a power of two)

        # --- CRCs ------------------------------------------------------------------------
        m.submodules.pcrc = pcrc = _RECORD_CRC(data_width=8).create()
        m.submodules.hcrc = hcrc = _RECORD_CRC(data_width=8).create()

        # --- segment and address generator -------------------------------------------------
        seg = Signal(_Seg)
        pay_left = Signal(34)             # payload bytes left in the segment
        total_left = Signal(26)           # bytes (payload + padding) left in the segment
        hdr_pos = Signal(9)
        tok_i = Signal(range(c.max_tokens + 1))
        tok_b = Signal(range(max(TB, 2)))
        lh = Signal(range(max(LH, 2)))
        t = Signal(range(W + 1))
        dim = Signal(range(D))
        slot = Signal(range(W))
        kind = Signal()
        # byte of the element, innermost (no counter at all for one byte per element: the fx1
        # gateware stays as it was)
        elem_b = Signal(range(EB)) if EB > 1 else None
        ring_addr = Signal(32)
        m.d.comb += ring_addr.eq(Cat(elem_b if EB > 1 else [], dim, slot, kind,
                                     lh[:ceil_log2(LH)] if LH > 1 else []))

        def init_counters():
            return [tok_i.eq(0), tok_b.eq(0), lh.eq(0), t.eq(0), dim.eq(0), slot.eq(s0),
                    kind.eq(0), hdr_pos.eq(0), *([elem_b.eq(0)] if EB > 1 else [])]

        def advance():
            """Step the loop nest of the current segment by one payload byte."""
            with m.If(seg == _Seg.TOK):
                with m.If(tok_b == TB - 1):
                    m.d.sync += [tok_b.eq(0), tok_i.eq(tok_i + 1)]
                with m.Else():
                    m.d.sync += tok_b.eq(tok_b + 1)
            if EB > 1:
                with m.Elif((seg == _Seg.KV) & (elem_b != EB - 1)):
                    m.d.sync += elem_b.eq(elem_b + 1)  # the next byte of the same element
            with m.Elif(seg == _Seg.KV):
                if EB > 1:
                    m.d.sync += elem_b.eq(0)
                next_slot = Signal.like(slot, name="next_slot")
                m.d.comb += next_slot.eq(slot + 1)
                last_t, last_dim, last_lh = t == v - 1, dim == D - 1, lh == LH - 1
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

        # --- export: header bytes, built at issue time --------------------------------------
        var_fields = {"commit_seq": req_seq, "prefix_hash": req_hash, "count": n,
                      "ring_head": head, "token_bytes": tok_payload, "k_bytes": kv_payload >> 1,
                      "v_bytes": kv_payload >> 1, "payload_crc": pcrc.crc,
                      "kind": req_kind.as_value()}
        hdr_byte = Signal(8)
        with m.Switch(hdr_pos):
            for name, value in var_fields.items():
                off, size = HEADER_OFFSETS[name]
                for i in range(size):
                    with m.Case(off + i):
                        m.d.comb += hdr_byte.eq(Value.cast(value)[8 * i:8 * i + 8]
                                                if i * 8 < len(Value.cast(value)) else 0)
            for i in range(4):
                with m.Case(508 + i):
                    m.d.comb += hdr_byte.eq(hcrc.crc[8 * i:8 * i + 8])
            for off, byte in enumerate(template[:508]):
                if byte and not any(HEADER_OFFSETS[f][0] <= off
                                    < HEADER_OFFSETS[f][0] + HEADER_OFFSETS[f][1]
                                    for f in var_fields):
                    with m.Case(off):
                        m.d.comb += hdr_byte.eq(byte)

        # --- export datapath: issue -> stage 1 (token memory data; the ring's bank read) ->
        # stage 2 (ring byte; token and constant bytes registered) -> FIFO -> storage.wdata --
        wfifo_rst = Signal()
        wfifo = fifo.SyncFIFO(width=8, depth=4)
        m.submodules.wfifo = ResetInserter(wfifo_rst)(wfifo)
        b_valid = Signal()
        b_src = Signal(2)                 # 0 constant, 1 token memory, 2 ring
        b_const = Signal(8)
        b_sel = Signal(range(max(TB, 2)))
        b_crc = Signal()
        tok_word = Signal(8 * TB)
        m.d.comb += tok_word.eq(self.tokens.data)
        b2_valid, b2_ring, b2_crc, b2_byte = Signal(), Signal(), Signal(), Signal(8)
        m.d.sync += [b2_valid.eq(b_valid), b2_ring.eq(b_src == 2), b2_crc.eq(b_crc),
                     b2_byte.eq(Mux(b_src == 1, tok_word.word_select(b_sel, 8), b_const))]
        b_data = Signal(8)
        m.d.comb += b_data.eq(Mux(b2_ring, self.ring.ring_rdata, b2_byte))
        m.d.comb += [wfifo.w_en.eq(b2_valid), wfifo.w_data.eq(b_data),
                     st.wdata.valid.eq(wfifo.r_rdy), st.wdata.payload.eq(wfifo.r_data),
                     wfifo.r_en.eq(st.wdata.ready)]
        m.d.sync += b_valid.eq(0)

        # payload CRC, one clock behind its bytes (export: the FIFO's input; import: the
        # storage's read data): nothing reads it until the segment's status has come
        crc_v, crc_d = Signal(), Signal(8)
        pcrc_v, pcrc_d = Signal(), Signal(8)
        m.d.comb += [crc_v.eq(b2_valid & b2_crc), crc_d.eq(b_data)]
        m.d.sync += [pcrc_v.eq(crc_v), pcrc_d.eq(crc_d)]
        m.d.comb += [pcrc.valid.eq(pcrc_v), pcrc.data.eq(pcrc_d)]

        # token compare pipeline (import)
        cmp_valid = Signal()
        cmp_byte = Signal(8)
        cmp_sel = Signal(range(max(TB, 2)))
        m.d.sync += cmp_valid.eq(0)
        with m.If(cmp_valid & (tok_word.word_select(cmp_sel, 8) != cmp_byte)):
            m.d.sync += tok_bad.eq(1)

        # --- header parse (import) -----------------------------------------------------------
        rbyte = st.rdata.payload
        captures = {"commit_seq": hd_seq, "prefix_hash": hd_hash, "count": hd_count,
                    "ring_head": hd_head, "token_bytes": hd_tok, "k_bytes": hd_k,
                    "v_bytes": hd_v, "payload_crc": hd_pcrc}

        def parse_header_byte():
            with m.Switch(hdr_pos):
                for name, reg in captures.items():
                    off, size = HEADER_OFFSETS[name]
                    for i in range(size):
                        with m.Case(off + i):
                            m.d.sync += reg.word_select(i, 8).eq(rbyte)
                for flag, (lo, hi) in ((bad_magic, CONST_RANGES["magic"]),
                                       (bad_version, CONST_RANGES["version"]),
                                       (bad_config, CONST_RANGES["config"]),
                                       (bad_config, CONST_RANGES["config_fields"]),
                                       (bad_config, CONST_RANGES["config_fields_tail"])):
                    for off in range(lo, hi):
                        with m.Case(off):
                            with m.If(rbyte != template[off]):
                                m.d.sync += flag.eq(1)

        ml = Signal(range(max(LH, 2)))    # ring index of a metadata access
        meta_bad = Signal()
        meta_w_count = Signal(32)
        meta_w_head = Signal(range(W))
        seg_count = Signal(16)
        seg_lba = Signal(32)
        with m.Switch(seg):
            with m.Case(_Seg.HDR):
                m.d.comb += [seg_count.eq(1), seg_lba.eq(base_lba)]
            with m.Case(_Seg.TOK):
                m.d.comb += [seg_count.eq(tok_sectors), seg_lba.eq(base_lba + 1)]
            with m.Default():
                m.d.comb += [seg_count.eq(kv_sectors), seg_lba.eq(base_lba + lay.kv_sector)]
        seg_pay = Signal(34)
        with m.Switch(seg):
            with m.Case(_Seg.HDR):
                m.d.comb += seg_pay.eq(SECTOR - 4)
            with m.Case(_Seg.TOK):
                m.d.comb += seg_pay.eq(tok_payload)
            with m.Default():
                m.d.comb += seg_pay.eq(kv_payload)

        exporting = op == DmaOp.EXPORT
        importing = op == DmaOp.IMPORT

        m.d.comb += [self.ring.ring_addr.eq(ring_addr), self.ring.meta_ring.eq(ml),
                     self.tokens.addr.eq(tok_i), self.ring.ring_wdata.eq(rbyte),
                     self.ring.meta_wcount.eq(meta_w_count), self.ring.meta_whead.eq(meta_w_head)]

        with m.FSM(name="dma"):
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    p = self.cmd.payload
                    m.d.sync += [op.eq(p.op), region.eq(p.region), req_count.eq(p.count),
                                 req_hash.eq(p.hash), req_seq.eq(p.seq), req_kind.eq(p.kind),
                                 status.eq(RecordStatus.OK), kv_started.eq(0), tok_bad.eq(0),
                                 bad_magic.eq(0), bad_version.eq(0), bad_config.eq(0),
                                 meta_bad.eq(0), ml.eq(0), n.eq(0), head.eq(0),
                                 hd_seq.eq(0), hd_hash.eq(0), hd_count.eq(0)]
                    m.d.comb += [pcrc.start.eq(1), hcrc.start.eq(1)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += base_lba.eq(self._base_lba + region * lay.sectors_per_region)
                with m.If(region >= self._regions):
                    m.d.sync += status.eq(RecordStatus.BAD_REQUEST)
                    m.next = "RESPOND"
                with m.Elif(exporting):
                    m.next = "META_READ"
                with m.Else():
                    m.d.sync += seg.eq(_Seg.HDR)
                    m.next = "SEGMENT_COMMAND"
            # ---- export: metadata of every ring ----
            with m.State("META_READ"):
                m.d.comb += self.busy.eq(1)
                m.next = "META_CAPTURE"
            with m.State("META_CAPTURE"):
                m.d.comb += self.busy.eq(1)
                with m.If(self.ring.meta_head >= W):
                    m.d.sync += meta_bad.eq(1)
                with m.If(ml == 0):
                    m.d.sync += [n.eq(self.ring.meta_count), head.eq(self.ring.meta_head)]
                with m.Elif((self.ring.meta_count != n) | (self.ring.meta_head != head)):
                    m.d.sync += meta_bad.eq(1)
                with m.If(ml == LH - 1):
                    m.d.sync += ml.eq(0)
                    m.next = "META_CHECK"
                with m.Else():
                    m.d.sync += ml.eq(ml + 1)
                    m.next = "META_READ"
            with m.State("META_CHECK"):
                m.d.comb += self.busy.eq(1)
                with m.If(meta_bad | (n > c.max_tokens)):
                    m.d.sync += status.eq(RecordStatus.BAD_REQUEST)
                    m.next = "RESPOND"
                with m.Else():
                    m.d.sync += seg.eq(Mux(n == 0, _Seg.HDR, _Seg.TOK))
                    m.next = "SEGMENT_COMMAND"
            # ---- one storage transfer ----
            with m.State("SEGMENT_COMMAND"):
                m.d.comb += [self.busy.eq(1), st.cmd.valid.eq(1),
                             st.cmd.payload.op.eq(Mux(exporting, StorageOp.WRITE,
                                                      StorageOp.READ)),
                             st.cmd.payload.lba.eq(seg_lba), st.cmd.payload.count.eq(seg_count)]
                with m.If(st.cmd.ready):
                    m.d.sync += [pay_left.eq(seg_pay), total_left.eq(seg_count * SECTOR),
                                 *init_counters()]
                    m.next = "SEGMENT_DATA"
            with m.State("SEGMENT_DATA"):
                m.d.comb += [self.busy.eq(1), st.status.ready.eq(1)]
                with m.If(exporting):
                    room = (wfifo.level + b_valid + b2_valid) < 4
                    with m.If((total_left != 0) & room):
                        m.d.sync += [total_left.eq(total_left - 1), b_valid.eq(1)]
                        with m.If(seg == _Seg.HDR):
                            m.d.sync += [b_src.eq(0), b_const.eq(hdr_byte), b_crc.eq(0)]
                            m.d.comb += [hcrc.valid.eq(hdr_pos < SECTOR - 4),
                                         hcrc.data.eq(hdr_byte)]
                            advance()
                        with m.Elif(pay_left != 0):
                            m.d.sync += [pay_left.eq(pay_left - 1), b_crc.eq(1),
                                         b_sel.eq(tok_b)]
                            with m.If(seg == _Seg.TOK):
                                m.d.comb += self.tokens.en.eq(1)
                                m.d.sync += b_src.eq(1)
                            with m.Else():
                                m.d.comb += self.ring.ring_re.eq(1)
                                m.d.sync += b_src.eq(2)
                            advance()
                        with m.Else():
                            m.d.sync += [b_src.eq(0), b_const.eq(0), b_crc.eq(0)]
                with m.Else():
                    m.d.comb += st.rdata.ready.eq(total_left != 0)
                    with m.If(st.rdata.valid & (total_left != 0)):
                        m.d.sync += total_left.eq(total_left - 1)
                        with m.If(seg == _Seg.HDR):
                            m.d.comb += [hcrc.valid.eq(1), hcrc.data.eq(rbyte)]
                            parse_header_byte()
                            advance()
                        with m.Elif(pay_left != 0):
                            m.d.sync += pay_left.eq(pay_left - 1)
                            m.d.comb += [crc_v.eq(1), crc_d.eq(rbyte)]
                            with m.If(seg == _Seg.TOK):
                                with m.If(importing):
                                    m.d.comb += self.tokens.en.eq(1)
                                    m.d.sync += [cmp_valid.eq(1), cmp_byte.eq(rbyte),
                                                 cmp_sel.eq(tok_b)]
                            with m.Elif(importing):
                                m.d.comb += self.ring.ring_we.eq(1)
                                m.d.sync += kv_started.eq(1)
                            advance()
                data_done = (total_left == 0) & ~b_valid & ~b2_valid & (wfifo.level == 0)
                with m.If(st.status.valid):
                    with m.If((st.status.payload.error != StorageError.OK) | ~data_done):
                        m.d.sync += status.eq(RecordStatus.STORAGE)
                        m.d.comb += wfifo_rst.eq(1)
                        m.d.sync += [b_valid.eq(0), b2_valid.eq(0)]
                        m.next = "FAIL"
                    with m.Else():
                        m.next = "SEGMENT_NEXT"
            with m.State("SEGMENT_NEXT"):
                m.d.comb += self.busy.eq(1)
                with m.If(exporting):
                    with m.Switch(seg):
                        with m.Case(_Seg.TOK):
                            m.d.sync += seg.eq(Mux(v == 0, _Seg.HDR, _Seg.KV))
                            m.next = "SEGMENT_COMMAND"
                        with m.Case(_Seg.KV):
                            m.d.sync += seg.eq(_Seg.HDR)
                            m.next = "SEGMENT_COMMAND"
                        with m.Default():
                            m.next = "RESPOND"
                with m.Else():
                    with m.Switch(seg):
                        with m.Case(_Seg.HDR):
                            m.d.sync += [n.eq(hd_count), head.eq(hd_head)]
                            m.next = "HEADER_EVALUATE"
                        with m.Case(_Seg.TOK):
                            with m.If(importing & tok_bad):
                                m.d.sync += status.eq(RecordStatus.TOKEN_MISMATCH)
                                m.next = "RESPOND"
                            with m.Elif(v == 0):
                                m.next = "CRC_EVALUATE"
                            with m.Else():
                                m.d.sync += seg.eq(_Seg.KV)
                                m.next = "SEGMENT_COMMAND"
                        with m.Default():
                            m.next = "CRC_EVALUATE"
            # ---- import: header checks, in the golden model's order ----
            with m.State("HEADER_EVALUATE"):
                m.d.comb += self.busy.eq(1)
                bad_fields = ((hd_count > c.max_tokens) | (hd_head >= W)
                              | (hd_tok != tok_payload) | (hd_k != kv_payload >> 1)
                              | (hd_v != kv_payload >> 1))
                with m.If(bad_magic):
                    m.d.sync += status.eq(RecordStatus.EMPTY)
                    m.next = "RESPOND"
                with m.Elif(bad_version):
                    m.d.sync += status.eq(RecordStatus.BAD_VERSION)
                    m.next = "RESPOND"
                with m.Elif(~hcrc.match_detected):
                    m.d.sync += status.eq(RecordStatus.BAD_HEADER)
                    m.next = "RESPOND"
                with m.Elif(bad_config):
                    m.d.sync += status.eq(RecordStatus.FOREIGN_CONFIG)
                    m.next = "RESPOND"
                with m.Elif(bad_fields):
                    m.d.sync += status.eq(RecordStatus.BAD_HEADER)
                    m.next = "RESPOND"
                with m.Elif(op == DmaOp.HEADER):
                    m.next = "RESPOND"
                with m.Elif(importing & ((hd_count != req_count) | (hd_hash != req_hash))):
                    m.d.sync += status.eq(RecordStatus.NOT_THIS)
                    m.next = "RESPOND"
                with m.Elif(hd_count == 0):
                    m.next = "CRC_EVALUATE"
                with m.Else():
                    m.d.sync += seg.eq(_Seg.TOK)
                    m.next = "SEGMENT_COMMAND"
            with m.State("CRC_EVALUATE"):
                m.d.comb += self.busy.eq(1)
                ok = pcrc.crc == hd_pcrc
                with m.If(~ok):
                    m.d.sync += status.eq(RecordStatus.BAD_PAYLOAD_CRC)
                with m.If(importing & (ok | kv_started)):
                    m.d.sync += [meta_w_count.eq(Mux(ok, n, 0)), meta_w_head.eq(Mux(ok, head, 0)),
                                 ml.eq(0)]
                    m.next = "META_WRITE"
                with m.Else():
                    m.next = "RESPOND"
            with m.State("FAIL"):
                # storage error: an import that has started writing the rings empties them
                m.d.comb += self.busy.eq(1)
                m.d.sync += [meta_w_count.eq(0), meta_w_head.eq(0), ml.eq(0)]
                with m.If(importing & kv_started):
                    m.next = "META_WRITE"
                with m.Else():
                    m.next = "RESPOND"
            with m.State("META_WRITE"):
                m.d.comb += [self.busy.eq(1), self.ring.meta_we.eq(1)]
                with m.If(ml == LH - 1):
                    m.next = "RESPOND"
                with m.Else():
                    m.d.sync += ml.eq(ml + 1)
            with m.State("RESPOND"):
                m.d.comb += [self.busy.eq(1), self.resp.valid.eq(1),
                             self.resp.payload.status.eq(status),
                             self.resp.payload.count.eq(Mux(exporting, n, hd_count)),
                             self.resp.payload.hash.eq(Mux(exporting, req_hash, hd_hash)),
                             self.resp.payload.seq.eq(Mux(exporting, req_seq, hd_seq))]
                with m.If(self.resp.ready):
                    m.next = "IDLE"
        return m
