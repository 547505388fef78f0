"""Bytes and four-byte words on storage streams: the two stream converters and a wide storage
port on a port of bytes.

The import moves its K/V area four bytes a clock from the SDRAM tier (``docs/blocks/dma.md``);
the card's controllers move a byte a clock. These pieces join the two widths, in the storage
port's byte order (byte ``4 i + k`` of a sector in bits ``8 k .. 8 k + 7`` of word ``i``):

* :class:`WordsToBytes`: a stream of words into a stream of bytes, low byte first;
* :class:`BytesToWords`: a stream of bytes into a stream of words, the first byte low;
* :class:`StorageWidener`: a ``StoragePortSignature(width=4)`` target on a byte target (the SD
  controller behind the tiered storage's wide port): commands and status through, the data
  streams through the two converters.

``amaranth.lib.stream`` (0.5) defines the stream interface but no width converters; these are
ours. Each moves one byte a clock with no bubble while both sides keep up (a word a clock is
four bytes, so the byte side sets the pace); backpressure passes both ways and nothing is
dropped. ``clear`` forgets a partial word (a transfer ended early by an error status).
"""

from amaranth import Array, Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .port import StoragePortSignature

__all__ = ["WordsToBytes", "BytesToWords", "StorageWidener"]


class WordsToBytes(wiring.Component):
    """``i`` (stream of 32-bit words) to ``o`` (stream of bytes), the low byte first.

    A word is taken when the last byte of the one before goes out (or when none is held):
    ``i.ready`` depends combinationally on ``o.ready``. Latency 1 clock (the word is
    registered); one byte a clock. ``clear`` (In 1): drop the held word at the next edge.
    """

    def __init__(self):
        super().__init__({"i": In(stream.Signature(32)), "o": Out(stream.Signature(8)),
                          "clear": In(1)})

    def elaborate(self, platform):
        m = Module()
        word = Signal(32)
        have = Signal()
        at = Signal(2)
        last = at == 3
        out = self.o.valid & self.o.ready
        m.d.comb += [self.o.valid.eq(have),
                     self.o.payload.eq(Array(word[8 * k:8 * k + 8] for k in range(4))[at]),
                     self.i.ready.eq(~have | (last & self.o.ready))]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [word.eq(self.i.payload), have.eq(1), at.eq(0)]
        with m.Elif(out):
            m.d.sync += [at.eq(at + 1), have.eq(~last)]
        with m.If(self.clear):
            m.d.sync += [have.eq(0), at.eq(0)]
        return m


class BytesToWords(wiring.Component):
    """``i`` (stream of bytes) to ``o`` (stream of 32-bit words), the first byte low.

    Three bytes wait in registers; the fourth makes the word, registered on ``o`` (taken
    while ``o`` is empty or being taken: ``i.ready`` depends combinationally on ``o.ready``).
    Latency 1 clock from the fourth byte; one byte a clock. ``clear`` (In 1): drop the bytes
    of a partial word and the word on ``o`` at the next edge.
    """

    def __init__(self):
        super().__init__({"i": In(stream.Signature(8)), "o": Out(stream.Signature(32)),
                          "clear": In(1)})

    def elaborate(self, platform):
        m = Module()
        early = [Signal(8, name=f"byte{k}") for k in range(3)]
        got = Signal(2)
        full = Signal()
        word = Signal(32)
        m.d.comb += [self.o.valid.eq(full), self.o.payload.eq(word),
                     self.i.ready.eq((got != 3) | ~full | self.o.ready)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += full.eq(0)
        with m.If(self.i.valid & self.i.ready):
            with m.If(got == 3):
                m.d.sync += [word.eq(Cat(*early, self.i.payload)), full.eq(1)]
            for k in range(3):
                with m.If(got == k):
                    m.d.sync += early[k].eq(self.i.payload)
            m.d.sync += got.eq(got + 1)
        with m.If(self.clear):
            m.d.sync += [got.eq(0), full.eq(0)]
        return m


class StorageWidener(wiring.Component):
    """``wide`` (In ``StoragePortSignature(width=4)``: the wide initiator's target) on
    ``narrow`` (Out ``StoragePortSignature()``: a target of bytes).

    ``cmd`` passes through unchanged, ``status`` too once the packer has handed over its last
    whole word (held while a word waits or a byte comes in); ``wide.wdata`` words go out as
    four bytes, ``narrow.rdata`` bytes come in as words. Every transfer is whole sectors (512
    bytes, 128 words), so words never straddle transfers; a transfer that the target ends early
    with an error status leaves a partial word, dropped with the status. Throughput: one byte a
    clock on ``narrow``, a word every four clocks on ``wide``.
    """

    def __init__(self):
        super().__init__({"wide": In(StoragePortSignature(4)),
                          "narrow": Out(StoragePortSignature())})

    def elaborate(self, platform):
        m = Module()
        w, n = self.wide, self.narrow
        m.submodules.unpack = unpack = WordsToBytes()
        m.submodules.pack = pack = BytesToWords()
        flipped = wiring.flipped
        wiring.connect(m, flipped(w.cmd), flipped(n.cmd))         # through, both ways
        # the status after the last word: a word still in the packer goes first (the status
        # follows the target's last byte at once, the word it completes a clock later)
        # (nor in the clock a byte comes in: it may complete a word)
        hold = pack.o.valid | (n.rdata.valid & n.rdata.ready)
        m.d.comb += [w.status.payload.eq(n.status.payload),
                     w.status.valid.eq(n.status.valid & ~hold),
                     n.status.ready.eq(w.status.ready & ~hold)]
        wiring.connect(m, flipped(w.wdata), unpack.i)
        wiring.connect(m, unpack.o, flipped(n.wdata))
        wiring.connect(m, flipped(n.rdata), pack.i)
        wiring.connect(m, pack.o, flipped(w.rdata))
        # a new command, or the status that ends a transfer (early, on an error: a write's
        # word left in the unpacker would keep offering bytes to an idle target)
        new = (n.cmd.valid & n.cmd.ready) | (w.status.valid & w.status.ready)
        m.d.comb += [unpack.clear.eq(new), pack.clear.eq(new)]
        return m
