"""Dispatcher unit: the longest stored prefix (QUERY_PREFIX).

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop`.

``QUERY_PREFIX n`` streams the first ``n`` tokens of token memory once through the hash engine
and probes the directory at **every** prefix length ``1 .. n``; it answers ``HIT`` with the
longest length ``count`` whose ``(count, hash)`` has a directory entry (its hash, link and
region), or ``MISS`` (count 0). A hit is a directory entry, not yet a verified record: the host
follows it with ``QUERY count``, which verifies the stored tokens, the config and the payload
CRC and imports (so a hash collision or a corrupt record is a miss, never a wrong answer). The
probe refreshes no stamp: looking a prefix up is not a use, only the import that follows is.
``n`` must be ``1 .. count of token memory`` (an empty token memory is ``BAD_ARG``); like
``QUERY`` the request answers ``NOT_READY`` while the directory is recovered. In a sealed build
it carries a tenant key slot (checked first: ``BAD_ARG``, ``NO_KEY``) and the hash starts from
the tenant's seed, so it finds only that tenant's records.

Datapath (all four run at once, one token per clock where nothing stalls)::

    token memory (read port 0) ─► slice ─► HashEngine ─► key FIFO ─► CacheDirectory.probe
      feeder: one read per clock   {hash, count, last}   (4 entries)   PROBE run: one key per
      while the slice takes it     of every prefix                    clock on an empty bucket,
                                                                      3 + 2 x links compared else

The directory's PROBE run (``hw/store/directory.py``) is a lookup per key without the command
handshake and without the stamp write: a key whose bucket is empty costs 1 clock, any other
``3 + 2c`` for ``c`` links compared; it answers once, after the key marked ``last``, with the
last (longest) key that hit. The feeder holds its token under the backpressure of the register
slice before the hash engine (``Dispatcher.h_ready``; token memory read data holds while ``en``
is low), the hash engine holds its output while the
FIFO is full, so no key is lost whatever the directory's pace, and the FIFO keeps keys on offer
so the directory never waits for one after the first.

No hang: the feeder issues exactly ``n`` tokens (the first marked ``first``, the ``n``-th
``last``), each becomes one key, the directory's run ends at the key marked ``last`` and
answers, and every stage waits only on the next one, which always drains (the directory takes
a key within ``3 + links`` clocks); so the request ends within ``15 + n * (3 + links)``
clocks.

Latency: ``QUERY_PREFIX_FIXED + sum(cost of each key)`` clocks from the request's header to its
answer (``cycles`` of the response; the exact formula and its terms are in
``docs/blocks/directory.md``, "PROBE runs", and the golden model
:func:`ringkv.host.golden.prefix.query_prefix`).
"""

from amaranth import Mux, Signal
from amaranth.lib import wiring

from ringkv.defs.protocol import RESPONSES, Op

from ..link.skid import StreamRegister
from ..protocol import Status
from ..store.directory import Op as DirOp
from ..store.directory import Status as DirStatus
from .dispatch import CommandUnit

__all__ = ["PrefixUnit", "KEY_FIFO_DEPTH"]

#: Entries of the key FIFO between the hash engine and the directory's probe stream. Two would
#: do for throughput (the directory takes at most one key per clock, the engine refills in one);
#: four leave slack. The FIFO is two register slices in a row (two entries each): every
#: ``ready`` and ``valid`` on its way is a flip-flop, so the directory's ``probe.ready`` (decided
#: on its bucket-head table's output: an empty bucket takes the next key at once) ends in the
#: second slice's registers, not in a FIFO's level counter; a key still takes two clocks through.
KEY_FIFO_DEPTH = 4


class PrefixUnit(CommandUnit):
    OPS = (Op.QUERY_PREFIX,)

    def signals(self, d):
        m, dr, hasher = d.m, d.dr, d.hasher
        self.issued = Signal()              # the directory took the PROBE command
        self.cycles = Signal(32)
        width = len(hasher.o.payload.as_value())
        if width != len(dr.probe.payload.as_value()):
            raise ValueError("the hash engine's output and the directory's probe stream differ")
        m.submodules.prefix_keys = self.keys_in = StreamRegister(width)
        m.submodules.prefix_keys_out = self.keys_out = StreamRegister(width)
        wiring.connect(m, self.keys_in.o, self.keys_out.i)

    def background(self, d):
        keys, probe = self.keys_out.o, d.dr.probe
        d.m.d.comb += [probe.valid.eq(keys.valid), probe.payload.eq(keys.payload),
                       keys.ready.eq(probe.ready)]

    def responses(self, d):
        r = d.dresp        # the PROBE answer: zero count, hash, link, region on a miss
        return {Op.QUERY_PREFIX: dict(count=r.count, hash=r.hash, link=r.link, region=r.region,
                                      probes=r.probes, cycles=self.cycles)}

    def dispatch(self, d):
        m, tm = d.m, d.tm
        with m.Case(Op.QUERY_PREFIX.value), d.tenant(Op.QUERY_PREFIX):
            n = d.arg(Op.QUERY_PREFIX, "n")
            with m.If(d.early((n == 0) | (n > tm.count))):
                d.reject(Status.BAD_ARG)
            with m.Else():
                m.d.sync += [d.h_n.eq(n), d.h_i.eq(0), self.issued.eq(0)]
                m.next = "PROBE_RUN"

    def states(self, d):
        m, dr, hasher, keys = d.m, d.dr, d.hasher, self.keys_in.i
        h_i, h_n = d.h_i, d.h_n
        with m.State("PROBE_RUN"):
            # the directory's PROBE command, once (the directory is idle between requests)
            with m.If(~self.issued):
                m.d.comb += [dr.i.valid.eq(1), dr.i.payload.op.eq(DirOp.PROBE),
                             dr.i.payload.now.eq(d.dir_now)]
                with m.If(dr.i.ready):
                    m.d.sync += self.issued.eq(1)
            # feeder: a token memory read whenever the hash engine takes the pending token
            with m.If(~d.h_valid | d.h_ready):
                with m.If(h_i != h_n):
                    m.d.comb += d.rd0.en.eq(1)      # at h_i
                    m.d.sync += [d.h_valid.eq(1), d.h_first.eq(h_i == 0),
                                 d.h_last.eq(h_i == h_n - 1), h_i.eq(h_i + 1)]
            with m.Else():      # held: read data holds while en is low
                m.d.sync += [d.h_valid.eq(1), d.h_first.eq(d.h_first), d.h_last.eq(d.h_last)]
            # hash engine -> key FIFO (-> the directory's probe stream, in background())
            m.d.comb += [hasher.o.ready.eq(keys.ready), keys.valid.eq(hasher.o.valid),
                         keys.payload.eq(hasher.o.payload.as_value())]
            # the answer, after the last key
            m.d.comb += dr.o.ready.eq(1)
            with m.If(dr.o.valid):
                m.d.sync += d.dresp.eq(dr.o.payload)
                m.next = "PROBE_DONE"
        with m.State("PROBE_DONE"):
            m.d.sync += self.cycles.eq(d.cycles - d.cycles_at)
            d.respond(Mux(d.dresp.status == DirStatus.OK, Status.HIT, Status.MISS),
                      RESPONSES[Op.QUERY_PREFIX].size)
