"""The cache directory's allocators: the two-FIFO region allocator and the free-link FIFO.

Both are pieces of :class:`~ringkv.hw.store.directory.CacheDirectory`
(``docs/blocks/directory.md``, "Allocator"), with behaviour of their own and a model each in
``tests/hw/store/test_directory_alloc.py``:

* :class:`RegionAllocator`: FIFO A (never-used regions, the range ``[a_next, regions)``: a
  counter, no memory) and FIFO B (freed regions, a table of depth ``regions``), and the
  allocation policy on both levels.
* :class:`FreeLinks`: the FIFO of free links (a table of depth ``links``), filled by the
  directory's reset sweep.

Both keep their tables in :class:`Table`: a block RAM, or registers when the directory is built
for its formal proofs (whose invariants range over every row: ``rows``).
"""

from amaranth.hdl import Array, Module, Mux, Shape, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int, check_pow2

__all__ = ["Table", "RegionAllocator", "FreeLinks"]


class Table:
    """One synchronous-read, one-write table: a block RAM, or registers when ``formal``.

    Both forms behave the same: ``rdata`` is the row at ``raddr`` of the previous clock, and a
    write is not seen by a read in the same clock (not transparent). The register form exists
    so that formal assertions can range over every row (``rows``) of a small configuration.
    With ``m = None`` the signals (and ``rows``) exist at once and :meth:`build` adds the logic
    later: a component makes its tables in its constructor, so that its owner's formal
    properties can name their rows before the component is elaborated.
    """

    def __init__(self, m, name, shape, depth, formal, init=None):
        self.rows = None
        self._name, self._depth = name, depth
        self.raddr = Signal(range(depth), name=f"{name}_raddr")
        self.waddr = Signal(range(depth), name=f"{name}_waddr")
        self.we = Signal(name=f"{name}_we")
        self.rdata = Signal(shape, name=f"{name}_rdata")
        self.wdata = Signal(shape, name=f"{name}_wdata")
        self._width = width = Shape.cast(shape).width
        if formal:
            init = list(init or [0] * depth)
            self.rows = [Signal(width, name=f"{name}_{n}", init=init[n]) for n in range(depth)]
        if m is not None:
            self.build(m)

    def build(self, m):
        """Add the table's logic to ``m`` (once; the constructor does it when given ``m``)."""
        name, depth, width = self._name, self._depth, self._width
        if self.rows is not None:
            rows = Array(self.rows)
            rdata = Signal(width, name=f"{name}_rdata_raw")
            m.d.sync += rdata.eq(rows[self.raddr])
            m.d.comb += self.rdata.eq(rdata)
            with m.If(self.we):
                m.d.sync += rows[self.waddr].eq(self.wdata)
        else:
            m.submodules[name] = mem = memory.Memory(shape=width, depth=depth, init=[])
            read = mem.read_port(transparent_for=())
            write = mem.write_port()
            m.d.comb += [read.addr.eq(self.raddr), self.rdata.eq(read.data),
                         write.addr.eq(self.waddr), write.data.eq(self.wdata),
                         write.en.eq(self.we)]
        return self

    def write(self, m, addr, value):
        m.d.comb += [self.we.eq(1), self.waddr.eq(addr), self.wdata.eq(value)]

    def row(self, index, shape=None):
        value = self.rows[index]
        return data.View(shape, value) if shape is not None else value


def _pow2_bits(name, value, high):
    check_pow2(name, value, low=2, high=high)
    return value.bit_length() - 1


class RegionAllocator(wiring.Component):
    """FIFO A, FIFO B and the policy between them.

    FIFO A is ``[a_next, regions)``; FIFO B a table of ``regions`` rows read at ``b_rd``
    (``b_level`` regions from there). Policy: the next region comes from B when B holds at least
    ``b_threshold`` regions or A is empty, else from A.

    Ports: ``reset`` (In 1: every region back to A, B empty), ``take`` (In 1: ``region`` is
    taken: from A when ``from_a`` or the policy says A, else from B), ``from_a`` (In 1),
    ``skip`` (In 1: A's first region goes to B, a rebuild's skipped region), ``free`` with
    ``free_region`` (In: a region goes to B), ``region`` (Out: the region the policy offers,
    valid when ``available``), ``available`` (Out 1: A or B is not empty), ``a_next`` (Out: A's
    first region; A holds ``regions - a_next``). One operation per clock (``reset`` wins).

    Latency: the counters move at the next edge; a region written to B is offered from the
    clock after next (the table is not transparent). No backpressure: the caller checks
    ``available`` before a ``take``.
    """

    def __init__(self, *, regions: int, b_threshold: int, formal: bool = False):
        rb = _pow2_bits("regions", regions, 1 << 24)
        check_int("b_threshold", b_threshold, low=1, high=regions)
        self._regions, self._b_threshold, self._formal = regions, b_threshold, bool(formal)
        super().__init__({"reset": In(1), "take": In(1), "from_a": In(1), "skip": In(1),
                          "free": In(1), "free_region": In(rb), "region": Out(rb),
                          "available": Out(1), "a_next": Out(range(regions + 1))})
        #: formal view: the FIFO B counters and table
        self.b_rd = Signal(rb)
        self.b_wr = Signal(rb)
        self.b_level = Signal(range(regions + 1))
        self.fifo_b = Table(None, "fifo_b", rb, regions, formal)

    def elaborate(self, platform):
        m = Module()
        nr = self._regions
        rb = nr.bit_length() - 1
        a_next, b_rd, b_wr, b_level = self.a_next, self.b_rd, self.b_wr, self.b_level
        fifo_b = self.fifo_b.build(m)
        m.d.comb += fifo_b.raddr.eq(b_rd)
        a_avail = a_next != nr
        b_avail = b_level != 0
        use_b = b_avail & (~a_avail | (b_level >= self._b_threshold))
        m.d.comb += [self.region.eq(Mux(use_b, fifo_b.rdata, a_next[:rb])),
                     self.available.eq(a_avail | b_avail)]
        with m.If(self.free):
            fifo_b.write(m, b_wr, self.free_region)
            m.d.sync += [b_wr.eq(b_wr + 1), b_level.eq(b_level + 1)]
        with m.If(self.skip):
            fifo_b.write(m, b_wr, a_next[:rb])
            m.d.sync += [b_wr.eq(b_wr + 1), b_level.eq(b_level + 1), a_next.eq(a_next + 1)]
        with m.If(self.take):
            with m.If(self.from_a | ~use_b):
                m.d.sync += a_next.eq(a_next + 1)
            with m.Else():
                m.d.sync += [b_rd.eq(b_rd + 1), b_level.eq(b_level - 1)]
        with m.If(self.reset):
            m.d.sync += [a_next.eq(0), b_rd.eq(0), b_wr.eq(0), b_level.eq(0)]
        return m


class FreeLinks(wiring.Component):
    """The FIFO of free links: a table of ``links`` rows, ``level`` links from ``rd``.

    Ports: ``fill`` with ``fill_index`` (In: the reset sweep writes link ``fill_index`` into row
    ``fill_index``), ``reset`` (In 1: every link free: ``rd = wr = 0``, ``level = links``; after
    a sweep that filled every row), ``take`` (In 1: ``link`` is taken), ``free`` with
    ``free_link`` (In: a link goes back), ``link`` (Out: the next free link, valid when
    ``available``), ``available`` (Out 1). One operation per clock (``reset`` wins).

    Latency: the counters move at the next edge; a freed link is offered from the clock after
    next. With ``formal`` the FIFO starts full (the state the reset sweep leaves). No
    backpressure: the caller checks ``available`` before a ``take``.
    """

    def __init__(self, *, links: int, formal: bool = False):
        lb = _pow2_bits("links", links, 1 << 15)
        self._links, self._formal = links, bool(formal)
        super().__init__({"fill": In(1), "fill_index": In(lb), "reset": In(1), "take": In(1),
                          "free": In(1), "free_link": In(lb), "link": Out(lb),
                          "available": Out(1)})
        #: formal view: the counters and the table
        self.rd = Signal(lb)
        self.wr = Signal(lb)
        self.level = Signal(range(links + 1), init=links if formal else 0)
        self.table = Table(None, "free_links", lb, links, formal, init=range(links))

    def elaborate(self, platform):
        m = Module()
        nl = self._links
        rd, wr, level = self.rd, self.wr, self.level
        table = self.table.build(m)
        m.d.comb += [table.raddr.eq(rd), self.link.eq(table.rdata),
                     self.available.eq(level != 0)]
        with m.If(self.fill):
            table.write(m, self.fill_index, self.fill_index)
        with m.If(self.free):
            table.write(m, wr, self.free_link)
            m.d.sync += [wr.eq(wr + 1), level.eq(level + 1)]
        with m.If(self.take):
            m.d.sync += [rd.eq(rd + 1), level.eq(level - 1)]
        with m.If(self.reset):
            m.d.sync += [rd.eq(0), wr.eq(0), level.eq(nl)]
        return m
