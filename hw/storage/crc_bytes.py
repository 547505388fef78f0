"""A CRC over one to four bytes a clock: the record's payload CRC when the import moves its
K/V area four bytes a clock and its tokens one.

Why not ``amaranth.lib.crc`` (which the engine uses for every CRC of one width): its
``Processor`` takes words of one fixed width and keeps its register to itself, so a CRC cannot
go on from a byte stream (the record's tokens, any number of bytes) into a word stream (its K/V
area) in one register, and a payload of tokens whose length is not a multiple of four has no
word-wide form at all. This unit keeps one register and updates it by ``n`` = 1 to 4 bytes of
``data`` a clock: four XOR networks (one per ``n``) derived at elaboration from the CRC's
parameters (:class:`ringkv.defs.crc.CrcSpec`: the same Rocksoft model as ``lib.crc``), the
register's next value chosen by ``n``. The networks come from the bitwise definition
(:meth:`CrcSpec.update`, which :meth:`CrcSpec.compute` uses), applied to unit vectors: the
update is linear in the register and the data bits. ``tests/hw/storage/test_crc_bytes.py``
checks the unit against ``zlib.crc32``, ``CrcSpec.compute`` and ``amaranth.lib.crc`` on random
byte streams split at random.
"""

from functools import cache

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_type
from ringkv.defs.crc import CrcSpec

__all__ = ["CrcBytes", "crc_step_matrix"]


@cache
def crc_step_matrix(spec: CrcSpec, nbytes: int) -> tuple[tuple[int, int], ...]:
    """For each bit ``i`` of the register after ``nbytes`` bytes: ``(state mask, data mask)``,
    the bits of the register before and of the data (the first byte in the low 8 bits) whose
    XOR it is."""
    w = spec.width
    from_state = [spec.update(1 << j, bytes(nbytes)) for j in range(w)]
    from_data = [spec.update(0, (1 << j).to_bytes(nbytes, "little"))
                 for j in range(8 * nbytes)]
    return tuple((sum(1 << j for j in range(w) if from_state[j] >> i & 1),
                  sum(1 << j for j in range(8 * nbytes) if from_data[j] >> i & 1))
                 for i in range(w))


class CrcBytes(wiring.Component):
    """One CRC register, updated by one to four bytes a clock.

    Ports: ``start`` (In 1: the register to the CRC's initial value; with ``valid``, the
    bytes are the first of a new CRC), ``valid`` (In 1), ``data`` (In 32: the bytes, the first
    in the low 8 bits), ``n`` (In 3: how many of them, 1 to 4; 0 or more than 4 leave the
    register unchanged), ``crc`` (Out: the CRC of every byte since ``start``, its output
    reflected and XORed as the spec says; registered: it includes a clock's bytes one clock
    later). Like ``amaranth.lib.crc.Processor`` with a byte count.
    """

    def __init__(self, spec: CrcSpec):
        check_type("spec", spec, CrcSpec)
        if spec.width < 8:
            raise ValueError(f"the CRC must be at least 8 bits wide, not {spec.width}")
        self._spec = spec
        super().__init__({"start": In(1), "valid": In(1), "data": In(32), "n": In(3),
                          "crc": Out(spec.width)})

    @property
    def spec(self) -> CrcSpec:
        return self._spec

    def elaborate(self, platform):
        m = Module()
        spec = self._spec
        w = spec.width
        reg = Signal(w, init=spec.initial)
        source = Signal(w)
        m.d.comb += source.eq(Mux(self.start, spec.initial, reg))
        nexts = {}
        for n in range(1, 5):
            nxt = Signal(w, name=f"after{n}")
            for i, (smask, dmask) in enumerate(crc_step_matrix(spec, n)):
                bit = 0
                for j in range(w):
                    if smask >> j & 1:
                        bit ^= source[j]
                for j in range(8 * n):
                    if dmask >> j & 1:
                        bit ^= self.data[j]
                m.d.comb += nxt[i].eq(bit)
            nexts[n] = nxt
        with m.If(self.valid):
            with m.Switch(self.n):
                for n, nxt in nexts.items():
                    with m.Case(n):
                        m.d.sync += reg.eq(nxt)
                with m.Default():
                    m.d.sync += reg.eq(source)
        with m.Elif(self.start):
            m.d.sync += reg.eq(spec.initial)
        out = reg[::-1] if spec.reflect else reg
        m.d.comb += self.crc.eq(out ^ spec.xor_output)
        return m
