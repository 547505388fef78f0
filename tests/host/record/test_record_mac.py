"""Sealed records: the MAC fields of the header, encode/verify under a key ring, and that an
open record is byte for byte what the encoder wrote before the fields existed."""

import hashlib

import numpy as np
import pytest

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.record import (
    HEADER_FIELDS,
    RECORD_STATUS_BITS,
    SECTOR,
    RecordLayout,
    RecordStatus,
    mac_message,
    put_field,
)
from ringkv.host.golden.mac import mac
from ringkv.host.record import (
    RecordError,
    crc32,
    decode_header,
    encode_payload,
    encode_record,
    import_record,
    read_record_bytes,
    record_writes,
    ring_dtype,
    scan_image,
)

SMALL = RingKVConfig(layers=2, q_heads=2, kv_heads=1, head_dim=8, window=8, token_width=16,
                     max_tokens=300)
KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))


class Image:
    def __init__(self, config, regions=2):
        self.lay = RecordLayout(config)
        self.data = bytearray(regions * self.lay.sectors_per_region * SECTOR)

    def read(self, lba, n):
        return bytes(self.data[lba * SECTOR:(lba + n) * SECTOR])

    def write(self, region, writes):
        base = self.lay.region_lba(region) * SECTOR
        for off, data in writes:
            self.data[base + off * SECTOR:base + off * SECTOR + len(data)] = data


def snapshot(config, seed, count):
    rng = np.random.default_rng(seed)
    rings = rng.integers(0, 256, (config.layers, config.kv_heads, 2, config.window,
                                  config.head_dim)).astype(ring_dtype(config))
    tokens = [int(t) for t in rng.integers(0, 2 ** config.token_width, count)]
    return tokens, rings


def sealed_image(config=SMALL, count=11, key=KEY_A, key_id=1, prefix_hash=0x55):
    tokens, rings = snapshot(config, 3, count)
    img = Image(config)
    img.write(0, encode_record(config, tokens, rings, count=count, ring_head=2,
                               prefix_hash=prefix_hash, commit_seq=5, key=key, key_id=key_id))
    return img, tokens, rings


def do_import(config, img, tokens, keys, *, sealed=False, count=11, prefix_hash=0x55):
    rings = np.zeros((config.layers, config.kv_heads, 2, config.window, config.head_dim),
                     dtype=ring_dtype(config))
    status, _, meta = import_record(config, img.read, 0, count=count, prefix_hash=prefix_hash,
                                    session_tokens=tokens, rings=rings, keys=keys,
                                    sealed=sealed)
    return status, meta, rings


def test_fields_in_zero_bytes_and_status_room():
    spans = sorted((off, off + size) for _, off, size in HEADER_FIELDS)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))     # no overlap
    offs = {name: (off, size) for name, off, size in HEADER_FIELDS}
    assert offs["mac_tag"] == (308, 16) and offs["key_id"] == (324, 2)
    assert max(s.value for s in RecordStatus) < 1 << RECORD_STATUS_BITS


# sha256 over (offset, bytes) of every write of encode_record for fixed inputs, taken from the
# encoder before the MAC fields existed: an open record is unchanged to the byte
OPEN_DIGESTS = {
    (0, 0): "6a46a18f1e45576219945965c28f806e94e5f23dc10435fd503a673704275cc2",
    (5, 4): "ba253bb3df848f13a729869d017e06cfae40d0289e32222a42deade650e9a345",
    (DEFAULT_CONFIG.window + 7, 6):
        "a39850e5e48014870a3c7ddba7676274cca54f9774d923e3a490eea48544a88e",
}


def test_open_records_byte_identical():
    c = DEFAULT_CONFIG
    rng = np.random.default_rng(26)
    for (count, head), want in OPEN_DIGESTS.items():
        rings = rng.integers(0, 256, (c.layers, c.kv_heads, 2, c.window, c.head_dim)).astype(
            ring_dtype(c))
        toks = [int(t) for t in rng.integers(0, 2 ** c.token_width, count)]
        w = encode_record(c, toks, rings, count=count, ring_head=head,
                          prefix_hash=0x0123456789ABCDEF, commit_seq=77, kind=1)
        got = hashlib.sha256(b"".join(off.to_bytes(4, "little") + d for off, d in w))
        assert got.hexdigest() == want
        h = decode_header(w[-1][1], c)
        assert h.key_id == 0 and h.mac_tag == bytes(16) and not h.sealed


def test_sealed_round_trip_and_tag_is_the_defined_message():
    img, tokens, rings = sealed_image()
    header = img.read(0, 1)
    h = decode_header(header, SMALL)
    assert h.key_id == 1 and h.sealed and h.mac_tag != bytes(16)
    tok, kv = encode_payload(SMALL, tokens, rings, 11, 2)
    assert h.mac_tag == mac(KEY_A, mac_message(tok, kv, header))
    assert mac_message(tok, kv, header)[len(tok) + len(kv) + 308:][:16] == bytes(16)
    assert crc32(header[:508]) == h.header_crc            # CRC over the header with the tag
    status, meta, got = do_import(SMALL, img, tokens, {1: KEY_A}, sealed=True)
    assert status is RecordStatus.OK and meta == (11, 2)
    want = np.zeros_like(got)
    for s in range(SMALL.window):
        if s in [(2 - 8 + 1 + t) % 8 for t in range(8)]:
            want[:, :, :, s, :] = rings[:, :, :, s, :]
    assert np.array_equal(got, want)
    [info] = scan_image(SMALL, img.read, 1, keys={1: KEY_A})
    assert info.valid and info.key_id == 1 and info.mac_ok is True


def test_forged_record_with_recomputed_crcs_is_refused():
    """Whoever writes a record without the key can recompute tokens, hash and both CRCs: a
    sealed device still misses (BAD_MAC), and leaves the rings empty."""
    img, tokens, _ = sealed_image()
    lay = RecordLayout(SMALL)
    kv_at = lay.kv_sector * SECTOR
    img.data[kv_at] ^= 0x5A                                # change the K/V...
    tok_bytes = img.data[SECTOR:SECTOR + 22]
    kvn = 2 * SMALL.layers * SMALL.kv_heads * 8 * SMALL.head_dim
    header = bytearray(img.read(0, 1))
    put_field(header, "payload_crc", crc32(bytes(tok_bytes) + bytes(img.data[kv_at:kv_at + kvn])))
    put_field(header, "header_crc", crc32(header[:508]))   # ...and fix every CRC
    img.data[:SECTOR] = header
    [info] = scan_image(SMALL, img.read, 1)
    assert info.valid and info.key_id == 1 and info.mac_ok is None   # CRCs alone: fine
    status, meta, rings = do_import(SMALL, img, tokens, {1: KEY_A}, sealed=True)
    assert status is RecordStatus.BAD_MAC and meta == (0, SMALL.window - 1)    # the cleared state
    [info] = scan_image(SMALL, img.read, 1, keys={1: KEY_A})
    assert info.status is RecordStatus.BAD_MAC and info.mac_ok is False
    # forging it as an open record (key id 0, zero tag) does not help on a sealed device
    put_field(header, "key_id", 0)
    put_field(header, "mac_tag", bytes(16))
    put_field(header, "header_crc", crc32(header[:508]))
    img.data[:SECTOR] = header
    status, meta, rings = do_import(SMALL, img, tokens, {1: KEY_A}, sealed=True)
    assert status is RecordStatus.NO_KEY and meta is None and not rings.any()


def test_tenant_a_record_under_tenant_b_key():
    img, tokens, _ = sealed_image(key=KEY_A, key_id=1)
    # B holds only its own key: A's key id is not held
    assert do_import(SMALL, img, tokens, {2: KEY_B}, sealed=True)[0] is RecordStatus.NO_KEY
    # the same key id mapped to B's key (a rotated or misassigned key): the tag fails
    status, meta, rings = do_import(SMALL, img, tokens, {1: KEY_B}, sealed=True)
    assert status is RecordStatus.BAD_MAC and meta == (0, SMALL.window - 1)
    [info] = scan_image(SMALL, img.read, 1, keys={1: KEY_B})
    assert info.status is RecordStatus.BAD_MAC


def test_open_device_never_imports_a_sealed_record():
    img, tokens, _ = sealed_image()
    status, meta, rings = do_import(SMALL, img, tokens, None)
    assert status is RecordStatus.NO_KEY and meta is None and not rings.any()
    [info] = scan_image(SMALL, img.read, 1)                # recovery needs no key
    assert info.valid and info.key_id == 1


def test_every_header_field_is_covered():
    img, tokens, _ = sealed_image()
    for name, off, _size in HEADER_FIELDS:
        if name in ("mac_tag", "header_crc", "magic", "version", "header_bytes"):
            continue
        forged = Image(SMALL)
        forged.data[:] = img.data
        header = bytearray(img.read(0, 1))
        header[off] ^= 0x01
        put_field(header, "header_crc", crc32(header[:508]))
        forged.data[:SECTOR] = header
        [info] = scan_image(SMALL, forged.read, 1, keys={1: KEY_A})
        assert not info.valid, name


def test_record_writes_restamps_sealed_records_only_with_the_key():
    img, _, _ = sealed_image()
    data = read_record_bytes(SMALL, img.read, 0, keys={1: KEY_A})
    with pytest.raises(RecordError) as e:
        record_writes(SMALL, data, commit_seq=9)
    assert e.value.status is RecordStatus.NO_KEY
    h, writes = record_writes(SMALL, data, commit_seq=9, keys={1: KEY_A})
    out = Image(SMALL)
    out.write(1, writes)
    [_, info] = scan_image(SMALL, out.read, 2, keys={1: KEY_A})
    assert info.valid and info.commit_seq == 9 and info.mac_ok is True
    with pytest.raises(RecordError) as e:
        record_writes(SMALL, data, keys={1: KEY_B})
    assert e.value.status is RecordStatus.BAD_MAC


def test_bad_key_ring_messages_hold_no_key():
    img, tokens, _ = sealed_image()
    with pytest.raises(ValueError) as e:
        do_import(SMALL, img, tokens, {1: KEY_A[:31]})
    assert KEY_A[:31].hex() not in str(e.value)
    with pytest.raises(ValueError):
        encode_record(SMALL, tokens, np.zeros((2, 1, 2, 8, 8), np.uint8), count=1, ring_head=0,
                      prefix_hash=0, commit_seq=0, key=KEY_A)     # a key needs a key id
