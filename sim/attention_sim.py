"""Drive the SWA attention core in the Amaranth simulator (shared by its tests and its bench).

A run is a list of operations, the same list the bit-exact model
:func:`ringkv.host.golden.fixed.run_ops` takes:

- ``("cmd", op, layer, kv_head, count, q, k, v)``: a command; for an accepted ATTEND ``q`` is
  (C, G, d) and ``k``/``v`` are (C, d) integer arrays in the core's numerics (int8 for
  ``ringkv-fx1``, int16 for ``ringkv-fx2``), streamed per token as q_0..q_{G-1}, k, v;
- ``("ring_write", addr, byte)``, ``("ring_read", addr)``: the byte-addressed ring access port
  (while idle);
- ``("meta_write", ring, count, head)``, ``("meta_read", ring)``: the metadata port.

:func:`rtl_run` returns ``{"outputs": [...], "status": [...], "reads": [...], "cycles": [...]}``
where ``cycles`` holds, per command, the clocks from the command's acceptance to its status.
"""

import random

import numpy as np
from amaranth.sim import Simulator

from ringkv.defs.numerics import numerics_of

from .streams import stream_get, stream_put

__all__ = ["token_beats", "rtl_run", "accepted_attends", "random_ops", "core_params"]


def token_beats(q, k, v, macs):
    """The ``i`` beats of one token: lists of ``macs`` element values."""
    beats = []
    for vec in [*q, k, v]:
        vec = [int(x) for x in vec]
        beats += [vec[j:j + macs] for j in range(0, len(vec), macs)]
    return beats


def accepted_attends(model, ops):
    """Which ``cmd`` operations of ``ops`` are accepted ATTENDs (by the golden checks)."""
    return [op[0] == "cmd" and op[1] == 0 and model.check(*op[1:5]) == 0 for op in ops]


def rtl_run(core, ops, *, checker, rng_seed=0, idle=0.0, stall=0.0, vcd=None, watch=None):
    """Run ``ops`` on ``core``; ``checker`` is a golden model giving each command's status.
    ``watch``, when given, is an async ``watch(ctx)`` run beside the testbenches (in the
    background: it may loop forever), to sample the core's internals."""
    rng_in, rng_out, rng_st = (random.Random(rng_seed + k) for k in range(3))
    G, d, M = core.group, core.head_dim, core.macs
    accepted = accepted_attends(checker, ops)
    beats, n_out = [], 0
    for op, ok in zip(ops, accepted):
        if ok:
            q, k, v = op[5], op[6], op[7]
            for t in range(len(k)):
                beats += token_beats(q[t], k[t], v[t], M)
            n_out += len(k) * G * d // M
    n_cmds = sum(op[0] == "cmd" for op in ops)
    res = {"outputs": [], "status": [], "reads": [], "cycles": []}
    clock = [0]
    started = []
    out_words = []

    collisions = []

    async def tick_counter(ctx):
        # the core's promise behind YOSYS_AFTER_READ: no used K/V bank read meets a write of
        # the same word (sampled at every clock edge)
        probe = getattr(core, "_collision_used", None)
        if probe is None:
            raise AssertionError("the core has no collision probe (elaborated?)")
        while True:
            *_, hit = await ctx.tick().sample(probe)
            if hit:
                collisions.append(clock[0])
            clock[0] += 1

    async def commands(ctx):
        for op in ops:
            if op[0] == "cmd":
                await stream_put(ctx, core.cmd, {"op": op[1], "layer": op[2], "kv_head": op[3],
                                                 "count": op[4]})
                started.append(clock[0])
                continue
            while ctx.get(core.busy):
                await ctx.tick()
            if op[0] == "ring_write":
                ctx.set(core.ring.ring_addr, op[1])
                ctx.set(core.ring.ring_wdata, op[2])
                ctx.set(core.ring.ring_we, 1)
                await ctx.tick()
                ctx.set(core.ring.ring_we, 0)
                await ctx.tick()                # the write lands; a read here would give 0
            elif op[0] == "ring_read":
                ctx.set(core.ring.ring_addr, op[1])
                ctx.set(core.ring.ring_re, 1)
                await ctx.tick()
                ctx.set(core.ring.ring_re, 0)
                await ctx.tick()                # ring data: two clocks after ring_re
                res["reads"].append(ctx.get(core.ring.ring_rdata))
            elif op[0] == "meta_write":
                ctx.set(core.ring.meta_ring, op[1])
                ctx.set(core.ring.meta_wcount, op[2])
                ctx.set(core.ring.meta_whead, op[3])
                ctx.set(core.ring.meta_we, 1)
                await ctx.tick()
                ctx.set(core.ring.meta_we, 0)
            elif op[0] == "meta_read":
                ctx.set(core.ring.meta_ring, op[1])
                await ctx.delay(1e-9)
                res["reads"].append((ctx.get(core.ring.meta_count), ctx.get(core.ring.meta_head)))
            else:
                raise ValueError(f"unknown operation {op[0]!r}")

    async def source(ctx):
        for beat in beats:
            await stream_put(ctx, core.i, beat, rng=rng_in, idle=idle)

    async def sink(ctx):
        for _ in range(n_out):
            word = await stream_get(ctx, core.o, rng=rng_out, stall=stall)
            out_words.append([int(word[j]) for j in range(M)])

    async def status(ctx):
        for _ in range(n_cmds):
            p = await stream_get(ctx, core.status, rng=rng_st, stall=stall)
            res["status"].append((p.op.value, p.err.value, int(p.count)))
            res["cycles"].append(clock[0])

    sim = Simulator(core)
    sim.add_clock(1e-8)
    sim.add_testbench(tick_counter, background=True)
    if watch is not None:
        sim.add_testbench(watch, background=True)
    for tb in (commands, source, sink, status):
        sim.add_testbench(tb)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()
    if collisions:
        raise AssertionError(f"a used K/V bank read collided with a write at clocks "
                             f"{collisions[:8]}")
    res["cycles"] = [end - start for start, end in zip(started, res["cycles"])]
    flat = np.array(out_words, dtype=np.int64).reshape(-1)
    pos = 0
    for op, ok in zip(ops, accepted):
        if ok:
            size = len(op[6]) * G * d
            res["outputs"].append(flat[pos:pos + size].reshape(len(op[6]), G, d))
            pos += size
    return res


def random_ops(rng, p, steps):
    """A random operation script for a core with parameters ``p`` (dict: layers, kv_heads,
    group, head_dim, window, numerics): ATTENDs of 1, 2, W-1, W, W+1 and 2W+1 tokens with
    normal, peaky and format-limit data, clears, rejected commands, ring and meta port
    traffic."""
    L, Hkv, G, d, W = p["layers"], p["kv_heads"], p["group"], p["head_dim"], p["window"]
    nx = numerics_of(p.get("numerics"))
    lo, hi = nx.qkv_min, nx.qkv_max
    nprng = np.random.default_rng(rng.randrange(1 << 30))
    total = 2 * L * Hkv * W * d * nx.elem_bytes
    ops = []
    for _ in range(steps):
        C = rng.choice([1, 1, 1, 1, 2, max(W - 1, 1), W, W + 1, 2 * W + 1])
        layer, kvh = rng.randrange(L), rng.randrange(Hkv)
        q = nprng.integers(lo, hi + 1, (C, G, d))
        k = nprng.integers(lo, hi + 1, (C, d))
        v = nprng.integers(lo, hi + 1, (C, d))
        style = rng.random()
        if style < 0.15:        # format limits: every score at its extreme
            q[:] = rng.choice([hi, lo])
            k[:] = rng.choice([hi, lo])
            v[:] = rng.choice([hi, lo])
        elif style < 0.3:       # peaky: one key far above the rest
            k[:] = nprng.integers(-8, 8, (C, d)) << (nx.elem_bits - 8)
            k[-1] = hi
            q[:] = hi
        elif style < 0.4:       # small values: the low bits of the wide format
            q = nprng.integers(-4, 4, (C, G, d))
            k = nprng.integers(-4, 4, (C, d))
            v = nprng.integers(-4, 4, (C, d))
        ops.append(("cmd", 0, layer, kvh, C, q, k, v))
        r = rng.random()
        if r < 0.06:
            ops.append(("cmd", 1, rng.randrange(L), 0, 0, None, None, None))
        elif r < 0.09:
            ops.append(("cmd", 2, 0, 0, 0, None, None, None))
        elif r < 0.14:
            ops.append(("cmd", rng.choice([0, 1]), L + rng.randrange(3), 0, 1, None, None, None))
        elif r < 0.17:
            ops.append(("cmd", 0, 0, Hkv, 1, None, None, None))
        elif r < 0.20:
            ops.append(("cmd", 3, 0, 0, 1, None, None, None))
        elif r < 0.23:
            ops.append(("cmd", 0, 0, 0, 0, None, None, None))
        elif r < 0.33:
            for _ in range(4):
                addr = rng.randrange(total + 8)
                ops.append(("ring_read", addr))
                ops.append(("ring_write", addr, rng.randrange(256)))
                ops.append(("ring_read", addr))
        elif r < 0.38:
            ring = rng.randrange(L * Hkv + 1)
            ops.append(("meta_read", ring))
            ops.append(("meta_write", ring, rng.randrange(3 * W), rng.randrange(W + 1)))
            ops.append(("meta_read", ring))
    return ops


def core_params(core):
    """The parameter dict :func:`random_ops` and the cocotb test take, from a core."""
    return {"layers": core.layers, "kv_heads": core.kv_heads, "group": core.group,
            "head_dim": core.head_dim, "window": core.window, "macs": core.macs,
            "numerics": core.numerics.name,
            "model": {"layers": core.layers, "q_heads": core.q_heads,
                      "kv_heads": core.kv_heads, "head_dim": core.head_dim,
                      "window": core.window, "lanes": core.lanes, "scale": core.scale,
                      "numerics": core.numerics.name,
                      "qkv_fracs": [list(t) for t in core.qkv_fracs]}}
