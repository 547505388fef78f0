"""Fast sector-level storage model over an image file, for system simulation.

:class:`SectorImage` is a disk image (a plain file of 512-byte sectors, or memory only); every
completed sector write goes to the file at once, so stopping the simulator mid-export and
starting a new one on the same file is a power cycle. The same file can be given to the
bit-level SD card model (``sim/sdcard_model.py``) and to ``python -m ringkv.host.record``.

The storage port (``hw/storage/port.py``) is served from Python, at up to one byte per clock:

* :func:`serve_storage` -- an Amaranth-simulator testbench coroutine;
* :class:`CocotbStorageServer` -- a cocotb coroutine for the Verilated design.

Both take ``rng`` with ``idle`` (probability of a bubble before each read byte / status) and
``stall`` (probability of withholding ``ready`` on ``cmd``/``wdata``), a ``cut_after`` budget of
written bytes after which the "power" fails (:class:`PowerCut` is raised: the sector being
written is torn, holding the bytes received so far), ``dead`` to make the medium stop
answering (the server then reports ``TIMEOUT``, as the SD controller does), and (Amaranth
server) ``error_after``: after that many written bytes the target stops the data phase early and
answers ``CARD`` at once (once; the storage contract's early error status), and ``fail``: a
per-command failure hook (``fail(op, lba, count)``: ``None``, or the data bytes after which
that transfer, a read or a write, ends early with ``CARD``). The tiered storage's tests serve
both of its backends with it (``sim/tiered_sim.py``).

:class:`CocotbStorageServer` also takes ``pace``, a :class:`StoragePace`: the clocks an SD
card takes, instead of a byte a clock. :data:`CARD_PACES` names them: ``"sd4"`` is the pace of
our SD native controller (``hw/storage/sdnative.py``, 4-bit bus at half the system clock) with
the bit-level card model's best-case timing, as ``bench storage`` measured it (the
``storage.sd4.*`` figures: 2,208 clocks for one sector read and 17,038 for eight, 2,549 and
17,620 written). A real card is slower still (its read access time and write busy time are
up to milliseconds, the model's 4 and 8 clocks): the pace is a lower bound of the card's cost.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from ringkv.hw.storage.port import SECTOR_BYTES, StorageError, StorageOp

from .streams import tick_until

__all__ = ["SectorImage", "PowerCut", "serve_storage", "CocotbStorageServer", "StoragePace",
           "CARD_PACES"]


@dataclass(frozen=True)
class StoragePace:
    """Clocks a storage target takes, beyond the one clock of each byte's handshake: a read
    waits ``read_command`` clocks after its command, then ``read_gap`` before each sector and
    ``byte - 1`` after each byte; a write waits ``byte - 1`` after each byte, ``write_gap``
    after each sector and ``write_command`` before its status. One sector read costs
    ``read_command + read_gap + 512 * byte`` clocks and each further one ``read_gap + 512 *
    byte``; writes likewise."""
    byte: int
    read_command: int
    read_gap: int
    write_command: int
    write_gap: int

    def read_clocks(self, sectors: int) -> int:
        """The clocks this pace adds to a read of ``sectors`` beyond a byte a clock."""
        return self.read_command + sectors * (self.read_gap + SECTOR_BYTES * (self.byte - 1))

    def write_clocks(self, sectors: int) -> int:
        """The clocks this pace adds to a write of ``sectors`` beyond a byte a clock."""
        return self.write_command + sectors * (self.write_gap + SECTOR_BYTES * (self.byte - 1))


#: Named paces (module docstring); ``"ideal"``: a byte a clock, the default.
CARD_PACES = {
    "ideal": None,
    # bench storage's storage.sd4 figures at half period 1: reads 2,208 (1 sector) and
    # 17,038 (8) clocks -> 2,119 a sector (4 clocks a byte + 71) and 89 a command; writes 2,549
    # and 17,620 -> 2,153 a sector (+ 105) and 396 a command
    "sd4": StoragePace(byte=4, read_command=89, read_gap=71, write_command=396, write_gap=105),
}


class PowerCut(Exception):
    """The simulated power failed during a write."""


class SectorImage:
    """A sector-addressed image: ``path`` (created/extended to ``sectors``) or memory only."""

    def __init__(self, path=None, sectors: int | None = None):
        self.path = Path(path) if path is not None else None
        if self.path is None:
            if sectors is None:
                raise ValueError("a memory image needs a size in sectors")
            self._mem = bytearray(sectors * SECTOR_BYTES)
            self.sectors = sectors
            return
        self._mem = None
        if not self.path.exists():
            self.path.write_bytes(b"")
        size = self.path.stat().st_size
        if sectors is not None and size < sectors * SECTOR_BYTES:
            with open(self.path, "r+b") as f:
                f.truncate(sectors * SECTOR_BYTES)
            size = sectors * SECTOR_BYTES
        self.sectors = size // SECTOR_BYTES
        self._file = open(self.path, "r+b")  # noqa: SIM115 (kept open for the model's life)

    def close(self):
        if self._mem is None and not self._file.closed:
            self._file.close()

    def read(self, lba: int, count: int = 1) -> bytes:
        if lba < 0 or lba + count > self.sectors:
            raise IndexError(f"sectors {lba}..{lba + count - 1} outside {self.sectors}")
        if self._mem is not None:
            return bytes(self._mem[lba * SECTOR_BYTES:(lba + count) * SECTOR_BYTES])
        self._file.seek(lba * SECTOR_BYTES)
        return self._file.read(count * SECTOR_BYTES)

    def write(self, lba: int, data: bytes):
        """Write at sector ``lba`` (``data`` may be a partial sector: a torn write)."""
        if lba < 0 or lba * SECTOR_BYTES + len(data) > self.sectors * SECTOR_BYTES:
            raise IndexError(f"write at sector {lba} outside {self.sectors}")
        if self._mem is not None:
            self._mem[lba * SECTOR_BYTES:lba * SECTOR_BYTES + len(data)] = data
            return
        self._file.seek(lba * SECTOR_BYTES)
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())

    def in_range(self, lba: int, count: int) -> bool:
        return count > 0 and lba + count <= self.sectors

    def __getitem__(self, key):
        """Byte access for tests: ``image[a:b]``."""
        if self._mem is not None:
            return self._mem[key]
        self._file.seek(0)
        return self._file.read()[key]


class _Budget:
    def __init__(self, cut_after):
        self.left = cut_after

    def take(self):
        """One byte written; True if the power fails before it lands."""
        if self.left is None:
            return False
        if self.left == 0:
            return True
        self.left -= 1
        return False


async def serve_storage(ctx, port, image: SectorImage, *, rng=None, idle=0.0, stall=0.0,
                        cut_after=None, dead=False, log=None, error_after=None, fail=None):
    """Serve storage port ``port`` (an initiator's storage-port member) forever, at up to one
    byte per clock.

    Run it with ``sim.add_testbench(..., background=True)``. ``log`` (a list) receives
    ``(op, lba, count)`` of each command. ``dead`` (a bool, or a callable asked at each
    command: the card can go and come back) makes every command end in ``TIMEOUT``.
    ``error_after``: the write data byte after which the target answers ``CARD`` at once
    (the rest of that transfer's data is not taken; the sector being written is not stored).
    ``fail(op, lba, count)`` (optional) is asked at each command in range: ``None``, or the
    number of data bytes after which that transfer ends early with ``CARD`` (a write's sector
    in progress is not stored, earlier ones are; ``0``: no data phase at all).
    A wide port (``StoragePortSignature(width=4)``) moves four bytes a transfer, the first
    low: byte counts (``error_after``, ``fail``) end at the last whole transfer before them,
    and a power cut (``cut_after``) still falls between two bytes of a sector.
    """
    budget = _Budget(cut_after)
    error_budget = [error_after]
    w = len(port.rdata.payload) // 8       # bytes a data transfer (a wide port: 4)

    def chance(p):
        return rng is not None and p > 0 and rng.random() < p

    async def status(error):
        while chance(idle):
            await ctx.tick()
        ctx.set(port.status.valid, 1)
        ctx.set(port.status.payload, {"error": error})
        await tick_until(ctx, port.status.ready)
        ctx.set(port.status.valid, 0)

    while True:
        while chance(stall):
            await ctx.tick()
        ctx.set(port.cmd.ready, 1)
        (cmd,) = await tick_until(ctx, port.cmd.valid, port.cmd.payload)
        ctx.set(port.cmd.ready, 0)
        op, lba, count = cmd.op, cmd.lba, cmd.count
        if log is not None:
            log.append((op, lba, count))
        if dead() if callable(dead) else dead:
            await ctx.tick().repeat(20)
            await status(StorageError.TIMEOUT)
            continue
        if not image.in_range(lba, count):
            await status(StorageError.RANGE)
            continue
        # Within a transfer ``valid`` (``ready``) stays high from one byte to the next unless
        # an idle (stall) clock comes between them: the design sees the same value at every
        # clock edge as if it were dropped and raised again between two edges, and the
        # simulator does not settle the whole design twice more per byte (each ``ctx.set``
        # that changes a value does): the top's tests run about 15 % faster.
        fail_at = fail(StorageOp(op), lba, count) if fail is not None else None
        if op == StorageOp.READ:
            data = image.read(lba, count)
            if fail_at is not None and fail_at < len(data):
                data = data[:fail_at - fail_at % w]         # whole transfers
            for i in range(0, len(data), w):
                while chance(idle):
                    ctx.set(port.rdata.valid, 0)
                    await ctx.tick()
                ctx.set(port.rdata.valid, 1)
                ctx.set(port.rdata.payload, int.from_bytes(data[i:i + w], "little"))
                await tick_until(ctx, port.rdata.ready)
            ctx.set(port.rdata.valid, 0)
            if fail_at is not None and fail_at < count * SECTOR_BYTES:
                await status(StorageError.CARD)
                continue
        else:
            failed = False
            moved = 0
            for s in range(count):
                sector = bytearray()
                for _ in range(SECTOR_BYTES // w):
                    if (error_budget[0] is not None and error_budget[0] < w) or (
                            fail_at is not None and moved + w > fail_at):
                        failed = True
                        break
                    while chance(stall):
                        ctx.set(port.wdata.ready, 0)
                        await ctx.tick()
                    ctx.set(port.wdata.ready, 1)
                    (word,) = await tick_until(ctx, port.wdata.valid, port.wdata.payload)
                    for byte in word.to_bytes(w, "little"):
                        if budget.take():
                            ctx.set(port.wdata.ready, 0)
                            image.write(lba + s, bytes(sector))
                            raise PowerCut(f"power cut in sector {lba + s} after "
                                           f"{len(sector)} bytes")
                        sector.append(byte)
                    moved += w
                    if error_budget[0] is not None:
                        error_budget[0] -= w
                if failed:
                    break
                image.write(lba + s, bytes(sector))
            ctx.set(port.wdata.ready, 0)
            if failed:
                if error_budget[0] is not None and error_budget[0] < w:
                    error_budget[0] = None       # error_after fails once
                await status(StorageError.CARD)
                continue
        await status(StorageError.OK)


class CocotbStorageServer:
    """The same model for cocotb: ``cocotb.start_soon(server.run())``.

    ``prefix`` is the storage port's name in the Verilog (``storage`` gives ``storage__cmd__valid``
    and so on). The command payload is ``{op:1, lba:32, count:16}`` from the LSB.
    """

    def __init__(self, dut, prefix, clk, image, *, rng=None, idle=0.0, stall=0.0, cut_after=None,
                 dead=False, pace: StoragePace | None = None):
        self.dut, self.clk, self.image, self.pace = dut, clk, image, pace
        self.p = {name: getattr(dut, f"{prefix}__{name}") for name in (
            "cmd__valid", "cmd__ready", "cmd__payload", "wdata__valid", "wdata__ready",
            "wdata__payload", "rdata__valid", "rdata__ready", "rdata__payload",
            "status__valid", "status__ready", "status__payload")}
        self.rng, self.idle, self.stall, self.dead = rng, idle, stall, dead
        self.budget = _Budget(cut_after)
        self.cut = None
        self.log = []
        #: per op ("read", "write"): commands, sectors, and clocks from the command's
        #: transfer to its status' (the port busy), for ``on_done`` and the harness's stats
        self.stats = {op: {"commands": 0, "sectors": 0, "clocks": 0} for op in ("read", "write")}
        for name in ("cmd__ready", "wdata__ready", "rdata__valid", "status__valid"):
            self.p[name].value = 0

    def _now(self) -> int:
        from cocotb.utils import get_sim_time
        return get_sim_time("ps")

    def on_done(self, op: str) -> None:
        """Called after each command's status (``stats`` updated); nothing here."""

    def _chance(self, p):
        return self.rng is not None and p > 0 and self.rng.random() < p

    async def _edge(self):
        from cocotb.triggers import RisingEdge
        await RisingEdge(self.clk)

    async def _take(self, stream, may_stall):
        from cocotb.triggers import ReadOnly
        while True:
            ready = not (may_stall and self._chance(self.stall))
            self.p[f"{stream}__ready"].value = int(ready)
            await ReadOnly()
            valid = int(self.p[f"{stream}__valid"].value)
            value = int(self.p[f"{stream}__payload"].value) if valid else 0
            await self._edge()
            if ready and valid:
                self.p[f"{stream}__ready"].value = 0
                return value

    async def _give(self, stream, value):
        from cocotb.triggers import ReadOnly
        while self._chance(self.idle):
            await self._edge()
        self.p[f"{stream}__valid"].value = 1
        self.p[f"{stream}__payload"].value = value
        while True:
            await ReadOnly()
            ready = int(self.p[f"{stream}__ready"].value)
            await self._edge()
            if ready:
                break
        self.p[f"{stream}__valid"].value = 0

    #: the clock's period in ps (the harness's and the tests' 10 ns clock), for ``stats``
    period_ps = 10_000

    async def _wait(self, clocks):
        if clocks > 0:
            from cocotb.triggers import ClockCycles
            await ClockCycles(self.clk, clocks)

    async def run(self):
        pace = self.pace
        while True:
            word = await self._take("cmd", True)
            started = self._now()
            op, lba, count = word & 1, (word >> 1) & 0xFFFFFFFF, (word >> 33) & 0xFFFF
            self.log.append((op, lba, count))
            if self.dead:
                for _ in range(20):
                    await self._edge()
                await self._give("status", StorageError.TIMEOUT.value)
                continue
            if not self.image.in_range(lba, count):
                await self._give("status", StorageError.RANGE.value)
                continue
            if op == StorageOp.READ.value:
                data = self.image.read(lba, count)
                if pace is None:
                    for byte in data:
                        await self._give("rdata", byte)
                else:
                    await self._wait(pace.read_command)
                    for i, byte in enumerate(data):
                        if i % SECTOR_BYTES == 0:
                            await self._wait(pace.read_gap)
                        await self._give("rdata", byte)
                        await self._wait(pace.byte - 1)
            else:
                for s in range(count):
                    sector = bytearray()
                    for _ in range(SECTOR_BYTES):
                        byte = await self._take("wdata", True)
                        if self.budget.take():
                            self.image.write(lba + s, bytes(sector))
                            self.cut = (lba + s, len(sector))
                            return
                        sector.append(byte)
                        if pace is not None:
                            await self._wait(pace.byte - 1)
                    self.image.write(lba + s, bytes(sector))
                    if pace is not None:
                        await self._wait(pace.write_gap)
                if pace is not None:
                    await self._wait(pace.write_command)
            await self._give("status", StorageError.OK.value)
            st = self.stats["read" if op == StorageOp.READ.value else "write"]
            st["commands"] += 1
            st["sectors"] += count
            st["clocks"] += round((self._now() - started) / self.period_ps)
            self.on_done("read" if op == StorageOp.READ.value else "write")
