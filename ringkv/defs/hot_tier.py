"""The hot tier's interface, defined once for the gateware and its golden model.

Opcodes (:class:`Op`), statuses (:class:`Status`), slot states (:class:`SlotState`), field
widths, the command and response fields (:func:`command_fields`, :func:`response_fields`) and
the parameter rules (:func:`check_hot_tier_params`) of
:class:`ringkv.hw.store.hot_tier.HotTier`, the map from the directory's card regions to SDRAM
slots; the golden model :class:`ringkv.host.golden.hot_tier.GoldenHotTier` depends on these,
not on the RTL.
"""

import enum

from .checks import check_int, check_pow2, check_type
from .directory import REGION_FIELD_WIDTH
from .sdram import DEFAULT_CHIP, chip_of

__all__ = ["Op", "Status", "SlotState", "OP_BITS", "STATUS_BITS", "STATE_BITS",
           "SLOT_FIELD_WIDTH", "REGION_FIELD_WIDTH", "COUNT_FIELD_WIDTH", "MAX_SLOTS",
           "command_fields", "response_fields", "check_hot_tier_params",
           "BOARD_SLOT_TOKEN_SECTORS", "BOARD_SDRAM_PART", "slot_sectors", "residents",
           "tier_parameters", "TIER_KEYS", "READ_CLOCKS", "import_clocks_model"]

#: Width of the ``slot`` fields (commands and responses): out-of-range slots are expressible.
SLOT_FIELD_WIDTH = 16
#: Width of the ``count`` response field (COUNT: valid slots).
COUNT_FIELD_WIDTH = 16
#: The most slots a hot tier may have (32 MB of SDRAM holds about 250 default records).
MAX_SLOTS = 1024

#: The board's compact slots (``TieredStorage``'s ``slot_token_sectors``): a slot holds the
#: header, the first 16 token sectors (4,096 tokens at 2 bytes) and the K/V, 273 sectors at the
#: default shape, so 32 MB of SDRAM holds 240 conversations (issue #35's target; 17 token
#: sectors would hold 239) and 64 MB 480; a longer conversation's tokens stay on the card.
BOARD_SLOT_TOKEN_SECTORS = 16


#: The ULX3S's SDRAM part (32 MB; :data:`ringkv.defs.sdram.CHIPS`): the default geometry of
#: ``RingKVTop(tier={})``.
BOARD_SDRAM_PART = DEFAULT_CHIP.name

#: A model of a DMA read's clocks, per tier: ``(fixed, per_sector)`` clocks besides the tiered
#: storage's own (its ``setup``, exact: the golden model's), fitted to the imports measured in
#: ``docs/blocks/tiered_storage.md`` (``sim.tiered_sim.import_clocks``, 40 MHz, the DMA over the
#: SDRAM sector store on the pin-level SDRAM model, CL 2, and over the SD native controller on
#: the bit-level card model at SD CLK = clk / 2: 1,624 and 5,210 clocks from SDRAM, 6,659 and
#: 21,491 from the card, for records of 3 and 10 sectors; ``bench/results.json``'s
#: ``sdram.tier.*``). It gives those four within 2 clocks (:func:`import_clocks_model`;
#: ``tests/host/device/test_software_device_tier.py`` reads the stored figures); ``fixed``
#: holds the DMA's own clocks of the read, the tier's clock for the status and the medium's
#: first-byte latency. A model of the simulated media, not of a real card (whose
#: read latency, up to 100 ms, adds to the card's side only); ``FpgaDevice`` reports the
#: device's own clocks (``QUERY``'s ``cycles``).
READ_CLOCKS = {"sdram": (19, 512), "card": (94, 2119)}

#: The keys of ``RingKVTop(tier=...)`` (:func:`tier_parameters`).
TIER_KEYS = ("part", "sdram_bytes", "slot_token_sectors", "slots", "stamp_width")


def slot_sectors(layout, slot_token_sectors=None) -> int:
    """Sectors of an SDRAM slot for records of ``layout`` (a
    :class:`~ringkv.defs.record.RecordLayout`): the header, ``slot_token_sectors`` token
    sectors (``None``: all of them) and the K/V."""
    if slot_token_sectors is None:
        return layout.sectors_per_region
    return 1 + slot_token_sectors + layout.kv_sectors_max


def residents(sdram_bytes: int, layout, slot_token_sectors=None, *, sdram_base=0) -> int:
    """Conversations resident in ``sdram_bytes`` of SDRAM (slots from SDRAM-store sector
    ``sdram_base``), at most :data:`MAX_SLOTS`."""
    return min(MAX_SLOTS, (sdram_bytes // 512 - sdram_base)
               // slot_sectors(layout, slot_token_sectors))


OP_BITS = 4
STATUS_BITS = 4
STATE_BITS = 2


class Op(enum.Enum):
    """Command opcodes (``command_layout().op``)."""
    LOOKUP = 0
    ALLOC = 1
    COMMIT = 2
    ABORT = 3
    DROP = 4
    CLEAR = 5
    READ = 6
    COUNT = 7


class Status(enum.Enum):
    """Response status (``response_layout().status``). A lookup hit is ``OK``."""
    OK = 0
    MISS = 1
    FULL = 2
    BAD_REGION = 3
    BAD_SLOT = 4
    BAD_OP = 5


class SlotState(enum.Enum):
    """A slot's state (READ's ``state``): free (in the pool), reserved by ALLOC for a write
    in progress (not found by LOOKUP, not evictable), or valid (a committed copy)."""
    FREE = 0
    RESERVED = 1
    VALID = 2


def command_fields(stamp_width=32) -> dict:
    """The command payload's fields from the LSB: ``{name: width}`` (``op`` is an :class:`Op`).

    Fields an operation does not use are ignored.
    """
    return {
        "op": OP_BITS,
        "region": REGION_FIELD_WIDTH,     # LOOKUP, ALLOC, COMMIT, ABORT, DROP
        "slot": SLOT_FIELD_WIDTH,         # COMMIT, ABORT, READ
        "now": stamp_width,               # LOOKUP (a hit), ALLOC, COMMIT
    }


def response_fields(stamp_width=32) -> dict:
    """The response payload's fields from the LSB: ``{name: width}`` (``status`` is a
    :class:`Status`, ``op`` an :class:`Op`, ``state`` a :class:`SlotState`). Fields an
    operation does not report are zero."""
    return {
        "status": STATUS_BITS,
        "op": OP_BITS,                    # the command's opcode, echoed
        "evicted": 1,                     # ALLOC: a valid slot was evicted to make room
        "slot": SLOT_FIELD_WIDTH,         # LOOKUP hit, ALLOC, COMMIT, ABORT, DROP, READ
        "victim_region": REGION_FIELD_WIDTH,  # ALLOC with evicted=1: the evicted slot's region
        "state": STATE_BITS,              # READ
        "region": REGION_FIELD_WIDTH,     # READ
        "stamp": stamp_width,             # READ
        "count": COUNT_FIELD_WIDTH,       # COUNT: valid slots
    }


def check_hot_tier_params(regions, slots, stamp_width):
    """Check the parameters shared by the RTL and the golden model."""
    check_pow2("Region count", regions, low=2, high=1 << REGION_FIELD_WIDTH)
    check_int("Slot count", slots, low=2, high=MAX_SLOTS)
    check_int("Stamp width", stamp_width, low=1, high=32, unit=" bits")


_BOARD = object()


def tier_parameters(layout, regions: int, *, part: str = BOARD_SDRAM_PART,
                    sdram_bytes: int | None = None, slot_token_sectors=_BOARD,
                    slots: int | None = None, stamp_width: int = 32) -> dict:
    """The SDRAM hot tier of a device with ``regions`` record regions of ``layout``: the
    :class:`~ringkv.hw.storage.tiered.TieredStorage` parameters besides the layout's, and what
    they come from. ``part``: the SDRAM part (its size, ``words * 2`` bytes; default the
    ULX3S's 32 MB), or ``sdram_bytes`` the size itself; ``slot_token_sectors``: the compact
    slots' T (default :data:`BOARD_SLOT_TOKEN_SECTORS`, at most the layout's token sectors;
    ``None``: whole regions); ``slots``: the copies held (default as many as fit,
    :func:`residents`, at most ``regions``: a region has one copy at most). Returns
    ``{"slots", "slot_token_sectors", "stamp_width", "part", "sdram_bytes", "slot_sectors",
    "sdram_sectors"}`` (the SDRAM sectors the slots use)."""
    check_type("part", part, str)
    chip = chip_of(part)
    if sdram_bytes is None:
        sdram_bytes = chip.words * 2
    check_int("sdram_bytes", sdram_bytes, low=1)
    if slot_token_sectors is _BOARD:
        slot_token_sectors = min(BOARD_SLOT_TOKEN_SECTORS, layout.token_sectors_max)
    elif slot_token_sectors is not None:
        check_int("slot_token_sectors", slot_token_sectors, low=0,
                  high=layout.token_sectors_max)
    per = slot_sectors(layout, slot_token_sectors)
    fit = min(residents(sdram_bytes, layout, slot_token_sectors), regions)
    if slots is None:
        slots = fit
    check_int("slots", slots, low=2, high=MAX_SLOTS)
    if slots * per > sdram_bytes // 512:
        raise ValueError(f"{slots} slots of {per} sectors need {slots * per * 512} bytes of "
                         f"SDRAM, more than {sdram_bytes}")
    return {"slots": slots, "slot_token_sectors": slot_token_sectors,
            "stamp_width": stamp_width, "part": part, "sdram_bytes": sdram_bytes,
            "slot_sectors": per, "sdram_sectors": slots * per}


def import_clocks_model(reads) -> int:
    """Modelled clocks of an import's reads ``[(tier, setup, sectors), ...]`` (``tier``
    ``"sdram"`` or ``"card"``, ``setup`` the tiered storage's clocks: :data:`READ_CLOCKS`)."""
    total = 0
    for tier, setup, sectors in reads:
        fixed, per_sector = READ_CLOCKS[tier]
        total += setup + (fixed + per_sector * sectors if sectors else 0)
    return total
