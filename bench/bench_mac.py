"""Record MAC core: bytes per clock and overhead per message (exact, Amaranth simulator); the
DMA engine's export and import with and without the MAC (exact clocks); synthesis of the MAC
with its key slots, and of the DMA engine with the MAC, on the LFE5U-85F at the board's
40 MHz."""

import random

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, connect, flipped
from amaranth.sim import Simulator

from bench.bench_storage import dma_cycles
from bench.run import SYNTH_HEADER, synth_or_elaborate, synth_result, synth_rows, table
from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.mac import PERSON_RECORD
from ringkv.host.golden.mac import mac
from ringkv.hw.seal.key_slots import KeyWrite
from ringkv.hw.seal.mac import MacUnit
from ringkv.hw.storage.dma import DmaEngine
from ringkv.sim.streams import write_key

TITLE = "Record MAC (keyed BLAKE2s)"

#: regions of the DMA engine in the synthesis of the sealed DMA (the ``storage`` group's)
REGIONS = 1024
#: the DMA transfers' configuration: small rings (the record is mostly tokens), up to 16,384
#: tokens; the smoke run's is smaller still
DMA_CONFIG = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=8, window=16,
                          token_width=16, max_tokens=16384)
DMA_COUNTS = (256, 16384)
SMOKE_DMA_CONFIG = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=4, window=4,
                                token_width=8, max_tokens=40)


class SealedDma(wiring.Component):
    """:class:`~ringkv.hw.storage.dma.DmaEngine` with the :class:`~ringkv.hw.seal.mac.MacUnit` it
    drives (the record MAC and its key slots): the engine's ports but ``mac``, ``key_ids`` and
    ``key_set``, plus the slots' ``key_write``; what the sealed DMA costs on the device."""

    def __init__(self, config, regions):
        self.dma = DmaEngine(config, regions)
        self.mac = MacUnit()
        sig = self.dma.signature.members
        super().__init__({name: sig[name] for name in ("cmd", "resp", "storage", "ring",
                                                        "tokens", "busy")}
                         | {"key_write": In(stream.Signature(KeyWrite))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dma, m.submodules.mac = dma, unit = self.dma, self.mac
        for name in ("cmd", "storage", "ring", "tokens"):
            connect(m, flipped(getattr(self, name)), getattr(dma, name))
        connect(m, dma.resp, flipped(self.resp))
        connect(m, dma.mac.cmd, unit.cmd)
        connect(m, dma.mac.i, unit.i)
        connect(m, unit.o, dma.mac.o)
        connect(m, flipped(self.key_write), unit.key_write)
        m.d.comb += [unit.abort.eq(dma.mac.abort), dma.key_ids.eq(unit.key_ids),
                     dma.key_set.eq(unit.set), self.busy.eq(dma.busy)]
        return m


def measure(length: int, seed: int = 0) -> dict:
    """One message of ``length`` bytes offered back to back right after ``cmd``: clocks from
    ``cmd``'s transfer to the last byte's, and from the last byte's to the tag."""
    dut = MacUnit()
    rng = random.Random(seed)
    key, message = rng.randbytes(32), rng.randbytes(length)
    out = {}

    async def bench(ctx):
        await write_key(ctx, dut.key_write, 0, 1, key)
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
    config = SMOKE_DMA_CONFIG if smoke else DMA_CONFIG
    cfg = {f: getattr(config, f) for f in ("layers", "kv_heads", "head_dim", "window",
                                            "token_width", "max_tokens")}
    for count in ((1,) if smoke else DMA_COUNTS):
        opened = dma_cycles(config, count, mac=True, sealed=False)
        sealed = dma_cycles(config, count, mac=True, sealed=True)
        for d in ("export", "import"):
            results.append({"name": f"mac.dma.{d}.cycles", "unit": "cycles",
                            "value": sealed[d],
                            "params": {**cfg, "count": count,
                                       "record_bytes": sealed["record_bytes"],
                                       "open_cycles": opened[d],
                                       "mac_overhead": sealed[d] - opened[d]}})
    synth = synth_or_elaborate(SealedDma(DEFAULT_CONFIG, REGIONS), "mac_sealed_dma",
                               smoke=smoke, freq_mhz=40)
    if synth is not None:
        results.append(synth_result("sealed_dma", {
            **{f: getattr(DEFAULT_CONFIG, f) for f in ("layers", "kv_heads", "head_dim",
                                                        "window", "max_tokens")},
            "regions": REGIONS, "tag_bytes": 16, "key_slots": 4}, synth))
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
    dma = [r for r in results if r["name"].startswith("mac.dma.")]
    if dma:
        p = dma[0]["params"]
        text += ("\n\nThe DMA engine with the MAC (`DmaHarness(..., mac=True)`, the storage "
                 "model at one byte per clock), clocks from the command's transfer to the "
                 "response, open (`sealed=0`) and sealed under key slot 0 (the sealed record "
                 "checked against the golden import with the key). Configuration: "
                 f"{p['layers']} layer, {p['kv_heads']} KV head, head_dim {p['head_dim']}, "
                 f"window {p['window']}, {p['token_width']}-bit tokens, max_tokens "
                 f"{p['max_tokens']} (small rings keep the simulation short; the MAC's cost "
                 "per record does not depend on them, see [dma](blocks/dma.md#the-record-mac))."
                 "\n\n")
        text += table(["transfer", "tokens", "record bytes", "open", "sealed", "MAC overhead"],
                      [[r["name"].split(".")[2], r["params"]["count"],
                        r["params"]["record_bytes"], r["params"]["open_cycles"], r["value"],
                        r["params"]["mac_overhead"]] for r in dma])
    text += ("\n\nSynthesis (out of context, target the board's 40 MHz): `MacUnit` (the core "
             "and 4 key slots, 16-byte tag); `sealed_dma`, the DMA engine (default "
             "configuration, 1024 regions) with the `MacUnit` it drives:\n\n")
    text += table(SYNTH_HEADER, synth_rows(results))
    return text
