"""A small ring-memory model implementing the attention core's ring-access port, and the DMA
test harness built around it.

:class:`RingMemoryModel` serves :class:`~ringkv.hw.attention.ring_port.RingPortSignature`
(flipped) from one block RAM of :func:`ringkv.defs.record.ring_bytes` bytes, four a word with
byte enables (``EB`` bytes per element from the configuration's numerics, byte address ``element
* EB + byte``, little-endian; byte writes and the four-byte writes of ``ring_wide``) plus
per-layer (count, head) registers, with the attention core's read timing (ring data two clocks
after ``ring_re``, metadata combinational, per ring ``layer * kv_heads + kv_head``). Its writes
land at once, where the core's land a clock after the strobe and a read strobed in that clock
returns 0 (``RING_WRITE_LATENCY``): the DMA never reads in the clock after a write, which the
top's tests on the real core would show as wrong exported bytes. A test access port ``tap`` lets
a testbench load and read the rings byte by byte in the same address space (sync read, one
clock; :func:`ringkv.host.record.ring_image` gives the bytes of element arrays).

:class:`DmaHarness` joins a :class:`~ringkv.hw.storage.dma.DmaEngine`, the ring model and a
:class:`~ringkv.hw.store.token_memory.TokenMemory`; the DMA's ``cmd``/``resp``/``storage`` and the
token memory's ``append``/``clear`` become top-level ports, so the same harness is the top of the
Amaranth-simulator tests and of the cocotb/Verilator tests.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ringkv.defs.record import RecordLayout
from ringkv.hw.attention.ring_port import RingPortSignature
from ringkv.hw.sdram.phy import SdramPinsSignature
from ringkv.hw.seal.key_slots import KeyWrite
from ringkv.hw.seal.mac import MacUnit
from ringkv.hw.storage.dma import DmaEngine
from ringkv.hw.storage.port import StoragePortSignature
from ringkv.hw.storage.sdnative import SDBusSignature, SDNativeController
from ringkv.hw.storage.sdspi import SDSPIController, SPISignature
from ringkv.hw.storage.tiered import TieredStorage
from ringkv.hw.store.token_memory import TokenMemory

from .sdram_store_sim import SdramStoreTop

__all__ = ["RingMemoryModel", "DmaHarness", "tap_signature", "tap_load", "tap_read"]


def tap_signature(config):
    ring_bytes = RingPortSignature.for_config(config).ring_bytes
    return wiring.Signature({
        "addr": Out(range(ring_bytes)), "we": Out(1), "wdata": Out(8), "rdata": In(8),
        "meta_ring": Out(8), "meta_we": Out(1), "meta_wcount": Out(32),
        "meta_whead": Out(16), "meta_rcount": In(32), "meta_rhead": In(16),
    })


class RingMemoryModel(wiring.Component):
    """Rings and per-layer metadata behind ``ring`` (the DMA side) and ``tap`` (the testbench)."""

    def __init__(self, config):
        self._config = config
        super().__init__({"ring": In(RingPortSignature.for_config(config)),
                          "tap": In(tap_signature(config))})

    def elaborate(self, platform):
        m = Module()
        c = self._config
        ring_bytes = RingPortSignature.for_config(c).ring_bytes
        # four bytes a word, byte enables: the ring port's byte and four-byte writes
        m.submodules.mem = mem = memory.Memory(shape=32, depth=-(-ring_bytes // 4), init=[])
        wp = mem.write_port(granularity=8)
        rp = mem.read_port(transparent_for=())
        tp = mem.read_port(transparent_for=())
        r = self.ring
        with m.If(r.ring_we & r.ring_wide):
            m.d.comb += [wp.addr.eq(r.ring_addr[2:]), wp.data.eq(r.ring_wdata), wp.en.eq(0xF)]
        with m.Elif(r.ring_we):
            m.d.comb += [wp.addr.eq(r.ring_addr[2:]), wp.data.eq(r.ring_wdata[:8].replicate(4)),
                         wp.en.eq(1 << r.ring_addr[:2])]
        with m.Else():
            m.d.comb += [wp.addr.eq(self.tap.addr[2:]), wp.data.eq(self.tap.wdata.replicate(4)),
                         wp.en.eq(Mux(self.tap.we, 1 << self.tap.addr[:2], 0))]
        # ring data two clocks after ring_re (RING_READ_LATENCY), as on the attention core
        sel, tap_sel = Signal(2), Signal(2)
        m.d.sync += [sel.eq(r.ring_addr[:2]), tap_sel.eq(self.tap.addr[:2])]
        rdata_q = Signal(8)
        m.d.sync += rdata_q.eq(rp.data.word_select(sel, 8))
        m.d.comb += [rp.addr.eq(r.ring_addr[2:]), rp.en.eq(r.ring_re), r.ring_rdata.eq(rdata_q),
                     tp.addr.eq(self.tap.addr[2:]),
                     self.tap.rdata.eq(tp.data.word_select(tap_sel, 8))]
        rings = c.layers * c.kv_heads
        counts = [Signal(32, name=f"count{i}") for i in range(rings)]
        heads = [Signal(16, name=f"head{i}") for i in range(rings)]
        for i in range(rings):
            with m.If(r.meta_we & (r.meta_ring == i)):
                m.d.sync += [counts[i].eq(r.meta_wcount), heads[i].eq(r.meta_whead)]
            with m.Elif(self.tap.meta_we & (self.tap.meta_ring == i)):
                m.d.sync += [counts[i].eq(self.tap.meta_wcount), heads[i].eq(self.tap.meta_whead)]
        # metadata reads are combinational, as on the attention core
        for port, rcount, rhead in ((r.meta_ring, r.meta_count, r.meta_head),
                                    (self.tap.meta_ring, self.tap.meta_rcount,
                                     self.tap.meta_rhead)):
            with m.Switch(port):
                for i in range(rings):
                    with m.Case(i):
                        m.d.comb += [rcount.eq(counts[i]), rhead.eq(heads[i])]
        return m


class DmaHarness(wiring.Component):
    """DMA engine + ring model + token memory, for tests and benchmarks.

    With ``sd`` (a dict of :class:`~ringkv.hw.storage.sdspi.SDSPIController` parameters) the storage
    port goes to an SD-SPI controller inside the harness and the SPI pins (``spi``) and
    ``sd_ready`` are the top-level ports instead of ``storage``: the board's storage path in SPI
    mode. With ``sd4`` (a dict of :class:`~ringkv.hw.storage.sdnative.SDNativeController`
    parameters) the same with the native 4-bit controller, its bus on ``sdbus``. With ``sdram``
    (``{"controller": {...}, "store": {...}}``: the parameters of
    :class:`~ringkv.sim.sdram_store_sim.SdramStoreTop`) the storage is the SDRAM sector store on
    an SDRAM controller, its pins on ``pins`` (``SdramPinsSignature``) and the end of its
    power-up on ``sd_ready``.

    With ``mac=True`` the engine's ``mac``, ``key_ids`` and ``key_set`` go to a
    :class:`~ringkv.hw.seal.mac.MacUnit` (the record MAC and its key slots), whose slots are written
    through ``key_write``: the sealed transfers. ``mac_hold`` (In 1) makes the unit refuse the
    engine's ``cmd`` while high, as while it serves another user (the tenant-seed derivation).
    Without ``mac`` they are left open (the engine's open transfers never use them).

    With ``width=4`` the engine's storage port moves four-byte words (``DmaEngine(width=4)``:
    an open import's K/V area a word a clock, into the ring model's four-byte writes): the
    port ``storage``, or with ``tiered`` a ``TieredStorage(width=4)`` whose SDRAM side is wide
    too (``sdram``'s ``store`` then needs ``width=4`` on a half-rate controller) and whose
    card side stays a port of bytes.

    With ``tiered`` (a dict of :class:`~ringkv.hw.storage.tiered.TieredStorage` parameters
    besides ``regions`` and ``sectors_per_region``, which come from the engine) the engine's
    storage port goes to a tiered storage: its ``card`` side to the SD controller of ``sd`` or
    ``sd4`` if given, else the port ``card``; its ``sdram`` side to the SDRAM store of
    ``sdram`` if given (then ``sd_ready`` is the SDRAM's power-up; with a card controller too,
    both), else the port ``sdram``.
    """

    def __init__(self, config, regions, *, sd=None, sd4=None, sdram=None, mac=False,
                 tiered=None, width=1):
        if width != 1 and tiered is None and (sd is not None or sd4 is not None
                                              or sdram is not None):
            raise ValueError("a wide storage port (width 4) goes to the port ``storage`` or "
                             "to a tiered storage")
        if tiered is not None:
            self._init_tiered(config, regions, sd, sd4, sdram, mac,
                              {**tiered, "width": tiered.get("width", width)})
            return
        self.tier = None
        if sum(x is not None for x in (sd, sd4, sdram)) > 1:
            raise ValueError("give one of sd (SPI mode), sd4 (native mode) or sdram")
        self._config = config
        self.dma = DmaEngine(config, regions, width=width)
        self.mac = MacUnit() if mac else None
        self.rings = RingMemoryModel(config)
        self.tmem = TokenMemory(config.max_tokens, config.token_width, read_ports=1)
        self.sd = (SDSPIController(**sd) if sd is not None else
                   SDNativeController(**sd4) if sd4 is not None else
                   SdramStoreTop(sdram["controller"], sdram.get("store")) if sdram is not None
                   else None)
        dma_sig = self.dma.signature.members
        storage = ({"storage": dma_sig["storage"]} if self.sd is None else
                   {"spi": Out(SPISignature()), "sd_ready": Out(1)} if sd is not None else
                   {"sdbus": Out(SDBusSignature()), "sd_ready": Out(1)} if sd4 is not None else
                   {"pins": Out(SdramPinsSignature(self.sd.ctrl.chip)), "sd_ready": Out(1)})
        super().__init__(self._members(config, dma_sig, storage, mac))

    def _init_tiered(self, config, regions, sd, sd4, sdram, mac, tiered):
        if sd is not None and sd4 is not None:
            raise ValueError("give one of sd (SPI mode) or sd4 (native mode)")
        self._config = config
        self.dma = DmaEngine(config, regions, width=tiered.get("width", 1))
        self.mac = MacUnit() if mac else None
        self.rings = RingMemoryModel(config)
        self.tmem = TokenMemory(config.max_tokens, config.token_width, read_ports=1)
        self.tier = TieredStorage(regions=regions,
                                  sectors_per_region=RecordLayout(config).sectors_per_region,
                                  kv_sector=RecordLayout(config).kv_sector, **tiered)
        self.sd = (SDSPIController(**sd) if sd is not None else
                   SDNativeController(**sd4) if sd4 is not None else None)
        self.sdram_top = (SdramStoreTop(sdram["controller"], sdram.get("store"))
                          if sdram is not None else None)
        ports = {}
        if self.sd is None:
            ports["card"] = Out(StoragePortSignature())
        elif sd is not None:
            ports["spi"] = Out(SPISignature())
        else:
            ports["sdbus"] = Out(SDBusSignature())
        if self.sdram_top is None:
            ports["sdram"] = Out(StoragePortSignature(self.tier.width))
        else:
            ports["pins"] = Out(SdramPinsSignature(self.sdram_top.ctrl.chip))
        if self.sd is not None or self.sdram_top is not None:
            ports["sd_ready"] = Out(1)
        super().__init__(self._members(config, self.dma.signature.members, ports, mac))

    @staticmethod
    def _members(config, dma_sig, storage, mac):
        return {
            "cmd": dma_sig["cmd"],
            "resp": dma_sig["resp"],
            **storage,
            "busy": Out(1),
            "tap": In(tap_signature(config)),
            "tok_append": In(wiring.Signature({"valid": Out(1),
                                               "payload": Out(config.token_width)})),
            "tok_clear": In(1),
            "tok_count": Out(range(config.max_tokens + 1)),
            **({"key_write": In(stream.Signature(KeyWrite)), "mac_hold": In(1)} if mac else {}),
        }

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma = dma = self.dma
        m.submodules.rings = rings = self.rings
        m.submodules.tmem = tmem = self.tmem
        connect(m, flipped(self.cmd), dma.cmd)
        connect(m, flipped(self.resp), dma.resp)
        if self.tier is not None:
            self._elaborate_tiered(m, dma)
        elif self.sd is None:
            connect(m, flipped(self.storage), dma.storage)
        else:
            m.submodules.sd = self.sd
            connect(m, dma.storage, self.sd.storage)
            if isinstance(self.sd, SDSPIController):
                connect(m, flipped(self.spi), self.sd.spi)
            elif isinstance(self.sd, SdramStoreTop):
                connect(m, flipped(self.pins), self.sd.pins)
            else:
                connect(m, flipped(self.sdbus), self.sd.sd)
            m.d.comb += self.sd_ready.eq(self.sd.ready)
        connect(m, dma.ring, rings.ring)
        connect(m, dma.tokens, tmem.read_port(0))
        connect(m, flipped(self.tap), rings.tap)
        if self.mac is not None:
            m.submodules.mac = unit = self.mac
            port = dma.mac
            m.d.comb += [unit.cmd.valid.eq(port.cmd.valid & ~self.mac_hold),
                         port.cmd.ready.eq(unit.cmd.ready & ~self.mac_hold),
                         unit.cmd.payload.eq(port.cmd.payload)]
            connect(m, port.i, unit.i)
            connect(m, unit.o, port.o)
            connect(m, flipped(self.key_write), unit.key_write)
            m.d.comb += [unit.abort.eq(port.abort), dma.key_ids.eq(unit.key_ids),
                         dma.key_set.eq(unit.set)]
        m.d.comb += [tmem.append.valid.eq(self.tok_append.valid),
                     tmem.append.payload.eq(self.tok_append.payload)]
        m.d.comb += [tmem.clear.eq(self.tok_clear), self.tok_count.eq(tmem.count),
                     self.busy.eq(dma.busy)]
        return m

    def _elaborate_tiered(self, m, dma):
        m.submodules.tier = tier = self.tier
        connect(m, dma.storage, tier.storage)
        ready = []
        if self.sd is None:
            connect(m, flipped(self.card), tier.card)
        else:
            m.submodules.sd = self.sd
            connect(m, tier.card, self.sd.storage)
            if isinstance(self.sd, SDSPIController):
                connect(m, flipped(self.spi), self.sd.spi)
            else:
                connect(m, flipped(self.sdbus), self.sd.sd)
            ready.append(self.sd.ready)
        if self.sdram_top is None:
            connect(m, flipped(self.sdram), tier.sdram)
        else:
            m.submodules.sdram_top = self.sdram_top
            connect(m, tier.sdram, self.sdram_top.storage)
            connect(m, flipped(self.pins), self.sdram_top.pins)
            ready.append(self.sdram_top.ready)
        if ready:
            both = ready[0] if len(ready) == 1 else ready[0] & ready[1]
            m.d.comb += self.sd_ready.eq(both)


async def tap_load(ctx, h, config, image, count, head, tokens=None, *, heads=None):
    """Through a :class:`DmaHarness`'s tap: the ring port's bytes ``image``, every ring's
    metadata (``count`` and ``head``, or ring ``r``'s ``heads[r]``); with ``tokens``, token
    memory cleared and filled with them. A testbench coroutine."""
    ctx.set(h.tap.we, 1)
    for i, byte in enumerate(image):
        ctx.set(h.tap.addr, i)
        ctx.set(h.tap.wdata, int(byte))
        await ctx.tick()
    ctx.set(h.tap.we, 0)
    ctx.set(h.tap.meta_we, 1)
    for ring in range(config.layers * config.kv_heads):
        ctx.set(h.tap.meta_ring, ring)
        ctx.set(h.tap.meta_wcount, count)
        ctx.set(h.tap.meta_whead, heads[ring] if heads else head)
        await ctx.tick()
    ctx.set(h.tap.meta_we, 0)
    if tokens is None:
        return
    ctx.set(h.tok_clear, 1)
    await ctx.tick()
    ctx.set(h.tok_clear, 0)
    ctx.set(h.tok_append.valid, 1)
    for tok in tokens:
        ctx.set(h.tok_append.payload, tok)
        await ctx.tick()
    ctx.set(h.tok_append.valid, 0)


async def tap_read(ctx, h, size) -> bytes:
    """The ring port's first ``size`` bytes through a :class:`DmaHarness`'s tap."""
    got = bytearray()
    for i in range(size):
        ctx.set(h.tap.addr, i)
        await ctx.tick()
        got.append(ctx.get(h.tap.rdata))
    return bytes(got)
