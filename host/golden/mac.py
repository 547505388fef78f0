"""Golden model of the record MAC: keyed BLAKE2s (RFC 7693), bit-exact with ``hw/seal/mac.py``.

:func:`mac` is the reference every test and the host use: Python's ``hashlib.blake2s``, an
implementation independent of ours (CPython builds it from the BLAKE2 reference code or
libb2). :func:`blake2s` is a second, plain implementation written from RFC 7693's pseudocode
(sections 3.1 to 3.3), for checking the internals the gateware exposes to its tests: the
chaining value after each block and the block schedule (:func:`blocks`). The tests check both
against the published vectors and against each other.

The constants (tag and key sizes, persons, IV, SIGMA) are :mod:`ringkv.defs.mac`'s, the
choices are explained there and in ``docs/blocks/mac.md``.
"""

import hashlib

from ringkv.defs.checks import check_int
from ringkv.defs.mac import (
    BLOCK_BYTES,
    IV,
    KEY_BYTES,
    PERSON_BYTES,
    PERSON_RECORD,
    PERSON_SEED,
    ROUNDS,
    SEED_BYTES,
    SIGMA,
    TAG_BYTES,
    param_word0,
)

__all__ = ["mac", "tenant_seed", "blake2s", "blocks", "compress", "initial_state",
           "check_key", "check_person"]

_MASK = 0xFFFFFFFF


def check_key(key) -> bytes:
    """``key`` as bytes, or ``TypeError``/``ValueError`` naming what is wrong."""
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"key must be bytes, not {type(key).__name__}")
    if len(key) != KEY_BYTES:
        raise ValueError(f"key must be {KEY_BYTES} bytes, not {len(key)}")
    return bytes(key)


def check_person(person) -> bytes:
    if not isinstance(person, (bytes, bytearray)):
        raise TypeError(f"person must be bytes, not {type(person).__name__}")
    if len(person) > PERSON_BYTES:
        raise ValueError(f"person must be at most {PERSON_BYTES} bytes, not {len(person)}")
    return bytes(person)


def mac(key: bytes, message: bytes, *, person: bytes = PERSON_RECORD,
        digest_bytes: int = TAG_BYTES) -> bytes:
    """The tag of ``message`` under ``key`` (32 bytes) and ``person``: keyed BLAKE2s through
    ``hashlib``."""
    check_key(key)
    check_person(person)
    check_int("digest_bytes", digest_bytes, low=1, high=32)
    return hashlib.blake2s(bytes(message), key=key, person=person,
                           digest_size=digest_bytes).digest()


def tenant_seed(key: bytes, config_digest: bytes) -> int:
    """A tenant's 64-bit prefix-hash seed ``h_0``: the MAC of the configuration digest under
    the tenant's key with :data:`PERSON_SEED`, its first 8 bytes little-endian.

    The configuration digest keeps seeds of different configurations apart, as
    :func:`ringkv.defs.hash.hash_seed` does for the open seed; the person keeps a seed from
    ever equalling a record tag's bytes."""
    return int.from_bytes(mac(key, config_digest, person=PERSON_SEED)[:SEED_BYTES], "little")


# --- RFC 7693, written from its pseudocode -------------------------------------------------

def _rotr(x: int, n: int) -> int:
    return ((x >> n) | (x << (32 - n))) & _MASK


def _g(v, a, b, c, d, x, y):
    """RFC 7693 section 3.1, the mixing function G with BLAKE2s' rotations 16, 12, 8, 7."""
    v[a] = (v[a] + v[b] + x) & _MASK
    v[d] = _rotr(v[d] ^ v[a], 16)
    v[c] = (v[c] + v[d]) & _MASK
    v[b] = _rotr(v[b] ^ v[c], 12)
    v[a] = (v[a] + v[b] + y) & _MASK
    v[d] = _rotr(v[d] ^ v[a], 8)
    v[c] = (v[c] + v[d]) & _MASK
    v[b] = _rotr(v[b] ^ v[c], 7)


def compress(h: list[int], block: bytes, t: int, final: bool) -> list[int]:
    """RFC 7693 section 3.2, the compression function F: the chaining value after ``block``
    (64 bytes), with ``t`` the bytes compressed so far, this block included."""
    if len(block) != BLOCK_BYTES:
        raise ValueError(f"block must be {BLOCK_BYTES} bytes, not {len(block)}")
    m = [int.from_bytes(block[4 * i:4 * i + 4], "little") for i in range(16)]
    v = list(h) + list(IV)
    v[12] ^= t & _MASK
    v[13] ^= (t >> 32) & _MASK
    if final:
        v[14] ^= _MASK
    for r in range(ROUNDS):
        s = SIGMA[r]
        _g(v, 0, 4, 8, 12, m[s[0]], m[s[1]])
        _g(v, 1, 5, 9, 13, m[s[2]], m[s[3]])
        _g(v, 2, 6, 10, 14, m[s[4]], m[s[5]])
        _g(v, 3, 7, 11, 15, m[s[6]], m[s[7]])
        _g(v, 0, 5, 10, 15, m[s[8]], m[s[9]])
        _g(v, 1, 6, 11, 12, m[s[10]], m[s[11]])
        _g(v, 2, 7, 8, 13, m[s[12]], m[s[13]])
        _g(v, 3, 4, 9, 14, m[s[14]], m[s[15]])
    return [h[i] ^ v[i] ^ v[i + 8] for i in range(8)]


def initial_state(*, key_bytes: int, person: bytes, digest_bytes: int) -> list[int]:
    """The chaining value before the first block: IV XOR the parameter block (no salt)."""
    person = check_person(person).ljust(PERSON_BYTES, b"\0")
    h = list(IV)
    h[0] ^= param_word0(digest_bytes, key_bytes)
    h[6] ^= int.from_bytes(person[:4], "little")
    h[7] ^= int.from_bytes(person[4:], "little")
    return h


def blocks(message: bytes, key: bytes = b"") -> list[tuple[bytes, int, bool]]:
    """RFC 7693 section 3.3's block schedule: ``(block, t, final)`` per compression. With a
    key, the key zero padded to a block comes first; the last block is zero padded; an empty
    unkeyed message is one all-zero final block with ``t = 0``."""
    data = (key.ljust(BLOCK_BYTES, b"\0") if key else b"") + bytes(message)
    if not data:
        return [(bytes(BLOCK_BYTES), 0, True)]
    out = []
    for start in range(0, len(data), BLOCK_BYTES):
        chunk = data[start:start + BLOCK_BYTES]
        end = start + len(chunk)
        out.append((chunk.ljust(BLOCK_BYTES, b"\0"), end, end == len(data)))
    return out


def blake2s(message: bytes, *, key: bytes = b"", person: bytes = b"",
            digest_bytes: int = 32, trace: list | None = None) -> bytes:
    """BLAKE2s from RFC 7693 alone (no ``hashlib``); ``trace``, when given, receives the
    chaining value (8 words) after every block."""
    if len(key) > KEY_BYTES:
        raise ValueError(f"key must be at most {KEY_BYTES} bytes, not {len(key)}")
    check_int("digest_bytes", digest_bytes, low=1, high=32)
    h = initial_state(key_bytes=len(key), person=person, digest_bytes=digest_bytes)
    for block, t, final in blocks(message, key):
        h = compress(h, block, t, final)
        if trace is not None:
            trace.append(list(h))
    return b"".join(w.to_bytes(4, "little") for w in h)[:digest_bytes]
