"""cocotb on Verilator: the whole RingKVTop through byte frames, storage served from an image.

Reuses the bench pieces of ``ringkv.sim.top_bench`` (the byte-link driver) and
``ringkv.sim.sector_model`` (the storage server), which the TCP simulation harness builds on.
"""

import random

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from ringkv.defs.config import RingKVConfig
from ringkv.defs.hash import hash_seed
from ringkv.defs.protocol import (
    RECOVERY_STATUS,
    REQUESTS,
    RESPONSES,
    SNAPSHOT_RESPONSE,
    Op,
    RecoveryState,
    Status,
)
from ringkv.defs.record import RecordLayout, elem_bytes
from ringkv.host.device.ops import pack_attn, pack_tokens, unpack_attn
from ringkv.host.golden.fixed import FixedRingCore
from ringkv.host.golden.hash import sequence_hash
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.sector_model import SectorImage
from ringkv.sim.top_bench import cocotb_start_top

P = cocotb_params()
CFG = RingKVConfig(**P["config"])
REGIONS, LANES = P["regions"], P["lanes"]
LIM = 1 << (8 * elem_bytes(CFG) - 1)       # q/k/v range: int8 (ringkv-fx1) or int16 (fx2)


@cocotb.test(timeout_time=200, timeout_unit="ms")
async def top_end_to_end(dut):
    rng = random.Random(P["seed"])
    nrng = np.random.default_rng(P["seed"])
    lay = RecordLayout(CFG)
    image = SectorImage(None, REGIONS * lay.sectors_per_region)
    link = await cocotb_start_top(dut, image, rng=rng, link_idle=0.1, link_stall=0.2,
                                  storage_idle=0.1, storage_stall=0.1)

    assert await link.call(Op.PING, b"ringkv") == b"ringkv"
    # the power-on recovery of the (empty) card: wait for it, as the host does
    for _ in range(1000):
        st = RECOVERY_STATUS.unpack(await link.call(Op.STORAGE_STATUS))
        if st["state"] != RecoveryState.SCANNING.value:
            break
        for _ in range(100):
            await RisingEdge(dut.clk)
    assert (st["state"], st["scanned"], st["live"], st["freed"], st["next_seq"]) == (
        RecoveryState.READY.value, REGIONS, 0, 0, 1)
    cd = RESPONSES[Op.CONFIG_DIGEST].unpack(await link.call(Op.CONFIG_DIGEST))
    assert cd["digest"] == CFG.digest()
    tokens = [rng.randrange(1 << CFG.token_width) for _ in range(10)]
    await link.call(Op.TOKENS_APPEND, REQUESTS[Op.TOKENS_APPEND].pack(n=10)
               + pack_tokens(CFG, tokens))
    h = RESPONSES[Op.HASH_QUERY].unpack(await link.call(Op.HASH_QUERY,
                                                   REQUESTS[Op.HASH_QUERY].pack(n=10)))["hash"]
    assert h == sequence_hash(tokens, hash_seed(CFG))
    golden = FixedRingCore(CFG.layers, CFG.q_heads, CFG.kv_heads, CFG.head_dim, CFG.window,
                           LANES, numerics=CFG.numerics)
    g = CFG.group
    for layer in range(CFG.layers):
        q = nrng.integers(-LIM, LIM, size=(10, CFG.q_heads, CFG.head_dim))
        k = nrng.integers(-LIM, LIM, size=(10, CFG.kv_heads, CFG.head_dim))
        v = nrng.integers(-LIM, LIM, size=(10, CFG.kv_heads, CFG.head_dim))
        out = unpack_attn(CFG, await link.call(Op.ATTN_PREFILL, pack_attn(CFG, layer, q, k, v)),
                          10)
        for kvh in range(CFG.kv_heads):
            want = golden.attend(layer, kvh, q[:, kvh * g:(kvh + 1) * g], k[:, kvh], v[:, kvh])
            assert np.array_equal(out[:, kvh * g:(kvh + 1) * g], want)
    r = SNAPSHOT_RESPONSE.unpack(await link.call(Op.EXPORT, REQUESTS[Op.EXPORT].pack(n=10)))
    assert r["record_status"] == 0 and r["hash"] == h
    await link.call(Op.SESSION_BEGIN)
    await link.call(Op.TOKENS_WRITE, REQUESTS[Op.TOKENS_WRITE].pack(offset=0, n=10)
               + pack_tokens(CFG, tokens))
    await link.call(Op.QUERY, REQUESTS[Op.QUERY].pack(n=10), Status.HIT)
    # corrupt the stored KV: a MISS, never a wrong answer
    lba = lay.region_lba(r["region"]) + lay.kv_sector
    sector = bytearray(image.read(lba, 1))
    sector[0] ^= 0x01
    image.write(lba, bytes(sector))
    await link.call(Op.QUERY, REQUESTS[Op.QUERY].pack(n=10), Status.MISS)
    # bad CRC and an out-of-range layer
    from ringkv.host.device.frames import encode_request
    frame = bytearray(encode_request(Op.PING, 200, b"x"))
    frame[-1] ^= 0xFF
    await link.send(bytes(frame))
    err = await link.receive()
    assert Status(err.status) == Status.BAD_CRC and err.seq == 200
    q = nrng.integers(-LIM, LIM, size=(1, CFG.q_heads, CFG.head_dim))
    k = nrng.integers(-LIM, LIM, size=(1, CFG.kv_heads, CFG.head_dim))
    await link.call(Op.ATTN_DECODE, pack_attn(CFG, CFG.layers, q, k, k), Status.BAD_ARG)
    assert await link.call(Op.PING, b"ok") == b"ok"
