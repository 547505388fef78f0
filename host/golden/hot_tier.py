"""Golden model of the hot tier (:mod:`ringkv.hw.store.hot_tier`), bit-exact.

Commands and responses are dicts keyed by the fields of ``command_layout`` and
``response_layout``; a response has every field, and the fields an operation does not report
are zero. ``GoldenHotTier.command(cmd)`` answers exactly what the gateware answers and records
the gateware's clock count for it in ``clocks`` (from the command's transfer to ``o.valid``);
``state()`` exposes the whole hot tier (the region map, every slot's row, the free-slot pool in
order) for checks.
"""

from collections import deque

from ringkv.defs.hot_tier import (
    COUNT_FIELD_WIDTH,
    REGION_FIELD_WIDTH,
    SLOT_FIELD_WIDTH,
    Op,
    SlotState,
    Status,
    check_hot_tier_params,
    command_fields,
    response_fields,
)

__all__ = ["GoldenHotTier", "COMMAND_FIELDS", "RESPONSE_FIELDS", "random_commands"]

COMMAND_FIELDS = tuple(command_fields())
RESPONSE_FIELDS = tuple(response_fields())

_OPS = {op.value: op for op in Op}
_FREE_ROW = {"state": SlotState.FREE.value, "region": 0, "stamp": 0}


def _int(value) -> int:
    return int(value.value) if isinstance(value, (Op, Status, SlotState)) else int(value)


class GoldenHotTier:
    """The hot tier as plain Python: a dict region -> slot, a row per slot, a deque of free
    slots in the gateware's order (0..slots-1 after a clear, freed slots appended)."""

    def __init__(self, *, regions=4096, slots=256, stamp_width=32):
        check_hot_tier_params(regions, slots, stamp_width)
        self.regions, self.slots, self.stamp_width = regions, slots, stamp_width
        self.stamp_mask = (1 << stamp_width) - 1
        self.clocks = 0                 # the last command's clocks, transfer to o.valid
        self.evictions = 0
        self.clear()

    # -- state ----------------------------------------------------------------------------

    def clear(self):
        self.region_map = {}                                  # region -> slot
        self.rows = [dict(_FREE_ROW) for _ in range(self.slots)]
        self.free = deque(range(self.slots))

    def state(self) -> dict:
        return {"map": dict(sorted(self.region_map.items())),
                "rows": [dict(row) for row in self.rows], "free": list(self.free)}

    def age(self, now, stamp) -> int:
        return (now - stamp) & self.stamp_mask

    def lru_victim(self, now):
        """The valid slot with the largest age (ties: the lowest slot), or None."""
        best, best_age = None, -1
        for slot, row in enumerate(self.rows):
            if row["state"] == SlotState.VALID.value:
                age = self.age(now, row["stamp"])
                if age > best_age:
                    best, best_age = slot, age
        return best

    def counts(self) -> dict:
        """How many slots are free, reserved and valid (they add up to ``slots``)."""
        out = {state.name.lower(): 0 for state in SlotState}
        for row in self.rows:
            out[SlotState(row["state"]).name.lower()] += 1
        return out

    def _free_slot(self, slot):
        self.rows[slot] = dict(_FREE_ROW)
        self.free.append(slot)

    # -- commands -------------------------------------------------------------------------

    def command(self, cmd: dict) -> dict:
        c = {k: _int(cmd.get(k, 0)) for k in COMMAND_FIELDS}
        c["op"] &= 0xF
        c["region"] &= (1 << REGION_FIELD_WIDTH) - 1
        c["slot"] &= (1 << SLOT_FIELD_WIDTH) - 1
        c["now"] &= self.stamp_mask
        r = dict.fromkeys(RESPONSE_FIELDS, 0)
        r["op"] = c["op"]
        self.clocks = 2
        r["status"] = self._execute(c, r).value
        r["count"] &= (1 << COUNT_FIELD_WIDTH) - 1
        return r

    def _execute(self, c, r) -> Status:
        op = _OPS.get(c["op"])
        region, slot, now = c["region"], c["slot"], c["now"]
        n = self.slots
        if op is None:
            self.clocks = 1
            return Status.BAD_OP
        if op == Op.CLEAR:
            self.clocks = max(self.regions, n) + 1
            self.clear()
            return Status.OK
        if op == Op.COUNT:
            self.clocks = n + 2
            r["count"] = self.counts()["valid"]
            return Status.OK
        if op == Op.READ:
            if slot >= n:
                return Status.BAD_SLOT
            r.update(slot=slot, **self.rows[slot])
            return Status.OK
        if region >= self.regions:
            return Status.BAD_REGION
        mapped = self.region_map.get(region)
        if op == Op.LOOKUP:
            if mapped is None:
                return Status.MISS
            self.clocks = 3
            row = self.rows[mapped]
            if row["state"] != SlotState.VALID.value:
                return Status.MISS                          # reserved: a write in progress
            row["stamp"] = now
            r["slot"] = mapped
            return Status.OK
        if op == Op.DROP:
            if mapped is None:
                return Status.MISS
            del self.region_map[region]
            self._free_slot(mapped)
            r["slot"] = mapped
            return Status.OK
        if op == Op.ALLOC:
            if mapped is None and self.free:
                mapped = self.free.popleft()
            elif mapped is None:
                victim = self.lru_victim(now)
                if victim is None:
                    self.clocks = n + 4
                    return Status.FULL
                self.clocks = n + 5
                self.evictions += 1
                victim_region = self.rows[victim]["region"]
                del self.region_map[victim_region]
                r.update(evicted=1, victim_region=victim_region)
                mapped = victim
            self.region_map[region] = mapped
            self.rows[mapped] = {"state": SlotState.RESERVED.value, "region": region,
                                 "stamp": now}
            r["slot"] = mapped
            return Status.OK
        # COMMIT, ABORT: the slot must be reserved for this region.
        row = self.rows[slot] if slot < n else None
        if row is None or row["state"] != SlotState.RESERVED.value or row["region"] != region:
            return Status.BAD_SLOT
        r["slot"] = slot
        if op == Op.COMMIT:
            self.rows[slot] = {"state": SlotState.VALID.value, "region": region, "stamp": now}
        else:
            del self.region_map[region]
            self._free_slot(slot)
        return Status.OK


def random_commands(rng, golden: GoldenHotTier, n: int, *, region_pool: int | None = None,
                    now_start: int = 0, clears: bool = True):
    """``n`` random commands with their expected responses, stepping ``golden``.

    The mix follows the hot tier's use (an ALLOC, then mostly its COMMIT, sometimes its ABORT or
    a DROP in between; LOOKUPs of mapped and unmapped regions; DROPs of the directory's freed
    regions) and adds every error: out-of-range regions and slots, COMMIT/ABORT of a slot
    reserved for another region or not reserved, unknown opcodes; CLEARs now and then. With
    ``region_pool`` the regions are drawn from that many (more than ``slots`` forces
    eviction); ``clears=False`` leaves CLEAR out (a sweep of ``regions`` clocks: large shapes).
    Returns ``(commands, responses)``.
    """
    g = golden
    pool = rng.sample(range(g.regions), min(g.regions, region_pool or g.regions))
    now = now_start
    pending = []                                    # (region, slot) of ALLOCs not yet settled
    cmds, resps = [], []
    for k in range(n):
        if k % 64 == 0:
            # phases: writes settled at once, or left in flight until every slot is reserved
            settle = rng.choice([0.05, 0.3, 0.45])
        now = (now + rng.choice((0, 0, 1, 2, 3))) & g.stamp_mask    # equal stamps: LRU ties
        mapped = sorted(g.region_map)
        roll = rng.random()
        region = rng.choice(mapped) if mapped and rng.random() < 0.4 else rng.choice(pool)
        if rng.random() < 0.03:
            region = rng.choice([g.regions, g.regions + rng.randrange(100),
                                 (1 << REGION_FIELD_WIDTH) - 1])
        rest = rng.random()                         # the rest of the mix, in any phase
        if pending and roll < settle:
            region, slot = pending.pop(rng.randrange(len(pending)))
            if rng.random() < 0.1:                  # a wrong slot or region
                slot = rng.randrange(g.slots + 2)
            op = Op.COMMIT if rng.random() < 0.8 else Op.ABORT
            cmd = {"op": op, "region": region, "slot": slot, "now": now}
        elif roll < settle + 0.25:
            cmd = {"op": Op.ALLOC, "region": region, "now": now}
        elif rest < 0.45:
            cmd = {"op": Op.LOOKUP, "region": region, "now": now}
        elif rest < 0.60:
            cmd = {"op": Op.DROP, "region": region}
        elif rest < 0.75:
            slot = rng.randrange(g.slots) if rng.random() < 0.85 else rng.choice(
                [g.slots, (1 << SLOT_FIELD_WIDTH) - 1])
            cmd = {"op": Op.READ, "slot": slot}
        elif rest < 0.85:
            cmd = {"op": rng.choice([Op.COMMIT, Op.ABORT]), "region": region,
                   "slot": rng.randrange(g.slots + 1), "now": now}
        elif rest < 0.93:
            cmd = {"op": Op.COUNT}
        elif rest < 0.98 or not clears:
            cmd = {"op": rng.randrange(Op.COUNT.value + 1, 16), "region": region}
        else:
            cmd = {"op": Op.CLEAR}
            pending.clear()
        cmd = {k: _int(v) for k, v in cmd.items()}
        cmds.append(cmd)
        resp = g.command(cmd)
        resps.append(resp)
        if cmd["op"] == Op.ALLOC.value and resp["status"] == Status.OK.value:
            pending.append((cmd["region"], resp["slot"]))
    return cmds, resps
