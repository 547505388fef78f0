"""FrameDecoder / FrameEncoder in the Amaranth simulator against the golden model."""

import random

import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator
from conftest import requires_verilator

from ringkv.defs.protocol import SYNC
from ringkv.host.device.frames import (
    GAP,
    Decoder,
    Frame,
    FrameError,
    decode_frames,
    encode_request,
    encode_response,
)
from ringkv.hw.link.framing import FrameDecoder, FrameEncoder
from ringkv.hw.protocol import Op, Status
from ringkv.sim.streams import stream_put

OPS = [op.value for op in Op]


async def _collect(ctx, stream, out, rng, stall):
    while True:
        ready = rng.random() >= stall
        ctx.set(stream.ready, ready)
        _, _, valid, payload = await ctx.tick().sample(stream.valid, stream.payload)
        if ready and valid:
            out.append(payload)


def _collector(stream, out, rng, stall):
    async def testbench(ctx):
        await _collect(ctx, stream, out, rng, stall)
    return testbench


def rtl_decode(items, *, max_payload=64, timeout=40, idle=0.3, stall=0.3, seed=0):
    """Run ``items`` (bytes and GAPs) through the RTL decoder; return golden-style events.

    Frames and errors are compared as two ordered lists (the two streams are independent).
    Also returns whether the decoder was back in its hunting state at the end.
    """
    dut = FrameDecoder(max_payload=max_payload, timeout=timeout)
    rng = random.Random(seed)
    headers, payload, errors = [], [], []
    final = {}

    async def source(ctx):
        for item in items:
            if item is GAP:
                await ctx.tick().repeat(timeout + 3)
            else:
                # idle gaps far below the timeout
                gap = 0
                while rng.random() < idle and gap < timeout // 4:
                    await ctx.tick()
                    gap += 1
                await stream_put(ctx, dut.i, item)
        await ctx.tick().repeat(timeout + max_payload * 8 + 50)
        final["ready"] = ctx.get(dut.i.ready)
        final["busy"] = ctx.get(dut.header.valid) | ctx.get(dut.data.valid) | \
            ctx.get(dut.error.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(source)
    for stream, out in ((dut.header, headers), (dut.data, payload), (dut.error, errors)):
        sim.add_testbench(_collector(stream, out, rng, stall), background=True)
    sim.run()

    frames, pos = [], 0
    for h in headers:
        n = int(h.length)
        chunk = payload[pos:pos + n]
        pos += n
        assert [int(b.last) for b in chunk] == [0] * (n - 1) + [1] * (n > 0)
        frames.append(Frame(int(h.op), int(h.seq), bytes(int(b.data) for b in chunk)))
    assert pos == len(payload), "payload bytes without a header"
    errs = [FrameError(Status(e.status).value if not isinstance(e.status, Status)
                       else e.status.value, int(e.op), int(e.seq)) for e in errors]
    return frames, errs, final


def golden(items, max_payload=64):
    events = decode_frames(items, max_payload)
    return ([e for e in events if isinstance(e, Frame)],
            [e for e in events if isinstance(e, FrameError)])


def check(items, **kw):
    frames, errors, final = rtl_decode(items, **kw)
    g_frames, g_errors = golden(items, kw.get("max_payload", 64))
    assert frames == g_frames
    assert errors == g_errors
    assert final == {"ready": 1, "busy": 0}, "decoder did not return to idle"
    return frames, errors


def test_parameter_errors():
    with pytest.raises(ValueError, match=r"^Maximum payload must be between 1 and 65535, "
                                         r"not 0$"):
        FrameDecoder(max_payload=0)
    with pytest.raises(ValueError, match=r"^Maximum payload must be between 1 and 65535, "
                                         r"not 65536$"):
        FrameDecoder(max_payload=65536)
    with pytest.raises(ValueError, match=r"^Timeout must be a positive integer, not 0$"):
        FrameDecoder(timeout=0)
    with pytest.raises(TypeError, match=r"^Timeout must be an integer, not 2\.0$"):
        FrameDecoder(timeout=2.0)
    d = FrameDecoder(max_payload=100, timeout=7)
    Fragment.get(d, None)  # elaborates
    assert (d.max_payload, d.timeout) == (100, 7)


def _random_frame(rng, max_payload=64):
    n = rng.choice([0, 1, max_payload, rng.randrange(max_payload + 1)])
    return encode_request(rng.choice(OPS), rng.randrange(256), rng.randbytes(n))


def test_valid_frames_with_backpressure():
    rng = random.Random(1)
    stream = b"".join(_random_frame(rng) for _ in range(25))
    frames, errors = check(list(stream), idle=0.4, stall=0.5, seed=1)
    assert len(frames) == 25 and errors == []


def test_garbage_truncation_overlength_unknown_op():
    rng = random.Random(2)
    items = list(b"\x00\x13garbage" + bytes([SYNC, 0x7E]))     # SYNC inside garbage
    items += [GAP]                                              # ... which times out
    items += list(encode_request(Op.PING, 1, b"ok"))
    items += list(encode_request(Op.PING, 2, b"truncated")[:7]) + [GAP]
    items += list(encode_request(Op.STATS, 3, bytes(65)))       # over-length (max 64)
    items += [GAP]
    items += list(encode_request(0x7F, 4, b"x"))                # unknown opcode
    items += list(encode_request(Op.VERSION, 5))
    items += list(rng.randbytes(30)) + [GAP]
    items += list(encode_request(Op.PING, 6, b"end"))
    frames, errors = check(items, seed=2)
    assert [f.seq for f in frames][:2] == [1, 5] and frames[-1].seq == 6
    statuses = [e.status for e in errors]
    for s in (Status.TIMEOUT, Status.BAD_LENGTH, Status.UNKNOWN_OP):
        assert s.value in statuses


def test_every_single_byte_corruption():
    """Each byte of a frame corrupted in turn: never accepted, the next frame always is."""
    frame = encode_request(Op.TOKENS_WRITE, 9, bytes(range(1, 9)))
    items = []
    for pos in range(len(frame)):
        bad = bytearray(frame)
        bad[pos] ^= 0x5A
        items += list(bad) + [GAP] + list(encode_request(Op.PING, pos, b"!"))
    frames, errors = check(items, idle=0.1, stall=0.2, seed=3)
    assert frames == [Frame(Op.PING.value, pos, b"!") for pos in range(len(frame))]
    assert len(errors) == len(frame) - 1            # a corrupted SYNC is just skipped


def test_fuzz_random_and_malformed():
    """Random and mutated frames: RTL == golden, decoder always back to idle, still decodes."""
    rng = random.Random(4)
    items = []
    for _ in range(120):
        kind = rng.randrange(5)
        frame = bytearray(_random_frame(rng, 16))
        if kind == 0:
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        elif kind == 1:
            frame = frame[:rng.randrange(len(frame))]
        elif kind == 2:
            frame = bytearray(rng.randbytes(rng.randrange(12)))
        elif kind == 3:
            frame = bytearray([SYNC]) + rng.randbytes(rng.randrange(8))
        items += list(frame)
        if rng.random() < 0.3:
            items.append(GAP)
    items += [GAP] + list(encode_request(Op.PING, 77, b"alive"))
    frames, _ = check(items, max_payload=16, timeout=30, idle=0.2, stall=0.3, seed=5)
    assert frames[-1] == Frame(Op.PING.value, 77, b"alive")


def rtl_encode(responses, *, idle=0.3, stall=0.3, seed=0):
    dut = FrameEncoder()
    rng = random.Random(seed)
    out = []
    total = sum(len(encode_response(*r)) for r in responses)

    async def headers(ctx):
        for op, seq, status, payload in responses:
            await stream_put(ctx, dut.header, {"op": op, "seq": seq, "status": status,
                                               "length": len(payload)}, rng=rng, idle=idle)

    async def data(ctx):
        for *_, payload in responses:
            for b in payload:
                await stream_put(ctx, dut.data, b, rng=rng, idle=idle)

    async def sink(ctx):
        while len(out) < total:
            ready = rng.random() >= stall
            ctx.set(dut.o.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if ready and valid:
                out.append(payload)
        await ctx.tick().repeat(20)
        assert not ctx.get(dut.o.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(headers, background=True)
    sim.add_testbench(data, background=True)
    sim.add_testbench(sink)
    sim.run()
    return bytes(out)


def test_encoder_bit_exact():
    rng = random.Random(6)
    responses = [(Op.PING.value, 0, Status.OK, b""), (Op.STATS.value, 255, Status.BAD_CRC, b"\xa5")]
    responses += [(rng.choice(OPS), rng.randrange(256), rng.choice(list(Status)),
                   rng.randbytes(rng.choice([0, 1, rng.randrange(40)]))) for _ in range(20)]
    got = rtl_encode(responses, seed=6)
    assert got == b"".join(encode_response(*r) for r in responses)
    decoded = Decoder(response=True).feed(got)
    assert [(f.op, f.seq, f.status, f.payload) for f in decoded] == \
        [(op, seq, st.value, p) for op, seq, st, p in responses]


def _cocotb_fuzz(frames, seed):
    from ringkv.sim.cocotb_run import run_cocotb
    run_cocotb(FrameDecoder(max_payload=32, timeout=40), toplevel="frame_decoder",
               test_module="cocotb_framing", testcase="decoder_fuzz",
               params={"unit": "decoder", "seed": seed, "frames": frames, "max_payload": 32,
                       "timeout": 40})


@requires_verilator
def test_cocotb_decoder_fuzz():
    """The link fuzz on Verilator: random/malformed frames against the golden decoder."""
    _cocotb_fuzz(300, 7)


@pytest.mark.slow
@requires_verilator
def test_cocotb_decoder_fuzz_thousands():
    """Link fuzz: 4000 random and malformed frames."""
    _cocotb_fuzz(4000, 8)


@requires_verilator
def test_cocotb_encoder():
    from ringkv.sim.cocotb_run import run_cocotb
    run_cocotb(FrameEncoder(), toplevel="frame_encoder", test_module="cocotb_framing",
               testcase="encoder_random", params={"unit": "encoder", "seed": 8, "frames": 60})
