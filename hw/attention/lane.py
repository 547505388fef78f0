"""One split-KV lane of the attention core: its K/V bank, its scores, its online-softmax state
and its share of the merge, on ``M`` multipliers shared by all three.

:class:`~ringkv.hw.attention.AttentionCore` makes ``P`` of these, one per contiguous segment of
``S = W / P`` ring slots, and drives them in lockstep from its sequencer (the loop counters,
the phase and the tag pipeline that says what was issued ``k`` clocks ago). Per token and query
head ``g`` the lane ends phase B with the golden model's lane state
(``ringkv.host.golden.fixed.lane_state`` over its valid slots): the max score ``m[g]``, the sum
of weights ``l[g]`` and the accumulator ``acc[g]`` (a ``d``-vector in its accumulator memory).
In the merge it forms ``alpha = exp2_fx(m - m[g])`` on its exp table, its ``sh``, ``amt`` and
``a = acc >> sh``, and multiplies ``a`` by the ``beta`` the merge unit writes back.

Timing (the core's docstring gives the clocks per token): phase A's score is stored
``LaneParams.score_latency`` clocks after its issue, phase B's accumulator
``LaneParams.acc_latency`` clocks after; in the merge, a product ``a * beta`` is on
``products`` 5 clocks after the accumulator read is issued. The lane has no backpressure: the
sequencer issues at most one (slot, chunk, head) per clock and never stalls a pipeline.
"""

import math
from dataclasses import dataclass

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import log2_exact
from ringkv.defs.numerics import CS_SHIFT, EXP_TABLE

from .merge import registered_sum, tree_stages

__all__ = ["LaneParams", "AttentionLane", "PH_A", "PH_B", "PH_M"]

#: the sequencer's phases: scores (A), exp weights and p*v (B), merge (M)
PH_A, PH_B, PH_M = 0, 1, 2


def _bits(x):
    """Bits of a non-negative integer (at least 1)."""
    return max(int(x).bit_length(), 1)


@dataclass(frozen=True)
class LaneParams:
    """The sizes and widths a lane is built with; :meth:`of` derives them from the core's
    parameters (see ``ringkv/defs/numerics.py`` and ``host/golden/fixed.py`` for the
    formats)."""

    lanes: int          # P
    slots: int          # S = W / P, ring slots per lane
    chunks: int         # CH = d / M, words per vector
    group: int          # G, query heads per KV head
    group_pow2: int     # GP, G rounded up to a power of two (the memories' head field)
    rings: int          # R = L * Hkv
    macs: int           # M
    elem_bits: int      # EW
    elem_bytes: int     # EB
    dot_shift: int      # DSH: the score uses dot >> DSH
    acc_shift_bits: int  # ASH: sh = bitlength(l) - ASH
    beta_shift: int     # BSH: amt = e + BSH - sh
    score_width: int    # SW, signed
    diff_width: int     # YW, m - s, unsigned
    lsum_width: int     # LW, the lane's sum of weights
    acc_width: int      # AW, the lane accumulator, signed
    merged_width: int   # LSW, the merged L
    dot_width: int      # DW, the dot product, signed

    @classmethod
    def of(cls, *, layers, kv_heads, head_dim, window, lanes, macs, group, numerics,
           score_consts):
        EW = numerics.elem_bits
        S = window // lanes
        dot_max = head_dim * (1 << (2 * EW - 2))
        s_max = ((dot_max >> numerics.dot_shift) * max(score_consts) >> CS_SHIFT) + 1
        LW = 16 + log2_exact(S) + 1
        return cls(
            lanes=lanes, slots=S, chunks=head_dim // macs, group=group,
            group_pow2=1 << math.ceil(math.log2(group)) if group > 1 else 1,
            rings=layers * kv_heads, macs=macs, elem_bits=EW, elem_bytes=numerics.elem_bytes,
            dot_shift=numerics.dot_shift, acc_shift_bits=numerics.acc_shift_bits,
            beta_shift=numerics.beta_shift,
            score_width=_bits(s_max) + 1, diff_width=_bits(2 * s_max), lsum_width=LW,
            acc_width=EW + 16 + log2_exact(S) + 1,
            merged_width=LW + log2_exact(lanes) + 1, dot_width=_bits(dot_max) + 2)

    @property
    def window(self):
        return self.lanes * self.slots

    @property
    def bank_depth(self):
        """Words of the K/V bank: ``2·R·S·CH`` (ring, kind, slot and chunk as bit fields)."""
        return 2 * self.rings * self.slots * self.chunks

    @property
    def tree_latency(self):
        """Registered stages of the adder tree over the ``M`` products (one per two levels)."""
        return tree_stages(self.macs)

    @property
    def dot_latency(self):
        """Clocks from a phase A issue to its dot sum (``A4`` + the tree)."""
        return 4 + self.tree_latency

    @property
    def score_latency(self):
        """Clocks from a phase A issue to its score stored (the phase A drain)."""
        return self.dot_latency + 3

    #: clocks from a phase B issue to its ``p * v`` product
    pv_latency = 7

    @property
    def acc_latency(self):
        """Clocks from a phase B issue to the accumulator stored (the phase B drain)."""
        return self.pv_latency + 2

    def tag_layout(self):
        """What the sequencer issued: ``valid``, slot ``t``, chunk ``c``, head ``g``, and
        ``last_t`` (the last valid slot of lane 0)."""
        return data.StructLayout({"valid": 1, "t": range(self.slots), "c": range(self.chunks),
                                  "g": range(self.group), "last_t": 1})

    @property
    def amt_width(self):
        """Width of ``amt = max(e + BSH - sh, 0)``."""
        return len(Signal(range(self.merged_width + self.beta_shift + 2)))


class AttentionLane(wiring.Component):
    """Lane ``index``: slots ``index·S .. (index+1)·S - 1`` of every ring.

    Ports (all driven by the core's sequencer unless said otherwise):

    * ``busy``: the core works on a command (the bank follows the sequencer, else the ring
      port); ``phase`` (:data:`PH_A`, :data:`PH_B`, :data:`PH_M`); ``nvalid``: the ring's valid
      slots after the token's write.
    * bank: ``issue_word`` (the word the sequencer reads while busy); the token's k/v load:
      ``kv_load`` (a k or v beat this clock), ``new_lane`` (the lane of the new slot: the beat
      is written here only when it is ``index``), ``load_word``/``load_data`` (the word and
      data, registered: written one clock after ``kv_load``); the ring port while idle:
      ``port_word`` (the word read), ``port_rsel`` (the byte read, one clock after its
      address); a write, registered in the core one clock after the port's strobe:
      ``port_we``, ``port_wword``, ``port_wbyte`` (the byte within the word), ``port_wlane``,
      ``port_wdata`` (a byte in the low 8 bits), ``port_wwide`` (four bytes of ``port_wdata``
      at a four-aligned ``port_wbyte``; none when ``M * EB`` is not a multiple of 4).
    * ``rbyte`` (Out): byte ``port_rsel`` of the bank word read the clock before, registered
      next to the bank. ``collides`` (Out): this clock's bank read and write hit the same word
      (a simulation probe; nothing in the design uses it).
    * ``q_word``: the query word of the issue, registered (phase A's operand).
    * tags: ``tag_dot`` (the issue ``dot_latency`` clocks ago), ``tag_y`` (1 ago),
      ``tag_pv0`` (``pv_latency - 1`` ago), ``tag_pv`` (``pv_latency`` ago), ``tag_store``
      (``pv_latency + 1`` ago); ``score_raddr``: the score memory's read address ``{t, g}``.
    * ``cs`` (only when built with ``score_const=None``): the command's layer's score
      constant, which the lane copies into its own register (its net stays local).
    * merge: ``mg_g`` (the head), ``mg_max`` (the largest lane max of that head, from the
      merge unit), ``mg_c`` (the accumulator word to read), ``alpha_latch`` (store ``alpha``,
      0 for an empty lane), ``amt_update`` with ``e`` (store ``amt = max(e + BSH - sh, 0)``),
      ``beta_we``/``beta_lane``/``beta`` (the merge unit's beta for lane ``beta_lane``).
    * Out: ``live`` (the lane has a valid slot), ``m_head``/``l_head`` (``m[mg_g]``,
      ``l[mg_g]``), ``alpha``, ``amt``, ``products`` (the ``M`` multiplier outputs, registered:
      ``a * beta`` in the merge).
    """

    def __init__(self, params: LaneParams, index: int, *, score_const=None, cs_width=1):
        if not isinstance(params, LaneParams):
            raise TypeError(f"params must be a LaneParams, not {params!r}")
        if not 0 <= index < params.lanes:
            raise ValueError(f"index must be between 0 and {params.lanes - 1}, not {index!r}")
        self._p, self._index, self._cs = params, index, score_const
        p = params
        EW, M = p.elem_bits, p.macs
        tag = p.tag_layout()
        members = {
            "busy": In(1),
            "phase": In(2),
            "nvalid": In(range(p.window + 1)),
            "issue_word": In(range(p.bank_depth)),
            "kv_load": In(1),
            "new_lane": In(range(p.lanes)),
            "load_word": In(range(p.bank_depth)),
            "load_data": In(EW * M),
            "port_word": In(range(p.bank_depth)),
            "port_we": In(1),
            "port_wword": In(range(p.bank_depth)),
            "port_wbyte": In(range(M * p.elem_bytes)),
            "port_wlane": In(range(p.lanes)),
            "port_wdata": In(32),
            "port_wwide": In(1),
            "port_rsel": In(range(M * p.elem_bytes)),
            "rbyte": Out(8),
            "collides": Out(1),
            "q_word": In(EW * M),
            "tag_dot": In(tag),
            "tag_y": In(tag),
            "tag_pv0": In(tag),
            "tag_pv": In(tag),
            "tag_store": In(tag),
            "score_raddr": In(range(p.slots * p.group_pow2)),
            "mg_g": In(range(p.group)),
            "mg_max": In(signed(p.score_width)),
            "mg_c": In(range(p.chunks)),
            "alpha_latch": In(1),
            "amt_update": In(1),
            "e": In(range(p.merged_width + 1)),
            "beta_we": In(1),
            "beta_lane": In(range(p.lanes)),
            "beta": In(18),
            "live": Out(1),
            "m_head": Out(signed(p.score_width)),
            "l_head": Out(p.lsum_width),
            "alpha": Out(16),
            "amt": Out(p.amt_width),
            "products": Out(data.ArrayLayout(signed(36), M)),
        }
        if score_const is None:
            members["cs"] = In(cs_width)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        p, lane = self._p, self._index
        S, CH, G, GP, M = p.slots, p.chunks, p.group, p.group_pow2, p.macs
        EW, EB = p.elem_bits, p.elem_bytes
        SW, YW, LW, AW, DW = p.score_width, p.diff_width, p.lsum_width, p.acc_width, p.dot_width
        DSH, ASH, BSH = p.dot_shift, p.acc_shift_bits, p.beta_shift
        PW = 2 * EW + 1                 # q*k product, signed
        phase = self.phase

        kv_mem = memory.Memory(shape=unsigned(EW * M), depth=p.bank_depth, init=[])
        m.submodules.kv_mem = kv_mem
        kv_wr = kv_mem.write_port(granularity=8)
        kv_rd = kv_mem.read_port(transparent_for=())
        sc_mem = memory.Memory(shape=signed(SW), depth=S * GP, init=[])
        m.submodules.score_mem = sc_mem
        sc_wr = sc_mem.write_port()
        sc_rd = sc_mem.read_port(transparent_for=())
        acc_mem = memory.Memory(shape=data.ArrayLayout(signed(AW), M), depth=GP * CH, init=[])
        m.submodules.acc_mem = acc_mem
        acc_wr = acc_mem.write_port()
        acc_rd = acc_mem.read_port(domain="comb")
        exp_rom = memory.Memory(shape=16, depth=256, init=EXP_TABLE)
        m.submodules.exp_rom = exp_rom
        exp_rd = exp_rom.read_port(transparent_for=())

        m_reg = Array(Signal(signed(SW), name=f"m{g}") for g in range(G))
        l_reg = Array(Signal(LW, name=f"l{g}") for g in range(G))
        dacc = Array(Signal(signed(DW), name=f"dot{g}") for g in range(G))
        sh = Signal(range(LW + 1))
        beta = Signal(18)
        # the lane state, for the tests that compare it with the golden model's lane_state
        self._state = {"m": list(m_reg), "l": list(l_reg), "acc": acc_mem}
        m.d.comb += [self.live.eq(self.nvalid > lane * S),
                     self.m_head.eq(m_reg[self.mg_g]),
                     self.l_head.eq(l_reg[self.mg_g])]

        def slot_valid(t):
            return (lane * S + t) < self.nvalid

        # K/V bank: read address and writes (load, ring port). The read port is always
        # enabled: a read nobody asked for is never used (the pipeline follows the tags,
        # ring_rdata shows a word only two clocks after ring_re), and a clock enable would
        # fan out from the FSM to every DP16KD.
        with m.If(self.busy):
            m.d.comb += kv_rd.addr.eq(self.issue_word)
        with m.Else():
            m.d.comb += kv_rd.addr.eq(self.port_word)
        # a k/v beat is written one clock after its transfer, from registers (yosys adds
        # read/write collision logic behind the bank, which must start at flip-flops);
        # the last v beat lands in the first RUN clock, long before phase B reads it
        load_we = Signal()
        m.d.sync += load_we.eq(self.kv_load & (self.new_lane == lane))
        # a ring port write (registered in the core, strobed while idle) lands even in the
        # first busy clock: no load beat is written before the second
        with m.If(self.busy & ~self.port_we):
            m.d.comb += [
                kv_wr.addr.eq(self.load_word),
                kv_wr.data.eq(self.load_data),
                kv_wr.en.eq(Mux(load_we, (1 << (M * EB)) - 1, 0)),
            ]
        with m.Else():
            # a byte of the word, or (ring_wide) four bytes at a four-aligned byte of it; a
            # word of fewer than four bytes, or not whole groups of four, takes no wide write
            port_en = Signal(M * EB)
            byte_en = Const(1, M * EB) << self.port_wbyte
            byte_data = Cat(*[self.port_wdata[:8]] * (M * EB))
            if (M * EB) % 4 == 0:
                m.d.comb += port_en.eq(Mux(self.port_wwide,
                                           Const(0xF, M * EB) << self.port_wbyte, byte_en))
                wdata = Mux(self.port_wwide, Cat(*[self.port_wdata] * (M * EB // 4)), byte_data)
            else:
                m.d.comb += port_en.eq(Mux(self.port_wwide, 0, byte_en))
                wdata = byte_data
            m.d.comb += [
                kv_wr.addr.eq(self.port_wword),
                kv_wr.data.eq(wdata),
                kv_wr.en.eq(Mux(self.port_we & (self.port_wlane == lane), port_en, 0)),
            ]
        m.d.comb += self.collides.eq((kv_wr.en != 0) & (kv_rd.addr == kv_wr.addr))
        # the ring port's byte of the word, registered next to the bank (the banks are spread
        # over the chip and have no output register)
        m.d.sync += self.rbyte.eq(kv_rd.data.word_select(self.port_rsel, 8))

        # shared multiplier operands (signed 18 x signed 18 -> MULT18X18D)
        opa = [Signal(signed(18), name=f"opa{k}") for k in range(M)]
        opb = [Signal(signed(18), name=f"opb{k}") for k in range(M)]
        prod = [Signal(signed(36), name=f"prod{k}") for k in range(M)]
        for k in range(M):
            m.d.sync += prod[k].eq(opa[k] * opb[k])
            m.d.comb += self.products[k].eq(prod[k])

        # the bank word, registered (k in phase A, v in phase B), and its delay line
        v_d = [Signal(EW * M, name=f"vd{k}") for k in range(4)]
        m.d.sync += v_d[0].eq(kv_rd.data)
        for k in range(1, 4):
            m.d.sync += v_d[k].eq(v_d[k - 1])
        p_reg = Signal(17)
        p_d = [Signal(17, name=f"pd{k}") for k in range(2)]
        m.d.sync += [p_d[0].eq(p_reg), p_d[1].eq(p_d[0])]

        # merge: M0 issue (acc read); M1 acc word; M2 coarse shift; M3 a = acc >> sh;
        # M4 opa/opb; M5 prod
        acc_word = [Signal(signed(AW), name=f"accw{k}") for k in range(M)]
        a_reg = [Signal(signed(18), name=f"a{k}") for k in range(M)]
        with m.Switch(phase):
            with m.Case(PH_A):
                for k in range(M):
                    m.d.sync += [opa[k].eq(self.q_word.word_select(k, EW).as_signed()),
                                 opb[k].eq(v_d[0].word_select(k, EW).as_signed())]
            with m.Case(PH_B):
                for k in range(M):
                    m.d.sync += [opa[k].eq(p_reg),
                                 opb[k].eq(v_d[3].word_select(k, EW).as_signed())]
            with m.Default():
                for k in range(M):
                    m.d.sync += [opa[k].eq(a_reg[k]), opb[k].eq(beta)]

        # ---------- phase A: scores ----------
        # adder tree over the M products of q*k (at A4)
        dot_sum = registered_sum(m, [x[:PW].as_signed() for x in prod], PW,
                                 lambda stage, depth, j: f"tree{4 + stage}_{j}")  # at tag_dot
        ta = self.tag_dot
        dot_final = Signal(signed(DW))
        dot_tag = Signal(p.tag_layout())
        new_dot = Signal(signed(DW))
        m.d.comb += new_dot.eq(Mux(ta.c == 0, 0, dacc[ta.g]) + dot_sum)
        m.d.sync += dot_tag.valid.eq(0)
        with m.If((phase == PH_A) & ta.valid):
            m.d.sync += dacc[ta.g].eq(new_dot)
            with m.If(ta.c == CH - 1):
                m.d.sync += [dot_final.eq(new_dot), dot_tag.eq(ta)]
        # s = ((dot >> DSH) * CS) >> 18 with dot >> DSH = dot_hi * 2**17 + dot_lo (dot_lo
        # unsigned): the two partial products (17 x 17 bits and the rest) are registered,
        # then added. The shift by DSH (0 for fx1) is wiring.
        sc_tag = Signal(p.tag_layout())
        m.d.sync += sc_tag.eq(dot_tag)
        if self._cs is None:
            # the lane's own copy of the layer's constant (one clock after the command's
            # latch, long before its first score), so the constant's net stays local
            cs_lane = Signal.like(self.cs, name="cs")
            m.d.sync += cs_lane.eq(self.cs)
        else:
            cs_lane = self._cs
        dot_s = dot_final[DSH:].as_signed() if DSH else dot_final
        DSW = DW - DSH
        if DSW > 17:
            sc_lo = Signal(unsigned(17 + 17))
            sc_hi = Signal(signed(DSW - 17 + 18))
            m.d.sync += [sc_lo.eq(dot_s[:17] * cs_lane),
                         sc_hi.eq(dot_s[17:].as_signed() * cs_lane)]
            sc_prod = (sc_hi << 17) + sc_lo
        else:
            sc_prod = Signal(signed(DSW + 18))
            m.d.sync += sc_prod.eq(dot_s * cs_lane)
        s_val = Signal(signed(SW))
        s_tag = Signal(p.tag_layout())
        m.d.sync += [s_val.eq(sc_prod >> CS_SHIFT), s_tag.eq(sc_tag)]
        m.d.comb += [
            sc_wr.addr.eq(Cat(s_tag.g, s_tag.t)),
            sc_wr.data.eq(s_val),
            sc_wr.en.eq(s_tag.valid & (phase == PH_A)),
        ]
        with m.If(s_tag.valid & (phase == PH_A) & slot_valid(s_tag.t)):
            with m.If((s_tag.t == 0) | (s_val > m_reg[s_tag.g])):
                m.d.sync += m_reg[s_tag.g].eq(s_val)

        # ---------- phase B: exp weights and P*V ----------
        m.d.comb += sc_rd.addr.eq(self.score_raddr)
        y = Signal(YW)
        y_hi = Signal(YW)
        y_hi_d = Signal(YW)
        exp_word = Signal(16)
        # exp ROM address: phase B from y, merge from the LSE difference
        mg_diff = Signal(YW)
        lane_diff = Signal(YW)
        m.d.comb += mg_diff.eq(self.mg_max - m_reg[self.mg_g])
        m.d.comb += lane_diff.eq(m_reg[self.tag_y.g] - sc_rd.data)
        m.d.sync += y.eq(Mux(phase == PH_B, lane_diff, mg_diff))
        m.d.comb += exp_rd.addr.eq(y[:8])
        m.d.sync += [y_hi.eq(y >> 8), y_hi_d.eq(y_hi), exp_word.eq(exp_rd.data)]
        m.d.sync += p_reg.eq(Mux(y_hi_d >= 16, 0, exp_word >> y_hi_d[:4]))
        # Phase B runs t innermost (the core's RUN), so the accumulator of (g, c) is a
        # register summing over consecutive clocks, stored once after the last slot: no
        # read-modify-write of the accumulator memory in one clock.
        tb = self.tag_pv                # prod of (p, v) valid here
        tw = self.tag_store             # the accumulator of (tw.g, tw.c) is final here
        b_slot_ok = Signal()
        m.d.sync += b_slot_ok.eq(slot_valid(self.tag_pv0.t))
        acc_reg = [Signal(signed(AW), name=f"acc{k}") for k in range(M)]
        with m.If((phase == PH_B) & tb.valid):
            for k in range(M):
                m.d.sync += acc_reg[k].eq(Mux(tb.t == 0, 0, acc_reg[k])
                                          + Mux(b_slot_ok, prod[k][:EW + 16].as_signed(), 0))
        m.d.comb += [
            acc_wr.addr.eq(Cat(tw.c, tw.g)),
            acc_wr.en.eq((phase == PH_B) & tw.valid & tw.last_t),
            acc_rd.addr.eq(Cat(self.mg_c, self.mg_g)),
        ]
        for k in range(M):
            m.d.comb += acc_wr.data[k].eq(acc_reg[k])
        with m.If((phase == PH_B) & tb.valid & b_slot_ok & (tb.c == 0)):
            m.d.sync += l_reg[tb.g].eq(Mux(tb.t == 0, 0, l_reg[tb.g]) + p_d[1])

        # ---------- merge: the lane's parts ----------
        # sh follows mg_g two clocks late (l selected, then its bit length), its copies
        # three: the last output word of a head still shifts with that head's sh
        lsel = Signal(LW)
        m.d.sync += lsel.eq(l_reg[self.mg_g])
        bl = Signal(range(LW + 1))
        for b in range(LW):
            with m.If(lsel[b]):
                m.d.comb += bl.eq(b + 1)
        m.d.sync += sh.eq(Mux(bl > ASH, bl - ASH, 0))
        # a = acc >> sh in two registered steps (by the multiple of 4 in sh, then by the
        # rest), each element with its own copy of sh: one sh net fanning out to M 30-bit
        # shifters was longer than a clock. The copies follow mg_g three clocks late.
        acc_coarse = [Signal(signed(AW), name=f"accc{k}") for k in range(M)]
        for k in range(M):
            sh_k = Signal(range(LW + 1), name=f"sh{k}")
            m.d.sync += [sh_k.eq(sh), acc_word[k].eq(acc_rd.data[k]),
                         acc_coarse[k].eq(acc_word[k] >> Cat(Const(0, 2), sh_k[2:])),
                         a_reg[k].eq(acc_coarse[k] >> sh_k[:2])]
        # alpha (the lane's p of m - m[g]), amt = e + B - sh (>= 0 whenever alpha >= 1; alpha
        # * R = 0 otherwise) and beta, each latched when the sequencer says
        with m.If(self.alpha_latch):
            m.d.sync += self.alpha.eq(Mux(self.live, p_reg, 0))
        with m.If(self.amt_update):
            amt = self.e + BSH - sh
            m.d.sync += self.amt.eq(Mux(amt[-1], 0, amt))
        with m.If(self.beta_we & (self.beta_lane == lane)):
            m.d.sync += beta.eq(self.beta)
        return m
