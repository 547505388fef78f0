"""The attention core's ring port: its signature, and the arbiter that shares it.

The attention core (``hw/attention/core.py``) keeps the K/V rings and their metadata; two parties
reach them through one port while the core is idle: the DMA engine (``hw/storage/dma.py``: export
reads, import writes) and the top's command dispatcher (``RING_READ``, and ``EXPORT``'s check that
all rings agree). :class:`RingPortSignature` is the port as its initiator sees it (the DMA has
``ring: Out(RingPortSignature(...))``, the core ``ring: In(...)``); :class:`RingReadSignature`
is its read-only part, which is all the dispatcher needs; :class:`RingPortArbiter` puts the
two on the core's port, so that every join is a checked ``wiring.connect``.

The member table lives in the docstring of :class:`RingPortSignature`.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import elem_bytes, ring_space

__all__ = ["RingPortSignature", "RingReadSignature", "RingPortArbiter", "RING_READ_LATENCY",
           "RING_WRITE_LATENCY"]

#: Clocks from ``ring_re`` to its byte on ``ring_rdata`` (the attention core registers the
#: addressed byte of each lane's bank word, then selects the lane).
RING_READ_LATENCY = 2

#: Clocks from ``ring_we`` to its byte in the K/V banks (the attention core registers the write
#: before it fans out to every lane's banks); a read strobed in between returns 0.
RING_WRITE_LATENCY = 1

_READ_MEMBERS = {
    "ring_addr": Out(32),
    "ring_re": Out(1),
    "ring_rdata": In(8),
    "meta_ring": Out(8),
    "meta_count": In(32),
    "meta_head": In(16),
}


class RingPortSignature(wiring.Signature):
    """The attention core's ring-access port, seen from its initiator (the DMA).

    Byte-addressed, synchronous, 8-bit reads, 8- or 32-bit writes: a K or V element is ``EB =
    elem_bytes`` bytes (1 for numerics ``ringkv-fx1``, 2 for ``ringkv-fx2``), little-endian;
    served only while the core is idle:

    =============== ===== =====================================================================
    member          dir   meaning
    =============== ===== =====================================================================
    ``ring_addr``   Out   32 bits: ``element * EB + byte`` with ``element = ((ring*2 + kind)*W +
                          slot)*d + dim``, ``ring = layer*Hkv + kv_head``, kind 0 = K, 1 = V
    ``ring_re``     Out   read strobe; ``ring_rdata`` holds the byte two clocks later
                          (:data:`RING_READ_LATENCY`)
    ``ring_rdata``  In    8 bits, read data (one byte of an element); 0 outside the rings,
                          and 0 for a read strobed with ``ring_we`` or in the clock after it
    ``ring_we``     Out   write strobe, with ``ring_addr`` and ``ring_wdata``; the byte lands
                          a clock later (:data:`RING_WRITE_LATENCY`)
    ``ring_wdata``  Out   32 bits, write data: a byte write takes the low 8 bits (one byte of
                          an element), a wide write all four bytes, the first in the low byte
    ``ring_wide``   Out   with ``ring_we``: the write is four bytes at ``ring_addr``, a multiple
                          of 4 (the four-byte import, ``hw/storage/kv_words.py``); they land
                          together, a clock later. Only a core whose bank word is whole groups
                          of four bytes takes them (``AttentionCore.takes_wide_writes``)
    ``meta_ring``   Out   8 bits, ring whose metadata is read or written
    ``meta_count``  In    32 bits, tokens seen by the ring (does not wrap); combinational
    ``meta_head``   In    16 bits, slot of the newest token; combinational
    ``meta_we``     Out   metadata write strobe, with ``meta_wcount``, ``meta_whead``
    ``meta_wcount`` Out   32 bits
    ``meta_whead``  Out   16 bits (a value ``>= W`` is ignored)
    =============== ===== =====================================================================

    The DMA holds ``meta_ring`` for two clocks before it samples ``meta_count``/``meta_head``,
    so a combinational (the attention core) or a one-clock synchronous metadata read both work.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, window: int,
                 elem_bytes: int = 1):
        self._params = (layers, kv_heads, head_dim, window, elem_bytes)
        super().__init__({
            **_READ_MEMBERS,
            "ring_we": Out(1),
            "ring_wdata": Out(32),
            "ring_wide": Out(1),
            "meta_we": Out(1),
            "meta_wcount": Out(32),
            "meta_whead": Out(16),
        })

    @classmethod
    def for_config(cls, config: RingKVConfig):
        return cls(config.layers, config.kv_heads, config.head_dim, config.window,
                   elem_bytes(config))

    @property
    def ring_bytes(self) -> int:
        """Size of the byte address space (:func:`ringkv.defs.record.ring_space`)."""
        layers, kv_heads, head_dim, window, eb = self._params
        return ring_space(layers, kv_heads, window, head_dim, eb)

    def __eq__(self, other):
        return type(other) is RingPortSignature and other._params == self._params

    def __hash__(self):
        return hash((RingPortSignature, self._params))

    def __repr__(self):
        return "RingPortSignature({}, {}, {}, {}, elem_bytes={})".format(*self._params)


class RingReadSignature(wiring.Signature):
    """The read members of :class:`RingPortSignature` (same names, widths and timing)."""

    def __init__(self):
        super().__init__(_READ_MEMBERS)

    def __eq__(self, other):
        return type(other) is RingReadSignature

    def __hash__(self):
        return hash(RingReadSignature)

    def __repr__(self):
        return "RingReadSignature()"


class RingPortArbiter(wiring.Component):
    """Two initiators on the attention core's ring port: ``dma`` (reads and writes) while
    ``dma_owns`` is high, ``reader`` (reads only) otherwise.

    Ports: ``dma`` (In :class:`RingPortSignature`), ``reader`` (In :class:`RingReadSignature`),
    ``core`` (Out :class:`RingPortSignature`, to the core's ``ring``), ``dma_owns`` (In 1).

    The core's address, read strobe and metadata selector come from the owner, combinationally;
    writes pass only from the DMA and only while it owns the port; read data and metadata go to
    both (each uses them only when it owns the port, so the core's fixed read latency holds for
    both). The metadata (``meta_count``, ``meta_head``) is registered here: both initiators read
    it one clock after ``meta_ring`` selects it (the port's contract allows a one-clock
    synchronous metadata read: the DMA holds ``meta_ring`` two clocks before it samples). That
    register ends the path from either initiator's selector through the core's metadata mux
    before the initiator's comparators (the board's timing closure, ``docs/BOARD.md``). The
    owner may change on any clock; a read in flight when it does is the old owner's. No
    backpressure (the port has none).
    """

    def __init__(self, port: RingPortSignature):
        if not isinstance(port, RingPortSignature):
            raise TypeError(f"port must be a RingPortSignature, not {port!r}")
        super().__init__({
            "dma": In(port),
            "reader": In(RingReadSignature()),
            "core": Out(port),
            "dma_owns": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        dma, reader, core, owns = self.dma, self.reader, self.core, self.dma_owns
        m.d.comb += [
            core.ring_addr.eq(Mux(owns, dma.ring_addr, reader.ring_addr)),
            core.ring_re.eq(Mux(owns, dma.ring_re, reader.ring_re)),
            core.ring_we.eq(dma.ring_we & owns),
            core.ring_wdata.eq(dma.ring_wdata),
            core.ring_wide.eq(dma.ring_wide),
            core.meta_ring.eq(Mux(owns, dma.meta_ring, reader.meta_ring)),
            core.meta_we.eq(dma.meta_we & owns),
            core.meta_wcount.eq(dma.meta_wcount),
            core.meta_whead.eq(dma.meta_whead),
        ]
        m.d.comb += [dma.ring_rdata.eq(core.ring_rdata), reader.ring_rdata.eq(core.ring_rdata)]
        for name in ("meta_count", "meta_head"):
            value = Signal.like(getattr(core, name), name=f"{name}_q")
            m.d.sync += value.eq(getattr(core, name))
            m.d.comb += [getattr(dma, name).eq(value), getattr(reader, name).eq(value)]
        return m
