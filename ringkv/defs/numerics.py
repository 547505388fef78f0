"""The attention core's numerics: one table shared by the gateware and its golden model.

A numerics names the fixed-point scheme of q, k, v and the output (``RingKVConfig.numerics``,
in the config digest and every record header). Three are defined:

* ``ringkv-fx1`` (the default, int8 K/V): q, k, v int8 with real = x / 32, output int16
  with real = o / 8192;
* ``ringkv-fx2`` (wide K/V, for accuracy): q, k, v int16 with real = x / 2048, output int16 with
  real = o / 2048;
* ``ringkv-fx1c`` (int8 K/V with calibrated per-layer scales): q, k, v int8 with a power-of-two
  scale per layer and per kind, ``real = x * 2**-Fq``, ``2**-Fk``, ``2**-Fv`` for layer ``l``'s
  ``(Fq, Fk, Fv) = RingKVConfig.qkv_fracs[l]`` (chosen by a calibration pass on training data,
  :mod:`ringkv.host.model.calibrate`); output int16 with real = o * 2**-(Fv + 8).

Everything else (shifts, output scale, element bytes on the link, in the rings and in records)
follows from the element width and the fraction bits: :class:`Numerics`. The core applies a
layer's fractions with its existing constants: the score constant becomes per layer,
``CS_l = round(scale * log2(e) * 2**(16 + 2F - Fq - Fk))`` with ``F`` the numerics' base
fraction (5 for the int8 formats, so the dot shift stays 0), which is ``CS`` itself whenever
``Fq + Fk = 2F`` (so fx1 and fx2 are unchanged); a layer's ``CS_l`` is picked from a
``L``-entry table by the command's layer (:func:`layer_score_consts`). ``Fv`` never reaches the
core: the output is a convex combination of v in v's units (with 8 more fraction bits), so the
host quantizes v and dequantizes the output with the layer's ``Fv``. The datapath these
constants drive is specified in :mod:`ringkv.host.golden.fixed` (the bit-exact model) and built
in :mod:`ringkv.hw.attention.core`; the exp table ``EXP_TABLE`` is the ROM both use.
"""

import math
from dataclasses import dataclass

__all__ = [
    "Numerics", "NUMERICS_TABLE", "numerics_of", "FX1", "FX2", "FX1C", "P_FRAC", "SCORE_FRAC",
    "CS_SHIFT", "CS_MAX", "DOT_FRAC", "BETA_MAX", "EXP_TABLE", "FRAC_MAX", "score_const",
    "layer_score_consts",
]

P_FRAC = 15         # exp weights: Q1.15
SCORE_FRAC = 8      # scores in base-2 log units with 8 fraction bits
CS_SHIFT = 18       # s = ((dot >> DSH) * CS) >> CS_SHIFT
DOT_FRAC = 10       # dot >> DSH is in units 2**-10
BETA_MAX = (1 << 17) - 1
CS_MAX = (1 << 17) - 1  # the score constant is an unsigned 17-bit multiplier operand
FRAC_MAX = 15           # per-layer fractions: 0 .. 15 (one byte each in a record header)

EXP_TABLE = tuple(round(2.0 ** (P_FRAC - f / 256)) for f in range(256))


@dataclass(frozen=True)
class Numerics:
    """One fixed-point scheme of the core: q/k/v width and scale; everything else follows."""

    name: str
    elem_bits: int      # EW: q, k, v are signed EW-bit integers
    qkv_frac: int       # F: real = x * 2**-F (the base fraction of a per-layer numerics)
    per_layer: bool = False     # fractions per layer and kind from RingKVConfig.qkv_fracs

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

    def layer_fracs(self, layers: int, qkv_fracs=()) -> tuple:
        """``(Fq, Fk, Fv)`` of each of ``layers`` layers: the configuration's ``qkv_fracs``
        for a per-layer numerics, ``(F, F, F)`` otherwise. ``ValueError`` for fractions that
        do not fit this numerics (wrong count, not integers in ``0 .. FRAC_MAX``, or given to
        a numerics with fixed scales)."""
        if not self.per_layer:
            if qkv_fracs:
                raise ValueError(f"{self.name} has fixed scales (2**-{self.qkv_frac}); "
                                 f"qkv_fracs must be empty, not {qkv_fracs!r}")
            return ((self.qkv_frac,) * 3,) * layers
        fracs = tuple(tuple(t) for t in qkv_fracs)
        if len(fracs) != layers or any(len(t) != 3 for t in fracs):
            raise ValueError(f"{self.name} needs qkv_fracs: one (Fq, Fk, Fv) per layer "
                             f"({layers}), not {qkv_fracs!r}")
        for t in fracs:
            for f in t:
                if not isinstance(f, int) or isinstance(f, bool) or not 0 <= f <= FRAC_MAX:
                    raise ValueError(f"qkv_fracs of {self.name}: fractions are integers "
                                     f"0..{FRAC_MAX}, not {f!r} (in {qkv_fracs!r})")
        return fracs

    def out_frac_of(self, fv: int) -> int:
        """The int16 output of a layer whose v has ``fv`` fraction bits: real = o * 2**-that."""
        return fv + 16 - self.elem_bits


FX1 = Numerics("ringkv-fx1", 8, 5)
FX2 = Numerics("ringkv-fx2", 16, 11)
FX1C = Numerics("ringkv-fx1c", 8, 5, per_layer=True)
NUMERICS_TABLE = {n.name: n for n in (FX1, FX2, FX1C)}


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


def score_const(head_dim, scale=None, shift=0):
    """``CS``: the score multiplier folding ``scale`` (default 1/sqrt(d)) and log2(e), times
    ``2**shift`` (``2F - Fq - Fk`` of a layer of a per-layer numerics, 0 otherwise)."""
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    return int(round(scale * math.log2(math.e) * 2.0 ** (16 + shift)))


def layer_score_consts(numerics, head_dim, layers, qkv_fracs=(), scale=None) -> tuple:
    """``CS_l`` of every layer (see the module docstring): all equal to :func:`score_const`
    for a numerics with fixed scales. ``ValueError`` when a layer's constant falls outside
    ``1 .. CS_MAX`` (fractions too small or too large for this head size and scale)."""
    nx = numerics_of(numerics)
    out = []
    for layer, (fq, fk, _) in enumerate(nx.layer_fracs(layers, qkv_fracs)):
        cs = score_const(head_dim, scale, 2 * nx.qkv_frac - fq - fk)
        if not 1 <= cs <= CS_MAX:
            raise ValueError(f"layer {layer}: q/k fractions {fq} + {fk} with d={head_dim}, "
                             f"scale {scale!r} give a score constant {cs} outside "
                             f"1..{CS_MAX}")
        out.append(cs)
    return tuple(out)
