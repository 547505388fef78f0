"""The attention core's numerics: one table shared by the gateware and its golden model.

A numerics names the fixed-point scheme of q, k, v and the output (``RingKVConfig.numerics``,
in the config digest and every record header). Two are defined:

* ``ringkv-fx1`` (the default, SPEC's int8 K/V): q, k, v int8 with real = x / 32, output int16
  with real = o / 8192;
* ``ringkv-fx2`` (wide K/V, for accuracy): q, k, v int16 with real = x / 2048, output int16 with
  real = o / 2048.

Everything else (shifts, output scale, element bytes on the link, in the rings and in records)
follows from the element width and the fraction bits: :class:`Numerics`. The datapath these
constants drive is specified in :mod:`ringkv.host.golden_fixed` (the bit-exact model) and built
in :mod:`ringkv.hw.attention`; the exp table ``EXP_TABLE`` is the ROM both use.
"""

import math
from dataclasses import dataclass

__all__ = [
    "Numerics", "NUMERICS_TABLE", "numerics_of", "FX1", "FX2", "P_FRAC", "SCORE_FRAC",
    "CS_SHIFT", "DOT_FRAC", "BETA_MAX", "EXP_TABLE", "score_const",
]

P_FRAC = 15         # exp weights: Q1.15
SCORE_FRAC = 8      # scores in base-2 log units with 8 fraction bits
CS_SHIFT = 18       # s = ((dot >> DSH) * CS) >> CS_SHIFT
DOT_FRAC = 10       # dot >> DSH is in units 2**-10
BETA_MAX = (1 << 17) - 1

EXP_TABLE = tuple(round(2.0 ** (P_FRAC - f / 256)) for f in range(256))


@dataclass(frozen=True)
class Numerics:
    """One fixed-point scheme of the core: q/k/v width and scale; everything else follows."""

    name: str
    elem_bits: int      # EW: q, k, v are signed EW-bit integers
    qkv_frac: int       # F: real = x * 2**-F

    @property
    def elem_bytes(self) -> int:
        """Bytes per q/k/v element on the link, in the rings and in a record."""
        return self.elem_bits // 8

    @property
    def out_frac(self) -> int:
        """The int16 output has real = o * 2**-out_frac."""
        return self.qkv_frac + 16 - self.elem_bits

    @property
    def dot_shift(self) -> int:
        """DSH: the dot product is shifted to units 2**-10 before the score multiply."""
        return 2 * self.qkv_frac - DOT_FRAC

    @property
    def acc_shift_bits(self) -> int:
        """A: ``sh = bitlength(l) - A`` makes ``acc >> sh`` fit 18 bits signed."""
        return 18 - self.elem_bits

    @property
    def beta_shift(self) -> int:
        """B: ``beta = (alpha * R) >> (e + B - sh)``."""
        return self.elem_bits - 2

    @property
    def qkv_min(self) -> int:
        return -(1 << (self.elem_bits - 1))

    @property
    def qkv_max(self) -> int:
        return (1 << (self.elem_bits - 1)) - 1


FX1 = Numerics("ringkv-fx1", 8, 5)
FX2 = Numerics("ringkv-fx2", 16, 11)
NUMERICS_TABLE = {n.name: n for n in (FX1, FX2)}


def numerics_of(numerics) -> Numerics:
    """A :class:`Numerics` from itself, its name, or ``None`` (the default ``ringkv-fx1``)."""
    if numerics is None:
        return FX1
    if isinstance(numerics, Numerics):
        return numerics
    try:
        return NUMERICS_TABLE[numerics]
    except (KeyError, TypeError):
        raise ValueError(f"unknown numerics {numerics!r}; known: "
                         f"{', '.join(sorted(NUMERICS_TABLE))}") from None




def score_const(head_dim, scale=None):
    """``CS``: the score multiplier folding ``scale`` (default 1/sqrt(d)) and log2(e)."""
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    return int(round(scale * math.log2(math.e) * (1 << 16)))
