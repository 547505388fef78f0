"""The whole system: resume by import versus recompute as the session grows, and where the time
of the decode loop goes.

Everything runs on the simulated device of ``make demo`` — ``RingKVTop`` built with Verilator at
the board's configuration (default config, P=4 lanes x M=8 MACs), reached over a TCP socket by
the host's :class:`~ringkv.host.device.link.Link` and :class:`~ringkv.host.device.fpga.FpgaDevice`,
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
(bit-exact with the DMA's export, tested in ``tests/hw/storage/test_dma.py``) with random K/V bytes
and registered by the device's own power-on recovery, exactly as after a power cycle (its clocks
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
8 data, stop; one request in flight, so the two directions add), and the SD card: by default
(``storage="sd4"``) the native 4-bit bus at SD CLK = clk / 2, and for comparison SPI mode at
its SCLK. Each record transfer at 1 B/clock is replaced by the SD time of the same transfers as
the DMA issues them (header 1 sector, tokens and KV multi-sector: ``CMD17``/``CMD18`` +
``CMD12`` for reads, ``CMD24``/``CMD25`` for writes on the 4-bit bus), measured from the
controller against its bit-level card model at the board's dividers
(:func:`bench.bench_storage.sd_session_cycles`: 1, 2, 8 and 16 sectors on the 4-bit bus, the
16-sector transfer checked against the 2/8-sector line; 1 and 8 sectors in SPI mode, as in the
storage bench). The models' card latencies (4-bit: ``SD4_CARD``; SPI: 2 filler bytes before a
read token, 3 busy bytes after a written block) are not a real card's. Link, device and host
times are added (no overlap assumed: an upper bound where the device computes while the UART
is still sending).

**Prefix reuse**: ``system.prefix.ttft_s.reuse_n1024`` and ``..recompute_n1024``
are the time to the first generated token of a new conversation behind a stored 1,024-token
prefix with a 32-token question of its own. Reuse is measured on the same top: the crafted
record of the sweep's first 1,024 tokens is found by ``QUERY_PREFIX`` (``FpgaDevice.query_prefix``
with ``limit = len - 1``; its link bytes and device cycles, the record read replaced by the
4-bit SD read of a 1,024-token record as for ``resume.import``), then the question's chunk is
prefilled on the device and appended to token memory. Recompute writes all 1,056 tokens and
prefills them in chunks: the direct run's chunks, steady chunks, and the question's chunk
(the same size at the same positions with a full ring, so the same cost). Without
``FpgaDevice.query_prefix`` no prefix time is published. ``system.prefix.tokens_computed_100x512``
counts the tokens 100 conversations behind one 512-token prefix prefill through the scheduler
(the decisions of the scheduler and the device, on the software device): with the prefix's end
marked as a checkpoint, with only the automatic checkpoints, and with none.

**Recovery on the board's store** (``system.recovery_s.*``): the top with the board's 4096
regions is built on Verilator and its own power-on scan is run on a card whose every region
holds a valid record (golden encoder, distinct keys and commit sequences; a sparse image) and on
an empty card: device clocks from reset to ready, exact, with the storage port at 1 B/clock. On
the board each region's 512-cycle header read is replaced by the mode's measured 1-sector read
(command to status; the sector model's own few cycles of command latency stay in, an upper
bound) and the controller's initialisation of the model card from reset is added (the model
answers ``ACMD41`` ready after a few polls; a real card may take up to a second there).
"""

import dataclasses
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench_storage import SD4_CARD, sd4_record_cycles, sd_record_cycles, sd_session_cycles
from bench.run import table
from ringkv.host.scheduler import CHECKPOINT_EVERY

TITLE = "Whole system: resume by import vs recompute, decode loop, prefix reuse"

SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384)
DIRECT_N = 512          # recomputed, exported and imported for real
CHUNK = 64              # the scheduler's prefill chunk
DECODE = 16             # tokens generated from the imported state
REGIONS = 16
FULL_REGIONS = 4096     # the board top's default store: the full-card recovery
LANES, MACS = 4, 8      # the board top's core
UART_BITS = 10          # start + 8 data + stop
PREFIX_N = 1024         # a shared prefix of 1,024 tokens (a crafted record) ...
PREFIX_Q = 32           # ... and a question of 32 tokens of the new conversation's own
SHARED_N, SHARED_CONVERSATIONS = 512, 100   # 100 conversations behind one 512-token prefix


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What one run measures: the published sizes (the module's constants) or the smoke's.
    ``full_regions``: the recovery's store (``None``: the board top's)."""
    sweep: tuple = SWEEP
    direct_n: int = DIRECT_N
    chunk: int = CHUNK
    decode: int = DECODE
    regions: int = REGIONS
    full_regions: int | None = None
    prefix_n: int = PREFIX_N
    prefix_q: int = PREFIX_Q
    shared_n: int = SHARED_N
    shared_conversations: int = SHARED_CONVERSATIONS


#: the smoke run (``run(smoke=True)``): the same flow on the same top, short sessions (chunks of
#: 32, so that the direct run still has steady chunks after the ring fills), the recovery on the
#: 16-region store, 4 conversations behind a 64-token prefix
SMOKE = Sizes(sweep=(256, 512), direct_n=256, chunk=32, decode=2, full_regions=REGIONS,
              prefix_n=512, prefix_q=8, shared_n=64, shared_conversations=4)


def board_params() -> dict:
    """System clock, UART baud rate and both SD controllers' parameters of the ULX3S top with
    its defaults (``storage="sd4"``, the board default, and ``storage="spi"``): the dividers
    and timeouts the board top builds them with."""
    from amaranth import Elaboratable

    from ringkv.boards.ulx3s import ULX3STop
    sd4, spi = ULX3STop(storage="sd4"), ULX3STop(storage="spi")

    def silence(obj, seen):             # only read, never elaborated: no unused warnings
        if isinstance(obj, Elaboratable) and id(obj) not in seen:
            seen.add(id(obj))
            obj._MustUse__silence = True
            for v in vars(obj).values():
                silence(v, seen)
    silence(sd4, set())
    silence(spi, set())
    if sd4.sys_hz != spi.sys_hz:
        raise RuntimeError("the two storage modes of the board top differ in clock")
    clk_hz = sd4.sys_hz
    return {"clk_hz": clk_hz, "baud": sd4.baud, "regions": sd4.top.regions,
            "sd4": {"init_half_period": sd4.sd_init_half, "half_period": sd4.sd_half,
                    "data_timeout": 1 << 22, "busy_timeout": 1 << 23},
            "spi": {"init_half_period": spi.sd_init_half, "half_period": spi.sd_half},
            "sd4_clk_hz": clk_hz / (2 * sd4.sd_half), "spi_sclk_hz": clk_hz / (2 * spi.sd_half),
            "sd4_init_clk_hz": clk_hz / (2 * sd4.sd_init_half),
            "spi_init_clk_hz": clk_hz / (2 * spi.sd_init_half)}


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
    from ringkv.host.golden.hash import sequence_hash
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


def _craft_full_card(path, config, regions, sectors):
    """A card whose ``regions`` regions all hold a valid record (golden encoder, 3 tokens each,
    distinct tokens, so distinct keys, and distinct commit sequences); the image is sparse."""
    from ringkv.defs.hash import hash_seed
    from ringkv.defs.record import SECTOR, RecordLayout
    from ringkv.host.golden.hash import sequence_hash
    from ringkv.host.model.transformer import BOS
    from ringkv.host.record import encode_record
    lay = RecordLayout(config)
    seed = hash_seed(config)
    rings = np.zeros((config.layers, config.kv_heads, 2, config.window, config.head_dim),
                     dtype=np.uint8)
    with open(path, "wb") as f:
        f.truncate(sectors * SECTOR)
        for r in range(regions):
            tokens = [BOS, 1 + r % 255, 1 + r // 255]
            for offset, data in encode_record(config, tokens, rings, count=len(tokens),
                                              ring_head=len(tokens) - 1,
                                              prefix_hash=sequence_hash(tokens, seed),
                                              commit_seq=r + 1):
                f.seek((lay.region_lba(r) + offset) * SECTOR)
                f.write(data)


def _measure_recovery(workdir: Path, regions: int) -> dict:
    """The device's recovery from power-on on a top of ``regions`` regions: a full card (every
    region a valid record) and an empty one."""
    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    from ringkv.sim.harness import SimDevice, build_top
    config = DEFAULT_CONFIG
    top = {"regions": regions, "lanes": LANES, "macs": MACS}
    _, sectors = build_top(config, **top)
    full = workdir / "full.img"
    _craft_full_card(full, config, regions, sectors)
    empty = workdir / "empty-full.img"
    empty.write_bytes(b"")
    out = {}
    for card, image in (("full", full), ("empty", empty)):
        with SimDevice(image, config=config, prebuilt=True, log=workdir / f"sim-{card}.log",
                       **top) as sim:
            st = FpgaDevice(Link(sim.url, timeout=600), config).wait_ready(poll=0.5)
        want = regions if card == "full" else 0
        if st["regions"] != regions or st["scanned"] != regions or st["live"] != want \
                or st["freed"] != 0:
            raise RuntimeError(f"recovery of the {card} card: {st}")
        out[card] = st
    return out


def _measure(workdir: Path, sz: Sizes = Sizes()) -> dict:
    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.defs.record import RecordLayout
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    from ringkv.host.model.transformer import BOS, FixedBackend, Model, limit_blas_threads
    from ringkv.sim.harness import SimDevice, build_top

    config = DEFAULT_CONFIG
    limit_blas_threads(1)
    lay = RecordLayout(config)
    rng = random.Random(11)
    tokens = [BOS] + [rng.randrange(256) for _ in range(max(sz.sweep) - 1)]
    crafted = [n for n in sz.sweep if n != sz.direct_n]
    top = {"regions": sz.regions, "lanes": LANES, "macs": MACS}
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

        # recompute sz.direct_n tokens, chunk by chunk, as the scheduler's miss path does
        dev.reset()
        dev.write_tokens(tokens[:sz.direct_n])
        last = None
        for s in range(0, sz.direct_n, sz.chunk):
            last, cost = meter.run(lambda s=s: model.forward(tokens[s:s + sz.chunk], s, dev)[-1])
            out["chunks"].append(cost)
        pending = int(np.argmax(last))      # the next token, fed after the resume
        exported, _ = dev.snapshot()
        before = dev.counters["device_cycles"]
        (_, moved), out["export"] = meter.run(lambda: dev.export(tokens[:sz.direct_n]))
        out["export"]["record_bytes"] = moved
        out["export"]["cycles"] = dev.counters["device_cycles"] - before

        # resume by import at every N (a fresh ring each time)
        for n in sz.sweep:
            _, out.setdefault("write", {})[n] = meter.run(lambda n=n: dev.write_tokens(tokens[:n]))
            dev.reset()
            before = dev.counters["device_cycles"]
            result, cost = meter.run(lambda n=n: dev.query(tokens[:n]))
            if not result.hit:
                raise RuntimeError(f"import of {n} tokens missed: {result.reason}")
            cost["query_cycles"] = dev.counters["device_cycles"] - before
            cost["record_bytes"] = lay.record_bytes(n)
            out["import"][n] = cost
            if n == sz.direct_n:
                imported, _ = dev.snapshot()
                if not np.array_equal(imported, exported):
                    raise RuntimeError("the imported rings differ from the exported ones")
                # decode from the imported state; every token against the software-only run
                generated, pos = [pending], sz.direct_n
                for _ in range(sz.decode):
                    logits, cost = meter.run(
                        lambda t=generated[-1], p=pos: model.forward([t], p, dev)[0])
                    out["decode"].append(cost)
                    generated.append(int(np.argmax(logits)))
                    pos += 1
                expect = model.generate(tokens[:sz.direct_n], 0, FixedBackend(config, lanes=LANES),
                                        sz.decode + 1, sz.chunk)
                if generated != expect:
                    raise RuntimeError(f"decode after import: {generated} != {expect}")
                out["decode_tokens"] = generated
        out["prefix"] = _measure_prefix(dev, meter, model, tokens, lay, rng, sz)
    return out


def _measure_prefix(dev, meter, model, tokens, lay, rng, sz: Sizes = Sizes()):
    """The time to first token of a new conversation behind the stored
    ``PREFIX_N``-token prefix (the crafted record of ``tokens[:PREFIX_N]``; the records of 256
    and 512 tokens are shorter prefixes of it, 2,048 a longer one) with a ``PREFIX_Q``-token
    question of its own, on the device, as the scheduler runs it:

    * reuse: ``query_prefix(all, limit=len - 1)`` (token memory written, ``QUERY_PREFIX``: hash
      and probe every length, the longest record verified and imported), then the question
      prefilled (one chunk at positions ``PREFIX_N..``) and appended to token memory; the first
      token is the argmax of the chunk's last logits;
    * recompute (no reuse at all): ``write_tokens`` of all, then chunked prefill of every token
      (composed in :func:`run` from the direct run's chunks, the steady chunk, and this
      question chunk, which costs what the recompute's last chunk costs: same size, same
      positions, full ring).

    Needs ``FpgaDevice.query_prefix`` (``QUERY_PREFIX``); without it (a tree without the
    gateware's QUERY_PREFIX) nothing is measured and :func:`run` publishes no prefix time.
    """
    from ringkv.host.device.interface import Device
    if type(dev).query_prefix is Device.query_prefix:
        import sys
        print("bench system: FpgaDevice has no query_prefix (QUERY_PREFIX); the prefix "
              "time-to-first-token figures are not measured", file=sys.stderr)
        return None
    question = [rng.randrange(256) for _ in range(sz.prefix_q)]
    ask = tokens[:sz.prefix_n] + question
    out = {}
    _, out["write_all"] = meter.run(lambda: dev.write_tokens(ask))
    dev.reset()
    before = dev.counters["device_cycles"]
    result, cost = meter.run(lambda: dev.query_prefix(ask, len(ask) - 1))
    if not result.hit or result.count != sz.prefix_n:
        raise RuntimeError(f"QUERY_PREFIX of {len(ask)} tokens: {result}, expected a hit of "
                           f"{sz.prefix_n}")
    cost["query_cycles"] = dev.counters["device_cycles"] - before
    if cost["query_cycles"] <= 0:
        raise RuntimeError("FpgaDevice.query_prefix did not count the device's cycles")
    cost["record_bytes"] = lay.record_bytes(sz.prefix_n)
    out["query"] = cost
    if dev.read_tokens(0, sz.prefix_n) != ask[:sz.prefix_n] or dev.n != sz.prefix_n:
        raise RuntimeError("after QUERY_PREFIX the device does not hold the prefix's state")
    _, out["question"] = meter.run(lambda: model.forward(question, sz.prefix_n, dev)[-1])
    _, out["append"] = meter.run(lambda: dev.append_tokens(question))
    return out


def prefix_tokens_computed(conversations=SHARED_CONVERSATIONS, shared=SHARED_N,
                           question=PREFIX_Q, mark=True, checkpoint_every=None):
    """``conversations`` new conversations behind one ``shared``-token prefix (a system prompt
    or a document), each with a ``question``-token question of its own, through the scheduler
    on the software device (default configuration, float64 rings, store without a bound; the
    decisions are the device's and the scheduler's, the same on the FPGA): the tokens each
    one prefilled, and of those the prefix's. ``mark``: every conversation marks the end of
    the prefix as a checkpoint (as a prompt-caching API's cache breakpoint); otherwise only
    the automatic checkpoints (every ``CHECKPOINT_EVERY``) are there. The first three
    conversations' generated tokens are checked against the run without reuse."""
    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.host.device.software import SoftwareDevice
    from ringkv.host.model.transformer import BOS, Float64Backend, Model, limit_blas_threads
    from ringkv.host.scheduler import Scheduler, plain_run
    limit_blas_threads(1)
    config = DEFAULT_CONFIG
    rng = random.Random(16)
    prefix = [BOS] + [rng.randrange(256) for _ in range(shared - 1)]
    model = Model(config)
    sched = Scheduler(model, SoftwareDevice(config), chunk=CHUNK,
                      checkpoint_every=checkpoint_every)
    reqs = []
    for i in range(conversations):
        own = [rng.randrange(256) for _ in range(question)]
        opts = {"checkpoints": (shared,)} if mark else {}
        reqs.append((f"c{i}", prefix + own, 1, opts))
    outs = [sched.request(sid, toks, n, **opts) for sid, toks, n, opts in reqs]
    if outs[:3] != plain_run(model, reqs[:3], lambda: Float64Backend(config), chunk=CHUNK):
        raise RuntimeError("prefix reuse changed the generated tokens")
    ev = sched.events
    return {"conversations": conversations, "shared": shared, "question": question,
            "mark": mark, "checkpoint_every": sched.checkpoint_every,
            "prefix_computed": sum(max(0, shared - e["reused"]) for e in ev),
            "own_computed": sum(e["prefilled"] - max(0, shared - e["reused"]) for e in ev),
            "computed": sum(e["prefilled"] for e in ev),
            "reused": sum(e["reused"] for e in ev),
            "no_reuse_computed": sum(len(toks) for _, toks, _, _ in reqs),
            "paths": {p: sum(e["path"] == p for e in ev) for p in ("first", "prefix")},
            "checkpoints": sum(len(e["checkpoints"]) for e in ev)}


def _same(a, b):
    keys = ("bytes_to_device", "bytes_from_device", "requests", "attn_cycles", "dma_cycles")
    return all(a[k] == b[k] for k in keys)


def run(smoke: bool = False):
    sz = SMOKE if smoke else Sizes()
    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.defs.record import SECTOR, RecordLayout
    from ringkv.hw.storage.port import StorageOp
    config = DEFAULT_CONFIG
    lay = RecordLayout(config)
    board = board_params()
    # SD transfers at the board's dividers against the bit-level card models, from power-on
    sd4 = sd_session_cycles("sd4", board["sd4"],
                            [(op, k) for op in (StorageOp.READ, StorageOp.WRITE)
                             for k in (1, 2, 8, 16)])
    spi = sd_session_cycles("spi", board["spi"],
                            [(op, k) for op in (StorageOp.READ, StorageOp.WRITE) for k in (1, 8)])
    with tempfile.TemporaryDirectory(prefix="ringkv-bench-") as tmp:
        m = _measure(Path(tmp), sz)
        m["recovery_full"] = _measure_recovery(Path(tmp), sz.full_regions or board["regions"])
    behind = dict(conversations=sz.shared_conversations, shared=sz.shared_n,
                  question=sz.prefix_q)
    shared = {"marked": prefix_tokens_computed(**behind),
              "automatic": prefix_tokens_computed(**behind, mark=False,
                                                  checkpoint_every=CHECKPOINT_EVERY),
              "none": prefix_tokens_computed(**behind, mark=False)}

    clk, baud = board["clk_hz"], board["baud"]

    def link_s(cost):
        return (cost["bytes_to_device"] + cost["bytes_from_device"]) * UART_BITS / baud

    def record_cycles(mode, op, n):
        if mode == "sd4":
            return sd4_record_cycles(sd4, op, lay, n)
        return round(sd_record_cycles(spi, op, lay, n))

    # steady state: once the ring is full, every chunk costs the same
    chunks = m["chunks"]
    full = -(-config.window // sz.chunk)          # chunks before the ring is full
    steady = chunks[-1]
    if len(chunks) - full < 3 or not all(_same(c, steady) for c in chunks[full:]):
        raise RuntimeError(f"prefill chunks after the ring filled are not identical: {chunks}")
    host_steady = sum(c["host_s"] for c in chunks[full:]) / (len(chunks) - full)
    common = {"layers": config.layers, "q_heads": config.q_heads, "kv_heads": config.kv_heads,
              "head_dim": config.head_dim, "window": config.window, "lanes": LANES,
              "macs": MACS, "chunk": sz.chunk, "clk_mhz": clk / 1e6, "uart_baud": baud,
              "storage": "sd4", "sd4_clk_mhz": board["sd4_clk_hz"] / 1e6,
              "spi_sclk_mhz": board["spi_sclk_hz"] / 1e6,
              "sd4_card": ", ".join(f"{k}={v}" for k, v in SD4_CARD.items())}
    results = []
    for n in sz.sweep:
        imp = m["import"][n]
        board_imp = {}
        for mode in ("sd4", "spi"):
            sd_read = record_cycles(mode, "read", n)
            dev = imp["query_cycles"] - imp["record_bytes"] + sd_read   # storage at SD speed
            board_imp[mode] = {"sd_read_cycles": sd_read, "device_cycles_board": dev,
                               "s": link_s(imp) + dev / clk + imp["host_s"]}
        imp_s = board_imp["sd4"]["s"]
        k = n // sz.chunk
        direct = chunks[:min(k, len(chunks))]
        extra = max(0, k - len(chunks))
        rec = {key: sum(c[key] for c in direct) + extra * steady[key]
               for key in ("bytes_to_device", "bytes_from_device", "requests", "attn_cycles")}
        rec["host_s"] = sum(c["host_s"] for c in direct) + extra * host_steady
        w = m["write"][n]
        rec["bytes_to_device"] += w["bytes_to_device"]
        rec["bytes_from_device"] += w["bytes_from_device"]
        rec_s = link_s(rec) + rec["attn_cycles"] / clk + rec["host_s"]
        params = {**common, "tokens": n, **imp,
                  "sd_read_cycles": board_imp["sd4"]["sd_read_cycles"],
                  "link_s": round(link_s(imp), 4),
                  "device_cycles_board": board_imp["sd4"]["device_cycles_board"],
                  "board_cycles": round(imp_s * clk),
                  "spi_sd_read_cycles": board_imp["spi"]["sd_read_cycles"],
                  "spi_device_cycles_board": board_imp["spi"]["device_cycles_board"],
                  "spi_s": round(board_imp["spi"]["s"], 4)}
        results.append({"name": "resume.import", "value": round(imp_s, 4), "unit": "s",
                        "params": params})
        if n in (256, 16384):
            results.append({"name": f"system.resume_s.n{n}", "value": round(imp_s, 4),
                            "unit": "s", "params": {**params, "target_s": 0.025}
                            if n == 256 else params})
        results.append({"name": "resume.recompute", "value": round(rec_s, 3), "unit": "s",
                        "params": {**common, "tokens": n, **rec,
                                   "host_s": round(rec["host_s"], 3),
                                   "composed": n > sz.direct_n, "link_s": round(link_s(rec), 3),
                                   "board_cycles": round(rec_s * clk),
                                   "speedup": round(rec_s / imp_s, 1)}})
    results += _prefix_results(m, shared, common, clk, link_s, record_cycles, steady,
                                host_steady, sz)
    dec = m["decode"]
    first = dec[0]
    if not all(_same(d, first) for d in dec):
        raise RuntimeError(f"decode steps differ: {dec}")
    host = sum(d["host_s"] for d in dec) / len(dec)
    tok_s = link_s(first) + first["attn_cycles"] / clk + host
    results.append({"name": "decode.tokens_per_s", "value": round(1 / tok_s, 2),
                    "unit": "tokens/s",
                    "params": {**common, "ring_tokens": sz.direct_n, "steps": len(dec),
                               "bytes_to_device": first["bytes_to_device"],
                               "bytes_from_device": first["bytes_from_device"],
                               "requests": first["requests"],
                               "attn_cycles": first["attn_cycles"],
                               "link_s": link_s(first), "attn_s": first["attn_cycles"] / clk,
                               "host_s": host,
                               "device_only_tokens_per_s": round(clk / first["attn_cycles"], 1),
                               "checked_tokens": len(m["decode_tokens"])}})
    exp = m["export"]
    exp_board = {}
    for mode in ("sd4", "spi"):
        sd_write = record_cycles(mode, "write", sz.direct_n)
        dev = exp["cycles"] - exp["record_bytes"] + sd_write
        exp_board[mode] = {"sd_write_cycles": sd_write, "device_cycles_board": dev,
                           "s": link_s(exp) + dev / clk + exp["host_s"]}
    exp_params = {**common, "tokens": sz.direct_n, "record_bytes": exp["record_bytes"],
                  "bytes_to_device": exp["bytes_to_device"],
                  "bytes_from_device": exp["bytes_from_device"], "requests": exp["requests"],
                  "dma_cycles": exp["dma_cycles"], "device_cycles": exp["cycles"],
                  "link_s": round(link_s(exp), 4), "host_s": round(exp["host_s"], 4),
                  "sd_write_cycles": exp_board["sd4"]["sd_write_cycles"],
                  "device_cycles_board": exp_board["sd4"]["device_cycles_board"],
                  "board_s": round(exp_board["sd4"]["s"], 4),
                  "spi_sd_write_cycles": exp_board["spi"]["sd_write_cycles"],
                  "spi_board_s": round(exp_board["spi"]["s"], 4)}
    results.append({"name": "export.record", "value": exp["cycles"], "unit": "cycles",
                    "params": exp_params})
    results.append({"name": f"system.export_s.n{sz.direct_n}", "value": exp_params["board_s"],
                    "unit": "s", "params": {**exp_params, "target_s": 0.020}})
    for card, st in m["recovery"].items():
        results.append({"name": f"recovery_cycles.{card}_sector_model", "value": st["cycles"],
                        "unit": "cycles",
                        "params": {**common, "regions": st["regions"], "live": st["live"],
                                   "freed": st["freed"],
                                   "cycles_per_region": round(st["cycles"] / st["regions"], 1),
                                   "storage": "sector-level model, 1 B/clock, no wait states"}})
    # recovery on the board: the device's clocks from reset to ready on the 4096-region top
    # (measured), each region's 1-sector header read at 1 B/clock replaced by the SD 1-sector
    # read of the mode, plus the controller's initialisation of the model card
    sd_read1 = {"sd4": sd4[("read", 1)], "spi": spi[("read", 1)]}
    sd_init = {"sd4": sd4["init"], "spi": spi["init"]}
    for card, st in m["recovery_full"].items():
        regions = st["regions"]
        for mode in ("sd4", "spi"):
            board_cycles = st["cycles"] - regions * SECTOR + regions * sd_read1[mode]
            total = board_cycles + sd_init[mode]
            results.append({
                "name": f"system.recovery_s.{card}_card_{mode}",
                "value": round(total / clk, 4), "unit": "s",
                "params": {**common, "storage": mode, "regions": regions, "live": st["live"],
                           "freed": st["freed"], "device_cycles": st["cycles"],
                           "device_cycles_per_region": round(st["cycles"] / regions, 2),
                           "sd_read1_cycles": sd_read1[mode], "sd_init_cycles": sd_init[mode],
                           "sd_init_s": round(sd_init[mode] / clk, 4),
                           "scan_cycles_board": board_cycles,
                           "scan_s": round(board_cycles / clk, 4),
                           "target_s": 1.5 if mode == "sd4" else 4.0,
                           "sd_init_clk_khz": board[f"{mode}_init_clk_hz"] / 1e3,
                           "measured": "device on Verilator, all regions scanned"}})
    return results


def _prefix_results(m, shared, common, clk, link_s, record_cycles, steady, host_steady,
                    sz: Sizes = Sizes()):
    """Prefix reuse figures: time to first token behind a stored 1,024-token prefix (reuse and
    recompute, on the board) when the device answers ``QUERY_PREFIX``; tokens computed by 100
    conversations behind one 512-token prefix (scheduler decisions, software device)."""
    out = []
    tc = shared["marked"]
    out.append({"name": f"system.prefix.tokens_computed_{tc['conversations']}x{tc['shared']}",
                "value": tc["computed"], "unit": "tokens",
                "params": {**tc, "target": tc["shared"] + tc["own_computed"],
                           "automatic_only": {k: shared["automatic"][k] for k in (
                               "checkpoint_every", "prefix_computed", "computed")},
                           "no_checkpoints": {k: shared["none"][k] for k in (
                               "prefix_computed", "computed")},
                           "device": "software device (decisions as on the FPGA)"}})
    pf = m.get("prefix")
    if pf is None:
        return out
    q, qu, ap, wa = pf["query"], pf["question"], pf["append"], pf["write_all"]
    sd_read = record_cycles("sd4", "read", sz.prefix_n)
    q_dev = q["query_cycles"] - q["record_bytes"] + sd_read      # the record read at SD speed
    question_s = link_s(qu) + qu["attn_cycles"] / clk + qu["host_s"]
    reuse = {"query_s": link_s(q) + q_dev / clk + q["host_s"], "question_s": question_s,
             "append_s": link_s(ap) + ap["host_s"]}
    reuse_s = sum(reuse.values())
    k = sz.prefix_n // sz.chunk
    chunks = m["chunks"]
    direct, extra = chunks[:min(k, len(chunks))], max(0, k - len(chunks))
    rec = {key: sum(c[key] for c in direct) + extra * steady[key]
           for key in ("bytes_to_device", "bytes_from_device", "requests", "attn_cycles")}
    rec["host_s"] = sum(c["host_s"] for c in direct) + extra * host_steady
    recompute = {"write_s": link_s(wa) + wa["host_s"],
                 "prefill_s": link_s(rec) + rec["attn_cycles"] / clk + rec["host_s"],
                 "question_s": question_s}
    rec_s = sum(recompute.values())
    base = {**common, "prefix_tokens": sz.prefix_n, "question_tokens": sz.prefix_q,
            "board": "4-bit SD; link at the UART baud; host numpy wall clock"}
    out.append({"name": f"system.prefix.ttft_s.reuse_n{sz.prefix_n}", "value": round(reuse_s, 4),
                "unit": "s", "params": {
                    **base, **{k: round(v, 4) for k, v in reuse.items()},
                    "query_bytes_to_device": q["bytes_to_device"],
                    "query_bytes_from_device": q["bytes_from_device"],
                    "query_device_cycles": q["query_cycles"], "sd_read_cycles": sd_read,
                    "query_device_cycles_board": q_dev, "record_bytes": q["record_bytes"],
                    "question_attn_cycles": qu["attn_cycles"],
                    "speedup": round(rec_s / reuse_s, 1), "target_speedup": 20}})
    out.append({"name": f"system.prefix.ttft_s.recompute_n{sz.prefix_n}",
                "value": round(rec_s, 3), "unit": "s", "params": {
                    **base, **{k: round(v, 3) for k, v in recompute.items()},
                    "attn_cycles": rec["attn_cycles"] + qu["attn_cycles"],
                    "bytes_to_device": rec["bytes_to_device"] + qu["bytes_to_device"]
                    + wa["bytes_to_device"],
                    "composed": True}})
    return out


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
            f"{p['clk_mhz']:g} MHz clock, UART {p['uart_baud']} baud (10 bits/byte); the "
            "record read at SD speed: on the 4-bit bus (the board default) at "
            f"{p['sd4_clk_mhz']:g} MHz SD CLK, and for comparison in SPI mode at "
            f"{p['spi_sclk_mhz']:g} MHz SCLK, each from the controller's transfers against its "
            "bit-level card model at the board's dividers, as the DMA issues them (header, "
            "tokens, KV: three transfers; 4-bit model card latencies "
            f"{p['sd4_card']} SD clocks, not a real card's); host = numpy time on this 2-core "
            "machine (wall clock, the only non-exact figure); link + device + host added.\n")
        rows = []
        for n in sorted(imports):
            i, r = imports[n]["params"], recs[n]["params"]
            rows.append([n, i["bytes_to_device"] + i["bytes_from_device"], i["query_cycles"],
                         f"{imports[n]['value']:.4f}", f"{i['spi_s']:.3f}",
                         r["bytes_to_device"] + r["bytes_from_device"],
                         r["attn_cycles"], f"{r['host_s']:.2f}",
                         f"{recs[n]['value']:.1f}" + (" *" if r["composed"] else ""),
                         f"{r['speedup']:.0f}x"])
        out.append(table(["N", "import link B", "import device cycles",
                          "import on board s (4-bit)", "import on board s (SPI)",
                          "recompute link B", "recompute attention cycles", "recompute host s",
                          "recompute on board s", "import speedup"], rows))
        rows = []
        for n in sorted(imports):
            i, r = imports[n]["params"], recs[n]["params"]
            rows.append([n, i["board_cycles"], f"{i['link_s'] * 1e3:.1f}",
                         i["device_cycles_board"], r["board_cycles"], f"{r['link_s']:.1f}",
                         r["attn_cycles"]])
        out.append("\nThe same in cycles at the board clock, and where it goes (import: link ms, "
                   "device cycles with the record read at 4-bit SD speed; recompute: link s, "
                   "attention cycles):\n")
        out.append(table(["N", "import board cycles", "import link ms",
                          "import device cycles (4-bit SD)",
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
                   f"board {p['sd_write_cycles']} cycles of SD writes on the 4-bit bus, "
                   f"{_ms(p['board_s'])} ms in all with the link ({_ms(p['link_s'])} ms), once "
                   f"per request; SPI mode: {p['spi_sd_write_cycles']} cycles of SD writes, "
                   f"{_ms(p['spi_board_s'])} ms.")
    for card in ("empty", "crafted"):
        for r in by.get(f"recovery_cycles.{card}_sector_model", []):
            p = r["params"]
            out.append(f"\nDevice recovery at power-on, {card} card ({p['regions']} regions, "
                       f"{p['live']} live records): {r['value']} cycles from reset to ready, "
                       f"{p['cycles_per_region']} per region, with the sector-level storage "
                       f"model (1 B/clock); no link traffic.")
    rec = {r["name"]: r for r in results if r["name"].startswith("system.recovery_s.")}
    if rec:
        any_p = next(iter(rec.values()))["params"]
        out.append(
            f"\nDevice recovery on the board's store ({any_p['regions']} regions): the top with "
            f"{any_p['regions']} regions on Verilator, its own power-on scan (one header sector "
            "per region, the DMA's header checks, directory insert), on a card whose every "
            "region holds a valid record (golden encoder, distinct keys) and on an empty card; "
            "device clocks from reset to ready counted by the device. On the board each "
            "region's 1-sector read at 1 B/clock (512 cycles) is replaced by the controller's "
            "1-sector read against its card model at the board's divider (command to status), "
            "and the controller's initialisation of the model card from reset is added (at "
            f"{any_p['sd_init_clk_khz']:g} kHz; the model answers ACMD41 ready after a few "
            "polls, a real card may take up to 1 s there, not included):\n")
        rows = []
        for name in sorted(rec):
            r = rec[name]
            p = r["params"]
            rows.append([f"`{name}`", p["storage"], p["live"], p["device_cycles"],
                         p["device_cycles_per_region"], p["sd_read1_cycles"],
                         p["scan_cycles_board"], _ms(p["sd_init_s"]),
                         f"**{r['value']:.3f}**", f"{p['target_s']:g}"])
        out.append(table(["figure", "bus", "live records", "device cycles (1 B/clock)",
                          "per region", "SD 1-sector read cycles", "scan board cycles",
                          "SD init ms", "board s", "target s"], rows))
    named = [r for r in results if r["name"].startswith(("system.resume_s.",
                                                          "system.export_s."))]
    if named:
        out.append("\nStorage figures (board, 4-bit bus; SPI mode for comparison):\n")
        out.append(table(["figure", "board s (4-bit)", "SPI s", "target s"],
                         [[f"`{r['name']}`", f"**{r['value']:.4f}**",
                           f"{r['params'].get('spi_s', r['params'].get('spi_board_s')):.4f}",
                           r["params"].get("target_s", "")] for r in named]))
    out += _prefix_markdown(results)
    return "\n".join(out) + "\n"


def _prefix_markdown(results) -> list[str]:
    out = []
    for r in results:
        if not r["name"].startswith("system.prefix.tokens_computed_"):
            continue
        p = r["params"]
        out.append(
            f"\nPrefix reuse: {p['conversations']} new conversations behind one "
            f"{p['shared']}-token prefix (a system prompt or a document), each with a "
            f"{p['question']}-token question of its own, through the scheduler ({p['device']}): "
            f"`{r['name']}` = **{r['value']}** tokens prefilled in all (target "
            f"{p['target']} = the prefix once + {p['own_computed']} of their own; the prefix's "
            f"tokens computed: {p['prefix_computed']}; {p['reused']} tokens imported instead); "
            f"without any reuse {p['no_reuse_computed']}. With the end of the prefix marked as "
            f"a checkpoint by the client: {p['paths']['first']} conversation computes it, "
            f"{p['paths']['prefix']} import it. Unmarked, with only the automatic checkpoints "
            f"every {p['automatic_only']['checkpoint_every']} tokens: "
            f"{p['automatic_only']['computed']} tokens; with no checkpoints at all: "
            f"{p['no_checkpoints']['computed']} (a turn snapshot ends after a conversation's "
            f"own question, so no other conversation has it as a prefix).")
    ttft = {r["name"]: r for r in results if r["name"].startswith("system.prefix.ttft_s.")}
    if ttft:
        rows = []
        for name in sorted(ttft, reverse=True):
            r, p = ttft[name], ttft[name]["params"]
            parts = ", ".join(f"{k[:-2]} {v * 1e3:.1f} ms" for k, v in p.items()
                              if k.endswith("_s") and k != "host_s")
            rows.append([f"`{name}`", f"**{r['value']:.4g}**", parts,
                         p.get("speedup", ""), p.get("target_speedup", "")])
        p = next(iter(ttft.values()))["params"]
        out.append(f"\nTime to the first generated token of a new conversation behind a "
                   f"stored {p['prefix_tokens']}-token prefix with a {p['question_tokens']}-token "
                   "question of its "
                   "own, on the board (link at the UART baud, device cycles with the record "
                   "read at 4-bit SD speed, host numpy wall clock). Reuse: `QUERY_PREFIX` "
                   "(tokens written, every length hashed and probed, the longest record "
                   "verified and imported) + the question's prefill; recompute: all tokens "
                   "written and prefilled in chunks (composed from the direct run's chunks):\n")
        out.append(table(["figure", "s", "where", "speedup", "target"], rows))
    return out
