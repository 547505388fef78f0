"""Dispatcher unit: the cache directory and allocator (DIR_* and ALLOC_STATUS).

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop`: each DIR_*
request is one :class:`~ringkv.hw.store.directory.CacheDirectory` command, answered with the
directory's response field for field (``DIR_RESPONSE``); its latency is the directory's plus
~5 clocks. ``DIR_CLEAR`` with a payload also sets the commit sequence number of the next export.
"""

from ringkv.defs.protocol import FLAG_EVICT, FLAG_EXISTING, RESPONSES, Op

from ..protocol import Status
from ..store.directory import Op as DirOp
from .dispatch import CommandUnit

__all__ = ["DirectoryUnit"]

_DIR_OPS = (Op.DIR_LOOKUP, Op.DIR_INSERT, Op.DIR_DELETE, Op.DIR_TOUCH, Op.DIR_EXPIRE,
            Op.DIR_READ, Op.DIR_CLEAR)


class DirectoryUnit(CommandUnit):
    OPS = (*_DIR_OPS, Op.ALLOC_STATUS)

    def responses(self, d):
        r = d.dresp
        fields = dict(dir_status=r.status.as_value(), evicted=r.evicted, link=r.link,
                      region=r.region, count=r.count, hash=r.hash, stamp=r.stamp, prev=r.prev,
                      next=r.next, victim=r.victim, expired=r.expired)
        out = {o: fields for o in _DIR_OPS}
        out[Op.ALLOC_STATUS] = dict(fifo_a=d.top.regions - d.a_next, fifo_b=d.b_level,
                                    live=d.a_next - d.b_level, commit_seq=d.commit_seq,
                                    token_count=d.tm.count, dir_now=d.dir_now)
        return out

    def dispatch(self, d):
        m, arg, MT = d.m, d.arg, d.config.max_tokens
        with m.Case(Op.ALLOC_STATUS.value):
            d.ok_fixed(Op.ALLOC_STATUS)
        with m.Case(Op.DIR_LOOKUP.value):
            with m.If(d.early(arg(Op.DIR_LOOKUP, "count") > MT)):
                d.reject(Status.BAD_ARG)
            with m.Else():
                m.next = "DIR_LOOKUP"
        with m.Case(Op.DIR_INSERT.value):
            with m.If(d.early((arg(Op.DIR_INSERT, "count") > MT)
                              | (arg(Op.DIR_INSERT, "region") >= d.top.regions)
                              | (arg(Op.DIR_INSERT, "flags") > 3))):
                d.reject(Status.BAD_ARG)
            with m.Elif(arg(Op.DIR_INSERT, "flags") & FLAG_EXISTING):
                m.next = "DIR_INSERT_EXISTING"
            with m.Else():
                m.next = "DIR_INSERT"
        for o, state in ((Op.DIR_DELETE, "DIR_DELETE"), (Op.DIR_TOUCH, "DIR_TOUCH"),
                         (Op.DIR_READ, "DIR_READ")):
            with m.Case(o.value):
                with m.If(d.early(arg(o, "link") >= d.top.links)):
                    d.reject(Status.BAD_ARG)
                with m.Else():
                    m.next = state
        with m.Case(Op.DIR_EXPIRE.value):
            m.next = "DIR_EXPIRE"
        with m.Case(Op.DIR_CLEAR.value):
            with m.If(d.length == 4):
                m.d.sync += d.commit_seq.eq(arg(Op.DIR_CLEAR, "next_seq"))
            m.next = "DIR_CLEAR"

    def states(self, d):
        m, arg = d.m, d.arg
        d.dir_call("DIR_LOOKUP", "DIR_DONE", op=DirOp.LOOKUP, count=arg(Op.DIR_LOOKUP, "count"),
                   hash=arg(Op.DIR_LOOKUP, "hash"))
        d.dir_call("DIR_INSERT", "DIR_DONE", op=DirOp.INSERT, count=arg(Op.DIR_INSERT, "count"),
                   hash=arg(Op.DIR_INSERT, "hash"),
                   evict=arg(Op.DIR_INSERT, "flags")[0] if FLAG_EVICT == 1 else 0)
        d.dir_call("DIR_INSERT_EXISTING", "DIR_DONE", op=DirOp.INSERT_EXISTING,
                   count=arg(Op.DIR_INSERT, "count"), hash=arg(Op.DIR_INSERT, "hash"),
                   region=arg(Op.DIR_INSERT, "region"))
        d.dir_call("DIR_DELETE", "DIR_DONE", op=DirOp.DELETE, link=arg(Op.DIR_DELETE, "link"))
        d.dir_call("DIR_TOUCH", "DIR_DONE", op=DirOp.TOUCH, link=arg(Op.DIR_TOUCH, "link"))
        d.dir_call("DIR_READ", "DIR_DONE", op=DirOp.READ, link=arg(Op.DIR_READ, "link"))
        d.dir_call("DIR_EXPIRE", "DIR_DONE", op=DirOp.EXPIRE,
                   max_age=arg(Op.DIR_EXPIRE, "max_age"))
        d.dir_call("DIR_CLEAR", "DIR_DONE", op=DirOp.CLEAR)
        with m.State("DIR_DONE"):
            d.respond(d.dir_to_status(d.dresp.status), RESPONSES[Op.DIR_LOOKUP].size)
