"""The initiator side of the storage port (``hw/storage/port.py``), for testing a storage
controller.

A storage controller (``SDSPIController``, ``SDNativeController``) is driven the way the DMA
drives it: a command, the write bytes or the read bytes, then one status. These drivers do that
from a testbench, with random idle cycles on every stream the testbench sources and random
withheld ``ready`` on every stream it sinks, so each controller is tested under backpressure:

* :func:`storage_write` and :func:`storage_read` -- Amaranth-simulator testbench coroutines;
* :class:`CocotbStorageHost` -- the same for the Verilated controller (cocotb).

The target side, a Python model of what answers a storage port, is ``sim/sector_model.py``.
The Amaranth drivers take the port's width from its data streams: a byte a transfer, or four on
a wide port (``StoragePortSignature(width=4)``, the first byte low); they count and return bytes
either way. Both drivers return the controller's :class:`~ringkv.hw.storage.StorageError`
together with what moved: a write stops offering bytes once the status arrives (an early error
status ends the data phase), a read returns the bytes handed over before the status.
"""

import random

from ringkv.hw.storage.port import StorageCommand, StorageError, StorageOp, StorageStatus

from .streams import stream_put

__all__ = ["storage_write", "storage_read", "CocotbStorageHost", "STORAGE_CMD_FIELDS"]

#: The storage command's fields in its flat Verilog payload, first at the LSB, read from
#: :data:`~ringkv.hw.storage.StorageCommand` (``op``, ``lba``, ``count``).
STORAGE_CMD_FIELDS = [(name, field.width) for name, field in StorageCommand]
_STATUS_FIELDS = [(name, field.width) for name, field in StorageStatus]


def _width(port):
    """Bytes a data transfer of ``port`` (1, or 4 on a wide port: ``StoragePortSignature``)."""
    return len(port.rdata.payload) // 8


def _status_ready(ctx, port, rng, hold, data_done):
    """``status.ready`` for the next clock: high during the data phase (the port's rule), then
    withheld with probability ``hold``."""
    take = not (data_done and rng is not None and hold > 0 and rng.random() < hold)
    ctx.set(port.status.ready, int(take))
    return take


async def storage_write(ctx, port, lba, data, *, count=None, rng=None, idle=0.0, hold=0.0):
    """Write ``data`` at ``lba`` through ``port`` (the controller's ``storage`` interface).

    ``count`` sectors are asked for (default ``len(data) // 512``: a test may ask for more or
    fewer than it sends). With ``rng``, each clock is idle with probability ``idle`` (the
    command too), and once every byte is sent ``status.ready`` is withheld with probability
    ``hold``. Returns ``(StorageError, bytes the controller took)``.
    """
    count = len(data) // 512 if count is None else count
    await stream_put(ctx, port.cmd, {"op": StorageOp.WRITE, "lba": lba, "count": count},
                     rng=rng, idle=idle)
    w = _width(port)
    i = 0
    while True:
        st_ready = _status_ready(ctx, port, rng, hold, i == len(data))
        if i < len(data):
            if rng is not None and rng.random() < idle:
                ctx.set(port.wdata.valid, 0)
            else:
                ctx.set(port.wdata.valid, 1)
                ctx.set(port.wdata.payload, int.from_bytes(data[i:i + w], "little"))
        _, _, ready, valid, st_valid, st = await ctx.tick().sample(
            port.wdata.ready, port.wdata.valid, port.status.valid, port.status.payload)
        if ready and valid and i < len(data):
            i += w
            if i == len(data):
                ctx.set(port.wdata.valid, 0)
        if st_valid and st_ready:
            ctx.set(port.wdata.valid, 0)
            ctx.set(port.status.ready, 0)
            return StorageError(st.error), i


async def storage_read(ctx, port, lba, count, *, rng=None, stall=0.0, hold=0.0):
    """Read ``count`` sectors at ``lba`` through ``port``; ``ready`` on the read bytes is
    withheld with probability ``stall`` per clock (and the command idles as often), and once
    all ``count * 512`` bytes are in, ``status.ready`` with probability ``hold``.
    Returns ``(StorageError, the bytes received)``."""
    await stream_put(ctx, port.cmd, {"op": StorageOp.READ, "lba": lba, "count": count},
                     rng=rng, idle=stall)
    w = _width(port)
    out = bytearray()
    while True:
        st_ready = _status_ready(ctx, port, rng, hold, len(out) == count * 512)
        take = not (rng is not None and rng.random() < stall)
        ctx.set(port.rdata.ready, int(take))
        _, _, valid, byte, st_valid, st = await ctx.tick().sample(
            port.rdata.valid, port.rdata.payload, port.status.valid, port.status.payload)
        if take and valid:
            out += byte.to_bytes(w, "little")
        if st_valid and st_ready:
            ctx.set(port.rdata.ready, 0)
            ctx.set(port.status.ready, 0)
            return StorageError(st.error), bytes(out)


class CocotbStorageHost:
    """Drive the storage port ``prefix`` of a Verilated ``dut`` (clock ``dut.clk``, reset
    ``dut.rst``) with idle and stall probability ``p`` on every stream, from ``seed``.

    :meth:`write` and :meth:`read` are whole transfers; :meth:`send_cmd` and :meth:`recv_status`
    are their halves, for a command that has no data phase (a zero count)."""

    def __init__(self, dut, seed, p, prefix="storage"):
        # imported here: cocotb is importable only inside a cocotb run
        from .cocotb_streams import StreamSink, StreamSource

        self.dut, self.prefix, self.p = dut, prefix, p
        rng = random.Random(seed)
        self.cmd = StreamSource(dut, f"{prefix}__cmd", dut.clk, idle=p,
                                rng=random.Random(rng.random()))
        self.wdata = StreamSource(dut, f"{prefix}__wdata", dut.clk, idle=p,
                                  rng=random.Random(rng.random()))
        self.status = StreamSink(dut, f"{prefix}__status", dut.clk)
        self.rng = rng

    def _sig(self, name):
        return getattr(self.dut, f"{self.prefix}__{name}")

    async def reset(self):
        """Hold ``rst`` for 3 clocks."""
        from cocotb.triggers import RisingEdge

        self.dut.rst.value = 1
        for _ in range(3):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0

    async def recv_status(self):
        """Wait for the controller's status; returns its :class:`StorageError`."""
        from .cocotb_streams import unpack_fields

        return StorageError(unpack_fields(_STATUS_FIELDS, await self.status.recv())["error"])

    async def send_cmd(self, op, lba, count):
        """Offer one storage command (``op`` a :class:`~ringkv.hw.storage.StorageOp`)."""
        from .cocotb_streams import pack_fields

        await self.cmd.send(pack_fields(STORAGE_CMD_FIELDS,
                                        {"op": op.value, "lba": lba, "count": count}))

    async def write(self, lba, data):
        """Write ``data`` (whole sectors) at ``lba``; returns the status."""
        import cocotb

        await self.send_cmd(StorageOp.WRITE, lba, len(data) // 512)
        sender = cocotb.start_soon(self.wdata.send_all(data))
        status = await self.recv_status()
        if not sender.done():
            sender.cancel()
            self._sig("wdata__valid").value = 0
        return status

    async def read(self, lba, count):
        """Read ``count`` sectors at ``lba``; returns ``(status, the bytes received)``."""
        from cocotb.triggers import ReadOnly, RisingEdge

        await self.send_cmd(StorageOp.READ, lba, count)
        d, ready = self.dut, self._sig("rdata__ready")
        out = bytearray()
        self._sig("status__ready").value = 1
        while True:
            take = self.rng.random() >= self.p
            ready.value = int(take)
            await ReadOnly()
            if take and int(self._sig("rdata__valid").value):
                out.append(int(self._sig("rdata__payload").value))
            done = int(self._sig("status__valid").value)
            status = int(self._sig("status__payload").value)
            await RisingEdge(d.clk)
            if done:
                self._sig("status__ready").value = 0
                ready.value = 0
                return StorageError(status), bytes(out)
