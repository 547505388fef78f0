"""Golden record format: layout, round trip, corruption, foreign config, scan and rebuild."""

import random

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.record import SECTOR, RecordLayout, RecordStatus, header_template
from ringkv.host.errors import ConfigError
from ringkv.host.record import (
    RecordError,
    crc32,
    decode_header,
    encode_header,
    encode_record,
    format_listing,
    import_record,
    main,
    rebuild,
    scan_image,
)

SMALL = RingKVConfig(layers=2, q_heads=2, kv_heads=1, head_dim=8, window=8, token_width=16,
                     max_tokens=300)


class Image:
    def __init__(self, config, regions):
        self.lay = RecordLayout(config)
        self.data = bytearray(regions * self.lay.sectors_per_region * SECTOR)

    def read(self, lba, n):
        return bytes(self.data[lba * SECTOR:(lba + n) * SECTOR])

    def write_record(self, region, writes, upto=None):
        base = self.lay.region_lba(region) * SECTOR
        for i, (off, data) in enumerate(writes):
            if upto is not None and i >= upto:
                return
            self.data[base + off * SECTOR:base + off * SECTOR + len(data)] = data


def random_snapshot(config, rng, count=None):
    count = rng.randrange(0, 3 * config.window) if count is None else count
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]
    rings = np.frombuffer(rng.randbytes(config.layers * config.kv_heads * 2 * config.window
                                        * config.head_dim), dtype=np.uint8).reshape(
        config.layers, config.kv_heads, 2, config.window, config.head_dim).copy()
    head = rng.randrange(config.window)
    return tokens, rings, count, head


def test_layout_default():
    lay = RecordLayout(DEFAULT_CONFIG)
    assert lay.token_bytes == 2
    assert lay.token_sectors_max == 64
    assert lay.kv_sectors_max == 256
    assert lay.sectors_per_region == 321
    assert lay.kv_sector == 65
    assert lay.region_lba(3) == 963
    # the snapshot size stops growing at W tokens except for the tokens themselves
    assert lay.record_bytes(128) == SECTOR * (1 + 1 + 256)
    assert lay.record_bytes(10000) - lay.record_bytes(128) == SECTOR * (40 - 1)


def test_header_fields():
    h = encode_header(DEFAULT_CONFIG, count=300, ring_head=43, prefix_hash=0x1122334455667788,
                      commit_seq=9, payload_crc=0xDEADBEEF)
    assert len(h) == SECTOR and h[:8] == b"RINGKVSN"
    assert h[48:56] == (0x1122334455667788).to_bytes(8, "little")
    assert int.from_bytes(h[508:512], "little") == crc32(h[:508])
    d = decode_header(h)
    assert (d.count, d.ring_head, d.commit_seq, d.payload_crc) == (300, 43, 9, 0xDEADBEEF)
    assert d.token_bytes == 600 and d.k_bytes == d.v_bytes == 4 * 2 * 128 * 64
    assert d.config_fields == {"layers": 4, "q_heads": 4, "kv_heads": 2, "head_dim": 64,
                               "window": 128, "token_width": 16, "max_tokens": 16384,
                               "numerics": "ringkv-fx1"}
    assert header_template(DEFAULT_CONFIG)[16:48] == DEFAULT_CONFIG.digest()


def test_v_column_wise_and_k_token_order():
    c = SMALL
    rings = np.zeros((2, 1, 2, 8, 8), dtype=np.uint8)
    for slot in range(8):
        for dim in range(8):
            rings[1, 0, 0, slot, dim] = 16 * slot + dim
            rings[1, 0, 1, slot, dim] = 16 * slot + dim + 128
    writes = encode_record(c, [0] * 20, rings, count=20, ring_head=2, prefix_hash=1, commit_seq=1)
    kv = writes[1][1]
    per = 8 * 8
    k1 = kv[per:2 * per]
    v1 = kv[3 * per:4 * per]
    order = [(2 - 8 + 1 + t) % 8 for t in range(8)]   # oldest..newest: slots 3,4,...,2
    assert list(k1[:8]) == [16 * order[0] + d for d in range(8)]
    assert list(v1[:8]) == [16 * s + 128 for s in order]          # dim 0 of every token
    assert list(v1[8:16]) == [16 * s + 129 for s in order]        # then dim 1


@settings(max_examples=examples(fast=12, thorough=200))
@given(seed=st.integers(0, 2**32 - 1))
def test_round_trip_random(seed):
    rng = random.Random(seed)
    img = Image(SMALL, 3)
    tokens, rings, count, head = random_snapshot(SMALL, rng)
    img.write_record(1, encode_record(SMALL, tokens, rings, count=count, ring_head=head,
                                      prefix_hash=77, commit_seq=5))
    out = np.zeros_like(rings)
    status, h, meta = import_record(SMALL, img.read, 1, count=count, prefix_hash=77,
                                    session_tokens=tokens, rings=out)
    assert status is RecordStatus.OK and meta == (count, head)
    v = min(count, SMALL.window)
    for t in range(v):
        s = (head - v + 1 + t) % SMALL.window
        assert (out[:, :, :, s, :] == rings[:, :, :, s, :]).all()
    assert import_record(SMALL, img.read, 1)[0] is RecordStatus.OK
    assert import_record(SMALL, img.read, 0)[0] is RecordStatus.EMPTY


def test_every_bit_flip_is_a_miss():
    rng = random.Random(3)
    img = Image(SMALL, 1)
    tokens, rings, count, head = random_snapshot(SMALL, rng, count=11)
    writes = encode_record(SMALL, tokens, rings, count=count, ring_head=head, prefix_hash=5,
                           commit_seq=2)
    img.write_record(0, writes)
    used = [(off * SECTOR + i) for off, data in writes for i in range(len(data))]
    lay = RecordLayout(SMALL)
    # every byte carrying information (header fields, tokens, KV): flip one random bit each
    tok_end = SECTOR + count * 2
    kv_end = lay.kv_sector * SECTOR + 2 * 2 * 8 * 8
    meaningful = [p for p in used if p < 116 or 508 <= p < 512 or SECTOR <= p < tok_end
                  or lay.kv_sector * SECTOR <= p < kv_end]
    for p in meaningful:
        saved = img.data[p]
        img.data[p] ^= 1 << rng.randrange(8)
        status, _, _ = import_record(SMALL, img.read, 0, count=count, prefix_hash=5,
                                     session_tokens=tokens, rings=rings.copy())
        assert status is not RecordStatus.OK, p
        img.data[p] = saved
    assert import_record(SMALL, img.read, 0)[0] is RecordStatus.OK


def test_foreign_config_names_field():
    other = RingKVConfig(**{**SMALL.__dict__, "window": 16})
    rng = random.Random(1)
    tokens, rings, count, head = random_snapshot(other, rng, count=5)
    writes = encode_record(other, tokens, rings, count=count, ring_head=head, prefix_hash=1,
                           commit_seq=1)
    header = writes[-1][1]
    with pytest.raises(RecordError, match=r"window: 16 != 8 \(record != this device\)") as e:
        decode_header(header, SMALL)
    assert e.value.status is RecordStatus.FOREIGN_CONFIG
    other2 = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx2"})
    with pytest.raises(RecordError, match="numerics: 'ringkv-fx2' != 'ringkv-fx1'"):
        decode_header(encode_header(other2, count=0, ring_head=0, prefix_hash=0, commit_seq=0,
                                    payload_crc=0), SMALL)


def test_token_mismatch_and_not_this():
    rng = random.Random(2)
    img = Image(SMALL, 1)
    tokens, rings, count, head = random_snapshot(SMALL, rng, count=40)
    img.write_record(0, encode_record(SMALL, tokens, rings, count=count, ring_head=head,
                                      prefix_hash=9, commit_seq=1))
    bad = list(tokens)
    bad[17] ^= 1
    out = rings.copy()
    assert import_record(SMALL, img.read, 0, count=40, prefix_hash=9, session_tokens=bad,
                         rings=out)[0] is RecordStatus.TOKEN_MISMATCH
    assert (out == rings).all()
    assert import_record(SMALL, img.read, 0, count=39, prefix_hash=9, session_tokens=tokens,
                         rings=out)[0] is RecordStatus.NOT_THIS
    assert import_record(SMALL, img.read, 0, count=40, prefix_hash=8, session_tokens=tokens,
                         rings=out)[0] is RecordStatus.NOT_THIS


def test_torn_export_and_rebuild_newest_wins():
    rng = random.Random(4)
    img = Image(SMALL, 4)
    snap = random_snapshot(SMALL, rng, count=30)
    tokens, rings, count, head = snap
    rec = encode_record(SMALL, tokens, rings, count=count, ring_head=head, prefix_hash=3,
                        commit_seq=1)
    img.write_record(0, rec)
    img.write_record(1, encode_record(SMALL, tokens, rings, count=count, ring_head=head,
                                      prefix_hash=3, commit_seq=4))
    # a newer snapshot of a longer conversation, torn before its header
    t2, r2, c2, h2 = random_snapshot(SMALL, rng, count=31)
    img.write_record(2, encode_record(SMALL, t2, r2, count=c2, ring_head=h2, prefix_hash=6,
                                      commit_seq=5), upto=2)
    infos = scan_image(SMALL, img.read, 4)
    assert [i.status for i in infos] == [RecordStatus.OK, RecordStatus.OK, RecordStatus.EMPTY,
                                         RecordStatus.EMPTY]
    inserts, frees, next_seq = rebuild(infos)
    assert inserts == [(30, 3, 1, 4)]
    assert frees == [0, 2, 3]
    assert next_seq == 5
    listing = format_listing(infos)
    assert "superseded" in listing and "2 valid, 1 live" in listing


def test_inspect_cli(tmp_path, capsys):
    rng = random.Random(5)
    img = Image(DEFAULT_CONFIG, 2)
    tokens, rings, count, head = random_snapshot(DEFAULT_CONFIG, rng, count=200)
    img.write_record(1, encode_record(DEFAULT_CONFIG, tokens, rings, count=count, ring_head=head,
                                      prefix_hash=0xABC, commit_seq=7))
    path = tmp_path / "sd.img"
    path.write_bytes(img.data)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "     1 OK" in out and "0x0000000000000abc" in out and "1 valid" in out


# --- numerics ringkv-fx2: int16 K/V, two bytes per element ---------------------------------

SMALL2 = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx2"})


def random_snapshot16(config, rng, count=None):
    count = rng.randrange(0, 3 * config.window) if count is None else count
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]
    shape = (config.layers, config.kv_heads, 2, config.window, config.head_dim)
    rings = np.array([rng.randrange(-32768, 32768) for _ in range(int(np.prod(shape)))],
                     dtype=np.int64).reshape(shape)
    return tokens, rings, count, rng.randrange(config.window)


def test_layout_fx2_doubles_kv():
    from ringkv.defs.record import elem_bytes, kv_bytes_of
    lay1, lay2 = RecordLayout(SMALL), RecordLayout(SMALL2)
    assert (elem_bytes(SMALL), elem_bytes(SMALL2)) == (1, 2)
    assert lay2.elem_bytes == 2
    assert lay2.kv_bytes_max == 2 * lay1.kv_bytes_max == 2 * 2 * 8 * 8 * 2
    assert lay2.token_sectors_max == lay1.token_sectors_max
    assert kv_bytes_of(SMALL2, 5) == 2 * kv_bytes_of(SMALL, 5) == 2 * 2 * 2 * 5 * 8
    d2 = RecordLayout(RingKVConfig(numerics="ringkv-fx2"))
    assert d2.kv_sectors_max == 512 and d2.sectors_per_region == 1 + 64 + 512
    h = decode_header(encode_header(SMALL2, count=20, ring_head=3, prefix_hash=1, commit_seq=1,
                                    payload_crc=0), SMALL2)
    assert h.k_bytes == h.v_bytes == 2 * 1 * 8 * 8 * 2
    assert h.config_fields["numerics"] == "ringkv-fx2"


SMALL_C = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx1c",
                          "qkv_fracs": ((5, 4, 6), (4, 5, 3))})


def test_fx1c_header_carries_the_fractions():
    """ringkv-fx1c: fx1's layout; the fractions in the digest and in the header's qkv_fracs
    field (the fixed-scale numerics keep their digests and an all-zero field); a record of other
    fractions is foreign, and the message names them."""
    from ringkv.defs.record import HEADER_OFFSETS, decode_fracs, encode_fracs
    assert RecordLayout(SMALL_C).sectors_per_region == RecordLayout(SMALL).sectors_per_region
    assert SMALL.canonical() == (b'{"head_dim":8,"kv_heads":1,"layers":2,"max_tokens":300,'
                                 b'"numerics":"ringkv-fx1","q_heads":2,"token_width":16,'
                                 b'"window":8}')
    assert DEFAULT_CONFIG.digest().hex()[:16] == "e08e9bb33e8e665f"  # as before qkv_fracs
    off, size = HEADER_OFFSETS["qkv_fracs"]
    assert (off, size) == (116, 192) and off + size <= 508
    assert header_template(SMALL)[off:off + size] == bytes(size)
    t = header_template(SMALL_C)
    assert t[off:off + 7] == bytes([5, 4, 6, 4, 5, 3, 0]) == encode_fracs(SMALL_C) + b"\0"
    assert decode_fracs(t, 2) == SMALL_C.qkv_fracs
    tokens, rings, count, head = random_snapshot(SMALL_C, random.Random(1), count=11)
    rec = encode_record(SMALL_C, tokens, rings, count=count, ring_head=head, prefix_hash=5,
                        commit_seq=2)[-1][1]
    h = decode_header(rec, SMALL_C)
    assert h.config_fields["qkv_fracs"] == ((5, 4, 6), (4, 5, 3))
    other = RingKVConfig(**{**SMALL_C.__dict__, "qkv_fracs": ((5, 4, 6), (4, 5, 4))})
    assert other.digest() != SMALL_C.digest()
    for config, match in ((other, r"qkv_fracs: \(\(5, 4, 6\), \(4, 5, 3\)\) != "),
                          (SMALL, "numerics: 'ringkv-fx1c' != 'ringkv-fx1'")):
        with pytest.raises(RecordError, match=match) as e:
            decode_header(rec, config)
        assert e.value.status == RecordStatus.FOREIGN_CONFIG


def test_unknown_numerics_is_a_clear_error():
    from ringkv.defs.record import kv_bytes_of
    bad = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx9"})
    msg = (r"^unknown numerics 'ringkv-fx9' \(known: ringkv-fx1, ringkv-fx1c, ringkv-fx2\): no "
           r"record layout for it$")
    with pytest.raises(ValueError, match=msg):
        RecordLayout(bad)
    with pytest.raises(ValueError, match=msg):
        kv_bytes_of(bad, 3)
    tokens, rings, count, head = random_snapshot(SMALL, random.Random(0), count=3)
    with pytest.raises(ValueError, match=msg):
        encode_record(bad, tokens, rings, count=count, ring_head=head, prefix_hash=1,
                      commit_seq=1)


def test_fx2_elements_little_endian_k_token_order_v_column_wise():
    c = SMALL2
    rings = np.zeros((2, 1, 2, 8, 8), dtype=np.int64)
    for slot in range(8):
        for dim in range(8):
            rings[1, 0, 0, slot, dim] = 0x100 * slot + dim + 0x1000          # K
            rings[1, 0, 1, slot, dim] = -(0x100 * slot + dim + 1)            # V, negative
    writes = encode_record(c, [0] * 20, rings, count=20, ring_head=2, prefix_hash=1,
                           commit_seq=1)
    kv = writes[1][1]
    per = 8 * 8 * 2                       # bytes of one (layer, kv_head) block
    k1 = kv[per:2 * per]
    v1 = kv[3 * per:4 * per]
    order = [(2 - 8 + 1 + t) % 8 for t in range(8)]   # oldest..newest: slots 3,4,...,2

    def words(b):
        return [int.from_bytes(b[i:i + 2], "little", signed=True) for i in range(0, len(b), 2)]

    assert list(k1[:2]) == [0x00, 0x10 + order[0]]        # low byte first, bytes together
    assert words(k1[:16]) == [0x100 * order[0] + d + 0x1000 for d in range(8)]
    assert words(v1[:16]) == [-(0x100 * s + 1) for s in order]      # dim 0 of every token
    assert words(v1[16:32]) == [-(0x100 * s + 2) for s in order]    # then dim 1
    assert len(kv) == 2 * 2 * 8 * 8 * 2


@settings(max_examples=examples(fast=8, thorough=100))
@given(seed=st.integers(0, 2**32 - 1))
def test_fx2_round_trip_random(seed):
    from ringkv.host.record import ring_image, rings_from_image
    rng = random.Random(100 + seed)
    img = Image(SMALL2, 3)
    tokens, rings, count, head = random_snapshot16(SMALL2, rng)
    img.write_record(2, encode_record(SMALL2, tokens, rings, count=count, ring_head=head,
                                      prefix_hash=77, commit_seq=5))
    out = np.zeros(rings.shape, dtype=np.uint16)
    status, h, meta = import_record(SMALL2, img.read, 2, count=count, prefix_hash=77,
                                    session_tokens=tokens, rings=out)
    assert status is RecordStatus.OK and meta == (count, head)
    signed = rings_from_image(SMALL2, ring_image(SMALL2, out), signed=True)
    v = min(count, SMALL2.window)
    for t in range(v):
        s = (head - v + 1 + t) % SMALL2.window
        assert (signed[:, :, :, s, :] == rings[:, :, :, s, :]).all()
        assert (out[:, :, :, s, :] == (rings[:, :, :, s, :] & 0xFFFF)).all()
    # an fx1 device refuses the record by name; the fx2 scan accepts it
    assert import_record(SMALL2, img.read, 2)[0] is RecordStatus.OK
    with pytest.raises(RecordError, match="numerics: 'ringkv-fx2' != 'ringkv-fx1'"):
        decode_header(img.read(RecordLayout(SMALL2).region_lba(2), 1), SMALL)


def test_fx2_every_kv_bit_flip_is_a_miss():
    rng = random.Random(8)
    img = Image(SMALL2, 1)
    tokens, rings, count, head = random_snapshot16(SMALL2, rng, count=3)
    img.write_record(0, encode_record(SMALL2, tokens, rings, count=count, ring_head=head,
                                      prefix_hash=5, commit_seq=2))
    lay = RecordLayout(SMALL2)
    start = lay.kv_sector * SECTOR
    for p in range(start, start + 2 * 2 * 3 * 8 * 2):
        saved = img.data[p]
        img.data[p] ^= 1 << rng.randrange(8)
        status, _, _ = import_record(SMALL2, img.read, 0, count=count, prefix_hash=5,
                                     session_tokens=tokens, rings=np.zeros(rings.shape,
                                                                           dtype=np.uint16))
        assert status is RecordStatus.BAD_PAYLOAD_CRC, p
        img.data[p] = saved


def test_fx1_bytes_unchanged_by_element_words():
    """fx1 rings given as signed int8 values or as their uint8 bytes encode identically."""
    from ringkv.host.record import ring_image
    rng = random.Random(9)
    tokens, rings, count, head = random_snapshot(SMALL, rng, count=13)
    signed = rings.astype(np.int8).astype(np.int64)
    a = encode_record(SMALL, tokens, rings, count=count, ring_head=head, prefix_hash=1,
                      commit_seq=1)
    b = encode_record(SMALL, tokens, signed, count=count, ring_head=head, prefix_hash=1,
                      commit_seq=1)
    assert a == b
    assert ring_image(SMALL, signed) == rings.tobytes()


def test_inspect_cli_fx2(tmp_path, capsys):
    fx2 = RingKVConfig(**{**DEFAULT_CONFIG.__dict__, "numerics": "ringkv-fx2"})
    rng = random.Random(6)
    img = Image(fx2, 2)
    tokens, rings, count, head = random_snapshot16(fx2, rng, count=20)
    img.write_record(0, encode_record(fx2, tokens, rings, count=count, ring_head=head,
                                      prefix_hash=0xDEF, commit_seq=3))
    path = tmp_path / "sd2.img"
    path.write_bytes(img.data)
    for options in ([], ["--numerics", "ringkv-fx2"]):      # the records state fx2
        assert main([str(path), *options]) == 0
        out = capsys.readouterr().out
        assert "     0 OK" in out and "0x0000000000000def" in out and "1 valid" in out
        assert "ringkv-fx2" in out.splitlines()[0]
    # read as fx1 (another element size: another region layout): refused, not misread
    with pytest.raises(ConfigError, match="another region layout") as e:
        main([str(path), "--numerics", "ringkv-fx1"])
    assert e.value.exit_code == 3
