"""cocotb side of the simulation harness: the Verilator-built top behind a TCP socket.

Started by :func:`ringkv.sim.harness.serve` (``ringkv sim``), never by pytest directly. The
test ``serve`` listens on ``127.0.0.1:port``, moves the bytes of one connection at a time into
the top's ``rx`` stream and its ``tx`` stream back to the socket, and serves the ``storage``
port from the image file (:class:`~ringkv.sim.sector_model.SectorImage`, fsync'd per sector:
killing the simulator is a power cut, restarting it on the same image a power cycle). A top
with an SDRAM hot tier (``sdram_sectors`` not 0) has its ``sdram`` port served the same way
from memory: the SDRAM's contents are lost with the process, as at a power cut. With
``cut_after`` the power fails by itself after that many bytes written to storage: the sector
being written is torn and the process exits at once.

Speed: the Python side wakes only when something happens. ``tx`` is always ready and is
watched by a value-change trigger on ``tx__valid``; the storage model waits for
``storage__cmd__valid`` the same way; the receive side sleeps in simulated time (one timer
callback per 256 clocks) while the socket is quiet. Verilator runs free in between.
"""

import json
import os
import queue
import signal
import socket
import sys
import threading

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge, Timer

from .sector_model import CocotbStorageServer, SectorImage

__all__ = ["serve", "POWER_CUT_EXIT", "LISTEN_FAILED_EXIT"]

CLOCK_NS = 10
#: Exit status of the simulator after a power cut (``cut_after``).
POWER_CUT_EXIT = 75
#: Exit status of the simulator when it cannot listen on its port (in use, not allowed).
LISTEN_FAILED_EXIT = 76


class _EventStorage(CocotbStorageServer):
    """The sector model, but asleep (no per-clock callback) until a command is offered."""

    async def _take(self, stream, may_stall):
        if stream == "cmd":
            await ReadOnly()
            if not int(self.p["cmd__valid"].value):
                await RisingEdge(self.p["cmd__valid"])
            else:
                await RisingEdge(self.clk)
        return await super()._take(stream, may_stall)


class _Socket:
    """Accepts connections in a thread; received bytes go to ``rx``, ``send`` writes back."""

    def __init__(self, port):
        self.rx = queue.Queue()
        self.conn = None
        self.closed = threading.Event()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conn = conn
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    break
                self.rx.put(data)
            self.conn = None
            conn.close()
            self.rx.put(None)   # end of a connection

    def send(self, data: bytes):
        conn = self.conn
        if conn is not None:
            try:
                conn.sendall(data)
            except OSError:
                pass


@cocotb.test(timeout_time=None)
async def serve(dut):
    params = json.loads(os.environ["RINGKV_SERVE"])
    # Ctrl-C at a terminal reaches the whole foreground process group: the ringkv process
    # that started this simulator stops it; here it would only print a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Clock(dut.clk, CLOCK_NS, unit="ns").start()
    dut.rst.value = 1
    dut.rx__valid.value = 0
    dut.tx__ready.value = 1
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    image = SectorImage(params["image"], params["sectors"])
    storage = _EventStorage(dut, "storage", dut.clk, image, cut_after=params.get("cut_after"))
    cocotb.start_soon(_storage(storage))
    if params.get("sdram_sectors"):
        sdram = _EventStorage(dut, "sdram", dut.clk, SectorImage(None, params["sdram_sectors"]))
        cocotb.start_soon(sdram.run())
    try:
        sock = _Socket(params["port"])
    except OSError as e:
        print(f"ringkv: cannot listen on 127.0.0.1:{params['port']}: {e.strerror or e}",
              file=sys.stderr, flush=True)
        os._exit(LISTEN_FAILED_EXIT)
    cocotb.start_soon(_tx_to_socket(dut, sock))
    # The parent process waits for this line to know where to connect.
    print(f"RINGKV-SIM listening on socket://127.0.0.1:{sock.port}", flush=True)

    connections = 0
    idle_rounds = 0
    while True:
        try:
            chunk = sock.rx.get_nowait()
        except queue.Empty:
            chunk = b""
        if chunk is None:
            connections += 1
            if params.get("once") and connections >= 1:
                break
            continue
        if not chunk:
            idle_rounds += 1
            if idle_rounds > 64:
                # Nothing in flight for a while: let the host catch up without spinning.
                sock.closed.wait(0.0005)
            await Timer(256 * CLOCK_NS, unit="ns")
            await RisingEdge(dut.clk)
            continue
        idle_rounds = 0
        for byte in chunk:
            dut.rx__valid.value = 1
            dut.rx__payload.value = byte
            while True:
                await ReadOnly()
                ready = int(dut.rx__ready.value)
                await RisingEdge(dut.clk)
                if ready:
                    break
        dut.rx__valid.value = 0
    image.close()
    sock.listener.close()


async def _storage(storage):
    """Serve the storage port; after a power cut (``cut_after`` written bytes, the sector in
    progress torn) the whole simulated device stops at once: the process exits with
    :data:`POWER_CUT_EXIT`, the image keeping every byte written so far."""
    await storage.run()
    print(f"RINGKV-SIM power cut in sector {storage.cut[0]} after {storage.cut[1]} bytes",
          flush=True)
    os._exit(POWER_CUT_EXIT)


async def _tx_to_socket(dut, sock):
    pending = bytearray()
    while True:
        await ReadOnly()
        if int(dut.tx__valid.value):
            pending.append(int(dut.tx__payload.value))
            await RisingEdge(dut.clk)
            continue
        if pending:
            sock.send(bytes(pending))
            pending.clear()
        await RisingEdge(dut.tx__valid)
