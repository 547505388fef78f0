"""The whole system: resume by import versus recompute as the session grows, and where the time
of the decode loop goes.

Everything runs on the simulated device of ``make demo`` — ``RingKVTop`` built with Verilator at
the board's configuration (default config, P=4 lanes x M=8 MACs), reached over a TCP socket by
the host's :class:`~ringkv.host.link.Link` and :class:`~ringkv.host.fpga_device.FpgaDevice`,
storage in an image file — with the host's numpy model and chunked prefill (chunk 64, the
scheduler's default). What is measured, and how exactly:

* **link bytes**: every byte the host sent and received (``Link.stats``): exact;
* **device cycles**: the cycle counters of the top (``QUERY``'s own cycle count from its start
  to its response; ``STATS`` busy counters of the attention core and the DMA): exact, with the
  storage port served at its peak of one byte per clock;
* **host seconds**: wall-clock time of the numpy model between link requests on this machine
  (the only figure that is not a cycle count).

Resume by **import** is measured directly for every N: ``write_tokens`` + ``QUERY`` (hash,
lookup, record read with token comparison, CRC and config check, K/V into the rings). The
records for N != ``DIRECT_N`` are written into the image by the golden record encoder
(bit-exact with the DMA's export, tested in ``tests/test_dma.py``) with random K/V bytes and
registered by the device's own power-on recovery, exactly as after a power cycle (its clocks
from reset to ready are the ``recovery`` figure; an empty card is measured too); the import moves
the same bytes and makes the same checks whatever the K/V values are. The ``DIRECT_N`` record is
exported by the device itself after a real recompute, imported back, and the rings are compared
with the exported ones byte for byte; then the decode loop runs from the imported state and
every generated token is checked against the software-only run (``FixedBackend``).

Resume by **recompute** (chunked prefill of the session's tokens through the model, attention on
the device) is measured directly for ``DIRECT_N`` tokens, chunk by chunk. Once the ring is full
every chunk costs the same link bytes and device cycles — the bench checks that the last chunks
of the direct run are identical — so recompute(N) for larger N is the direct run's chunks plus
steady chunks, composed from those exact figures.

On the board (ULX3S-85F) the figures are converted with the board top's own parameters
(:class:`~ringkv.boards.ulx3s.ULX3STop`): system clock, UART baud rate (10 bits per byte: start,
8 data, stop; one request in flight, so the two directions add), and the SD card's SPI clock,
whose record transfers are estimated from 1- and 8-sector transfers of the SD-SPI controller
against the bit-level card model at the board's divider (as in the storage bench). Link,
device and host times are added (no overlap assumed: an upper bound where the device computes
while the UART is still sending).
"""

import inspect
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench_storage import SD_BENCH, sd_cycles, sd_record_cycles
from bench.run import table

TITLE = "Whole system: resume by import vs recompute, decode loop"

SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384)
DIRECT_N = 512          # recomputed, exported and imported for real
CHUNK = 64              # the scheduler's prefill chunk
DECODE = 16             # tokens generated from the imported state
REGIONS = 16
LANES, MACS = 4, 8      # the board top's core
UART_BITS = 10          # start + 8 data + stop


def board_params() -> dict:
    """System clock, UART baud rate and SD-SPI divider of the ULX3S top with its defaults."""
    from ringkv.boards.ulx3s import ULX3STop, pll_params
    defaults = {k: p.default for k, p in inspect.signature(ULX3STop).parameters.items()
                if p.default is not inspect.Parameter.empty}
    clk_hz = pll_params(25.0, defaults["sys_mhz"])["f_out_mhz"] * 1e6
    sd_half = max(1, round(clk_hz / (2 * defaults["sd_mhz"] * 1e6)))
    return {"clk_hz": clk_hz, "baud": defaults["baud"], "sd_half_period": sd_half,
            "sclk_hz": clk_hz / (2 * sd_half)}


class _Meter:
    """Deltas of link bytes, device busy counters and host wall time around a block."""

    def __init__(self, link, dev):
        self.link, self.dev = link, dev
        self.in_link = 0.0
        request = link.request

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return request(*args, **kwargs)
            finally:
                self.in_link += time.perf_counter() - t
        link.request = timed

    def _stats(self):
        from ringkv.defs.protocol import RESPONSES, Op
        saved = dict(self.link.stats), self.in_link
        r = RESPONSES[Op.STATS].unpack(self.dev._call(Op.STATS))
        self.link.stats.update(saved[0])          # the meter's own request is not counted
        self.in_link = saved[1]
        return r

    def run(self, fn):
        """``fn()``'s result and a dict of what it cost."""
        s0, b0, t0, l0 = self._stats(), dict(self.link.stats), time.perf_counter(), self.in_link
        result = fn()
        wall, in_link = time.perf_counter() - t0, self.in_link - l0
        s1, b1 = self._stats(), dict(self.link.stats)
        return result, {
            "bytes_to_device": b1["bytes_out"] - b0["bytes_out"],
            "bytes_from_device": b1["bytes_in"] - b0["bytes_in"],
            "requests": b1["requests"] - b0["requests"],
            "attn_cycles": s1["attn_cycles"] - s0["attn_cycles"],
            "dma_cycles": s1["dma_cycles"] - s0["dma_cycles"],
            "host_s": wall - in_link,
        }


def _craft_image(path, config, tokens, sweep, sectors):
    """Write records of ``tokens[:n]`` (random K/V) for every ``n`` of ``sweep`` into the image
    at regions 1, 2, ... with the golden encoder; region 0 stays free."""
    from ringkv.defs.hash import hash_seed
    from ringkv.defs.record import SECTOR, RecordLayout
    from ringkv.host.golden_hash import sequence_hash
    from ringkv.host.record import encode_record
    lay = RecordLayout(config)
    rng = np.random.default_rng(3)
    seed = hash_seed(config)
    with open(path, "wb") as f:
        f.truncate(sectors * SECTOR)
        for i, n in enumerate(sweep):
            rings = rng.integers(0, 256, (config.layers, config.kv_heads, 2, config.window,
                                          config.head_dim), dtype=np.uint8)
            writes = encode_record(config, tokens, rings, count=n,
                                   ring_head=(n - 1) % config.window,
                                   prefix_hash=sequence_hash(tokens[:n], seed),
                                   commit_seq=i + 1)
            for offset, data in writes:
                f.seek((lay.region_lba(i + 1) + offset) * SECTOR)
                f.write(data)


def _measure(workdir: Path) -> dict:
    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.defs.record import RecordLayout
    from ringkv.host.fpga_device import FpgaDevice
    from ringkv.host.link import Link
    from ringkv.host.model import BOS, FixedBackend, Model, limit_blas_threads
    from ringkv.sim.harness import SimDevice, build_top

    config = DEFAULT_CONFIG
    limit_blas_threads(1)
    lay = RecordLayout(config)
    rng = random.Random(11)
    tokens = [BOS] + [rng.randrange(256) for _ in range(max(SWEEP) - 1)]
    crafted = [n for n in SWEEP if n != DIRECT_N]
    top = {"regions": REGIONS, "lanes": LANES, "macs": MACS}
    _, sectors = build_top(config, **top)
    image = workdir / "system.img"
    _craft_image(image, config, tokens, crafted, sectors)
    model = Model(config)
    out = {"import": {}, "chunks": [], "decode": [], "recovery": {}}
    empty = workdir / "empty.img"
    empty.write_bytes(b"")
    with SimDevice(empty, config=config, prebuilt=True, log=workdir / "sim-empty.log",
                   **top) as sim:
        out["recovery"]["empty"] = FpgaDevice(Link(sim.url, timeout=600), config).wait_ready()
    with SimDevice(image, config=config, prebuilt=True, log=workdir / "sim.log", **top) as sim:
        link = Link(sim.url, timeout=600)
        dev = FpgaDevice(link, config)
        dev.check_config()
        st = dev.wait_ready()           # the device's own recovery from power-on
        out["recovery"]["crafted"] = st
        found = sorted(c for c, _, _ in dev.directory())
        if found != crafted or st["live"] != len(crafted):
            raise RuntimeError(f"recovery found {found}, expected records of {crafted}")
        meter = _Meter(link, dev)

        # recompute DIRECT_N tokens, chunk by chunk, as the scheduler's miss path does
        dev.reset()
        dev.write_tokens(tokens[:DIRECT_N])
        last = None
        for s in range(0, DIRECT_N, CHUNK):
            last, cost = meter.run(lambda s=s: model.forward(tokens[s:s + CHUNK], s, dev)[-1])
            out["chunks"].append(cost)
        pending = int(np.argmax(last))      # the next token, fed after the resume
        exported, _ = dev.snapshot()
        before = dev.counters["device_cycles"]
        (_, moved), out["export"] = meter.run(lambda: dev.export(tokens[:DIRECT_N]))
        out["export"]["record_bytes"] = moved
        out["export"]["cycles"] = dev.counters["device_cycles"] - before

        # resume by import at every N (a fresh ring each time)
        for n in SWEEP:
            _, out.setdefault("write", {})[n] = meter.run(lambda n=n: dev.write_tokens(tokens[:n]))
            dev.reset()
            before = dev.counters["device_cycles"]
            result, cost = meter.run(lambda n=n: dev.query(tokens[:n]))
            if not result.hit:
                raise RuntimeError(f"import of {n} tokens missed: {result.reason}")
            cost["query_cycles"] = dev.counters["device_cycles"] - before
            cost["record_bytes"] = lay.record_bytes(n)
            out["import"][n] = cost
            if n == DIRECT_N:
                imported, _ = dev.snapshot()
                if not np.array_equal(imported, exported):
                    raise RuntimeError("the imported rings differ from the exported ones")
                # decode from the imported state; every token against the software-only run
                generated, pos = [pending], DIRECT_N
                for _ in range(DECODE):
                    logits, cost = meter.run(
                        lambda t=generated[-1], p=pos: model.forward([t], p, dev)[0])
                    out["decode"].append(cost)
                    generated.append(int(np.argmax(logits)))
                    pos += 1
                expect = model.generate(tokens[:DIRECT_N], 0, FixedBackend(config, lanes=LANES),
                                        DECODE + 1, CHUNK)
                if generated != expect:
                    raise RuntimeError(f"decode after import: {generated} != {expect}")
                out["decode_tokens"] = generated
    return out


def _same(a, b):
    keys = ("bytes_to_device", "bytes_from_device", "requests", "attn_cycles", "dma_cycles")
    return all(a[k] == b[k] for k in keys)


def run():
    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.defs.record import RecordLayout
    from ringkv.hw.storage import StorageOp
    config = DEFAULT_CONFIG
    lay = RecordLayout(config)
    board = board_params()
    sd_params = {**SD_BENCH, "half_period": board["sd_half_period"]}
    sd = {(op.name.lower(), k): sd_cycles(op, k, sd_params)
          for op in (StorageOp.READ, StorageOp.WRITE) for k in (1, 8)}
    with tempfile.TemporaryDirectory(prefix="ringkv-bench-") as tmp:
        m = _measure(Path(tmp))

    clk, baud = board["clk_hz"], board["baud"]

    def link_s(cost):
        return (cost["bytes_to_device"] + cost["bytes_from_device"]) * UART_BITS / baud

    # steady state: once the ring is full, every chunk costs the same
    chunks = m["chunks"]
    full = -(-config.window // CHUNK)          # chunks before the ring is full
    steady = chunks[-1]
    if len(chunks) - full < 3 or not all(_same(c, steady) for c in chunks[full:]):
        raise RuntimeError(f"prefill chunks after the ring filled are not identical: {chunks}")
    host_steady = sum(c["host_s"] for c in chunks[full:]) / (len(chunks) - full)
    common = {"layers": config.layers, "q_heads": config.q_heads, "kv_heads": config.kv_heads,
              "head_dim": config.head_dim, "window": config.window, "lanes": LANES,
              "macs": MACS, "chunk": CHUNK, "clk_mhz": clk / 1e6, "uart_baud": baud,
              "sd_sclk_mhz": board["sclk_hz"] / 1e6}
    results = []
    for n in SWEEP:
        imp = m["import"][n]
        sd_read = sd_record_cycles(sd, "read", lay, n)
        imp_dev = imp["query_cycles"] - imp["record_bytes"] + sd_read   # storage at SD speed
        imp_s = link_s(imp) + imp_dev / clk + imp["host_s"]
        k = n // CHUNK
        direct = chunks[:min(k, len(chunks))]
        extra = max(0, k - len(chunks))
        rec = {key: sum(c[key] for c in direct) + extra * steady[key]
               for key in ("bytes_to_device", "bytes_from_device", "requests", "attn_cycles")}
        rec["host_s"] = sum(c["host_s"] for c in direct) + extra * host_steady
        w = m["write"][n]
        rec["bytes_to_device"] += w["bytes_to_device"]
        rec["bytes_from_device"] += w["bytes_from_device"]
        rec_s = link_s(rec) + rec["attn_cycles"] / clk + rec["host_s"]
        results.append({"name": "resume.import", "value": round(imp_s, 4), "unit": "s",
                        "params": {**common, "tokens": n, **imp, "sd_read_cycles": round(sd_read),
                                   "link_s": round(link_s(imp), 4),
                                   "device_cycles_board": round(imp_dev),
                                   "board_cycles": round(imp_s * clk)}})
        results.append({"name": "resume.recompute", "value": round(rec_s, 3), "unit": "s",
                        "params": {**common, "tokens": n, **rec,
                                   "host_s": round(rec["host_s"], 3),
                                   "composed": n > DIRECT_N, "link_s": round(link_s(rec), 3),
                                   "board_cycles": round(rec_s * clk),
                                   "speedup": round(rec_s / imp_s, 1)}})
    dec = m["decode"]
    first = dec[0]
    if not all(_same(d, first) for d in dec):
        raise RuntimeError(f"decode steps differ: {dec}")
    host = sum(d["host_s"] for d in dec) / len(dec)
    tok_s = link_s(first) + first["attn_cycles"] / clk + host
    exp = m["export"]
    sd_write = sd_record_cycles(sd, "write", lay, DIRECT_N)
    results.append({"name": "decode.tokens_per_s", "value": round(1 / tok_s, 2),
                    "unit": "tokens/s",
                    "params": {**common, "ring_tokens": DIRECT_N, "steps": len(dec),
                               "bytes_to_device": first["bytes_to_device"],
                               "bytes_from_device": first["bytes_from_device"],
                               "requests": first["requests"],
                               "attn_cycles": first["attn_cycles"],
                               "link_s": link_s(first), "attn_s": first["attn_cycles"] / clk,
                               "host_s": host,
                               "device_only_tokens_per_s": round(clk / first["attn_cycles"], 1),
                               "checked_tokens": len(m["decode_tokens"])}})
    results.append({"name": "export.record", "value": exp["cycles"], "unit": "cycles",
                    "params": {**common, "tokens": DIRECT_N, "record_bytes": exp["record_bytes"],
                               "bytes_to_device": exp["bytes_to_device"],
                               "bytes_from_device": exp["bytes_from_device"],
                               "dma_cycles": exp["dma_cycles"],
                               "sd_write_cycles": round(sd_write),
                               "board_s": round(link_s(exp) + (exp["cycles"]
                                                               - exp["record_bytes"]
                                                               + sd_write) / clk, 4)}})
    for card, st in m["recovery"].items():
        results.append({"name": f"recovery_cycles.{card}_sector_model", "value": st["cycles"],
                        "unit": "cycles",
                        "params": {**common, "regions": st["regions"], "live": st["live"],
                                   "freed": st["freed"],
                                   "cycles_per_region": round(st["cycles"] / st["regions"], 1),
                                   "storage": "sector-level model, 1 B/clock, no wait states"}})
    return results


def _ms(s):
    return f"{s * 1e3:.1f}"


def markdown(results) -> str:
    by = {}
    for r in results:
        by.setdefault(r["name"], []).append(r)
    out = []
    imports = {r["params"]["tokens"]: r for r in by.get("resume.import", [])}
    recs = {r["params"]["tokens"]: r for r in by.get("resume.recompute", [])}
    if imports and recs:
        p = next(iter(imports.values()))["params"]
        out.append(
            f"Resuming a session of N tokens (default config L={p['layers']}, Hq={p['q_heads']}, "
            f"Hkv={p['kv_heads']}, d={p['head_dim']}, W={p['window']}; P={p['lanes']} x "
            f"M={p['macs']}; prefill chunk {p['chunk']}). **Import** = write the N tokens to "
            "token memory + `QUERY` (hash, lookup, record read with token comparison, config "
            "and CRC check, K/V into the rings). **Recompute** = write the tokens + chunked "
            "prefill through the model, attention on the device. Link bytes and device cycles "
            "are exact (Verilator, storage port at 1 B/clock); recompute rows marked * are "
            "composed from the direct run's exact per-chunk figures (every chunk after the ring "
            "fills costs the same, checked). *On the board*: "
            f"{p['clk_mhz']:g} MHz clock, UART {p['uart_baud']} baud (10 bits/byte), SD card at "
            f"{p['sd_sclk_mhz']:g} MHz SCLK (record transfer estimated from the SD-SPI "
            "controller against the card model); host = numpy time on this 2-core machine "
            "(wall clock, the only non-exact figure); link + device + host added.\n")
        rows = []
        for n in sorted(imports):
            i, r = imports[n]["params"], recs[n]["params"]
            rows.append([n, i["bytes_to_device"] + i["bytes_from_device"], i["query_cycles"],
                         f"{imports[n]['value']:.3f}",
                         r["bytes_to_device"] + r["bytes_from_device"],
                         r["attn_cycles"], f"{r['host_s']:.2f}",
                         f"{recs[n]['value']:.1f}" + (" *" if r["composed"] else ""),
                         f"{r['speedup']:.0f}x"])
        out.append(table(["N", "import link B", "import device cycles", "import on board s",
                          "recompute link B", "recompute attention cycles", "recompute host s",
                          "recompute on board s", "import speedup"], rows))
        rows = []
        for n in sorted(imports):
            i, r = imports[n]["params"], recs[n]["params"]
            rows.append([n, i["board_cycles"], f"{i['link_s'] * 1e3:.1f}",
                         i["device_cycles_board"], r["board_cycles"], f"{r['link_s']:.1f}",
                         r["attn_cycles"]])
        out.append("\nThe same in cycles at the board clock, and where it goes (import: link ms, "
                   "device cycles with the record read at SD speed; recompute: link s, "
                   "attention cycles):\n")
        out.append(table(["N", "import board cycles", "import link ms",
                          "import device cycles (SD)",
                          "recompute board cycles", "recompute link s",
                          "recompute attention cycles"], rows))
    for r in by.get("decode.tokens_per_s", []):
        p = r["params"]
        total = p["link_s"] + p["attn_s"] + p["host_s"]
        out.append(
            f"\nDecode loop (one token through all {p['layers']} layers, full ring of "
            f"{p['window']} slots, after resuming a {p['ring_tokens']}-token session by import; "
            f"{p['steps']} steps, all identical on the link and the device; all "
            f"{p['checked_tokens']} generated tokens equal to the software-only run):\n")
        out.append(table(
            ["where", "per token", "on the board ms", "share"],
            [["link (UART)", f"{p['bytes_to_device']} B to + {p['bytes_from_device']} B from "
              f"device, {p['requests']} requests", _ms(p["link_s"]),
              f"{100 * p['link_s'] / total:.1f} %"],
             ["attention core", f"{p['attn_cycles']} cycles", _ms(p["attn_s"]),
              f"{100 * p['attn_s'] / total:.1f} %"],
             ["host numpy (rest of the model)", "wall clock", _ms(p["host_s"]),
              f"{100 * p['host_s'] / total:.1f} %"],
             ["**total**", f"{round(total * p['clk_mhz'] * 1e6)} cycles at "
              f"{p['clk_mhz']:g} MHz", _ms(total), f"**{r['value']:.1f} tokens/s**"]]))
        out.append(f"\nThe attention core alone would sustain {p['device_only_tokens_per_s']:g} "
                   f"tokens/s at {p['clk_mhz']:g} MHz: the board's loop is bound by the UART.")
    for r in by.get("export.record", []):
        p = r["params"]
        out.append(f"\nExport after a request ({p['tokens']} tokens, {p['record_bytes']} B "
                   f"record): {r['value']} device cycles with storage at 1 B/clock; on the "
                   f"board {p['sd_write_cycles']} cycles of SD writes, "
                   f"{_ms(p['board_s'])} ms in all, once per request.")
    for card in ("empty", "crafted"):
        for r in by.get(f"recovery_cycles.{card}_sector_model", []):
            p = r["params"]
            out.append(f"\nDevice recovery at power-on, {card} card ({p['regions']} regions, "
                       f"{p['live']} live records): {r['value']} cycles from reset to ready, "
                       f"{p['cycles_per_region']} per region, with the sector-level storage "
                       f"model (1 B/clock); no link traffic. SD timing on the board: with the "
                       f"4-bit controller.")
    return "\n".join(out) + "\n"
