"""The whole top over the tiered storage (``ringkv.sim.tiered_sim.TieredTop``: ``RingKVTop``
unchanged, its storage port through a ``TieredStorage``), in the Amaranth simulator, both
backends sector images at one byte per clock: an EXPORT writes the card and a slot, a QUERY of
it imports from SDRAM (no card read) and restores the rings bit-exactly; after a power cut (a
new top on the same card, the SDRAM noise) the recovery scan and the same QUERY read the card.
The QUERY's clocks are compared with the same scenario on the top alone. Slow tier (about
two minutes: three simulations of the top); ``tests/hw/storage/test_tiered.py`` checks the
same paths at the DMA engine in the fast tier."""

import random

import numpy as np
import pytest
from top_helpers import CFG, make_top, req

from ringkv.defs.protocol import RING_ELEMENTS, SNAPSHOT_RESPONSE, Op, Status
from ringkv.defs.record import RecordStatus, elem_bytes
from ringkv.host.device.ops import pack_attn, pack_tokens
from ringkv.hw.storage.port import StorageOp
from ringkv.sim.sector_model import SectorImage
from ringkv.sim.tiered_sim import TieredTop, lose_sdram
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


def _counter(clock):
    async def count(ctx):
        async for _ in ctx.tick():
            clock["n"] += 1
    return count


@pytest.mark.slow
def test_query_imports_from_sdram_then_from_the_card_after_a_power_cut():
    rng = np.random.default_rng(4)
    tokens = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    top = TieredTop(make_top(), slots=2)
    card = image_for(top)
    spr = top.record_layout.sectors_per_region
    sdram = SectorImage(None, 2 * spr)
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
    # clocks (both media here move one byte per clock)
    rng = np.random.default_rng(4)
    tokens2 = [int(t) for t in rng.integers(0, 1 << 16, size=12)]
    plain = make_top()
    out2, clock2 = {}, {"n": 0}
    run_top(plain, image_for(plain), _scenario(tokens2, rng, out2, clock2),
            monitors=[_counter(clock2)])
    assert (out2["status"], out2["rings_after"]) == (Status.HIT, out2["rings"])
    assert 0 < tiered_clocks - out2["query_clocks"] < 100

    # power cut: a new top on the same card, the SDRAM lost; recovery reads the card through
    # the tier, the QUERY hits from the card
    lose_sdram(sdram, random.Random(2))
    top = TieredTop(make_top(), slots=2)
    card_log, sdram_log, out3, clock = [], [], {}, {"n": 0}
    run_top(top, card, _scenario(tokens, rng, out3, clock, export=False),
            storage_log=card_log, sdram_image=sdram, sdram_log=sdram_log,
            monitors=[_counter(clock)])
    assert (out3["status"], out3["record"]) == (Status.HIT, RecordStatus.OK)
    assert out3["rings_after"] == out["rings"]
    assert not sdram_log and any(c[0] == StorageOp.READ for c in card_log)
