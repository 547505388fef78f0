"""The whole top with its SDRAM hot tier (``RingKVTop(tier=...)``: its storage port through a
``TieredStorage``), in the Amaranth simulator, both backends sector images at one byte per
clock: an EXPORT writes the card and a slot, a QUERY of it imports from SDRAM (no card read)
and restores the rings bit-exactly; after a power cut (a new top on the same card, the SDRAM
noise) the recovery scan and the same QUERY read the card. The QUERY's clocks are compared with
the same scenario on the top alone (slow tier: three simulations of the top, about two
minutes); ``tests/hw/storage/test_tiered.py`` checks the same paths at the DMA engine in the
fast tier. ``STORAGE_INFO`` reports the tier and its residents, and a ``DIR_DELETE`` drops the
record's copy (the broken variant ``drop_ignored`` in the slow tier)."""

import random

import numpy as np
import pytest
from top_helpers import CFG, make_top, req

from ringkv.defs.protocol import (
    DIR_RESPONSE,
    RING_ELEMENTS,
    SNAPSHOT_RESPONSE,
    STORAGE_INFO,
    Op,
    Status,
)
from ringkv.defs.record import RecordStatus, elem_bytes
from ringkv.host.device.ops import pack_attn, pack_tokens
from ringkv.hw.storage.port import StorageOp
from ringkv.sim.sector_model import SectorImage
from ringkv.sim.streams import tick_until
from ringkv.sim.tiered_sim import lose_sdram
from ringkv.sim.top_bench import image_for, run_top

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _qkv(rng, count):
    lim = 1 << (8 * elem_bytes(CFG) - 1)
    return (rng.integers(-lim, lim, size=(count, CFG.q_heads, CFG.head_dim)),
            rng.integers(-lim, lim, size=(count, CFG.kv_heads, CFG.head_dim)),
            rng.integers(-lim, lim, size=(count, CFG.kv_heads, CFG.head_dim)))


def _scenario(tokens, rng, out, clock, *, export=True):
    """Session, tokens, attention on every layer, EXPORT (if ``export``), then a new session
    and QUERY of the tokens; ``out`` gets the QUERY's status, record status, clocks and the
    rings' metadata read back."""
    async def scenario(ctx, link):
        n = len(tokens)
        await link.call(ctx, Op.SESSION_BEGIN)
        if export:
            await link.call(ctx, Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=n)
                            + pack_tokens(CFG, tokens))
            for layer in range(CFG.layers):
                q, k, v = _qkv(rng, n)
                await link.call(ctx, Op.ATTN_PREFILL, pack_attn(CFG, layer, q, k, v))
            await link.call(ctx, Op.EXPORT, req(Op.EXPORT, n=n))
            out["rings"] = await link.call(ctx, Op.RING_READ, req(Op.RING_READ, addr=0,
                                                                  n=512,
                                                                  what=RING_ELEMENTS))
            await link.call(ctx, Op.SESSION_BEGIN)
        await link.call(ctx, Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=n)
                        + pack_tokens(CFG, tokens))
        start = clock["n"]
        frame = await link.request(ctx, Op.QUERY, req(Op.QUERY, n=n))
        out["query_clocks"] = clock["n"] - start
        out["status"] = Status(frame.status)
        out["record"] = RecordStatus(SNAPSHOT_RESPONSE.unpack(frame.payload)["record_status"])
        out["rings_after"] = await link.call(ctx, Op.RING_READ, req(Op.RING_READ, addr=0,
                                                                    n=512,
                                                                  what=RING_ELEMENTS))
    return scenario


#: two whole-region slots (the tier's own tests' shape; the ULX3S default is ``{}``)
TIER = dict(slots=2, slot_token_sectors=None)


def _counter(clock):
    async def count(ctx):
        async for _ in ctx.tick():
            clock["n"] += 1
    return count


@pytest.mark.slow
def test_query_imports_from_sdram_then_from_the_card_after_a_power_cut():
    rng = np.random.default_rng(4)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    top = make_top(tier=TIER)
    card = image_for(top)
    sdram = SectorImage(None, top.tier["sdram_sectors"])
    lose_sdram(sdram, random.Random(1))
    card_log, sdram_log, out, clock = [], [], {}, {"n": 0}
    run_top(top, card, _scenario(tokens, rng, out, clock), storage_log=card_log,
            sdram_image=sdram, sdram_log=sdram_log, monitors=[_counter(clock)])
    assert (out["status"], out["record"]) == (Status.HIT, RecordStatus.OK)
    assert out["rings_after"] == out["rings"]
    # the export wrote both tiers; the QUERY's three reads (header, tokens, K/V) came from
    # the slot, none from the card
    reads = [c for c in sdram_log if c[0] == StorageOp.READ]
    assert len(reads) == 3
    last_write = max(i for i, c in enumerate(card_log) if c[0] == StorageOp.WRITE)
    assert all(c[0] == StorageOp.WRITE for c in card_log[last_write - 2:])
    tiered_clocks = out["query_clocks"]

    # the same scenario on the top alone: the QUERY's clocks differ only by the tier's own
    # clocks (both media here move one byte per clock): for each of the three reads, its
    # setup (``qb + 9``: a committed copy's LOOKUP and extents) and the registered status's
    # clock (the read slice's clock overlaps it on the byte port)
    rng = np.random.default_rng(4)
    tokens2 = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    plain = make_top()
    out2, clock2 = {}, {"n": 0}
    run_top(plain, image_for(plain), _scenario(tokens2, rng, out2, clock2),
            monitors=[_counter(clock2)])
    assert (out2["status"], out2["rings_after"]) == (Status.HIT, out2["rings"])
    qb = top.regions.bit_length() - 1
    assert tiered_clocks - out2["query_clocks"] == 3 * (qb + 9 + 1)

    # power cut: a new top on the same card, the SDRAM lost; recovery reads the card through
    # the tier, the QUERY hits from the card
    lose_sdram(sdram, random.Random(2))
    top = make_top(tier=TIER)
    card_log, sdram_log, out3, clock = [], [], {}, {"n": 0}
    run_top(top, card, _scenario(tokens, rng, out3, clock, export=False),
            storage_log=card_log, sdram_image=sdram, sdram_log=sdram_log,
            monitors=[_counter(clock)])
    assert (out3["status"], out3["record"]) == (Status.HIT, RecordStatus.OK)
    assert out3["rings_after"] == out["rings"]
    assert not sdram_log and any(c[0] == StorageOp.READ for c in card_log)


@pytest.mark.parametrize("bug", [None, pytest.param("drop_ignored", marks=pytest.mark.slow)])
def test_storage_info_reports_the_tier_and_a_delete_drops_the_copy(bug):
    """``STORAGE_INFO`` of a top with a tier (the default ``{}``: compact slots, as many as
    fit, at most ``regions``): its slots and slot shape, 0 residents, 1 after an EXPORT, 0
    after the record's ``DIR_DELETE`` (its region dropped from the hot tier: ``drop``), and a
    QUERY then misses without reading SDRAM. The broken variant keeps the copy: 1 resident."""
    rng = np.random.default_rng(5)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    top = make_top(tier={} if bug is None else {"_bug": bug})
    lay = top.record_layout
    assert top.tier["slots"] == top.regions                 # 32 MB holds far more
    assert top.tier["slot_token_sectors"] == lay.token_sectors_max    # T 16 > this shape's
    sdram = SectorImage(None, top.tier["sdram_sectors"])
    lose_sdram(sdram, random.Random(1))
    sdram_log, out = [], {}

    async def scenario(ctx, link):
        async def info():
            return STORAGE_INFO.unpack(await link.call(ctx, Op.STORAGE_INFO))
        out["before"] = await info()
        await _scenario(tokens, rng, {}, {"n": 0})(ctx, link)
        out["after_export"] = await info()
        h = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.QUERY, req(Op.QUERY,
                                                                         n=len(tokens)),
                                                     status=Status.HIT))["hash"]
        r = DIR_RESPONSE.unpack(await link.call(ctx, Op.DIR_LOOKUP,
                                                req(Op.DIR_LOOKUP, count=len(tokens), hash=h)))
        await link.call(ctx, Op.DIR_DELETE, req(Op.DIR_DELETE, link=r["link"]))
        out["after_delete"] = await info()
        out["reads"] = sum(c[0] == StorageOp.READ for c in sdram_log)
        await link.call(ctx, Op.QUERY, req(Op.QUERY, n=len(tokens)), status=Status.MISS)
        out["reads_after"] = sum(c[0] == StorageOp.READ for c in sdram_log)

    run_top(top, image_for(top), scenario, sdram_image=sdram, sdram_log=sdram_log)
    shape = dict(hot_slots=top.regions, hot_slot_sectors=lay.sectors_per_region,
                 hot_slot_tokens=lay.token_sectors_max)
    assert out["before"] == dict(kind=0, card_type=0, initialised=0, bus_width=0, high_speed=0,
                                 last_error=0, errors=0, sd_clock_hz=0, sectors=0,
                                 hot_residents=0, **shape)
    assert out["after_export"]["hot_residents"] == 1
    assert out["reads"] == 6                   # two QUERYs' header, tokens and K/V from SDRAM
    assert out["reads_after"] == out["reads"]  # a miss: the directory has no entry
    assert out["after_delete"]["hot_residents"] == (1 if bug else 0)


@pytest.mark.slow       # a minute or two of the whole top; the board check runs SDRAM_TEST too
def test_sdram_test_empties_the_tier_and_the_card_serves_after_it():
    """A top with both the tier and ``SDRAM_TEST`` (the ULX3S top's build): the self-test
    overwrites the SDRAM (here the stand-in for the BIST scribbles over the whole image), so
    the top holds the tier in reset from the test's command to its result: 1 resident before,
    0 after, and the QUERY of the exported record then hits from the card, reading nothing from
    SDRAM. Without the reset (tried: ``ResetInserter(testing & 0)``) the copy stays resident,
    the QUERY imports the scribbled bytes, fails their check and answers ``MISS``."""
    rng = np.random.default_rng(9)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    top = make_top(tier={}, sdram_test=True)
    sdram = SectorImage(None, top.tier["sdram_sectors"])
    lose_sdram(sdram, random.Random(2))
    card_log, sdram_log, out = [], [], {}
    port = top.sdram_test

    async def bist(ctx):
        ctx.set(port.cmd.ready, 1)
        while True:
            valid = (await ctx.tick().sample(port.cmd.valid))[2]
            if not valid:
                continue
            ctx.set(port.cmd.ready, 0)
            lose_sdram(sdram, random.Random(3))         # the test's patterns
            await ctx.tick().repeat(20)
            ctx.set(port.result.valid, 1)
            await tick_until(ctx, port.result.ready)
            ctx.set(port.result.valid, 0)
            ctx.set(port.cmd.ready, 1)

    async def scenario(ctx, link):
        async def residents():
            return STORAGE_INFO.unpack(await link.call(ctx, Op.STORAGE_INFO))["hot_residents"]
        await _scenario(tokens, rng, {}, {"n": 0})(ctx, link)
        out["before"] = await residents()
        await link.call(ctx, Op.SDRAM_TEST, req(Op.SDRAM_TEST, tests=1, words=0, pause_ms=0))
        out["after"] = await residents()
        out["sdram_reads"] = sum(c[0] == StorageOp.READ for c in sdram_log)
        out["card_reads"] = sum(c[0] == StorageOp.READ for c in card_log)
        r = SNAPSHOT_RESPONSE.unpack(await link.call(ctx, Op.QUERY, req(Op.QUERY,
                                                                         n=len(tokens)),
                                                     status=Status.HIT))
        out["record_status"] = r["record_status"]
        out["sdram_reads_after"] = sum(c[0] == StorageOp.READ for c in sdram_log)
        out["card_reads_after"] = sum(c[0] == StorageOp.READ for c in card_log)

    run_top(top, image_for(top), scenario, storage_log=card_log, sdram_image=sdram,
            sdram_log=sdram_log, monitors=[bist])
    assert (out["before"], out["after"]) == (1, 0)
    assert out["record_status"] == RecordStatus.OK.value
    assert out["sdram_reads_after"] == out["sdram_reads"]        # nothing from SDRAM
    assert out["card_reads_after"] > out["card_reads"]           # the card served it


def test_the_four_byte_import_in_the_top():
    """``RingKVTop(tier=..., storage_width=4)``: the DMA, the tiered storage and the SDRAM side
    on four-byte words, the card's bytes through the tier's widener. An EXPORT writes both
    tiers the golden bytes (the SDRAM slot's sectors equal the card's); ``SECTOR_READ``s of
    the record's header (a committed copy: from the slot, as words) and of a sector outside
    the record area (from the card) return the card's bytes; a QUERY imports from the slot
    (no card read) and restores the rings bit-exactly."""
    from ringkv.defs.record import RecordLayout
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    top = make_top(tier=TIER, storage_width=4)
    assert top.storage_width == 4 and top.dma.width == 4
    card = image_for(top)
    sdram = SectorImage(None, top.tier["sdram_sectors"])
    lose_sdram(sdram, random.Random(3))
    lay = RecordLayout(CFG)
    card_log, sdram_log, out, clock = [], [], {}, {"n": 0}
    scenario = _scenario(tokens, rng, out, clock)

    async def with_sector_reads(ctx, link):
        await scenario(ctx, link)
        n_card = len(card_log)
        out["header"] = await link.call(ctx, Op.SECTOR_READ,
                                        req(Op.SECTOR_READ, lba=lay.region_lba(0)))
        out["header_from_card"] = len(card_log) != n_card
        last = card.sectors - 1
        out["outside"] = await link.call(ctx, Op.SECTOR_READ, req(Op.SECTOR_READ, lba=last))

    run_top(top, card, with_sector_reads, storage_log=card_log, sdram_image=sdram,
            sdram_log=sdram_log, monitors=[_counter(clock)])
    assert (out["status"], out["record"]) == (Status.HIT, RecordStatus.OK)
    assert out["rings_after"] == out["rings"]
    reads = [c for c in sdram_log if c[0] == StorageOp.READ]
    assert len(reads) >= 3 + 1                     # the QUERY's three, the header's
    assert out["header"] == card.read(lay.region_lba(0), 1) and not out["header_from_card"]
    assert out["outside"] == card.read(card.sectors - 1, 1)
    for k in (0, 1, lay.kv_sector):
        assert sdram.read(k) == card.read(lay.region_lba(0) + k)


def test_storage_width_errors():
    with pytest.raises(ValueError, match=r"^storage_width must be one of \(1, 4\) bytes, "
                                         r"not 2$"):
        make_top(tier=TIER, storage_width=2)
    with pytest.raises(ValueError, match=r"^storage_width 4 needs the SDRAM tier"):
        make_top(storage_width=4)
