"""cocotb on Verilator: a sealed RingKVTop (``sealed=True``) through byte frames, with random
idle and stalls on the link and the storage port: keys, tenant slots, isolation."""

import random

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from ringkv.defs.config import RingKVConfig
from ringkv.defs.hash import hash_seed
from ringkv.defs.protocol import (
    NO_RECORD,
    PREFIX_RESPONSE,
    RECOVERY_STATUS,
    REQUESTS,
    RESPONSES,
    SNAPSHOT_RESPONSE,
    Op,
    RecoveryState,
    Status,
    build_requests,
)
from ringkv.defs.record import RecordLayout
from ringkv.host.device.ops import pack_attn, pack_tokens
from ringkv.host.golden.hash import sequence_hash
from ringkv.host.golden.mac import tenant_seed
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.sector_model import SectorImage
from ringkv.sim.top_bench import cocotb_start_top

P = cocotb_params()
CFG = RingKVConfig(**P["config"])
REGIONS = P["regions"]
SEALED = build_requests(True)


def key_set(slot, key_id, key):
    return REQUESTS[Op.KEY_SET].pack(slot=slot, key_id=key_id) + key


@cocotb.test(timeout_time=200, timeout_unit="ms")
async def sealed_tenants(dut):
    rng = random.Random(P["seed"])
    nrng = np.random.default_rng(P["seed"])
    lay = RecordLayout(CFG)
    image = SectorImage(None, REGIONS * lay.sectors_per_region)
    link = await cocotb_start_top(dut, image, rng=rng, link_idle=0.1, link_stall=0.2,
                                  storage_idle=0.1, storage_stall=0.1)
    for _ in range(1000):
        st = RECOVERY_STATUS.unpack(await link.call(Op.STORAGE_STATUS))
        if st["state"] != RecoveryState.SCANNING.value:
            break
        for _ in range(100):
            await RisingEdge(dut.clk)
    assert st["state"] == RecoveryState.READY.value
    key_a, key_b = rng.randbytes(32), rng.randbytes(32)
    seed_a, seed_b = (tenant_seed(k, CFG.digest()) for k in (key_a, key_b))
    tokens = [rng.randrange(1 << CFG.token_width) for _ in range(10)]
    await link.call(Op.TOKENS_APPEND, REQUESTS[Op.TOKENS_APPEND].pack(n=10)
                    + pack_tokens(CFG, tokens))
    # no key yet: refused
    await link.call(Op.QUERY, SEALED[Op.QUERY].pack(n=10, slot=0), Status.NO_KEY)
    assert await link.call(Op.KEY_SET, key_set(0, 7, key_a)) == b""
    assert await link.call(Op.KEY_SET, key_set(1, 8, key_b)) == b""
    await link.call(Op.KEY_SET, key_set(1, 0, key_b), Status.BAD_ARG)
    await link.call(Op.KEY_SET, key_set(4, 9, key_b), Status.BAD_ARG)
    await link.call(Op.KEY_SET, key_set(1, 8, key_b)[:-1], Status.BAD_LENGTH)
    await link.call(Op.QUERY_PREFIX, SEALED[Op.QUERY_PREFIX].pack(n=10, slot=2), Status.NO_KEY)
    for layer in range(CFG.layers):
        q = nrng.integers(-128, 128, size=(10, CFG.q_heads, CFG.head_dim))
        k = nrng.integers(-128, 128, size=(10, CFG.kv_heads, CFG.head_dim))
        v = nrng.integers(-128, 128, size=(10, CFG.kv_heads, CFG.head_dim))
        await link.call(Op.ATTN_PREFILL, pack_attn(CFG, layer, q, k, v))
    r = SNAPSHOT_RESPONSE.unpack(await link.call(Op.EXPORT, SEALED[Op.EXPORT].pack(
        n=10, slot=0)))
    assert r["record_status"] == 0 and r["hash"] == sequence_hash(tokens, seed_a)
    # tenant B: a miss on the same tokens (QUERY and QUERY_PREFIX); tenant A: hits
    r = SNAPSHOT_RESPONSE.unpack(await link.call(Op.QUERY, SEALED[Op.QUERY].pack(
        n=10, slot=1), Status.MISS))
    assert r["record_status"] == NO_RECORD and r["hash"] == sequence_hash(tokens, seed_b)
    p = PREFIX_RESPONSE.unpack(await link.call(Op.QUERY_PREFIX, SEALED[Op.QUERY_PREFIX].pack(
        n=10, slot=1), Status.MISS))
    assert p["count"] == 0
    p = PREFIX_RESPONSE.unpack(await link.call(Op.QUERY_PREFIX, SEALED[Op.QUERY_PREFIX].pack(
        n=10, slot=0), Status.HIT))
    assert p["count"] == 10
    await link.call(Op.SESSION_BEGIN)
    await link.call(Op.TOKENS_WRITE, REQUESTS[Op.TOKENS_WRITE].pack(offset=0, n=10)
                    + pack_tokens(CFG, tokens))
    await link.call(Op.QUERY, SEALED[Op.QUERY].pack(n=10, slot=0), Status.HIT)
    h = RESPONSES[Op.HASH_QUERY].unpack(await link.call(
        Op.HASH_QUERY, REQUESTS[Op.HASH_QUERY].pack(n=10)))["hash"]
    assert h == sequence_hash(tokens, hash_seed(CFG))
    # cleared: refused again
    await link.call(Op.KEY_CLEAR, REQUESTS[Op.KEY_CLEAR].pack(slot=0))
    await link.call(Op.QUERY, SEALED[Op.QUERY].pack(n=10, slot=0), Status.NO_KEY)
    assert await link.call(Op.PING, b"ok") == b"ok"
