"""The whole RingKV device: link frames in, command dispatcher, every block, frames out.

::

    rx ─► FrameDecoder ─► dispatcher ─┬─► TokenMemory ◄─┬─ HashEngine (read port 0, shared
                              │       │                 │  with TOKENS_READ)
                              │       ├─► CacheDirectory (+ allocator)
                              │       ├─► DmaEngine ─── storage port (muxed with SECTOR_READ)
                              │       │      └─ ring port ─► AttentionCore ring/meta
                              │       │                      (muxed with RING_READ)
                              │       └─► AttentionCore (cmd / i / o / status)
    tx ◄─ FrameEncoder ◄──────┘

The payload layout of every opcode is defined once in :mod:`ringkv.defs.protocol` (this module
takes its argument offsets and response packing from there) and documented in
``docs/blocks/top.md``.
"""

from amaranth import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import enum, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.config import RingKVConfig
from ringkv.defs.hash import hash_seed
from ringkv.defs.protocol import (
    DEFAULT_MAX_PAYLOAD,
    FLAG_EVICT,
    FLAG_EXISTING,
    GATEWARE_VERSION,
    META_BYTES,
    NO_RECORD,
    PROTOCOL_VERSION,
    REQUESTS,
    RESPONSES,
    RING_CLEAR_ALL,
    RING_ELEMENTS,
    RING_META,
    Op,
    attn_in_bytes,
)
from ringkv.defs.record import RecordLayout, header_template

from .attention import AttentionCore, AttnOp
from .directory import CacheDirectory
from .directory import Op as DirOp
from .directory import Status as DirStatus
from .dma import DmaEngine, DmaOp, RecordStatus
from .framing import FrameDecoder, FrameEncoder
from .hash_engine import HashEngine
from .protocol import Status
from .storage import SECTOR_BYTES, StorageError, StorageOp, StoragePortSignature
from .token_memory import TokenMemory

__all__ = ["RingKVTop"]


def _pow2(x):
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and x & (x - 1) == 0


def _field(value, size):
    """``value`` as exactly ``size`` bytes (zero-extended or truncated)."""
    value = Value.cast(value).as_unsigned()
    width = 8 * size
    if len(value) >= width:
        return value[:width]
    return Cat(value, Const(0, width - len(value)))


def _pack(layout, **values):
    """A response/request layout of :mod:`ringkv.defs.protocol` as one little-endian Value."""
    parts = []
    for f in layout.fields:
        parts.append(_field(values.get(f[0], 0), f[1]))
    return Cat(*parts) if parts else Const(0, 8)


class _Mode(enum.Enum, shape=3):
    """Where the response payload comes from after the response header."""
    BUF = 0       # the op's fixed response record (_pack of RESPONSES[op])
    ECHO = 1      # PING: the request payload, byte for byte
    TOKENS = 2    # TOKENS_READ: token memory
    SECTOR = 3    # SECTOR_READ: the sector buffer
    RING = 4      # RING_READ: ring bytes (EB per element) or metadata
    ATTN = 5      # ATTN_*: the attention core's outputs


class RingKVTop(wiring.Component):
    """The RingKV device: a framed byte link in, every block of SPEC §3 inside.

    Parameters
    ----------
    config : RingKVConfig
        Model shape and numerics; ``window`` and ``head_dim`` powers of two. ``numerics``
        (``ringkv-fx1``: int8 q/k/v, ``ringkv-fx2``: int16) sets the attention core's element
        width and ``EB``, the bytes per element in ATTN payloads (M*EB bytes per input beat),
        on the byte-addressed ring port (``RING_READ`` counts bytes) and in records.
    regions : int
        Snapshot regions in storage (power of two, 2..32768); region ``r`` starts at sector
        ``base_lba + r * sectors_per_region`` (:class:`~ringkv.defs.record.RecordLayout`).
    links, buckets : int
        Directory link pool and bucket table (powers of two; default ``regions`` and
        ``max(regions // 2, 2)``).
    lanes, macs : int
        Attention core split-KV lanes and MACs per lane.
    max_payload : int
        Largest request payload (the frame decoder's buffer); must hold one attention token.
    timeout : int
        Frame decoder idle timeout in clocks.
    base_lba : int
        First sector of region 0.

    Ports
    -----
    ``rx`` (In stream of bytes from the link), ``tx`` (Out stream of bytes to the link),
    ``storage`` (:class:`~ringkv.hw.storage.StoragePortSignature`, initiator side).

    Behaviour
    ---------
    One frame at a time, exactly one response per frame, in order. A frame-layer error (bad
    CRC, timeout, length above ``max_payload``, unknown opcode) is answered with the frame
    decoder's error status. For a checked frame the dispatcher first checks the payload length
    against the op's layout (``BAD_LENGTH``) and its arguments against the configuration
    (``BAD_ARG``); a rejected request's payload is drained and **nothing is changed**. Opcodes
    of :class:`~ringkv.defs.protocol.Op` not in :data:`~ringkv.defs.protocol.IMPLEMENTED` are
    answered ``UNKNOWN_OP``.

    No hang: every wait has a bound or is guaranteed by a block's contract. Draining and
    argument collection are bounded by the frame's length (the decoder has checked it); the
    hash engine is fixed latency (``n + 2`` clocks); the directory answers every command (its
    worst case is an evicting insert, ``links + 10`` clocks); the DMA answers every command
    once the storage port answers (the storage contract: a dead card ends in ``TIMEOUT``); the
    attention core answers every command the dispatcher has checked (layer, count, lengths).
    The only unbounded waits are on the link itself: ``tx.ready`` (the host must read) and
    ``rx`` (a partial frame times out).

    Latency and throughput: a request is decoded at one byte per clock and its header reaches
    the dispatcher 2 clocks after the last CRC byte; simple ops answer within ~5 clocks of the
    payload; the response goes out at one byte per clock (plus 8 framing bytes). Streams with
    backpressure: ``rx`` (the decoder holds ``ready`` low while it releases a frame) and ``tx``.
    """

    def __init__(self, config: RingKVConfig, *, regions: int = 64, links: int | None = None,
                 buckets: int | None = None, lanes: int = 4, macs: int = 8,
                 max_payload: int = DEFAULT_MAX_PAYLOAD, timeout: int = 1 << 16,
                 base_lba: int = 0):
        if not isinstance(config, RingKVConfig):
            raise TypeError(f"config must be a RingKVConfig, not {config!r}")
        if not _pow2(regions) or not 2 <= regions <= 1 << 15:
            raise ValueError(f"regions must be a power of two between 2 and 32768, "
                             f"not {regions!r}")
        links = regions if links is None else links
        buckets = max(regions // 2, 2) if buckets is None else buckets
        for name, value in (("links", links), ("buckets", buckets)):
            if not _pow2(value) or not 2 <= value <= 1 << 15:
                raise ValueError(f"{name} must be a power of two between 2 and 32768, "
                                 f"not {value!r}")
        if config.layers > 255 or config.layers * config.kv_heads > 256:
            raise ValueError(f"at most 255 layers and 256 rings, not {config.layers} layers "
                             f"of {config.kv_heads} KV heads")
        if config.max_tokens >= 1 << 24:
            raise ValueError(f"max_tokens must be below 2**24 (the directory's count field), "
                             f"not {config.max_tokens!r}")
        if (isinstance(max_payload, bool) or not isinstance(max_payload, int)
                or not 1 <= max_payload <= 0xFFFF):
            raise ValueError(f"max_payload must be an integer in 1..65535, not {max_payload!r}")
        need = max(max(lay.size for lay in REQUESTS.values()),
                   REQUESTS[Op.ATTN_PREFILL].size + attn_in_bytes(config, 1),
                   2 * config.q_heads * config.head_dim)
        if max_payload < need:
            raise ValueError(f"max_payload must be at least {need} bytes (one attention token "
                             f"of this config), not {max_payload!r}")
        self._config = config
        self._regions, self._links, self._buckets = regions, links, buckets
        self._max_payload, self._base_lba = max_payload, base_lba
        self._layout = RecordLayout(config)
        # children built here so that their parameter checks run at construction
        self.decoder = FrameDecoder(max_payload=max_payload, timeout=timeout)
        self.encoder = FrameEncoder()
        self.tokens = TokenMemory(config.max_tokens, config.token_width, read_ports=2)
        self.hasher = HashEngine(token_width=config.token_width, hash_width=64,
                                 count_width=24, seed=hash_seed(config))
        self.directory = CacheDirectory(buckets=buckets, links=links, regions=regions,
                                        count_width=24, hash_width=64, stamp_width=32)
        self.dma = DmaEngine(config, regions, base_lba)
        self.attention = AttentionCore(layers=config.layers, q_heads=config.q_heads,
                                       kv_heads=config.kv_heads, head_dim=config.head_dim,
                                       window=config.window, lanes=lanes, macs=macs,
                                       numerics=config.numerics)
        super().__init__({
            "rx": In(stream.Signature(8)),
            "tx": Out(stream.Signature(8)),
            "storage": Out(StoragePortSignature()),
        })

    config = property(lambda self: self._config)
    regions = property(lambda self: self._regions)
    links = property(lambda self: self._links)
    buckets = property(lambda self: self._buckets)
    max_payload = property(lambda self: self._max_payload)
    base_lba = property(lambda self: self._base_lba)
    record_layout = property(lambda self: self._layout)

    # ------------------------------------------------------------------------------------
    def elaborate(self, platform):  # noqa: C901 (one dispatcher FSM, by design)
        m = Module()
        c, lay = self._config, self._layout
        L, Hq, Hkv, d, W = c.layers, c.q_heads, c.kv_heads, c.head_dim, c.window
        R = c.layers * c.kv_heads
        TB = lay.token_bytes
        MT = c.max_tokens
        M = self.attention.macs
        EB = lay.elem_bytes               # bytes per q/k/v element (1: ringkv-fx1, 2: fx2)
        ring_bytes = R * 2 * W * d * EB   # the byte-addressed ring port's space
        region_sectors = self._regions * lay.sectors_per_region
        per_token_in = attn_in_bytes(c, 1)
        per_token_out = 2 * Hq * d

        m.submodules.decoder = dec = self.decoder
        m.submodules.encoder = enc = self.encoder
        m.submodules.tokens = tm = self.tokens
        m.submodules.hasher = hasher = self.hasher
        m.submodules.directory = dr = self.directory
        m.submodules.dma = dma = self.dma
        m.submodules.attention = at = self.attention
        wiring.connect(m, wiring.flipped(self.rx), dec.i)
        wiring.connect(m, enc.o, wiring.flipped(self.tx))
        wiring.connect(m, dma.tokens, tm.read_port(1))

        # ---- counters ------------------------------------------------------------------
        cycles = Signal(64)
        attn_cycles, dma_cycles, dir_cycles = Signal(64), Signal(64), Signal(64)
        frames, frame_errors, rejected = Signal(32), Signal(32), Signal(32)
        queries, hits, exports = Signal(32), Signal(32), Signal(32)
        stats_clear = Signal()
        m.d.sync += cycles.eq(cycles + 1)
        with m.If(stats_clear):
            m.d.sync += [x.eq(0) for x in (attn_cycles, dma_cycles, dir_cycles, frames,
                                            frame_errors, rejected, queries, hits, exports)]
        with m.Else():
            m.d.sync += [attn_cycles.eq(attn_cycles + at.busy),
                         dma_cycles.eq(dma_cycles + dma.busy),
                         dir_cycles.eq(dir_cycles + ~dr.i.ready)]

        # ---- request registers -----------------------------------------------------------
        arg_max = max(lay_.size for lay_ in REQUESTS.values())
        op = Signal(8)
        seq = Signal(8)
        length = Signal(16)
        taken = Signal(16)                 # payload bytes consumed so far
        args = Signal(8 * arg_max)
        rstatus = Signal(8)                # a Status value
        rlen = Signal(16)
        mode = Signal(_Mode)
        idx = Signal(17)                   # response byte / item index
        cycles_at = Signal(64)             # STATS snapshot; start of QUERY/EXPORT

        def arg(o, name):
            off, size = REQUESTS[o].offset(name)
            return args[8 * off:8 * (off + size)]

        # ---- token memory ports (read port 0 shared by the hash feeder and TOKENS_READ) ---
        rd0 = tm.read_port(0)
        tok_acc = Signal(8 * TB)
        tok_b = Signal(range(max(TB, 2)))
        tok_i = Signal(32)                 # tokens done (stream ops) / index
        tok_word = Signal(8 * TB)
        m.d.comb += tok_word.eq(rd0.data)

        # ---- hash feeder ---------------------------------------------------------------------
        h_n = Signal(32)
        h_i = Signal(32)
        h_valid, h_first, h_last = Signal(), Signal(), Signal()
        hash_val = Signal(64)
        m.d.comb += [hasher.i.valid.eq(h_valid), hasher.i.payload.token.eq(rd0.data),
                     hasher.i.payload.first.eq(h_first), hasher.i.payload.last.eq(h_last),
                     hasher.o.ready.eq(1)]
        m.d.sync += [h_valid.eq(0), h_first.eq(0), h_last.eq(0)]

        # ---- directory ---------------------------------------------------------------------
        dresp = Signal(dr.resp_layout)
        dir_now = Signal(32)
        commit_seq = Signal(32, init=1)
        a_next = Signal(range(self._regions + 1))     # mirrors of the allocator's FIFO levels
        b_level = Signal(range(self._regions + 1))

        def mirror_allocator(r):
            """Track FIFO A/B levels from a response ``r`` (the directory exports no levels)."""
            with m.If(r.status == DirStatus.OK):
                with m.Switch(r.op):
                    with m.Case(DirOp.CLEAR):
                        m.d.sync += [a_next.eq(0), b_level.eq(0)]
                    with m.Case(DirOp.INSERT):
                        from_a = r.region == a_next
                        m.d.sync += [a_next.eq(a_next + from_a),
                                     b_level.eq(b_level + r.evicted - ~from_a)]
                    with m.Case(DirOp.INSERT_EXISTING):
                        m.d.sync += [a_next.eq(r.region + 1),
                                     b_level.eq(b_level + (r.region - a_next))]
                    with m.Case(DirOp.DELETE):
                        m.d.sync += b_level.eq(b_level + 1)
                    with m.Case(DirOp.EXPIRE):
                        m.d.sync += b_level.eq(b_level + r.expired)

        # ---- DMA ---------------------------------------------------------------------------
        dma_resp = Signal(dma.resp.payload.shape())

        # ---- storage port: DMA, or the dispatcher's SECTOR_READ ---------------------------
        st, ds = self.storage, dma.storage
        st_top = Signal()
        top_cmd_valid, top_rready = Signal(), Signal()
        top_lba = Signal(32)
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
            m.d.comb += [st.cmd.payload.op.eq(StorageOp.READ), st.cmd.payload.lba.eq(top_lba),
                         st.cmd.payload.count.eq(1)]
        m.submodules.sector = sector = memory.Memory(shape=8, depth=SECTOR_BYTES, init=[])
        sec_wr = sector.write_port()
        sec_rd = sector.read_port(transparent_for=())
        sec_err = Signal()

        # ---- attention ring / meta ports: the DMA while busy, else the dispatcher ---------
        top_ring_addr = Signal(32)
        top_ring_re = Signal()
        top_meta_ring = Signal(8)
        dr_ring = dma.ring
        # The DMA's ring port has the core's member names (hw/dma.RingPortSignature); it owns
        # the port while busy, the dispatcher (RING_READ, EXPORT's ring check) otherwise.
        m.d.comb += [
            at.ring_addr.eq(Mux(dma.busy, dr_ring.ring_addr, top_ring_addr)),
            at.ring_re.eq(Mux(dma.busy, dr_ring.ring_re, top_ring_re)),
            at.ring_we.eq(dr_ring.ring_we & dma.busy),
            at.ring_wdata.eq(dr_ring.ring_wdata),
            dr_ring.ring_rdata.eq(at.ring_rdata),
            at.meta_ring.eq(Mux(dma.busy, dr_ring.meta_ring, top_meta_ring)),
            dr_ring.meta_count.eq(at.meta_count),
            dr_ring.meta_head.eq(at.meta_head),
            at.meta_we.eq(dr_ring.meta_we & dma.busy),
            at.meta_wcount.eq(dr_ring.meta_wcount),
            at.meta_whead.eq(dr_ring.meta_whead),
        ]

        # ---- snapshot (QUERY / EXPORT) registers ------------------------------------------
        s_n = Signal(32)
        s_rec = Signal(8)
        s_dir = Signal(4)
        s_link = Signal(16)
        s_region = Signal(24)
        s_seq = Signal(32)
        s_old_hit = Signal()
        s_old_link = Signal(16)
        s_ring = Signal(range(R + 1))
        s_bad = Signal()
        s_prev_head = Signal(16)
        s_cycles = Signal(32)
        valid_slots = Mux(s_n < W, s_n, W)
        s_bytes = s_n * TB + valid_slots * (2 * L * Hkv * d * EB)

        # ---- attention streaming ---------------------------------------------------------
        a_layer = Signal(8)
        a_count = Signal(16)
        a_kvh = Signal(range(Hkv + 1))
        a_inflight = Signal()
        a_done = Signal(range(Hkv + 1))
        a_beat = Signal(8 * M * EB)       # one ``i`` beat: M elements of EB bytes
        a_fill = Signal(range(M * EB + 1))
        a_obuf = Signal(16 * M)
        a_ofull = Signal()
        a_opos = Signal(range(2 * M))
        a_sent = Signal(17)
        a_clear_op = Signal(2)

        # ---- ring read ---------------------------------------------------------------------
        rr_word = Signal(48)
        rr_pos = Signal(range(META_BYTES))

        # ---- response records --------------------------------------------------------------
        template = header_template(c)
        digest = int.from_bytes(c.digest(), "little")
        cfg_fields = int.from_bytes(template[80:116], "little")
        tm_count = tm.count
        resp_word = Signal(8 * max(lay_.size for lay_ in RESPONSES.values()))
        dir_fields = dict(dir_status=dresp.status.as_value(), evicted=dresp.evicted,
                          link=dresp.link, region=dresp.region, count=dresp.count,
                          hash=dresp.hash, stamp=dresp.stamp, prev=dresp.prev, next=dresp.next,
                          victim=dresp.victim, expired=dresp.expired)
        snap_fields = dict(record_status=s_rec, dir_status=s_dir, link=s_link, region=s_region,
                           count=s_n, hash=hash_val, bytes=s_bytes, cycles=s_cycles, seq=s_seq)
        records = {
            Op.VERSION: dict(protocol=PROTOCOL_VERSION, gateware=GATEWARE_VERSION,
                             max_payload=self._max_payload, lanes=self.attention.lanes, macs=M,
                             regions=self._regions, links=self._links, buckets=self._buckets,
                             sectors_per_region=lay.sectors_per_region,
                             base_lba=self._base_lba, hash_width=64, token_bytes=TB),
            Op.CONFIG_DIGEST: dict(digest=Const(digest, 256), fields=Const(cfg_fields, 288)),
            Op.STATS: dict(cycles=cycles_at, attn_cycles=attn_cycles, dma_cycles=dma_cycles,
                           dir_cycles=dir_cycles, frames=frames, frame_errors=frame_errors,
                           rejected=rejected, queries=queries, hits=hits, exports=exports),
            Op.TOKENS_WRITE: dict(count=tm_count),
            Op.TOKENS_APPEND: dict(count=tm_count),
            Op.HASH_QUERY: dict(hash=hash_val),
            Op.ALLOC_STATUS: dict(fifo_a=self._regions - a_next, fifo_b=b_level,
                                  live=a_next - b_level, commit_seq=commit_seq,
                                  token_count=tm_count, dir_now=dir_now),
            Op.QUERY: snap_fields,
            Op.EXPORT: snap_fields,
        }
        for o in (Op.DIR_LOOKUP, Op.DIR_INSERT, Op.DIR_DELETE, Op.DIR_TOUCH, Op.DIR_EXPIRE,
                  Op.DIR_READ, Op.DIR_CLEAR):
            records[o] = dir_fields
        with m.Switch(op):
            for o, values in records.items():
                with m.Case(o.value):
                    m.d.comb += resp_word.eq(_pack(RESPONSES[o], **values))

        def dir_to_status(s):
            return Mux(s == DirStatus.OK, Status.OK,
                       Mux(s == DirStatus.MISS, Status.MISS,
                           Mux(s == DirStatus.FULL, Status.FULL, Status.BAD_ARG)))

        # ---- the dispatcher ------------------------------------------------------------------
        def respond(status, n_bytes=0, how=_Mode.BUF):
            m.d.sync += [rstatus.eq(status), rlen.eq(n_bytes), mode.eq(how), idx.eq(0)]
            m.next = "RESP_HDR"

        def reject(status):
            """Refuse the request: drain what is left of its payload, then answer."""
            m.d.sync += [rstatus.eq(status), rlen.eq(0), mode.eq(_Mode.BUF),
                         rejected.eq(rejected + 1)]
            m.next = "DRAIN"

        def ok_fixed(o):
            respond(Status.OK, RESPONSES[o].size)

        def dir_call(name, next_state, **fields):
            """States ``name`` (issue) and ``name_W`` (await): one directory command."""
            with m.State(name):
                m.d.comb += dr.i.valid.eq(1)
                m.d.comb += dr.i.payload.now.eq(dir_now)
                for key, value in fields.items():
                    m.d.comb += getattr(dr.i.payload, key).eq(value)
                with m.If(dr.i.ready):
                    m.d.sync += dir_now.eq(dir_now + 1)
                    m.next = name + "_W"
            with m.State(name + "_W"):
                m.d.comb += dr.o.ready.eq(1)
                with m.If(dr.o.valid):
                    m.d.sync += dresp.eq(dr.o.payload)
                    mirror_allocator(dr.o.payload)
                    m.next = next_state

        def dma_call(name, next_state, **fields):
            """States ``name`` (issue) and ``name_W`` (await): one DMA command."""
            with m.State(name):
                m.d.comb += dma.cmd.valid.eq(1)
                for key, value in fields.items():
                    m.d.comb += getattr(dma.cmd.payload, key).eq(value)
                with m.If(dma.cmd.ready):
                    m.next = name + "_W"
            with m.State(name + "_W"):
                m.d.comb += dma.resp.ready.eq(1)
                with m.If(dma.resp.valid):
                    m.d.sync += dma_resp.eq(dma.resp.payload)
                    m.next = next_state

        def hash_call(name, next_state):
            """Hash the first ``h_n`` tokens (``h_n >= 1``) into ``hash_val``: ``n + 2`` clocks."""
            with m.State(name):
                m.d.comb += [rd0.addr.eq(h_i), rd0.en.eq(1)]
                m.d.sync += [h_valid.eq(1), h_first.eq(h_i == 0), h_last.eq(h_i == h_n - 1),
                             h_i.eq(h_i + 1)]
                with m.If(h_i == h_n - 1):
                    m.next = name + "_W"
            with m.State(name + "_W"):
                with m.If(hasher.o.valid & hasher.o.payload.last):
                    m.d.sync += hash_val.eq(hasher.o.payload.hash)
                    m.next = next_state

        def attn_cmd(name, next_state, attn_op, layer):
            with m.State(name):
                m.d.comb += [at.cmd.valid.eq(1), at.cmd.payload.op.eq(attn_op),
                             at.cmd.payload.layer.eq(layer)]
                with m.If(at.cmd.ready):
                    m.next = name + "_W"
            with m.State(name + "_W"):
                m.d.comb += at.status.ready.eq(1)
                with m.If(at.status.valid):
                    m.next = next_state

        fixed_ops = [o for o in REQUESTS
                     if o not in (Op.PING, Op.TOKENS_WRITE, Op.TOKENS_APPEND, Op.ATTN_DECODE,
                                  Op.ATTN_PREFILL, Op.DIR_CLEAR)]

        with m.FSM(name="dispatch"):
            with m.State("IDLE"):
                m.d.comb += dec.error.ready.eq(1)
                with m.If(dec.error.valid):
                    p = dec.error.payload
                    m.d.sync += [op.eq(p.op), seq.eq(p.seq), frame_errors.eq(frame_errors + 1)]
                    respond(p.status)
                with m.Else():
                    m.d.comb += dec.header.ready.eq(1)
                    with m.If(dec.header.valid):
                        p = dec.header.payload
                        m.d.sync += [op.eq(p.op), seq.eq(p.seq), length.eq(p.length),
                                     taken.eq(0), args.eq(0), frames.eq(frames + 1),
                                     cycles_at.eq(cycles)]
                        m.next = "HDR_CHECK"

            with m.State("HDR_CHECK"):
                with m.Switch(op):
                    for o in fixed_ops:
                        with m.Case(o.value):
                            with m.If(length != REQUESTS[o].size):
                                reject(Status.BAD_LENGTH)
                            with m.Elif(length == 0):
                                m.next = "DISPATCH"
                            with m.Else():
                                m.next = "ARGS"
                    with m.Case(Op.DIR_CLEAR.value):
                        with m.If((length != 0) & (length != 4)):
                            reject(Status.BAD_LENGTH)
                        with m.Elif(length == 0):
                            m.next = "DISPATCH"
                        with m.Else():
                            m.next = "ARGS"
                    with m.Case(Op.PING.value):
                        m.next = "DISPATCH"
                    for o in (Op.TOKENS_WRITE, Op.TOKENS_APPEND, Op.ATTN_DECODE,
                              Op.ATTN_PREFILL):
                        with m.Case(o.value):
                            with m.If(length < REQUESTS[o].size):
                                reject(Status.BAD_LENGTH)
                            with m.Else():
                                m.next = "ARGS"
                    with m.Default():
                        reject(Status.UNKNOWN_OP)

            with m.State("ARGS"):
                # collect the op's fixed record (length >= its size was checked)
                m.d.comb += dec.data.ready.eq(1)
                with m.If(dec.data.valid):
                    m.d.sync += [args.word_select(taken[:5], 8).eq(dec.data.payload.data),
                                 taken.eq(taken + 1)]
                    with m.Switch(op):
                        for o in REQUESTS:
                            size = REQUESTS[o].size
                            if size == 0:
                                continue
                            with m.Case(o.value):
                                with m.If(taken == size - 1):
                                    m.next = "DISPATCH"

            with m.State("DRAIN"):
                m.d.comb += dec.data.ready.eq(taken != length)
                with m.If(taken == length):
                    m.next = "RESP_HDR"
                with m.Elif(dec.data.valid):
                    m.d.sync += taken.eq(taken + 1)

            with m.State("RESP_HDR"):
                m.d.comb += [enc.header.valid.eq(1), enc.header.payload.op.eq(op),
                             enc.header.payload.seq.eq(seq),
                             enc.header.payload.status.as_value().eq(rstatus),
                             enc.header.payload.length.eq(rlen)]
                with m.If(enc.header.ready):
                    m.d.sync += idx.eq(0)
                    with m.If(rlen == 0):
                        m.next = "IDLE"
                    with m.Else():
                        with m.Switch(mode):
                            with m.Case(_Mode.BUF):
                                m.next = "SEND_BUF"
                            with m.Case(_Mode.ECHO):
                                m.next = "ECHO"
                            with m.Case(_Mode.TOKENS):
                                m.next = "TR_ISSUE"
                            with m.Case(_Mode.SECTOR):
                                m.next = "SR_ISSUE"
                            with m.Case(_Mode.RING):
                                m.next = "RR_ISSUE"
                            with m.Case(_Mode.ATTN):
                                m.next = "A_RUN"

            with m.State("SEND_BUF"):
                m.d.comb += [enc.data.valid.eq(1),
                             enc.data.payload.eq(resp_word.word_select(idx[:7], 8))]
                with m.If(enc.data.ready):
                    m.d.sync += idx.eq(idx + 1)
                    with m.If(idx == rlen - 1):
                        m.next = "IDLE"

            with m.State("ECHO"):
                m.d.comb += [enc.data.valid.eq(dec.data.valid),
                             enc.data.payload.eq(dec.data.payload.data),
                             dec.data.ready.eq(enc.data.ready)]
                with m.If(dec.data.valid & enc.data.ready):
                    m.d.sync += idx.eq(idx + 1)
                    with m.If(idx == rlen - 1):
                        m.next = "IDLE"

            # ---------------------------------------------------------------------------
            with m.State("DISPATCH"):
                with m.Switch(op):
                    with m.Case(Op.PING.value):
                        respond(Status.OK, length, _Mode.ECHO)
                    for o in (Op.VERSION, Op.CONFIG_DIGEST, Op.STATS, Op.ALLOC_STATUS):
                        with m.Case(o.value):
                            ok_fixed(o)
                    with m.Case(Op.STATS_CLEAR.value):
                        m.d.comb += stats_clear.eq(1)
                        respond(Status.OK)
                    with m.Case(Op.SESSION_BEGIN.value):
                        m.d.comb += tm.clear.eq(1)
                        m.d.sync += a_clear_op.eq(AttnOp.CLEAR_ALL)
                        m.next = "RING_CLR"
                    with m.Case(Op.RING_CLEAR.value):
                        layer = arg(Op.RING_CLEAR, "layer")
                        with m.If(layer == RING_CLEAR_ALL):
                            m.d.sync += [a_clear_op.eq(AttnOp.CLEAR_ALL), a_layer.eq(0)]
                            m.next = "RING_CLR"
                        with m.Elif(layer < L):
                            m.d.sync += [a_clear_op.eq(AttnOp.CLEAR), a_layer.eq(layer)]
                            m.next = "RING_CLR"
                        with m.Else():
                            reject(Status.BAD_ARG)
                    with m.Case(Op.TOKENS_APPEND.value):
                        n = arg(Op.TOKENS_APPEND, "n")
                        with m.If(length != REQUESTS[Op.TOKENS_APPEND].size + n * TB):
                            reject(Status.BAD_LENGTH)
                        with m.Elif(tm.count + n > MT):
                            reject(Status.BAD_ARG)
                        with m.Else():
                            m.d.sync += [tok_i.eq(0), tok_b.eq(0)]
                            m.next = "TOK_IN"
                    with m.Case(Op.TOKENS_WRITE.value):
                        n = arg(Op.TOKENS_WRITE, "n")
                        off = arg(Op.TOKENS_WRITE, "offset")
                        with m.If(length != REQUESTS[Op.TOKENS_WRITE].size + n * TB):
                            reject(Status.BAD_LENGTH)
                        with m.Elif((off > tm.count) | (off + n > MT)):
                            reject(Status.BAD_ARG)
                        with m.Else():
                            m.d.sync += [tok_i.eq(0), tok_b.eq(0)]
                            m.next = "TOK_IN"
                    with m.Case(Op.TOKENS_READ.value):
                        n = arg(Op.TOKENS_READ, "n")
                        off = arg(Op.TOKENS_READ, "offset")
                        with m.If((off + n > tm.count) | (n * TB > self._max_payload)):
                            reject(Status.BAD_ARG)
                        with m.Elif(n == 0):
                            respond(Status.OK)
                        with m.Else():
                            m.d.sync += tok_i.eq(off)
                            respond(Status.OK, n * TB, _Mode.TOKENS)
                    with m.Case(Op.HASH_QUERY.value):
                        n = arg(Op.HASH_QUERY, "n")
                        with m.If(n > tm.count):
                            reject(Status.BAD_ARG)
                        with m.Elif(n == 0):
                            m.d.sync += hash_val.eq(hash_seed(c))
                            ok_fixed(Op.HASH_QUERY)
                        with m.Else():
                            m.d.sync += [h_n.eq(n), h_i.eq(0)]
                            m.next = "HQ_HASH"
                    # ---- directory ----
                    with m.Case(Op.DIR_LOOKUP.value):
                        with m.If(arg(Op.DIR_LOOKUP, "count") > MT):
                            reject(Status.BAD_ARG)
                        with m.Else():
                            m.next = "D_LOOKUP"
                    with m.Case(Op.DIR_INSERT.value):
                        with m.If((arg(Op.DIR_INSERT, "count") > MT)
                                  | (arg(Op.DIR_INSERT, "region") >= self._regions)
                                  | (arg(Op.DIR_INSERT, "flags") > 3)):
                            reject(Status.BAD_ARG)
                        with m.Elif(arg(Op.DIR_INSERT, "flags") & FLAG_EXISTING):
                            m.next = "D_INSERT_X"
                        with m.Else():
                            m.next = "D_INSERT"
                    for o, state in ((Op.DIR_DELETE, "D_DELETE"), (Op.DIR_TOUCH, "D_TOUCH"),
                                     (Op.DIR_READ, "D_READ")):
                        with m.Case(o.value):
                            with m.If(arg(o, "link") >= self._links):
                                reject(Status.BAD_ARG)
                            with m.Else():
                                m.next = state
                    with m.Case(Op.DIR_EXPIRE.value):
                        m.next = "D_EXPIRE"
                    with m.Case(Op.DIR_CLEAR.value):
                        with m.If(length == 4):
                            m.d.sync += commit_seq.eq(arg(Op.DIR_CLEAR, "next_seq"))
                        m.next = "D_CLEAR"
                    # ---- snapshot store ----
                    with m.Case(Op.QUERY.value):
                        n = arg(Op.QUERY, "n")
                        with m.If((n == 0) | (n > tm.count)):
                            reject(Status.BAD_ARG)
                        with m.Else():
                            m.d.sync += [h_n.eq(n), h_i.eq(0), s_n.eq(n), s_rec.eq(NO_RECORD),
                                         s_dir.eq(DirStatus.MISS), s_link.eq(0),
                                         s_region.eq(0), s_seq.eq(0)]
                            m.next = "Q_HASH"
                    with m.Case(Op.EXPORT.value):
                        n = arg(Op.EXPORT, "n")
                        with m.If((n == 0) | (n > tm.count) | (n != at.meta_count)):
                            reject(Status.BAD_ARG)
                        with m.Else():
                            m.d.sync += [h_n.eq(n), h_i.eq(0), s_n.eq(n), s_rec.eq(NO_RECORD),
                                         s_dir.eq(DirStatus.MISS), s_link.eq(0),
                                         s_region.eq(0), s_seq.eq(commit_seq), s_ring.eq(0),
                                         s_bad.eq(0)]
                            m.next = "E_RINGS"
                    # ---- attention ----
                    for o in (Op.ATTN_DECODE, Op.ATTN_PREFILL):
                        with m.Case(o.value):
                            layer = arg(o, "layer")
                            count = arg(o, "count")
                            in_len = REQUESTS[o].size + count * per_token_in
                            with m.If(length != in_len):
                                reject(Status.BAD_LENGTH)
                            with m.Elif((layer >= L) | (count == 0)
                                        | (count * per_token_out > 0xFFFF)
                                        | ((count != 1) if o == Op.ATTN_DECODE else 0)):
                                reject(Status.BAD_ARG)
                            with m.Else():
                                m.d.sync += [a_layer.eq(layer), a_count.eq(count),
                                             a_kvh.eq(0), a_inflight.eq(0), a_done.eq(0),
                                             a_fill.eq(0), a_ofull.eq(0), a_opos.eq(0),
                                             a_sent.eq(0)]
                                respond(Status.OK, count * per_token_out, _Mode.ATTN)
                    with m.Case(Op.RING_READ.value):
                        addr = arg(Op.RING_READ, "addr")
                        n = arg(Op.RING_READ, "n")
                        what = arg(Op.RING_READ, "what")
                        with m.If(what == RING_ELEMENTS):
                            with m.If((addr + n > ring_bytes) | (n > self._max_payload)):
                                reject(Status.BAD_ARG)
                            with m.Else():
                                m.d.sync += tok_i.eq(addr)
                                respond(Status.OK, n, _Mode.RING)
                        with m.Elif(what == RING_META):
                            with m.If((addr + n > R) | (n * META_BYTES > self._max_payload)):
                                reject(Status.BAD_ARG)
                            with m.Else():
                                m.d.sync += tok_i.eq(addr)
                                respond(Status.OK, n * META_BYTES, _Mode.RING)
                        with m.Else():
                            reject(Status.BAD_ARG)
                    with m.Case(Op.SECTOR_READ.value):
                        lba = arg(Op.SECTOR_READ, "lba")
                        with m.If(lba >= region_sectors):
                            reject(Status.BAD_ARG)
                        with m.Else():
                            m.d.sync += [top_lba.eq(self._base_lba + lba), idx.eq(0),
                                         sec_err.eq(0)]
                            m.next = "S_CMD"
                    with m.Default():
                        respond(Status.INTERNAL)

            # ---- ring clear (SESSION_BEGIN, RING_CLEAR) ----
            attn_cmd("RING_CLR", "RING_CLR_DONE", a_clear_op, a_layer)
            with m.State("RING_CLR_DONE"):
                respond(Status.OK)

            # ---- token stream in (TOKENS_APPEND / TOKENS_WRITE) ----
            with m.State("TOK_IN"):
                is_write = op == Op.TOKENS_WRITE.value
                n = Mux(is_write, arg(Op.TOKENS_WRITE, "n"), arg(Op.TOKENS_APPEND, "n"))
                off = arg(Op.TOKENS_WRITE, "offset")
                m.d.comb += dec.data.ready.eq(tok_i != n)
                with m.If(tok_i == n):
                    m.next = "TOK_DONE"
                with m.Elif(dec.data.valid):
                    byte = dec.data.payload.data
                    m.d.sync += [taken.eq(taken + 1),
                                 tok_acc.word_select(tok_b, 8).eq(byte)]
                    with m.If(tok_b == TB - 1):
                        token = Cat(tok_acc[:8 * (TB - 1)], byte) if TB > 1 else byte
                        m.d.sync += [tok_b.eq(0), tok_i.eq(tok_i + 1)]
                        with m.If(is_write):
                            m.d.comb += [tm.write.addr.eq(off + tok_i), tm.write.data.eq(token),
                                         tm.write.en.eq(1)]
                        with m.Else():
                            m.d.comb += [tm.append.valid.eq(1), tm.append.payload.eq(token)]
                    with m.Else():
                        m.d.sync += tok_b.eq(tok_b + 1)
            with m.State("TOK_DONE"):
                with m.If(op == Op.TOKENS_WRITE.value):
                    m.d.comb += [tm.count_we.eq(1),
                                 tm.set_count.eq(arg(Op.TOKENS_WRITE, "offset")
                                                 + arg(Op.TOKENS_WRITE, "n"))]
                m.next = "TOK_RESP"
            with m.State("TOK_RESP"):
                ok_fixed(Op.TOKENS_APPEND)

            # ---- TOKENS_READ: 2 clocks per token + TB bytes ----
            with m.State("TR_ISSUE"):
                m.d.comb += [rd0.addr.eq(tok_i), rd0.en.eq(1)]
                m.d.sync += tok_b.eq(0)
                m.next = "TR_SEND"
            with m.State("TR_SEND"):
                m.d.comb += [enc.data.valid.eq(1),
                             enc.data.payload.eq(tok_word.word_select(tok_b, 8))]
                with m.If(enc.data.ready):
                    m.d.sync += [idx.eq(idx + 1), tok_b.eq(tok_b + 1)]
                    with m.If(idx == rlen - 1):
                        m.next = "IDLE"
                    with m.Elif(tok_b == TB - 1):
                        m.d.sync += tok_i.eq(tok_i + 1)
                        m.next = "TR_ISSUE"

            # ---- HASH_QUERY ----
            hash_call("HQ_HASH", "HQ_DONE")
            with m.State("HQ_DONE"):
                ok_fixed(Op.HASH_QUERY)

            # ---- DIR_* ----
            dir_call("D_LOOKUP", "D_DONE", op=DirOp.LOOKUP, count=arg(Op.DIR_LOOKUP, "count"),
                     hash=arg(Op.DIR_LOOKUP, "hash"))
            dir_call("D_INSERT", "D_DONE", op=DirOp.INSERT, count=arg(Op.DIR_INSERT, "count"),
                     hash=arg(Op.DIR_INSERT, "hash"),
                     evict=arg(Op.DIR_INSERT, "flags")[0] if FLAG_EVICT == 1 else 0)
            dir_call("D_INSERT_X", "D_DONE", op=DirOp.INSERT_EXISTING,
                     count=arg(Op.DIR_INSERT, "count"), hash=arg(Op.DIR_INSERT, "hash"),
                     region=arg(Op.DIR_INSERT, "region"))
            dir_call("D_DELETE", "D_DONE", op=DirOp.DELETE, link=arg(Op.DIR_DELETE, "link"))
            dir_call("D_TOUCH", "D_DONE", op=DirOp.TOUCH, link=arg(Op.DIR_TOUCH, "link"))
            dir_call("D_READ", "D_DONE", op=DirOp.READ, link=arg(Op.DIR_READ, "link"))
            dir_call("D_EXPIRE", "D_DONE", op=DirOp.EXPIRE,
                     max_age=arg(Op.DIR_EXPIRE, "max_age"))
            dir_call("D_CLEAR", "D_DONE", op=DirOp.CLEAR)
            with m.State("D_DONE"):
                respond(dir_to_status(dresp.status), RESPONSES[Op.DIR_LOOKUP].size)

            # ---- QUERY: hash, lookup, verify + import ----
            hash_call("Q_HASH", "Q_LOOKUP")
            dir_call("Q_LOOKUP", "Q_LOOKED", op=DirOp.LOOKUP, count=s_n, hash=hash_val)
            with m.State("Q_LOOKED"):
                m.d.sync += [s_dir.eq(dresp.status), s_link.eq(dresp.link),
                             s_region.eq(dresp.region), queries.eq(queries + 1)]
                with m.If(dresp.status == DirStatus.OK):
                    m.next = "Q_IMPORT"
                with m.Else():
                    m.next = "Q_DONE"
            dma_call("Q_IMPORT", "Q_IMPORTED", op=DmaOp.IMPORT, region=s_region, count=s_n,
                     hash=hash_val)
            with m.State("Q_IMPORTED"):
                status = dma_resp.status
                m.d.sync += [s_rec.eq(status), s_seq.eq(dma_resp.seq)]
                # A record that can never verify is dropped from the directory (its region
                # goes back to the allocator); a token mismatch (a hash collision) or a storage
                # error (maybe transient) keeps it.
                drop = ((status != RecordStatus.OK) & (status != RecordStatus.TOKEN_MISMATCH)
                        & (status != RecordStatus.STORAGE))
                with m.If(status == RecordStatus.OK):
                    m.d.sync += hits.eq(hits + 1)
                with m.If(drop):
                    m.next = "Q_DROP"
                with m.Else():
                    m.next = "Q_DONE"
            dir_call("Q_DROP", "Q_DONE", op=DirOp.DELETE, link=s_link)
            with m.State("Q_DONE"):
                m.d.sync += s_cycles.eq(cycles - cycles_at)
                hit = (s_dir == DirStatus.OK) & (s_rec == RecordStatus.OK)
                respond(Mux(hit, Status.HIT, Status.MISS), RESPONSES[Op.QUERY].size)

            # ---- EXPORT: rings agree, hash, lookup old, insert, DMA export, retire ----
            with m.State("E_RINGS"):
                m.d.comb += top_meta_ring.eq(s_ring)
                # every ring must hold the n tokens, with the same head (the DMA checks this
                # too, but after the directory insert: checked here, a refusal changes nothing)
                with m.If((at.meta_count != s_n)
                          | ((at.meta_head != s_prev_head) & (s_ring != 0))):
                    m.d.sync += s_bad.eq(1)
                m.d.sync += [s_ring.eq(s_ring + 1), s_prev_head.eq(at.meta_head)]
                with m.If(s_ring == R - 1):
                    m.next = "E_RINGS_OK"
            with m.State("E_RINGS_OK"):
                with m.If(s_bad):
                    m.d.sync += [rstatus.eq(Status.BAD_ARG), rlen.eq(0),
                                 rejected.eq(rejected + 1)]
                    m.next = "RESP_HDR"
                with m.Else():
                    m.next = "E_HASH"
            hash_call("E_HASH", "E_LOOKUP")
            dir_call("E_LOOKUP", "E_LOOKED", op=DirOp.LOOKUP, count=s_n, hash=hash_val)
            with m.State("E_LOOKED"):
                m.d.sync += [s_old_hit.eq(dresp.status == DirStatus.OK),
                             s_old_link.eq(dresp.link)]
                m.next = "E_INSERT"
            dir_call("E_INSERT", "E_INSERTED", op=DirOp.INSERT, count=s_n, hash=hash_val,
                     evict=1)
            with m.State("E_INSERTED"):
                m.d.sync += [s_dir.eq(dresp.status), s_link.eq(dresp.link),
                             s_region.eq(dresp.region)]
                with m.If(dresp.evicted & (dresp.victim == s_old_link)):
                    m.d.sync += s_old_hit.eq(0)       # the old record was the LRU victim
                with m.If(dresp.status == DirStatus.OK):
                    m.next = "E_DMA"
                with m.Else():
                    m.next = "E_DONE"
            dma_call("E_DMA", "E_EXPORTED", op=DmaOp.EXPORT, region=s_region, count=s_n,
                     hash=hash_val, seq=s_seq)
            with m.State("E_EXPORTED"):
                m.d.sync += s_rec.eq(dma_resp.status)
                with m.If(dma_resp.status == RecordStatus.OK):
                    m.d.sync += [commit_seq.eq(commit_seq + 1), exports.eq(exports + 1)]
                    with m.If(s_old_hit):
                        m.next = "E_RETIRE"
                    with m.Else():
                        m.next = "E_DONE"
                with m.Else():
                    m.next = "E_UNDO"
            dir_call("E_RETIRE", "E_DONE", op=DirOp.DELETE, link=s_old_link)
            dir_call("E_UNDO", "E_DONE", op=DirOp.DELETE, link=s_link)
            with m.State("E_DONE"):
                m.d.sync += s_cycles.eq(cycles - cycles_at)
                status = Mux(s_dir != DirStatus.OK, dir_to_status(s_dir),
                             Mux(s_rec == RecordStatus.OK, Status.OK,
                                 Mux(s_rec == RecordStatus.STORAGE, Status.STORAGE_ERROR,
                                     Status.INTERNAL)))
                respond(status, RESPONSES[Op.EXPORT].size)

            # ---- ATTN_DECODE / ATTN_PREFILL: header sent, then stream both ways ----
            with m.State("A_RUN"):
                # one ATTEND command per KV head, in order
                m.d.comb += [at.cmd.valid.eq((a_kvh != Hkv) & ~a_inflight),
                             at.cmd.payload.op.eq(AttnOp.ATTEND),
                             at.cmd.payload.layer.eq(a_layer),
                             at.cmd.payload.kv_head.eq(a_kvh),
                             at.cmd.payload.count.eq(a_count),
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
                                 a_fill.eq(a_fill + 1), taken.eq(taken + 1)]
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
                with m.If((a_done == Hkv) & (a_sent == rlen) & ~a_ofull):
                    m.next = "IDLE"

            # ---- RING_READ: 3 clocks per item (a byte of the byte-addressed ring port, or the
            # metadata of a ring) ----
            with m.State("RR_ISSUE"):
                what = arg(Op.RING_READ, "what")
                m.d.comb += [top_ring_addr.eq(tok_i), top_ring_re.eq(what == RING_ELEMENTS),
                             top_meta_ring.eq(tok_i)]
                m.d.sync += rr_pos.eq(0)
                m.next = "RR_CAP"
            with m.State("RR_CAP"):
                what = arg(Op.RING_READ, "what")
                m.d.comb += top_meta_ring.eq(tok_i)
                m.d.sync += rr_word.eq(Mux(what == RING_ELEMENTS, at.ring_rdata,
                                           Cat(at.meta_count, at.meta_head)))
                m.next = "RR_SEND"
            with m.State("RR_SEND"):
                what = arg(Op.RING_READ, "what")
                m.d.comb += [enc.data.valid.eq(1),
                             enc.data.payload.eq(rr_word.word_select(rr_pos, 8))]
                with m.If(enc.data.ready):
                    m.d.sync += [idx.eq(idx + 1), rr_pos.eq(rr_pos + 1)]
                    with m.If(idx == rlen - 1):
                        m.next = "IDLE"
                    with m.Elif((what == RING_ELEMENTS) | (rr_pos == META_BYTES - 1)):
                        m.d.sync += tok_i.eq(tok_i + 1)
                        m.next = "RR_ISSUE"

            # ---- SECTOR_READ: into the sector buffer, then out ----
            with m.State("S_CMD"):
                m.d.comb += [st_top.eq(1), top_cmd_valid.eq(1)]
                with m.If(st.cmd.ready):
                    m.next = "S_DATA"
            with m.State("S_DATA"):
                # the storage contract: count*512 bytes, then one status (early on an error)
                m.d.comb += [st_top.eq(1), top_rready.eq(idx != SECTOR_BYTES),
                             sec_wr.addr.eq(idx), sec_wr.data.eq(st.rdata.payload)]
                with m.If(st.rdata.valid & (idx != SECTOR_BYTES)):
                    m.d.comb += sec_wr.en.eq(1)
                    m.d.sync += idx.eq(idx + 1)
                with m.If(st.status.valid):
                    with m.If((st.status.payload.error != StorageError.OK)
                              | (idx != SECTOR_BYTES)):
                        respond(Status.STORAGE_ERROR)
                    with m.Else():
                        respond(Status.OK, SECTOR_BYTES, _Mode.SECTOR)
            with m.State("SR_ISSUE"):
                m.d.comb += [sec_rd.addr.eq(idx), sec_rd.en.eq(1)]
                m.next = "SR_SEND"
            with m.State("SR_SEND"):
                m.d.comb += [sec_rd.en.eq(0), enc.data.valid.eq(1),
                             enc.data.payload.eq(sec_rd.data)]
                with m.If(enc.data.ready):
                    m.d.sync += idx.eq(idx + 1)
                    with m.If(idx == SECTOR_BYTES - 1):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "SR_ISSUE"
        return m
