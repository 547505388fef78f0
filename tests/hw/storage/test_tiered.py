"""Tiered storage (``hw/storage/tiered.py``) in the Amaranth simulator, against its golden model
(``ringkv.host.golden.tiered``) and the card.

Both backends are sector images served at up to one byte per clock (``ringkv.sim.tiered_sim``),
so a run is fast enough for many transfers; ``test_sdram_store.py`` checks the SDRAM sector
store behind the ``sdram`` port on the pin-level SDRAM model, and ``test_dma_over_tiers`` below
the DMA engine over this block. Every run is compared with the golden model on every
operation -- which backend got a command and its sector, the block's own clocks before the
backend's command (``setup``) and after a write's statuses (``tail``), the status the initiator
got -- and every read that returned ``OK`` must return the bytes the card held (the SDRAM image
starts as noise, so a read from SDRAM of a sector the copy never wrote returns other bytes).
"""

import random
import zlib

import numpy as np
import pytest
from amaranth.sim import Simulator
from dma_helpers import dma_op, load_state, new_image, rand_rings, read_state, set_key

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import HEADER_OFFSETS, RecordLayout, RecordStatus
from ringkv.host.golden.tiered import GoldenTieredStorage
from ringkv.hw.storage.dma import DmaOp
from ringkv.hw.storage.port import StorageError, StorageOp
from ringkv.hw.storage.tiered import BUGS, TieredStorage
from ringkv.sim.ring_model import DmaHarness
from ringkv.sim.sector_model import SectorImage, serve_storage
from ringkv.sim.tiered_sim import check_run, lose_sdram, random_script, run_tiered

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

#: 4 regions of 4 sectors from card sector 2, 2 slots
SMALL = dict(regions=4, sectors_per_region=4, base_lba=2, slots=2)
#: 8 regions of 6 sectors from sector 3, 3 slots at SDRAM sector 5: evictions
EVICT = dict(regions=8, sectors_per_region=6, base_lba=3, slots=3, sdram_base=5)
#: compact slots: 4 regions of 7 sectors from sector 2 (header 0, tokens 1..3, K/V 4..6), a
#: slot holds the header, 1 token sector and the K/V (5 sectors: the gap is sectors 2..3),
#: 2 slots at SDRAM sector 1
GAP = dict(regions=4, sectors_per_region=7, base_lba=2, slots=2, sdram_base=1, kv_sector=4,
           slot_token_sectors=1)


def images(params, seed, *, card_extra=1, sdram_short=0):
    """A card image (the record area plus ``card_extra`` sectors after it, random bytes) and an
    SDRAM image (the slots, noise; ``sdram_short`` sectors fewer: the last slot's end is out of
    range)."""
    rng = random.Random(seed)
    card = SectorImage(None, params.get("base_lba", 0)
                       + params["regions"] * params["sectors_per_region"] + card_extra)
    for lba in range(card.sectors):
        card.write(lba, rng.randbytes(512))
    sdram = SectorImage(None, params.get("sdram_base", 0) + params["slots"]
                        * GoldenTieredStorage(**params).slot_sectors - sdram_short)
    lose_sdram(sdram, rng)
    return card, sdram


def run_and_check(params, script, *, seed=0, bug=None, card=None, sdram=None, golden=None,
                  **kw):
    if card is None:
        card, sdram = images(params, seed)
    run = run_tiered(params, script, card, sdram, seed=seed, bug=bug, **kw)
    golden = golden or GoldenTieredStorage(**params)
    return run, check_run(golden, script, run)


def data(n, seed=0):
    return random.Random(seed * 7919 + n).randbytes(n * 512)


def region(r, params=SMALL):
    return params["base_lba"] + r * params["sectors_per_region"]


def export(r, tokens=1, kv=1, params=SMALL, seed=0):
    """The DMA's writes of a record into region ``r``: tokens from sector 1, K/V from sector
    ``1 + tokens`` (from ``params["kv_sector"]`` if given), the header (sector 0) last."""
    lba = region(r, params)
    kv_at = params.get("kv_sector") or 1 + tokens
    return [("w", lba + 1, data(tokens, seed)), ("w", lba + kv_at, data(kv, seed + 1)),
            ("w", lba, data(1, seed + 2))]


# ---- parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, exc, message", [
    (dict(regions=3, sectors_per_region=4), ValueError,
     "regions must be a power of two between 2 and 32768, not 3"),
    (dict(regions=4, sectors_per_region=0), ValueError,
     "sectors_per_region must be between 1 and 65535, not 0"),
    (dict(regions=4, sectors_per_region=4, slots=1), ValueError,
     "slots must be between 2 and 1024, not 1"),
    (dict(regions=4, sectors_per_region=4, base_lba=-1), ValueError,
     "base_lba must be a non-negative integer, not -1"),
    (dict(regions=4, sectors_per_region="4"), TypeError,
     "sectors_per_region must be an integer, not '4'"),
    (dict(regions=4, sectors_per_region=100, base_lba=(1 << 32) - 100), ValueError,
     "4 regions of 100 sectors from 4294967196 do not fit in 32-bit sector addresses"),
    (dict(regions=4, sectors_per_region=4, sdram_base=(1 << 32) - 4), ValueError,
     "256 slots of 4 sectors from 4294967292 do not fit in 32-bit sector addresses"),
    (dict(regions=4, sectors_per_region=4, _bug="nope"), ValueError, "Unknown bug 'nope'"),
    (dict(regions=4, sectors_per_region=4, kv_sector=5), ValueError,
     "kv_sector must be between 1 and 4, not 5"),
    (dict(regions=4, sectors_per_region=4, slot_token_sectors=1), ValueError,
     "slot_token_sectors needs kv_sector"),
    (dict(regions=4, sectors_per_region=4, kv_sector=2, slot_token_sectors=2), ValueError,
     "slot_token_sectors must be between 0 and 1, not 2"),
    (dict(regions=4, sectors_per_region=8, kv_sector=5, slot_token_sectors=0,
          sdram_base=(1 << 32) - 1000), ValueError,
     "256 slots of 4 sectors from 4294966296 do not fit in 32-bit sector addresses"),
])
def test_parameter_errors(kw, exc, message):
    with pytest.raises(exc, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        TieredStorage(**kw)


def test_parameters_are_read_only_properties():
    t = TieredStorage(regions=8, sectors_per_region=321, base_lba=5, slots=3, sdram_base=7)
    assert (t.regions, t.sectors_per_region, t.base_lba, t.slots, t.sdram_base,
            t.stamp_width) == (8, 321, 5, 3, 7, 32)
    assert t.params() == dict(regions=8, sectors_per_region=321, base_lba=5, slots=3,
                              sdram_base=7, stamp_width=32, kv_sector=None,
                              slot_token_sectors=None)
    assert t.slot_sectors == 321
    with pytest.raises(AttributeError):
        t.regions = 4
    # the board's compact slots at the default shape: 273 sectors
    c = TieredStorage(regions=8, sectors_per_region=321, slots=3, kv_sector=65,
                      slot_token_sectors=16)
    assert (c.kv_sector, c.slot_token_sectors, c.slot_sectors) == (65, 16, 273)
    with pytest.raises(AttributeError):
        c.slot_token_sectors = 3


# ---- the export / import cycle ----------------------------------------------------------------

def test_export_then_import_reads_sdram():
    """An export writes both tiers and commits at its header; the import's three reads come
    from the slot, a sector the export did not write from the card."""
    lba = region(1)
    script = export(1, tokens=1, kv=2) + [("r", lba, 1), ("r", lba + 1, 1), ("r", lba + 2, 2),
                                          ("r", lba + 1, 3), ("r", lba, 4)]
    run, found = run_and_check(SMALL, script)
    assert not found, found
    tiers = [("card" if o.card else "") + ("sdram" if o.sdram else "") for o in run.ops]
    # the K/V write continued the tokens' extent (sectors 1..3: one extent); the header is
    # an extent of its own, so a read of sectors 0..3 is the card's
    assert tiers == ["cardsdram"] * 3 + ["sdram"] * 4 + ["card"]
    # the record's sectors from slot 0 (SDRAM sectors 0..3), at the region's offsets
    assert [o.sdram[1] for o in run.ops[3:6]] == [0, 1, 2]


# ---- one test per rule, each with the broken variant that it catches -------------------------

#: rule -> (script, backend failures, the broken variant that breaks the rule)
RULES = {
    # a read of a sector the copy did not write goes to the card
    "extents": (export(0) + [("r", region(0) + 3, 1)], {}, "extents"),
    # a write into a region whose copy is committed drops the copy (ALLOC) before it writes
    "invalidate": (export(0) + [("w", region(0) + 1, data(1, 9)), ("r", region(0) + 1, 1)],
                   {}, "stale"),
    # an error on either tier aborts the copy: here the card fails the header's write
    "abort": (export(0) + [("r", region(0), 1)], {"card_fail": "header"}, "error"),
    # a write over two regions clears the hot tier
    "span": (export(0, tokens=2, kv=1) + [("w", region(0) + 3, data(2, 5)),
                                          ("r", region(0) + 3, 1)], {}, "span"),
    # slot s is SDRAM sectors sdram_base + s * sectors_per_region ...
    "address": (export(0) + [("r", region(0), 1)], {}, "address"),
    # only the write that includes sector 0 (the header) commits
    "commit": ([("w", region(0) + 1, data(1)), ("r", region(0) + 1, 1)], {}, "early"),
    # a region on ``drop`` (its record deleted) loses its copy: the count goes down and the
    # region's reads go to the card (a drop between an export's writes forgets the pending
    # copy: the header alone commits a copy of one extent)
    "drop": (export(0) + export(1) + [("n",), ("d", 0), ("n",), ("r", region(0), 1),
                                      ("r", region(1), 1), ("w", region(2) + 1, data(1)),
                                      ("d", 2), ("w", region(2), data(1)), ("n",),
                                      ("r", region(2) + 1, 1), ("r", region(2), 1)],
             {}, "drop_ignored"),
}


def _fail(kind):
    """``header``: the card fails the write of a region's sector 0 after 100 bytes."""
    starts = {region(r) for r in range(SMALL["regions"])}
    return lambda op, lba, count: 100 if op.value == 1 and lba in starts else None


def gap(r, offset):
    """Card sector ``offset`` of region ``r`` of the compact shape ``GAP``."""
    return region(r, GAP) + offset


#: the compact slots' rules (shape ``GAP``: sectors 2..3 of a region are the gap):
#: rule -> (script, the broken variant that breaks the rule)
GAP_RULES = {
    # a read touching the gap goes to the card without a LOOKUP (only the golden's clocks
    # catch the variant: the extents never hold a gap sector, so its data stay right)
    "gap_read": (export(0, params=GAP) + [("r", gap(0, 2), 1), ("r", gap(0, 1), 3)],
                 "gap_read"),
    # a write touching the gap is not recorded: it goes to the card alone
    "gap_write": (export(0, tokens=3, kv=3, params=GAP) + [("r", gap(0, 4), 3)], "gap_write"),
    # ... and drops the region's committed copy (whose token sector it overwrites on the card)
    "gap_drop": (export(0, params=GAP) + [("w", gap(0, 1), data(2, 7)), ("r", gap(0, 1), 1),
                                          ("r", gap(0, 4), 1)], "gap_keep"),
    # slot offset of a K/V sector: its region offset less the gap
    "gap_address": (export(1, kv=3, params=GAP) + [("r", gap(1, 4), 3), ("r", gap(1, 6), 1)],
                    "gap_address"),
}


@pytest.mark.parametrize("rule", sorted(RULES) + sorted(GAP_RULES))
def test_rule(rule):
    if rule in GAP_RULES:
        (script, bug), fails, params = GAP_RULES[rule], {}, GAP
    else:
        (script, fails, bug), params = RULES[rule], SMALL
    kw = {k: _fail(v) for k, v in fails.items()}
    _, found = run_and_check(params, script, **kw)
    assert not found, found
    _, found = run_and_check(params, script, bug=bug, **kw)
    assert found, f"the broken variant {bug!r} passed rule {rule!r}"


#: the read slice's rules, caught on random reads with stalls (the initiator withholding
#: ``ready`` keeps words in the slice) and card errors: rule -> the broken variant
SLICE_RULES = {"ok_status_after_the_words": "slice_early",
               "words_after_an_error_dropped": "slice_stale"}


def _slice_run(bug):
    """Reads of the card and of a slot with the initiator stalling half its clocks, a fifth
    of the card's reads failing part-way, on the tier with ``bug`` (None: the design): the
    findings against the golden model."""
    rng = random.Random(3)
    script = export(0) + [("r", rng.randrange(SMALL["base_lba"], 24), rng.randrange(1, 3))
                          for _ in range(40)]
    frng = random.Random(4)

    def fail(op, lba, count):
        return frng.randrange(8, count * 512) if frng.random() < 0.2 else None

    _, found = run_and_check(SMALL, script, seed=5, stall=0.5, card_fail=fail, bug=bug)
    return found


def test_read_slice_script_passes():
    """The design on the read slice's script (``test_read_slice_rule``'s): no finding."""
    found = _slice_run(None)
    assert not found, found[:3]


@pytest.mark.parametrize("rule", sorted(SLICE_RULES))
def test_read_slice_rule(rule):
    """On the script the design passes (``test_read_slice_script_passes``): an OK status comes
    only once the slice's words are out (else its tail is short of the golden's clock), and
    the words an error leaves in the slice never reach the next read (else it returns another
    read's bytes first)."""
    found = _slice_run(SLICE_RULES[rule])
    assert found, f"the broken variant {SLICE_RULES[rule]!r} passed rule {rule!r}"


def test_every_broken_variant_is_caught_by_a_rule():
    assert sorted([*(bug for *_, bug in [*RULES.values(), *GAP_RULES.values()]),
                   *SLICE_RULES.values()]) == sorted(BUGS)


def test_compact_slot_boundaries():
    """Compact slots (``GAP``): the last held token sector, the first and last gap sectors,
    the first and last K/V sectors are read where they belong; writes over the gap's edges
    (held -> gap, gap -> K/V) and into the gap alone go to the card and drop the copy; the last
    slot ends at SDRAM sector ``sdram_base + slots * 5``; an export whose tokens reach the gap
    keeps its header and K/V in a slot (tokens from the card)."""
    p = GAP
    full = export(1, tokens=1, kv=3, params=p, seed=1)
    script = (export(0, tokens=1, kv=3, params=p) + full
              + [("r", gap(0, 1), 1),              # last held token sector: SDRAM
                 ("r", gap(0, 2), 1),              # first gap sector: card
                 ("r", gap(0, 3), 1),              # last gap sector: card
                 ("r", gap(0, 4), 1),              # first K/V sector: SDRAM
                 ("r", gap(1, 6), 1),              # the last slot's last sector: SDRAM
                 ("r", gap(0, 3), 2),              # over the gap's upper edge: card
                 ("w", gap(0, 3), data(2, 3)),     # a write over it: card, drops region 0
                 ("r", gap(0, 4), 1), ("r", gap(0, 1), 1)]     # region 0 from the card now
              + full
              + [("w", gap(1, 2), data(1, 4)),     # a write into the gap alone: drops 1
                 ("r", gap(1, 0), 1)]
              + full
              + [("w", gap(1, 1), data(2, 5)),     # over the lower edge (held -> gap): drops
                 ("r", gap(1, 1), 1), ("r", gap(1, 4), 1)]
              # a long record: tokens 1..3 (card alone), K/V and header in a slot
              + export(2, tokens=3, kv=3, params=p, seed=6)
              + [("r", gap(2, 0), 1), ("r", gap(2, 1), 3), ("r", gap(2, 4), 3)])
    run, found = run_and_check(p, script)
    assert not found, found
    tiers = [("card" if o.card else "") + ("sdram" if o.sdram else "") for o in run.ops]
    base = p["sdram_base"]
    assert tiers[6:12] == ["sdram", "card", "card", "sdram", "sdram", "card"]
    assert run.ops[6].sdram[1] == base + 1 and run.ops[9].sdram[1] == base + 2
    assert run.ops[10].sdram[1] == base + 2 * 5 - 1
    assert tiers[12:15] == ["card"] * 3
    assert tiers[18:20] == ["card"] * 2 and tiers[23:26] == ["card"] * 3
    # the long record: tokens to the card alone, K/V and header to both; read back likewise
    assert tiers[26:] == ["card", "cardsdram", "cardsdram", "sdram", "card", "sdram"]


# ---- boundaries, errors --------------------------------------------------------------------

def test_boundaries():
    """The first and the last region, a read over two regions, transfers below and beyond the
    record area, count 0, the card's last sector and past it, the highest lba."""
    p = SMALL
    last = region(p["regions"] - 1)
    area_end = region(p["regions"])
    script = (export(0) + export(p["regions"] - 1, tokens=2, kv=1)
              + [("r", region(0), 1), ("r", last, 1), ("r", last + 1, 2), ("r", last + 3, 1),
                 ("r", region(0) + 3, 2),            # over regions 0 and 1: the card
                 ("r", 0, 2), ("w", 1, data(1)),     # below the record area
                 ("r", area_end, 1), ("w", area_end, data(1)),   # beyond it (the card's last)
                 ("r", area_end + 1, 1),              # past the card: RANGE
                 ("r", region(0), 0), ("w", region(0), b""),    # count 0: RANGE
                 ("r", (1 << 32) - 1, 1),
                 ("w", 1, data(2)),                   # sector 1 and region 0's header: clears
                 ("r", region(0), 1), ("r", last, 1)])
    run, found = run_and_check(p, script)
    assert not found, found
    assert [o.status for o in run.ops].count(StorageError.RANGE) == 4
    assert run.ops[6].sdram and run.ops[7].sdram and not run.ops[-2].sdram


@pytest.mark.parametrize("side", ["card", "sdram"])
def test_write_errors_abort_the_copy(side):
    """A failure of either tier in any write of an export: the copy is aborted and its region
    read from the card; the initiator gets the card's status (an SDRAM failure costs only the
    copy). Both a failure in the data phase and one before it (at byte 0)."""
    rng = random.Random(3)
    for k, at in enumerate([0, 300, 511]):
        target = rng.randrange(3)
        calls = {"n": 0}

        def fail(op, lba, count, target=target, at=at, calls=calls):
            if op.value != 1:
                return None
            calls["n"] += 1
            return at if calls["n"] - 1 == target else None

        script = export(1, seed=k) + [("r", region(1), 1), ("r", region(1) + 1, 1)]
        run, found = run_and_check(SMALL, script, seed=k, **{f"{side}_fail": fail})
        assert not found, found
        if target == 2:           # the header's write failed: no copy
            assert all(not o.sdram for o in run.ops[3:])
        failed = run.ops[target]
        assert failed.status == (StorageError.CARD if side == "card" else StorageError.OK)


def test_sdram_range_error_on_the_last_slot():
    """An SDRAM store smaller than the slots: writes into the last slot fail there (RANGE);
    the export still succeeds on the card, and its region is read from the card."""
    card, sdram = images(SMALL, 4, sdram_short=3)
    script = export(0) + export(1) + [("r", region(0), 1), ("r", region(1) + 1, 1)]
    run, found = run_and_check(SMALL, script, card=card, sdram=sdram)
    assert not found, found
    assert [o.status for o in run.ops] == [StorageError.OK] * 8
    assert run.ops[6].sdram and not run.ops[7].sdram


def test_read_error_from_the_card_is_passed_on():
    fail = lambda op, lba, count: 200 if op.value == 0 else None      # noqa: E731
    run, found = run_and_check(SMALL, [("r", region(2), 2)], card_fail=fail)
    assert not found, found
    assert run.ops[0].status == StorageError.CARD and len(run.ops[0].data) == 200


# ---- random traffic ----------------------------------------------------------------------------

def _random_run(params, seed, n, p, drops=False):
    rng = random.Random(seed)
    card, sdram = images(params, seed)
    script = random_script(rng, params, card.sectors, n, drops=drops)
    frng = random.Random(seed + 1)

    def fail(op, lba, count):
        return frng.randrange(count * 512) if frng.random() < 0.05 else None

    run, found = run_and_check(params, script, seed=seed, card=card, sdram=sdram, idle=p,
                               stall=p, hold=p, card_fail=fail, sdram_fail=fail)
    assert not found, "\n".join(found)
    return run


def test_random_traffic():
    """Random exports, imports and raw transfers, 20 % idle and stalls on every stream, 5 %
    of transfers failing on each tier: the golden's routes, clocks and statuses, the card's
    bytes on every read."""
    run = _random_run(EVICT, 11, 24, 0.2)
    assert any(o.sdram and not o.card for o in run.ops)          # reads served from SDRAM


def test_random_traffic_with_drops():
    """The same with the directory's deletes on ``drop`` (between an export's writes too) and
    counts of the residents, against the golden's."""
    run = _random_run(EVICT, 13, 30, 0.2, drops=True)
    assert any(o.residents for o in run.ops)


def test_random_traffic_wide():
    """The same on the wide port (``width=4``: the storage and SDRAM sides four-byte words,
    the card's bytes through the tier's widener): the golden's routes, clocks and statuses,
    the card's bytes on every read."""
    run = _random_run({**EVICT, "width": 4}, 15, 24, 0.2)
    assert any(o.sdram and not o.card for o in run.ops)


def test_random_traffic_compact():
    """The same over compact slots (``GAP``): exports whose tokens reach the gap or not."""
    run = _random_run(GAP, 12, 24, 0.2)
    assert any(o.sdram and not o.card for o in run.ops)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", ["SMALL", "EVICT", "GAP"])
def test_random_traffic_more(shape, seed):
    _random_run({"SMALL": SMALL, "EVICT": EVICT, "GAP": GAP}[shape], 100 + seed, 80,
                [0.0, 0.3][seed % 2])


# ---- power cuts --------------------------------------------------------------------------------

def _power_cut(params, seed, n):
    """A random script cut at a random clock; then a new block (the tier empty) on the same
    card and an SDRAM of noise: every region's sectors read back equal the card, from the card
    (nothing committed yet), then a new export and its import from SDRAM."""
    rng = random.Random(seed)
    card, sdram = images(params, seed)
    script = random_script(rng, params, card.sectors, n)
    golden = GoldenTieredStorage(**params)
    run = run_tiered(params, script, card, sdram, seed=seed, cut_at=rng.randrange(n * 700))
    found = check_run(golden, script, run)
    assert not found, found
    lose_sdram(sdram, rng)
    golden.power_cut()
    spr = params["sectors_per_region"]
    after = [("r", region(r, params), spr) for r in range(params["regions"])]
    after += [("r", region(r, params) + s, 1) for r in range(params["regions"])
              for s in range(2)]
    after += export(1, params=params, seed=seed) + [("r", region(1, params), 1)]
    run2, found = run_and_check(params, after, seed=seed, card=card, sdram=sdram,
                                golden=golden)
    assert not found, found
    assert not any(o.sdram for o in run2.ops[:-4]) and run2.ops[-1].sdram
    return run


def test_power_cut_then_card_only():
    _power_cut(SMALL, 21, 12)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_power_cuts_at_random_points(seed):
    _power_cut([SMALL, EVICT][seed % 2], 200 + seed, 30)


# ---- the DMA engine over the tiers --------------------------------------------------------

#: the small record shape of test_dma.py: a record is a few thousand clocks
TINY = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=4, window=4, token_width=8,
                    max_tokens=40)
KEY = (7, bytes(range(32)))


def simulate_dma(config, regions, card, sdram, body, *, seed=0, mac=False, tiered=None,
                 p=0.0, cut_at=None, clock=None, fail=None):
    """Run ``body(ctx, h, logs)`` on a DMA harness over a tiered storage whose backends are the
    sector images ``card`` and ``sdram`` (random idle and stalls ``p``); ``logs`` has each
    backend's ``(op, lba, count)`` commands. ``cut_at``: the power fails at that clock (the
    simulation stops there; returns ``None``). ``clock`` (a dict): its ``"n"`` counts clocks.
    ``fail``: ``{"card" | "sdram": the sector model's fail(op, lba, count)}``."""
    h = DmaHarness(config, regions, mac=mac, tiered=tiered or dict(slots=2))
    sim = Simulator(h)
    sim.add_clock(1e-8)
    logs, out = {"card": [], "sdram": []}, {}
    for name, image in (("card", card), ("sdram", sdram)):
        port = getattr(h, name)

        side_fail = (fail or {}).get(name)

        async def serve(ctx, port=port, image=image, log=logs[name], side_fail=side_fail):
            await serve_storage(ctx, port, image, rng=random.Random(seed + len(log)), idle=p,
                                stall=p, log=log, fail=side_fail)
        sim.add_testbench(serve, background=True)

    async def bench(ctx):
        await ctx.tick().repeat(regions + 4)          # the hot tier's reset sweep
        out["value"] = await body(ctx, h, logs)

    async def cut(ctx):
        await ctx.tick().repeat(cut_at)

    if clock is not None:
        async def count(ctx):
            async for _ in ctx.tick():
                clock["n"] += 1
        sim.add_process(count)

    if cut_at is None:
        sim.add_testbench(bench)
    else:
        sim.add_testbench(bench, background=True)
        sim.add_testbench(cut)
    sim.run()
    return out.get("value")


@pytest.mark.parametrize("width", [1, 4])
def test_dma_over_tiers(width):
    """The DMA engine, unchanged, over the tiered storage: an export writes the record to the
    card and the slot (the same bytes), the import reads it from SDRAM (no card command) and
    restores the rings; after a power cut (a new harness on the card, the SDRAM noise) the
    same import reads the card and restores the same rings. ``width`` 4: the engine and the
    tier's SDRAM side move four-byte words, the card stays a port of bytes behind the tier's
    widener."""
    config, regions, r = TINY, 4, 2
    rng = random.Random(5)
    lay = RecordLayout(config)
    card = new_image(config, regions, rng)
    sdram = SectorImage(None, 2 * lay.sectors_per_region)
    lose_sdram(sdram, rng)
    rings, count, head = rand_rings(config, rng), 11, 3
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]

    async def body(ctx, h, logs):
        await load_state(ctx, h, config, rings, count, head, tokens)
        exp = await dma_op(ctx, h, DmaOp.EXPORT, r, hash=99, seq=4)
        await load_state(ctx, h, config, np.zeros_like(rings), 0, 0, tokens)
        n_card = len(logs["card"])
        imp = await dma_op(ctx, h, DmaOp.IMPORT, r, count=count, hash=99)
        assert len(logs["card"]) == n_card          # nothing read from the card
        return exp, imp, await read_state(ctx, h, config)

    tiered = dict(slots=2, width=width)
    exp, imp, (got, meta) = simulate_dma(config, regions, card, sdram, body, p=0.2,
                                         tiered=tiered)
    assert exp[0] == RecordStatus.OK and imp[:4] == (RecordStatus.OK, count, 99, 4)
    assert (got == rings).all() and meta == [(count, head)]
    # slot 0 holds the card's bytes of the sectors the export wrote (header, tokens, K/V)
    for k in (0, 1, lay.kv_sector):
        assert sdram.read(k) == card.read(lay.region_lba(r) + k)

    lose_sdram(sdram, rng)

    async def after_cut(ctx, h, logs):
        await load_state(ctx, h, config, np.zeros_like(rings), 0, 0, tokens)
        imp = await dma_op(ctx, h, DmaOp.IMPORT, r, count=count, hash=99)
        assert not logs["sdram"]
        return imp, await read_state(ctx, h, config)

    imp2, (got2, meta2) = simulate_dma(config, regions, card, sdram, after_cut, tiered=tiered)
    assert imp2[:4] == (RecordStatus.OK, count, 99, 4)
    assert (got2 == rings).all() and meta2 == [(count, head)]


@pytest.mark.parametrize("at", [2, 5, 70])
def test_wide_import_from_the_card_ended_early(at):
    """Four-byte words between the engine and the tier, the card behind the tier's widener:
    after a power cut (the SDRAM noise) an import reads the card, which ends its K/V read with
    ``CARD`` after ``at`` bytes (the widener holds a partial word, or whole words went to the
    K/V writer): STORAGE, the rings empty once a K/V word came (``at`` >= 4), unchanged
    before; the same import again, the card healthy, restores the rings."""
    config, regions, r = TINY, 4, 1
    rng = random.Random(at)
    lay = RecordLayout(config)
    card = new_image(config, regions, rng)
    sdram = SectorImage(None, 2 * lay.sectors_per_region)
    rings, count, head = rand_rings(config, rng), 11, 3
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]
    tiered = dict(slots=2, width=4)

    async def export(ctx, h, logs):
        await load_state(ctx, h, config, rings, count, head, tokens)
        return await dma_op(ctx, h, DmaOp.EXPORT, r, hash=9, seq=2)

    assert simulate_dma(config, regions, card, sdram, export, tiered=tiered)[0] \
        == RecordStatus.OK
    lose_sdram(sdram, rng)
    armed = [True]

    def card_fail(op, lba, n):
        if op == StorageOp.READ and lba == lay.region_lba(r) + lay.kv_sector and armed[0]:
            armed[0] = False
            return at
        return None

    async def imports(ctx, h, logs):
        stale = rand_rings(config, rng)
        await load_state(ctx, h, config, stale, 2, 1, tokens)
        bad = await dma_op(ctx, h, DmaOp.IMPORT, r, count=count, hash=9)
        after_bad = await read_state(ctx, h, config)
        good = await dma_op(ctx, h, DmaOp.IMPORT, r, count=count, hash=9)
        assert not logs["sdram"]
        return bad[0], after_bad[1], good[:4], await read_state(ctx, h, config)

    bad, meta_bad, good, (got, meta) = simulate_dma(config, regions, card, sdram, imports,
                                                    tiered=tiered, p=0.2,
                                                    fail={"card": card_fail})
    assert bad == RecordStatus.STORAGE
    assert meta_bad == [(0, config.window - 1) if at >= 4 else (2, 1)]
    assert good == (RecordStatus.OK, count, 9, 2)
    assert (got == rings).all() and meta == [(count, head)]


def test_dma_over_compact_slots():
    """The DMA engine over compact slots: records of 1,024 one-byte tokens have 2 token sectors
    (K/V from sector 3); the slots hold 1 (``slot_token_sectors=1``). A record of 11 tokens is
    imported from SDRAM alone; one of 600 tokens (2 token sectors: its token write touches the
    gap) reads its tokens from the card and its header and K/V from the slot; both restore
    their rings, and the two copies fit in 2 slots of 3 sectors."""
    config = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=4, window=4,
                          token_width=8, max_tokens=1024)
    regions = 4
    rng = random.Random(8)
    lay = RecordLayout(config)
    assert (lay.token_sectors_max, lay.kv_sector, lay.sectors_per_region) == (2, 3, 4)
    card = new_image(config, regions, rng)
    sdram = SectorImage(None, 2 * 3)
    lose_sdram(sdram, rng)
    recs = [(1, 11), (2, 600)]
    states = {r: (rand_rings(config, rng), [rng.randrange(256) for _ in range(n)])
              for r, n in recs}

    async def body(ctx, h, logs):
        for r, n in recs:
            rings, tokens = states[r]
            await load_state(ctx, h, config, rings, n, 0, tokens)
            assert (await dma_op(ctx, h, DmaOp.EXPORT, r, hash=r, seq=1))[0] == RecordStatus.OK
        out = []
        for r, n in recs:
            rings, tokens = states[r]
            await load_state(ctx, h, config, np.zeros_like(rings), 0, 0, tokens)
            n_card = len(logs["card"])
            imp = await dma_op(ctx, h, DmaOp.IMPORT, r, count=n, hash=r)
            out.append((imp, logs["card"][n_card:], await read_state(ctx, h, config)))
        return out

    out = simulate_dma(config, regions, card, sdram, body, p=0.2,
                       tiered=dict(slots=2, slot_token_sectors=1))
    (imp1, card1, (got1, meta1)), (imp2, card2, (got2, meta2)) = out
    assert imp1[:3] == (RecordStatus.OK, 11, 1) and imp2[:3] == (RecordStatus.OK, 600, 2)
    assert (got1 == states[1][0]).all() and meta1 == [(11, 0)]
    assert (got2 == states[2][0]).all() and meta2 == [(600, 0)]
    assert card1 == []                                                # all from SDRAM
    assert card2 == [(StorageOp.READ, lay.region_lba(2) + 1, 2)]      # the tokens alone


def _refresh_header_crc(sector: bytes) -> bytes:
    off, _ = HEADER_OFFSETS["header_crc"]
    return sector[:off] + zlib.crc32(sector[:off]).to_bytes(4, "little") + sector[off + 4:]


def test_sealed_records_keep_their_checks_from_sdram():
    """A sealed record imported from the slot is checked as one from the card: it hits with
    its key; a copy whose tag was changed (header CRC made right again) is ``BAD_MAC``, one
    with a K/V byte flipped ``BAD_PAYLOAD_CRC``, and the rings are left empty."""
    config, regions, r = TINY, 4, 1
    rng = random.Random(6)
    lay = RecordLayout(config)
    card = new_image(config, regions, rng)
    sdram = SectorImage(None, 2 * lay.sectors_per_region)
    rings, count, head = rand_rings(config, rng), 9, 0
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]
    tag, _ = HEADER_OFFSETS["mac_tag"]

    async def body(ctx, h, logs):
        await set_key(ctx, h, 1, *KEY)
        await load_state(ctx, h, config, rings, count, head, tokens)
        out = [await dma_op(ctx, h, DmaOp.EXPORT, r, hash=5, seq=1, sealed=1, slot=1)]
        slot_lba = logs["sdram"][-1][1]                  # the header: the slot's sector 0
        out.append(await dma_op(ctx, h, DmaOp.IMPORT, r, count=count, hash=5, sealed=1,
                                slot=1))
        header = sdram.read(slot_lba)
        bad = bytearray(header)
        bad[tag] ^= 1
        sdram.write(slot_lba, _refresh_header_crc(bytes(bad)))
        out.append(await dma_op(ctx, h, DmaOp.IMPORT, r, count=count, hash=5, sealed=1,
                                slot=1))
        sdram.write(slot_lba, header)
        kv = sdram.read(slot_lba + lay.kv_sector)
        sdram.write(slot_lba + lay.kv_sector, bytes([kv[0] ^ 0x10]) + kv[1:])
        out.append(await dma_op(ctx, h, DmaOp.IMPORT, r, count=count, hash=5, sealed=1,
                                slot=1))
        reads = [lba for op, lba, _ in logs["sdram"] if op == StorageOp.READ]
        return out, reads, slot_lba, await read_state(ctx, h, config)

    out, reads, slot_lba, (_, meta) = simulate_dma(config, regions, card, sdram, body, mac=True)
    assert [o[0] for o in out] == [RecordStatus.OK, RecordStatus.OK, RecordStatus.BAD_MAC,
                                   RecordStatus.BAD_PAYLOAD_CRC]
    assert reads.count(slot_lba) == 3                  # every import read the slot
    assert meta == [(0, config.window - 1)]            # emptied


@pytest.mark.parametrize("seed", [0, *(pytest.param(k, marks=pytest.mark.slow)
                                      for k in range(1, 6))])
def test_power_cut_during_a_reexport(seed):
    """Record A exported into a region and read back from SDRAM; record B exported into the same
    region (the directory reusing it) with the power failing at a random clock of its export
    (the clocks of a run without the cut);
    then a new harness on the card, the SDRAM noise: importing A gives A's rings or a miss,
    importing B gives B's rings or a miss, never another state, and a hit only from the card."""
    config, regions, r = TINY, 4, 1
    rng = random.Random(40 + seed)
    lay = RecordLayout(config)
    recs = []
    for key in (7, 8):
        # at least W tokens: every ring slot is in the record (the whole rings compare)
        rings, count, head = rand_rings(config, rng), rng.randint(4, 9), rng.randrange(4)
        recs.append((rings, count, head, [rng.randrange(256) for _ in range(count)], key))

    async def first(ctx, h, logs):
        rings, count, head, tokens, key = recs[0]
        await load_state(ctx, h, config, rings, count, head, tokens)
        assert (await dma_op(ctx, h, DmaOp.EXPORT, r, hash=key, seq=1))[0] == RecordStatus.OK
        await load_state(ctx, h, config, np.zeros_like(rings), 0, 0, tokens)
        imp = await dma_op(ctx, h, DmaOp.IMPORT, r, count=count, hash=key)
        assert imp[0] == RecordStatus.OK
        assert any(op == StorageOp.READ for op, _, _ in logs["sdram"])
        rings, count, head, tokens, key = recs[1]
        await load_state(ctx, h, config, rings, count, head, tokens)
        phase["start"] = clock["n"]
        await dma_op(ctx, h, DmaOp.EXPORT, r, hash=key, seq=2)
        phase["end"] = clock["n"]

    def media():
        card = new_image(config, regions, random.Random(seed))
        return card, SectorImage(None, 2 * lay.sectors_per_region)

    # a run without the cut gives the clocks of B's export; the run with it cuts inside them
    phase, clock = {}, {"n": 0}
    simulate_dma(config, regions, *media(), first, seed=seed, clock=clock)
    window = (phase["start"], phase["end"])
    phase, clock = {}, {"n": 0}
    card, sdram = media()
    simulate_dma(config, regions, card, sdram, first, seed=seed, clock=clock,
                 cut_at=rng.randrange(*window))
    assert "start" in phase and "end" not in phase
    lose_sdram(sdram, rng)

    async def after(ctx, h, logs):
        out = []
        for rings, count, _, tokens, key in recs:
            await load_state(ctx, h, config, np.zeros_like(rings), 0, 0, tokens)
            imp = await dma_op(ctx, h, DmaOp.IMPORT, r, count=count, hash=key)
            out.append((imp[0], await read_state(ctx, h, config)))
        assert not logs["sdram"]
        return out

    for (status, (got, meta)), (rings, count, head, _, _) in zip(
            simulate_dma(config, regions, card, sdram, after, seed=seed), recs):
        if status == RecordStatus.OK:
            assert (got == rings).all() and meta == [(count, head)]
        else:
            assert meta == [(0, config.window - 1)] or meta == [(0, 0)]


@pytest.mark.slow       # two DMA runs through the real controllers: about 4 minutes
def test_dma_through_the_half_rate_sdram_controller():
    """The DMA engine, the tiered storage, the SD native controller on the 4-bit card model and
    the SDRAM sector store on the half-rate controller (60 MHz, the SDRAM at 120 on the strict
    pin-level model): exports and imports restore the rings (``import_clocks`` checks them)
    in the same clocks as at full rate on the byte port; on the wide port (four-byte words
    end to end) the import from SDRAM is faster by the K/V sector's three quarters."""
    from ringkv.sim.tiered_sim import import_clocks
    config = RingKVConfig(layers=1, q_heads=2, kv_heads=2, head_dim=16, window=8,
                          max_tokens=64)
    full = import_clocks(config, 8, mhz=60)
    half = import_clocks(config, 8, mhz=60, sdram_rate=2)
    assert half == full and half["import_sdram"] < half["import_card"]
    # on four-byte words: the slot's K/V sector a word a clock (373 clocks fewer, as in
    # test_switch_from_sdram_at_four_bytes_a_clock); the card's import a clock more (its
    # widener hands the status on after the last word); the exports paced by the card
    wide = import_clocks(config, 8, mhz=60, sdram_rate=2, width=4)
    assert wide == {**half, "import_sdram": half["import_sdram"] - 373,
                    "import_card": half["import_card"] + 1}


SWITCH = RingKVConfig(layers=1, q_heads=2, kv_heads=2, head_dim=16, window=8, max_tokens=64)


def test_switch_from_sdram_at_four_bytes_a_clock():
    """The four-byte import end to end: the DMA engine, the tiered storage and the SDRAM
    sector store on four-byte words, the SDRAM controller at half rate (60 MHz, the SDRAM at
    120, CL 3) on the strict pin-level model. A record exported to the card and its slot
    imports from the slot (no card command) and restores the rings (``switch_clocks`` checks
    both) in 1,248 clocks: the byte port's 1,621 (``test_switch_from_sdram_on_bytes``) less
    384 for its one K/V sector read a word a clock, plus the K/V writer's input register and
    last chunk (1 + ``v - 1`` = 8 clocks, no padding words after it), plus a clock for each of
    the three reads: the tier's read slice gives every word a clock later, which the byte
    port hides (its status comes a clock after the backend's, as late as the last word) and
    the wide path does not (the unpacker's bytes after the header's and the tokens' last
    words, the writer's drain after the K/V's). The SDRAM keeps up with a word a clock."""
    from ringkv.sim.tiered_sim import switch_clocks
    r = switch_clocks(SWITCH, 8, width=4)
    assert (r["import_sdram"], r["kv_sectors"]) == (1621 - 384 + 8 + 3, 1)


@pytest.mark.slow
def test_switch_from_sdram_on_bytes():
    """The same record on the byte port (the half-rate controller and the full-rate one):
    1,621 clocks either way, a byte a clock."""
    from ringkv.sim.tiered_sim import switch_clocks
    half = switch_clocks(SWITCH, 8, width=1)
    full = switch_clocks(SWITCH, 8, width=1, sdram_rate=1)
    assert half["import_sdram"] == full["import_sdram"] == 1621
