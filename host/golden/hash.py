"""Golden model of the chained prefix hash (bit-exact with ``hw/store/hash_engine.py``).

The hash of a token sequence is chained (``docs/CONVENTIONS.md#hash``): ``h_0 = seed`` (from
:func:`ringkv.defs.hash.hash_seed`, which folds in the model-config digest and an optional
tenant salt) and ``h_{i+1} = f(h_i, t_i)``. The engine emits ``h_i`` after every token, so the
hash of every prefix is available, one token per clock.

``f`` is built for one-clock hardware on ECP5 (see the engine's docstring for the cost): the
hash is two words ``x`` (low half) and ``y`` (high half) of ``w = width / 2`` bits, the token is
XORed into ``y``, and ``rounds`` ARX rounds of the Speck cipher's round function mix them::

    y ^= t
    repeat rounds (r = 0, 1, ...):
        x = ((x >>> 8) + y) mod 2^w  XOR  K[r]
        y = (y <<< 3) XOR x

Each round is a bijection of ``(x, y)``, so for a fixed prefix state two different last tokens
never collide, and sequences of equal length that first differ at one position keep different
states as long as the remaining tokens agree. A hash match alone never counts as a hit: the
import compares the stored tokens (``docs/CONVENTIONS.md#records``).
"""

from ringkv.defs.hash import ROUND_CONSTANTS, check_params

__all__ = ["ROUND_CONSTANTS", "hash_step", "prefix_hashes", "sequence_hash", "check_params"]


def hash_step(h: int, token: int, *, width: int = 64, rounds: int = 2) -> int:
    """``f(h, t)``: one token absorbed into hash state ``h``."""
    w = width // 2
    mask = (1 << w) - 1
    x, y = h & mask, (h >> w) & mask
    y ^= token & mask
    for r in range(rounds):
        x = ((((x >> 8) | (x << (w - 8))) & mask) + y) & mask
        x ^= ROUND_CONSTANTS[r] & mask
        y = (((y << 3) | (y >> (w - 3))) & mask) ^ x
    return x | (y << w)


def prefix_hashes(tokens, seed: int, *, width: int = 64, rounds: int = 2) -> list[int]:
    """``[h_1, ..., h_n]``: the hash after each token (what the engine emits)."""
    out, h = [], seed & ((1 << width) - 1)
    for t in tokens:
        h = hash_step(h, int(t), width=width, rounds=rounds)
        out.append(h)
    return out


def sequence_hash(tokens, seed: int, *, width: int = 64, rounds: int = 2) -> int:
    """``h_n`` of the whole sequence (``seed`` itself for an empty one)."""
    h = seed & ((1 << width) - 1)
    for t in tokens:
        h = hash_step(h, int(t), width=width, rounds=rounds)
    return h
