"""Record MAC core: bytes per clock and overhead per message (exact, Amaranth simulator) and
synthesis of the MAC with its key slots on the LFE5U-85F at the board's 40 MHz."""

import random

from amaranth.sim import Simulator

from bench.run import SYNTH_HEADER, synth_or_elaborate, synth_result, synth_rows, table
from ringkv.defs.mac import KEY_ID_BYTES, PERSON_RECORD
from ringkv.host.golden_mac import mac
from ringkv.hw.mac import MacUnit

TITLE = "Record MAC (keyed BLAKE2s)"


def measure(length: int, seed: int = 0) -> dict:
    """One message of ``length`` bytes offered back to back right after ``cmd``: clocks from
    ``cmd``'s transfer to the last byte's, and from the last byte's to the tag."""
    dut = MacUnit()
    rng = random.Random(seed)
    key, message = rng.randbytes(32), rng.randbytes(length)
    out = {}

    async def bench(ctx):
        raw = (1).to_bytes(KEY_ID_BYTES, "little") + key
        for index, byte in enumerate(raw):
            ctx.set(dut.key_write.valid, 1)
            ctx.set(dut.key_write.payload, {"slot": 0, "index": index, "data": byte})
            await ctx.tick()
        ctx.set(dut.key_write.valid, 0)
        ctx.set(dut.cmd.valid, 1)
        ctx.set(dut.cmd.payload, {"person": 0, "slot": 0, "empty": int(not message)})
        await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)
        clocks, stalls = 0, 0
        for j, byte in enumerate(message):
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload, {"data": byte, "last": int(j == length - 1)})
            stalls += not ctx.get(dut.i.ready)
            await ctx.tick().until(dut.i.ready)
            clocks += 1
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.o.ready, 1)
        tail = 0
        while not ctx.get(dut.o.valid):
            await ctx.tick()
            tail += 1
        out.update(bytes_clocks=clocks, tail=tail, stalls=stalls,
                   tag=ctx.get(dut.o.payload).to_bytes(16, "little"))

    sim = Simulator(dut)
    sim.add_clock(25e-9)
    sim.add_testbench(bench)
    sim.run()
    assert out["tag"] == mac(key, message, person=PERSON_RECORD), "tag differs from hashlib"
    assert out["stalls"] == 0, "the core stalled inside a message"
    return out


def run(smoke: bool = False):
    results = []
    for length in ((64, 65) if smoke else (256, 4096, 4096 + 1, 4096 + 50)):
        r = measure(length)
        results.append({"name": "mac.bytes_per_clock", "unit": "bytes/clock",
                        "value": round(length / r["bytes_clocks"], 4),
                        "params": {"bytes": length, "clocks": r["bytes_clocks"],
                                   "last_to_tag_clocks": r["tail"]}})
    synth = synth_or_elaborate(MacUnit(), "mac_unit", smoke=smoke, freq_mhz=40)
    if synth is not None:
        results.append(synth_result("mac_unit", {"tag_bytes": 16, "key_slots": 4}, synth))
    return results


def markdown(results):
    rows = [[r["params"]["bytes"], r["params"]["clocks"], r["value"],
             r["params"]["last_to_tag_clocks"]]
            for r in results if r["name"] == "mac.bytes_per_clock"]
    text = ("One message offered back to back after its `cmd` (key slot set beforehand). Exact "
            "clocks from the Amaranth simulator: the bytes' transfers (equal to the byte count: "
            "no stall), then the clock edges from the last byte's to `o.valid` (the constant "
            "overhead: 42 when the final block has 42 bytes or more, up to 83 after a full "
            "block, see [mac](blocks/mac.md)). Every tag checked against `hashlib`.\n\n")
    text += table(["bytes", "clocks", "bytes/clock", "last byte → tag"], rows)
    text += ("\n\nSynthesis (out of context, `MacUnit`: the core and 4 key slots, 16-byte tag, "
             "target the board's 40 MHz):\n\n")
    text += table(SYNTH_HEADER, synth_rows(results))
    return text
