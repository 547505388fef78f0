"""The CRCs of the link and of the records, as parameters (the Rocksoft/Williams model).

The gateware builds each one with ``amaranth.lib.crc`` from these parameters
(:meth:`CrcSpec.algorithm_kwargs`); the host computes them with the standard library
(``binascii.crc_hqx`` for CRC-16/XMODEM, ``zlib.crc32`` for CRC-32/ISO-HDLC), which is fast and
independent of the HDL library. ``tests/defs/test_defs.py`` checks the three agree, and
:meth:`CrcSpec.compute` (a plain bitwise implementation) is the reference for that check.
"""

from dataclasses import dataclass

__all__ = ["CrcSpec"]


@dataclass(frozen=True)
class CrcSpec:
    """A CRC by its catalogue name and parameters; input and output reflected alike."""

    name: str
    width: int
    polynomial: int
    initial: int
    reflect: bool
    xor_output: int

    def algorithm_kwargs(self) -> dict:
        """Keyword arguments of ``amaranth.lib.crc.Algorithm`` for this CRC."""
        return dict(crc_width=self.width, polynomial=self.polynomial,
                    initial_crc=self.initial, reflect_input=self.reflect,
                    reflect_output=self.reflect, xor_output=self.xor_output)

    def update(self, state: int, data: bytes) -> int:
        """The CRC register after ``data`` from ``state``, bit by bit, before the output's
        reflection and XOR (linear in ``state`` and ``data``: the gateware's many-byte update
        networks are derived from it, ``hw/storage/crc_bytes.py``)."""
        top, mask = 1 << (self.width - 1), (1 << self.width) - 1
        for byte in bytes(data):
            if self.reflect:
                byte = int(f"{byte:08b}"[::-1], 2)
            state ^= byte << (self.width - 8)
            for _ in range(8):
                state = ((state << 1) ^ self.polynomial) if state & top else state << 1
                state &= mask
        return state

    def compute(self, data: bytes) -> int:
        """The CRC of ``data``, bit by bit (slow; the reference, not the host's fast path)."""
        crc = self.update(self.initial, data)
        if self.reflect:
            crc = int(f"{crc:0{self.width}b}"[::-1], 2)
        return crc ^ self.xor_output
