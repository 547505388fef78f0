"""Test bench pieces for :class:`ringkv.hw.top.RingKVTop`, reusable by tests and the TCP harness.

Amaranth simulator:

* :class:`SimByteLink` -- the host side of the byte link inside a testbench: ``await
  link.request(ctx, op, payload)`` sends an encoded request on ``rx`` (with optional random idle
  cycles) and returns the decoded response :class:`~ringkv.host.device.frames.Frame` (``await
  link.call(ctx, op, payload, status)``: its payload, the status checked); a background
  process (:meth:`SimByteLink.tx_process`) drains ``tx`` (with optional random stalls) through
  the golden response decoder;
* :func:`run_top` -- build a simulator of the top with the storage port served from a
  :class:`~ringkv.sim.sector_model.SectorImage` and run one async scenario;
* :class:`SimPort` -- a pyserial-like port (``write``/``read``/``in_waiting``) whose bytes
  go through a running simulation in a background thread, so :class:`ringkv.host.device.link.Link`
  and :class:`ringkv.host.device.fpga.FpgaDevice` drive the simulated gateware unchanged.

cocotb (Verilator): :class:`CocotbByteLink` (the same ``request`` and ``call`` as cocotb
coroutines, on the Verilog ports ``rx__*``/``tx__*``); the storage port is served by
:class:`ringkv.sim.sector_model.CocotbStorageServer` with ``prefix="storage"``;
:func:`cocotb_start_top` starts the clock, both, and the reset.
"""

import threading
import time
from collections import deque

from amaranth.sim import Simulator

from ringkv.defs.protocol import Status
from ringkv.host.device.frames import Decoder, Frame, encode_request

from . import cycle_signature
from .sector_model import SectorImage, serve_storage
from .streams import tick_until

__all__ = ["SimByteLink", "run_top", "SimPort", "CocotbByteLink", "cocotb_start_top",
           "image_for"]


def image_for(top, path=None) -> SectorImage:
    """A sector image exactly large enough for the top's regions (file ``path`` or memory)."""
    sectors = top.base_lba + top.regions * top.record_layout.sectors_per_region
    return SectorImage(path, sectors)


class SimByteLink:
    """The host end of ``top.rx`` / ``top.tx`` in the Amaranth simulator."""

    def __init__(self, top, *, rng=None, idle=0.0, stall=0.0):
        self.top, self.rng, self.idle, self.stall = top, rng, idle, stall
        self.decoder = Decoder(0xFFFF, response=True)
        self.events = deque()
        self.seq = 0
        self.cycles = 0

    async def tx_process(self, ctx):
        """Background: take every ``tx`` byte, feed the golden response decoder."""
        tx = self.top.tx
        while True:
            if self.rng is not None and self.stall > 0:
                while self.rng.random() < self.stall:
                    ctx.set(tx.ready, 0)
                    await ctx.tick()
            ctx.set(tx.ready, 1)
            (byte,) = await tick_until(ctx, tx.valid, tx.payload)
            self.events.extend(self.decoder.feed([byte]))

    async def send(self, ctx, data):
        """Put raw bytes on ``rx`` (one per clock when ready, random idle cycles if asked)."""
        rx = self.top.rx
        for byte in data:
            if self.rng is not None and self.idle > 0:
                while self.rng.random() < self.idle:
                    ctx.set(rx.valid, 0)
                    await ctx.tick()
            ctx.set(rx.valid, 1)
            ctx.set(rx.payload, byte)
            await tick_until(ctx, rx.ready)
        ctx.set(rx.valid, 0)

    async def receive(self, ctx, *, timeout=1_000_000):
        """The next decoded response event (:class:`Frame` or ``FrameError``)."""
        waited = 0
        while not self.events:
            await ctx.tick()
            waited += 1
            if waited > timeout:
                raise TimeoutError(f"no response within {timeout} clocks")
        self.cycles = waited
        return self.events.popleft()

    async def request(self, ctx, op, payload=b"", *, seq=None, timeout=1_000_000) -> Frame:
        """Send one request, return its response (checks the echoed opcode and sequence)."""
        if seq is None:
            self.seq = (self.seq + 1) & 0xFF
            seq = self.seq
        op = int(op.value if hasattr(op, "value") else op)
        await self.send(ctx, encode_request(op, seq, payload))
        frame = await self.receive(ctx, timeout=timeout)
        if not isinstance(frame, Frame) or frame.op != op or frame.seq != seq:
            raise AssertionError(f"unexpected response {frame!r} to op {op:#x} seq {seq}")
        return frame

    async def call(self, ctx, op, payload=b"", status=Status.OK, **kw) -> bytes:
        """:meth:`request`, the response's status required to be ``status``; its payload."""
        frame = await self.request(ctx, op, payload, **kw)
        if Status(frame.status) != status:
            raise AssertionError(f"{Status(frame.status)!r} (payload {frame.payload.hex()}) "
                                 f"to op {op!r}, expected {status!r}")
        return frame.payload


def run_top(top, image, scenario, *, rng=None, idle=0.0, stall=0.0, storage_rng=None,
            storage_idle=0.0, storage_stall=0.0, storage_dead=False, storage_log=None, vcd=None,
            wait_ready=True, monitors=(), sdram_image=None, sdram_log=None):
    """Simulate ``top`` with ``image`` on its storage port; ``await scenario(ctx, link)``.

    ``sdram_image``: ``top`` has an SDRAM hot tier (``RingKVTop(tier=...)``: its ``storage``
    is the card side) and this image serves its ``sdram`` side (``sdram_log`` its commands).

    ``wait_ready``: the scenario starts when the power-on recovery scan has ended
    (``top.recovering`` low); ``link.ready_cycles`` is then the clocks it took.
    ``monitors``: async functions ``f(ctx)`` run as background testbenches beside it (to watch
    internal streams; they must only read)."""
    link = SimByteLink(top, rng=rng, idle=idle, stall=stall)
    sim = Simulator(top)
    sim.add_clock(1e-8)

    async def storage(ctx):
        await serve_storage(ctx, top.storage, image, rng=storage_rng, idle=storage_idle,
                            stall=storage_stall, dead=storage_dead, log=storage_log)

    async def body(ctx):
        if wait_ready:
            link.ready_cycles = 0
            while ctx.get(top.recovering):
                await ctx.tick()
                link.ready_cycles += 1
        await scenario(ctx, link)

    sim.add_testbench(storage, background=True)
    if sdram_image is not None:
        async def sdram(ctx):
            await serve_storage(ctx, top.sdram, sdram_image, log=sdram_log)
        sim.add_testbench(sdram, background=True)
    sim.add_testbench(link.tx_process, background=True)
    for monitor in monitors:
        sim.add_testbench(monitor, background=True)
    sim.add_testbench(body)
    cycle_signature.tap(sim, top, relative=False)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()
    return link


class SimPort:
    """A serial-port-like byte pipe into a simulated top, simulated in a background thread.

    ``with SimPort(top, image) as port: Link(port, timeout=...)`` -- the simulation runs until
    :meth:`close`. The simulator only advances while a request is outstanding or a response
    is being sent (it idles in steps when nothing is pending), so the host's timeouts should
    allow for the simulator's speed (a few thousand clocks per second).
    """

    def __init__(self, top, image):
        self.top, self.image = top, image
        self._in = deque()                 # host -> device bytes
        self._out = bytearray()            # device -> host bytes
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error = None
        self.timeout = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    # -- pyserial-like interface -------------------------------------------------------
    def write(self, data):
        with self._lock:
            self._in.extend(bytes(data))
        return len(data)

    @property
    def in_waiting(self):
        self._check()
        with self._lock:
            return len(self._out)

    def read(self, n=1):
        self._check()
        deadline = time.monotonic() + 0.05
        while True:
            with self._lock:
                if self._out or time.monotonic() > deadline:
                    data = bytes(self._out[:n])
                    del self._out[:n]
                    return data
            time.sleep(0.001)

    def reset_input_buffer(self):
        with self._lock:
            self._out.clear()

    def close(self):
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check(self):
        if self._error is not None:
            raise RuntimeError("the simulation failed") from self._error

    # -- the simulation ---------------------------------------------------------------------
    def _run(self):
        top = self.top
        sim = Simulator(top)
        sim.add_clock(1e-8)

        async def storage(ctx):
            await serve_storage(ctx, top.storage, self.image)

        async def tx(ctx):
            ctx.set(top.tx.ready, 1)
            while True:
                (byte,) = await tick_until(ctx, top.tx.valid, top.tx.payload)
                with self._lock:
                    self._out.append(byte)

        async def rx(ctx):
            while not self._stop.is_set():
                with self._lock:
                    byte = self._in.popleft() if self._in else None
                if byte is None:
                    ctx.set(top.rx.valid, 0)
                    await ctx.tick().repeat(16)
                    continue
                ctx.set(top.rx.valid, 1)
                ctx.set(top.rx.payload, byte)
                await tick_until(ctx, top.rx.ready)
                ctx.set(top.rx.valid, 0)

        sim.add_testbench(storage, background=True)
        sim.add_testbench(tx, background=True)
        sim.add_testbench(rx)
        cycle_signature.tap(sim, top, relative=True)
        try:
            sim.run()
        except BaseException as e:      # surfaced to the host thread by _check()
            self._error = e


class CocotbByteLink:
    """The host end of the top's ``rx``/``tx`` for cocotb (Verilog names ``rx__valid`` ...).

    ``cocotb.start_soon(link.tx_process())`` once, then ``frame = await link.request(op,
    payload)``.
    """

    def __init__(self, dut, clk, *, rng=None, idle=0.0, stall=0.0):
        self.dut, self.clk, self.rng, self.idle, self.stall = dut, clk, rng, idle, stall
        self.decoder = Decoder(0xFFFF, response=True)
        self.events = deque()
        self.seq = 0
        dut.rx__valid.value = 0
        dut.tx__ready.value = 0

    def _chance(self, p):
        return self.rng is not None and p > 0 and self.rng.random() < p

    async def tx_process(self):
        from cocotb.triggers import ReadOnly, RisingEdge
        while True:
            ready = not self._chance(self.stall)
            self.dut.tx__ready.value = int(ready)
            await ReadOnly()
            valid = int(self.dut.tx__valid.value)
            byte = int(self.dut.tx__payload.value) if valid else 0
            await RisingEdge(self.clk)
            if ready and valid:
                self.events.extend(self.decoder.feed([byte]))

    async def send(self, data):
        from cocotb.triggers import ReadOnly, RisingEdge
        for byte in data:
            while self._chance(self.idle):
                self.dut.rx__valid.value = 0
                await RisingEdge(self.clk)
            self.dut.rx__valid.value = 1
            self.dut.rx__payload.value = byte
            while True:
                await ReadOnly()
                ready = int(self.dut.rx__ready.value)
                await RisingEdge(self.clk)
                if ready:
                    break
        self.dut.rx__valid.value = 0

    async def receive(self, timeout=1_000_000):
        from cocotb.triggers import RisingEdge
        waited = 0
        while not self.events:
            await RisingEdge(self.clk)
            waited += 1
            if waited > timeout:
                raise TimeoutError(f"no response within {timeout} clocks")
        return self.events.popleft()

    async def request(self, op, payload=b"", *, seq=None, timeout=1_000_000):
        if seq is None:
            self.seq = (self.seq + 1) & 0xFF
            seq = self.seq
        op = int(op.value if hasattr(op, "value") else op)
        await self.send(encode_request(op, seq, payload))
        frame = await self.receive(timeout)
        if not isinstance(frame, Frame) or frame.op != op or frame.seq != seq:
            raise AssertionError(f"unexpected response {frame!r} to op {op:#x} seq {seq}")
        return frame

    async def call(self, op, payload=b"", status=Status.OK, **kw) -> bytes:
        """:meth:`request`, the response's status required to be ``status``; its payload."""
        frame = await self.request(op, payload, **kw)
        if Status(frame.status) != status:
            raise AssertionError(f"{Status(frame.status)!r} (payload {frame.payload.hex()}) "
                                 f"to op {op!r}, expected {status!r}")
        return frame.payload


async def cocotb_start_top(dut, image, *, rng=None, link_idle=0.0, link_stall=0.0,
                           storage_idle=0.0, storage_stall=0.0, period_ns=10):
    """Start a cocotb bench of the whole top: the clock, the storage server on ``image`` (a
    :class:`~ringkv.sim.sector_model.SectorImage`) and the byte link, then 3 clocks of reset.
    Returns the :class:`CocotbByteLink`. ``rng`` (a :class:`random.Random`) drives both
    sides' random idle and stall cycles."""
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import RisingEdge

    from .sector_model import CocotbStorageServer

    Clock(dut.clk, period_ns, unit="ns").start()
    server = CocotbStorageServer(dut, "storage", dut.clk, image, rng=rng, idle=storage_idle,
                                 stall=storage_stall)
    link = CocotbByteLink(dut, dut.clk, rng=rng, idle=link_idle, stall=link_stall)
    dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    cocotb.start_soon(server.run())
    cocotb.start_soon(link.tx_process())
    return link
