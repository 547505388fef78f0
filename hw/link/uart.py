"""UART (8N1) receiver and transmitter with ``lib.stream`` ports and a fractional divisor.

The bit period is ``divisor`` clock cycles, an ``int`` or a :class:`fractions.Fraction` (clock /
baud, at least 4). A fractional divisor ``q + r/den`` is realised exactly on average by a
Bresenham accumulator: each bit lasts ``q`` or ``q + 1`` cycles, the accumulator carrying the
remainder from bit to bit, so the *average* baud rate has no error at all and each bit edge is
within one clock of its ideal position. Example: the ULX3S's 25 MHz clock at 3 Mbaud is
``Fraction(25, 3)`` = 8 1/3: bits of 8, 8, 9, 8, 8, 9, ... cycles (an integer divisor of 8 would
be 4.2 % fast, beyond what a receiver tolerates). :func:`baud_error` states the error of a
divisor; :func:`divisor_for` gives the exact one.

Receiver
    The input passes an :class:`~amaranth.lib.cdc.FFSynchronizer` (2 flip-flops, reset value 1:
    an idle line). A falling edge starts a character; the start bit is sampled again half a bit
    later and a character whose start bit is no longer low there is dropped as a glitch. Data
    bits are sampled at their middles, LSB first; a stop bit read as 0 is a *framing error*: the
    byte is dropped, ``framing_errors`` counts it and the receiver waits for the line to go
    high again (a break is one error, not a stream of zero bytes). Tolerated baud mismatch:
    the stop bit's sample (9.5 bits after the start edge) must stay inside the stop bit, about
    ±4.5 % at 8 1/3 cycles per bit minus the one-cycle sampling uncertainty; tested at ±2 %.

    Latency: a byte is offered on ``o`` ``~9.5`` bit periods + 4 cycles after its start edge.
    Throughput: line rate. Backpressure: received bytes enter a FIFO of ``fifo_depth`` bytes
    (``SyncFIFOBuffered``); ``o`` is its read side. A byte that arrives while the FIFO is full is
    dropped and counted in ``overruns`` (a UART cannot stall its sender); the host protocol keeps
    one request in flight so the consumer never falls that far behind.

Transmitter
    ``i`` is accepted when the line is idle or in the last cycle of a stop bit, so a
    continuously valid source gets back-to-back characters of exactly 10 bit periods each.
    Latency: the start bit begins on the cycle after the transfer. Throughput: one byte per
    ``10 * divisor`` cycles. Backpressure: ``i.ready`` is low while a character is on the line.
"""

from fractions import Fraction

from amaranth import *
from amaranth.lib import cdc, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int

__all__ = ["UARTReceiver", "UARTTransmitter", "UART", "divisor_for", "baud_error"]


def divisor_for(clk_hz: int, baud: int) -> Fraction:
    """The exact divisor ``clk_hz / baud`` (an ``int`` when it divides evenly)."""
    d = Fraction(clk_hz, baud)
    return int(d) if d.denominator == 1 else d


def baud_error(clk_hz: int, baud: int, divisor) -> float:
    """Relative error of the average baud rate obtained with ``divisor``: ``+`` = too fast."""
    return float(Fraction(clk_hz) / Fraction(divisor) / baud - 1)


def _check_divisor(divisor):
    if isinstance(divisor, bool) or not isinstance(divisor, (int, Fraction)):
        raise TypeError(f"Divisor must be an int or a Fraction, not {divisor!r}")
    if divisor < 4:
        raise ValueError(f"Divisor must be at least 4 clock cycles per bit, not {divisor!r}")
    divisor = Fraction(divisor)
    if divisor.denominator > 1 << 16:
        raise ValueError(f"Divisor denominator must be at most 65536, not {divisor!r}")
    return divisor


class _BitTimer:
    """Bit-period down-counter with a Bresenham remainder accumulator (sync-domain logic)."""

    def __init__(self, divisor: Fraction, name: str):
        self.q = divisor.numerator // divisor.denominator
        self.r = divisor.numerator % divisor.denominator
        self.den = divisor.denominator
        self.count = Signal(range(self.q + 1), name=f"{name}_count")
        self.acc = Signal(range(self.den), name=f"{name}_acc")

    def reload(self, m):
        """Start a new bit: ``count`` = its length - 1. Call inside a conditional."""
        if self.den == 1:
            m.d.sync += self.count.eq(self.q - 1)
            return
        with m.If(self.acc >= self.den - self.r):
            m.d.sync += [self.count.eq(self.q), self.acc.eq(self.acc + self.r - self.den)]
        with m.Else():
            m.d.sync += [self.count.eq(self.q - 1), self.acc.eq(self.acc + self.r)]


class UARTTransmitter(wiring.Component):
    """8N1 transmitter; see the module docstring for timing.

    Parameters: ``divisor`` (``int`` or ``Fraction`` >= 4) clock cycles per bit.
    Ports: ``i`` (stream of bytes in), ``tx`` (line out, idle high), ``busy``.
    """

    i: In(stream.Signature(8))
    tx: Out(1, init=1)
    busy: Out(1)

    def __init__(self, divisor):
        self._divisor = _check_divisor(divisor)
        super().__init__()

    @property
    def divisor(self) -> Fraction:
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        timer = _BitTimer(self._divisor, "tx")
        shreg = Signal(10, init=0x3FF)       # start, 8 data LSB first, stop; shifted right
        bits_left = Signal(range(11))

        last_cycle = (bits_left == 1) & (timer.count == 0)
        m.d.comb += [
            self.tx.eq(shreg[0]),
            self.busy.eq(bits_left != 0),
            self.i.ready.eq((bits_left == 0) | last_cycle),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [shreg.eq(Cat(C(0, 1), self.i.payload, C(1, 1))), bits_left.eq(10)]
            timer.reload(m)
        with m.Elif(bits_left != 0):
            with m.If(timer.count == 0):
                m.d.sync += [shreg.eq(Cat(shreg[1:], C(1, 1))), bits_left.eq(bits_left - 1)]
                with m.If(bits_left != 1):
                    timer.reload(m)
            with m.Else():
                m.d.sync += timer.count.eq(timer.count - 1)
        return m


class UARTReceiver(wiring.Component):
    """8N1 receiver with an input synchroniser and a FIFO; see the module docstring.

    Parameters: ``divisor`` (``int`` or ``Fraction`` >= 4), ``fifo_depth`` (bytes, >= 1).
    Ports: ``rx`` (line in, asynchronous), ``o`` (stream of received bytes),
    ``framing_errors`` / ``overruns`` (16-bit saturating counters), ``error`` (one-cycle strobe
    on either event).
    """

    rx: In(1, init=1)
    o: Out(stream.Signature(8))
    framing_errors: Out(16)
    overruns: Out(16)
    error: Out(1)

    def __init__(self, divisor, *, fifo_depth: int = 16):
        self._divisor = _check_divisor(divisor)
        check_int("FIFO depth", fifo_depth, low=1)
        self._fifo_depth = fifo_depth
        super().__init__()

    @property
    def divisor(self) -> Fraction:
        return self._divisor

    @property
    def fifo_depth(self) -> int:
        return self._fifo_depth

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = rx_fifo = fifo.SyncFIFOBuffered(width=8, depth=self._fifo_depth)
        wiring.connect(m, wiring.flipped(self.o), rx_fifo.r_stream)

        line = Signal(init=1)
        m.submodules.sync = cdc.FFSynchronizer(self.rx, line, init=1)

        timer = _BitTimer(self._divisor, "rx")
        half = max(1, round(self._divisor / 2))
        shreg = Signal(8)
        bits_left = Signal(range(9))

        def bump(counter):
            with m.If(counter != 0xFFFF):
                m.d.sync += counter.eq(counter + 1)
            m.d.comb += self.error.eq(1)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += [timer.count.eq(half - 1), timer.acc.eq(0)]
                    m.next = "START"
            with m.State("START"):
                with m.If(timer.count != 0):
                    m.d.sync += timer.count.eq(timer.count - 1)
                with m.Elif(line):
                    m.next = "IDLE"                     # a glitch, not a start bit
                with m.Else():
                    timer.reload(m)
                    m.d.sync += bits_left.eq(8)
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer.count != 0):
                    m.d.sync += timer.count.eq(timer.count - 1)
                with m.Else():
                    timer.reload(m)
                    m.d.sync += [shreg.eq(Cat(shreg[1:], line)), bits_left.eq(bits_left - 1)]
                    with m.If(bits_left == 1):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer.count != 0):
                    m.d.sync += timer.count.eq(timer.count - 1)
                with m.Elif(line):
                    with m.If(rx_fifo.w_rdy):
                        m.d.comb += [rx_fifo.w_data.eq(shreg), rx_fifo.w_en.eq(1)]
                    with m.Else():
                        bump(self.overruns)
                    m.next = "IDLE"
                with m.Else():
                    bump(self.framing_errors)
                    m.next = "BREAK"
            with m.State("BREAK"):
                with m.If(line):
                    m.next = "IDLE"
        return m


class UART(wiring.Component):
    """Receiver and transmitter sharing one ``divisor``.

    Ports: ``rx``/``tx`` (line), ``o`` (received bytes), ``i`` (bytes to send),
    ``framing_errors``, ``overruns``, ``error`` (the receiver's one-cycle strobe on either).
    """

    rx: In(1, init=1)
    tx: Out(1, init=1)
    i: In(stream.Signature(8))
    o: Out(stream.Signature(8))
    framing_errors: Out(16)
    overruns: Out(16)
    error: Out(1)

    def __init__(self, divisor, *, fifo_depth: int = 16):
        # The children check the parameters (same messages as when used alone).
        self._receiver = UARTReceiver(divisor, fifo_depth=fifo_depth)
        self._transmitter = UARTTransmitter(divisor)
        super().__init__()

    @property
    def divisor(self) -> Fraction:
        return self._receiver.divisor

    def elaborate(self, platform):
        m = Module()
        m.submodules.receiver = rxr = self._receiver
        m.submodules.transmitter = txr = self._transmitter
        wiring.connect(m, wiring.flipped(self.o), rxr.o)
        wiring.connect(m, wiring.flipped(self.i), txr.i)
        m.d.comb += [
            rxr.rx.eq(self.rx),
            self.tx.eq(txr.tx),
            self.framing_errors.eq(rxr.framing_errors),
            self.overruns.eq(rxr.overruns),
            self.error.eq(rxr.error),
        ]
        return m
