"""Hash engine: tokens per clock (exact, Amaranth simulator) and synthesis on the LFE5U-85F."""

import random

from amaranth.sim import Simulator

from bench.run import SYNTH_HEADER, synth_or_elaborate, synth_result, synth_rows, table
from ringkv.defs.hash import hash_seed
from ringkv.host.golden.hash import prefix_hashes
from ringkv.hw.store.hash_engine import HashEngine

TITLE = "Hash engine"


def measure_throughput(tokens: int, seq_len: int, stall: float, seed: int = 0) -> dict:
    """Feed ``tokens`` back to back (source always valid); count clocks until the last output."""
    engine = HashEngine(seed=hash_seed())
    rng = random.Random(seed)
    stream = [rng.randrange(1 << 16) for _ in range(tokens)]
    result = {}

    async def bench(ctx):
        got, cycles, started, n = [], 0, False, 0
        while len(got) < tokens:
            ctx.set(engine.i.valid, n < tokens)
            if n < tokens:
                ctx.set(engine.i.payload, {"token": stream[n], "first": n % seq_len == 0,
                                           "last": n % seq_len == seq_len - 1})
            ready = rng.random() >= stall
            ctx.set(engine.o.ready, ready)
            _, _, in_ready, valid, payload = await ctx.tick().sample(
                engine.i.ready, engine.o.valid, engine.o.payload)
            n += n < tokens and in_ready
            started = started or valid
            cycles += started
            if valid and ready:
                got.append(payload.hash)
        result["cycles"] = cycles
        result["hashes"] = got

    sim = Simulator(engine)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = []
    for start in range(0, tokens, seq_len):
        want += prefix_hashes(stream[start:start + seq_len], hash_seed())
    assert result["hashes"] == want, "hash engine output differs from the golden model"
    return {"cycles": result["cycles"], "tokens": tokens}


def run(smoke: bool = False):
    results = []
    tokens = 128 if smoke else 4096        # smoke: two sequences of 64
    for stall in (0.0, 0.5):
        r = measure_throughput(tokens, 64, stall)
        results.append({"name": "hash.tokens_per_clock", "unit": "tokens/clock",
                        "value": round(r["tokens"] / r["cycles"], 4),
                        "params": {"tokens": r["tokens"], "cycles": r["cycles"], "seq_len": 64,
                                   "sink_stall_probability": stall, "hash_width": 64,
                                   "token_width": 16}})
    for hash_width, token_width in ((64, 16), (128, 32)):
        config = {"hash_width": hash_width, "token_width": token_width, "rounds": 2}
        engine = HashEngine(hash_width=hash_width, token_width=token_width,
                            seed=hash_seed(width=hash_width))
        synth = synth_or_elaborate(engine, f"hash_engine_{hash_width}", smoke=smoke,
                                   freq_mhz=100)
        if synth is not None:
            results.append(synth_result("hash_engine", config, synth))
    return results


def markdown(results):
    tput = [r for r in results if r["name"] == "hash.tokens_per_clock"]
    rows = [[r["params"]["tokens"], r["params"]["sink_stall_probability"], r["params"]["cycles"],
             r["value"]] for r in tput]
    text = ("Throughput: tokens fed back to back in sequences of 64, sink ready with probability "
            "1 − stall (64-bit hash, 16-bit tokens). Exact cycles from the Amaranth simulator, "
            "first output to last output; every hash checked against the golden model.\n\n")
    text += table(["tokens", "sink stall prob.", "cycles", "tokens/clock"], rows)
    text += "\n\nSynthesis (out of context, 2 ARX rounds per token):\n\n"
    text += table(SYNTH_HEADER, synth_rows(results))
    return text
