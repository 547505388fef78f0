"""Golden model of the tiered storage (:mod:`ringkv.hw.storage.tiered`), bit-exact.

:class:`GoldenTieredStorage` takes the storage port's commands in order and says where each
goes (:class:`Route`: the card, the SDRAM slot, or both), at which SDRAM sector, after how
many clocks of the block's own work (``setup``: from the command's transfer on the storage
port to the backend's ``cmd.valid``), and for a write to both tiers, given the two backends'
statuses, the status the initiator gets and the clocks from the later backend status to it
(``tail``; a route to one backend gives its backend's status a clock after it,
``Route.tail``). Its hot tier is :class:`ringkv.host.golden.hot_tier.GoldenHotTier`, driven
with the same commands as the gateware drives its ``HotTier``, so LRU choices and slots agree.

The rules (``docs/blocks/tiered_storage.md``) in short: a read in one region is served from
SDRAM when the region's copy is committed and the read lies inside one of its written extents;
a write in one region goes to both tiers, the first of a region reserves a slot (ALLOC), the
one that includes the region's sector 0 commits it when both tiers answered OK, any error
aborts it; a write over several regions clears the hot tier; everything else is the card's.
A region the directory deleted (:meth:`GoldenTieredStorage.drop`) loses its copy and its
pending write; :meth:`GoldenTieredStorage.residents` is the count ``STORAGE_INFO`` reports.

Compact slots (``kv_sector`` and ``slot_token_sectors`` T): a slot holds the region's first
``1 + T`` sectors and its sectors from ``kv_sector`` on; the *gap* ``[1 + T, kv_sector)`` is
never in SDRAM. A read touching the gap goes to the card (no LOOKUP); a write touching it makes
the copy unrecordable: the pending copy of another region is aborted, the region's own copy
(pending or committed) dropped, and the write goes to the card alone. Extents are in region
(card) offsets; only the SDRAM sector maps: offset ``o >= kv_sector`` is slot offset
``o - (kv_sector - 1 - T)``.
"""

from dataclasses import dataclass, field

from ringkv.defs.hot_tier import Op, Status

from .hot_tier import GoldenHotTier

__all__ = ["GoldenTieredStorage", "Route", "EXTENTS", "READ", "WRITE", "OK"]

#: Written extents recorded per copy (the gateware's ``EXTENTS``).
EXTENTS = 3
#: The storage port's opcodes and the OK status (``ringkv.defs.protocol.StorageError.OK``).
READ, WRITE, OK = 0, 1, 0


@dataclass
class Route:
    tier: str                    # "card", "sdram" or "both"
    sdram_lba: int | None = None
    setup: int = 0               # clocks: the command's transfer -> the backend's cmd.valid
    #: clocks from the backend's status transfer (an OK one: or the last read word's transfer
    #: to the initiator, if later) to the initiator's ``status.valid`` for a route to one
    #: backend (the status registered, the read data through a register slice); a write to
    #: both gets :meth:`finish`'s
    tail: int = 1
    hot_ops: list = field(default_factory=list)   # the hot-tier commands it ran, in order


class GoldenTieredStorage:
    """The tiered storage's decisions, as plain Python."""

    def __init__(self, *, regions, sectors_per_region, base_lba=0, slots=256, sdram_base=0,
                 stamp_width=32, kv_sector=None, slot_token_sectors=None, width=1):
        # ``width`` (the block's data transfer width) changes no route and no clock this model
        # counts: the routes are per command, the clocks from a command to its backend's
        # command and from the backends' statuses to the initiator's
        del width
        self.regions, self.spr, self.base = regions, sectors_per_region, base_lba
        # the gap [gap_lo, gap_hi) of region offsets not held in a slot (empty: the whole
        # region is held, the slot is ``sectors_per_region`` long)
        if kv_sector is None or slot_token_sectors is None:
            self.gap_lo = self.gap_hi = sectors_per_region
        else:
            self.gap_lo, self.gap_hi = 1 + slot_token_sectors, kv_sector
        self.slot_sectors = sectors_per_region - (self.gap_hi - self.gap_lo)
        self.slots, self.sdram_base = slots, sdram_base
        self.stamp_mask = (1 << stamp_width) - 1
        self.qb = regions.bit_length() - 1
        self.hot = GoldenHotTier(regions=regions, slots=slots, stamp_width=stamp_width)
        self.extents = {}        # slot -> the committed copy's extents [(lo, hi)] * EXTENTS
        self.power_cut()

    def power_cut(self):
        """A reset: the hot tier is swept empty, no write is pending, the stamp restarts."""
        self.hot.clear()
        self.pending = None      # (region, slot, [[lo, hi]] * EXTENTS)
        self.now = 0
        self._write = None       # the write to both tiers in flight: (region, offset)

    # -- helpers ---------------------------------------------------------------------------

    def where(self, lba, count):
        """``(region, offset)`` of a transfer in one region, else ``None``."""
        rel = lba - self.base
        if rel < 0 or rel >= self.regions * self.spr or count == 0:
            return None
        region, offset = divmod(rel, self.spr)
        return (region, offset) if offset + count <= self.spr else None

    def touches(self, lba, count):
        return count != 0 and lba < self.base + self.regions * self.spr \
            and lba + count > self.base

    def in_gap(self, offset, count):
        """The transfer ``[offset, offset + count)`` of a region touches the gap."""
        return offset < self.gap_hi and offset + count > self.gap_lo

    def slot_lba(self, slot, offset):
        if offset >= self.gap_hi:
            offset -= self.gap_hi - self.gap_lo
        return self.sdram_base + slot * self.slot_sectors + offset

    def _hot(self, route, op, region=0, slot=0):
        resp = self.hot.command({"op": op, "region": region, "slot": slot, "now": self.now})
        route.hot_ops.append((op, region, slot, Status(resp["status"])))
        route.setup += 1 + self.hot.clocks
        return resp

    def resident(self) -> dict:
        """region -> slot of every committed copy."""
        return {r: s for r, s in self.hot.region_map.items()
                if self.hot.rows[s]["state"] == 2}

    # -- the storage port ------------------------------------------------------------------

    def command(self, op, lba, count) -> Route:
        """Route one command (``op`` READ 0 or WRITE 1); for a write to both tiers call
        :meth:`finish` with the backends' statuses before the next command."""
        assert self._write is None, "finish() the write to both tiers first"
        self.now = (self.now + 1) & self.stamp_mask
        route = Route("card", setup=self.qb + 2)
        place = self.where(lba, count)
        if op == READ:
            if place is None:
                return route
            region, offset = place
            if self.in_gap(offset, count):
                return route
            resp = self._hot(route, Op.LOOKUP, region)
            if resp["status"] != Status.OK.value:
                return route
            slot = resp["slot"]
            route.setup += 3
            if any(lo <= offset and offset + count <= hi for lo, hi in self.extents[slot]):
                route.tier, route.sdram_lba = "sdram", self.slot_lba(slot, offset)
            return route
        if place is None:
            if self.touches(lba, count):
                self._hot(route, Op.CLEAR)
                self.pending = None
            return route
        region, offset = place
        end = offset + count
        if self.in_gap(offset, count):
            if self.pending is not None and self.pending[0] != region:
                self._hot(route, Op.ABORT, self.pending[0], self.pending[1])
            self._hot(route, Op.DROP, region)
            self.pending = None
            return route
        if self.pending is not None and self.pending[0] == region:
            exts = self.pending[2]
            hit = next((e for e in exts if e[1] != 0 and e[1] == offset), None)
            hit = hit or next((e for e in exts if e[1] == 0), None)
            if hit is None:
                self._hot(route, Op.ABORT, region, self.pending[1])
                self.pending = None
                return route
            if hit[1] == 0:
                hit[0] = offset
            hit[1] = end
        else:
            if self.pending is not None:
                self._hot(route, Op.ABORT, self.pending[0], self.pending[1])
                self.pending = None
            resp = self._hot(route, Op.ALLOC, region)
            if resp["status"] != Status.OK.value:
                return route
            route.setup += 1
            self.pending = (region, resp["slot"], [[offset, end]] + [[0, 0]
                                                                  for _ in range(EXTENTS - 1)])
        route.tier, route.sdram_lba = "both", self.slot_lba(self.pending[1], offset)
        self._write = (region, offset)
        return route

    def drop(self, region) -> Route:
        """The directory deleted the record of ``region`` (the block's ``drop`` port): its copy
        is dropped (a ``DROP``, a ``MISS`` when it has none) and a pending write of it
        forgotten. No storage command; the stamp does not move."""
        assert self._write is None, "finish() the write to both tiers first"
        route = Route("none")
        self._hot(route, Op.DROP, region)
        if self.pending is not None and self.pending[0] == region:
            self.pending = None
        return route

    def residents(self) -> int:
        """Committed copies (the hot tier's ``COUNT``: ``residents`` of the block)."""
        return self.hot.counts()["valid"]

    def finish(self, card_error, sdram_error):
        """The write to both tiers ended with these statuses: ``(status the initiator gets,
        clocks from the later backend status to it)``."""
        region, offset = self._write
        self._write = None
        tail = Route("both", setup=3)
        _, slot, exts = self.pending
        if card_error == OK and sdram_error == OK:
            if offset == 0:
                self.extents[slot] = [tuple(e) for e in exts]
                self.pending = None
                self._hot(tail, Op.COMMIT, region, slot)
        else:
            self.pending = None
            self._hot(tail, Op.ABORT, region, slot)
        return card_error, tail.setup
