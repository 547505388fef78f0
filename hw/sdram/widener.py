"""A 16-bit user port on a half-rate controller's 32-bit port.

Golden model: none of its own; what it moves is checked word for word against
:class:`ringkv.host.golden.sdram.SdramGolden` through the controller on the pin-level model
(``tests/hw/sdram/test_widener.py``).
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .arbiter import UserPortSignature

__all__ = ["PortWidener", "WIDENER_BUGS"]

#: deliberately broken variants (private knob ``_bug``): ``read_order`` (a read word's high
#: half first), ``write_order`` (a write pair's second word in the low half)
WIDENER_BUGS = ("read_order", "write_order")


class PortWidener(wiring.Component):
    """``narrow`` (a user port of 16-bit words, the user's side) on ``wide`` (a port of a
    controller at ``rate`` 2: two words a transfer, the even address's in the low half).

    Commands pass through unchanged (a transfer is whole bursts of at least 2 words, so every
    command's words pair up). Write words are paired: the first is held, the second goes out
    with it in the same clock (``wide.w.valid`` follows ``narrow.w.valid`` combinationally,
    ``narrow.w.ready`` follows ``wide.w.ready`` for the second word). Read words are split: a
    wide word is held and handed over low half first. Throughput: one 16-bit word a clock each
    way; latency: none for writes beyond the pairing, one clock for reads. Backpressure passes
    through both ways; nothing is dropped.

    For users that move one word a clock anyway (the memory self-test): half of what the
    half-rate controller can move.
    """

    def __init__(self, addr_bits: int, count_bits: int, *, _bug=None):
        if _bug is not None and _bug not in WIDENER_BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {WIDENER_BUGS}")
        self._bug = _bug
        super().__init__({"narrow": In(UserPortSignature(addr_bits, count_bits, 1)),
                          "wide": Out(UserPortSignature(addr_bits, count_bits, 2))})

    def elaborate(self, platform):
        m = Module()
        n, w = self.narrow, self.wide
        m.d.comb += [w.cmd.valid.eq(n.cmd.valid), w.cmd.payload.eq(n.cmd.payload),
                     n.cmd.ready.eq(w.cmd.ready)]

        # write: the first word of a pair held until the second comes
        first = Signal(18)
        held = Signal()
        pair = [first, n.w.payload.as_value()]
        pair = pair[::-1] if self._bug == "write_order" else pair
        m.d.comb += [w.w.valid.eq(held & n.w.valid),
                     w.w.payload.data.eq(Cat(pair[0][:16], pair[1][:16])),
                     w.w.payload.mask.eq(Cat(pair[0][16:], pair[1][16:])),
                     n.w.ready.eq(~held | w.w.ready)]
        with m.If(n.w.valid & n.w.ready):
            m.d.sync += [first.eq(n.w.payload), held.eq(~held)]

        # read: a wide word held, its low half first
        word = Signal(32)
        have = Signal()
        upper = Signal()
        low, high = (word[16:], word[:16]) if self._bug == "read_order" else (word[:16],
                                                                               word[16:])
        m.d.comb += [n.r.valid.eq(have), n.r.payload.eq(Mux(upper, high, low)),
                     w.r.ready.eq(~have | (upper & n.r.ready))]
        with m.If(w.r.valid & w.r.ready):
            m.d.sync += [word.eq(w.r.payload), have.eq(1), upper.eq(0)]
        with m.Elif(n.r.valid & n.r.ready):
            m.d.sync += [upper.eq(1), have.eq(~upper)]
        return m
