"""Hash engine: parameter checks, Amaranth-simulator tests, cocotb on Verilator."""

import random

import pytest
from amaranth.sim import Simulator
from conftest import requires_verilator

from ringkv.defs.config import RingKVConfig
from ringkv.defs.hash import hash_seed
from ringkv.host.golden.hash import hash_step, prefix_hashes, sequence_hash
from ringkv.hw.store.hash_engine import HashEngine
from ringkv.sim.streams import stream_get, stream_put


def rtl_prefix_hashes(engine, sequences, *, idle=0.0, stall=0.0, rng_seed=0, seeds=None):
    """Run ``sequences`` through ``engine``; return [(hash, count, last), ...]. ``seeds``
    (an engine with ``seed_input``): each sequence's seed on ``seed_in`` with its first token,
    random junk there with the others."""
    rng_in, rng_out = random.Random(rng_seed), random.Random(rng_seed + 1)
    total = sum(len(s) for s in sequences)
    out = []

    async def source(ctx):
        for i, seq in enumerate(sequences):
            for k, t in enumerate(seq):
                if seeds is not None:
                    ctx.set(engine.seed_in, seeds[i] if k == 0 else rng_in.getrandbits(64))
                await stream_put(ctx, engine.i, {"token": t, "first": k == 0,
                                                 "last": k == len(seq) - 1},
                                 rng=rng_in, idle=idle)

    async def sink(ctx):
        for _ in range(total):
            p = await stream_get(ctx, engine.o, rng=rng_out, stall=stall)
            out.append((p.hash, p.count, p.last))

    sim = Simulator(engine)
    sim.add_clock(1e-8)
    sim.add_testbench(source)
    sim.add_testbench(sink)
    sim.run()
    return out


def ref_prefix_hashes(sequences, seed, *, width=64, rounds=2, count_width=24):
    out = []
    for seq in sequences:
        for k, h in enumerate(prefix_hashes(seq, seed, width=width, rounds=rounds)):
            out.append((h, (k + 1) % (1 << count_width), int(k == len(seq) - 1)))
    return out


@pytest.mark.parametrize("idle,stall", [(0.0, 0.0), (0.5, 0.0), (0.0, 0.6), (0.4, 0.4)])
def test_rtl_equals_golden(idle, stall):
    rng = random.Random(7)
    seed = hash_seed(RingKVConfig())
    sequences = [[rng.randrange(1 << 16) for _ in range(rng.choice([1, 2, 5, 17]))]
                 for _ in range(40)]
    sequences += [[0xFFFF] * 3, [0] * 4]
    got = rtl_prefix_hashes(HashEngine(seed=seed), sequences, idle=idle, stall=stall)
    assert got == ref_prefix_hashes(sequences, seed)


@pytest.mark.parametrize("hash_width,token_width,rounds", [(128, 64, 3), (96, 8, 1), (64, 32, 4)])
def test_rtl_other_widths(hash_width, token_width, rounds):
    rng = random.Random(hash_width)
    seed = rng.getrandbits(hash_width)
    sequences = [[rng.getrandbits(token_width) for _ in range(rng.randint(1, 9))]
                 for _ in range(12)]
    engine = HashEngine(token_width=token_width, hash_width=hash_width, count_width=3,
                        seed=seed, rounds=rounds)
    got = rtl_prefix_hashes(engine, sequences, idle=0.3, stall=0.3)
    assert got == ref_prefix_hashes(sequences, seed, width=hash_width, rounds=rounds,
                                    count_width=3)


def test_no_first_marker_continues_from_seed():
    """After reset the chain starts at the seed even if the first token lacks ``first``."""
    engine = HashEngine(seed=1234)
    out = []

    async def bench(ctx):
        for t in (5, 6):
            await stream_put(ctx, engine.i, {"token": t, "first": 0, "last": 0})
            out.append((await stream_get(ctx, engine.o)).hash)

    sim = Simulator(engine)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert out == prefix_hashes([5, 6], 1234)

@pytest.mark.parametrize("idle,stall", [(0.0, 0.0), (0.4, 0.4)])
def test_seed_input_per_sequence(idle, stall):
    """``seed_input``: each sequence starts from the seed on the ``seed_in`` port when its first
    token transfers (a sealed device's tenant seeds), equal to the golden chain of that seed;
    the port may change between sequences and while the chain runs."""
    rng = random.Random(11)
    sequences = [[rng.randrange(1 << 16) for _ in range(rng.choice([1, 3, 9]))]
                 for _ in range(24)]
    seeds = [rng.getrandbits(64) for _ in sequences]
    seeds[0], seeds[1] = 0, (1 << 64) - 1
    engine = HashEngine(seed=5, seed_input=True)
    out = rtl_prefix_hashes(engine, sequences, idle=idle, stall=stall, rng_seed=1, seeds=seeds)
    want = []
    for seq, seed in zip(sequences, seeds):
        want += ref_prefix_hashes([seq], seed)
    assert out == want
    with pytest.raises(TypeError, match=r"^seed_input must be a bool, not 1$"):
        HashEngine(seed_input=1)
    assert "seed_in" not in HashEngine().signature.members


@pytest.mark.parametrize("kwargs,exc,message", [
    ({"hash_width": 48}, ValueError, "Hash width must be 64, 96 or 128 bits, not 48"),
    ({"hash_width": "64"}, TypeError, "Hash width must be an integer, not '64'"),
    ({"token_width": 0}, ValueError, "Token width must be between 1 and 32 bits, not 0"),
    ({"token_width": 33}, ValueError, "Token width must be between 1 and 32 bits, not 33"),
    ({"rounds": 0}, ValueError, "Rounds must be between 1 and 4, not 0"),
    ({"rounds": 2.0}, TypeError, "Rounds must be an integer, not 2.0"),
    ({"count_width": 0}, ValueError, "Count width must be between 1 and 64 bits, not 0"),
    ({"seed": -1}, ValueError, "Seed must fit in 64 bits, not -1"),
    ({"seed": 1 << 64}, ValueError, f"Seed must fit in 64 bits, not {1 << 64}"),
    ({"seed": None}, TypeError, "Seed must be an integer, not None"),
])
def test_bad_parameters(kwargs, exc, message):
    with pytest.raises(exc) as info:
        HashEngine(**kwargs)
    assert str(info.value) == message


def test_properties():
    engine = HashEngine(token_width=8, hash_width=128, count_width=10, seed=3, rounds=3)
    assert (engine.token_width, engine.hash_width, engine.count_width, engine.seed,
            engine.rounds) == (8, 128, 10, 3, 3)


@requires_verilator
@pytest.mark.parametrize("name,params", [
    ("default", {"token_width": 16, "hash_width": 64, "count_width": 24, "rounds": 2,
                 "sequences": 10000, "idle": 0.2, "stall": 0.3}),
    # the same unit at other widths: a second Verilator build, in make test-all (the
    # Amaranth-simulator tests above cover these widths in make test)
    pytest.param("wide", {"token_width": 32, "hash_width": 128, "count_width": 5, "rounds": 3,
                          "sequences": 600, "idle": 0.5, "stall": 0.5}, marks=pytest.mark.slow),
])
def test_cocotb_verilator(name, params):
    from ringkv.sim.cocotb_run import run_cocotb
    params = dict(params, seed=hash_seed(RingKVConfig(), width=params["hash_width"]))
    engine = HashEngine(token_width=params["token_width"], hash_width=params["hash_width"],
                        count_width=params["count_width"], seed=params["seed"],
                        rounds=params["rounds"])
    run_cocotb(engine, toplevel="hash_engine", build_name=f"hash_engine_{name}",
               test_module="cocotb_hash_engine", params=params)


# --- the golden function itself -------------------------------------------------------------

def test_golden_is_bijective_in_last_token():
    """For a fixed prefix, different last tokens never give the same hash."""
    rng = random.Random(3)
    for _ in range(50):
        h = rng.getrandbits(64)
        outs = {hash_step(h, t) for t in range(4096)}
        assert len(outs) == 4096


def test_golden_mixing():
    """One flipped token bit changes many output bits, always the bucket index bits."""
    rng = random.Random(11)
    flips, low_changed, trials = 0, 0, 2000
    for _ in range(trials):
        h, t, b = rng.getrandbits(64), rng.getrandbits(16), rng.randrange(16)
        d = hash_step(h, t) ^ hash_step(h, t ^ (1 << b))
        flips += bin(d).count("1")
        low_changed += (d & 0x3FF) != 0
    assert low_changed == trials
    assert 10 < flips / trials < 54
    # One more token spreads a difference over the whole state (avalanche ~ 32 of 64 bits).
    flips = 0
    for _ in range(trials):
        h, t, u = rng.getrandbits(64), rng.getrandbits(16), rng.getrandbits(16)
        b = rng.randrange(16)
        d = hash_step(hash_step(h, t), u) ^ hash_step(hash_step(h, t ^ (1 << b)), u)
        flips += bin(d).count("1")
    assert 24 < flips / trials < 40


def test_seed_folds_config_and_salt():
    base = RingKVConfig()
    assert hash_seed(base) != hash_seed(RingKVConfig(window=64))
    assert hash_seed(base) != hash_seed(base, salt=b"tenant-a")
    assert hash_seed(base, salt=b"x") == hash_seed(RingKVConfig(), salt=b"x")
    toks = [1, 2, 3]
    other = hash_seed(RingKVConfig(window=64))
    assert sequence_hash(toks, hash_seed(base)) != sequence_hash(toks, other)


def test_golden_known_answer():
    """Pin the function: any change to it changes every stored snapshot's hash."""
    assert hash_step(0, 0) == 0x9D26EF3267750F99
    assert sequence_hash([1, 2, 3], 0) == 0xC64D0396F2A8E9F6
    assert sequence_hash(b"hello", 0x0123456789ABCDEF) == 0x5A1E9CC77D790EE5
    assert sequence_hash([], 42) == 42


def test_golden_matches_independent_formulation():
    """The Speck-round chain written again with numpy uint32 wrap-around arithmetic."""
    import numpy as np

    def step(h, t):
        x, y = np.uint32(h & 0xFFFFFFFF), np.uint32(h >> 32)
        y ^= np.uint32(t)
        for k in (np.uint32(0x7F4A7C15), np.uint32(0xF3BCC908)):
            x = ((x >> np.uint32(8)) | (x << np.uint32(24))) + y
            x ^= k
            y = ((y << np.uint32(3)) | (y >> np.uint32(29))) ^ x
        return int(x) | (int(y) << 32)

    rng = random.Random(5)
    with np.errstate(over="ignore"):
        for _ in range(500):
            h, t = rng.getrandbits(64), rng.getrandbits(16)
            assert hash_step(h, t) == step(h, t)
