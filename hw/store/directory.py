"""Cache directory and region allocator: hash -> bucket -> doubly linked links.

The golden model is :class:`ringkv.host.golden.directory.GoldenDirectory`; the block's document
is ``docs/blocks/directory.md``. This module holds the link metadata and stamp tables and the
command sequencer; the bucket heads and the prev/next pointers, with every pointer update, are
:mod:`ringkv.hw.store.directory_lists`'s piece, and the region allocator (FIFO A, FIFO B and the
policy) and the free-link FIFO are :mod:`ringkv.hw.store.directory_alloc`'s.
"""

from amaranth.hdl import Assert, Assume, Module, Mux, ResetSignal, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs import directory as defs
from ringkv.defs.directory import (
    LINK_FIELD_WIDTH,
    NIL,
    REGION_FIELD_WIDTH,
    check_directory_params,
)

from ..enums import shaped
from .directory_alloc import FreeLinks, RegionAllocator, Table
from .directory_lists import LIST_BUGS, BucketLists, count_true

__all__ = ["CacheDirectory", "Op", "Status", "command_layout", "response_layout",
           "probe_layout", "layout_fields", "NIL", "LINK_FIELD_WIDTH", "REGION_FIELD_WIDTH",
           "BUGS", "CHECKS", "check_directory_params"]

#: Deliberately broken variants for the formal tests (private knob ``_bug``).
BUGS = ("region_leak", "region_dup", "link_dup", "lost_head", "stale_prev")
#: Formal property groups (private knob ``_checks``).
CHECKS = ("regions", "free_links", "reach", "links")


#: :class:`ringkv.defs.directory.Op` and ``Status`` as 4-bit shapes.
Op = shaped(defs.Op, defs.OP_BITS, module=__name__)
Status = shaped(defs.Status, defs.STATUS_BITS, module=__name__)
_ENUM_FIELDS = {"op": Op, "status": Status}


def command_layout(count_width=24, hash_width=64, stamp_width=32) -> data.StructLayout:
    """The command payload (:func:`ringkv.defs.directory.command_fields`)."""
    fields = defs.command_fields(count_width, hash_width, stamp_width)
    return data.StructLayout({name: _ENUM_FIELDS.get(name, width)
                              for name, width in fields.items()})


def response_layout(count_width=24, hash_width=64, stamp_width=32) -> data.StructLayout:
    """The response payload (:func:`ringkv.defs.directory.response_fields`)."""
    fields = defs.response_fields(count_width, hash_width, stamp_width)
    return data.StructLayout({name: _ENUM_FIELDS.get(name, width)
                              for name, width in fields.items()})


def probe_layout(count_width=24, hash_width=64) -> data.StructLayout:
    """The ``probe`` stream's payload (:func:`ringkv.defs.directory.probe_fields`): the same
    fields as the hash engine's output, so its stream connects unchanged."""
    return data.StructLayout(defs.probe_fields(count_width, hash_width))


def layout_fields(layout) -> list[tuple[str, int]]:
    """``[(name, width), ...]`` from the LSB, for ``pack_fields``/``unpack_fields``."""
    return [(name, Shape.cast(field.shape).width) for name, field in layout]


class CacheDirectory(wiring.Component):
    """The snapshot store's cache directory with its two-FIFO region allocator.

    A bucket table (``buckets`` heads, indexed by the low ``log2(buckets)`` bits of the hash)
    heads doubly linked lists of links; a link holds valid, token count, full hash, storage
    region, prev, next and a last-use stamp. Free links wait in a free-link FIFO. Regions are
    in exactly one of FIFO A (never used since reset/clear), FIFO B (freed by delete, expiry or
    eviction) or a live link.

    Parameters
    ----------
    buckets, links, regions : int
        Powers of two; ``links`` at most 2**15, ``regions`` at most 2**24.
    count_width, hash_width, stamp_width : int
        Field widths (defaults 24, 64, 32). ``hash_width >= log2(buckets)``.
    b_threshold : int
        Allocation policy: a new region comes from FIFO B when B holds at least ``b_threshold``
        regions or A is empty, otherwise from A (default ``regions // 2``). ``regions`` gives
        "A first" (wear spreading), 1 gives "B first" (locality).
    formal : bool
        Build the tables as registers and add the formal invariants (small configurations).

    Ports
    -----
    i : ``In(stream.Signature(command_layout(...)))``
        Commands (:class:`Op`). ``i.ready`` is high only while the directory is idle.
    o : ``Out(stream.Signature(response_layout(...)))``
        One response per command (:class:`Status`), held until ``o.ready``.
    probe : ``In(stream.Signature(probe_layout(...)))``
        The keys ``{hash, count, last}`` of a PROBE run, taken only during one (after a
        PROBE command, up to and including the key marked ``last``); ``ready`` is low
        otherwise.

    Latency, throughput, backpressure
    ---------------------------------
    One command at a time; cycles from the command transfer to ``o.valid`` (exact figures in
    ``docs/BENCHMARKS.md``): lookup 5 + 2k for a hit at chain position k (0 = head), 2 for a
    miss in an empty bucket and 3 + 2n for a miss after a chain of n >= 1 links; insert 2 (empty
    bucket) or 3; delete, touch, read 3; expire ``3 * links + e + 2`` for e expired links; an
    insert that must evict scans the link pool (``links + 7``, or ``links + 8`` into a
    non-empty bucket); clear ``max(buckets, links) + 1``; a PROBE run takes each key in 1 clock
    when its bucket is empty, else in ``3 + 2c`` clocks for ``c`` links compared, and answers 1
    clock after the last key's. Every decision on a link's row is taken on the row registered
    a clock after the table read (``row``, ``row_stamp``): no table's output goes straight into
    a compare, and no table's output reaches a read address (a walk takes two clocks a link).
    The next command
    is accepted one cycle after the response transfer. ``o.valid`` holds with a steady
    payload until ``o.ready``; meanwhile ``i.ready`` is low. After reset the tables are swept
    for ``max(buckets, links)`` cycles before the first command is accepted.
    """

    def __init__(self, *, buckets=1024, links=4096, regions=4096, count_width=24, hash_width=64,
                 stamp_width=32, b_threshold=None, formal=False, _bug=None, _checks=CHECKS):
        b_threshold = check_directory_params(buckets, links, regions, count_width, hash_width,
                                             stamp_width, b_threshold)
        if _bug is not None and _bug not in BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {BUGS}")
        self._buckets = buckets
        self._links = links
        self._regions = regions
        self._count_width = count_width
        self._hash_width = hash_width
        self._stamp_width = stamp_width
        self._b_threshold = b_threshold
        self._formal = bool(formal)
        self._bug = _bug
        self._checks = tuple(_checks)
        self._cmd_layout = command_layout(count_width, hash_width, stamp_width)
        self._resp_layout = response_layout(count_width, hash_width, stamp_width)
        self._probe_layout = probe_layout(count_width, hash_width)
        super().__init__({
            "i": In(stream.Signature(self._cmd_layout)),
            "o": Out(stream.Signature(self._resp_layout)),
            "probe": In(stream.Signature(self._probe_layout)),
        })

    buckets = property(lambda self: self._buckets)
    links = property(lambda self: self._links)
    regions = property(lambda self: self._regions)
    count_width = property(lambda self: self._count_width)
    hash_width = property(lambda self: self._hash_width)
    stamp_width = property(lambda self: self._stamp_width)
    b_threshold = property(lambda self: self._b_threshold)
    cmd_layout = property(lambda self: self._cmd_layout)
    resp_layout = property(lambda self: self._resp_layout)
    probe_layout = property(lambda self: self._probe_layout)

    def params(self) -> dict:
        """The parameters the golden model needs."""
        return dict(buckets=self._buckets, links=self._links, regions=self._regions,
                    count_width=self._count_width, hash_width=self._hash_width,
                    stamp_width=self._stamp_width, b_threshold=self._b_threshold)

    def elaborate(self, platform):
        m = Module()
        nb, nl, nr = self._buckets, self._links, self._regions
        bb, lb, rb = nb.bit_length() - 1, nl.bit_length() - 1, nr.bit_length() - 1
        bug = self._bug
        formal = self._formal
        meta_layout = data.StructLayout({"valid": 1, "count": self._count_width,
                                          "hash": self._hash_width, "region": rb})

        # In formal mode the tables start out as the reset sweep leaves them (the sweep itself is
        # still checked: CLEAR runs it), so that the bounded depth is spent on commands.
        meta = Table(m, "meta", meta_layout, nl, formal)
        stamp = Table(m, "stamp", self._stamp_width, nl, formal)
        m.submodules.region_allocator = alloc = RegionAllocator(
            regions=nr, b_threshold=self._b_threshold, formal=formal)
        m.submodules.free_links = free = FreeLinks(links=nl, formal=formal)
        m.submodules.lists = lists = BucketLists(
            buckets=nb, links=nl, formal=formal, _bug=bug if bug in LIST_BUGS else None)
        is_nil = lists.is_nil

        cmd = Signal(self._cmd_layout)
        resp = Signal(self._resp_layout)
        a_next = alloc.a_next                # FIFO A is the range [a_next, regions)
        sweep = max(nb, nl)
        idx = Signal(range(sweep + 1))
        cur = Signal(lb)
        best_link = Signal(lb)
        best_age = Signal(self._stamp_width)
        have_best = Signal()
        scan_link = Signal(lb)               # eviction scan: the link whose age is registered
        scan_stamp = Signal(self._stamp_width)
        exp_diff = Signal(self._stamp_width)     # EXPIRE: (now - max_age) mod 2**stamp_width
        exp_ge = Signal()                        # EXPIRE: now >= max_age
        scan_live = Signal()
        expire_now = Signal()
        clearing = Signal()                  # INIT was entered by CLEAR: answer it
        # The link row read the clock before, registered in every clock (no enable): the
        # walk's compare, the expiry's age check and LINK_OP's valid bit take it from here, a
        # clock after the table's output. The meta table is a block RAM without output register
        # (5.8 ns clock-to-out on the ECP5); its output crossing the chip straight into the
        # lookup's 88-bit compare was the board's critical path at 60 MHz (docs/BOARD.md).
        row = Signal(meta_layout)            # meta.rdata of the previous clock
        row_stamp = Signal(self._stamp_width)    # stamp.rdata of the previous clock
        row_link = Signal(lb)                # the walk's link whose row is in `row`
        walked = Signal()                    # `row` holds a link the walk stepped over
        m.d.sync += [row.eq(meta.rdata), row_stamp.eq(stamp.rdata), row_link.eq(cur)]
        # A lookup's verdict, registered unconditionally in LK_CMP (see there).
        lk_walk = Signal()                   # the lookup compared links: RESP reports lk_hit
        lk_hit = Signal()
        lk_link = Signal(lb)
        lk_region = Signal(rb)
        phase = Signal()                     # a walk step's clock: 0 read and compare, 1 step
        pr_last = Signal()                   # PROBE: the key being probed is the run's last
        link_raddr = Signal(lb)

        m.d.comb += [
            meta.raddr.eq(link_raddr), lists.link_addr.eq(link_raddr), stamp.raddr.eq(link_raddr),
            link_raddr.eq(cur), lists.head_addr.eq(cmd.hash[:bb]),
        ]

        def age_of(stamp_value):
            return (cmd.now - stamp_value)[:self._stamp_width]

        def unlink(link):
            """Unlink ``link`` (its rows in meta/prev/next ``rdata``); free link and region."""
            m.d.comb += [lists.unlink.eq(1), lists.bucket.eq(meta.rdata.hash[:bb])]
            dead = Signal(meta_layout)
            m.d.comb += [dead.eq(meta.rdata), dead.valid.eq(0)]
            meta.write(m, link, dead)
            m.d.comb += [free.free.eq(1), free.free_link.eq(link)]
            if bug != "region_leak":
                m.d.comb += [alloc.free.eq(1), alloc.free_region.eq(meta.rdata.region)]

        # The response: ``resp``, or a lookup's verdict from the lk_* registers.
        answer = Signal(self._resp_layout)
        m.d.comb += answer.eq(resp)
        with m.If(lk_walk & lk_hit):
            m.d.comb += [answer.link.eq(lk_link), answer.region.eq(lk_region),
                         answer.count.eq(cmd.count), answer.hash.eq(cmd.hash)]
        with m.Elif(lk_walk):
            m.d.comb += answer.status.eq(Status.MISS)

        def compare(*also):
            """The walk's second stage: the link whose row is in ``row`` (stepped over the clock
            before: ``walked``) against the key, into ``lk_hit`` and nowhere else; the
            statements ``also`` with each link compared."""
            hit = walked & row.valid & (row.count == cmd.count) & (row.hash == cmd.hash)
            m.d.sync += [lk_hit.eq(hit), lk_link.eq(row_link), lk_region.eq(row.region)]
            with m.If(walked):
                m.d.sync += list(also)

        def walk(on_hit, last, *also):
            """A COMPARE state: ``on_hit()`` once ``lk_hit`` is set, else the walk's two clocks
            per link. ``phase`` 0: the tables read at ``cur`` (a register: no table output
            reaches a read address), and the link stepped over before compared (:func:`compare`,
            with ``also``). ``phase`` 1: the read's data is out; step ``cur`` to its next
            pointer, and on to ``last`` where the list ends (its last link is compared in the
            clock after: LK_LAST, PR_LAST)."""
            with m.If(lk_hit):
                on_hit()
            with m.Elif(~phase):
                compare(*also)
                m.d.sync += phase.eq(1)
            with m.Else():
                # idx bounds the walk: a list never holds more than `links` links.
                end = is_nil(lists.next) | (idx == nl - 1)
                m.d.sync += [cur.eq(lists.next[:lb]), idx.eq(idx + 1), walked.eq(1),
                             phase.eq(0)]
                with m.If(end):
                    m.next = last

        def walk_last(on_hit, after, *also):
            """A LAST state: ``on_hit()`` if the link before the last hit, else the last link's
            compare (with ``also``) and on to ``after``."""
            with m.If(lk_hit):
                on_hit()
            with m.Else():
                compare(*also)
                m.next = after

        def respond():
            """Offer ``answer`` (held steady: it depends on registers only) until taken."""
            m.d.comb += [self.o.valid.eq(1), self.o.payload.eq(answer)]
            with m.If(lk_walk & lk_hit):
                # A hit refreshes the link's stamp; writing it again while waiting is harmless.
                stamp.write(m, lk_link, cmd.now)
            with m.If(self.o.ready):
                m.next = "IDLE"
            with m.Else():
                m.next = "RESPOND"

        # set by the walk's steps
        m.d.sync += walked.eq(0)
        with m.FSM(init="IDLE" if formal else "INIT") as fsm:
            with m.State("INIT"):
                # Reset and CLEAR: empty every bucket, free every link, all regions to FIFO A.
                with m.If(idx < nb):
                    m.d.comb += [lists.clear.eq(1), lists.bucket.eq(idx)]
                with m.If(idx < nl):
                    meta.write(m, idx, 0)
                    m.d.comb += [free.fill.eq(1), free.fill_index.eq(idx)]
                m.d.sync += idx.eq(idx + 1)
                with m.If(idx == sweep - 1):
                    m.d.comb += [alloc.reset.eq(1), free.reset.eq(1)]
                    m.d.sync += [idx.eq(0), clearing.eq(0)]
                    with m.If(clearing):
                        m.next = "RESPOND"
                    with m.Else():
                        m.next = "IDLE"

            with m.State("IDLE"):
                m.d.comb += [self.i.ready.eq(1), link_raddr.eq(self.i.payload.link[:lb]),
                             lists.head_addr.eq(self.i.payload.hash[:bb])]
                # the command register takes the offer every clock here, valid or not: an enable
                # of its 160 bits from the state alone, not from ``i.valid`` (the requester's
                # handshake across the chip: 15.2 ns of the half-rate board build at 60 MHz);
                # nothing reads ``cmd`` before the clock that takes a command leaves IDLE
                m.d.sync += cmd.eq(self.i.payload)
                with m.If(self.i.valid):
                    m.d.sync += [resp.eq(0),
                                 resp.op.eq(self.i.payload.op), idx.eq(0), lk_walk.eq(0),
                                 lk_hit.eq(0),
                                 exp_diff.eq(self.i.payload.now - self.i.payload.max_age),
                                 exp_ge.eq(self.i.payload.now >= self.i.payload.max_age)]
                    with m.Switch(self.i.payload.op):
                        with m.Case(Op.LOOKUP):
                            m.next = "LOOKUP_HEAD"
                        with m.Case(Op.INSERT, Op.INSERT_EXISTING):
                            m.next = "INSERT_CHECK"
                        with m.Case(Op.DELETE, Op.TOUCH, Op.READ):
                            m.next = "LINK_READ"
                        with m.Case(Op.EXPIRE):
                            m.next = "EXPIRE_ISSUE"
                        with m.Case(Op.CLEAR):
                            m.d.sync += clearing.eq(1)
                            m.next = "INIT"
                        with m.Case(Op.PROBE):
                            m.d.sync += [resp.status.eq(Status.MISS), pr_last.eq(0)]
                            m.next = "PROBE_NEXT"
                        with m.Default():
                            m.d.sync += resp.status.eq(Status.BAD_OP)
                            m.next = "RESPOND"

            with m.State("LOOKUP_HEAD"):
                # the head into `cur`, which addresses the tables from the next clock (an empty
                # bucket's RESPOND: below the FSM, ``head_nil_next``)
                m.d.sync += [cur.eq(lists.head[:lb]), phase.eq(0)]
                with m.If(cmd.count == 0):
                    m.d.sync += resp.status.eq(Status.BAD_COUNT)
                    m.next = "RESPOND"
                with m.Elif(is_nil(lists.head)):
                    m.d.sync += resp.status.eq(Status.MISS)
                with m.Else():
                    m.d.sync += lk_walk.eq(1)
                    m.next = "LOOKUP_COMPARE"

            with m.State("LOOKUP_COMPARE"):
                # Two clocks a link (walk): the tables read at `cur`, then `cur` stepped to the
                # next pointer the read gave (the next pointer straight from its block RAM into
                # the tables' read address was the board's critical path at 60 MHz). A link's
                # row is compared a clock after its read, from `row` (the block RAM's output
                # straight into the 64-bit hash and count compare was the critical path before),
                # into one flip-flop, lk_hit, and nowhere else (it was the critical path when it
                # also drove the FSM, the response register's enables and the stamp write). The
                # walk goes on while lk_hit settles, a link past a hit; a set lk_hit answers at
                # once, as RESP does.
                walk(respond, "LOOKUP_LAST")

            with m.State("LOOKUP_LAST"):
                # the list's last link is compared (unless the one before it hit)
                walk_last(respond, "RESPOND")

            with m.State("INSERT_CHECK"):
                existing = cmd.op == Op.INSERT_EXISTING
                have_link = free.available
                have_region = alloc.available
                region = Mux(existing, cmd.region[:rb], alloc.region)
                with m.If(cmd.count == 0):
                    m.d.sync += resp.status.eq(Status.BAD_COUNT)
                    m.next = "RESPOND"
                with m.Elif(existing & ((cmd.region >= nr) | (cmd.region < a_next))):
                    m.d.sync += resp.status.eq(Status.BAD_REGION)
                    m.next = "RESPOND"
                with m.Elif(~have_link | (~existing & ~have_region)):
                    with m.If(~existing & cmd.evict & ~resp.evicted):
                        # Start the LRU scan: read link 0 now.
                        m.d.comb += link_raddr.eq(0)
                        m.d.sync += [idx.eq(0), have_best.eq(0), scan_live.eq(0)]
                        m.next = "EVICT_SCAN"
                    with m.Else():
                        m.d.sync += resp.status.eq(Status.FULL)
                        m.next = "RESPOND"
                with m.Elif(existing & (cmd.region != a_next)):
                    # Rebuild: regions of FIFO A below the record's are skipped into FIFO B.
                    m.d.comb += alloc.skip.eq(1)
                with m.Else():
                    link = free.link
                    new_meta = Signal(meta_layout)
                    m.d.comb += [new_meta.valid.eq(1), new_meta.count.eq(cmd.count),
                                 new_meta.hash.eq(cmd.hash), new_meta.region.eq(region)]
                    meta.write(m, link, new_meta)
                    stamp.write(m, link, cmd.now)
                    m.d.comb += [lists.push.eq(1), lists.link.eq(link),
                                 lists.bucket.eq(cmd.hash[:bb])]
                    if bug != "link_dup":
                        m.d.comb += free.take.eq(1)
                    if bug != "region_dup":
                        m.d.comb += [alloc.take.eq(1), alloc.from_a.eq(existing)]
                    m.d.sync += [resp.link.eq(link), resp.region.eq(region), cur.eq(link)]
                    with m.If(is_nil(lists.head)):
                        m.next = "RESPOND"
                    with m.Else():
                        m.next = "INSERT_PREVIOUS"

            with m.State("INSERT_PREVIOUS"):
                m.d.comb += [lists.push_prev.eq(1), lists.link.eq(cur)]
                m.next = "RESPOND"

            def scan_compare():
                scan_age = age_of(scan_stamp)
                with m.If(scan_live & (~have_best | (scan_age > best_age))):
                    m.d.sync += [best_link.eq(scan_link), best_age.eq(scan_age),
                                 have_best.eq(1)]

            with m.State("EVICT_SCAN"):
                # One link per clock: the oldest live stamp wins, ties to the lowest index.
                # Two stages (the stamp is registered, then aged and compared with the best so
                # far): the stamp read, subtraction and compare in one clock was too slow.
                m.d.comb += link_raddr.eq(idx + 1)
                m.d.sync += [scan_link.eq(idx), scan_stamp.eq(stamp.rdata),
                             scan_live.eq(meta.rdata.valid), idx.eq(idx + 1)]
                scan_compare()
                with m.If(idx == nl - 1):
                    m.next = "EVICT_LAST"

            with m.State("EVICT_LAST"):
                scan_compare()
                m.next = "EVICT_READ"

            with m.State("EVICT_READ"):
                m.d.comb += link_raddr.eq(best_link)
                m.d.sync += cur.eq(best_link)
                with m.If(have_best):
                    m.next = "EVICT_UNLINK"
                with m.Else():
                    m.d.sync += resp.status.eq(Status.FULL)
                    m.next = "RESPOND"

            with m.State("EVICT_UNLINK"):
                unlink(cur)
                m.d.sync += [resp.evicted.eq(1), resp.victim.eq(cur)]
                m.next = "EVICT_WAIT"

            with m.State("EVICT_WAIT"):
                # The tables' read ports see EV_UNLINK's writes one clock later.
                m.next = "INSERT_CHECK"

            with m.State("LINK_READ"):
                # The link's rows are on the tables' outputs (addressed in IDLE) and go into
                # `row`; LINK_OP decides on its valid bit: the block RAM's output straight into
                # the unlink's write enables (lists, free links, FIFO B) was the directory's
                # longest path. The rows are read again for LINK_OP.
                m.d.comb += link_raddr.eq(cmd.link[:lb])
                m.next = "LINK_OP"

            with m.State("LINK_OP"):
                link = cmd.link[:lb]
                with m.If(cmd.link >= nl):
                    m.d.sync += resp.status.eq(Status.BAD_LINK)
                with m.Elif(~row.valid):
                    m.d.sync += resp.status.eq(Status.NOT_LIVE)
                with m.Else():
                    m.d.sync += resp.link.eq(cmd.link)
                    with m.Switch(cmd.op):
                        with m.Case(Op.DELETE):
                            unlink(link)
                            m.d.sync += resp.region.eq(meta.rdata.region)
                        with m.Case(Op.TOUCH):
                            stamp.write(m, link, cmd.now)
                        with m.Case(Op.READ):
                            m.d.sync += [resp.region.eq(meta.rdata.region),
                                         resp.count.eq(meta.rdata.count),
                                         resp.hash.eq(meta.rdata.hash),
                                         resp.stamp.eq(stamp.rdata),
                                         resp.prev.eq(lists.field(lists.prev)),
                                         resp.next.eq(lists.field(lists.next))]
                m.next = "RESPOND"

            with m.State("EXPIRE_ISSUE"):
                m.d.comb += link_raddr.eq(idx)
                m.next = "EXPIRE_CHECK"

            with m.State("EXPIRE_CHECK"):
                # the link's rows are on the tables' outputs; they go into `row`, `row_stamp`
                m.d.comb += link_raddr.eq(idx)
                m.next = "EXPIRE_AGE"

            with m.State("EXPIRE_AGE"):
                # The age compare, on the registered stamp (not the table's output), goes into
                # a register, not straight into the unlink's write enables: that path (stamp
                # read, subtract, compare, write) was the critical one.
                m.d.comb += link_raddr.eq(idx)
                # age > max_age without the subtraction after the read: with d = (now -
                # max_age) mod 2**w, a stamp s <= now is old when now >= max_age and s < d; a
                # stamp s > now (the clock wrapped) when now >= max_age or s < d.
                s = row_stamp
                below = s < exp_diff
                old = Mux(s <= cmd.now, exp_ge & below, exp_ge | below)
                m.d.sync += expire_now.eq(row.valid & old)
                m.next = "EXPIRE_ACT"

            with m.State("EXPIRE_ACT"):
                last = idx == nl - 1
                m.d.sync += idx.eq(idx + 1)
                with m.If(expire_now):
                    unlink(idx[:lb])
                    m.d.sync += resp.expired.eq(resp.expired + 1)
                    # The next link may be a neighbour just rewritten: read it afresh.
                    with m.If(last):
                        m.next = "RESPOND"
                    with m.Else():
                        m.next = "EXPIRE_ISSUE"
                with m.Else():
                    m.d.comb += link_raddr.eq(idx + 1)
                    with m.If(last):
                        m.next = "RESPOND"
                    with m.Else():
                        m.next = "EXPIRE_CHECK"

            # ---- PROBE: a run of lookups that do not refresh stamps (a probe is not a use),
            # one key per clock while buckets are empty. The bucket-head table's read address
            # follows the probe stream's payload in every PR_ state (below the FSM), so the
            # head of the key on offer is read in the very clock that takes it.
            def record_hit():
                # the last key that hit wins: keys come in increasing count (longest prefix)
                m.d.sync += [resp.status.eq(Status.OK), resp.link.eq(lk_link),
                             resp.region.eq(lk_region), resp.count.eq(cmd.count),
                             resp.hash.eq(cmd.hash)]

            def key_hit():
                # a hit ends the key
                record_hit()
                next_key()

            def next_key(move=True):
                with m.If(pr_last):
                    if move:
                        m.next = "RESPOND"
                with m.Else():
                    m.d.comb += self.probe.ready.eq(1)
                    with m.If(self.probe.valid):
                        p = self.probe.payload
                        m.d.sync += [cmd.count.eq(p.count), cmd.hash.eq(p.hash),
                                     pr_last.eq(p.last), idx.eq(0), lk_hit.eq(0)]
                        if move:
                            m.next = "PROBE_HEAD"
                    with m.Else():
                        if move:
                            m.next = "PROBE_NEXT"

            with m.State("PROBE_NEXT"):
                # between keys: the previous key's last compare (lk_hit) is settled here
                with m.If(lk_hit):
                    record_hit()
                next_key()

            with m.State("PROBE_HEAD"):
                # an empty bucket is a miss in this clock, and the next key is taken at once;
                # else the head into `cur`, which addresses the tables from the next clock
                m.d.sync += [cur.eq(lists.head[:lb]), phase.eq(0)]
                with m.If(is_nil(lists.head)):
                    next_key(move=False)            # the move: below the FSM
                with m.Else():
                    m.next = "PROBE_COMPARE"

            with m.State("PROBE_COMPARE"):
                # LK_CMP's walk: the compare (a clock after the read) goes into lk_hit only, the
                # walk goes on while it settles; a set lk_hit ends this key (a later link cannot
                # be the first hit)
                walk(key_hit, "PROBE_LAST", resp.probes.eq(resp.probes + 1))

            with m.State("PROBE_LAST"):
                # the list's last link is compared (unless the one before it hit)
                walk_last(key_hit, "PROBE_NEXT", resp.probes.eq(resp.probes + 1))

            with m.State("RESPOND"):
                respond()

        # An empty bucket's move out of LOOKUP_HEAD and PROBE_HEAD, chosen last: the head's
        # "none" bit comes from a block RAM without output register (5.8 ns clock-to-out), and
        # as a term of the FSM's next-state logic it crossed six LUTs into the state register
        # (15.8 ns of the full-rate board build at 60 MHz); here it selects, in the last LUTs,
        # between the FSM's own next state and this one, computed from registers and the probe
        # stream.
        enc = fsm.encoding
        head_nil_next = Signal.like(fsm.state)
        m.d.comb += head_nil_next.eq(
            Mux(fsm.ongoing("LOOKUP_HEAD") | pr_last, enc["RESPOND"],
                Mux(self.probe.valid, enc["PROBE_HEAD"], enc["PROBE_NEXT"])))
        with m.If(is_nil(lists.head) & (fsm.ongoing("PROBE_HEAD")
                                         | (fsm.ongoing("LOOKUP_HEAD") & (cmd.count != 0)))):
            m.d.sync += fsm.state.eq(head_nil_next)

        with m.If(fsm.ongoing("PROBE_NEXT") | fsm.ongoing("PROBE_HEAD")
                  | fsm.ongoing("PROBE_COMPARE") | fsm.ongoing("PROBE_LAST")):
            m.d.comb += lists.head_addr.eq(self.probe.payload.hash[:bb])

        if formal:
            m.d.comb += Assume(~ResetSignal())
            idle = fsm.ongoing("IDLE")
            self._add_properties(m, idle, meta.row, meta_layout, alloc, free, lists)
            with m.If(idle):
                m.d.comb += Assert(~clearing)
        return m

    def _add_properties(self, m, idle, meta_row, meta_layout, alloc, free_links, lists):
        """The directory's invariants, asserted whenever it is idle (between commands)."""
        nb, nl, nr = self._buckets, self._links, self._regions
        bb, lb, rb = nb.bit_length() - 1, nl.bit_length() - 1, nr.bit_length() - 1
        metas = [meta_row(n, meta_layout) for n in range(nl)]
        a_next, b_rd, b_wr, b_level = alloc.a_next, alloc.b_rd, alloc.b_wr, alloc.b_level
        fifo_b, free_q = alloc.fifo_b, free_links.table
        fl_rd, fl_wr, fl_level = free_links.rd, free_links.wr, free_links.level

        def occupied(slot, rd, level, depth):
            return ((slot - rd) % depth) < level

        checks = []
        if "regions" in self._checks:
            # Every region is in exactly one of FIFO A, FIFO B or a live link.
            checks += [a_next <= nr, b_level <= nr, b_wr == (b_rd + b_level)[:rb]]
            for r in range(nr):
                in_a = a_next <= r
                in_b = [occupied(j, b_rd, b_level, nr) & (fifo_b.rows[j] == r)
                        for j in range(nr)]
                live = [metas[n].valid & (metas[n].region == r) for n in range(nl)]
                checks.append(count_true([in_a, *in_b, *live]) == 1)
        if "free_links" in self._checks:
            # Free links and live links are disjoint, and together they are all links.
            checks += [fl_level <= nl, fl_wr == (fl_rd + fl_level)[:lb]]
            for n in range(nl):
                free = [occupied(j, fl_rd, fl_level, nl) & (free_q.rows[j] == n)
                        for j in range(nl)]
                checks.append(count_true([*free, metas[n].valid]) == 1)
        # The lists' own invariants ("reach", "links") over their tables.
        checks += lists.invariants(m, [row.valid for row in metas],
                                   [row.hash[:bb] for row in metas], self._checks)
        with m.If(idle):
            for check in checks:
                m.d.comb += Assert(check)
