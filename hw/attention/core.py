"""SWA attention core: ring-buffer KV cache in block RAM, split-KV lanes, LSE merge.

This module holds the command interface and the request sequencer (the FSM that loads a token,
runs phases A and B on every lane in lockstep and steps the merge), the ring metadata and the
ring port; the lanes are :class:`~ringkv.hw.attention.lane.AttentionLane` and the merge's
cross-lane steps are in :mod:`ringkv.hw.attention.merge`.

See ``docs/blocks/attention.md`` for the interface tables and measured figures, and
:mod:`ringkv.defs.numerics` (the table) and ``host/golden/fixed.py`` (the bit-exact model) for
the numerics (``ringkv-fx1`` int8, ``ringkv-fx2`` int16 q/k/v, ``ringkv-fx1c`` int8 with
per-layer scales) that this core reproduces bit for bit.
"""

import math

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int, check_pow2, log2_exact
from ringkv.defs.numerics import (
    layer_score_consts,
    numerics_of,
    score_const,
)
from ringkv.defs.record import ring_space

from .lane import PH_A, PH_B, PH_M, AttentionLane, LaneParams
from .merge import BetaUnit, LaneMax, OutputTree, Reciprocal, WeightSum
from .ring_port import RingPortSignature

__all__ = ["AttentionCore", "AttnOp", "AttnErr", "YOSYS_AFTER_READ"]

#: Yosys commands to run after reading a design that contains this core (``boards/synth.py``
#: and the board build use them). The K/V banks never use the data of a read that collides
#: with a write of the same word (see "bank collisions" in ``elaborate``; the Amaranth-simulator
#: tests check it on every clock), so their read ports are declared collision-undefined: yosys
#: then maps each bank straight to DP16KD ports, without the soft logic (about 500 LUT4 and 200
#: FF at the default size) that emulates Amaranth's read-old-data rule on a collision.
YOSYS_AFTER_READ = ("setparam -set COLLISION_X_MASK 1 t:$memrd_v2 r:MEMID=*kv_mem* %i",)


class AttnOp(enum.Enum, shape=2):
    """Command opcodes (``cmd.p.op``)."""
    ATTEND = 0      # C = count tokens: write each token's K/V, then attend (decode, prefill)
    CLEAR = 1       # empty every ring of ``layer``
    CLEAR_ALL = 2   # empty every ring (new session)
    RESERVED = 3    # no command: answered with AttnErr.OP, nothing changes


class AttnErr(enum.Enum, shape=2):
    """Status codes (``status.p.err``); a command with an error changes nothing."""
    NONE = 0
    RANGE = 1       # layer >= L or kv_head >= Hkv
    COUNT = 2       # ATTEND with count == 0
    OP = 3          # unknown opcode


def _bits(x):
    """Bits of a non-negative integer (at least 1)."""
    return max(int(x).bit_length(), 1)


class AttentionCore(wiring.Component):
    """Sliding-window attention on ring-buffer K/V caches, with ``lanes`` split-KV lanes.

    Parameters
    ----------
    layers, q_heads, kv_heads, head_dim, window:
        Model shape: ``L``, ``Hq``, ``Hkv``, ``d``, ``W``. ``d`` and ``W`` are powers of two;
        ``Hq`` is a multiple of ``Hkv`` (``G = Hq / Hkv`` query heads per KV head).
    lanes:
        ``P`` split-KV lanes (power of two, ``P <= W``). Lane ``l`` owns the contiguous ring slots
        ``l*S .. (l+1)*S - 1`` (``S = W / P``) in its own block RAM bank.
    macs:
        ``M`` multiply-accumulates per lane per clock (power of two, ``M <= d``); also the number
        of q/k/v elements per input beat and of int16 elements per output beat.
    scale:
        Softmax scale (default ``1/sqrt(d)``), folded into the score constant ``CS``.
    numerics:
        ``"ringkv-fx1"`` (default: q, k, v int8, ``EW = 8``), ``"ringkv-fx2"`` (q, k, v int16,
        ``EW = 16``, for accuracy; twice the ring memory) or ``"ringkv-fx1c"`` (int8 with
        per-layer scales); see :mod:`ringkv.defs.numerics`.
    qkv_fracs:
        ``ringkv-fx1c``'s ``(Fq, Fk, Fv)`` per layer (``RingKVConfig.qkv_fracs``); empty for
        the others. Only ``Fq + Fk`` reaches the core, as layer ``l``'s score constant
        ``CS_l`` (:func:`~ringkv.defs.numerics.layer_score_consts`): when the constants differ,
        a register loaded from an ``L``-entry table by the command's layer feeds the score
        multipliers in the constant's place (no extra clock, no extra multiplier).

    Interfaces
    ----------
    ``cmd`` (in stream): ``op`` (2 bits, :class:`AttnOp`; 3 is rejected), ``layer`` (8 bits),
    ``kv_head`` (8 bits), ``count`` (16 bits, tokens for ATTEND). ``i`` (in stream): ``M``
    signed ``EW``-bit elements per beat; per token, the ``G`` query vectors, then ``k``, then
    ``v`` (``d / M`` beats each, element ``e`` of a vector in beat ``e // M`` at position
    ``e % M``, position 0 at the LSB).
    ``o`` (out stream): ``M`` int16 per beat, per token the ``G`` output vectors in the same
    order. ``status`` (out stream): one per command, ``op`` (as given), ``err`` (2 bits,
    :class:`AttnErr`), ``count`` (the ring's token count after the command). A rejected command
    consumes no ``i`` beat and emits no ``o`` beat.

    ``ring`` (In :class:`~ringkv.hw.attention.ring_port.RingPortSignature`, its members described
    there): the byte-addressed ring and metadata port, served only while ``busy`` is low. Ring reads
    give 0 outside the rings or while busy; ring writes outside the rings or while busy are
    ignored. Metadata reads are combinational at any time (0 for a bad ring index); metadata
    writes take effect while idle (ignored for a bad ring index or ``meta_whead >= W``).

    Latency and throughput
    ----------------------
    One ATTEND token takes ``(G + 2)·d/M`` input beats, then ``2·G·T·d/M`` MAC cycles
    (``T = min(S, n)``, ``n`` the valid slots), a drain of ``7 + ceil(log2(M)/2)`` clocks after
    phase A and of 9 after phase B, and the merge: one clock, then per query head
    ``2·P + log2(P) + 32`` clocks for the LSE weights and the reciprocal plus ``d/M`` output
    beats, then a drain of ``6 + ceil(log2(P)/2)`` clocks. A command adds one clock for its
    status. These counts are exact with ``i`` always valid and ``o`` always ready (tested);
    measured figures are in ``docs/BENCHMARKS.md``.

    Backpressure: ``o`` goes through a FIFO that holds one token's whole output; the core waits
    for it to be empty before it merges the next token, and ``status`` waits for its ``ready``.
    ``i`` is read only while a token is being loaded.
    """

    def __init__(self, *, layers=4, q_heads=4, kv_heads=2, head_dim=64, window=128, lanes=4,
                 macs=8, scale=None, numerics=None, qkv_fracs=()):
        for name, value in (("layers", layers), ("q_heads", q_heads), ("kv_heads", kv_heads)):
            check_int(name, value, low=1, high=256)
        if q_heads % kv_heads:
            raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
        check_pow2("head_dim", head_dim)
        check_pow2("window", window)
        check_pow2("lanes", lanes, high=window)
        check_pow2("macs", macs, high=head_dim)
        if scale is not None and (not isinstance(scale, (int, float)) or isinstance(scale, bool)
                                  or not scale > 0):
            raise ValueError(f"scale must be a positive number or None, not {scale!r}")
        cs = score_const(head_dim, scale)
        if not 1 <= cs < (1 << 17):
            raise ValueError(f"scale {scale!r} gives a score constant {cs} outside 1..2**17-1")
        nx = numerics_of(numerics)
        cs_layers = layer_score_consts(nx, head_dim, layers, qkv_fracs, scale)
        if ring_space(layers, kv_heads, window, head_dim, nx.elem_bytes) > (1 << 32):
            raise ValueError("the rings exceed the 32-bit ring_addr space")

        self._L, self._Hq, self._Hkv = layers, q_heads, kv_heads
        self._d, self._W, self._P, self._M = head_dim, window, lanes, macs
        self._G = q_heads // kv_heads
        self._scale = scale
        self._cs = cs
        self._cs_layers = cs_layers
        self._qkv_fracs = nx.layer_fracs(layers, qkv_fracs) if nx.per_layer else ()
        self._nx = nx
        EW = nx.elem_bits

        self.cmd_layout = data.StructLayout({
            "op": AttnOp, "layer": 8, "kv_head": 8, "count": 16})
        self.status_layout = data.StructLayout({"op": AttnOp, "err": AttnErr, "count": 32})
        super().__init__({
            "cmd": In(stream.Signature(self.cmd_layout)),
            "i": In(stream.Signature(data.ArrayLayout(signed(EW), macs))),
            "o": Out(stream.Signature(data.ArrayLayout(signed(16), macs))),
            "status": Out(stream.Signature(self.status_layout)),
            "busy": Out(1),
            "ring": In(RingPortSignature(layers, kv_heads, head_dim, window, nx.elem_bytes)),
        })

    layers = property(lambda self: self._L)
    q_heads = property(lambda self: self._Hq)
    kv_heads = property(lambda self: self._Hkv)
    head_dim = property(lambda self: self._d)
    window = property(lambda self: self._W)
    lanes = property(lambda self: self._P)
    macs = property(lambda self: self._M)
    group = property(lambda self: self._G)
    scale = property(lambda self: self._scale)
    score_const = property(lambda self: self._cs)
    score_consts = property(lambda self: self._cs_layers)
    numerics = property(lambda self: self._nx)
    qkv_fracs = property(lambda self: self._qkv_fracs)

    @property
    def takes_wide_writes(self) -> bool:
        """Whether the ring port's four-byte writes (``ring_wide``) land: a bank word is
        ``macs * EB`` bytes, whole groups of four; a core of smaller words writes nothing on
        a wide write."""
        return (self._M * self._nx.elem_bytes) % 4 == 0

    def ideal_cycles(self):
        """The MAC-bound ideal of one decode step with a full ring: ``G·2·W·d/(P·M)``."""
        return self._G * 2 * self._W * self._d // (self._P * self._M)

    def _ring_port_decode(self, m, busy, lane_depth):
        """The ring port's byte address as a bank word: ``address = ((((ring*2 + kind)*W +
        slot)*d + dim)*EB + byte``, every field a power of two, so each is a bit field; the slot
        gives the lane and the slot within it, the dimension the chunk and the element within
        the word. Returns the bank word of this clock's address, ``(lane, byte_in_word,
        read_ok)`` registered for the read data one clock later, and the registered write (a
        dict: ``we``, ``word``, ``byte``, ``lane``, ``data``)."""
        d, W, P, M = self._d, self._W, self._P, self._M
        S, CH = W // P, d // M
        EB = self._nx.elem_bytes
        LEB = log2_exact(EB)
        total = ring_space(self._L, self._Hkv, W, d, EB)    # bytes behind the ring port
        dma_in = Signal()
        elem_addr = self.ring.ring_addr[LEB:]
        dma_byte = self.ring.ring_addr[:LEB] if EB > 1 else Const(0, 1)
        dma_dim = elem_addr[:log2_exact(d)] if d > 1 else Const(0, 1)
        dma_slot = elem_addr[log2_exact(d):log2_exact(d) + log2_exact(W)] if W > 1 else Const(0, 1)
        dma_rk = Signal(32)
        m.d.comb += [
            dma_in.eq(self.ring.ring_addr < total),
            dma_rk.eq(elem_addr >> (log2_exact(d) + log2_exact(W))),
        ]
        dma_lane = Signal(range(P))
        dma_t = Signal(range(S))
        dma_c = Signal(range(CH))
        dma_b = Signal(range(M))
        dma_bb = Signal(range(M * EB))  # the byte within the bank word
        dma_word = Signal(range(lane_depth))
        m.d.comb += [
            dma_lane.eq(dma_slot >> log2_exact(S)),
            dma_t.eq(dma_slot & (S - 1)),
            dma_c.eq(dma_dim >> log2_exact(M)),
            dma_b.eq(dma_dim & (M - 1)),
            dma_word.eq(Cat(dma_c, dma_t, dma_rk)),
            dma_bb.eq(dma_b * EB + dma_byte),
        ]
        dma_rd_lane = Signal(range(P))
        dma_rd_b = Signal(range(M * EB))
        dma_rd_ok = Signal()
        # a write is registered here and reaches the lanes' banks one clock later: the banks
        # are spread over the chip, and the DMA's byte loop -> strobe -> every bank's write
        # enable in one clock was the 60 MHz board build's critical path (15.94 ns, 13.35 of
        # it routing). A write strobed while idle lands even if a command was taken in its
        # clock (the lanes give ``port_we`` priority over ``busy``: the command's first K/V
        # beat is written two clocks after it is taken at the earliest).
        wr = {"we": Signal(name="port_wr_we"),
              "word": Signal(range(lane_depth), name="port_wr_word"),
              "byte": Signal(range(M * EB), name="port_wr_byte"),
              "lane": Signal(range(P), name="port_wr_lane"),
              "data": Signal(32 if self.takes_wide_writes else 8, name="port_wr_data"),
              "wide": Signal(name="port_wr_wide")}
        m.d.sync += [wr["we"].eq(self.ring.ring_we & dma_in & ~busy), wr["word"].eq(dma_word),
                     wr["byte"].eq(dma_bb), wr["lane"].eq(dma_lane),
                     wr["data"].eq(self.ring.ring_wdata),
                     wr["wide"].eq(self.ring.ring_wide)]
        # a read in the clock of a write, or in the clock after it (while the registered write
        # lands), returns 0: a used bank read never meets a write
        m.d.sync += [dma_rd_lane.eq(dma_lane), dma_rd_b.eq(dma_bb),
                     dma_rd_ok.eq(self.ring.ring_re & ~self.ring.ring_we & ~wr["we"] & dma_in
                                  & ~busy)]
        return dma_word, dma_rd_lane, dma_rd_b, dma_rd_ok, wr

    def elaborate(self, platform):
        m = Module()
        L, Hkv, d, W, P, M, G = (self._L, self._Hkv, self._d, self._W, self._P, self._M,
                                 self._G)
        nx = self._nx
        # the sizes and widths (ringkv/defs/numerics.py, host/golden/fixed.py) that the lanes
        # and the merge unit are built with
        lp = LaneParams.of(layers=L, kv_heads=Hkv, head_dim=d, window=W, lanes=P, macs=M,
                           group=G, numerics=nx, score_consts=self._cs_layers)
        S, CH, R, GP = lp.slots, lp.chunks, lp.rings, lp.group_pow2
        lane_depth = lp.bank_depth
        EW = nx.elem_bits               # q/k/v element bits
        SW, LW, LSW = lp.score_width, lp.lsum_width, lp.merged_width
        ADD_LAT_M = math.ceil(log2_exact(P) / 2)     # the output tree's registered stages

        # ---- timing rules of this datapath (LFE5U-85F, nextpnr's timing model) ----
        # * A DP16KD (the K/V banks, the exp tables) has a clock-to-output of about 5.6 ns: its
        #   read data goes straight into a register, never through logic first.
        # * A MULT18X18D is used without its internal registers (yosys does not pack them) and
        #   takes about 4 ns: every multiplier has registered operands (any selection happens
        #   before the operand register) and a registered product, with no adder behind.
        #   Products wider than 18x18 are split by hand into 18x18 parts whose sum is formed
        #   in the next stage.
        # * Selections across lanes or heads and the adders that follow them are separated by
        #   a register (the merge unit's max tree, the operand selects of the shared merge
        #   multipliers, the shifts of alpha*R and of the accumulators).
        # * Nets that fan out to many cells (ring metadata enables, K/V bank enables, the
        #   accumulator shift) start at flip-flops at most one gate away; see the comments at
        #   each (routing, not logic, dominates the paths on this device).
        # The extra stages add a fixed number of clocks per token and per query head (see the
        # docstring), never a clock inside the MAC loop.

        # ---- the score constant: one for every layer, or the command's layer's (a register
        # loaded with the command, so the multipliers keep registered operands) ----
        if len(set(self._cs_layers)) > 1:
            cs_op = Signal(range(max(self._cs_layers) + 1))
            cs_table = Array(Const(c, cs_op.shape()) for c in self._cs_layers)
        else:
            cs_op, cs_table = self._cs_layers[0], None

        # ---- metadata per ring ----
        ring_count = Array(Signal(32, name=f"ring_count{r}") for r in range(R))
        ring_head = Array(Signal(range(W), name=f"ring_head{r}", init=W - 1) for r in range(R))

        # ---- command latch and FSM state ----
        cmd_op = Signal(AttnOp)
        cmd_left = Signal(16)           # tokens still to process
        cmd_err = Signal(AttnErr)
        ring = Signal(range(R))
        cur_count = Signal(32)
        cur_count_inc = Signal(32)
        busy = Signal()
        m.d.comb += self.busy.eq(busy)

        # ---- memories ----
        # word addresses are bit fields (every size below is a power of two): q word
        # ``g*CH + c``, K/V word ``((ring*2 + kind)*S + t)*CH + c``, score ``t*GP + g``
        q_mem = memory.Memory(shape=unsigned(EW * M), depth=GP * CH, init=[])
        m.submodules.q_mem = q_mem
        q_wr = q_mem.write_port()
        q_rd = q_mem.read_port(transparent_for=())
        q_word = Signal(EW * M)         # q_rd.data, registered
        m.d.sync += q_word.eq(q_rd.data)

        out_fifo = fifo.SyncFIFO(width=16 * M, depth=G * CH)
        m.submodules.out_fifo = out_fifo
        m.d.comb += [
            self.o.valid.eq(out_fifo.r_rdy),
            self.o.payload.eq(out_fifo.r_data),
            out_fifo.r_en.eq(self.o.ready),
        ]

        # ---- shared schedule: phases A (scores), B (exp, P*V), merge ----
        phase = Signal(2)
        nvalid = Signal(range(W + 1))   # valid slots after the write
        tcount = Signal(range(S + 1))   # lane 0's valid slots: the lockstep loop length
        it_t = Signal(range(S))
        it_c = Signal(range(CH))
        it_g = Signal(range(G))
        issue = Signal()

        # pipeline stages (k = clocks after the issue of (t, c, g)):
        # phase A: A1 q/k words out of the memories; A2 registered; A3 opa/opb; A4 products;
        #   A4+ADD_LAT_A dot sum; +1 dot accumulated; +2 dot*CS in two parts; +3 score
        #   (stored, running max updated at the end of that clock)
        # phase B: B1 score -> y = m - s; B2 exp table address; B3 table word; B4 registered;
        #   B5 p; B6 opa/opb; B7 product -> accumulator register, lane sum; B8 accumulator
        #   stored after the lane's last slot
        TA = lp.dot_latency             # dot sum valid
        LAT_A = lp.score_latency        # issue -> score stored (the phase A drain)
        TB = lp.pv_latency              # p*v product valid
        LAT_B = lp.acc_latency          # issue -> accumulator stored (the phase B drain)

        # tag pipeline: what was issued k cycles ago
        tag_layout = lp.tag_layout()
        DEPTH = max(TA, TB + 1) + 1
        tags = [Signal(tag_layout, name=f"tag{k}") for k in range(DEPTH)]
        m.d.comb += [tags[0].valid.eq(issue), tags[0].t.eq(it_t), tags[0].c.eq(it_c),
                     tags[0].g.eq(it_g), tags[0].last_t.eq(it_t == tcount - 1)]
        for k in range(1, DEPTH):
            m.d.sync += tags[k].eq(tags[k - 1])

        # ring port decode: byte address = element address * EB + byte
        (dma_word, dma_rd_lane, dma_rd_b, dma_rd_ok,
         port_wr) = self._ring_port_decode(m, busy, lane_depth)

        # load: beat c of vector v (v < G: query g = v; v = G: k; v = G + 1: v)
        load_c = Signal(range(CH))
        load_vec = Signal(range(G + 2))
        # the new token's slot, registered: ring_head only changes at the end of a token's load
        # or while idle, and the first k beat comes at least one clock into LOAD
        new_slot = Signal(range(W))
        m.d.sync += new_slot.eq(Mux(ring_head[ring] == W - 1, 0, ring_head[ring] + 1))
        # in_load, load_is_kv and load_kind are registers kept with the beat counters, so
        # that the K/V bank write enables are one gate away from flip-flops
        in_load = Signal()              # the FSM is in LOAD
        load_beat = Signal()            # an i beat is transferred this cycle
        load_kind = Signal()            # 0 = K, 1 = V (vector load_vec)
        load_is_kv = Signal()           # load_vec >= G
        m.d.comb += [
            load_beat.eq(in_load & self.i.valid),
            q_wr.addr.eq(Cat(load_c, load_vec[:len(it_g)])),
            q_wr.data.eq(self.i.payload.as_value()),
            q_wr.en.eq(load_beat & ~load_is_kv),
            q_rd.addr.eq(Cat(it_c, it_g)),
        ]
        new_lane = Signal(range(P))
        new_t = Signal(range(S))
        m.d.comb += [new_lane.eq(new_slot >> log2_exact(S)), new_t.eq(new_slot & (S - 1))]

        # ---- merge unit state ----
        mg_g = Signal(range(G))
        mg_i = Signal(range(P + 8))
        mg_step = Signal(range(64))
        # the merge unit (hw/attention/merge.py), driven from the MERGE_* states
        m.submodules.lane_max = lane_max = LaneMax(P, SW)
        m.submodules.weight_sum = weight_sum = WeightSum(LW, LSW)
        m.submodules.recip = recip = Reciprocal(LSW)
        m.submodules.beta_unit = beta_unit = BetaUnit(P, lp.amt_width)
        m.submodules.out_tree = out_tree = OutputTree(P, M)
        mg_m = lane_max.max             # global max of head mg_g
        mg_issue = Signal()
        mg_c = Signal(range(CH))

        word_issue = Signal(range(lane_depth))
        m.d.comb += word_issue.eq(Cat(it_c, it_t, phase == PH_B, ring))
        load_word_d = Signal(range(lane_depth))
        load_data_d = Signal(EW * M)
        m.d.sync += [load_word_d.eq(Cat(load_c, new_t, load_kind, ring)),
                     load_data_d.eq(self.i.payload.as_value())]

        # ---- the lanes (hw/attention/lane.py) ----
        lanes = []
        for lane in range(P):
            if cs_table is None:
                ln = AttentionLane(lp, lane, score_const=cs_op)
            else:
                ln = AttentionLane(lp, lane, cs_width=len(cs_op))
                m.d.comb += ln.cs.eq(cs_op)
            m.submodules[f"lane{lane}"] = ln
            lanes.append(ln)
            m.d.comb += [
                ln.busy.eq(busy), ln.phase.eq(phase), ln.nvalid.eq(nvalid),
                ln.issue_word.eq(word_issue),
                ln.kv_load.eq(load_beat & load_is_kv), ln.new_lane.eq(new_lane),
                ln.load_word.eq(load_word_d), ln.load_data.eq(load_data_d),
                ln.port_word.eq(dma_word), ln.port_rsel.eq(dma_rd_b),
                ln.port_we.eq(port_wr["we"]), ln.port_wword.eq(port_wr["word"]),
                ln.port_wbyte.eq(port_wr["byte"]), ln.port_wlane.eq(port_wr["lane"]),
                ln.port_wdata.eq(port_wr["data"]), ln.port_wwide.eq(port_wr["wide"]),
                ln.q_word.eq(q_word),
                ln.tag_dot.eq(tags[TA]), ln.tag_y.eq(tags[1]), ln.tag_pv0.eq(tags[TB - 1]),
                ln.tag_pv.eq(tags[TB]), ln.tag_store.eq(tags[TB + 1]),
                ln.score_raddr.eq(Cat(it_g, it_t)),
                ln.mg_g.eq(mg_g), ln.mg_max.eq(mg_m), ln.mg_c.eq(mg_c),
                ln.e.eq(recip.e),
                ln.beta_we.eq(beta_unit.beta_valid), ln.beta_lane.eq(beta_unit.beta_lane),
                ln.beta.eq(beta_unit.beta),
            ]
        self._lanes, self._phase = lanes, phase     # for the tests of the lanes' state
        lane_alpha = [ln.alpha for ln in lanes]
        lane_live = [ln.live for ln in lanes]

        # ---- merge: global max over the live lanes (LaneMax), the sums of l * alpha
        # (WeightSum), the reciprocal, the lanes' beta (BetaUnit), the output tree ----
        for lane in range(P):
            m.d.comb += [lane_max.values[lane].eq(lanes[lane].m_head),
                         lane_max.live[lane].eq(lane_live[lane])]
        MAX_LAT = lane_max.latency
        m.d.comb += [weight_sum.l.eq(Array(ln.l_head for ln in lanes)[mg_i]),
                     weight_sum.alpha.eq(Array(lane_alpha)[mg_i]),
                     recip.divisor.eq(weight_sum.total),
                     beta_unit.alpha.eq(Array(lane_alpha)[mg_i]),
                     beta_unit.amt.eq(Array(ln.amt for ln in lanes)[mg_i]),
                     beta_unit.lane.eq(mg_i),
                     beta_unit.recip.eq(recip.quotient)]

        # ---- merge across lanes: the output tree behind the lanes' products (M5) ----
        OUT_LAT = 6 + ADD_LAT_M         # M0 issue .. M5 prod, the tree, the rounded word
        assert OUT_LAT == 5 + out_tree.latency
        mg_tags = [Signal(name=f"mg_v{k}") for k in range(6)]
        m.d.comb += mg_tags[0].eq(mg_issue)
        for k in range(1, 6):
            m.d.sync += mg_tags[k].eq(mg_tags[k - 1])
        for lane in range(P):
            for k in range(M):
                m.d.comb += out_tree.products[lane][k].eq(lanes[lane].products[k])
        m.d.comb += [out_tree.valid.eq(mg_tags[5]),
                     out_fifo.w_data.eq(out_tree.o.as_value()),
                     out_fifo.w_en.eq(out_tree.o_valid)]

        # ---- meta port ----
        meta_ok = Signal()
        m.d.comb += meta_ok.eq(self.ring.meta_ring < R)
        m.d.comb += [
            self.ring.meta_count.eq(Mux(meta_ok, ring_count[self.ring.meta_ring], 0)),
            self.ring.meta_head.eq(Mux(meta_ok, ring_head[self.ring.meta_ring], 0)),
        ]
        with m.If(self.ring.meta_we & ~busy & meta_ok & (self.ring.meta_whead < W)):
            m.d.sync += [ring_count[self.ring.meta_ring].eq(self.ring.meta_wcount),
                         ring_head[self.ring.meta_ring].eq(self.ring.meta_whead)]

        # ---- bank collisions ----
        # A read whose data is used never meets a write of the same bank word in the same
        # clock: while busy, words are read only when issued in RUN, and the only write in RUN
        # (its first clock) is the new token's last v word while phase A reads K words; while
        # idle, the ring port's read is used only without a write in this clock or the one
        # before (the registered write lands a clock after its strobe). So synthesis may treat a
        # collision as undefined (YOSYS_AFTER_READ). ``collision_used`` is 1 in a clock that
        # breaks this rule; nothing in the design reads it (synthesis removes it), the
        # simulation tests assert that it stays 0.
        collision_used = Signal()
        read_used = Mux(busy, issue, self.ring.ring_re & ~self.ring.ring_we & ~port_wr["we"])
        m.d.comb += collision_used.eq(read_used & Cat(*[ln.collides for ln in lanes]).any())
        self._collision_used = collision_used

        # ring port read data, two clocks after ring_re: the addressed byte of every lane's
        # word is registered next to that lane's banks (the banks are spread over the chip and
        # have no output register: a bank -> byte -> lane -> DMA path in one clock was the
        # board build's critical path), then the addressed lane's byte is selected
        lane_bytes = [ln.rbyte for ln in lanes]
        rd_lane_q = Signal(range(P))
        rd_ok_q = Signal()
        m.d.sync += [rd_lane_q.eq(dma_rd_lane), rd_ok_q.eq(dma_rd_ok)]
        m.d.comb += self.ring.ring_rdata.eq(Mux(rd_ok_q, Array(lane_bytes)[rd_lane_q], 0))

        # the ring's new head and count are stored one clock after the token's last beat
        # (from registers: the enables of the 8-way metadata registers stay off the load's
        # beat counting); nothing reads them before the next token or the status
        commit = Signal()
        clear_mask = Signal(R)
        m.d.sync += commit.eq(0)
        with m.If(commit):
            m.d.sync += [ring_head[ring].eq(new_slot), ring_count[ring].eq(cur_count_inc)]

        # ---- the FSM ----
        drain = Signal(range(32))
        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    p = self.cmd.payload
                    m.d.sync += [cmd_op.eq(p.op), cmd_left.eq(p.count), busy.eq(1)]
                    bad_range = (p.layer >= L) | ((p.op == AttnOp.ATTEND) & (p.kv_head >= Hkv))
                    # the rings a CLEAR empties, decided here so that CLEAR is a plain write
                    m.d.sync += clear_mask.eq(Cat(*[
                        (p.op == AttnOp.CLEAR_ALL) | (p.layer == r // Hkv) for r in range(R)]))
                    with m.If(p.op == AttnOp.RESERVED):
                        m.d.sync += cmd_err.eq(AttnErr.OP)
                        m.next = "STATUS"
                    with m.Elif((p.op != AttnOp.CLEAR_ALL) & bad_range):
                        m.d.sync += cmd_err.eq(AttnErr.RANGE)
                        m.next = "STATUS"
                    with m.Elif((p.op == AttnOp.ATTEND) & (p.count == 0)):
                        m.d.sync += cmd_err.eq(AttnErr.COUNT)
                        m.next = "STATUS"
                    with m.Else():
                        if cs_table is not None:
                            m.d.sync += cs_op.eq(cs_table[p.layer[:max(1, _bits(L - 1))]])
                        m.d.sync += [cmd_err.eq(AttnErr.NONE),
                                     ring.eq(p.layer[:8] * Hkv + p.kv_head),
                                     load_c.eq(0), load_vec.eq(0), load_is_kv.eq(0),
                                     load_kind.eq(0)]
                        with m.If(p.op == AttnOp.ATTEND):
                            m.d.sync += in_load.eq(1)
                            m.next = "LOAD"
                        with m.Else():
                            m.next = "CLEAR"
            with m.State("CLEAR"):
                for r in range(R):
                    with m.If(clear_mask[r]):
                        m.d.sync += [ring_count[r].eq(0), ring_head[r].eq(W - 1)]
                m.next = "STATUS"
            with m.State("LOAD"):
                # the ring's count + 1 is ready two clocks into LOAD; a token has at least
                # three beats, so the last beat always sees it (keeps the 32-bit mux and adder
                # off the critical path)
                m.d.sync += [cur_count.eq(ring_count[ring]), cur_count_inc.eq(cur_count + 1)]
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += load_c.eq(load_c + 1)
                    with m.If(load_c == CH - 1):
                        m.d.sync += [load_c.eq(0), load_vec.eq(load_vec + 1),
                                     load_is_kv.eq(load_vec + 1 >= G),
                                     load_kind.eq(load_vec + 1 == G + 1)]
                        with m.If(load_vec == G + 1):
                            new_count = cur_count_inc
                            m.d.sync += [
                                load_vec.eq(0), load_is_kv.eq(0), load_kind.eq(0),
                                in_load.eq(0),
                                commit.eq(1),
                                nvalid.eq(Mux(new_count >= W, W, new_count)),
                                tcount.eq(Mux(new_count >= S, S, new_count)),
                                phase.eq(PH_A), it_t.eq(0), it_c.eq(0), it_g.eq(0),
                            ]
                            m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += issue.eq(1)

                last_g = it_g == G - 1
                last_c = it_c == CH - 1
                last_t = it_t == tcount - 1
                with m.If(phase == PH_A):
                    # t, c, g (g innermost): one K word serves the G queries
                    m.d.sync += it_g.eq(Mux(last_g, 0, it_g + 1))
                    with m.If(last_g):
                        m.d.sync += it_c.eq(Mux(last_c, 0, it_c + 1))
                        with m.If(last_c):
                            m.d.sync += it_t.eq(it_t + 1)
                            with m.If(last_t):
                                m.d.sync += [it_t.eq(0), drain.eq(0)]
                                m.next = "DRAIN"
                with m.Else():
                    # g, c, t (t innermost): each accumulator sums over consecutive clocks
                    m.d.sync += it_t.eq(Mux(last_t, 0, it_t + 1))
                    with m.If(last_t):
                        m.d.sync += it_c.eq(Mux(last_c, 0, it_c + 1))
                        with m.If(last_c):
                            m.d.sync += it_g.eq(it_g + 1)
                            with m.If(last_g):
                                m.d.sync += [it_g.eq(0), drain.eq(0)]
                                m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.sync += drain.eq(drain + 1)
                with m.If(phase == PH_A):
                    with m.If(drain == LAT_A - 1):
                        m.d.sync += phase.eq(PH_B)
                        m.next = "RUN"
                with m.Else():
                    with m.If(drain == LAT_B - 1):
                        m.d.sync += [phase.eq(PH_M), mg_g.eq(0)]
                        m.next = "MERGE_WAIT"
            with m.State("MERGE_WAIT"):
                # the output FIFO holds one token: wait until the previous one has left
                with m.If(out_fifo.level == 0):
                    m.d.sync += mg_step.eq(0)
                    m.next = "MERGE_ALPHA"
            with m.State("MERGE_ALPHA"):
                # the max tree gives mg_m at step MAX_LAT; then y <- m - m_lane (+1), table
                # address (+2), table word (+3), p_reg (+4): latch alpha
                m.d.sync += mg_step.eq(mg_step + 1)
                with m.If(mg_step == MAX_LAT + 4):
                    m.d.comb += [ln.alpha_latch.eq(1) for ln in lanes]
                    m.d.comb += weight_sum.clear.eq(1)
                    m.d.sync += mg_i.eq(0)
                    m.next = "MERGE_SUM"
            with m.State("MERGE_SUM"):
                m.d.sync += mg_i.eq(mg_i + 1)
                m.d.comb += weight_sum.valid.eq(mg_i < P)
                with m.If(mg_i == P + 2):        # the last term is summed in this clock
                    m.next = "MERGE_LOG"
            with m.State("MERGE_LOG"):
                m.d.sync += mg_step.eq(0)
                m.next = "MERGE_DIVIDE"
            with m.State("MERGE_DIVIDE"):
                # restoring division: R = 2**(e+16) // L, 18 quotient bits
                m.d.sync += mg_step.eq(mg_step + 1)
                with m.If(mg_step == 17):
                    m.d.sync += mg_i.eq(0)
                    m.next = "MERGE_BETA"
            with m.State("MERGE_BETA"):
                m.d.sync += mg_i.eq(mg_i + 1)
                m.d.comb += beta_unit.valid.eq(mg_i < P)
                with m.If(mg_i == P + 3):        # the last beta is written in this clock
                    m.d.sync += mg_c.eq(0)
                    m.next = "MERGE_OUTPUT"
            with m.State("MERGE_OUTPUT"):
                m.d.comb += mg_issue.eq(1)
                m.d.sync += mg_c.eq(mg_c + 1)
                with m.If(mg_c == CH - 1):
                    m.d.sync += mg_c.eq(0)
                    with m.If(mg_g == G - 1):
                        m.d.sync += drain.eq(0)
                        m.next = "MERGE_DRAIN"
                    with m.Else():
                        m.d.sync += [mg_g.eq(mg_g + 1), mg_step.eq(0)]
                        m.next = "MERGE_ALPHA"
            with m.State("MERGE_DRAIN"):
                m.d.sync += drain.eq(drain + 1)
                with m.If(drain == OUT_LAT - 1):
                    m.d.sync += cmd_left.eq(cmd_left - 1)
                    with m.If(cmd_left == 1):
                        m.next = "STATUS"
                    with m.Else():
                        m.d.sync += in_load.eq(1)
                        m.next = "LOAD"
            with m.State("STATUS"):
                m.d.comb += [
                    self.status.valid.eq(1),
                    self.status.payload.op.eq(cmd_op),
                    self.status.payload.err.eq(cmd_err),
                    self.status.payload.count.eq(
                        Mux((cmd_err == AttnErr.NONE) & (cmd_op == AttnOp.ATTEND),
                            ring_count[ring], 0)),
                ]
                with m.If(self.status.ready):
                    m.d.sync += busy.eq(0)
                    m.next = "IDLE"
        # the reciprocal's load and steps; each lane's amt (from e and its sh) in every step
        m.d.comb += [recip.load.eq(fsm.ongoing("MERGE_LOG")),
                     recip.step.eq(fsm.ongoing("MERGE_DIVIDE"))]
        m.d.comb += [ln.amt_update.eq(fsm.ongoing("MERGE_DIVIDE")) for ln in lanes]
        return m
