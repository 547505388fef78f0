"""The golden record MAC against published vectors, and its two implementations against each
other (``hashlib.blake2s`` and the RFC 7693 transcription)."""

import hashlib
import random

import pytest
from mac_vectors import KAT, KAT_KEY, kat_input

from ringkv.defs.config import DEFAULT_CONFIG
from ringkv.defs.mac import KEY_BYTES, PERSON_RECORD, PERSON_SEED, PERSONS, TAG_BYTES
from ringkv.host.golden import mac as golden_mac

#: RFC 7693 Appendix B: BLAKE2s-256("abc"), unkeyed.
RFC7693_ABC = bytes.fromhex(
    "508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982")
def test_rfc7693_appendix_b():
    assert hashlib.blake2s(b"abc").digest() == RFC7693_ABC
    assert golden_mac.blake2s(b"abc") == RFC7693_ABC


@pytest.mark.parametrize("n", sorted(KAT))
def test_keyed_kat(n):
    expected = bytes.fromhex(KAT[n])
    assert golden_mac.mac(KAT_KEY, kat_input(n), person=b"", digest_bytes=32) == expected
    assert golden_mac.blake2s(kat_input(n), key=KAT_KEY) == expected


def test_rfc_transcription_equals_hashlib():
    rng = random.Random(7)
    for n in (0, 1, 31, 63, 64, 65, 127, 128, 129, 1000):
        for person in PERSONS:
            for digest_bytes in (8, TAG_BYTES, 32):
                key = rng.randbytes(KEY_BYTES)
                msg = rng.randbytes(n)
                assert (golden_mac.blake2s(msg, key=key, person=person, digest_bytes=digest_bytes)
                        == golden_mac.mac(key, msg, person=person, digest_bytes=digest_bytes))


def test_block_schedule():
    key = bytes(range(32))
    sched = golden_mac.blocks(b"", key)
    assert [(t, f) for _, t, f in sched] == [(64, True)]
    sched = golden_mac.blocks(bytes(64), key)
    assert [(t, f) for _, t, f in sched] == [(64, False), (128, True)]
    sched = golden_mac.blocks(bytes(65), key)
    assert [(t, f) for _, t, f in sched] == [(64, False), (128, False), (129, True)]
    trace = []
    golden_mac.blake2s(bytes(65), key=key, trace=trace)
    assert len(trace) == 3


def test_persons_separate_uses():
    key = bytes(range(32))
    msg = b"the same bytes"
    assert golden_mac.mac(key, msg, person=PERSON_RECORD) != golden_mac.mac(
        key, msg, person=PERSON_SEED)
    assert len(golden_mac.mac(key, msg)) == TAG_BYTES
    # a 16-byte tag is not a prefix of the 32-byte digest: digest_size is in the parameter block
    assert golden_mac.mac(key, msg, digest_bytes=32)[:16] != golden_mac.mac(key, msg)


def test_tenant_seed():
    a, b = bytes(32), bytes([1]) + bytes(31)
    digest = DEFAULT_CONFIG.digest()
    seed = golden_mac.tenant_seed(a, digest)
    assert 0 <= seed < 2 ** 64
    assert seed == int.from_bytes(
        hashlib.blake2s(digest, key=a, person=PERSON_SEED, digest_size=16).digest()[:8], "little")
    assert seed != golden_mac.tenant_seed(b, digest)
    assert seed != golden_mac.tenant_seed(a, bytes(32))


@pytest.mark.parametrize("key, exc, text", [
    ("k" * 32, TypeError, "key must be bytes, not str"),
    (bytes(31), ValueError, "key must be 32 bytes, not 31"),
    (bytes(33), ValueError, "key must be 32 bytes, not 33"),
])
def test_bad_key(key, exc, text):
    with pytest.raises(exc, match=text):
        golden_mac.mac(key, b"")


def test_bad_person_and_digest():
    with pytest.raises(ValueError, match="person must be at most 8 bytes, not 9"):
        golden_mac.mac(bytes(32), b"", person=bytes(9))
    with pytest.raises(ValueError, match="digest_bytes must be between 1 and 32, not 33"):
        golden_mac.mac(bytes(32), b"", digest_bytes=33)
