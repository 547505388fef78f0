"""SWA attention core: parameter checks, Amaranth-simulator tests, cocotb on Verilator."""

import math
import random

import numpy as np
import pytest
from conftest import examples, requires_verilator
from hypothesis import given, settings
from hypothesis import strategies as st

from ringkv.defs.numerics import FX1, FX2
from ringkv.host.golden.fixed import FixedRingCore, run_ops
from ringkv.hw.attention.core import AttentionCore
from ringkv.sim.attention_sim import core_params, random_ops, rtl_run

SMALL = dict(layers=2, q_heads=4, kv_heads=2, head_dim=8)


def check(core, ops, **kw):
    p = core_params(core)
    got = rtl_run(core, ops, checker=FixedRingCore(**p["model"]), **kw)
    want = run_ops(FixedRingCore(**p["model"]), ops)
    assert got["status"] == want["status"]
    assert got["reads"] == want["reads"]
    assert len(got["outputs"]) == len(want["outputs"])
    for j, (a, b) in enumerate(zip(got["outputs"], want["outputs"])):
        assert np.array_equal(a, b), f"attend {j}"
    return got, want


def attend(rng, layer, kvh, C, G, d, numerics=FX1):
    lo, hi = numerics.qkv_min, numerics.qkv_max + 1
    return ("cmd", 0, layer, kvh, C, rng.integers(lo, hi, (C, G, d)),
            rng.integers(lo, hi, (C, d)), rng.integers(lo, hi, (C, d)))


@pytest.mark.parametrize("kwargs,message", [
    (dict(layers=0), "layers must be between 1 and 256, not 0"),
    (dict(q_heads=3, kv_heads=2), "q_heads (3) must be a multiple of kv_heads (2)"),
    (dict(kv_heads=257), "kv_heads must be between 1 and 256, not 257"),
    (dict(head_dim=48), "head_dim must be a positive power of two, not 48"),
    (dict(window=100), "window must be a positive power of two, not 100"),
    (dict(window=4, lanes=8), "lanes must be a power of two between 1 and 4, not 8"),
    (dict(lanes=3), "lanes must be a power of two between 1 and 128, not 3"),
    (dict(head_dim=8, macs=16), "macs must be a power of two between 1 and 8, not 16"),
    (dict(scale=-1.0), "scale must be a positive number or None, not -1.0"),
    (dict(scale=1e-9), "scale 1e-09 gives a score constant 0 outside 1..2**17-1"),
    (dict(numerics="ringkv-fx9"),
     "unknown numerics 'ringkv-fx9'; known: ringkv-fx1, ringkv-fx1c, ringkv-fx2"),
    (dict(numerics=8), "unknown numerics 8; known: ringkv-fx1, ringkv-fx1c, ringkv-fx2"),
    (dict(layers=1, qkv_fracs=((5, 5, 5),)),
     "ringkv-fx1 has fixed scales (2**-5); qkv_fracs must be empty, not ((5, 5, 5),)"),
    (dict(layers=1, numerics="ringkv-fx1c"),
     "ringkv-fx1c needs qkv_fracs: one (Fq, Fk, Fv) per layer (1), not ()"),
    (dict(layers=1, numerics="ringkv-fx1c", qkv_fracs=((3, 3, 5),)),
     "layer 0: q/k fractions 3 + 3 with d=64, scale None give a score constant 189097 outside "
     "1..131071"),
])
def test_parameter_errors(kwargs, message):
    with pytest.raises(ValueError) as info:
        AttentionCore(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("kwargs,message", [
    (dict(kv_heads=True), "kv_heads must be an integer, not True"),
    (dict(window=128.0), "window must be an integer, not 128.0"),
    (dict(macs="8"), "macs must be an integer, not '8'"),
])
def test_parameter_type_errors(kwargs, message):
    with pytest.raises(TypeError) as info:
        AttentionCore(**kwargs)
    assert str(info.value) == message


def test_properties_and_ideal():
    core = AttentionCore()
    core._MustUse__silence = True       # inspected, never elaborated
    assert (core.layers, core.q_heads, core.kv_heads, core.head_dim, core.window) == \
        (4, 4, 2, 64, 128)
    assert (core.lanes, core.macs, core.group) == (4, 8, 2)
    assert core.ideal_cycles() == 2 * 2 * 128 * 64 // 32
    assert core.numerics.name == "ringkv-fx1"
    assert len(core.i.payload.as_value()) == 8 * 8 and len(core.o.payload.as_value()) == 8 * 16
    wide = AttentionCore(numerics="ringkv-fx2")
    wide._MustUse__silence = True
    assert wide.numerics.elem_bits == 16 and len(wide.i.payload.as_value()) == 8 * 16
    assert len(wide.o.payload.as_value()) == 8 * 16 and len(wide.ring.ring_rdata) == 8
    assert wide.signature.members["ring"].signature.ring_bytes == 4 * 2 * 2 * 128 * 64 * 2


def test_decode_wraps_many_times():
    """Decode steps from n = 0 through several wrap-arounds of one ring, exact equality;
    the other rings are untouched."""
    core = AttentionCore(**SMALL, window=4, lanes=2, macs=4)
    rng = np.random.default_rng(1)
    ops = [attend(rng, 1, 0, 1, 2, 8) for _ in range(14)]
    ops += [("meta_read", r) for r in range(4)]
    got, _ = check(core, ops)
    assert [s[2] for s in got["status"]] == list(range(1, 15))
    assert got["reads"] == [(0, 3), (0, 3), (14, (14 - 1) % 4), (0, 3)]


def documented_token_cycles(core, n):
    """The clocks of one ATTEND token with ``n`` valid slots, as the docstring states them
    (input always valid, output always ready), without the command's status clock."""
    G, d, M, P = core.group, core.head_dim, core.macs, core.lanes
    T = min(core.window // P, n)
    drain_a = 7 + math.ceil(math.log2(M) / 2)
    drain_out = 6 + math.ceil(math.log2(P) / 2)
    merge_head = 2 * P + int(math.log2(P)) + 32 + d // M
    return ((G + 2) * d // M + 2 * G * T * d // M + drain_a + 9 + 1 + G * merge_head
            + drain_out)


@pytest.mark.parametrize("config,fill", [
    (dict(layers=1, q_heads=2, kv_heads=1, head_dim=16, window=16, lanes=4, macs=4), 16),
    (dict(layers=1, q_heads=2, kv_heads=1, head_dim=16, window=16, lanes=4, macs=4,
          numerics="ringkv-fx2"), 16),
    (dict(layers=1, q_heads=2, kv_heads=1, head_dim=16, window=16, lanes=4, macs=4), 2),
    (dict(layers=2, q_heads=3, kv_heads=1, head_dim=8, window=8, lanes=1, macs=2), 8),
    (dict(layers=1, q_heads=4, kv_heads=1, head_dim=32, window=8, lanes=8, macs=32), 5),
])
def test_cycles_match_docstring(config, fill):
    """A decode step and a 3-token prefill take exactly the clocks the docstring states."""
    core = AttentionCore(**config)
    rng = np.random.default_rng(fill)
    G, d = core.group, core.head_dim
    ops = [("meta_write", 0, fill - 1, (fill - 2) % core.window),
           attend(rng, 0, 0, 1, G, d, core.numerics), attend(rng, 0, 0, 3, G, d, core.numerics)]
    got, _ = check(core, ops)
    assert got["cycles"][0] == documented_token_cycles(core, fill) + 1
    assert got["cycles"][1] == sum(documented_token_cycles(core, fill + 1 + j)
                                   for j in range(3)) + 1


@pytest.mark.parametrize("window,lanes,macs", [(8, 4, 2), (4, 1, 8), (1, 1, 4)])
def test_chunked_prefill_below_at_above_window(window, lanes, macs):
    core = AttentionCore(**SMALL, window=window, lanes=lanes, macs=macs)
    rng = np.random.default_rng(window)
    ops = [attend(rng, 0, 1, C, 2, 8) for C in (max(window - 1, 1), window, window + 1,
                                                 2 * window + 3, 1)]
    check(core, ops, idle=0.2, stall=0.3, rng_seed=window)


#: the parameter sets of the random scripts: empty lanes while n < W, G = 3 with M = 1, W = 2
#: with M = d, and the three numerics
SCRIPT_CONFIGS = (
    dict(SMALL, window=8, lanes=4, macs=2),
    dict(layers=1, q_heads=3, kv_heads=1, head_dim=4, window=4, lanes=2, macs=1),
    dict(layers=2, q_heads=2, kv_heads=2, head_dim=8, window=2, lanes=2, macs=8),
    dict(SMALL, window=8, lanes=4, macs=2, numerics="ringkv-fx2"),
    dict(layers=1, q_heads=3, kv_heads=1, head_dim=4, window=4, lanes=1, macs=4,
         numerics="ringkv-fx2"),
    dict(SMALL, window=8, lanes=2, macs=4, numerics="ringkv-fx1c",
         qkv_fracs=((4, 5, 6), (7, 8, 3))),
)


@settings(max_examples=examples(fast=2, thorough=18))
@given(config=st.sampled_from(SCRIPT_CONFIGS), seed=st.integers(0, 2**32 - 1))
def test_random_scripts_with_backpressure(config, seed):
    """Random scripts (errors, clears, ring/meta port traffic included) with idle cycles on
    cmd/i and backpressure on o/status."""
    core = AttentionCore(**config)
    rng = random.Random(seed)
    ops = random_ops(rng, core_params(core), 6)
    check(core, ops, idle=0.3, stall=0.4, rng_seed=seed)


def test_rejected_commands_change_nothing():
    core = AttentionCore(**SMALL, window=4, lanes=2, macs=4)
    rng = np.random.default_rng(2)
    ops = [attend(rng, 0, 0, 3, 2, 8),
           ("cmd", 0, 2, 0, 1, None, None, None),     # layer out of range
           ("cmd", 0, 0, 2, 1, None, None, None),     # kv head out of range
           ("cmd", 0, 0, 0, 0, None, None, None),     # zero tokens
           ("cmd", 3, 0, 0, 1, None, None, None),     # unknown opcode
           ("cmd", 1, 7, 0, 0, None, None, None),     # clear of a missing layer
           ("meta_write", 4, 9, 0), ("meta_write", 0, 9, 4),   # bad ring, bad head
           ("ring_write", 2 * 2 * 2 * 4 * 8, 0x55), ("ring_read", 2 * 2 * 2 * 4 * 8),
           ("meta_read", 0), ("meta_read", 4),
           attend(rng, 0, 0, 1, 2, 8)]
    got, _ = check(core, ops)
    assert [s[1] for s in got["status"]] == [0, 1, 1, 2, 3, 1, 0]
    assert got["reads"] == [0, (3, 2), (0, 0)]


#: ringkv-fx1c at d = 8: layer 0 at the largest score constant that fits (Fq + Fk = 9, the most
#: negative shift), layer 1 far finer (Fq + Fk = 15), layer 2 at fx1's scales
FX1C_LIMITS = dict(layers=3, q_heads=4, kv_heads=2, head_dim=8, window=4, lanes=2, macs=4,
                   numerics="ringkv-fx1c", qkv_fracs=((5, 4, 7), (7, 8, 0), (5, 5, 5)))


def test_fx1c_score_constant_per_layer_at_the_limits():
    """Per-layer score constants: every layer with q and k saturated at +127 / -128 (the
    largest scores of either sign through the largest constant), interleaved across layers
    so the constant register is reloaded each command, with backpressure; then the rings'
    contents are equal to the golden's (only the score constant is per layer)."""
    core = AttentionCore(**FX1C_LIMITS)
    assert core.score_consts == (66856, 1045, 33428)
    lo, hi = core.numerics.qkv_min, core.numerics.qkv_max
    rng = np.random.default_rng(7)
    ops = []
    for step in range(4):
        for layer in (0, 1, 2, 0):
            C = 1 + (step + layer) % 3
            q = np.full((C, 2, 8), hi if step % 2 else lo)
            k = np.full((C, 8), (hi, lo)[(step + layer) % 2])
            k[0] = rng.integers(lo, hi + 1, 8)           # one key apart from the rest
            v = rng.choice([lo, hi, 0], (C, 8))
            ops.append(("cmd", 0, layer, step % 2, C, q, k, v))
    ops += [("ring_read", a) for a in range(0, 3 * 2 * 2 * 4 * 8, 7)]
    got, want = check(core, ops, idle=0.2, stall=0.5, rng_seed=7)
    assert len(got["outputs"]) == 16
    # the limits reach the output range: saturated scores give one-hot weights
    assert max(int(np.abs(o).max()) for o in got["outputs"]) >= 127 << 8


@pytest.mark.parametrize("numerics", [FX1, FX2])
def test_ring_port_export_import(numerics):
    """Export a ring through the (byte-addressed) port, clear, import it back with its
    metadata: the next decode gives the same output as without the round trip."""
    kw = dict(layers=1, q_heads=2, kv_heads=1, head_dim=4, window=4, lanes=2, macs=2)
    core = AttentionCore(**kw, numerics=numerics.name)
    rng = np.random.default_rng(4)
    pre = attend(rng, 0, 0, 6, 2, 4, numerics)
    nxt = attend(rng, 0, 0, 1, 2, 4, numerics)
    model = FixedRingCore(**core_params(core)["model"])
    run_ops(model, [pre])
    image = [model.ring_read(a) for a in range(model.ring_bytes)]
    assert len(image) == 2 * 4 * 4 * numerics.elem_bytes
    # the image is the rings' elements, little-endian, EB bytes each
    elems = model.rings.reshape(-1) & ((1 << numerics.elem_bits) - 1)
    assert bytes(image) == b"".join(int(x).to_bytes(numerics.elem_bytes, "little")
                                    for x in elems)
    ops = [pre, ("meta_read", 0)] + [("ring_read", a) for a in range(len(image))]
    ops += [("cmd", 2, 0, 0, 0, None, None, None)]
    ops += [("ring_write", a, 0) for a in range(len(image))]
    ops += [("ring_write", a, b) for a, b in enumerate(image)]
    ops += [("meta_write", 0, 6, 1), nxt]
    got, want = check(core, ops)
    assert got["reads"][1:] == image
    ref = FixedRingCore(**core_params(core)["model"])
    assert np.array_equal(got["outputs"][1], run_ops(ref, [pre, nxt])["outputs"][1])


@pytest.mark.parametrize("config,seed", [
    (dict(SMALL, window=8, lanes=4, macs=2), 11),
    # the other builds repeat the flow in other shapes and numerics: make test-all
    pytest.param(dict(layers=2, q_heads=4, kv_heads=1, head_dim=8, window=4, lanes=1, macs=8),
                 12, marks=pytest.mark.slow),
    pytest.param(dict(layers=1, q_heads=2, kv_heads=2, head_dim=4, window=1, lanes=1, macs=2),
                 13, marks=pytest.mark.slow),
    pytest.param(dict(SMALL, window=8, lanes=2, macs=4, numerics="ringkv-fx2"), 14,
                 marks=pytest.mark.slow),
    pytest.param(FX1C_LIMITS, 15, marks=pytest.mark.slow),
])
@requires_verilator
def test_cocotb_random_scripts(config, seed):
    from ringkv.sim.cocotb_run import run_cocotb
    core = AttentionCore(**config)
    params = dict(core_params(core), seed=seed, steps=14,
                  pressure=[(0.0, 0.0), (0.3, 0.5), (0.6, 0.2)])
    name = "attn_" + "_".join(f"{k[0]}{v}" for k, v in sorted(config.items())
                              if k != "qkv_fracs")
    if core.qkv_fracs:
        name += "_f" + "".join(f"{f:x}" for t in core.qkv_fracs for f in t)
    run_cocotb(core, toplevel="attention_core", test_module="cocotb_attention", params=params,
               build_name=name)


@pytest.mark.slow
@pytest.mark.parametrize("config,seed", [
    (dict(layers=2, q_heads=3, kv_heads=1, head_dim=4, window=8, lanes=8, macs=4), 21),
    (dict(layers=1, q_heads=4, kv_heads=2, head_dim=16, window=16, lanes=2, macs=4), 22),
    (dict(layers=3, q_heads=2, kv_heads=2, head_dim=8, window=8, lanes=2, macs=1), 23),
    (dict(layers=2, q_heads=3, kv_heads=1, head_dim=4, window=8, lanes=8, macs=4,
          numerics="ringkv-fx2"), 24),
    (dict(layers=1, q_heads=4, kv_heads=2, head_dim=16, window=16, lanes=2, macs=1,
          numerics="ringkv-fx2"), 25),
])
@requires_verilator
def test_cocotb_more_parameters(config, seed):
    """More parameter sets (G = 3, one slot per lane, M = 1, larger rings, both numerics):
    the long sweep."""
    from ringkv.sim.cocotb_run import run_cocotb
    core = AttentionCore(**config)
    params = dict(core_params(core), seed=seed, steps=12, pressure=[(0.0, 0.0), (0.4, 0.4)])
    name = "attn_" + "_".join(f"{k[0]}{v}" for k, v in sorted(config.items()))
    run_cocotb(core, toplevel="attention_core", test_module="cocotb_attention", params=params,
               build_name=name)


class _CollidingCore(AttentionCore):
    """A core whose collision probe fires whenever it is busy: the check must catch it."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        self._collision_used = self.busy
        return m


def test_bank_collision_check_can_fail():
    """rtl_run asserts on every clock that no used K/V bank read meets a write of the same word
    (the promise behind YOSYS_AFTER_READ); a probe that fires makes the run fail."""
    core = _CollidingCore(layers=1, q_heads=2, kv_heads=1, head_dim=4, window=4, lanes=2, macs=2)
    ops = [attend(np.random.default_rng(0), 0, 0, 1, 2, 4)]
    with pytest.raises(AssertionError, match="collided with a write at clocks"):
        rtl_run(core, ops, checker=FixedRingCore(**core_params(core)["model"]))


@pytest.mark.parametrize("offer", [0, 1])
def test_a_ring_write_lands_when_a_command_is_taken_at_once(offer):
    """The ring port's write lands in the banks a clock after its strobe: a command taken in
    the strobe's clock (``offer`` 0) or in the next (1) turns the core busy meanwhile, and the
    write still lands; the byte reads back after the command."""
    from amaranth.sim import Simulator

    from ringkv.hw.attention.core import AttnOp
    core = AttentionCore(layers=1, q_heads=2, kv_heads=1, head_dim=4, window=4, lanes=2, macs=2)
    seen = {}

    async def bench(ctx):
        ctx.set(core.status.ready, 1)
        ctx.set(core.ring.ring_addr, 6)
        ctx.set(core.ring.ring_wdata, 0xC3)
        ctx.set(core.ring.ring_we, 1)
        ctx.set(core.cmd.payload, {"op": AttnOp.CLEAR, "layer": 0, "kv_head": 0, "count": 0})
        for clock in range(2):
            if clock == offer:
                ctx.set(core.cmd.valid, 1)
                seen["ready"] = ctx.get(core.cmd.ready)
            await ctx.tick()
            ctx.set(core.ring.ring_we, 0)
            ctx.set(core.cmd.valid, 0)
        seen["busy"] = ctx.get(core.busy)
        while ctx.get(core.busy):
            await ctx.tick()
        ctx.set(core.ring.ring_re, 1)
        await ctx.tick()
        ctx.set(core.ring.ring_re, 0)
        await ctx.tick()
        seen["byte"] = ctx.get(core.ring.ring_rdata)

    sim = Simulator(core)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen == {"ready": 1, "busy": 1, "byte": 0xC3}


def test_ring_port_read_with_write_returns_zero():
    """ring_re together with ring_we, and in the clock after it (while the registered write
    lands): the write happens, both reads return 0 (never the data of a colliding read); the
    read after that returns the byte written."""
    from amaranth.sim import Simulator
    core = AttentionCore(layers=1, q_heads=2, kv_heads=1, head_dim=4, window=4, lanes=2, macs=2)
    got = []

    async def bench(ctx):
        ctx.set(core.ring.ring_addr, 5)
        ctx.set(core.ring.ring_wdata, 0x5A)
        ctx.set(core.ring.ring_we, 1)
        ctx.set(core.ring.ring_re, 1)                # reads at clocks 0, 1 and 2
        await ctx.tick()
        ctx.set(core.ring.ring_we, 0)
        await ctx.tick()
        got.append(ctx.get(core.ring.ring_rdata))    # clock 0's read (with the write)
        await ctx.tick()
        ctx.set(core.ring.ring_re, 0)
        got.append(ctx.get(core.ring.ring_rdata))    # clock 1's (while the write lands)
        await ctx.tick()
        got.append(ctx.get(core.ring.ring_rdata))    # clock 2's (after it)
        await ctx.tick()
        got.append(ctx.get(core.ring.ring_rdata))    # no read at clock 3

    sim = Simulator(core)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == [0, 0, 0x5A, 0]


@pytest.mark.parametrize("params", [
    dict(head_dim=8, lanes=2, macs=4),                           # a bank word of 4 bytes
    dict(head_dim=8, lanes=2, macs=8),                           # 8 bytes: two groups
    dict(head_dim=8, lanes=1, macs=2, numerics="ringkv-fx2"),    # 2 elements of 2 bytes
    dict(head_dim=8, lanes=2, macs=2),                           # 2 bytes: no wide writes
])
def test_ring_port_wide_writes(params):
    """The ring port's four-byte writes (``ring_wide``) among byte writes, at random
    four-aligned addresses over the whole ring space: every byte reads back as a byte model
    of the writes has it; a core whose bank word is not whole groups of four bytes
    (``takes_wide_writes`` False) writes nothing on a wide write."""
    from amaranth.sim import Simulator
    core = AttentionCore(layers=2, q_heads=2, kv_heads=1, window=4, **params)
    size = core.ring.signature.ring_bytes
    rng = random.Random(size + core.macs)
    wide_ok = (core.macs * core.numerics.elem_bytes) % 4 == 0
    assert core.takes_wide_writes == wide_ok
    image = bytearray(size)
    writes = []
    for _ in range(3 * size // 4):
        if rng.random() < 0.7:
            addr, word = 4 * rng.randrange(size // 4), rng.randrange(1 << 32)
            writes.append((addr, word, 1))
            if wide_ok:
                image[addr:addr + 4] = word.to_bytes(4, "little")
        else:
            addr, byte = rng.randrange(size), rng.randrange(256)
            writes.append((addr, byte | (rng.randrange(1 << 24) << 8), 0))   # high bytes ignored
            image[addr] = byte
    got = bytearray(size)

    async def bench(ctx):
        for addr, data, wide in writes:
            ctx.set(core.ring.ring_addr, addr)
            ctx.set(core.ring.ring_wdata, data)
            ctx.set(core.ring.ring_wide, wide)
            ctx.set(core.ring.ring_we, 1)
            await ctx.tick()
        ctx.set(core.ring.ring_we, 0)
        await ctx.tick()                               # the last write lands
        for addr in range(size + 2):                   # one read a clock, two clocks behind
            ctx.set(core.ring.ring_addr, min(addr, size - 1))
            ctx.set(core.ring.ring_re, int(addr < size))
            if addr >= 2:
                got[addr - 2] = ctx.get(core.ring.ring_rdata)
            await ctx.tick()

    sim = Simulator(core)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert bytes(got) == bytes(image)
