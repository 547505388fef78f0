"""Token memory: the computed tokens of the resident session.

``max_tokens`` x ``token_width`` block RAM with one write port, used by the link (append at the
running count, or write at an index), and ``read_ports`` synchronous read ports (by default two:
one for the hash engine, one for the DMA engine's export and import verification).

Ports:

* ``append``: stream of tokens (``ready`` is always 1) written at index ``count``, then
  ``count += 1``;
  appends beyond ``max_tokens`` are dropped and set ``overflow``;
* ``write``: ``{addr, data, en}`` write at an index (does not change ``count``);
* ``clear``: pulse: ``count := 0``, ``overflow := 0``; ``set_count``/``count_we``: load ``count``
  (the host sets it after an import);
* ``count``: number of tokens held; ``overflow``: an append was dropped;
* ``read0``, ``read1``, ...: :class:`TokenReadSignature` (flipped): ``{addr, en}`` ->
  ``data`` one clock later (data holds while ``en`` is low).

The block RAM itself reads every clock (its clock enable tied high); ``en`` goes into a
flip-flop that chooses, the clock after, between the word just read and the word held (a
register). A reader's ``en`` is a decode of its state and handshakes; as the clock enable of
every block RAM of the copy (16 for 16,384 tokens), spread across the chip, it was 16.9 ns of
the half-rate board build at 60 MHz. The port's behaviour is the same.

An append and an indexed write in the same clock: the append wins, the write is dropped.

Latency: write to read-visible 1 clock (read ports are not transparent: a read in the same clock
as a write to the same address returns the old token). Throughput: one append or write and one
read per port per clock. No backpressure (``append.ready`` is always 1; a plain stream, not
``always_ready``, so the block converts to Verilog on its own).
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int

__all__ = ["TokenReadSignature", "TokenMemory"]


class TokenReadSignature(wiring.Signature):
    """A synchronous token read port, reader side: ``addr``, ``en`` out; ``data`` in (1 clock)."""

    def __init__(self, max_tokens: int, token_width: int):
        self._max_tokens, self._token_width = max_tokens, token_width
        super().__init__({"addr": Out(range(max_tokens)), "en": Out(1),
                          "data": In(token_width)})

    def __eq__(self, other):
        return (type(other) is TokenReadSignature and other._max_tokens == self._max_tokens
                and other._token_width == self._token_width)

    def __hash__(self):
        return hash((TokenReadSignature, self._max_tokens, self._token_width))

    def __repr__(self):
        return f"TokenReadSignature({self._max_tokens}, {self._token_width})"


class TokenMemory(wiring.Component):
    """Per-session token store; see the module docstring for ports and timing."""

    def __init__(self, max_tokens: int, token_width: int, read_ports: int = 2):
        check_int("max_tokens", max_tokens, low=1)
        check_int("token_width", token_width, low=1, high=32)
        check_int("read_ports", read_ports, low=1)
        self._max_tokens, self._token_width, self._read_ports = max_tokens, token_width, read_ports
        super().__init__({
            "append": In(stream.Signature(token_width)),
            "write": In(wiring.Signature({"addr": Out(range(max_tokens)),
                                          "data": Out(token_width), "en": Out(1)})),
            "clear": In(1),
            "count_we": In(1),
            "set_count": In(range(max_tokens + 1)),
            "count": Out(range(max_tokens + 1)),
            "overflow": Out(1),
            **{f"read{i}": In(TokenReadSignature(max_tokens, token_width))
               for i in range(read_ports)},
        })

    @property
    def max_tokens(self):
        return self._max_tokens

    @property
    def token_width(self):
        return self._token_width

    def read_port(self, i: int):
        """The ``i``-th read port (``TokenReadSignature`` flipped: connect a reader to it)."""
        return getattr(self, f"read{i}")

    def elaborate(self, platform):
        m = Module()
        # One write port, several read ports: yosys replicates the block RAM per read port.
        m.d.comb += self.append.ready.eq(1)
        m.submodules.mem = mem = memory.Memory(shape=self._token_width, depth=self._max_tokens,
                                               init=[])
        wp = mem.write_port()
        full = self.count == self._max_tokens
        with m.If(self.append.valid & ~full):
            m.d.comb += [wp.addr.eq(self.count), wp.data.eq(self.append.payload), wp.en.eq(1)]
        with m.Else():
            m.d.comb += [wp.addr.eq(self.write.addr), wp.data.eq(self.write.data),
                         wp.en.eq(self.write.en)]
        with m.If(self.clear):
            m.d.sync += [self.count.eq(0), self.overflow.eq(0)]
        with m.Elif(self.count_we):
            m.d.sync += self.count.eq(Mux(self.set_count > self._max_tokens, self._max_tokens,
                                          self.set_count))
        with m.Elif(self.append.valid):
            with m.If(full):
                m.d.sync += self.overflow.eq(1)
            with m.Else():
                m.d.sync += self.count.eq(self.count + 1)
        for i in range(self._read_ports):
            port = self.read_port(i)
            rp = mem.read_port(transparent_for=())         # en: 1 (its reset value)
            fresh = Signal(name=f"fresh{i}")               # ``en`` a clock ago
            held = Signal(self._token_width, name=f"held{i}")
            m.d.sync += [fresh.eq(port.en), held.eq(port.data)]
            m.d.comb += [rp.addr.eq(port.addr), port.data.eq(Mux(fresh, rp.data, held))]
        return m
