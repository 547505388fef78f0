"""cocotb on Verilator: FrameDecoder/FrameEncoder against the golden framing model.

Run by ``tests/hw/link/test_framing.py`` through :func:`ringkv.sim.cocotb_run.run_cocotb`. The
decoder test is the link fuzz: thousands of random, mutated, truncated and garbage frames with
random idle and stalls; every frame the RTL accepts must be one the golden decoder accepts (and the
same errors), and the decoder must end idle and still decode a valid frame.
"""

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles

from ringkv.defs.protocol import SYNC
from ringkv.host.device.frames import (
    GAP,
    Frame,
    FrameError,
    decode_frames,
    encode_request,
    encode_response,
)
from ringkv.hw.protocol import Op, Status
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import StreamSink, StreamSource, pack_fields, unpack_fields

HEADER = [("op", 8), ("seq", 8), ("length", 16)]
DATA = [("data", 8), ("last", 1)]
ERROR = [("status", 8), ("op", 8), ("seq", 8)]
RESPONSE = [("op", 8), ("seq", 8), ("status", 8), ("length", 16)]
OPS = [op.value for op in Op]


async def _reset(dut):
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0


def fuzz_items(rng, frames, max_payload):
    items = []
    for _ in range(frames):
        n = rng.choice([0, 1, max_payload, max_payload + 1, rng.randrange(max_payload + 1)])
        frame = bytearray(encode_request(rng.choice(OPS + [0x00, 0x7F, 0xFF]),
                                         rng.randrange(256), rng.randbytes(n)))
        kind = rng.randrange(6)
        if kind == 0:
            frame[rng.randrange(len(frame))] ^= rng.randrange(1, 256)
        elif kind == 1:
            frame = frame[:rng.randrange(len(frame))]
        elif kind == 2:
            frame = bytearray(rng.randbytes(rng.randrange(16)))
        elif kind == 3:
            frame = bytearray([SYNC]) + rng.randbytes(rng.randrange(8))
        items += list(frame)
        if rng.random() < 0.25:
            items.append(GAP)
    return items + [GAP] + list(encode_request(Op.PING, 0x42, b"still alive"))


@cocotb.test(timeout_time=600, timeout_unit="sec")
async def decoder_fuzz(dut):
    p = cocotb_params()
    if p.get("unit") != "decoder":
        return
    rng = random.Random(p["seed"])
    max_payload, timeout = p["max_payload"], p["timeout"]
    await _reset(dut)
    items = fuzz_items(rng, p["frames"], max_payload)
    expected = decode_frames(items, max_payload)
    source = StreamSource(dut, "i", dut.clk, idle=0.0, rng=rng)
    sinks = {name: StreamSink(dut, name, dut.clk, stall=0.3, rng=random.Random(i))
             for i, name in enumerate(("header", "data", "error"))}
    got = {name: [] for name in sinks}

    async def collect(name):
        while True:
            got[name].append(await sinks[name].recv())

    tasks = [cocotb.start_soon(collect(name)) for name in sinks]
    for item in items:
        if item is GAP:
            await ClockCycles(dut.clk, timeout + 3)
            continue
        if rng.random() < 0.3:
            await ClockCycles(dut.clk, rng.randrange(1, timeout // 4))
        await source.send(item)
    await ClockCycles(dut.clk, timeout + 4 * max_payload + 100)
    for t in tasks:
        t.cancel()
    assert int(dut.i__ready.value) == 1, "decoder not back to hunting"

    frames, pos = [], 0
    data = [unpack_fields(DATA, w) for w in got["data"]]
    for word in got["header"]:
        h = unpack_fields(HEADER, word)
        chunk = data[pos:pos + h["length"]]
        pos += h["length"]
        assert [c["last"] for c in chunk] == [0] * (h["length"] - 1) + [1] * (h["length"] > 0)
        frames.append(Frame(h["op"], h["seq"], bytes(c["data"] for c in chunk)))
    assert pos == len(data)
    errors = [FrameError(**unpack_fields(ERROR, w)) for w in got["error"]]
    assert frames == [e for e in expected if isinstance(e, Frame)]
    assert errors == [e for e in expected if isinstance(e, FrameError)]
    assert frames[-1] == Frame(Op.PING.value, 0x42, b"still alive")
    dut._log.info(f"{len(items)} items: {len(frames)} frames, {len(errors)} errors "
                  f"{sorted({Status(e.status).name for e in errors})}")


@cocotb.test(timeout_time=200, timeout_unit="sec")
async def encoder_random(dut):
    p = cocotb_params()
    if p.get("unit") != "encoder":
        return
    rng = random.Random(p["seed"])
    await _reset(dut)
    responses = [(rng.choice(OPS), rng.randrange(256), rng.choice(list(Status)).value,
                  rng.randbytes(rng.choice([0, 1, rng.randrange(64)])))
                 for _ in range(p["frames"])]
    expected = b"".join(encode_response(*r) for r in responses)
    hdr = StreamSource(dut, "header", dut.clk, idle=0.3, rng=random.Random(1))
    dat = StreamSource(dut, "data", dut.clk, idle=0.3, rng=random.Random(2))
    sink = StreamSink(dut, "o", dut.clk, stall=0.3, rng=random.Random(3))

    async def headers():
        for op, seq, status, payload in responses:
            await hdr.send(pack_fields(RESPONSE, {"op": op, "seq": seq, "status": status,
                                                  "length": len(payload)}))

    async def payloads():
        for *_, payload in responses:
            await dat.send_all(payload)

    cocotb.start_soon(headers())
    cocotb.start_soon(payloads())
    got = bytes(await sink.recv_n(len(expected)))
    assert got == expected
    await sink.expect_idle(20)
