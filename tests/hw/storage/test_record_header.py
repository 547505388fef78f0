"""The header encoder and parser (hw/storage/record_header.py) against the golden header
(host/record/codec.py's ``encode_header``), on random and boundary fields, bytes in random order."""

import random

import pytest
from amaranth.sim import Simulator

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.record import (
    CONST_RANGES,
    HEADER_OFFSETS,
    SECTOR,
    RecordLayout,
    RecordStatus,
    header_template,
    kv_bytes_of,
)
from ringkv.host.record import RecordError, crc32, decode_header, encode_header
from ringkv.hw.storage.record_header import (
    HEADER_CHECKS,
    HeaderEncoder,
    HeaderFields,
    HeaderParser,
    ParsedHeader,
)

SMALL = RingKVConfig(layers=2, q_heads=2, kv_heads=1, head_dim=8, window=8, token_width=16,
                     max_tokens=600)
SMALLC = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx1c",
                         "qkv_fracs": ((5, 4, 6), (4, 6, 3))})
CONFIGS = [DEFAULT_CONFIG, SMALL, SMALLC]


def random_fields(config, rng, extreme=None):
    """Golden header arguments: random, or every field at its lowest or highest value."""
    if extreme == "low":
        return dict(count=0, ring_head=0, prefix_hash=0, commit_seq=0, payload_crc=0, kind=0,
                    key_id=0, mac_tag=bytes(16))
    if extreme == "high":
        return dict(count=config.max_tokens, ring_head=config.window - 1,
                    prefix_hash=(1 << 64) - 1, commit_seq=(1 << 32) - 1,
                    payload_crc=(1 << 32) - 1, kind=255, key_id=0xFFFF, mac_tag=b"\xff" * 16)
    return dict(count=rng.randrange(config.max_tokens + 1), ring_head=rng.randrange(config.window),
                prefix_hash=rng.randrange(1 << 64), commit_seq=rng.randrange(1 << 32),
                payload_crc=rng.randrange(1 << 32), kind=rng.randrange(256),
                key_id=rng.randrange(1 << 16), mac_tag=rng.randbytes(16))


def encoder_fields(config, f):
    """The encoder's inputs for golden arguments ``f`` (the lengths follow from the count)."""
    kv = kv_bytes_of(config, f["count"])
    return {"commit_seq": f["commit_seq"], "prefix_hash": f["prefix_hash"], "count": f["count"],
            "ring_head": f["ring_head"],
            "token_bytes": f["count"] * RecordLayout(config).token_bytes,
            "k_bytes": kv // 2, "v_bytes": kv // 2, "payload_crc": f["payload_crc"],
            "kind": f["kind"], "key_id": f["key_id"],
            "mac_tag": int.from_bytes(f["mac_tag"], "little")}


def run(dut, bench, *, clock=True):
    sim = Simulator(dut)
    if clock:
        sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_layouts_cover_the_variable_fields():
    assert set(HeaderFields.members) == set(ParsedHeader.members)
    for name, shape in HeaderFields.members.items():
        assert shape == 8 * HEADER_OFFSETS[name][1]
    assert [status for _, status in HEADER_CHECKS] == [
        "EMPTY", "BAD_VERSION", "BAD_HEADER", "FOREIGN_CONFIG", "BAD_HEADER"]
    with pytest.raises(TypeError, match=r"^config must be a RingKVConfig, not 3$"):
        HeaderEncoder(3)


@pytest.mark.parametrize("config", CONFIGS)
def test_encoder_matches_golden(config):
    """Every byte at every position, in random order, equals the golden header's, for random
    and extreme fields (the CRC bytes from ``header_crc``)."""
    dut = HeaderEncoder(config)
    rng = random.Random(len(config.numerics) + config.window)
    checked = []

    async def bench(ctx):
        for extreme in ("low", "high", None, None):
            f = random_fields(config, rng, extreme)
            want = encode_header(config, **f)
            for name, value in encoder_fields(config, f).items():
                ctx.set(getattr(dut.fields, name), value)
            ctx.set(dut.header_crc, crc32(want[:SECTOR - 4]))
            for pos in rng.sample(range(SECTOR), SECTOR):
                ctx.set(dut.pos, pos)
                assert ctx.get(dut.byte) == want[pos], (extreme, pos)
            checked.append(extreme)

    run(dut, bench, clock=False)
    assert len(checked) == 4


async def parse(ctx, dut, sector, rng, order=None, gaps=0.3):
    """Give ``sector``'s bytes to the parser (in ``order``), with idle clocks holding garbage."""
    for pos in order or range(SECTOR):
        while rng.random() < gaps:
            ctx.set(dut.valid, 0)
            ctx.set(dut.pos, rng.randrange(SECTOR))
            ctx.set(dut.byte, rng.randrange(256))
            await ctx.tick()
        ctx.set(dut.valid, 1)
        ctx.set(dut.pos, pos)
        ctx.set(dut.byte, sector[pos])
        await ctx.tick()
    ctx.set(dut.valid, 0)


def model_flags(config, sector):
    """The parser's flags for a whole sector: a byte of the range differs from the template."""
    t = header_template(config)

    def differs(*names):
        return int(any(sector[o] != t[o] for n in names for o in range(*CONST_RANGES[n])))
    return {"bad_magic": differs("magic"), "bad_version": differs("version"),
            "bad_config": differs("config", "config_fields", "config_fields_tail")}


@pytest.mark.parametrize("config", [SMALL, SMALLC])
def test_parser_matches_golden(config):
    """Valid headers (random and extreme fields, bytes in random order, idle clocks between)
    give the golden fields and no flag; a header with a byte changed in one of the constant
    ranges sets that range's flag and the golden decode refuses it with the matching status;
    ``clear`` zeroes sequence, hash, count and the flags."""
    dut = HeaderParser(config)
    rng = random.Random(61 + config.window)
    seen = []

    async def bench(ctx):
        for extreme in ("low", "high", None, None):
            f = random_fields(config, rng, extreme)
            sector = encode_header(config, **f)
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            await parse(ctx, dut, sector, rng, rng.sample(range(SECTOR), SECTOR))
            h = decode_header(sector, config)
            want = {name: getattr(h, name) for name in ParsedHeader.members}
            want["mac_tag"] = int.from_bytes(want["mac_tag"], "little")
            got = {name: ctx.get(getattr(dut.fields, name)) for name in ParsedHeader.members}
            assert got == want
            assert {k: ctx.get(getattr(dut, k)) for k in model_flags(config, sector)} == {
                "bad_magic": 0, "bad_version": 0, "bad_config": 0}
            seen.append("valid")
        status_of = {"bad_magic": RecordStatus.EMPTY, "bad_version": RecordStatus.BAD_VERSION,
                     "bad_config": RecordStatus.FOREIGN_CONFIG}
        for name, (lo, hi) in list(CONST_RANGES.items()) * 3:
            sector = bytearray(encode_header(config, **random_fields(config, rng)))
            off = rng.randrange(lo, hi)
            sector[off] ^= 1 << rng.randrange(8)
            sector[SECTOR - 4:] = crc32(sector[:SECTOR - 4]).to_bytes(4, "little")
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            await parse(ctx, dut, sector, rng)
            flags = {k: ctx.get(getattr(dut, k)) for k in status_of}
            assert flags == model_flags(config, sector)
            (flag,) = [k for k, v in flags.items() if v]
            with pytest.raises(RecordError) as e:
                decode_header(bytes(sector), config)
            assert e.value.status is status_of[flag], (name, off)
            seen.append(flag)
        ctx.set(dut.clear, 1)
        await ctx.tick()
        assert [ctx.get(dut.fields.commit_seq), ctx.get(dut.fields.prefix_hash),
                ctx.get(dut.fields.count), ctx.get(dut.bad_magic), ctx.get(dut.bad_version),
                ctx.get(dut.bad_config)] == [0] * 6

    run(dut, bench)
    assert seen.count("valid") == 4 and {"bad_magic", "bad_version", "bad_config"} <= set(seen)
