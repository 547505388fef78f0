"""cocotb drivers for Amaranth streams in generated Verilog, with random idle and backpressure.

A stream port ``i`` appears in the Verilog as ``i__valid``, ``i__ready``, ``i__payload`` (the
payload of a struct layout is one flat vector, first field at the LSB; pack it with
:func:`pack_fields`). Drivers change inputs just after the rising edge and sample on it, so they
obey the stream rules: ``valid`` never waits for ``ready`` and the payload holds until the
transfer. ``check_commands`` runs a command/response block (the directory, the hot tier)
against a golden model's responses.
"""

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

__all__ = ["StreamSource", "StreamSink", "pack_fields", "unpack_fields", "check_commands"]


def pack_fields(fields, values: dict) -> int:
    """Pack ``values`` by ``fields`` = [(name, width), ...], first field at the LSB."""
    word, shift = 0, 0
    for name, width in fields:
        word |= (int(values.get(name, 0)) & ((1 << width) - 1)) << shift
        shift += width
    return word


def unpack_fields(fields, word: int) -> dict:
    out, shift = {}, 0
    for name, width in fields:
        out[name] = (word >> shift) & ((1 << width) - 1)
        shift += width
    return out


class StreamSource:
    """Drive stream ``prefix`` of ``dut`` (the DUT's input stream)."""

    def __init__(self, dut, prefix: str, clk, *, idle: float = 0.0, rng=None):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready", None)
        self.payload = getattr(dut, f"{prefix}__payload", None)
        self.clk = clk
        self.idle = idle
        self.rng = rng or random.Random(0)
        self.valid.value = 0

    async def send(self, payload: int):
        while self.idle and self.rng.random() < self.idle:
            await RisingEdge(self.clk)
        self.valid.value = 1
        if self.payload is not None:
            self.payload.value = payload
        while True:
            # Decide on settled values, then let the edge do the transfer.
            await ReadOnly()
            ready = self.ready is None or bool(int(self.ready.value))
            await RisingEdge(self.clk)
            if ready:
                break
        self.valid.value = 0

    async def send_all(self, payloads):
        for payload in payloads:
            await self.send(payload)


class StreamSink:
    """Consume stream ``prefix`` of ``dut`` (the DUT's output stream)."""

    def __init__(self, dut, prefix: str, clk, *, stall: float = 0.0, rng=None):
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready", None)
        self.payload = getattr(dut, f"{prefix}__payload", None)
        self.clk = clk
        self.stall = stall
        self.rng = rng or random.Random(1)
        if self.ready is not None:
            self.ready.value = 0

    async def recv(self) -> int:
        while True:
            ready = not (self.stall and self.rng.random() < self.stall)
            if self.ready is not None:
                self.ready.value = int(ready)
            await ReadOnly()
            valid = bool(int(self.valid.value))
            value = int(self.payload.value) if (valid and self.payload is not None) else 0
            await RisingEdge(self.clk)
            if ready and valid:
                if self.ready is not None:
                    self.ready.value = 0
                return value

    async def recv_n(self, count: int) -> list[int]:
        return [await self.recv() for _ in range(count)]

    async def expect_idle(self, cycles: int):
        """Assert that nothing is offered for ``cycles`` clocks."""
        for _ in range(cycles):
            await RisingEdge(self.clk)
            await ReadOnly()
            assert not int(self.valid.value), "unexpected output"


async def check_commands(dut, cmd_fields, resp_fields, commands, expected, *, seed: int,
                         idle: float, stall: float):
    """Start ``dut``'s clock, reset it, send ``commands`` (dicts of ints, packed by
    ``cmd_fields``) on its stream ``i`` with ``idle``, and check each response on ``o``
    (unpacked by ``resp_fields``, received with ``stall``) against ``expected``; then nothing
    more may be offered. The sender's and the receiver's randomness come from ``seed + 1`` and
    ``seed + 2``."""
    Clock(dut.clk, 10, unit="ns").start()
    source = StreamSource(dut, "i", dut.clk, idle=idle, rng=random.Random(seed + 1))
    sink = StreamSink(dut, "o", dut.clk, stall=stall, rng=random.Random(seed + 2))
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    sender = cocotb.start_soon(source.send_all(pack_fields(cmd_fields, c) for c in commands))
    for n, (cmd, want) in enumerate(zip(commands, expected)):
        got = unpack_fields(resp_fields, await sink.recv())
        assert got == want, f"command {n} {cmd}: got {got}, expected {want}"
    await sender
    await sink.expect_idle(4)
