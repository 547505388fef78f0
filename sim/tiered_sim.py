"""The tiered storage in the Amaranth simulator: the harness of ``tests/hw/storage/test_tiered.py``
and of the figures in ``docs/blocks/tiered_storage.md``.

:func:`run_tiered` drives a :class:`~ringkv.hw.storage.tiered.TieredStorage`'s ``storage`` port
with a script of reads and writes (``("r", lba, count)``, ``("w", lba, data)``) and of the
directory's requests (``("d", region)``: a deleted record's region on ``drop``; ``("n",)``:
the residents' count), serves its ``card`` and ``sdram`` ports from two
:class:`~ringkv.sim.sector_model.SectorImage`\\ s with
:func:`~ringkv.sim.sector_model.serve_storage` (random idle and stalls, errors on demand through
its per-command ``fail`` hook), and watches every stream: per
operation it returns the status, the bytes, which backend got a command (with its payload), and
the block's own clocks (``setup``: the command's transfer on ``storage`` to the backend's
``cmd.valid``; ``tail``: the backend's status, the later one of a write to both tiers, or the
last read word's transfer to the initiator if later and the status OK, to the initiator's
``status.valid``), for comparison with
:class:`~ringkv.host.golden.tiered.GoldenTieredStorage`.

A power cut is the end of a run (``cut_at``: the simulation stops at that clock, wherever it
is); the next run on the same card image, with a new block and the SDRAM image overwritten
with noise (:func:`lose_sdram`), is the power coming back.
"""

import random
from dataclasses import dataclass, field

from amaranth import Array, Cat, Const, Elaboratable, Module, Signal
from amaranth.hdl import Assert
from amaranth.sim import Simulator

from ringkv.hw.storage.port import SECTOR_BYTES, StorageError, StorageOp
from ringkv.hw.storage.tiered import TieredStorage
from ringkv.hw.store.hot_tier import Op, Status

from .ring_model import tap_load, tap_read
from .sector_model import SectorImage, serve_storage
from .storage_host import storage_read, storage_write
from .streams import stream_get, stream_put, tick_until

__all__ = ["run_tiered", "TieredRun", "Observed", "lose_sdram", "check_run",
           "random_script", "import_clocks", "TieredFormalHarness"]


@dataclass
class Observed:
    """One operation as seen on the block's ports."""
    status: StorageError | None = None
    data: bytes = b""                  # a read's bytes
    card: tuple | None = None          # (op, lba, count) of the card's command, if any
    sdram: tuple | None = None         # ... of the SDRAM's
    setup: int | None = None           # clocks: storage cmd transfer -> first backend cmd.valid
    tail: int | None = None            # (later) backend status or last read word -> status.valid
    card_status: StorageError | None = None
    sdram_status: StorageError | None = None
    expect: bytes | None = None        # a read: the card's bytes when it ended (None: beyond)
    residents: int | None = None       # ("n",): the count on ``residents``


@dataclass
class TieredRun:
    ops: list = field(default_factory=list)    # Observed per operation started
    cut: bool = False                          # the run ended by a power cut
    clocks: int = 0


def lose_sdram(image: SectorImage, rng):
    """The SDRAM after a power cut: noise."""
    for lba in range(image.sectors):
        image.write(lba, rng.randbytes(SECTOR_BYTES))


def run_tiered(params: dict, script, card: SectorImage, sdram: SectorImage, *, seed=0,
               idle=0.0, stall=0.0, hold=0.0, card_fail=None, sdram_fail=None, cut_at=None,
               max_cycles=5_000_000, bug=None) -> TieredRun:
    """Run ``script`` on a fresh ``TieredStorage(**params)`` (``bug``: a broken variant) whose
    backends are ``card`` and ``sdram``. ``idle``/``stall``/``hold``: the chances of an idle
    clock or a withheld ready on every stream, the storage port's (:mod:`ringkv.sim.storage_host`)
    and the backends' (:func:`serve_sectors`). ``card_fail``/``sdram_fail``: the backends'
    ``fail``. ``cut_at``: stop (a power cut) at that clock after the hot tier's reset sweep."""
    dut = TieredStorage(**params, _bug=bug)
    run = TieredRun()
    rng = random.Random(seed)
    clock = {"n": 0}
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(_server(dut.card, card, random.Random(rng.random()), idle, stall,
                              card_fail), background=True)
    sim.add_testbench(_server(dut.sdram, sdram, random.Random(rng.random()), idle, stall,
                              sdram_fail), background=True)
    cur = {"op": None, "t0": None, "last_status": None, "last_ok": None, "last_word": None,
           "done": 0}

    async def monitor(ctx):
        st, cp, sp = dut.storage, dut.card, dut.sdram
        sigs = (st.cmd.valid, st.cmd.ready, cp.cmd.valid, cp.cmd.ready, cp.cmd.payload,
                sp.cmd.valid, sp.cmd.ready, sp.cmd.payload, cp.status.valid, cp.status.ready,
                cp.status.payload, sp.status.valid, sp.status.ready, sp.status.payload,
                st.status.valid, st.rdata.valid, st.rdata.ready)
        prev_c = prev_s = prev_st = 0
        async for _, _, *v in ctx.tick().sample(*sigs):
            (c_valid, c_ready, cc_valid, cc_ready, cc_p, sc_valid, sc_ready, sc_p, cs_valid,
             cs_ready, cs_p, ss_valid, ss_ready, ss_p, st_valid, rd_valid, rd_ready) = v
            clock["n"] += 1
            n = clock["n"]
            o = cur["op"]
            if c_valid and c_ready:
                cur["t0"] = n
            if o is not None:
                if cc_valid and not prev_c:
                    o.card = (StorageOp(cc_p.op), cc_p.lba, cc_p.count)
                    o.setup = n - cur["t0"] if o.setup is None else o.setup
                if sc_valid and not prev_s:
                    o.sdram = (StorageOp(sc_p.op), sc_p.lba, sc_p.count)
                    o.setup = n - cur["t0"] if o.setup is None else o.setup
                if cs_valid and cs_ready:
                    o.card_status = StorageError(cs_p.error)
                    cur["last_status"], cur["last_ok"] = n, o.card_status == StorageError.OK
                if ss_valid and ss_ready:
                    o.sdram_status = StorageError(ss_p.error)
                    cur["last_status"], cur["last_ok"] = n, o.sdram_status == StorageError.OK
                if rd_valid and rd_ready:
                    cur["last_word"] = n
                if st_valid and not prev_st and cur["last_status"] is not None:
                    # an OK status waits for the read words still on their way; an error
                    # status does not
                    after = cur["last_status"]
                    if cur["last_ok"]:
                        after = max(after, cur["last_word"] or 0)
                    o.tail = n - after
            prev_c, prev_s, prev_st = cc_valid, sc_valid, st_valid

    async def bench(ctx):
        # the hot tier's reset sweep
        await ctx.tick().repeat(max(params["regions"], params.get("slots", 256)) + 2)
        clock["start"] = clock["n"]
        for op in script:
            o = Observed()
            cur["op"], cur["last_status"], cur["last_word"] = o, None, None
            run.ops.append(o)
            if op[0] == "d":
                await stream_put(ctx, dut.drop, op[1])
                o.status = StorageError.OK
            elif op[0] == "n":
                await stream_put(ctx, dut.residents_req, 0)
                o.residents = await stream_get(ctx, dut.residents)
                o.status = StorageError.OK
            elif op[0] == "r":
                o.status, o.data = await storage_read(ctx, dut.storage, op[1], op[2], rng=rng,
                                                      stall=stall, hold=hold)
                if card.in_range(op[1], op[2]):
                    o.expect = card.read(op[1], op[2])
            else:
                o.status, _ = await storage_write(ctx, dut.storage, op[1], op[2], rng=rng,
                                                  idle=idle, hold=hold)
            await ctx.tick()
            cur["op"] = None

    async def cutter(ctx):
        await ctx.tick().repeat(max(params["regions"], params.get("slots", 256)) + 2 + cut_at)
        run.cut = True

    async def limit(ctx):
        for _ in range(max_cycles):
            await ctx.tick()
        raise TimeoutError(f"the script not done after {max_cycles} clocks")

    sim.add_process(monitor)
    sim.add_testbench(limit, background=True)
    sim.add_testbench(cutter if cut_at is not None else bench)
    if cut_at is not None:
        sim.add_testbench(bench, background=True)
    sim.run()
    run.clocks = clock["n"]
    return run


def _server(port, image, rng, idle, stall, fail):
    async def serve(ctx):
        await serve_storage(ctx, port, image, rng=rng, idle=idle, stall=stall, fail=fail)
    return serve


def check_run(golden, script, run: TieredRun) -> list[str]:
    """Every difference between ``run`` and the golden model ``golden`` (stepped here, from the
    state it is in), and every read that returned other bytes than the card held: an empty list
    for a correct run. An operation cut short by a power cut is left out."""
    from ringkv.host.golden.tiered import READ, WRITE

    found = []
    for k, (op, o) in enumerate(zip(script, run.ops)):
        if o.status is None:              # cut short by the power cut
            break
        where = f"op {k} {op[0]}"
        if op[0] in "dn":
            if o.card or o.sdram:
                found.append(f"{where}: a backend command {o.card} {o.sdram}")
            if op[0] == "d":
                golden.drop(op[1])
            elif o.residents != golden.residents():
                found.append(f"{where}: {o.residents} residents, golden {golden.residents()}")
            continue
        count = op[2] if op[0] == "r" else len(op[2]) // SECTOR_BYTES
        kind = READ if op[0] == "r" else WRITE
        route = golden.command(kind, op[1], count)
        where = f"op {k} {op[0]} lba {op[1]} count {count}"
        want_card = (StorageOp(kind), op[1], count) if route.tier != "sdram" else None
        want_sd = ((StorageOp(kind), route.sdram_lba, count) if route.tier != "card"
                   else None)
        if (o.card, o.sdram) != (want_card, want_sd):
            # the golden model cannot follow a run that went elsewhere: stop here
            return found + [f"{where}: card {o.card} sdram {o.sdram}, golden {route.tier} "
                            f"{want_card} {want_sd}"]
        if o.setup != route.setup:
            found.append(f"{where}: setup {o.setup} clocks, golden {route.setup}")
        want_status = o.card_status if route.tier != "sdram" else o.sdram_status
        tail = route.tail
        if route.tier == "both":
            want_status, tail = golden.finish(o.card_status.value, o.sdram_status.value)
        if o.tail != tail:
            found.append(f"{where}: tail {o.tail} clocks, golden {tail}")
        if o.status != StorageError(want_status):
            found.append(f"{where}: status {o.status}, golden {StorageError(want_status)}")
        if kind == READ and o.status == StorageError.OK and o.data != o.expect:
            found.append(f"{where}: read returned other bytes than the card holds "
                         f"(from {route.tier})")
    return found


def random_script(rng, params: dict, card_sectors: int, n: int, *, data=None, drops=False):
    """``n`` random operations in the tiered storage's use: the DMA's exports into a region
    (tokens, K/V, header last; sometimes cut short or with another write between), its
    imports (header, tokens, K/V of the last export's shape), and raw reads and writes of any
    sector: single sectors, over two regions, outside the record area, ``count == 0``, past
    the card's end. ``data(n_sectors)`` gives the bytes of a write (default random).
    ``drops``: also the directory's deletes (``("d", region)``, between an export's writes
    too) and residents' counts (``("n",)``)."""
    spr, base, regions = params["sectors_per_region"], params.get("base_lba", 0), params["regions"]
    data = data or (lambda n: rng.randbytes(n * SECTOR_BYTES))
    # a region's record: tokens from sector 1, K/V from ``kv`` (a fixed sector, as the DMA's:
    # ``params["kv_sector"]`` if given)
    kv = params.get("kv_sector") or max(2, spr // 2)
    shapes = {}
    script = []

    def region_lba(r):
        return base + r * spr

    while len(script) < n:
        roll = rng.random()
        r = rng.choice([0, regions - 1, rng.randrange(regions)])
        if roll < 0.35:
            t = rng.randint(1, kv - 1)
            k = rng.randint(1, spr - kv)
            steps = [("w", region_lba(r) + 1, data(t)), ("w", region_lba(r) + kv, data(k)),
                     ("w", region_lba(r), data(1))]
            if rng.random() < 0.15:
                steps = steps[:rng.randint(1, 2)]
            if rng.random() < 0.15:
                other = rng.randrange(card_sectors)
                steps.insert(rng.randint(0, len(steps) - 1), ("w", other, data(1)))
            if drops and rng.random() < 0.2:
                steps.insert(rng.randint(0, len(steps)),
                             ("d", rng.choice([r, rng.randrange(regions)])))
            script += steps
            shapes[r] = (t, k)
        elif roll < 0.65 and shapes:
            r = rng.choice(sorted(shapes))
            t, k = shapes[r]
            script += [("r", region_lba(r), 1), ("r", region_lba(r) + 1, t),
                       ("r", region_lba(r) + kv, k)]
        elif roll < 0.80:
            lba = rng.randrange(card_sectors + 2)
            script.append(("r", lba, rng.choice([0, 1, 1, 2, spr])))
        elif roll < 0.90:
            lba = rng.randrange(card_sectors)
            script.append(("w", lba, data(1)))
        elif roll < 0.95:
            lba = region_lba(r) + spr - 1
            script.append(("w", lba, data(2)))             # over two regions (or the end)
        else:
            script.append(("w", rng.randrange(card_sectors), b""))     # count 0
        if drops and rng.random() < 0.15:
            script.append(("d", rng.randrange(regions)) if rng.random() < 0.6 else ("n",))
    return script


#: the SD native controller and the card model of the figures (as ``bench/bench_storage.py``'s
#: ``SD4_BENCH`` and ``SD4_CARD``: SD CLK = clk / 2 once initialised)
SD4_FIGURES = dict(init_half_period=2, half_period=1, resp_timeout=64, data_timeout=1 << 12,
                   busy_timeout=1 << 12, init_retries=8)
SD4_CARD_FIGURES = dict(ncr=2, nac=4, block_gap=2, busy_clocks=8)


def _random_rings(config, rng):
    """Rings of random element words, ``(layers, kv_heads, 2, window, head_dim)``."""
    import numpy as np

    from ringkv.host.record import ring_dtype
    shape = (config.layers, config.kv_heads, 2, config.window, config.head_dim)
    dt = ring_dtype(config)
    return np.frombuffer(rng.randbytes(int(np.prod(shape)) * dt.itemsize),
                         dtype=dt).reshape(shape).copy()


async def _timed_op(ctx, h, clock, payload):
    """One DMA command on a ``DmaHarness``: (its status, the clocks ``clock["n"]`` counted
    from the command's transfer to the response's)."""
    from ringkv.defs.record import RecordStatus
    await stream_put(ctx, h.cmd, payload)
    start = clock["n"]
    resp = await stream_get(ctx, h.resp)
    return RecordStatus(resp.status.value), clock["n"] - start


def import_clocks(config, count: int, *, mhz=40.0, chip=None, seed=0,
                  slot_token_sectors=None, sdram_rate: int = 1, width: int = 1) -> dict:
    """Exact clocks of the DMA engine's EXPORT and IMPORT of one record of ``count`` tokens
    through a tiered storage whose card side is the SD native controller on the bit-level
    4-bit card model and whose SDRAM side is the SDRAM sector store on the SDRAM controller and
    the pin-level SDRAM model, one system clock of ``mhz`` for all (Amaranth simulator).

    Three records go to regions 0, 1, 2 with two slots, so region 0's copy is evicted: its
    import reads the card (``import_card``), region 2's reads the slot (``import_sdram``); both
    must hit and restore the rings. Clocks from the DMA command's transfer to its response's.
    ``slot_token_sectors``: the tier's compact slots (``None``: whole regions).
    ``sdram_rate`` 2: the SDRAM controller at half rate (CL 3, the SDRAM at twice ``mhz``);
    ``width`` 4 (at half rate only): the engine, the tier and the SDRAM store on four-byte
    words (an open import's K/V area a word a clock from the slot).
    Returns ``{"export": [...], "import_card", "import_sdram", "sectors"}``."""
    import numpy as np

    from ringkv.defs.hot_tier import slot_sectors
    from ringkv.defs.record import RecordLayout, RecordStatus
    from ringkv.defs.sdram import DEFAULT_CHIP
    from ringkv.hw.storage.dma import DmaOp
    from ringkv.sim.ring_model import DmaHarness

    from .sd4_model import SDCard4, amaranth_sd4_card
    from .sdram_model import add_controller_clocks, amaranth_sdram, model_for_controller

    rng = random.Random(seed)
    chip = chip or DEFAULT_CHIP.scaled(power_up_ns=500)
    tck = 1000.0 / mhz
    lay = RecordLayout(config)
    regions, spr = 4, lay.sectors_per_region
    h = DmaHarness(config, regions, tiered=dict(slots=2, slot_token_sectors=slot_token_sectors,
                                                width=width),
                   sd4=SD4_FIGURES,
                   sdram={"controller": dict(chip=chip, tck_ns=tck, cl=2 if sdram_rate == 1
                                             else 3, rate=sdram_rate),
                          "store": dict(sectors=2 * slot_sectors(lay, slot_token_sectors),
                                        width=width)})
    card = SDCard4(SectorImage(None, ((regions * spr + 1023) // 1024) * 1024),
                   **SD4_CARD_FIGURES)
    ctrl = h.sdram_top.ctrl
    sdram = model_for_controller(ctrl, seed=seed)
    sim = Simulator(h)
    pin_domain = add_controller_clocks(sim, ctrl)
    sim.add_testbench(amaranth_sdram(sdram, h.pins, domain=pin_domain), background=True)

    async def card_proc(ctx):
        await amaranth_sd4_card(ctx, h.sdbus, card)
    sim.add_testbench(card_proc, background=True)
    clock = {"n": 0}
    out = {"export": []}

    async def counter(ctx):
        async for _ in ctx.tick():
            clock["n"] += 1

    from ringkv.host.record import ring_image
    records = [(_random_rings(config, rng),
                [rng.randrange(1 << config.token_width) for _ in range(count)])
               for _ in range(3)]

    async def bench(ctx):
        await tick_until(ctx, h.sd_ready)
        for r, (rings, tokens) in enumerate(records):
            await tap_load(ctx, h, config, ring_image(config, rings), count, 0, tokens)
            status, clocks = await _timed_op(ctx, h, clock, {
                "op": DmaOp.EXPORT, "region": r, "hash": r + 1, "seq": r + 1})
            assert status == RecordStatus.OK, status
            out["export"].append(clocks)
        for r, key in ((0, "import_card"), (2, "import_sdram")):
            image = ring_image(config, np.zeros_like(records[r][0]))
            await tap_load(ctx, h, config, image, 0, 0, records[r][1])
            status, clocks = await _timed_op(ctx, h, clock, {
                "op": DmaOp.IMPORT, "region": r, "count": count, "hash": r + 1})
            assert status == RecordStatus.OK, (key, status)
            out[key] = clocks

    sim.add_process(counter)
    sim.add_testbench(bench)
    sim.run()
    if card.violations or card.crc_errors or sdram.violations:
        raise RuntimeError(f"violations: {card.violations} {card.crc_errors} "
                           f"{sdram.violations}")
    out["sectors"] = 1 + lay.token_sectors(count) + lay.kv_sectors(count)
    return out


class TieredFormalHarness(Elaboratable):
    """A small :class:`~ringkv.hw.storage.tiered.TieredStorage` (``formal=True``: 2 regions of
    2 sectors from card sector 0, 2 slots from SDRAM sector 0, 2-bit stamps) under free inputs,
    with a shadow of what each sector holds, for :func:`ringkv.sim.formal.bmc`.

    Free: the initiator's commands (``lba`` 0..7: the 4 sectors of the record area and 4
    beyond; ``count`` 0..3), the directory's drops (any region, at any time) and residents'
    requests, every ``valid`` and ``ready`` on every stream, the backends' statuses and
    errors; assumed only that a backend answers a command it has taken, once, and sends read
    bytes only then (a storage-port target's contract).

    The shadow, per card sector and per SDRAM sector (abstract data: which write last wrote
    it, and whether that write ended ``OK`` on that medium): a write's id is the count of write
    commands the initiator has given; a backend's write command sets its sectors' tag to that
    id and their ``ok`` to 0, its ``OK`` status sets ``ok``. Two sectors with the same tag,
    both ``ok``, hold the same bytes (the tee gives both media the same bytes: the simulation
    tests check that).

    Properties (``checks``): ``read`` -- whenever the SDRAM side is offered a read command,
    each of its sectors holds, ``ok``, the same write as the card sector the initiator asked for
    (so the bytes served from SDRAM are the card's); ``copies`` -- at every clock, every sector
    inside the written extents of a slot the hot tier holds valid (as its responses tell: a
    COMMIT makes a slot valid, an ALLOC, ABORT, DROP or CLEAR not) equals its region's card
    sector in the same sense.

    ``compact``: compact slots -- regions of 3 sectors (the header, a gap sector, a K/V sector:
    ``kv_sector=2``, ``slot_token_sectors=0``) in slots of 2; the shadow maps a slot's sectors to
    its region's (the K/V sector one down) and the ``read`` property compares the card sector
    asked for with the SDRAM sector read."""

    REGIONS, SLOTS = 2, 2
    #: ``full``: the state after two exports: region s committed in slot s (the hot tier's
    #: ``_full`` start), slot 0 with its header sector written (extent [0, 1): SDRAM sector 1
    #: holds no write of the card's), slot 1 with both (extent [0, 2)); every card sector and
    #: the written SDRAM sectors hold write 0, OK
    FULL_EXTENTS = [[(0, 1)], [(0, 2)]]
    #: ``full`` with compact slots: slot 0 with its header, slot 1 with header and K/V (region
    #: offsets: the extents are kept in the card's offsets)
    FULL_EXTENTS_COMPACT = [[(0, 1)], [(0, 1), (2, 3)]]

    def __init__(self, *, bug=None, checks=("read", "copies"), full=False, compact=False):
        self.compact = bool(compact)
        self.SPR = 3 if compact else 2
        self.SLOT_SPR = 2
        #: region offset -> slot offset (``None``: the gap)
        self.slot_offset = [0, None, 1] if compact else [0, 1]
        extents = self.FULL_EXTENTS_COMPACT if compact else self.FULL_EXTENTS
        self.dut = TieredStorage(regions=self.REGIONS, sectors_per_region=self.SPR,
                                 slots=self.SLOTS, stamp_width=2, formal=True, _bug=bug,
                                 _full=full, _extents_init=extents if full else None,
                                 kv_sector=2 if compact else None,
                                 slot_token_sectors=0 if compact else None)
        self.checks = tuple(checks)
        self.full = bool(full)
        self.free = {
            "op": Signal(), "lba": Signal(3), "count": Signal(2), "cmd_valid": Signal(),
            "wvalid": Signal(), "rready": Signal(), "sready": Signal(),
            "drop_valid": Signal(), "drop_region": Signal(), "res_valid": Signal(),
            "res_ready": Signal(),
        }
        for side in ("card", "sdram"):
            for name in ("cmd_ready", "wready", "rvalid", "svalid"):
                self.free[f"{side}_{name}"] = Signal(name=f"{side}_{name}")
            self.free[f"{side}_error"] = Signal(3, name=f"{side}_error")

    def ports(self):
        return list(self.free.values())

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        f = self.free
        st = dut.storage
        m.d.comb += [st.cmd.valid.eq(f["cmd_valid"]), st.cmd.payload.op.eq(f["op"]),
                     st.cmd.payload.lba.eq(f["lba"]), st.cmd.payload.count.eq(f["count"]),
                     st.wdata.valid.eq(f["wvalid"]), st.rdata.ready.eq(f["rready"]),
                     st.status.ready.eq(f["sready"]),
                     dut.drop.valid.eq(f["drop_valid"]), dut.drop.payload.eq(f["drop_region"]),
                     dut.residents_req.valid.eq(f["res_valid"]),
                     dut.residents.ready.eq(f["res_ready"])]
        n_sectors = {"card": self.REGIONS * self.SPR, "sdram": self.SLOTS * self.SLOT_SPR}
        write_id = Signal(4)
        cur_lba = Signal(3)
        with m.If(st.cmd.valid & st.cmd.ready):
            m.d.sync += cur_lba.eq(st.cmd.payload.lba)
            with m.If(st.cmd.payload.op == StorageOp.WRITE):
                m.d.sync += write_id.eq(write_id + 1)
        tags, oks = {}, {}
        for side in ("card", "sdram"):
            port = getattr(dut, side)
            busy = Signal(name=f"{side}_busy")
            write = Signal(name=f"{side}_write")
            lo = Signal(3, name=f"{side}_lo")
            n = Signal(2, name=f"{side}_n")
            sectors = n_sectors[side]
            tags[side] = [Signal(4, name=f"{side}_tag{k}") for k in range(sectors)]
            held = [self.full and (side == "card" or k != 1) for k in range(sectors)]
            oks[side] = [Signal(name=f"{side}_ok{k}", init=held[k]) for k in range(sectors)]
            m.d.comb += [port.cmd.ready.eq(f[f"{side}_cmd_ready"] & ~busy),
                         port.wdata.ready.eq(f[f"{side}_wready"] & busy),
                         port.rdata.valid.eq(f[f"{side}_rvalid"] & busy & ~write),
                         port.status.valid.eq(f[f"{side}_svalid"] & busy),
                         port.status.payload.error.eq(f[f"{side}_error"])]
            c = port.cmd.payload
            with m.If(port.cmd.valid & port.cmd.ready):
                m.d.sync += [busy.eq(1), write.eq(c.op == StorageOp.WRITE), lo.eq(c.lba),
                             n.eq(c.count)]
                with m.If(c.op == StorageOp.WRITE):
                    for k in range(sectors):
                        with m.If((c.lba <= k) & (k < c.lba + c.count)):
                            m.d.sync += [tags[side][k].eq(write_id), oks[side][k].eq(0)]
            with m.If(port.status.valid & port.status.ready):
                m.d.sync += busy.eq(0)
                with m.If(write & (port.status.payload.error == StorageError.OK)):
                    for k in range(sectors):
                        with m.If((lo <= k) & (k < lo + n)):
                            m.d.sync += oks[side][k].eq(1)

        def same(sd_sector, card_sector):
            """SDRAM sector ``sd_sector`` holds the card sector's write (indices: Values)."""
            out = Signal()
            sd_tag = Array(tags["sdram"])[sd_sector]
            sd_ok = Array(oks["sdram"])[sd_sector]
            card_tag = Array(tags["card"])[card_sector]
            card_ok = Array(oks["card"])[card_sector]
            m.d.comb += out.eq(sd_ok & card_ok & (sd_tag == card_tag))
            return out

        if "read" in self.checks:
            sp = dut.sdram.cmd
            with m.If(sp.valid & (sp.payload.op == StorageOp.READ)):
                for i in range(self.SPR):
                    with m.If(i < sp.payload.count):
                        m.d.comb += [Assert(sp.payload.lba + i < n_sectors["sdram"]),
                                     Assert(cur_lba + i < n_sectors["card"]),
                                     Assert(same((sp.payload.lba + i)[:3],
                                                 (cur_lba + i)[:3]))]

        # the hot tier's slots, as its responses tell
        hot = dut.hot
        valid = [Signal(name=f"shadow_valid{s}", init=self.full) for s in range(self.SLOTS)]
        region_of = [Signal(name=f"shadow_region{s}", init=s if self.full else 0)
                     for s in range(self.SLOTS)]
        h_op, h_region, h_slot = Signal(4), Signal(), Signal()
        with m.If(hot.i.valid & hot.i.ready):
            m.d.sync += [h_op.eq(hot.i.payload.op), h_region.eq(hot.i.payload.region),
                         h_slot.eq(hot.i.payload.slot)]
        resp = hot.o.payload
        with m.If(hot.o.valid & hot.o.ready & (resp.status == Status.OK)):
            with m.Switch(h_op):
                with m.Case(Op.COMMIT):
                    m.d.sync += [Array(valid)[resp.slot[:1]].eq(1),
                                 Array(region_of)[resp.slot[:1]].eq(h_region)]
                with m.Case(Op.ALLOC, Op.DROP):
                    m.d.sync += Array(valid)[resp.slot[:1]].eq(0)
                with m.Case(Op.ABORT):
                    m.d.sync += Array(valid)[h_slot].eq(0)
                with m.Case(Op.CLEAR):
                    m.d.sync += [v.eq(0) for v in valid]
        if "copies" in self.checks:
            for s in range(self.SLOTS):
                for o in range(self.SPR):
                    written = Cat(*[(e.lo <= o) & (o < e.hi)
                                    for e in dut.extent_rows[s]]).any()
                    if self.slot_offset[o] is None:
                        # the gap: no extent may hold it
                        m.d.comb += Assert(~(valid[s] & written))
                        continue
                    with m.If(valid[s] & written):
                        m.d.comb += Assert(same(Const(s * self.SLOT_SPR + self.slot_offset[o], 3),
                                                region_of[s] * self.SPR + o))
        return m


def switch_clocks(config, count: int, *, mhz=60.0, chip=None, seed=0, sdram_rate: int = 2,
                  width: int = 4, slot_token_sectors=None) -> dict:
    """Exact clocks of the switch to a resident conversation: the DMA engine's IMPORT of one
    record of ``count`` tokens from its SDRAM slot, through the tiered storage, the SDRAM
    sector store and the SDRAM controller (``sdram_rate``; CL 3 at half rate, 2 at full) on
    the pin-level SDRAM model, one system clock of ``mhz`` (Amaranth simulator); ``width``:
    the engine's, the tier's and the store's transfer width (4: the four-byte import; at half
    rate only). The record is first exported (to the card, served by the sector model at a
    byte a clock, and to the slot); the import must hit the slot (no card command), return
    ``OK`` and leave the rings the export read. Returns ``{"export", "import_sdram",
    "sectors", "kv_sectors"}``: clocks from the DMA command's transfer to its response's."""

    from ringkv.defs.hot_tier import slot_sectors
    from ringkv.defs.record import RecordLayout, RecordStatus
    from ringkv.defs.sdram import DEFAULT_CHIP
    from ringkv.host.record import ring_image, rings_from_image
    from ringkv.hw.storage.dma import DmaOp
    from ringkv.sim.ring_model import DmaHarness

    from .sdram_model import add_controller_clocks, amaranth_sdram, model_for_controller

    rng = random.Random(seed)
    chip = chip or DEFAULT_CHIP.scaled(power_up_ns=500)
    lay = RecordLayout(config)
    regions = 2
    h = DmaHarness(config, regions, tiered=dict(slots=2, slot_token_sectors=slot_token_sectors,
                                                width=width),
                   sdram={"controller": dict(chip=chip, tck_ns=1000.0 / mhz,
                                             cl=2 if sdram_rate == 1 else 3, rate=sdram_rate),
                          "store": dict(sectors=2 * slot_sectors(lay, slot_token_sectors),
                                        width=width)})
    card = SectorImage(None, regions * lay.sectors_per_region)
    ctrl = h.sdram_top.ctrl
    sdram = model_for_controller(ctrl, seed=seed)
    sim = Simulator(h)
    pin_domain = add_controller_clocks(sim, ctrl)
    sim.add_testbench(amaranth_sdram(sdram, h.pins, domain=pin_domain), background=True)
    card_log = []

    async def card_proc(ctx):
        await serve_storage(ctx, h.card, card, log=card_log)
    sim.add_testbench(card_proc, background=True)
    clock = {"n": 0}
    out = {}

    async def counter(ctx):
        async for _ in ctx.tick():
            clock["n"] += 1

    rings = _random_rings(config, rng)
    image = ring_image(config, rings)
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]
    head = (count - 1) % config.window

    async def bench(ctx):
        await tick_until(ctx, h.sd_ready)
        await tap_load(ctx, h, config, image, count, head, tokens)
        status, out["export"] = await _timed_op(ctx, h, clock, {
            "op": DmaOp.EXPORT, "region": 1, "hash": 7, "seq": 1})
        assert status == RecordStatus.OK, status
        await tap_load(ctx, h, config, bytes(len(image)), 0, config.window - 1)
        n_card = len(card_log)
        status, out["import_sdram"] = await _timed_op(ctx, h, clock, {
            "op": DmaOp.IMPORT, "region": 1, "count": count, "hash": 7})
        assert status == RecordStatus.OK, status
        assert len(card_log) == n_card, "the import read the card"
        out["rings"] = await tap_read(ctx, h, len(image))

    sim.add_process(counter)
    sim.add_testbench(bench)
    sim.run()
    if sdram.violations:
        raise RuntimeError(f"SDRAM violations: {sdram.violations}")
    got = rings_from_image(config, out.pop("rings"))
    slots = [(head - min(count, config.window) + 1 + t) % config.window
             for t in range(min(count, config.window))]
    if not (got[:, :, :, slots, :] == rings[:, :, :, slots, :]).all():
        raise RuntimeError("the import from SDRAM did not restore the rings")
    out["sectors"] = 1 + lay.token_sectors(count) + lay.kv_sectors(count)
    out["kv_sectors"] = lay.kv_sectors(count)
    return out
