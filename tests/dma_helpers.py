"""What the sealed-DMA tests share: a DMA harness with the record MAC (``DmaHarness(...,
mac=True)``), its key slots, the rings' state and the storage image around a simulation."""

import random

import numpy as np
from amaranth.sim import Simulator

from ringkv.defs.record import SECTOR, RecordLayout, RecordStatus
from ringkv.host.record import ring_dtype, ring_image, rings_from_image
from ringkv.hw.attention.ring_port import RingPortSignature
from ringkv.sim.ring_model import DmaHarness, tap_load, tap_read
from ringkv.sim.sector_model import PowerCut, SectorImage, serve_storage
from ringkv.sim.streams import stream_get, stream_put, write_key

__all__ = ["rand_rings", "random_session", "load_state", "read_state", "set_key", "dma_op",
           "simulate", "new_image"]


def rand_rings(config, rng):
    """Random element words (uint8 for fx1, uint16 for fx2) ``[layer, kv_head, kind, slot,
    dim]``."""
    shape = (config.layers, config.kv_heads, 2, config.window, config.head_dim)
    dt = ring_dtype(config)
    return np.frombuffer(rng.randbytes(int(np.prod(shape)) * dt.itemsize),
                         dtype=dt).reshape(shape).copy()


def random_session(config, rng, count):
    tokens = [rng.randrange(1 << config.token_width) for _ in range(count)]
    return rand_rings(config, rng), count, rng.randrange(config.window), tokens


async def load_state(ctx, h, config, rings, count, head, tokens, *, meta_heads=None):
    """Write ``rings`` and every ring's metadata (``head``, or ring ``r``'s
    ``meta_heads[r]``) through the ring model's tap, and ``tokens`` into token memory."""
    await tap_load(ctx, h, config, ring_image(config, rings), count, head, tokens,
                   heads=meta_heads)


async def read_state(ctx, h, config):
    """``(rings, [(count, head)] per ring)`` read back through the ring model's tap."""
    out = await tap_read(ctx, h, RingPortSignature.for_config(config).ring_bytes)
    meta = []
    for layer in range(config.layers * config.kv_heads):
        ctx.set(h.tap.meta_ring, layer)
        meta.append((ctx.get(h.tap.meta_rcount), ctx.get(h.tap.meta_rhead)))
    return rings_from_image(config, out), meta


async def set_key(ctx, h, slot, key_id, key):
    """Write a key slot through the harness's ``key_write``; ``key=None`` clears the slot."""
    await write_key(ctx, h.key_write, slot, key_id, key)


async def dma_op(ctx, h, op, region, *, count=0, hash=0, seq=0, sealed=0, slot=0, rng=None,
                 idle=0.0):
    """One command; ``(status, count, hash, seq, key_id)`` of its response."""
    await stream_put(ctx, h.cmd, {"op": op, "region": region, "count": count, "hash": hash,
                                  "seq": seq, "sealed": sealed, "slot": slot},
                     rng=rng, idle=idle)
    resp = await stream_get(ctx, h.resp, rng=rng, stall=idle)
    return RecordStatus(resp.status.value), resp.count, resp.hash, resp.seq, resp.key_id


def simulate(config, regions, image, body, *, seed=0, idle=0.0, stall=0.0, cut_after=None,
             dead=False, log=None, error_after=None, process=None, hold=0.0, mac=True,
             width=1, fail=None):
    """Run ``body(ctx, h, rng)`` against a harness whose storage is ``image``, with the MAC
    (``mac``, default) or without; ``process(h)`` (optional) gives an extra background process
    (a monitor); ``hold``: the chance per clock that the MAC refuses a new message (busy with
    another user). With the MAC, every clock a byte the engine offers it must find it ready
    (else the simulation fails). With a power cut (``cut_after``) the simulation ends when the
    server loses power, else when the body ends. ``width``: the engine's storage port's
    bytes a transfer (4: the wide port; the sector model serves it in words); ``fail``: the
    sector model's (a transfer ended early with ``CARD``)."""
    h = DmaHarness(config, regions, mac=mac, width=width)
    sim = Simulator(h)
    sim.add_clock(1e-8)
    rng = random.Random(seed)
    result = {}

    async def server(ctx):
        try:
            await serve_storage(ctx, h.storage, image, rng=random.Random(seed + 1), idle=idle,
                                stall=stall, cut_after=cut_after, dead=dead, log=log,
                                error_after=error_after, fail=fail)
        except PowerCut as e:
            result["cut"] = str(e)

    async def bench(ctx):
        result["value"] = await body(ctx, h, rng)

    lost = []

    async def holder(ctx):
        hold_rng = random.Random(seed + 2)
        async for _ in ctx.tick():
            ctx.set(h.mac_hold, int(hold_rng.random() < hold))

    async def mac_watch(ctx):
        # a byte offered to the MAC while it cannot take it would be lost from the tag
        port = h.dma.mac.i
        async for _, _, valid, ready in ctx.tick().sample(port.valid, port.ready):
            if valid and not ready:
                lost.append(1)

    sim.add_testbench(server, background=cut_after is None)
    sim.add_testbench(bench, background=cut_after is not None)
    if mac:
        sim.add_process(mac_watch)
    if hold:
        sim.add_testbench(holder, background=True)
    if process is not None:
        sim.add_process(process(h))
    sim.run()
    assert not lost, f"{len(lost)} MAC byte(s) offered while the core was not ready"
    return result


def new_image(config, regions, rng=None):
    """A storage image for ``regions`` regions; with ``rng``, garbage in every byte."""
    lay = RecordLayout(config)
    image = SectorImage(sectors=regions * lay.sectors_per_region + 2)
    if rng is not None:
        image.write(0, rng.randbytes(image.sectors * SECTOR))
    return image
