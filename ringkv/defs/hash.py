"""The chained prefix hash's constants and parameter rules (``docs/CONVENTIONS.md#hash``).

Shared by the gateware (:class:`ringkv.hw.store.hash_engine.HashEngine`) and its golden model
(:mod:`ringkv.host.golden.hash`, which also documents the round function): the round constants,
the parameter checks, and :func:`hash_seed`, ``h_0``, which folds in the configuration digest
and an optional tenant salt so that prefix hashes of different configurations never match.
"""

import hashlib

from .checks import check_int
from .config import DEFAULT_CONFIG, RingKVConfig

__all__ = ["ROUND_CONSTANTS", "HASH_WIDTH", "HASH_ROUNDS", "check_params", "hash_seed"]

# Round constants: successive 64-bit words of the fractional part of the golden ratio and of
# sqrt(2) (no hidden structure); a w-bit engine uses the low w bits.
ROUND_CONSTANTS = (0x9E3779B97F4A7C15, 0x6A09E667F3BCC908, 0xBB67AE8584CAA73B,
                   0x3C6EF372FE94F82B)
#: The device's hash width and rounds (the engine and the golden model take others too).
HASH_WIDTH = 64
HASH_ROUNDS = 2


def check_params(token_width, hash_width, rounds):
    """Validate hash parameters; raise ``TypeError``/``ValueError`` with a clear message."""
    check_int("Hash width", hash_width)
    if hash_width not in (64, 96, 128):
        raise ValueError(f"Hash width must be 64, 96 or 128 bits, not {hash_width!r}")
    check_int("Token width", token_width, low=1, high=hash_width // 2, unit=" bits")
    check_int("Rounds", rounds, low=1, high=len(ROUND_CONSTANTS))


def hash_seed(config: RingKVConfig = DEFAULT_CONFIG, salt: bytes = b"",
              width: int = HASH_WIDTH) -> int:
    """``h_0`` of the chained prefix hash: config digest and optional tenant salt folded."""
    if width % 8:
        raise ValueError(f"hash width must be a multiple of 8, not {width!r}")
    d = hashlib.blake2b(config.digest() + salt, digest_size=width // 8, person=b"ringkv-seed")
    return int.from_bytes(d.digest(), "little")
