"""Golden model of the UART line: the transmitter's exact waveform and test stimuli.

:func:`tx_levels` is bit-exact with :class:`ringkv.hw.link.uart.UARTTransmitter` fed by a source
that is always valid: the line level at every clock from the first start bit on, including the
Bresenham accumulator that spreads a fractional divisor over the bits (it runs on across
characters and is never reset). :func:`line_levels` draws a character stream at any real bit
period (for baud-tolerance tests) and :func:`decode_line` is a reference receiver.
"""

from fractions import Fraction

__all__ = ["bit_lengths", "tx_levels", "line_levels", "decode_line"]


def bit_lengths(divisor, count: int, acc: int = 0):
    """Lengths in cycles of ``count`` successive bits and the final accumulator."""
    divisor = Fraction(divisor)
    q, r, den = divisor.numerator // divisor.denominator, divisor.numerator % divisor.denominator, \
        divisor.denominator
    out = []
    for _ in range(count):
        if den > 1 and acc >= den - r:
            out.append(q + 1)
            acc += r - den
        else:
            out.append(q)
            acc += r
    return out, acc


def _char_bits(byte: int):
    return [0] + [(byte >> i) & 1 for i in range(8)] + [1]


def tx_levels(data: bytes, divisor) -> list[int]:
    """The transmitter's line, one level per clock, for back-to-back characters."""
    levels, acc = [], 0
    for byte in data:
        lengths, acc = bit_lengths(divisor, 10, acc)
        for bit, length in zip(_char_bits(byte), lengths):
            levels += [bit] * length
    return levels


def line_levels(data: bytes, period: float, *, gap_bits: float = 0.0, rng=None,
                stop_bits=None) -> list[int]:
    """A line with characters of bit ``period`` cycles (a float), edges at rounded ideal times.

    ``gap_bits``: idle time between characters (random up to it when ``rng`` is given).
    ``stop_bits``: optional per-character stop-bit levels (0 makes a framing error).
    """
    levels = [1] * 8
    t = float(len(levels))
    for n, byte in enumerate(data):
        bits = _char_bits(byte)
        if stop_bits is not None:
            bits[-1] = stop_bits[n]
        for bit in bits:
            end = t + period
            levels += [bit] * (round(end) - round(t))
            t = end
        gap = gap_bits * (rng.random() if rng else 1.0) * period
        end = t + gap
        levels += [1] * (round(end) - round(t))
        t = end
    return levels + [1] * int(2 * period + 4)


def decode_line(levels, period: float) -> bytes:
    """Reference receiver: sample mid-bit after each falling edge; drop bad stop bits."""
    out, i = bytearray(), 0
    n = len(levels)
    while i < n:
        if levels[i] == 0:
            def at(k, start=i):
                j = int(start + (k + 0.5) * period)
                return levels[j] if j < n else 1
            if at(0) == 0:
                byte = sum(at(1 + b) << b for b in range(8))
                if at(9) == 1:
                    out.append(byte)
                i = int(i + 9.5 * period)
                while i < n and levels[i] == 0:
                    i += 1
                continue
        i += 1
    return bytes(out)
