"""The cache directory's linked lists: bucket heads and the prev/next pointers of every link.

A piece of :class:`~ringkv.hw.store.directory.CacheDirectory` (``docs/blocks/directory.md``,
"Implementation"), with a model in ``tests/hw/store/test_directory_lists.py``. The directory decides
which bucket a hash selects, which link to act on and when; this piece holds the three pointer
tables and runs every pointer update the directory's commands make.
"""

from amaranth.hdl import Array, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_pow2
from ringkv.defs.directory import NIL

from .directory_alloc import Table

__all__ = ["BucketLists", "LIST_BUGS", "LIST_CHECKS", "count_true"]

#: The invariant groups of :meth:`BucketLists.invariants`.
LIST_CHECKS = ("reach", "links")
#: Deliberately broken variants for the directory's formal tests (private knob ``_bug``).
LIST_BUGS = ("lost_head", "stale_prev")



def count_true(terms):
    """How many of the 1-bit ``terms`` are 1 (a sum wide enough for all of them): the
    invariants' "exactly one of" checks."""
    total = Const(0, range(len(terms) + 1))
    for term in terms:
        total = total + term
    return total

class BucketLists(wiring.Component):
    """``buckets`` doubly linked lists over a pool of ``links`` links.

    Three tables (:class:`~ringkv.hw.store.directory_alloc.Table`: block RAM, or registers when
    ``formal``): ``head`` (a row per bucket), ``prev`` and ``next`` (a row per link). A pointer is
    ``log2(links) + 1`` bits wide, its top bit meaning "none" (:meth:`is_nil`); a list's first
    link has no prev and its last no next. The piece touches these three tables and nothing
    else: the links' payload (valid, hash, stamp, ...) and the free-link and region FIFOs are
    its owner's.

    Ports
    -----
    head_addr : In(log2 buckets); head : Out(pointer)
        ``head`` is the head of bucket ``head_addr`` of the previous clock.
    link_addr : In(log2 links); prev, next : Out(pointer)
        ``prev``/``next`` are link ``link_addr``'s pointers of the previous clock.
    bucket : In(log2 buckets); link : In(log2 links)
        The operands of the operations below.
    clear : In(1)
        ``head[bucket] := none`` (the owner's reset sweep runs it over every bucket).
    push : In(1)
        Link ``link`` (not in a list) at the head of ``bucket``, whose head is on ``head`` (read
        the clock before): ``prev[link] := none``, ``next[link] := head``, ``head[bucket] :=
        link``; the old head is kept for ``push_prev``.
    push_prev : In(1)
        The second clock of a push onto a non-empty list (``head`` was not none at the push):
        ``prev[old head] := link``; ``link`` must be the pushed link again.
    unlink : In(1)
        Unlink the link whose pointers are on ``prev``/``next`` (read the clock before) from
        ``bucket``, its list: ``next[prev] := next`` (or ``head[bucket] := next`` when it has no
        prev) and ``prev[next] := prev`` (unless it has no next). Its own rows keep their old
        values.

    Latency, throughput, backpressure
    ---------------------------------
    One operation per clock (at most one of ``clear``, ``push``, ``push_prev``, ``unlink``),
    written at the next edge; reads are registered and not transparent, so a row written at an
    edge is read back from the clock after it. A push onto a non-empty list takes two clocks
    (``push``, then ``push_prev``), every other operation one; between the two clocks of a push
    the lists are not consistent (the old head's prev is stale). No backpressure: the owner
    sequences the operations, and reads each operand's row the clock before.
    """

    def __init__(self, *, buckets: int, links: int, formal: bool = False, _bug=None):
        check_pow2("buckets", buckets, low=2, high=1 << 16)
        check_pow2("links", links, low=2, high=1 << 15)
        if _bug is not None and _bug not in LIST_BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {LIST_BUGS}")
        self._buckets, self._links, self._formal, self._bug = buckets, links, bool(formal), _bug
        bb, lb = buckets.bit_length() - 1, links.bit_length() - 1
        self._lb = lb
        ptr = lb + 1
        #: the "none" pointer
        self.nil_ptr = 1 << lb
        super().__init__({
            "head_addr": In(bb), "head": Out(ptr),
            "link_addr": In(lb), "prev": Out(ptr), "next": Out(ptr),
            "bucket": In(bb), "link": In(lb),
            "clear": In(1), "push": In(1), "push_prev": In(1), "unlink": In(1),
        })
        #: formal view: the three tables (``rows`` when ``formal``)
        self.head_table = Table(None, "head", ptr, buckets, formal, init=[self.nil_ptr] * buckets)
        self.prev_table = Table(None, "prev", ptr, links, formal)
        self.next_table = Table(None, "next", ptr, links, formal)

    buckets = property(lambda self: self._buckets)
    links = property(lambda self: self._links)
    formal = property(lambda self: self._formal)

    def is_nil(self, pointer):
        """Whether ``pointer`` (a table's pointer) is "none"."""
        return pointer[self._lb]

    def field(self, pointer):
        """``pointer`` as a response field: the link, or ``NIL`` for none."""
        return Mux(self.is_nil(pointer), NIL, pointer[:self._lb])

    def elaborate(self, platform):
        m = Module()
        lb, bug, nil_ptr = self._lb, self._bug, self.nil_ptr
        head = self.head_table.build(m)
        prev = self.prev_table.build(m)
        nxt = self.next_table.build(m)
        m.d.comb += [head.raddr.eq(self.head_addr), prev.raddr.eq(self.link_addr),
                     nxt.raddr.eq(self.link_addr), self.head.eq(head.rdata),
                     self.prev.eq(prev.rdata), self.next.eq(nxt.rdata)]
        old_head = Signal(lb + 1)

        with m.If(self.clear):
            head.write(m, self.bucket, nil_ptr)
        with m.If(self.push):
            prev.write(m, self.link, nil_ptr)
            nxt.write(m, self.link, head.rdata)
            if bug != "lost_head":
                head.write(m, self.bucket, self.link)
            m.d.sync += old_head.eq(head.rdata)
        with m.If(self.push_prev):
            prev.write(m, old_head[:lb], self.link)
        with m.If(self.unlink):
            p, n = prev.rdata, nxt.rdata
            with m.If(self.is_nil(p)):
                head.write(m, self.bucket, n)
            with m.Else():
                nxt.write(m, p[:lb], n)
            if bug != "stale_prev":
                with m.If(~self.is_nil(n)):
                    prev.write(m, n[:lb], p)
        return m

    def invariants(self, m, live, bucket, groups=LIST_CHECKS) -> list:
        """The lists' invariants over the register tables of the ``formal`` form, as values
        for the owner to assert while no push is half done. ``live[n]`` says whether link ``n``
        is in a list, ``bucket[n]`` which bucket it belongs to (both the owner's). Groups:

        * ``"reach"``: every live link is reachable from exactly one bucket, its own, no other
          link is reachable, and every list ends within ``links`` steps (no cycle);
        * ``"links"``: prev and next agree, a live link without prev heads its bucket, and a
          bucket's head is a live link of that bucket without prev.
        """
        nb, nl, lb = self._buckets, self._links, self._lb
        heads, prev_rows = self.head_table.rows, self.prev_table.rows
        next_rows = self.next_table.rows
        prevs, nexts = Array(prev_rows), Array(next_rows)
        valid = Array(Signal(name=f"live_{n}") for n in range(nl))
        for n in range(nl):
            m.d.comb += valid[n].eq(live[n])
        bucket_bits = Array(bucket)
        nil = self.is_nil

        checks = []
        if "reach" in groups:
            reach = [[Const(0) for _ in range(nl)] for _ in range(nb)]
            for b in range(nb):
                p = heads[b]
                for _ in range(nl):
                    for n in range(nl):
                        reach[b][n] = reach[b][n] | (~nil(p) & (p[:lb] == n))
                    p = Mux(nil(p), p, nexts[p[:lb]])
                checks.append(nil(p))
            for n in range(nl):
                by = count_true([reach[b][n] for b in range(nb)])
                own = Array(reach[b][n] for b in range(nb))[bucket[n]]
                checks.append(Mux(live[n], (by == 1) & own, by == 0))
        if "links" in groups:
            for n in range(nl):
                p, q = prev_rows[n], next_rows[n]
                ok_next = nil(q) | (valid[q[:lb]] & (prevs[q[:lb]] == n))
                ok_prev = Mux(nil(p), Array(heads)[bucket[n]] == n,
                              valid[p[:lb]] & (nexts[p[:lb]] == n))
                checks.append(~live[n] | (ok_next & ok_prev))
            for b in range(nb):
                h = heads[b]
                ok = nil(h) | (valid[h[:lb]] & nil(prevs[h[:lb]]) & (bucket_bits[h[:lb]] == b))
                checks.append(ok)
        return checks
