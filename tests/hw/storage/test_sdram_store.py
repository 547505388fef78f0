"""SDRAM sector store (``hw/storage/sdram_store.py``) in the Amaranth simulator, on a real
``SdramController`` and the strict pin-level model ``SdramModel`` (the first violation of a
chip rule fails the test), against the golden model: a sector image
(``ringkv.sim.sector_model.SectorImage``, what the storage port reads back, with the port's
RANGE rule) and ``ringkv.host.golden.sdram.sector_words`` (where each byte lies in the SDRAM).

Every run starts with every sector of the store put into the model's memory (so a read of the
wrong place or in the wrong byte order returns other bytes) and ends by comparing the whole
memory with the golden layout: every word of every sector, and no word outside the store
touched (the model adds a word it reads or writes). Chips are scaled down as in
``tests/hw/sdram/test_controller.py`` (a 0.5 us power-up, a refresh period of 8 refreshes).
"""

import random
import re

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator
from conftest import examples
from dma_helpers import load_state, new_image, rand_rings, read_state
from dma_helpers import simulate as simulate_sector
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import SECTOR, RecordLayout, RecordStatus
from ringkv.defs.sdram import CHIPS
from ringkv.host.golden.sdram import sector_words
from ringkv.hw.sdram.controller import SdramController
from ringkv.hw.storage.dma import DmaOp
from ringkv.hw.storage.port import StorageError, StorageOp
from ringkv.hw.storage.sdram_store import BUGS, SdramSectorStore
from ringkv.sim.ring_model import DmaHarness
from ringkv.sim.sdram_model import (
    SdramModel,
    SdramViolation,
    amaranth_sdram,
    model_for_controller,
)
from ringkv.sim.sdram_store_sim import (
    SdramStoreTop,
    preload,
    run_store,
    sdram_sector,
    transfer_clocks,
)
from ringkv.sim.sector_model import SectorImage
from ringkv.sim.streams import stream_get, stream_put, tick_until

# background testbenches (the SDRAM model) are abandoned when the body ends
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

MHZ60 = 1000 / 60


def small(name="MT48LC16M16A2-6A", **changes):
    """A short power-up and a refresh period of 8 refreshes in 20 us (one every 2.5 us)."""
    return CHIPS[name].scaled(**{"power_up_ns": 500, "refreshes": 8, "refresh_ns": 8 * 2500,
                                 **changes})


#: controller parameters and the store's place: the board's chip at 60 MHz; CL 3 with 4-word
#: bursts and 2-bit counts (a sector is 64 bursts: many controller commands); the 64 MB part
#: (1024 columns) with single-word bursts and the store not at word 0
CONFIGS = {
    "6A-60MHz-CL2-BL8": (dict(chip=small(), tck_ns=MHZ60, cl=2, bl=8),
                         dict(sectors=6, base=0)),
    "7E-100MHz-CL3-BL4": (dict(chip=small("MT48LC16M16A2-7E"), tck_ns=10.0, cl=3, bl=4,
                               count_bits=2), dict(sectors=9, base=256 * 1021)),
    "AS4C-60MHz-CL2-BL1": (dict(chip=small("AS4C32M16SB-7"), tck_ns=MHZ60, cl=2, bl=1,
                                count_bits=5), dict(sectors=7, base=256 * 13)),
    # half rate (32-bit port words): the board's chip with the controller at 60 MHz and the
    # SDRAM at 120; 2-word bursts (one port word each), 2-bit counts, the pins an edge late
    "6A-60MHz-half-CL3-BL8": (dict(chip=small(), tck_ns=MHZ60, cl=3, bl=8, rate=2),
                              dict(sectors=6, base=0)),
    "7E-50MHz-half-CL2-BL2-RD1": (dict(chip=small("MT48LC16M16A2-7E"), tck_ns=20.0, cl=2, bl=2,
                                       rate=2, count_bits=2, read_delay=1),
                                  dict(sectors=5, base=256 * 77)),
    # the wide storage port at half rate: a 32-bit port word a storage transfer
    "6A-60MHz-half-CL3-BL8-wide": (dict(chip=small(), tck_ns=MHZ60, cl=3, bl=8, rate=2),
                                   dict(sectors=6, base=0, width=4)),
    "7E-50MHz-half-CL2-BL2-RD1-wide": (dict(chip=small("MT48LC16M16A2-7E"), tck_ns=20.0, cl=2,
                                            bl=2, rate=2, count_bits=2, read_delay=1),
                                       dict(sectors=5, base=256 * 77, width=4)),
}
#: the configurations the boundary and broken-variant cases run on
MAIN = ["6A-60MHz-CL2-BL8", "6A-60MHz-half-CL3-BL8", "6A-60MHz-half-CL3-BL8-wide"]


def random_script(rng, sectors, n):
    """``n`` operations: mostly 1..3 sectors at random places, the first and the last sector
    often, some with count 0 and some beyond the end (by one sector, far, or a huge count)."""
    out = []
    for _ in range(n):
        write = rng.random() < 0.5
        kind = rng.random()
        if kind < 0.1:
            lba, count = rng.randrange(sectors + 2), 0
        elif kind < 0.25:
            lba, count = rng.choice([(sectors, 1), (sectors - 1, 2), (0, sectors + 1),
                                     (rng.randrange(sectors), 0xFFFF), (0xFFFFFFFF, 1),
                                     (sectors - 2, rng.randrange(3, 6))])
        else:
            count = rng.randrange(1, min(3, sectors) + 1)
            lba = rng.choice([0, sectors - count, rng.randrange(sectors - count + 1)])
        if not write:
            out.append(("r", lba, count))
        elif count * 512 <= 4 * 512:
            out.append(("w", lba, rng.randbytes(count * 512), count))
        else:
            out.append(("w", lba, rng.randbytes(512), count))   # never taken: RANGE
    return out


def golden_results(image: SectorImage, script):
    """What the port must answer, applying the writes to ``image``."""
    out = []
    for op in script:
        lba, count = op[1], (op[2] if op[0] == "r" else op[3])
        if not image.in_range(lba, count):
            out.append((StorageError.RANGE, b"" if op[0] == "r" else 0))
        elif op[0] == "r":
            out.append((StorageError.OK, image.read(lba, count)))
        else:
            image.write(lba, op[2])
            out.append((StorageError.OK, len(op[2])))
    return out


def check_memory(model, chip, image: SectorImage, base: int, preloaded: set):
    """The sectors whose words differ from the golden layout of the image's bytes, and
    whether a word outside the store was read or written."""
    bad = [lba for lba in range(image.sectors)
           if sdram_sector(model, chip, lba, base=base)
           != sector_words(lba, image.read(lba), base=base)]
    return bad, set(model.memory) != preloaded


def run_checked(name, script, *, seed=0, idle=0.0, stall=0.0, hold=0.0, bug=None):
    """Run ``script`` on configuration ``name`` with every sector preloaded; returns
    ``(results, golden results, (sectors whose SDRAM words differ from the golden layout,
    whether a word outside the store was touched))``."""
    controller, store = CONFIGS[name]
    top = SdramStoreTop(controller, {**store, "_bug": bug})
    chip, base, sectors = top.ctrl.chip, store["base"], store["sectors"]
    rng = random.Random(seed)
    image = SectorImage(sectors=sectors)
    image.write(0, rng.randbytes(sectors * SECTOR))
    model = model_for_controller(top.ctrl, seed=seed)
    preload(model, chip, 0, image.read(0, sectors), base=base)
    preloaded = set(model.memory)
    # 100 clocks after the last status: a write's last bursts reach the cells a few clocks
    # after it (a refresh may come first)
    run = run_store(top, script, model=model, seed=seed, idle=idle, stall=stall, hold=hold,
                    tail=100)
    want = golden_results(image, script)
    return run.results, want, check_memory(model, chip, image, base, preloaded)


# -- parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(chip="MT48LC16M16A2"), TypeError, "Chip must be a SdramChip, not 'MT48LC16M16A2'"),
    (dict(bl=3), ValueError, "Burst length must be 1, 2, 4 or 8, not 3"),
    (dict(count_bits=0), ValueError, "Count width must be between 1 and 24 bits, not 0"),
    (dict(fifo_depth=24), ValueError,
     "FIFO depth must be a power of two between 16 and 4096, not 24"),
    (dict(base=100), ValueError, "Base must be a multiple of 256 words, not 100"),
    (dict(base=-256), ValueError, "Base must be between 0 and 16776960, not -256"),
    (dict(base=1 << 24), ValueError, "Base must be between 0 and 16776960, not 16777216"),
    (dict(sectors=0), ValueError, "Sectors must be between 1 and 65536, not 0"),
    (dict(sectors=65536, base=256), ValueError, "Sectors must be between 1 and 65535, not 65536"),
    (dict(sectors=2.0), TypeError, "Sectors must be an integer, not 2.0"),
    (dict(_bug="nope"), ValueError, "Unknown bug 'nope'"),
    (dict(width=4), ValueError, "Width must be 1 byte, or 4 (a port word) at rate 2, not 4 at "
                                "rate 1"),
    (dict(width=2), ValueError, "Width must be 1 byte, or 4 (a port word) at rate 2, not 2 at "
                                "rate 1"),
])
def test_bad_parameters(kwargs, exc, message):
    with pytest.raises(exc, match="^" + re.escape(message)):
        SdramSectorStore(**kwargs)


def test_defaults_and_the_controller_port():
    """32 MB: 65536 sectors from word 0; ``for_controller`` takes the controller's burst
    length, count width and FIFO depth, and its port connects to the controller's."""
    store = SdramSectorStore()
    assert (store.sectors, store.base, store.bl, store.fifo_depth) == (65536, 0, 8, 32)
    ctrl = SdramController(CHIPS["AS4C32M16SB-7"], tck_ns=10.0, bl=2, count_bits=7,
                           fifo_depth=64)
    store = SdramSectorStore.for_controller(ctrl, base=512)
    assert (store.sectors, store.bl, store.fifo_depth) == (131070, 2, 64)
    wiring.connect(Module(), store.sdram, ctrl.port[0])     # raises if the shapes differ


# -- against the golden model ----------------------------------------------------------------

@pytest.mark.parametrize("name", MAIN)
def test_boundaries_without_backpressure(name):
    """First and last sector, the whole store in one command, every RANGE case; exact
    results and memory (and at half rate, four bytes a port word; on the wide port, a port
    word a storage transfer)."""
    rng = random.Random(5)
    script = [("r", 0, 1), ("r", 5, 1), ("w", 5, rng.randbytes(512), 1),
              ("w", 0, rng.randbytes(512), 1), ("r", 0, 6), ("r", 6, 1), ("r", 5, 2),
              ("r", 0, 0), ("w", 0, b"", 0), ("w", 5, rng.randbytes(512), 2),
              ("w", 6, rng.randbytes(512), 1), ("r", 0xFFFFFFFF, 1), ("r", 0, 0xFFFF),
              ("w", 2, rng.randbytes(2 * 512), 2)]
    got, want, memory = run_checked(name, script)
    assert got == want
    assert memory == ([], False)


# no shrinking: an example is seconds of simulation, and the printed seed reproduces it
@settings(max_examples=examples(fast=3, thorough=30), deadline=None,
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(name=st.sampled_from(sorted(CONFIGS)), seed=st.integers(0, 2**30),
       idle=st.sampled_from([0.0, 0.3, 0.7]), stall=st.sampled_from([0.0, 0.3, 0.7]),
       hold=st.sampled_from([0.0, 0.5]))
def test_random_scripts_against_golden(name, seed, idle, stall, hold):
    """Random reads and writes (first/last sector, multi-sector, count 0, beyond the end)
    with random idle on ``cmd``/``wdata`` and withheld ``ready`` on ``rdata``/``status``:
    every status and byte is the golden model's, the SDRAM holds the golden layout."""
    rng = random.Random(seed)
    script = random_script(rng, CONFIGS[name][1]["sectors"], 6)
    got, want, memory = run_checked(name, script, seed=seed, idle=idle, stall=stall,
                                    hold=hold)
    assert got == want
    assert memory == ([], False)


def bug_case(bug):
    """A script that shows ``bug``: a read of the preloaded first sector, a write and read
    of the last, and a command one sector past the end."""
    rng = random.Random(7)
    return [("r", 0, 1), ("w", 5, rng.randbytes(512), 1), ("r", 5, 1), ("r", 5, 2)]


#: the variants that change what is stored or answered (``eager`` changes when bursts are
#: asked for: the long-stall test below catches it)
DATA_BUGS = ("address", "byte_order", "range")


def test_every_bug_has_a_case():
    assert set(BUGS) == {*DATA_BUGS, "eager"}


@pytest.mark.parametrize("name", MAIN)
@pytest.mark.parametrize("bug", DATA_BUGS)
def test_broken_variant_caught(bug, name):
    """Each deliberately broken store fails the comparison with the golden model."""
    got, want, memory = run_checked(name, bug_case(bug), bug=bug)
    assert got != want or memory != ([], False)


@pytest.mark.parametrize("name", MAIN)
def test_broken_variant_script_passes_on_the_correct_store(name):
    got, want, memory = run_checked(name, bug_case(None))
    assert got == want and memory == ([], False)


# -- backpressure never holds back the refresh -----------------------------------------------

@pytest.mark.parametrize("bug", [None, "eager"])
def test_long_stalls_do_not_hold_back_the_refresh(bug):
    """An initiator that stops in the middle of a write (``wdata.valid`` low) and of a read
    (``rdata.ready`` low) for 1500 clocks -- three times the scaled refresh period (480
    clocks, 8 refreshes) -- neither starves the SDRAM's refresh (the strict model checks it)
    nor loses a byte. The ``eager`` store, whose bursts wait in the controller's queues for
    data or FIFO room, starves it."""
    controller = dict(chip=small(refresh_ns=8 * 1000), tck_ns=MHZ60, cl=2, bl=8)
    top = SdramStoreTop(controller, dict(sectors=6, _bug=bug))
    model = SdramModel(top.ctrl.chip, controller["tck_ns"])
    data = random.Random(3).randbytes(2 * SECTOR)
    port = top.storage
    out = {}

    async def bench(ctx):
        await tick_until(ctx, top.ready)
        await stream_put(ctx, port.cmd, {"op": StorageOp.WRITE, "lba": 4, "count": 2})
        ctx.set(port.status.ready, 1)
        for i, byte in enumerate(data):
            if i == 700:
                ctx.set(port.wdata.valid, 0)
                for _ in range(1500):
                    await ctx.tick()
            ctx.set(port.wdata.valid, 1)
            ctx.set(port.wdata.payload, byte)
            await tick_until(ctx, port.wdata.ready)
        ctx.set(port.wdata.valid, 0)
        out["write"] = (await stream_get(ctx, port.status)).error
        await stream_put(ctx, port.cmd, {"op": StorageOp.READ, "lba": 4, "count": 2})
        got = bytearray()
        for i in range(len(data)):
            if i == 300:
                ctx.set(port.rdata.ready, 0)
                for _ in range(1500):
                    await ctx.tick()
            got.append(await stream_get(ctx, port.rdata))
        out["read"] = (await stream_get(ctx, port.status)).error, bytes(got)

    sim = Simulator(top)
    sim.add_clock(controller["tck_ns"] * 1e-9)
    sim.add_testbench(amaranth_sdram(model, top.pins), background=True)
    sim.add_testbench(bench)
    if bug == "eager":
        with pytest.raises(SdramViolation, match="refresh_interval"):
            sim.run()
        return
    sim.run()
    assert out == {"write": StorageError.OK, "read": (StorageError.OK, data)}
    assert model.violations == []


# -- exact clocks ----------------------------------------------------------------------------

def test_clocks_per_sector():
    """Clocks from the command to the status's transfer at 60 MHz, CL 2, BL 8 on the board's
    chip, no idle and no backpressure (``docs/blocks/sdram_store.md``): one byte a clock,
    plus a fixed latency; no byte of the 4-sector read (two rows, several refreshes) waits."""
    chip = CHIPS["MT48LC16M16A2-6A"].scaled(power_up_ns=500)
    clocks = transfer_clocks(dict(chip=chip, tck_ns=MHZ60, cl=2, bl=8), (1, 4))
    assert clocks == {("w", 1): 512 + 5, ("r", 1): 512 + 17,
                      ("w", 4): 4 * 512 + 5, ("r", 4): 4 * 512 + 17}


def test_clocks_per_sector_at_half_rate():
    """The same at half rate (the controller at 60 MHz, the SDRAM at 120, CL 3): still one
    byte a clock on the storage port; the read right after the write starts 4 clocks sooner,
    as the write's last burst (issued once its words are in the FIFO) holds the bus for 4
    controller clocks instead of 8 (the first byte of a read on its own comes after the same
    12 clocks from an open row: ``test_first_byte_latency``)."""
    chip = CHIPS["MT48LC16M16A2-6A"].scaled(power_up_ns=500)
    clocks = transfer_clocks(dict(chip=chip, tck_ns=MHZ60, cl=3, bl=8, rate=2), (1, 4))
    assert clocks == {("w", 1): 512 + 5, ("r", 1): 512 + 13,
                      ("w", 4): 4 * 512 + 5, ("r", 4): 4 * 512 + 15}


def test_clocks_per_sector_on_the_wide_port():
    """Half rate with the wide storage port (``width=4``): a port word a clock, so a sector's
    data in 128 clocks. A one-sector write takes 128 + 5 as on the byte port; reads (and long
    writes) now wait for the SDRAM's row changes and refreshes, which the byte port's fourfold
    slack hid: 16 sectors (2,048 words) read in 2,113 clocks, 97 % of a word a clock, the
    controller's own sequential efficiency at half rate (97.9 %, ``docs/blocks/sdram.md``);
    the first word 15 clocks after a read that follows a write (13 on its own)."""
    chip = CHIPS["MT48LC16M16A2-6A"].scaled(power_up_ns=500)
    clocks = transfer_clocks(dict(chip=chip, tck_ns=MHZ60, cl=3, bl=8, rate=2), (1, 4, 16),
                             store={"width": 4})
    assert clocks == {("w", 1): 128 + 5, ("r", 1): 128 + 15,
                      ("w", 4): 4 * 128 + 8, ("r", 4): 4 * 128 + 38,
                      ("w", 16): 16 * 128 + 50, ("r", 16): 16 * 128 + 65}


@pytest.mark.parametrize("controller", [dict(cl=2, bl=8), dict(cl=3, bl=8, rate=2)])
def test_first_byte_latency(controller):
    """Clocks from a read command's transfer to its first byte's at 60 MHz, CL 2, BL 8:
    ``CL + 10`` from an open row, 2 more from a closed bank (``tRCD``), 4 more after a row miss
    (PRECHARGE, ``tRP``, ACTIVE, ``tRCD``); a sector then takes 512 clocks and the status 1.
    At half rate with CL 3 (the SDRAM at 120 MHz) the same clocks."""
    chip = CHIPS["MT48LC16M16A2-6A"].scaled(power_up_ns=500)
    top = SdramStoreTop(dict(chip=chip, tck_ns=MHZ60, **controller))
    # sector 8 is row 1 of bank 0, where sector 0 is row 0
    run = run_store(top, [("r", 0, 1), ("r", 0, 1), ("r", 8, 1), ("r", 8, 1)])
    assert run.first_byte == [14, 12, 16, 12]
    assert run.clocks == [n + 512 + 1 for n in run.first_byte]


# -- the DMA engine on the SDRAM store -------------------------------------------------------

TINY = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=4, window=4, token_width=8,
                    max_tokens=40)


def test_dma_export_import_over_the_sdram_store():
    """The DMA engine, unchanged, exports a record to the SDRAM store and imports it back:
    the sectors in the SDRAM are the bytes the same export writes to the sector model, and
    the import restores the rings (small configuration: the whole run is a few thousand
    clocks)."""
    config, regions, region = TINY, 2, 1
    rng = random.Random(11)
    rings, count, head = rand_rings(config, rng), 13, 2
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]
    lay = RecordLayout(config)
    first, n = lay.region_lba(region), lay.sectors_per_region

    async def export(ctx, h, rng):
        if hasattr(h, "sd_ready"):
            await tick_until(ctx, h.sd_ready)
        await load_state(ctx, h, config, rings, count, head, tokens)
        await stream_put(ctx, h.cmd, {"op": DmaOp.EXPORT, "region": region, "hash": 77,
                                      "seq": 5})
        exp = (await stream_get(ctx, h.resp)).status.value
        await load_state(ctx, h, config, np.zeros_like(rings), 0, 0, tokens)
        await stream_put(ctx, h.cmd, {"op": DmaOp.IMPORT, "region": region, "count": count,
                                      "hash": 77})
        imp = await stream_get(ctx, h.resp)
        return exp, (imp.status.value, imp.count, imp.hash, imp.seq), \
            await read_state(ctx, h, config)

    # the reference: the same DMA over the sector model
    image, log = new_image(config, regions), []
    ref = simulate_sector(config, regions, image, export, mac=False, log=log)["value"]
    written = sorted({lba + k for op, lba, count in log if op == StorageOp.WRITE
                      for k in range(count)})
    assert written and all(first <= lba < first + n for lba in written)

    chip = small()
    sectors = regions * n + 2
    h = DmaHarness(config, regions, sdram={"controller": dict(chip=chip, tck_ns=MHZ60, cl=2),
                                           "store": dict(sectors=sectors)})
    model = SdramModel(chip, MHZ60)
    sim = Simulator(h)
    sim.add_clock(MHZ60 * 1e-9)
    sim.add_testbench(amaranth_sdram(model, h.pins), background=True)
    out = {}

    async def bench(ctx):
        out["value"] = await export(ctx, h, None)

    sim.add_testbench(bench)
    sim.run()
    exp, imp, (got_rings, meta) = out["value"]
    assert (exp, imp) == (RecordStatus.OK.value, (RecordStatus.OK.value, count, 77, 5))
    assert (exp, imp) == ref[:2]
    assert meta == ref[2][1] == [(count, head)]
    assert (got_rings == ref[2][0]).all()
    # the record in the SDRAM, word for word, is the sector model's bytes
    for lba in written:
        assert sdram_sector(model, chip, lba) == sector_words(lba, image.read(lba))
    assert model.violations == []
