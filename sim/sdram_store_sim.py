"""The SDRAM sector store on the pin-level SDRAM model, in the Amaranth simulator: the shared
harness of ``tests/hw/storage/test_sdram_store.py`` and of the figures in
``docs/blocks/sdram_store.md``.

:class:`SdramStoreTop` is the store on one port of a real :class:`SdramController`;
:func:`run_store` drives its storage port with a script of reads and writes (``("r", lba,
count)``, ``("w", lba, data)``, ``("w", lba, data, count)`` to ask for another count than the
data holds), the SDRAM's pins with :class:`SdramModel`, and returns each operation's status,
bytes and clocks. :func:`preload` puts sectors into the model's memory before the run, as they
would be after earlier writes.
"""

import random
from dataclasses import dataclass, field

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from ringkv.host.golden.sdram import sector_words, split_command
from ringkv.hw.sdram.controller import SdramController
from ringkv.hw.sdram.phy import SdramPinsSignature
from ringkv.hw.storage.port import StorageOp, StoragePortSignature
from ringkv.hw.storage.sdram_store import SdramSectorStore

from .sdram_model import SdramModel, add_controller_clocks, amaranth_sdram, model_for_controller
from .storage_host import storage_read, storage_write
from .streams import tick_until

__all__ = ["SdramStoreTop", "StoreRun", "run_store", "preload", "sdram_sector", "transfer_clocks"]


class SdramStoreTop(wiring.Component):
    """:class:`SdramSectorStore` on port 0 of a one-port :class:`SdramController`.

    ``controller`` holds the controller's parameters (``chip``, ``tck_ns``, ``cl``, ``bl``,
    ...), ``store`` the store's (``sectors``, ``base``, ``width``, ``_bug``). Ports:
    ``storage`` (the store's), ``pins`` (the controller's), ``ready`` (the SDRAM's power-up is
    done)."""

    def __init__(self, controller: dict, store: dict | None = None):
        self.ctrl = SdramController(**controller)
        self.store = SdramSectorStore.for_controller(self.ctrl, **(store or {}))
        super().__init__({
            "storage": In(StoragePortSignature(self.store.width)),
            "pins": Out(SdramPinsSignature(self.ctrl.chip)),
            "ready": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.ctrl, m.submodules.store = self.ctrl, self.store
        wiring.connect(m, self.store.sdram, self.ctrl.port[0])
        wiring.connect(m, wiring.flipped(self.storage), self.store.storage)
        wiring.connect(m, wiring.flipped(self.pins), self.ctrl.pins)
        m.d.comb += self.ready.eq(self.ctrl.ready)
        return m


def preload(model: SdramModel, chip, lba: int, data: bytes, *, base: int = 0):
    """Put sectors ``data`` at sector ``lba`` into the model's memory (the store's layout)."""
    for addr, word in sector_words(lba, data, base=base).items():
        (location,) = split_command(chip, 1, addr, 1)
        model.memory[location] = word


def sdram_sector(model: SdramModel, chip, lba: int, *, base: int = 0) -> dict[int, int | None]:
    """Word address -> the model's word (``None``: never written) of sector ``lba``."""
    out = {}
    for addr in sector_words(lba, bytes(512), base=base):
        (location,) = split_command(chip, 1, addr, 1)
        out[addr] = model.memory.get(location)
    return out


@dataclass
class StoreRun:
    results: list = field(default_factory=list)   # per operation (StorageError, bytes read or
    #                                             the number of bytes a write took)
    clocks: list = field(default_factory=list)    # per operation: command offered to status
    first_byte: list = field(default_factory=list)  # per read with data: command to 1st byte
    model: SdramModel | None = None


def run_store(top: SdramStoreTop, script, *, model: SdramModel | None = None, seed=0,
              idle=0.0, stall=0.0, hold=0.0, gap=0, tail=0, max_cycles=2_000_000) -> StoreRun:
    """Run ``script`` on ``top.storage`` once the SDRAM is ready, ``gap`` idle clocks between
    operations and ``tail`` after the last (a write's last bursts reach the SDRAM's cells a
    few clocks after its status); ``idle``/``stall``/``hold``: the chances of an idle clock on
    ``cmd``/``wdata``, of a withheld ``rdata.ready`` and of a withheld ``status.ready``
    (``sim/storage_host.py``).
    ``clocks[i]``: from the clock operation ``i`` starts (its command offered, with no idle
    drawn) to the status's transfer; ``first_byte``: for each read that moved data, the
    clocks from its command's transfer to its first byte's."""
    model = model_for_controller(top.ctrl, seed=seed) if model is None else model
    run = StoreRun(model=model)
    rng = random.Random(seed)
    clock = {"n": 0}
    sim = Simulator(top)
    pin_domain = add_controller_clocks(sim, top.ctrl)
    sim.add_testbench(amaranth_sdram(model, top.pins, domain=pin_domain,
                                     pin_delay=top.ctrl.read_delay), background=True)

    async def counter(ctx):
        port, taken = top.storage, None
        async for _, _, c_valid, c_ready, c_op, r_valid, r_ready in ctx.tick().sample(
                port.cmd.valid, port.cmd.ready, port.cmd.payload.op, port.rdata.valid,
                port.rdata.ready):
            clock["n"] += 1
            if taken is not None and r_valid and r_ready:
                run.first_byte.append(clock["n"] - taken)
                taken = None
            if c_valid and c_ready and c_op == StorageOp.READ:
                taken = clock["n"]

    async def limit(ctx):
        for _ in range(max_cycles):
            await ctx.tick()
        raise TimeoutError(f"the store's script not done after {max_cycles} clocks")

    async def bench(ctx):
        await tick_until(ctx, top.ready)
        for op in script:
            for _ in range(gap):
                await ctx.tick()
            start = clock["n"]
            if op[0] == "r":
                res = await storage_read(ctx, top.storage, op[1], op[2], rng=rng, stall=stall,
                                         hold=hold)
            else:
                count = op[3] if len(op) > 3 else None
                res = await storage_write(ctx, top.storage, op[1], op[2], count=count, rng=rng,
                                          idle=idle, hold=hold)
            run.results.append(res)
            run.clocks.append(clock["n"] - start)
        for _ in range(tail):
            await ctx.tick()

    sim.add_process(counter)
    sim.add_testbench(limit, background=True)
    sim.add_testbench(bench)
    sim.run()
    return run



def transfer_clocks(controller: dict, counts=(1, 8, 256), *, lba: int = 0, seed: int = 0,
                    store: dict | None = None):
    """Exact clocks of a write and then a read of ``count`` sectors at ``lba`` for each of
    ``counts``, one after the other on a store over the whole chip, no idle and no
    backpressure: ``{("w" | "r", count): clocks}`` from the command offered to the status's
    transfer. Every read must return what was written (else ``AssertionError``). ``store``:
    the store's parameters (``width``, ...)."""
    top = SdramStoreTop(controller, store)
    rng = random.Random(seed)
    script = []
    for count in counts:
        data = rng.randbytes(count * 512)
        script += [("w", lba, data), ("r", lba, count)]
    run = run_store(top, script, seed=seed)
    out = {}
    for k, count in enumerate(counts):
        (w_error, _), (r_error, got) = run.results[2 * k:2 * k + 2]
        assert w_error == r_error == w_error.OK, f"{count} sectors: {w_error}, {r_error}"
        assert got == script[2 * k][2], f"the read of {count} sectors differs"
        out[("w", count)], out[("r", count)] = run.clocks[2 * k:2 * k + 2]
    return out
