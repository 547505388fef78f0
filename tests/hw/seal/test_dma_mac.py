"""Sealed transfers: the DMA engine driving the record MAC (``DmaEngine`` + ``MacUnit``'s
``MacCore`` and ``KeySlots``) in the Amaranth simulator, against the golden sealed record
(``host/record/codec.py``'s ``encode_record`` / ``import_record`` with keys; ``hashlib.blake2s`` is
the MAC's reference), with random idle and stalls on every storage stream."""

import random

import pytest
from conftest import examples
from dma_helpers import (
    dma_op,
    load_state,
    new_image,
    random_session,
    read_state,
    set_key,
    simulate,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from ringkv.defs.config import RingKVConfig
from ringkv.defs.mac import KEY_SLOTS
from ringkv.defs.record import (
    MAC_HEADER_BYTES,
    SECTOR,
    RecordLayout,
    RecordStatus,
    kv_bytes_of,
    put_field,
)
from ringkv.host.record import (
    crc32,
    encode_record,
    import_record,
    scan_image,
)
from ringkv.hw.storage.dma import DmaOp
from ringkv.hw.storage.dma_stream import RecordSegment
from ringkv.hw.storage.port import StorageOp

# background testbenches (the storage server) are abandoned when the body ends
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
# the fast tier keeps one case of each flow and the block boundary itself; the other counts,
# numerics and phases repeat the same flow (each about 10 s on 2 busy cores)
SLOW = pytest.mark.slow

SMALL = RingKVConfig(layers=2, q_heads=2, kv_heads=1, head_dim=8, window=8, token_width=16,
                     max_tokens=600)
# one byte per token: message lengths at every byte, so a record can end on a MAC block
TINY = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=4, window=4, token_width=8,
                    max_tokens=40)
SMALL2 = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx2"})

KEYS = {slot: (0x100 + 17 * slot, random.Random(slot).randbytes(32)) for slot in range(KEY_SLOTS)}


def mac_bytes(config, count):
    """The record MAC's message length: tokens, K/V, header bytes 0..507."""
    return (count * RecordLayout(config).token_bytes + kv_bytes_of(config, count)
            + MAC_HEADER_BYTES)


async def set_keys(ctx, h, slots):
    for slot in slots:
        await set_key(ctx, h, slot, *KEYS[slot])


def golden_writes(config, session, *, hash, seq, slot=None):
    """The golden record's writes ``[(sector offset, bytes)]``: sealed under ``KEYS[slot]``,
    or open."""
    rings, count, head, tokens = session
    key_id, key = KEYS[slot] if slot is not None else (0, None)
    return encode_record(config, tokens, rings, count=count, ring_head=head, prefix_hash=hash,
                         commit_seq=seq, key=key, key_id=key_id)


def write_golden(config, image, region, session, **kwargs):
    lay = RecordLayout(config)
    for off, data in golden_writes(config, session, **kwargs):
        image.write(lay.region_lba(region) + off, data)


def expected_image(config, before, region, writes):
    lay = RecordLayout(config)
    expect = bytearray(before)
    base = lay.region_lba(region) * SECTOR
    for off, data in writes:
        expect[base + off * SECTOR:base + off * SECTOR + len(data)] = data
    return bytes(expect)


def test_block_boundary_counts():
    """TINY's counts 35, 36, 37 put the MAC's message one byte short of, exactly on, and one
    byte past a 64-byte block (the boundary cases of the tests below)."""
    assert [mac_bytes(TINY, n) % 64 for n in (35, 36, 37)] == [63, 0, 1]


# --- export ---------------------------------------------------------------------------------

@pytest.mark.parametrize("config,count,slot,seed", [
    (TINY, 0, 0, 1), pytest.param(TINY, 1, 3, 2, marks=SLOW),
    pytest.param(TINY, 35, 1, 3, marks=SLOW), (TINY, 36, 2, 4),
    pytest.param(TINY, 37, 0, 5, marks=SLOW), (TINY, 40, 3, 6),
    pytest.param(SMALL, 7, 2, 7, marks=SLOW), pytest.param(SMALL, 600, 1, 8, marks=SLOW),
    pytest.param(SMALL2, 300, 0, 9, marks=SLOW),
])
def test_sealed_export_bit_exact(config, count, slot, seed):
    """A sealed export under a slot writes the golden sealed record (key id and tag in the
    header, byte for byte), header last; an open export right after it, from the same state,
    writes the golden open record. Random idle and stalls on every storage stream; the MAC
    refuses a new message at random clocks (busy with another user), so the engine waits."""
    rng = random.Random(seed)
    image = new_image(config, 3, rng)
    before = bytes(image[:])
    session = random_session(config, rng, count)
    log = []

    async def body(ctx, h, rng):
        await set_keys(ctx, h, [0, 1, 2, 3])
        await load_state(ctx, h, config, *session)
        sealed = await dma_op(ctx, h, DmaOp.EXPORT, 2, hash=0xABC + seed, seq=seed, sealed=1,
                              slot=slot, rng=rng, idle=0.3)
        opened = await dma_op(ctx, h, DmaOp.EXPORT, 0, hash=0xABD, seq=seed + 1, rng=rng,
                              idle=0.3)
        return sealed, opened

    res = simulate(config, 3, image, body, seed=seed, idle=0.3, stall=0.3, log=log, hold=0.7)
    sealed, opened = res["value"]
    assert sealed == (RecordStatus.OK, count, 0xABC + seed, seed, KEYS[slot][0])
    assert opened == (RecordStatus.OK, count, 0xABD, seed + 1, 0)
    writes = golden_writes(config, session, hash=0xABC + seed, seq=seed, slot=slot)
    expect = expected_image(config, before, 2, writes)
    expect = expected_image(config, expect, 0,
                            golden_writes(config, session, hash=0xABD, seq=seed + 1))
    assert bytes(image[:]) == expect
    lay = RecordLayout(config)
    sealed_writes = [e for e in log if lay.region_lba(2) <= e[1] < lay.region_lba(3)]
    assert sealed_writes[-1] == (StorageOp.WRITE, lay.region_lba(2), 1)


def test_sealed_export_unset_slot_is_no_key():
    """A sealed export under a slot that holds no key (never set, or cleared) is ``NO_KEY``
    and issues no storage command; the slot set again, the export goes through."""
    config = TINY
    rng = random.Random(20)
    image = new_image(config, 2)
    session = random_session(config, rng, 9)
    log = []

    async def body(ctx, h, rng):
        await set_keys(ctx, h, [0, 1])
        await load_state(ctx, h, config, *session)
        out = [await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=1, seq=1, sealed=1, slot=2)]
        await set_key(ctx, h, 1, 0, None)
        out.append(await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=1, seq=1, sealed=1, slot=1))
        n = len(log)
        await set_key(ctx, h, 1, *KEYS[1])
        out.append(await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=1, seq=1, sealed=1, slot=1))
        return out, n

    out, n = simulate(config, 2, image, body, log=log)["value"]
    assert [o[0] for o in out] == [RecordStatus.NO_KEY, RecordStatus.NO_KEY, RecordStatus.OK]
    assert out[0][4] == 0 and n == 0
    assert out[2][4] == KEYS[1][0]


# --- import ---------------------------------------------------------------------------------

@pytest.mark.parametrize("config,count,slot,seed,width", [
    (TINY, 0, 1, 30, 1), pytest.param(TINY, 3, 0, 31, 1, marks=SLOW),
    pytest.param(TINY, 35, 2, 32, 1, marks=SLOW), (TINY, 36, 3, 33, 1),
    pytest.param(TINY, 37, 1, 34, 1, marks=SLOW), (TINY, 40, 0, 35, 1),
    pytest.param(SMALL, 600, 2, 36, 1, marks=SLOW),
    pytest.param(SMALL2, 21, 3, 37, 1, marks=SLOW),
    (TINY, 36, 2, 38, 4), pytest.param(SMALL2, 21, 1, 39, 4, marks=SLOW),
])
def test_sealed_import_of_golden_record(config, count, slot, seed, width):
    """A golden sealed record imports under its slot: ``OK``, the rings and metadata are the
    golden import's; ``VERIFY`` with the slot is ``OK`` and ``HEADER`` reports the key id. The
    MAC refuses a new message at random clocks (the engine waits). On a wide storage port
    (``width`` 4) a sealed import moves its K/V area a byte a clock, at the MAC's pace."""
    rng = random.Random(seed)
    image = new_image(config, 2, rng)
    session = random_session(config, rng, count)
    write_golden(config, image, 1, session, hash=0x55, seq=9, slot=slot)
    stale = random_session(config, rng, 5)

    async def body(ctx, h, rng):
        await set_keys(ctx, h, [0, 1, 2, 3])
        await load_state(ctx, h, config, stale[0], 5, 1, session[3])
        imp = await dma_op(ctx, h, DmaOp.IMPORT, 1, count=count, hash=0x55, sealed=1,
                           slot=slot, rng=rng, idle=0.3)
        state = await read_state(ctx, h, config)
        ver = await dma_op(ctx, h, DmaOp.VERIFY, 1, sealed=1, slot=slot, rng=rng, idle=0.3)
        hdr = await dma_op(ctx, h, DmaOp.HEADER, 1)
        return imp, state, ver, hdr

    res = simulate(config, 2, image, body, seed=seed, idle=0.3, stall=0.3, hold=0.7,
                   width=width)
    imp, (got, meta), ver, hdr = res["value"]
    kid = KEYS[slot][0]
    assert imp == (RecordStatus.OK, count, 0x55, 9, kid)
    assert ver == (RecordStatus.OK, count, 0x55, 9, kid)
    assert hdr == (RecordStatus.OK, count, 0x55, 9, kid)
    want = stale[0].copy()
    status, _, want_meta = import_record(config, image.read, 1, count=count, prefix_hash=0x55,
                                         session_tokens=session[3], rings=want,
                                         keys={kid: KEYS[slot][1]}, sealed=True)
    assert status is RecordStatus.OK
    assert (got == want).all()
    assert meta == [want_meta] * (config.layers * config.kv_heads)


def forge(config, image, region, how, rng):
    """Change a golden sealed record in ``region`` as a forger without the key can: a K/V
    byte (``kv``), a token with the prefix hash changed to match (``token``), the tag
    (``tag``), the key id set to another held slot's (``key_id``), a header field the tag
    covers (``seq``); the payload CRC and the header CRC recomputed each time, so only the tag
    tells. Returns the stored token bytes and prefix hash afterwards."""
    lay = RecordLayout(config)
    base = lay.region_lba(region)
    header = bytearray(image.read(base, 1))
    count = int.from_bytes(header[56:60], "little")
    tok = image.read(base + 1, lay.token_sectors(count))[:count * lay.token_bytes]
    kv = image.read(base + lay.kv_sector, lay.kv_sectors(count))[:kv_bytes_of(config, count)]
    if how == "kv":
        kv = bytearray(kv)
        kv[rng.randrange(len(kv))] ^= 1 << rng.randrange(8)
        image.write(base + lay.kv_sector, bytes(kv).ljust(lay.kv_sectors(count) * SECTOR, b"\0"))
    elif how == "token":
        tok = bytearray(tok)
        tok[rng.randrange(len(tok))] ^= 1 << rng.randrange(8)
        image.write(base + 1, bytes(tok).ljust(lay.token_sectors(count) * SECTOR, b"\0"))
        put_field(header, "prefix_hash", rng.getrandbits(64))   # the new tokens' hash
    elif how == "tag":
        header[308 + rng.randrange(16)] ^= 1 << rng.randrange(8)
    elif how == "key_id":
        put_field(header, "key_id", KEYS[0][0])
    elif how == "seq":
        header[12] ^= 1
    put_field(header, "payload_crc", crc32(bytes(tok) + bytes(kv)))
    put_field(header, "header_crc", crc32(bytes(header[:SECTOR - 4])))
    image.write(base, bytes(header))
    return bytes(tok), int.from_bytes(header[48:56], "little")


@pytest.mark.parametrize("how,width", [("kv", 1), pytest.param("token", 1, marks=SLOW),
                                       ("tag", 1), ("key_id", 1),
                                       pytest.param("seq", 1, marks=SLOW), ("kv", 4)])
def test_forged_record_is_bad_mac_and_rings_empty(how, width):
    """A sealed record changed by someone without the key, both CRCs recomputed: the import
    is ``BAD_MAC`` and every ring is left empty (count 0), as the golden import says; the
    record as written still imports (the check is not stuck)."""
    config = SMALL
    rng = random.Random(hash(how) & 0xFFFF)
    image = new_image(config, 2, rng)
    session = random_session(config, rng, 13)
    write_golden(config, image, 0, session, hash=0x77, seq=3, slot=1)
    clean = bytes(image[:])
    tok, forged_hash = forge(config, image, 0, how, rng)
    lay = RecordLayout(config)
    tokens = [int.from_bytes(tok[i:i + lay.token_bytes], "little")
              for i in range(0, len(tok), lay.token_bytes)]
    slot = 0 if how == "key_id" else 1

    async def body(ctx, h, rng):
        await set_keys(ctx, h, [0, 1])
        await load_state(ctx, h, config, session[0], 4, 2, tokens)
        bad = await dma_op(ctx, h, DmaOp.IMPORT, 0, count=13, hash=forged_hash, sealed=1,
                           slot=slot, rng=rng, idle=0.2)
        state = await read_state(ctx, h, config)
        image.write(0, clean)
        await load_state(ctx, h, config, session[0], 4, 2, session[3])
        good = await dma_op(ctx, h, DmaOp.IMPORT, 0, count=13, hash=0x77, sealed=1, slot=1)
        return bad, state, good

    bad_image = bytes(image[:])
    res = simulate(config, 2, image, body, seed=5, idle=0.2, stall=0.2, width=width)
    bad, (got, meta), good = res["value"]
    assert bad[0] is RecordStatus.BAD_MAC
    assert meta == [(0, config.window - 1)] * (config.layers * config.kv_heads)   # cleared
    assert good[0] is RecordStatus.OK
    image.write(0, bad_image)
    rings = session[0].copy()
    status, _, want_meta = import_record(config, image.read, 0, count=13,
                                         prefix_hash=forged_hash, session_tokens=tokens,
                                         rings=rings, keys={KEYS[slot][0]: KEYS[slot][1]},
                                         sealed=True)
    assert status is RecordStatus.BAD_MAC and want_meta == (0, config.window - 1)


@pytest.mark.parametrize("op", [DmaOp.IMPORT, pytest.param(DmaOp.VERIFY, marks=SLOW)])
def test_modes_match_golden(op):
    """Every pairing of a request's mode and a record's, against the golden import and
    verify: a sealed import of an open record, of a record under another key id, under an
    unset slot (``NO_KEY``, decided from the header: the rings untouched); an open import of a
    sealed record (``NO_KEY``); an open record with a tag (``BAD_MAC`` after the payload); an
    open verify of a sealed record (no key needed: ``OK``); a sealed verify of an open record
    (``OK``) and of another key's record (``NO_KEY``); the key id in every response."""
    config = TINY
    rng = random.Random(40)
    image = new_image(config, 4, rng)
    session = random_session(config, rng, 11)
    write_golden(config, image, 0, session, hash=0x21, seq=1, slot=None)      # open
    write_golden(config, image, 1, session, hash=0x21, seq=2, slot=1)         # sealed, slot 1
    write_golden(config, image, 2, session, hash=0x21, seq=3, slot=None)      # open, tagged
    lay = RecordLayout(config)
    header = bytearray(image.read(lay.region_lba(2), 1))
    header[310] = 0x5A
    put_field(header, "header_crc", crc32(bytes(header[:SECTOR - 4])))
    image.write(lay.region_lba(2), bytes(header))
    # (op, region, sealed, slot): slot 3 is never set
    cases = [(op, r, s, slot) for r in (0, 1, 2) for s, slot in
             ((0, 0), (1, 1), (1, 0), (1, 3))]
    stale = random_session(config, rng, 2)[0]

    async def body(ctx, h, rng):
        await set_keys(ctx, h, [0, 1])
        out = []
        for op, region, sealed, slot in cases:
            await load_state(ctx, h, config, stale, 2, 1, session[3])
            resp = await dma_op(ctx, h, op, region, count=11, hash=0x21, sealed=sealed,
                                slot=slot, rng=rng, idle=0.2)
            out.append((resp, await read_state(ctx, h, config)))
        return out

    out = simulate(config, 4, image, body, seed=41, idle=0.2, stall=0.2)["value"]
    held = {0: KEYS[0], 1: KEYS[1]}
    statuses = []
    for (op, region, sealed, slot), (resp, (got, meta)) in zip(cases, out):
        keys = {held[slot][0]: held[slot][1]} if sealed and slot in held else {}
        rings = stale.copy()
        if op == DmaOp.IMPORT:
            want, h, want_meta = import_record(config, image.read, region, count=11,
                                               prefix_hash=0x21, session_tokens=session[3],
                                               rings=rings, keys=keys, sealed=bool(sealed))
        else:
            want, h, want_meta = import_record(config, image.read, region,
                                               keys=keys if sealed else None)
        name = (op.name, region, sealed, slot)
        assert resp[0] is want, name
        assert resp[4] == h.key_id, name
        assert (got == rings).all(), name
        assert meta == [want_meta or (2, 1)], name
        statuses.append(want)
    assert set(statuses) == {RecordStatus.OK, RecordStatus.NO_KEY, RecordStatus.BAD_MAC}
    assert statuses.count(RecordStatus.NO_KEY) == (9 if op == DmaOp.IMPORT else 2)


@SLOW      # the round trips above, drawn: counts, slots, numerics, stalls
@settings(max_examples=examples(fast=2, thorough=20), deadline=None)
@given(st.data())
def test_sealed_round_trip_property(data):
    """Drawn configuration (one or two bytes per element), count, slot, seed and stall rates:
    the sealed export is the golden sealed record and imports back under its slot, the rings
    and metadata the golden import's; under another set slot it is ``NO_KEY``."""
    config = data.draw(st.sampled_from((TINY, SMALL2)))
    count = data.draw(st.integers(0, config.max_tokens if config is TINY else 40))
    slot = data.draw(st.integers(0, KEY_SLOTS - 1))
    seed = data.draw(st.integers(0, 1 << 16))
    p = data.draw(st.sampled_from((0.0, 0.3, 0.6)))
    hold = data.draw(st.sampled_from((0.0, 0.7)))
    rng = random.Random(seed)
    image = new_image(config, 2, rng)
    before = bytes(image[:])
    session = random_session(config, rng, count)
    stale = random_session(config, rng, 0)[0]
    other = (slot + 1) % KEY_SLOTS

    async def body(ctx, h, rng):
        await set_keys(ctx, h, range(KEY_SLOTS))
        await load_state(ctx, h, config, *session)
        exp = await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=seed, seq=7, sealed=1, slot=slot,
                           rng=rng, idle=p)
        await load_state(ctx, h, config, stale, 1, 0, session[3])
        wrong = await dma_op(ctx, h, DmaOp.IMPORT, 1, count=count, hash=seed, sealed=1,
                             slot=other, rng=rng, idle=p)
        imp = await dma_op(ctx, h, DmaOp.IMPORT, 1, count=count, hash=seed, sealed=1,
                           slot=slot, rng=rng, idle=p)
        return exp, wrong, imp, await read_state(ctx, h, config)

    res = simulate(config, 2, image, body, seed=seed, idle=p, stall=p, hold=hold)
    exp, wrong, imp, (got, meta) = res["value"]
    assert exp == (RecordStatus.OK, count, seed, 7, KEYS[slot][0])
    assert bytes(image[:]) == expected_image(
        config, before, 1, golden_writes(config, session, hash=seed, seq=7, slot=slot))
    assert wrong[0] is RecordStatus.NO_KEY
    assert imp == (RecordStatus.OK, count, seed, 7, KEYS[slot][0])
    want = stale.copy()
    import_record(config, image.read, 1, count=count, prefix_hash=seed,
                  session_tokens=session[3], rings=want, keys=dict([KEYS[slot]]), sealed=True)
    assert (got == want).all() and meta == [(count, session[2])] * len(meta)


# --- failures in the middle of a sealed export ----------------------------------------------

def export_phases(config, count):
    """Byte offsets (of the bytes the export writes) inside each phase: tokens, K/V, the MAC's
    header pass (every payload byte written, no header byte), the header."""
    lay = RecordLayout(config)
    tok = lay.token_sectors(count) * SECTOR
    kv = lay.kv_sectors(count) * SECTOR
    return {"tokens": tok // 2, "kv": tok + kv // 2, "mac": tok + kv, "header": tok + kv + 300}


@pytest.mark.parametrize("phase", [pytest.param("tokens", marks=SLOW),
                                   pytest.param("kv", marks=SLOW), "mac", "header"])
def test_power_cut_in_sealed_export_keeps_previous(phase):
    """Sealed record A in region 0; a sealed export of B into region 1 loses power in each
    phase: after the restart the gateware's verify and the golden scan (with the key) agree,
    A is valid and B is not."""
    config = SMALL
    rng = random.Random(50)
    image = new_image(config, 2)
    a = random_session(config, rng, 30)
    write_golden(config, image, 0, a, hash=11, seq=1, slot=2)
    b = random_session(config, rng, 31)
    cut = export_phases(config, 31)[phase]

    async def export_b(ctx, h, rng):
        await set_keys(ctx, h, [2])
        await load_state(ctx, h, config, *b)
        return await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=12, seq=2, sealed=1, slot=2)

    res = simulate(config, 2, image, export_b, seed=51, cut_after=cut)
    assert "cut" in res and "value" not in res

    async def scan(ctx, h, rng):
        await set_keys(ctx, h, [2])
        return [await dma_op(ctx, h, DmaOp.VERIFY, r, sealed=1, slot=2) for r in range(2)]

    got = simulate(config, 2, image, scan, seed=52)["value"]
    infos = scan_image(config, image.read, 2, keys={KEYS[2][0]: KEYS[2][1]})
    assert [g[0] for g in got] == [i.status for i in infos]
    assert got[0] == (RecordStatus.OK, 30, 11, 1, KEYS[2][0])
    assert got[1][0] is not RecordStatus.OK


@pytest.mark.parametrize("phase", [pytest.param("tokens", marks=SLOW), "kv",
                                   pytest.param("header", marks=SLOW)])
def test_storage_error_in_sealed_export_frees_the_mac(phase):
    """A storage error in each phase of a sealed export: ``STORAGE``; the MAC's message is
    given up, so the next sealed export (healthy medium) is the golden record."""
    config = SMALL
    rng = random.Random(60)
    image = new_image(config, 2, rng)
    session = random_session(config, rng, 12)
    error_after = export_phases(config, 12)[phase]

    async def body(ctx, h, rng):
        await set_keys(ctx, h, [3])
        await load_state(ctx, h, config, *session)
        a = await dma_op(ctx, h, DmaOp.EXPORT, 0, hash=5, seq=1, sealed=1, slot=3, rng=rng,
                         idle=0.3)
        b = await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=6, seq=2, sealed=1, slot=3, rng=rng,
                         idle=0.3)
        return a[0], b

    a, b = simulate(config, 2, image, body, seed=61, idle=0.3, stall=0.3,
                    error_after=error_after)["value"]
    assert a is RecordStatus.STORAGE
    assert b == (RecordStatus.OK, 12, 6, 2, KEYS[3][0])
    lay = RecordLayout(config)
    for off, data in golden_writes(config, session, hash=6, seq=2, slot=3):
        assert image.read(lay.region_lba(1) + off, len(data) // SECTOR) == data


def test_failed_sealed_imports_free_the_mac():
    """Sealed imports that stop with the MAC's message open (a token mismatch, a payload CRC
    failure) give it up: the next sealed import verifies."""
    config = TINY
    rng = random.Random(70)
    image = new_image(config, 2, rng)
    session = random_session(config, rng, 20)
    write_golden(config, image, 0, session, hash=3, seq=1, slot=0)
    write_golden(config, image, 1, session, hash=4, seq=1, slot=0)
    lay = RecordLayout(config)
    kv = bytearray(image.read(lay.region_lba(1) + lay.kv_sector, 1))
    kv[5] ^= 0x80
    image.write(lay.region_lba(1) + lay.kv_sector, bytes(kv))
    wrong = list(session[3])
    wrong[7] ^= 1

    async def body(ctx, h, rng):
        await set_keys(ctx, h, [0])
        await load_state(ctx, h, config, *session[:3], wrong)
        out = [await dma_op(ctx, h, DmaOp.IMPORT, 0, count=20, hash=3, sealed=1)]
        await load_state(ctx, h, config, *session)
        out.append(await dma_op(ctx, h, DmaOp.IMPORT, 1, count=20, hash=4, sealed=1))
        out.append(await dma_op(ctx, h, DmaOp.IMPORT, 0, count=20, hash=3, sealed=1))
        return [o[0] for o in out]

    assert simulate(config, 2, image, body, seed=71)["value"] == [
        RecordStatus.TOKEN_MISMATCH, RecordStatus.BAD_PAYLOAD_CRC, RecordStatus.OK]


# --- the MAC port: used by sealed transfers only --------------------------------------------

def test_open_transfers_leave_the_mac_idle():
    """Across open exports, imports, verifies and header reads the engine drives nothing on
    ``mac``; during a sealed round trip it does, only while busy."""
    config = TINY
    rng = random.Random(80)
    image = new_image(config, 2)
    session = random_session(config, rng, 9)
    seen = {"open": set(), "sealed": set()}
    phase = ["open"]

    def monitor(h):
        port = h.dma.mac

        async def watch(ctx):
            async for _, _, *v in ctx.tick().sample(port.cmd.valid, port.i.valid, port.o.ready,
                                                    port.abort, h.dma.busy):
                driven = v[0] | v[1] | v[2] | v[3]
                seen[phase[0]].add((driven, v[4]))
        return watch

    async def body(ctx, h, rng):
        await set_keys(ctx, h, [0])
        await load_state(ctx, h, config, *session)
        out = [await dma_op(ctx, h, DmaOp.EXPORT, 0, hash=1, seq=1),
               await dma_op(ctx, h, DmaOp.IMPORT, 0, count=9, hash=1),
               await dma_op(ctx, h, DmaOp.VERIFY, 0), await dma_op(ctx, h, DmaOp.HEADER, 0)]
        phase[0] = "sealed"
        out += [await dma_op(ctx, h, DmaOp.EXPORT, 1, hash=2, seq=1, sealed=1),
                await dma_op(ctx, h, DmaOp.IMPORT, 1, count=9, hash=2, sealed=1)]
        return [o[0] for o in out]

    res = simulate(config, 2, image, body, seed=81, process=monitor)
    assert res["value"] == [RecordStatus.OK] * 6
    assert all(not driven for driven, _ in seen["open"])
    assert (1, 1) in seen["sealed"] and (1, 0) not in seen["sealed"]


# --- the constant overhead of a sealed transfer ---------------------------------------------

def overhead_clocks(config, count, *, sealed, seed=90):
    """``{direction: (clocks from the last payload byte on the engine's tap to the response's
    valid, clocks from the command's first busy clock to the response's valid)}`` for an
    export and an import (no idle, no stalls)."""
    rng = random.Random(seed)
    image = new_image(config, 2)
    session = random_session(config, rng, count)
    marks = {}
    phase = ["load"]

    def monitor(h):
        tap = h.dma.record_tap

        async def watch(ctx):
            clock = 0
            async for _, _, valid, seg, busy, rvalid in ctx.tick().sample(
                    tap.valid, tap.segment, h.dma.busy, h.resp.valid):
                clock += 1
                if valid and seg != RecordSegment.HDR:
                    marks[phase[0] + "_last"] = clock
                if busy:
                    marks.setdefault(phase[0] + "_start", clock)
                if rvalid:
                    marks.setdefault(phase[0] + "_resp", clock)
        return watch

    async def body(ctx, h, rng):
        await set_keys(ctx, h, [0])
        await load_state(ctx, h, config, *session)
        phase[0] = "export"
        out = [await dma_op(ctx, h, DmaOp.EXPORT, 0, hash=1, seq=1, sealed=int(sealed))]
        phase[0] = "import"
        out.append(await dma_op(ctx, h, DmaOp.IMPORT, 0, count=count, hash=1,
                                sealed=int(sealed)))
        return [o[0] for o in out]

    res = simulate(config, 2, image, body, seed=seed, process=monitor)
    assert res["value"] == [RecordStatus.OK] * 2
    return {d: (marks[d + "_resp"] - marks[d + "_last"], marks[d + "_resp"] - marks[d + "_start"])
            for d in ("export", "import")}


def mac_latency(length):
    """``docs/blocks/mac.md``'s clocks from a message's last byte to its tag (length > 64)."""
    tail = length % 64 or 64
    return 42 if tail >= 42 else 84 - tail


@pytest.mark.parametrize("config,count", [pytest.param(TINY, 1, marks=SLOW),
                                          pytest.param(TINY, 35, marks=SLOW), (TINY, 36),
                                          (TINY, 37), pytest.param(SMALL, 100, marks=SLOW)])
def test_sealed_overhead_is_constant(config, count):
    """The MAC adds no clock per byte: from its last payload byte to its response a sealed
    transfer takes exactly the open one's clocks plus the header pass (508), the MAC's
    last-byte-to-tag latency (42 to 83, by the message's last block) and the clock that takes
    the tag; the whole transfer one clock more (the clock that opens the message)."""
    opened = overhead_clocks(config, count, sealed=False)
    sealed = overhead_clocks(config, count, sealed=True)
    extra = MAC_HEADER_BYTES + mac_latency(mac_bytes(config, count)) + 1
    for d in ("export", "import"):
        assert sealed[d][0] - opened[d][0] == extra, d
        assert sealed[d][1] - opened[d][1] == extra + 1, d
