"""The attention core's log-sum-exp merge unit: the pieces that combine the lanes' partial
softmax states ``(m, l, acc)`` of one query head into its output.

With ``alpha_j = exp2_fx(m - m_j)`` the lanes' weights (``m`` the largest lane max), the merge
computes (``ringkv.host.golden.fixed.merge_lanes``, integer for integer):

* :class:`LaneMax`: ``m``, the largest ``m_j`` of the live lanes (a registered tree);
* :class:`WeightSum`: ``L = sum_j (l_j * alpha_j) >> 15``, one lane per clock;
* :class:`Reciprocal`: ``e = bitlength(L)`` and ``R = 2**(e+16) // L`` by restoring division;
* :class:`BetaUnit`: ``beta_j = min((alpha_j * R) >> amt_j, 2**17 - 1)``, one lane per clock;
* :class:`OutputTree`: ``o = clamp((sum_j a_j * beta_j + 2**16) >> 17)`` per element, from the
  lanes' products ``a_j * beta_j`` (``a_j = acc_j >> sh_j``, formed in the lanes' multipliers).

The lanes keep their own parts of the merge (``alpha_j`` from their exp table, ``sh_j``,
``a_j``); :class:`~ringkv.hw.attention.AttentionCore`'s sequencer drives these units' strobes
in its ``MERGE_*`` states. Each unit is a plain datapath with a fixed latency and no
backpressure (the sequencer never stalls the merge); each follows the timing rules of the core
(see ``AttentionCore.elaborate``): a multiplier has registered operands and a registered
product, a selection is separated from the adder behind it by a register.
"""

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int, check_pow2, log2_exact
from ringkv.defs.numerics import BETA_MAX, P_FRAC

__all__ = ["LaneMax", "WeightSum", "Reciprocal", "BetaUnit", "OutputTree",
           "RECIP_BITS", "PRODUCT_BITS"]

#: quotient bits of :class:`Reciprocal` (``R = 2**(e+16) // L`` lies in ``2**16 .. 2**17``)
RECIP_BITS = 18
#: width of a lane multiplier's product (signed 18 x signed 18)
PRODUCT_BITS = 36



def tree_stages(n: int) -> int:
    """Registered stages of :func:`registered_sum` over ``n`` values (a power of two): one per
    two adder levels, ``ceil(log2(n) / 2)``."""
    return (log2_exact(n) + 1) // 2


def registered_sum(m: Module, values, width: int, name) -> Signal:
    """The sum of ``values`` (a power of two of them, signed, ``width`` bits) as an adder tree
    with a register after every second level and after the last: valid
    :func:`tree_stages` clocks after its inputs. ``name(stage, depth, j)`` names the ``j``-th
    register of the ``stage``-th registered level (``depth`` adder levels deep); one value is
    returned as it is."""
    level, depth, stage = list(values), 0, 0
    while len(level) > 1:
        level = [level[j] + level[j + 1] for j in range(0, len(level), 2)]
        depth += 1
        if depth % 2 == 0 or len(level) == 1:
            regs = [Signal(signed(width + depth), name=name(stage, depth, j))
                    for j in range(len(level))]
            m.d.sync += [r.eq(x) for r, x in zip(regs, level)]
            level, stage = regs, stage + 1
    return level[0]

class LaneMax(wiring.Component):
    """The largest value among the live inputs, through a registered tree.

    Ports: ``values`` (In, ``lanes`` signed ``width``-bit), ``live`` (In, ``lanes`` bits),
    ``max`` (Out, signed ``width``).

    Latency ``1 + log2(lanes)`` clocks (the inputs are registered, then one register per tree
    level): ``max`` shows the largest ``values[j]`` with ``live[j]`` set of the inputs that many
    clocks earlier (ties keep the lower index; with no live input it is unspecified, and the
    core never uses it then). A new set of inputs every clock, no backpressure.
    """

    def __init__(self, lanes, width):
        check_pow2("lanes", lanes)
        check_int("width", width, low=1)
        self._lanes, self._width = lanes, width
        super().__init__({
            "values": In(data.ArrayLayout(signed(width), lanes)),
            "live": In(lanes),
            "max": Out(signed(width)),
        })

    latency = property(lambda self: 1 + log2_exact(self._lanes))

    def elaborate(self, platform):
        m = Module()
        level = []
        for j in range(self._lanes):
            cand = Signal(signed(self._width), name=f"cand{j}")
            ok = Signal(name=f"ok{j}")
            m.d.sync += [cand.eq(self.values[j]), ok.eq(self.live[j])]
            level.append((cand, ok))
        depth = 0
        while len(level) > 1:
            depth += 1
            nxt = []
            for j in range(0, len(level), 2):
                (a, a_ok), (b, b_ok) = level[j], level[j + 1]
                v = Signal(signed(self._width), name=f"max{depth}_{j // 2}")
                ok = Signal(name=f"maxok{depth}_{j // 2}")
                m.d.sync += [v.eq(Mux(b_ok & (~a_ok | (b > a)), b, a)), ok.eq(a_ok | b_ok)]
                nxt.append((v, ok))
            level = nxt
        m.d.comb += self.max.eq(level[0][0])
        return m


class WeightSum(wiring.Component):
    """``total = sum (l * alpha) >> 15`` over a series of ``(l, alpha)`` pairs.

    Ports: ``l`` (In, ``l_width`` bits unsigned), ``alpha`` (In, 16 bits, Q1.15), ``valid``
    (In: add this clock's pair), ``clear`` (In: set ``total`` to 0), ``total`` (Out,
    ``total_width`` bits).

    One pair per clock; a pair offered with ``valid`` is in ``total`` 4 clocks later (the pair
    registered, the product in two registered parts when ``l`` is wider than 17 bits, the
    shifted term registered, then added). ``clear`` takes effect at the next clock and wins
    over an addition in the same clock. No backpressure; ``total`` wraps at ``total_width``
    bits (the core sizes it so that it never does).
    """

    def __init__(self, l_width, total_width):
        check_int("l_width", l_width, low=1)
        check_int("total_width", total_width, low=l_width + 1)
        self._lw, self._tw = l_width, total_width
        super().__init__({
            "l": In(l_width),
            "alpha": In(16),
            "valid": In(1),
            "clear": In(1),
            "total": Out(total_width),
        })

    latency = 4

    def elaborate(self, platform):
        m = Module()
        LW = self._lw
        # S0 (l, alpha) registered; S1 l_lo*alpha and l_hi*alpha (l = l_hi*2**17 + l_lo);
        # S2 term = l_hi*alpha*4 + (l_lo*alpha >> 15) = (l*alpha) >> 15; S3 total
        LO = min(LW, 17)
        sum_l = Signal(LW)
        sum_a = Signal(16)
        sum_v = Signal()
        sum_plo = Signal(LO + 16)
        sum_phi = Signal(max(LW - 17, 1) + 16)
        sum_pv = Signal()
        sum_term = Signal(LW + 1)
        sum_tv = Signal()
        m.d.sync += [sum_v.eq(self.valid), sum_plo.eq(sum_l[:LO] * sum_a), sum_pv.eq(sum_v),
                     sum_tv.eq(sum_pv)]
        with m.If(self.valid):
            m.d.sync += [sum_l.eq(self.l), sum_a.eq(self.alpha)]
        if LW > 17:
            m.d.sync += [sum_phi.eq(sum_l[17:] * sum_a),
                         sum_term.eq((sum_phi << 2) + (sum_plo >> P_FRAC))]
        else:
            m.d.sync += sum_term.eq(sum_plo >> P_FRAC)
        with m.If(self.clear):
            m.d.sync += self.total.eq(0)
        with m.Elif(sum_tv):
            m.d.sync += self.total.eq(self.total + sum_term)
        return m


class Reciprocal(wiring.Component):
    """``e = bitlength(L)`` and ``R = 2**(e+16) // L`` for ``L >= 2``, by restoring division.

    Ports: ``divisor`` (In, ``width`` bits: ``L``), ``load`` (In: start), ``step`` (In: one
    quotient bit), ``e`` (Out), ``quotient`` (Out, 18 bits: ``R``).

    ``load`` latches ``e`` (from ``divisor``), sets the remainder to ``2**(e-2)`` and the
    quotient to 0; then each clock with ``step`` forms one quotient bit, most significant
    first. After the load and 18 steps, ``quotient`` is ``R`` (between ``2**16`` and
    ``2**17``) and holds until the next ``load``. ``divisor`` must stay steady from the load to
    the last step. Latency 19 clocks, one reciprocal at a time, no backpressure: the caller
    counts the steps. For ``L < 2`` the result is unspecified: the core's ``L`` is at least
    ``2**15`` (the lane holding the largest max has ``alpha = 1.0`` and ``l >= 2**15``, the
    weight of its largest score).
    """

    def __init__(self, width):
        check_int("width", width, low=1)
        self._width = width
        super().__init__({
            "divisor": In(width),
            "load": In(1),
            "step": In(1),
            "e": Out(range(width + 1)),
            "quotient": Out(RECIP_BITS),
        })

    #: clocks from ``load`` to the quotient: the load and one step per quotient bit
    latency = 1 + RECIP_BITS

    def elaborate(self, platform):
        m = Module()
        W = self._width
        rem = Signal(W + 1)
        with m.If(self.load):
            # the highest set bit gives e; the remainder starts at 2**(e-2) so that 18 steps
            # divide 2**(e+16)
            for b in range(W):
                with m.If(self.divisor[b]):
                    m.d.sync += [self.e.eq(b + 1),
                                 rem.eq(Const(1, W + 1) << (b - 1) if b >= 1 else 0)]
            m.d.sync += self.quotient.eq(0)
        with m.Elif(self.step):
            rem2 = Cat(Const(0, 1), rem)
            with m.If(rem2 >= self.divisor):
                m.d.sync += [rem.eq(rem2 - self.divisor), self.quotient.eq(Cat(1, self.quotient))]
            with m.Else():
                m.d.sync += [rem.eq(rem2), self.quotient.eq(Cat(0, self.quotient))]
        return m


class BetaUnit(wiring.Component):
    """``beta = min((alpha * R) >> amt, 2**17 - 1)`` for a series of lanes.

    Ports: ``alpha`` (In, 16 bits), ``amt`` (In, the shift), ``lane`` (In, the lane index),
    ``valid`` (In), ``recip`` (In, 18 bits: ``R <= 2**17``, steady while the unit works),
    ``beta`` (Out, 18 bits), ``beta_lane`` (Out), ``beta_valid`` (Out: write ``beta`` into lane
    ``beta_lane`` this clock).

    One lane per clock; a lane offered with ``valid`` comes out 4 clocks later (inputs
    registered; ``alpha * R`` in two registered parts, ``R = R_hi*2**17 + R_lo``; the sum; the
    shift), then ``beta`` is saturated combinationally in the clock of ``beta_valid``. No
    backpressure.
    """

    def __init__(self, lanes, amt_width):
        check_pow2("lanes", lanes)
        check_int("amt_width", amt_width, low=1)
        self._lanes, self._amt_width = lanes, amt_width
        super().__init__({
            "alpha": In(16),
            "amt": In(amt_width),
            "lane": In(range(lanes)),
            "valid": In(1),
            "recip": In(RECIP_BITS),
            "beta": Out(RECIP_BITS),
            "beta_lane": Out(range(lanes)),
            "beta_valid": Out(1),
        })

    latency = 4

    def elaborate(self, platform):
        m = Module()
        b_alpha = Signal(16)
        b_amt = [Signal(self._amt_width, name=f"amt{k}") for k in range(3)]
        b_idx = [Signal(range(self._lanes), name=f"idx{k}") for k in range(4)]
        b_v = [Signal(name=f"v{k}") for k in range(4)]
        b_lo = Signal(16 + 17)
        b_hi = Signal(16)
        b_calc = Signal(34)
        b_shifted = Signal(34)
        m.d.sync += [b_v[0].eq(self.valid),
                     b_lo.eq(b_alpha * self.recip[:17]),
                     b_hi.eq(Mux(self.recip[17], b_alpha, 0)),
                     b_calc.eq(b_lo + (b_hi << 17)),
                     b_shifted.eq(b_calc >> b_amt[2])]
        with m.If(self.valid):
            m.d.sync += [b_alpha.eq(self.alpha), b_amt[0].eq(self.amt), b_idx[0].eq(self.lane)]
        for k in range(1, 4):
            m.d.sync += [b_idx[k].eq(b_idx[k - 1]), b_v[k].eq(b_v[k - 1])]
            if k < 3:
                m.d.sync += b_amt[k].eq(b_amt[k - 1])
        m.d.comb += [
            self.beta.eq(Mux(b_shifted > BETA_MAX, BETA_MAX, b_shifted)),
            self.beta_lane.eq(b_idx[3]),
            self.beta_valid.eq(b_v[3]),
        ]
        return m


class OutputTree(wiring.Component):
    """Per element ``k``: ``o[k] = clamp((sum_j products[j][k] + 2**16) >> 17, -32768, 32767)``.

    Ports: ``products`` (In, ``lanes`` x ``macs`` signed 36 bits), ``valid`` (In), ``o`` (Out,
    ``macs`` int16), ``o_valid`` (Out).

    A registered adder tree (a register after every second level and after the last), then the
    rounded and saturated word, registered: latency ``1 + ceil(log2(lanes) / 2)`` clocks, one
    word per clock, no backpressure (``o_valid`` follows ``valid`` by the latency).
    """

    def __init__(self, lanes, macs):
        check_pow2("lanes", lanes)
        check_pow2("macs", macs)
        self._lanes, self._macs = lanes, macs
        super().__init__({
            "products": In(data.ArrayLayout(data.ArrayLayout(signed(PRODUCT_BITS), macs),
                                            lanes)),
            "valid": In(1),
            "o": Out(data.ArrayLayout(signed(16), macs)),
            "o_valid": Out(1),
        })

    @property
    def latency(self):
        return 1 + tree_stages(self._lanes)

    def elaborate(self, platform):
        m = Module()
        P, M = self._lanes, self._macs
        tags = [Signal(name=f"v{k}") for k in range(self.latency + 1)]
        m.d.comb += tags[0].eq(self.valid)
        for k in range(1, self.latency + 1):
            m.d.sync += tags[k].eq(tags[k - 1])
        m.d.comb += self.o_valid.eq(tags[-1])
        for k in range(M):
            total = registered_sum(m, [self.products[j][k] for j in range(P)], PRODUCT_BITS,
                                   lambda stage, depth, j, k=k: f"tree{k}_{depth}_{j}")
            r = Signal(signed(len(total) + 1), name=f"round{k}")
            m.d.comb += r.eq((total + (1 << 16)) >> 17)
            out = Signal(16, name=f"out{k}")
            m.d.sync += out.eq(Mux(r > 32767, 32767, Mux(r < -32768, -32768, r))[:16])
            m.d.comb += self.o[k].eq(out)
        return m
