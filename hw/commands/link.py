"""Dispatcher unit: link and device identity (PING, VERSION, CONFIG_DIGEST, STATS, STATS_CLEAR).

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop`; the
payloads are :mod:`ringkv.defs.protocol`'s. PING echoes its payload byte for byte (state ``ECHO``);
the others answer a fixed record: ``n + 8`` bytes out, ~5 clocks after the request's last byte.
"""

from amaranth import Const

from ringkv.defs.hash import HASH_WIDTH
from ringkv.defs.protocol import GATEWARE_VERSION, PROTOCOL_VERSION, Op
from ringkv.defs.record import header_template

from ..protocol import Status
from .dispatch import CommandUnit

__all__ = ["LinkUnit"]


class LinkUnit(CommandUnit):
    OPS = (Op.PING, Op.VERSION, Op.CONFIG_DIGEST, Op.STATS, Op.STATS_CLEAR)
    BODIES = {"ECHO": "ECHO"}

    def responses(self, d):
        top, c, lay = d.top, d.config, d.layout
        template = header_template(c)
        return {
            Op.VERSION: dict(protocol=PROTOCOL_VERSION, gateware=GATEWARE_VERSION,
                             max_payload=top.max_payload, lanes=d.at.lanes, macs=d.at.macs,
                             regions=top.regions, links=top.links, buckets=top.buckets,
                             sectors_per_region=lay.sectors_per_region,
                             base_lba=top.base_lba, hash_width=HASH_WIDTH,
                             token_bytes=lay.token_bytes),
            Op.CONFIG_DIGEST: dict(digest=Const(int.from_bytes(c.digest(), "little"), 256),
                                   fields=Const(int.from_bytes(template[80:116], "little"),
                                                288)),
            Op.STATS: dict(cycles=d.cycles_at, attn_cycles=d.attn_cycles,
                           dma_cycles=d.dma_cycles, dir_cycles=d.dir_cycles, frames=d.frames,
                           frame_errors=d.frame_errors, rejected=d.rejected, queries=d.queries,
                           hits=d.hits, exports=d.exports),
        }

    def dispatch(self, d):
        m = d.m
        with m.Case(Op.PING.value):
            d.respond(Status.OK, d.length, "ECHO")
        for o in (Op.VERSION, Op.CONFIG_DIGEST, Op.STATS):
            with m.Case(o.value):
                d.ok_fixed(o)
        with m.Case(Op.STATS_CLEAR.value):
            m.d.comb += d.stats_clear.eq(1)
            d.respond(Status.OK)

    def states(self, d):
        m, dec, enc = d.m, d.dec, d.enc
        with m.State("ECHO"):
            m.d.comb += [enc.data.valid.eq(dec.data.valid),
                         enc.data.payload.eq(dec.data.payload.data),
                         dec.data.ready.eq(enc.data.ready)]
            with m.If(dec.data.valid & enc.data.ready):
                m.d.sync += d.idx.eq(d.idx + 1)
                with m.If(d.idx == d.rlen - 1):
                    m.next = "IDLE"
