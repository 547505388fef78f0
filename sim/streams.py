"""Stream helpers for the Amaranth simulator, shared by every unit test.

``stream_put`` / ``stream_get`` follow the ``amaranth.lib.stream`` rules: ``valid`` is raised
without waiting for ``ready`` and the payload holds until the transfer. Both take an optional
``random.Random`` and probability to insert idle cycles (source) or withhold ``ready`` (sink),
so every test can run with backpressure. ``run_commands`` runs a whole list of commands
through a block with a command stream ``i`` and a response stream ``o`` (the directory, the
hot tier).
"""

import enum
import random

from amaranth.hdl import Shape
from amaranth.lib import data
from amaranth.sim import Simulator

from ringkv.defs.mac import KEY_ID_BYTES

__all__ = ["tick_until", "stream_put", "stream_get", "stream_put_all", "stream_get_n",
           "write_key", "run_commands"]


async def tick_until(ctx, cond, *signals):
    """Wait for clock edges until ``cond`` is true at one; return ``signals`` sampled there.

    The same as ``await ctx.tick().sample(*signals).until(cond)``, written as a plain loop:
    Amaranth's ``until`` closes an async generator when the coroutine is dropped, so a
    background process still waiting in it when the simulation ends raised an unraisable
    ``RuntimeError: aclose(): asynchronous generator is already running`` at garbage
    collection (pytest showed dozens of warnings per run).
    """
    while True:
        *values, done = (await ctx.tick().sample(*signals, cond))[2:]
        if done:
            return tuple(values)


async def stream_put(ctx, stream, payload, *, rng=None, idle=0.0):
    """Transfer one ``payload`` into ``stream`` (a stream the testbench drives)."""
    if rng is not None and idle > 0:
        while rng.random() < idle:
            await ctx.tick()
    ctx.set(stream.valid, 1)
    ctx.set(stream.payload, payload)
    await tick_until(ctx, stream.ready)
    ctx.set(stream.valid, 0)


async def stream_get(ctx, stream, *, rng=None, stall=0.0):
    """Receive one payload from ``stream`` (a stream the testbench consumes)."""
    if rng is not None and stall > 0:
        while rng.random() < stall:
            ctx.set(stream.ready, 0)
            await ctx.tick()
    ctx.set(stream.ready, 1)
    (payload,) = await tick_until(ctx, stream.valid, stream.payload)
    ctx.set(stream.ready, 0)
    return payload


async def stream_put_all(ctx, stream, payloads, *, rng=None, idle=0.0):
    for payload in payloads:
        await stream_put(ctx, stream, payload, rng=rng, idle=idle)


async def stream_get_n(ctx, stream, count, *, rng=None, stall=0.0):
    return [await stream_get(ctx, stream, rng=rng, stall=stall) for _ in range(count)]


async def write_key(ctx, stream, slot, key_id, key, *, rng=None, idle=0.0):
    """Write key slot ``slot`` through a ``KeyWrite`` stream (``hw/seal/key_slots.py``): the key id
    (little-endian), then the key, a byte a transfer; ``key=None`` clears the slot."""
    if key is None:
        await stream_put(ctx, stream, {"slot": slot, "index": 0, "data": 0, "clear": 1},
                         rng=rng, idle=idle)
        return
    raw = key_id.to_bytes(KEY_ID_BYTES, "little") + key
    for index, byte in enumerate(raw):
        await stream_put(ctx, stream, {"slot": slot, "index": index, "data": byte, "clear": 0},
                         rng=rng, idle=idle)


def run_commands(dut, commands, *, seed=0, idle=0.0, stall=0.0):
    """Simulate ``dut``, a block that takes one command on ``i`` and answers one response on
    ``o`` (struct payloads), for each of ``commands`` (dicts of field values: ints or enum
    members; missing fields are 0), with random idle on ``i`` and stall on ``o`` drawn from
    ``random.Random(seed)``. Returns ``(responses, clocks)``: the responses as dicts of ints,
    and for each command the clocks from its transfer to ``o.valid``. The first command waits
    for ``i.ready`` (a reset sweep), so the clocks measure the commands alone."""
    from .cocotb_streams import pack_fields, unpack_fields

    def fields(layout):
        return [(name, Shape.cast(field.shape).width) for name, field in layout]

    cmd_layout, resp_layout = dut.i.payload.shape(), dut.o.payload.shape()
    cmd_fields, resp_fields = fields(cmd_layout), fields(resp_layout)
    rng = random.Random(seed)
    responses, clocks = [], []

    async def bench(ctx):
        await tick_until(ctx, dut.i.ready)
        for cmd in commands:
            word = pack_fields(cmd_fields, {k: v.value if isinstance(v, enum.Enum) else v
                                            for k, v in cmd.items()})
            await stream_put(ctx, dut.i, data.Const(cmd_layout, word), rng=rng, idle=idle)
            waited = 1
            while not ctx.get(dut.o.valid):
                await ctx.tick()
                waited += 1
            payload = await stream_get(ctx, dut.o, rng=rng, stall=stall)
            clocks.append(waited)
            responses.append(unpack_fields(resp_fields, payload.as_value().value))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return responses, clocks
