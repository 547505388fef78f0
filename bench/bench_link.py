"""Link: frame decoder cycles per frame (exact, Amaranth simulator), UART and framing synthesis."""

from fractions import Fraction

from amaranth.sim import Simulator

from bench.run import SYNTH_HEADER, synth_result, synth_rows, table
from ringkv.boards.synth import synth_core
from ringkv.defs.protocol import Op
from ringkv.host.device.frames import encode_request
from ringkv.hw.link.framing import FrameDecoder, FrameEncoder
from ringkv.hw.link.uart import UART

TITLE = "Link (UART, frame decoder/encoder)"


def decoder_cycles(n: int) -> int:
    """Clocks from the SYNC byte's transfer to the last payload byte's (source/sink never
    stall)."""
    dut = FrameDecoder()
    frame = encode_request(Op.PING, 1, bytes(i & 0xFF for i in range(n)))
    result = {}

    async def bench(ctx):
        ctx.set(dut.header.ready, 1)
        ctx.set(dut.data.ready, 1)
        cycles, sent, done = 0, 0, False
        while not done:
            ctx.set(dut.i.valid, sent < len(frame))
            if sent < len(frame):
                ctx.set(dut.i.payload, frame[sent])
            _, _, ready, hv, dv, last = await ctx.tick().sample(
                dut.i.ready, dut.header.valid, dut.data.valid, dut.data.payload.last)
            sent += sent < len(frame) and ready
            cycles += 1
            done = (dv and last) or (n == 0 and hv)
        result["cycles"] = cycles

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return result["cycles"]


def run(smoke: bool = False):
    """Smoke: payloads 0 and 16, and the UART alone synthesized (the one real yosys and
    nextpnr run of the smoke groups: the synthesis path stays tested)."""
    results = []
    for n in (0, 16) if smoke else (0, 16, 256, 4096):
        results.append({"name": f"decoder.cycles.n{n}", "value": decoder_cycles(n),
                        "unit": "cycles", "params": {"payload": n}})
    cores = (("uart", lambda: UART(Fraction(25, 3)), {"divisor": "25/3"}),
             ("frame_decoder", FrameDecoder, {"max_payload": 4096}),
             ("frame_encoder", FrameEncoder, {}))
    for core, make, cfg in cores[:1] if smoke else cores:
        results.append(synth_result(core, cfg, synth_core(make(), core, freq_mhz=25.0)))
    return results


def markdown(results):
    rows = [[r["params"]["payload"], r["value"], r["params"]["payload"] * 2 + 9]
            for r in results if r["unit"] == "cycles"]
    return (table(["payload bytes n", "cycles SYNC in → last byte out", "2n + 9"], rows)
            + "\n\nReception takes n + 7 cycles, the check 1, the release 1 + n "
              "(header, then n bytes).\n\n"
            + table(SYNTH_HEADER, synth_rows(results)))
