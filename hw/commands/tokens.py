"""Dispatcher unit: token memory and hash (TOKENS_APPEND, TOKENS_WRITE, TOKENS_READ, HASH_QUERY).

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop`. Tokens
arrive as ``token_bytes`` little-endian bytes each, one byte per clock; TOKENS_READ sends them back
a byte a clock after 2 clocks (the next token read while one is sent); HASH_QUERY runs the hash
feeder (``n + 3`` clocks).
"""

from amaranth import Cat, Signal

from ringkv.defs.hash import hash_seed
from ringkv.defs.protocol import REQUESTS, Op

from ..protocol import Op as LinkOp
from ..protocol import Status
from .dispatch import CommandUnit

__all__ = ["TokenUnit"]


class TokenUnit(CommandUnit):
    OPS = (Op.TOKENS_APPEND, Op.TOKENS_WRITE, Op.TOKENS_READ, Op.HASH_QUERY)
    BODIES = {"TOKENS": "TOKENS_READ_ISSUE"}

    def signals(self, d):
        TB = d.layout.token_bytes
        self.tok_acc = Signal(8 * TB)
        self.tok_b = Signal(range(max(TB, 2)))
        self.tok_word = Signal(8 * TB)
        self.tok_reg = Signal(8 * TB)
        d.m.d.comb += self.tok_word.eq(d.rd0.data)

    def responses(self, d):
        return {Op.TOKENS_WRITE: dict(count=d.tm.count), Op.TOKENS_APPEND: dict(count=d.tm.count),
                Op.HASH_QUERY: dict(hash=d.hash_val)}

    def dispatch(self, d):
        m, tm, arg, length = d.m, d.tm, d.arg, d.length
        TB, MT = d.layout.token_bytes, d.config.max_tokens
        with m.Case(Op.TOKENS_APPEND.value):
            n = arg(Op.TOKENS_APPEND, "n")
            with m.If(d.early(length != REQUESTS[Op.TOKENS_APPEND].size + n * TB)):
                d.reject(Status.BAD_LENGTH)
            with m.Elif(d.early(tm.count + n > MT)):
                d.reject(Status.BAD_ARG)
            with m.Else():
                m.d.sync += [d.tok_i.eq(0), self.tok_b.eq(0)]
                m.next = "TOKENS_IN"
        with m.Case(Op.TOKENS_WRITE.value):
            n = arg(Op.TOKENS_WRITE, "n")
            off = arg(Op.TOKENS_WRITE, "offset")
            with m.If(d.early(length != REQUESTS[Op.TOKENS_WRITE].size + n * TB)):
                d.reject(Status.BAD_LENGTH)
            with m.Elif(d.early((off > tm.count) | (off + n > MT))):
                d.reject(Status.BAD_ARG)
            with m.Else():
                m.d.sync += [d.tok_i.eq(0), self.tok_b.eq(0)]
                m.next = "TOKENS_IN"
        with m.Case(Op.TOKENS_READ.value):
            n = arg(Op.TOKENS_READ, "n")
            off = arg(Op.TOKENS_READ, "offset")
            with m.If(d.early((off + n > tm.count) | (n * TB > d.top.max_payload))):
                d.reject(Status.BAD_ARG)
            with m.Elif(d.early(n == 0)):
                d.respond(Status.OK)
            with m.Else():
                m.d.sync += d.h_i.eq(off)       # read port 0's address (dispatch.py)
                d.respond(Status.OK, d.early((n * TB)[:16]), "TOKENS")
        with m.Case(Op.HASH_QUERY.value):
            n = arg(Op.HASH_QUERY, "n")
            with m.If(d.early(n > tm.count)):
                d.reject(Status.BAD_ARG)
            with m.Elif(d.early(n == 0)):
                m.d.sync += d.hash_val.eq(hash_seed(d.config))
                d.ok_fixed(Op.HASH_QUERY)
            with m.Else():
                m.d.sync += [d.h_n.eq(n), d.h_i.eq(0)]
                m.next = "HASH_QUERY_HASH"

    def states(self, d):
        m, tm, dec, enc, arg = d.m, d.tm, d.dec, d.enc, d.arg
        TB = d.layout.token_bytes
        op, tok_i, tok_b, tok_acc = d.op, d.tok_i, self.tok_b, self.tok_acc
        # ---- token stream in (TOKENS_APPEND / TOKENS_WRITE) ----
        with m.State("TOKENS_IN"):
            is_write = op == LinkOp.TOKENS_WRITE
            # the tokens end with the payload (DISPATCH checked ``length`` to be the record's
            # size plus ``n`` tokens, and ARGS took the record): ``d.more`` is ``tok_i != n``,
            # a register (the 32-bit compare in front of ``dec.data.ready`` and the dispatcher's
            # count led the half-rate board build's paths at 60 MHz)
            off = arg(Op.TOKENS_WRITE, "offset")
            m.d.comb += dec.data.ready.eq(d.more)
            with m.If(~d.more):
                m.next = "TOKENS_DONE"
            with m.Elif(dec.data.valid):
                byte = dec.data.payload.data
                m.d.sync += tok_acc.word_select(tok_b, 8).eq(byte)
                with m.If(tok_b == TB - 1):
                    token = Cat(tok_acc[:8 * (TB - 1)], byte) if TB > 1 else byte
                    m.d.sync += [tok_b.eq(0), tok_i.eq(tok_i + 1)]
                    with m.If(is_write):
                        m.d.comb += [tm.write.addr.eq(off + tok_i), tm.write.data.eq(token),
                                     tm.write.en.eq(1)]
                    with m.Else():
                        m.d.comb += [tm.append.valid.eq(1), tm.append.payload.eq(token)]
                with m.Else():
                    m.d.sync += tok_b.eq(tok_b + 1)
        with m.State("TOKENS_DONE"):
            with m.If(op == LinkOp.TOKENS_WRITE):
                m.d.comb += [tm.count_we.eq(1),
                             tm.set_count.eq(arg(Op.TOKENS_WRITE, "offset")
                                             + arg(Op.TOKENS_WRITE, "n"))]
            m.next = "TOKENS_RESPOND"
        with m.State("TOKENS_RESPOND"):
            d.ok_fixed(Op.TOKENS_APPEND)

        # ---- TOKENS_READ: 2 clocks, then a byte a clock ----
        # The bytes leave from ``tok_reg``, a register: the token memory's block RAM has no
        # output register (5.8 ns clock-to-out), and its data through the byte select into the
        # response encoder in the same clock was the half-rate board build's critical path
        # (docs/BOARD.md). The read of the next token is issued as the current one is loaded
        # (port 0 holds its data while ``en`` is low), so after ISSUE and LOAD a token takes
        # ``TB`` clocks; a read past the last token is issued and never used.
        with m.State("TOKENS_READ_ISSUE"):
            m.d.comb += d.rd0.en.eq(1)             # at h_i (dispatch.py): token `offset`
            m.d.sync += d.h_i.eq(d.h_i + 1)
            m.next = "TOKENS_READ_LOAD"
        with m.State("TOKENS_READ_LOAD"):
            m.d.comb += d.rd0.en.eq(1)             # the next token
            m.d.sync += [self.tok_reg.eq(self.tok_word), tok_b.eq(0), d.h_i.eq(d.h_i + 1)]
            m.next = "TOKENS_READ_SEND"
        with m.State("TOKENS_READ_SEND"):
            m.d.comb += [enc.data.valid.eq(1),
                         enc.data.payload.eq(self.tok_reg.word_select(tok_b, 8))]
            with m.If(enc.data.ready):
                m.d.sync += [d.idx.eq(d.idx + 1), tok_b.eq(tok_b + 1)]
                with m.If(d.idx == d.rlen - 1):
                    m.next = "IDLE"
                with m.Elif(tok_b == TB - 1):
                    m.d.comb += d.rd0.en.eq(1)
                    m.d.sync += [self.tok_reg.eq(self.tok_word), tok_b.eq(0),
                                 d.h_i.eq(d.h_i + 1)]

        # ---- HASH_QUERY ----
        d.hash_call("HASH_QUERY_HASH", "HASH_QUERY_DONE")
        with m.State("HASH_QUERY_DONE"):
            d.ok_fixed(Op.HASH_QUERY)
