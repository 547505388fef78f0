"""A register slice for a stream: every output and ``i.ready`` come straight from flip-flops.

:class:`StreamRegister` cuts the combinational paths through a stream in both directions: the
producer's ``valid``/``payload`` logic no longer reaches the consumer's registers, and the
consumer's ``ready`` logic no longer reaches the producer's. The top puts one between the frame
decoder's payload bytes and the dispatcher, and one between the dispatcher's response bytes and
the frame encoder (whose CRC and the UART's shift register took the dispatcher's byte muxes
combinationally): the timing closure of the board's system clock (``docs/BOARD.md``).
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["StreamRegister"]


class StreamRegister(wiring.Component):
    """A two-entry skid buffer: ``i`` in, ``o`` out, payloads of ``shape``.

    Latency: 1 clock (a payload taken on ``i`` is offered on ``o`` the next clock).
    Throughput: one transfer per clock, with or without backpressure. Backpressure: ``i.ready``
    is low only while both entries are full (the output stalled with a second payload taken
    the clock it stalled); it is a register, as are ``o.valid`` and ``o.payload``. Order is
    kept; ``o`` obeys the stream rules (``valid`` held with a steady payload until taken).
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        main, main_v = Signal(self._shape), Signal()
        skid, skid_v = Signal(self._shape), Signal()
        m.d.comb += [self.o.valid.eq(main_v), self.o.payload.eq(main),
                     self.i.ready.eq(~skid_v)]
        take_in = self.i.valid & self.i.ready
        with m.If(self.o.ready | ~main_v):          # the output entry is free next clock
            with m.If(skid_v):
                m.d.sync += [main.eq(skid), main_v.eq(1), skid_v.eq(0)]
            with m.Else():
                m.d.sync += [main.eq(self.i.payload), main_v.eq(take_in)]
        with m.Elif(~skid_v):                       # output stalled: park the new payload
            # (taken whether or not it is valid, as the output entry's is: the payload registers'
            # enables do not wait for the producer's ``valid``, only ``skid_v`` and ``main_v``
            # do; a command slice's ``valid`` is a state decode, its payload a few hundred bits)
            m.d.sync += [skid.eq(self.i.payload), skid_v.eq(self.i.valid)]
        return m
