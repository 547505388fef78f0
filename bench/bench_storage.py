"""Storage path: DMA export/import cycles and efficiency, snapshot size, SD-SPI and SD native
4-bit throughput, synthesis of the DMA engine, the token memory and both SD controllers.

DMA figures come from the Amaranth simulator: ``DmaHarness`` (DMA engine + ring model + token
memory) with the sector-level storage model serving the storage port at its peak (one byte per
clock, no idle cycles), cycles counted from the command transfer to the response. SD-SPI figures
come from the Amaranth simulator with the bit-level card model (``sim/sdcard_model.py``: 2 filler
bytes before each read token, 3 busy bytes after each written block). SD native 4-bit figures
(``storage.sd4.*``) come from the Amaranth simulator with the bit-level 4-bit card model
(``sim/sd4_model.py``, timing in :data:`SD4_CARD`), SD clocks counted from the command transfer
on the storage port to the status (every SD clock of the command, the response, the data blocks
with their start/CRC/end bits, the card's latencies and busy time, and ``CMD12``), against the
4-bit limit of 4 bits per SD clock. ``python -m bench.bench_storage --sd4`` prints just those.
"""

import random

from amaranth.sim import Simulator

from ringkv.defs.config import DEFAULT_CONFIG
from ringkv.defs.record import RecordLayout, RecordStatus
from ringkv.host.record import import_record
from ringkv.hw.storage.dma import DmaEngine, DmaOp
from ringkv.hw.storage.port import SECTOR_BYTES, StorageError, StorageOp
from ringkv.hw.storage.sdnative import SDNativeController
from ringkv.hw.storage.sdspi import SDSPIController
from ringkv.hw.store.token_memory import TokenMemory
from ringkv.sim.ring_model import DmaHarness
from ringkv.sim.sd4_model import SDCard4, amaranth_sd4_card
from ringkv.sim.sdcard_model import SDCardSPI, amaranth_sd_card
from ringkv.sim.sector_model import SectorImage, serve_storage
from ringkv.sim.streams import tick_until, write_key

from .run import SYNTH_HEADER, synth_or_elaborate, synth_result, synth_rows, table

TITLE = "Storage path (DMA engine, snapshot records, SD card in SPI mode)"

DMA_COUNTS = (1, 128, 1000, 4096)
SIZE_COUNTS = (1, 64, 128, 1000, 4096, 16384)
SD_BENCH = dict(init_half_period=2, half_period=1, resp_timeout=16, token_timeout=200,
                busy_timeout=200, init_retries=8)
SD_BOARD = dict(init_half_period=63, half_period=1, resp_timeout=16, token_timeout=1 << 19,
                busy_timeout=1 << 20, init_retries=1 << 12)
REGIONS = 1024
#: the smoke run (``run(smoke=True)``): one record size, one DMA count, 1-sector transfers
SMOKE_COUNTS, SMOKE_SECTORS = (1,), (1,)
#: SD native controller in the bench: SD CLK = clk / 2 after initialisation
SD4_BENCH = dict(init_half_period=2, half_period=1, resp_timeout=64, data_timeout=1 << 12,
                 busy_timeout=1 << 12, init_retries=8)
#: SD native controller on the board (40 MHz: 400 kHz during initialisation, then 20 MHz)
SD4_BOARD = dict(init_half_period=50, half_period=1, resp_timeout=64, data_timeout=1 << 22,
                 busy_timeout=1 << 23, init_retries=1 << 12)
#: the card model's timing in the bench (SD clocks): response latency N_CR, read latency N_AC
#: (first block and between blocks), busy after each written block
SD4_CARD = dict(ncr=2, nac=4, block_gap=2, busy_clocks=8)


def dma_cycles(config, count: int, *, mac: bool = False, sealed: bool = False,
               width: int = 1) -> dict:
    """Clocks of one export and one import of ``count`` tokens: ``DmaHarness`` (with the record
    MAC when ``mac``), the storage model at its peak of one byte per clock, counted from the
    command's transfer to the response. ``sealed`` (with ``mac``): under key slot 0, and the
    record must verify as the golden sealed record under that key. ``width`` 4: the engine's
    wide storage port (the model serves a four-byte word a clock). Returns ``export``,
    ``import`` and ``record_bytes``."""
    if sealed and not mac:
        raise ValueError("a sealed transfer needs the MAC (mac=True)")
    lay = RecordLayout(config)
    h = DmaHarness(config, 2, mac=mac, width=width)
    image = SectorImage(sectors=2 * lay.sectors_per_region)
    key = random.Random(count).randbytes(32)
    clock = [0]
    out = {}

    async def counter(ctx):
        async for _ in ctx.tick():
            clock[0] += 1

    async def server(ctx):
        await serve_storage(ctx, h.storage, image)

    async def op(ctx, payload):
        if mac:
            payload = {**payload, "sealed": int(sealed), "slot": 0}
        ctx.set(h.cmd.valid, 1)
        ctx.set(h.cmd.payload, payload)
        await tick_until(ctx, h.cmd.ready)
        ctx.set(h.cmd.valid, 0)
        start = clock[0]
        ctx.set(h.resp.ready, 1)
        (resp,) = await tick_until(ctx, h.resp.valid, h.resp.payload)
        ctx.set(h.resp.ready, 0)
        return RecordStatus(resp.status.value), clock[0] - start

    async def body(ctx):
        if mac:
            await write_key(ctx, h.key_write, 0, 1, key)
        ctx.set(h.tap.meta_we, 1)
        for ring in range(config.layers * config.kv_heads):
            ctx.set(h.tap.meta_ring, ring)
            ctx.set(h.tap.meta_wcount, count)
            ctx.set(h.tap.meta_whead, (count - 1) % config.window)
            await ctx.tick()
        ctx.set(h.tap.meta_we, 0)
        out["export"] = await op(ctx, {"op": DmaOp.EXPORT, "region": 1, "hash": 5, "seq": 1})
        out["import"] = await op(ctx, {"op": DmaOp.IMPORT, "region": 1, "count": count,
                                       "hash": 5})

    sim = Simulator(h)
    sim.add_clock(25e-9)
    sim.add_testbench(counter, background=True)
    sim.add_testbench(server, background=True)
    sim.add_testbench(body)
    sim.run()
    for name in ("export", "import"):
        if out[name][0] is not RecordStatus.OK:
            raise RuntimeError(f"bench {name} of {count} tokens: {out[name][0]}")
    if sealed:       # the record is the golden sealed one: its tag verifies under the key
        status, _, _ = import_record(config, image.read, 1, keys={1: key})
        if status is not RecordStatus.OK:
            raise RuntimeError(f"the sealed record of {count} tokens does not verify: {status}")
    return {"export": out["export"][1], "import": out["import"][1],
            "record_bytes": lay.record_bytes(count)}


def sd_cycles(op, sectors, params=SD_BENCH):
    """Cycles from command transfer to status of an SD transfer (card already initialised),
    for the controller built with ``params``."""
    image = SectorImage(sectors=64)
    image.write(0, random.Random(1).randbytes(64 * 512))
    card = SDCardSPI(image)
    dut = SDSPIController(**params)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    clock = [0]
    out = {}
    s = dut.storage

    async def counter(ctx):
        async for _ in ctx.tick():
            clock[0] += 1

    async def card_proc(ctx):
        await amaranth_sd_card(ctx, dut.spi, card)

    async def transfer(ctx, op, lba, count):
        ctx.set(s.cmd.valid, 1)
        ctx.set(s.cmd.payload, {"op": op, "lba": lba, "count": count})
        await tick_until(ctx, s.cmd.ready)
        ctx.set(s.cmd.valid, 0)
        start = clock[0]
        ctx.set(s.rdata.ready, 1)
        ctx.set(s.status.ready, 1)
        ctx.set(s.wdata.valid, 1)
        ctx.set(s.wdata.payload, 0xA5)
        await tick_until(ctx, s.status.valid)
        ctx.set(s.wdata.valid, 0)
        ctx.set(s.status.ready, 0)
        return clock[0] - start

    async def body(ctx):
        await transfer(ctx, StorageOp.READ, 0, 1)              # initialises the card
        out["cycles"] = await transfer(ctx, op, 8, sectors)

    sim.add_testbench(counter, background=True)
    sim.add_testbench(card_proc, background=True)
    sim.add_testbench(body)
    sim.run()
    return out["cycles"]


def sd4_clocks(op, sectors, params=SD4_BENCH, card=SD4_CARD):
    """(SD clocks, system clocks) from the command transfer to the status of an SD native
    transfer of ``sectors`` (card already initialised), no stalls on the storage port."""
    image = SectorImage(sectors=1024)
    image.write(0, random.Random(1).randbytes(64 * 512))
    model = SDCard4(image, **card)
    dut = SDNativeController(**params)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    count = {"clk": 0, "sd": 0, "on": False}
    out = {}
    s = dut.storage

    async def counter(ctx):
        async for _, _, sdclk in ctx.tick().sample(dut.sd.clk):
            count["clk"] += 1
            if count["on"] and sdclk and not count["prev"]:
                count["sd"] += 1
            count["prev"] = sdclk

    async def card_proc(ctx):
        await amaranth_sd4_card(ctx, dut.sd, model)

    async def transfer(ctx, op, lba, n):
        ctx.set(s.cmd.valid, 1)
        ctx.set(s.cmd.payload, {"op": op, "lba": lba, "count": n})
        await tick_until(ctx, s.cmd.ready)
        ctx.set(s.cmd.valid, 0)
        count.update(on=True, sd=0)
        start = count["clk"]
        ctx.set(s.rdata.ready, 1)
        ctx.set(s.status.ready, 1)
        ctx.set(s.wdata.valid, 1)
        ctx.set(s.wdata.payload, 0xA5)
        (status,) = await tick_until(ctx, s.status.valid, s.status.payload)
        count["on"] = False
        ctx.set(s.wdata.valid, 0)
        ctx.set(s.status.ready, 0)
        if status.error != StorageError.OK:
            raise RuntimeError(f"bench sd4 {op.name} of {n}: error {status.error}")
        return count["sd"], count["clk"] - start

    async def body(ctx):
        await transfer(ctx, StorageOp.READ, 0, 1)              # initialises the card
        out["clocks"] = await transfer(ctx, op, 8, sectors)

    count["prev"] = 0
    sim.add_testbench(counter, background=True)
    sim.add_testbench(card_proc, background=True)
    sim.add_testbench(body)
    sim.run()
    if model.violations or model.crc_errors:
        raise RuntimeError(f"bench sd4: {model.violations} {model.crc_errors}")
    return out["clocks"]


def sd_session_cycles(mode: str, params: dict, transfers, card: dict | None = None) -> dict:
    """System clocks of SD transfers on one card, as a board does them after power-on.

    One simulation (Amaranth simulator, bit-level card model: ``mode`` "sd4" with
    :class:`~ringkv.sim.sd4_model.SDCard4` (``card``: its timing, default :data:`SD4_CARD`) or
    "spi" with :class:`~ringkv.sim.sdcard_model.SDCardSPI` (its default timing)) of the
    controller built with ``params``: first a 1-sector read at LBA 0 offered at reset (the
    controller initialises the card from reset and takes its first command when ready), then
    each ``(op, sectors)`` of ``transfers`` at LBA 8, no stalls on the storage port. Returns
    ``{(op_name, sectors): cycles}`` (cycles from the command transfer to the status) and
    ``"init"``: cycles from reset to the first transfer's status less a later 1-sector read's
    (so ``transfers`` must hold ``(READ, 1)``): the initialisation of the model card.
    """
    image = SectorImage(sectors=1024)
    image.write(0, random.Random(1).randbytes(64 * 512))
    if mode == "sd4":
        model = SDCard4(image, **(SD4_CARD if card is None else card))
        dut = SDNativeController(**params)
        pins, attach = dut.sd, amaranth_sd4_card
    elif mode == "spi":
        model = SDCardSPI(image)
        dut = SDSPIController(**params)
        pins, attach = dut.spi, amaranth_sd_card
    else:
        raise ValueError(f"mode must be sd4 or spi, not {mode!r}")
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    clock = [0]
    out = {}
    s = dut.storage

    async def counter(ctx):
        async for _ in ctx.tick():
            clock[0] += 1

    async def card_proc(ctx):
        await attach(ctx, pins, model)

    async def transfer(ctx, op, lba, n):
        ctx.set(s.cmd.valid, 1)
        ctx.set(s.cmd.payload, {"op": op, "lba": lba, "count": n})
        await tick_until(ctx, s.cmd.ready)
        ctx.set(s.cmd.valid, 0)
        start = clock[0]
        ctx.set(s.rdata.ready, 1)
        ctx.set(s.status.ready, 1)
        ctx.set(s.wdata.valid, 1)
        ctx.set(s.wdata.payload, 0xA5)
        (status,) = await tick_until(ctx, s.status.valid, s.status.payload)
        ctx.set(s.wdata.valid, 0)
        ctx.set(s.status.ready, 0)
        if status.error != StorageError.OK:
            raise RuntimeError(f"bench {mode} {op.name} of {n}: error {status.error}")
        return clock[0] - start

    async def body(ctx):
        await transfer(ctx, StorageOp.READ, 0, 1)       # offered at reset: waits for the init
        first = clock[0]
        for op, n in transfers:
            out[(op.name.lower(), n)] = await transfer(ctx, op, 8, n)
        out["init"] = first - out[("read", 1)]

    sim.add_testbench(counter, background=True)
    sim.add_testbench(card_proc, background=True)
    sim.add_testbench(body)
    sim.run()
    if mode == "sd4" and (model.violations or model.crc_errors):
        raise RuntimeError(f"bench sd4: {model.violations} {model.crc_errors}")
    return out


def sd4_record_cycles(sd: dict, op: str, lay: RecordLayout, count: int) -> int:
    """System clocks to move one record of ``count`` tokens over the SD native bus, from
    measured transfers ``sd[(op, sectors)]`` (:func:`sd_session_cycles`) of 1, 2, 8 and 16
    sectors: three transfers per record as the DMA issues them (header: 1 sector, ``CMD17`` /
    ``CMD24``; tokens and KV: ``CMD18`` / ``CMD25`` + ``CMD12`` when longer than a sector),
    a single sector as measured, several linear in the count from the 2- and 8-sector
    transfers (the model's per-block time is constant up to the SD clock's phase: the
    16-sector transfer is checked against the line, within 0.1 %)."""
    per = (sd[(op, 8)] - sd[(op, 2)]) / 6
    fixed = sd[(op, 2)] - 2 * per
    if abs(fixed + 16 * per - sd[(op, 16)]) > 1e-3 * sd[(op, 16)]:
        raise RuntimeError(f"sd4 {op}: 16 sectors {sd[(op, 16)]} off the 2/8-sector line")
    return round(sum(sd[(op, 1)] if k == 1 else fixed + per * k
                     for k in (1, lay.token_sectors(count), lay.kv_sectors(count)) if k))


def sd4_results(sector_counts=(1, 8)):
    """The ``storage.sd4.*`` figures: efficiency against the 4-bit limit, 1 and 8 sectors."""
    results = []
    for op in (StorageOp.READ, StorageOp.WRITE):
        for sectors in sector_counts:
            sd_clocks, cycles = sd4_clocks(op, sectors)
            ideal = 2 * SECTOR_BYTES * sectors          # 4 bits per SD clock
            name = f"storage.sd4.{op.name.lower()}_efficiency"
            results.append({
                "name": name if sectors == 8 else f"{name}_1",
                "value": round(ideal / sd_clocks, 4), "unit": "fraction",
                "params": {"sectors": sectors, "sd_clocks": sd_clocks, "ideal_sd_clocks": ideal,
                           "sys_cycles": cycles, "half_period": SD4_BENCH["half_period"],
                           "counted": "SD clocks from the command transfer to the status",
                           "card": ", ".join(f"{k}={v}" for k, v in SD4_CARD.items())}})
    return results


def sd_record_cycles(sd: dict, op: str, lay: RecordLayout, count: int) -> float:
    """Cycles to move one record of ``count`` tokens over the SD card, estimated from measured
    1- and 8-sector transfers ``sd[(op, sectors)]`` (``op`` "read" or "write"): linear in the
    sector count, three transfers per record (header, tokens, KV), as the DMA issues them."""
    per = (sd[(op, 8)] - sd[(op, 1)]) / 7          # cycles per extra sector
    fixed = sd[(op, 1)] - per                       # per-transfer overhead
    return sum(fixed + per * k for k in (1, lay.token_sectors(count), lay.kv_sectors(count))
               if k)


def run(smoke: bool = False):
    config = DEFAULT_CONFIG
    sizes, dma_counts = (SMOKE_COUNTS, SMOKE_COUNTS) if smoke else (SIZE_COUNTS, DMA_COUNTS)
    sectors = SMOKE_SECTORS if smoke else (1, 8)
    cfg = {"layers": config.layers, "kv_heads": config.kv_heads, "head_dim": config.head_dim,
           "window": config.window, "max_tokens": config.max_tokens}
    results = []
    lay = RecordLayout(config)
    for n in sizes:
        results.append({"name": "snapshot.bytes", "value": lay.record_bytes(n), "unit": "bytes",
                        "params": {**cfg, "count": n,
                                   "token_bytes": n * lay.token_bytes,
                                   "kv_bytes": 2 * config.layers * config.kv_heads
                                   * min(n, config.window) * config.head_dim}})
    for n in dma_counts:
        r = dma_cycles(config, n)
        size = r["record_bytes"]
        for name, cycles in (("export", r["export"]), ("import", r["import"])):
            results.append({"name": f"dma.{name}.cycles", "value": cycles, "unit": "cycles",
                            "params": {**cfg, "count": n, "record_bytes": size,
                                       "efficiency": round(size / cycles, 4),
                                       "peak_bytes_per_clock": 1}})
    for op, n in ((op, n) for op in (StorageOp.READ, StorageOp.WRITE) for n in sectors):
        cycles = sd_cycles(op, n)
        sclk = cycles / (2 * SD_BENCH["half_period"])
        results.append({"name": f"sdspi.{op.name.lower()}.cycles", "value": cycles,
                        "unit": "cycles",
                        "params": {"sectors": n, "half_period": SD_BENCH["half_period"],
                                   "sclk_cycles": sclk,
                                   "efficiency_vs_1bit": round(8 * 512 * n / sclk, 4),
                                   "card": "read_latency=2 bytes, busy=3 bytes"}})
    results += sd4_results(sectors)
    for core, comp, conf in (
            ("sdspi", SDSPIController(**SD_BOARD), SD_BOARD),
            ("sdnative", SDNativeController(**SD4_BOARD), SD4_BOARD),
            ("dma", DmaEngine(config, REGIONS), {**cfg, "regions": REGIONS}),
            ("token_memory", TokenMemory(config.max_tokens, config.token_width, 2),
             {"max_tokens": config.max_tokens, "token_width": config.token_width,
              "read_ports": 2})):
        synth = synth_or_elaborate(comp, f"storage_{core}", smoke=smoke)
        if synth is not None:
            results.append(synth_result(core, conf, synth))
    return results


def markdown(results) -> str:
    by = {}
    for r in results:
        by.setdefault(r["name"], []).append(r)
    out = []
    rows = []
    for r in by.get("snapshot.bytes", []):
        p = r["params"]
        rows.append([p["count"], p["token_bytes"], p["kv_bytes"], r["value"]])
    if rows:
        out.append("Snapshot size (default config, bytes written by one export: header sector + "
                   "token sectors + KV sectors). Beyond W = 128 tokens only the tokens grow "
                   "(2 bytes each):\n")
        out.append(table(["tokens n", "token bytes", "K+V bytes", "record bytes"], rows))
    rows = []
    exports = {r["params"]["count"]: r for r in by.get("dma.export.cycles", [])}
    imports = {r["params"]["count"]: r for r in by.get("dma.import.cycles", [])}
    for n in sorted(exports):
        e, i = exports[n], imports.get(n)
        rows.append([n, e["params"]["record_bytes"], e["value"],
                     f"{e['params']['efficiency']:.4f}",
                     i["value"] if i else "", f"{i['params']['efficiency']:.4f}" if i else ""])
    if rows:
        out.append("\nDMA engine, default config, storage port at its peak of 1 byte/clock "
                   "(sector model, no stalls); cycles from command to response; efficiency = "
                   "record bytes / cycles (target >= 0.90):\n")
        out.append(table(["tokens n", "record bytes", "export cycles", "export B/clk",
                          "import cycles", "import B/clk"], rows))
    rows = []
    for name in ("sdspi.read.cycles", "sdspi.write.cycles"):
        for r in by.get(name, []):
            p = r["params"]
            rows.append([name.split(".")[1], p["sectors"], r["value"], p["sclk_cycles"],
                         f"{p['efficiency_vs_1bit']:.4f}"])
    if rows:
        out.append("\nSD-SPI controller against the bit-level card model (SCLK = clk/2, "
                   "`half_period=1`; card: 2 filler bytes before a read token, 3 busy bytes "
                   "after a written block); efficiency = data bits / SCLK cycles, i.e. against "
                   "the 1-bit-per-SCLK limit. At a 25 MHz SCLK the limit is 3.125 MB/s:\n")
        out.append(table(["op", "sectors", "cycles", "SCLK cycles", "efficiency"], rows))
    sd = {(r["name"].split(".")[1], r["params"]["sectors"]): r["value"]
          for r in results if r["name"].startswith("sdspi.") and r["unit"] == "cycles"}
    sizes = {r["params"]["count"]: r["params"] for r in by.get("snapshot.bytes", [])}
    if len(sd) == 4 and sizes:
        lay = RecordLayout(DEFAULT_CONFIG)
        rows = []
        for n in (128, 1000, 16384):
            if n not in sizes:
                continue
            est = {op: sd_record_cycles(sd, op, lay, n) for op in ("read", "write")}
            rows.append([n, lay.record_bytes(n), round(est["write"]),
                         f"{est['write'] / 50e6 * 1e3:.1f}", round(est["read"]),
                         f"{est['read'] / 50e6 * 1e3:.1f}"])
        out.append("\nOne snapshot over the SD card (default config; 50 MHz clock, 25 MHz SCLK): "
                   "estimated from the measured 1- and 8-sector transfers above, linear in the "
                   "sector count, three transfers per export/import (header, tokens, KV); the "
                   "DMA adds fewer than 100 cycles. A real card's busy and read latency vary "
                   "(the model's are 3 and 2 bytes):\n")
        out.append(table(["tokens n", "record bytes", "export cycles", "export ms",
                          "import cycles", "import ms"], rows))
    rows = []
    for r in results:
        if r["name"].startswith("storage.sd4."):
            p = r["params"]
            rows.append([r["name"], p["sectors"], p["sd_clocks"], p["ideal_sd_clocks"],
                         f"{r['value']:.4f}"])
    if rows:
        card = next(r for r in results if r["name"].startswith("storage.sd4."))["params"]["card"]
        out.append("\nSD native 4-bit controller against the bit-level 4-bit card model "
                   f"({card}; SD clocks); SD clocks counted from the command transfer on the "
                   "storage port to the status, including the 8 idle clocks before each command, "
                   "the command and response, start/CRC/end bits, the card's latencies and busy "
                   "time and CMD12; efficiency = data clocks at 4 bits per SD clock / SD clocks "
                   "(target >= 0.90 for 8 sectors). On the board (40 MHz system clock) SD CLK "
                   "is 20 MHz: 10 MB/s at the 4-bit limit:\n")
        out.append(table(["figure", "sectors", "SD clocks", "ideal", "efficiency"], rows))
    synth = [r for r in results if r["unit"] == "MHz"]
    if synth:
        out.append("\nSynthesis (out of context, LFE5U-85F):\n")
        out.append(table(SYNTH_HEADER, synth_rows(synth)))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import json
    import sys
    if sys.argv[1:] != ["--sd4"]:
        sys.exit("usage: python -m bench.bench_storage --sd4  (the storage.sd4.* figures)")
    print(json.dumps(sd4_results(), indent=1))
