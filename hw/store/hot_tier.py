"""Hot tier: which SDRAM slot holds a copy of which card region's snapshot record.

The golden model is :class:`ringkv.host.golden.hot_tier.GoldenHotTier`; the block's document is
``docs/blocks/hot_tier.md``. The directory maps a conversation's (count, hash) to a card region
and is unchanged; this block maps regions to SDRAM slots (fixed-size areas, one record each),
with a reverse map region -> slot, a forward map slot -> {state, region, stamp} and a FIFO of
free slots, and picks the least recently used valid slot when it must evict.
"""

from amaranth.hdl import Assert, Assume, Module, Mux, ResetSignal, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs import hot_tier as defs
from ringkv.defs.hot_tier import check_hot_tier_params

from ..enums import shaped
from .directory import layout_fields
from .directory_alloc import Table
from .directory_lists import count_true

__all__ = ["HotTier", "Op", "Status", "SlotState", "command_layout", "response_layout",
           "layout_fields", "BUGS", "CHECKS"]

#: Deliberately broken variants for the tests (private knob ``_bug``): ``lru_tie`` (an age tie
#: goes to the highest slot), ``commit_unchecked`` (COMMIT does not check that the slot is
#: reserved for the region), ``drop_leak`` (DROP does not return the slot to the pool),
#: ``stale_victim`` (an eviction leaves the victim region's map entry).
BUGS = ("lru_tie", "commit_unchecked", "drop_leak", "stale_victim")
#: Formal property groups (private knob ``_checks``): ``pool`` (every slot is either in the
#: free FIFO or reserved/valid, exactly once), ``maps`` (the two maps agree).
CHECKS = ("pool", "maps")

#: :class:`ringkv.defs.hot_tier.Op`, ``Status`` and ``SlotState`` as Amaranth shapes.
Op = shaped(defs.Op, defs.OP_BITS, module=__name__)
Status = shaped(defs.Status, defs.STATUS_BITS, module=__name__)
SlotState = shaped(defs.SlotState, defs.STATE_BITS, module=__name__)
_ENUM_FIELDS = {"op": Op, "status": Status, "state": SlotState}


def command_layout(stamp_width=32) -> data.StructLayout:
    """The command payload (:func:`ringkv.defs.hot_tier.command_fields`)."""
    return data.StructLayout({name: _ENUM_FIELDS.get(name, width)
                              for name, width in defs.command_fields(stamp_width).items()})


def response_layout(stamp_width=32) -> data.StructLayout:
    """The response payload (:func:`ringkv.defs.hot_tier.response_fields`)."""
    return data.StructLayout({name: _ENUM_FIELDS.get(name, width)
                              for name, width in defs.response_fields(stamp_width).items()})


class HotTier(wiring.Component):
    """Map from the directory's card regions to SDRAM slots, with LRU eviction.

    State: the reverse map (``regions`` rows {valid, slot}), the forward map (``slots`` rows
    {state, region, stamp}; state free, reserved or valid) and the free-slot FIFO (``slots``
    rows, filled with 0..slots-1 by the reset sweep; freed slots are appended). A slot is
    reserved from ALLOC to COMMIT (or ABORT): not free, not found by LOOKUP, not evictable.

    Parameters
    ----------
    regions : int
        Power of two, 2..2**24 (the directory's ``regions``; default 4096).
    slots : int
        2..1024, any integer (default 256: 32 MB of SDRAM / ~130 KB records).
    stamp_width : int
        Last-use stamp and ``now``, 1..32 bits (default 32); ages modulo 2**stamp_width.
    formal : bool
        Build the tables as registers and add the formal invariants (small configurations).

    Ports
    -----
    i : ``In(stream.Signature(command_layout(stamp_width)))``
        Commands (:class:`Op`). ``i.ready`` is high only while the block is idle.
    o : ``Out(stream.Signature(response_layout(stamp_width)))``
        One response per command (:class:`Status`), held until ``o.ready``.

    Latency, throughput, backpressure
    ---------------------------------
    One command at a time; clocks from the command transfer to ``o.valid``: 1 for an unknown
    opcode; 2 for ALLOC without eviction, COMMIT, ABORT, DROP, READ, any BAD_REGION and a
    LOOKUP of an unmapped region; 3 for a LOOKUP of a mapped region (a hit, or MISS when its
    slot is reserved); ``slots + 5`` for an ALLOC that evicts, ``slots + 4`` for one that
    answers FULL (every slot reserved); COUNT ``slots + 2``; CLEAR ``max(regions, slots) + 1``.
    The next command is accepted one clock after the response transfer. ``o.valid`` holds with
    a steady payload until ``o.ready``; meanwhile ``i.ready`` is low. After reset the tables
    are swept for ``max(regions, slots)`` clocks before the first command is accepted.
    """

    def __init__(self, *, regions=4096, slots=256, stamp_width=32, formal=False, _bug=None,
                 _checks=CHECKS, _full=False):
        check_hot_tier_params(regions, slots, stamp_width)
        if _bug is not None and _bug not in BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {BUGS}")
        if _full and not (formal and slots <= regions):
            raise ValueError("_full needs formal=True and slots <= regions")
        self._regions, self._slots, self._stamp_width = regions, slots, stamp_width
        self._formal = bool(formal)
        self._full = bool(_full)
        self._bug = _bug
        self._checks = tuple(_checks)
        self._cmd_layout = command_layout(stamp_width)
        self._resp_layout = response_layout(stamp_width)
        super().__init__({
            "i": In(stream.Signature(self._cmd_layout)),
            "o": Out(stream.Signature(self._resp_layout)),
        })

    regions = property(lambda self: self._regions)
    slots = property(lambda self: self._slots)
    stamp_width = property(lambda self: self._stamp_width)
    cmd_layout = property(lambda self: self._cmd_layout)
    resp_layout = property(lambda self: self._resp_layout)

    def params(self) -> dict:
        """The parameters the golden model needs."""
        return dict(regions=self._regions, slots=self._slots, stamp_width=self._stamp_width)

    def elaborate(self, platform):
        m = Module()
        nr, ns, sw = self._regions, self._slots, self._stamp_width
        rb, sb = nr.bit_length() - 1, (ns - 1).bit_length()
        bug, formal = self._bug, self._formal
        map_layout = data.StructLayout({"valid": 1, "slot": sb})
        row_layout = data.StructLayout({"state": SlotState, "region": rb, "stamp": sw})

        # In formal mode the tables start out as the reset sweep leaves them (the sweep itself
        # is still checked: CLEAR runs it), so that the bounded depth is spent on commands.
        # With ``_full`` they start as ALLOC + COMMIT of regions 0..slots-1 at now = 0 leave
        # them (slot s valid for region s, the FIFO empty): a reachable state, from which a
        # shallow check reaches evictions.
        full = self._full
        region_map = Table(m, "region_map", map_layout, nr, formal,
                           init=[map_layout.const({"valid": 1, "slot": r}).as_value().value
                                 for r in range(ns)] + [0] * (nr - ns) if full else None)
        rows = Table(m, "slot_rows", row_layout, ns, formal,
                     init=[row_layout.const({"state": SlotState.VALID, "region": s})
                           .as_value().value for s in range(ns)] if full else None)
        fifo = Table(m, "free_slots", sb, ns, formal, init=range(ns))
        fifo_rd = Signal(range(ns))
        fifo_level = Signal(range(ns + 1), init=ns if formal and not full else 0)
        fifo_sum = Signal(range(2 * ns))
        fifo_wr = Signal(range(ns))
        m.d.comb += [fifo.raddr.eq(fifo_rd), fifo_sum.eq(fifo_rd + fifo_level),
                     fifo_wr.eq(Mux(fifo_sum >= ns, fifo_sum - ns, fifo_sum))]

        cmd = Signal(self._cmd_layout)
        resp = Signal(self._resp_layout)
        sweep = max(nr, ns)
        idx = Signal(range(sweep + 1))
        cur = Signal(sb)                     # LOOKUP: the mapped slot
        clearing = Signal()                  # INIT was entered by CLEAR: answer it
        # The LRU scan (ALLOC) and COUNT: one slot per clock, the row registered, then compared.
        scan_slot = Signal(sb)
        scan_live = Signal()
        scan_stamp = Signal(sw)
        scan_region = Signal(rb)
        best_slot = Signal(sb)
        best_age = Signal(sw)
        best_region = Signal(rb)
        have_best = Signal()

        # The command's own checks, registered with it: the states that decide on a table's
        # read combine these with the read alone (a block RAM's output through a chain of
        # the opcode's and the bounds' compares was the tier's longest path at 60 MHz).
        region_bad = Signal()                # cmd.region >= regions
        slot_bad = Signal()                  # cmd.slot >= slots
        op_is = {op: Signal(name=f"op_is_{op.name.lower()}")
                 for op in (Op.LOOKUP, Op.ALLOC, Op.DROP, Op.COMMIT, Op.ABORT, Op.READ)}
        # ``fifo_level != 0``, a clock behind it: the level changes only in a deciding state,
        # at least two clocks (RESPOND, IDLE) before REGION reads this
        fifo_nz = Signal(init=int(fifo_level.init != 0))
        m.d.sync += fifo_nz.eq(fifo_level != 0)

        reserved_row = Signal(row_layout)    # ``cmd.region``'s row while its copy is written
        m.d.comb += [reserved_row.state.eq(SlotState.RESERVED),
                     reserved_row.region.eq(cmd.region[:rb]), reserved_row.stamp.eq(cmd.now)]

        def reserve(slot):
            """``slot``'s row: reserved for ``cmd.region`` (stamp ``now``)."""
            rows.write(m, slot, reserved_row)

        def map_region(region, slot):
            entry = Signal(map_layout)
            m.d.comb += [entry.valid.eq(1), entry.slot.eq(slot)]
            region_map.write(m, region, entry)

        def scan_compare():
            age = (cmd.now - scan_stamp)[:sw]
            older = age >= best_age if bug == "lru_tie" else age > best_age
            with m.If(scan_live & (cmd.op == Op.COUNT)):
                m.d.sync += resp.count.eq(resp.count + 1)
            with m.If(scan_live & (~have_best | older)):
                m.d.sync += [best_slot.eq(scan_slot), best_age.eq(age),
                             best_region.eq(scan_region), have_best.eq(1)]

        with m.FSM(init="IDLE" if formal else "INIT") as fsm:
            with m.State("INIT"):
                # Reset and CLEAR: every region unmapped, every slot free, 0..slots-1 in the FIFO.
                with m.If(idx < nr):
                    region_map.write(m, idx, 0)
                with m.If(idx < ns):
                    rows.write(m, idx, 0)
                    fifo.write(m, idx, idx)
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == sweep - 1):
                    m.d.sync += [idx.eq(0), clearing.eq(0), fifo_rd.eq(0), fifo_level.eq(ns)]
                    with m.If(clearing):
                        m.next = "RESPOND"
                    with m.Else():
                        m.next = "IDLE"

            with m.State("IDLE"):
                m.d.comb += [self.i.ready.eq(1),
                             region_map.raddr.eq(self.i.payload.region[:rb]),
                             rows.raddr.eq(self.i.payload.slot[:sb])]
                with m.If(self.i.valid):
                    m.d.sync += [cmd.eq(self.i.payload), resp.eq(0),
                                 resp.op.eq(self.i.payload.op), idx.eq(0), have_best.eq(0),
                                 scan_live.eq(0), region_bad.eq(self.i.payload.region >= nr),
                                 slot_bad.eq(self.i.payload.slot >= ns),
                                 *(bit.eq(self.i.payload.op == op) for op, bit in op_is.items())]
                    with m.Switch(self.i.payload.op):
                        with m.Case(Op.LOOKUP, Op.ALLOC, Op.DROP):
                            m.next = "REGION"
                        with m.Case(Op.COMMIT, Op.ABORT, Op.READ):
                            m.next = "SLOT"
                        with m.Case(Op.COUNT):
                            m.d.comb += rows.raddr.eq(0)
                            m.next = "SCAN"
                        with m.Case(Op.CLEAR):
                            m.d.sync += clearing.eq(1)
                            m.next = "INIT"
                        with m.Default():
                            m.d.sync += resp.status.eq(Status.BAD_OP)
                            m.next = "RESPOND"

            # In the states that decide on a table's read (REGION, LOOKUP_SLOT, SLOT) each
            # table's write address and data are chosen by the state and the opcode (REGION's
            # slot address also by the entry's valid bit), and only the write enables by the
            # decision: the block RAM's output no longer runs through the decision into the
            # other ports' address and data (the tier's longest paths at 60 MHz). The writes
            # are the same.
            def aim(table, addr, value):
                m.d.comb += [table.waddr.eq(addr), table.wdata.eq(value)]

            def enable(*tables):
                m.d.comb += [table.we.eq(1) for table in tables]

            def free_row():
                """The aimed-at slot back to the pool: its row cleared, appended to the FIFO."""
                enable(rows, fifo)
                m.d.sync += fifo_level.eq(fifo_level + 1)

            with m.State("REGION"):
                # The region's map entry is read: LOOKUP, DROP and ALLOC decide on it.
                entry = region_map.rdata
                region = cmd.region[:rb]
                dropping = op_is[Op.DROP]
                new_entry = Signal(map_layout)
                m.d.comb += [new_entry.valid.eq(~dropping),
                             new_entry.slot.eq(Mux(dropping, 0, fifo.rdata))]
                aim(region_map, region, new_entry)
                aim(rows, Mux(entry.valid, entry.slot, fifo.rdata),
                    Mux(dropping, 0, reserved_row))
                aim(fifo, fifo_wr, entry.slot)
                # the row read next: the mapped slot's (LOOKUP), slot 0 (an ALLOC's scan)
                m.d.comb += rows.raddr.eq(Mux(op_is[Op.LOOKUP], entry.slot, 0))
                # the decision: the entry's valid bit against the registered checks
                valid = entry.valid
                go = ~region_bad
                lookup_hit = Signal()
                drop_hit = Signal()
                alloc_hit = Signal()                # ALLOC of a mapped region
                alloc_new = Signal()                # ALLOC from the free FIFO
                alloc_scan = Signal()               # ALLOC with no free slot: the LRU scan
                m.d.comb += [lookup_hit.eq(go & op_is[Op.LOOKUP] & valid),
                             drop_hit.eq(go & op_is[Op.DROP] & valid),
                             alloc_hit.eq(go & op_is[Op.ALLOC] & valid),
                             alloc_new.eq(go & op_is[Op.ALLOC] & ~valid & fifo_nz),
                             alloc_scan.eq(go & op_is[Op.ALLOC] & ~valid & ~fifo_nz)]
                m.d.sync += [resp.status.eq(Mux(region_bad, Status.BAD_REGION,
                                                Mux(valid | op_is[Op.ALLOC], Status.OK,
                                                    Status.MISS))),
                             resp.slot.eq(Mux(drop_hit | alloc_hit, entry.slot,
                                              Mux(alloc_new, fifo.rdata, 0))),
                             cur.eq(entry.slot)]
                # ALLOC of a mapped region: its copy is invalidated, its slot rewritten; DROP:
                # the slot back to the pool
                with m.If(drop_hit):
                    enable(region_map)
                    if bug == "drop_leak":
                        enable(rows)
                    else:
                        free_row()
                with m.If(alloc_hit):
                    enable(rows)
                with m.If(alloc_new):
                    enable(rows, region_map)
                    m.d.sync += [fifo_level.eq(fifo_level - 1),
                                 fifo_rd.eq(Mux(fifo_rd == ns - 1, 0, fifo_rd + 1))]
                with m.If(lookup_hit):
                    m.next = "LOOKUP_SLOT"
                with m.Elif(alloc_scan):
                    # No free slot: scan for the least recently used valid one (slot 0 is read).
                    m.next = "SCAN"
                with m.Else():
                    m.next = "RESPOND"

            with m.State("LOOKUP_SLOT"):
                row = rows.rdata
                touched = Signal(row_layout)
                m.d.comb += [touched.eq(row), touched.stamp.eq(cmd.now)]
                aim(rows, cur, touched)
                hit = row.state == SlotState.VALID  # else reserved: a write in progress
                with m.If(hit):
                    enable(rows)
                m.d.sync += [resp.slot.eq(Mux(hit, cur, 0)),
                             resp.status.eq(Mux(hit, Status.OK, Status.MISS))]
                m.next = "RESPOND"

            with m.State("SLOT"):
                # The slot's row is read: READ reports it, COMMIT and ABORT check it.
                row = rows.rdata
                slot = cmd.slot[:sb]
                reserved_here = (row.state == SlotState.RESERVED) & (row.region == cmd.region)
                if bug == "commit_unchecked":
                    reserved_here = reserved_here | (cmd.op == Op.COMMIT)
                done = Signal(row_layout)
                m.d.comb += [done.state.eq(SlotState.VALID), done.region.eq(cmd.region[:rb]),
                             done.stamp.eq(cmd.now)]
                aim(rows, slot, Mux(cmd.op == Op.COMMIT, done, 0))
                aim(region_map, cmd.region[:rb], 0)
                aim(fifo, fifo_wr, slot)
                m.next = "RESPOND"
                # the decision: the row's check against the registered ones
                reading = op_is[Op.READ]
                fixed = reading | region_bad | slot_bad     # decided without the row
                fixed_status = Mux(reading, Mux(slot_bad, Status.BAD_SLOT, Status.OK),
                                   Mux(region_bad, Status.BAD_REGION, Status.BAD_SLOT))
                go = ~fixed & reserved_here
                m.d.sync += [resp.status.eq(Mux(fixed, fixed_status,
                                                Mux(reserved_here, Status.OK, Status.BAD_SLOT))),
                             resp.slot.eq(Mux((reading & ~slot_bad) | go, cmd.slot, 0))]
                with m.If(reading & ~slot_bad):
                    m.d.sync += [resp.state.eq(row.state), resp.region.eq(row.region),
                                 resp.stamp.eq(row.stamp)]
                with m.If(go & op_is[Op.COMMIT]):
                    enable(rows)
                with m.If(go & op_is[Op.ABORT]):
                    enable(region_map)
                    free_row()

            with m.State("SCAN"):
                # One slot per clock, two stages (the row registered, then aged and compared),
                # as the directory's eviction scan: the oldest valid stamp wins, ties to the
                # lowest slot. COUNT counts the valid rows on the same pipeline.
                m.d.comb += rows.raddr.eq(idx + 1)
                m.d.sync += [scan_slot.eq(idx), scan_live.eq(rows.rdata.state == SlotState.VALID),
                             scan_stamp.eq(rows.rdata.stamp), scan_region.eq(rows.rdata.region),
                             idx.eq(idx + 1)]
                scan_compare()
                with m.If(idx == ns - 1):
                    m.next = "SCAN_LAST"

            with m.State("SCAN_LAST"):
                scan_compare()
                with m.If(cmd.op == Op.COUNT):
                    m.next = "RESPOND"
                with m.Else():
                    m.next = "EVICT"

            with m.State("EVICT"):
                with m.If(have_best):
                    reserve(best_slot)
                    if bug != "stale_victim":
                        region_map.write(m, best_region, 0)
                    m.d.sync += [resp.evicted.eq(1), resp.victim_region.eq(best_region),
                                 resp.slot.eq(best_slot)]
                    m.next = "EVICT_MAP"
                with m.Else():
                    m.d.sync += resp.status.eq(Status.FULL)     # every slot reserved
                    m.next = "RESPOND"

            with m.State("EVICT_MAP"):
                # The region map's one write port unmapped the victim's region last clock.
                map_region(cmd.region[:rb], best_slot)
                m.next = "RESPOND"

            with m.State("RESPOND"):
                m.d.comb += [self.o.valid.eq(1), self.o.payload.eq(resp)]
                with m.If(self.o.ready):
                    m.next = "IDLE"

        if formal:
            m.d.comb += Assume(~ResetSignal())
            idle = fsm.ongoing("IDLE")
            self._add_properties(m, idle, region_map, map_layout, rows, row_layout, fifo,
                                 fifo_rd, fifo_level)
            with m.If(idle):
                m.d.comb += Assert(~clearing)
        return m

    def _add_properties(self, m, idle, region_map, map_layout, rows, row_layout, fifo, fifo_rd,
                        fifo_level):
        """The invariants, asserted whenever the block is idle (between commands)."""
        nr, ns = self._regions, self._slots
        entries = [region_map.row(r, map_layout) for r in range(nr)]
        slot_rows = [rows.row(s, row_layout) for s in range(ns)]
        taken = [row.state != SlotState.FREE for row in slot_rows]

        def in_fifo(j):
            offset = Mux(j >= fifo_rd, j - fifo_rd, j + ns - fifo_rd)
            return offset < fifo_level

        checks = []
        if "pool" in self._checks:
            # Every slot is in the free FIFO or reserved/valid, exactly once; free + reserved +
            # valid = slots; a free row is all zero (READ reports zeros); no fourth state.
            checks += [fifo_rd < ns, fifo_level <= ns, fifo_level + count_true(taken) == ns]
            for s, row in enumerate(slot_rows):
                free = [in_fifo(j) & (fifo.rows[j] == s) for j in range(ns)]
                checks += [count_true([*free, taken[s]]) == 1,
                           row.state.as_value() != 3, taken[s] | (row.as_value() == 0)]
        if "maps" in self._checks:
            # A mapped region points to a reserved/valid slot that names it, and a
            # reserved/valid slot's region points back to it.
            for r, entry in enumerate(entries):
                checks.append(~entry.valid | (entry.slot < ns))
                for s, row in enumerate(slot_rows):
                    points = entry.valid & (entry.slot == s)
                    names = taken[s] & (row.region == r)
                    checks.append(points == names)
        with m.If(idle):
            for check in checks:
                m.d.comb += Assert(check)
