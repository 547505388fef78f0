"""cocotb on Verilator: QUERY_PREFIX through the whole RingKVTop, against the golden model.

Run by ``tests/hw/top/test_top_cocotb.py::test_prefix_cocotb`` (the same build as the top's own
cocotb test). Backpressure: the host side withholds ``tx.ready`` half the time (the response
stream) and idles ``rx``; the storage server stalls too. Every QUERY_PREFIX answer -- status,
count, hash, link, region, probes and cycles -- equals :func:`ringkv.host.golden.prefix.
query_prefix` of a golden directory kept in step with the device's (``DIR_INSERT`` with the
device's ``dir_now``, evictions included). Then the real flow: a checkpoint exported with
``EXPORT kind=1`` is found by QUERY_PREFIX for a longer conversation and imported by QUERY.
"""

import random

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge

from ringkv.defs.config import RingKVConfig
from ringkv.defs.hash import hash_seed
from ringkv.defs.protocol import (
    DIR_RESPONSE,
    PREFIX_RESPONSE,
    RECOVERY_STATUS,
    REQUESTS,
    RESPONSES,
    SNAPSHOT_RESPONSE,
    Op,
    RecoveryState,
    Status,
)
from ringkv.defs.record import RecordKind, RecordLayout, elem_bytes
from ringkv.host.device.ops import pack_attn, pack_tokens
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.host.golden.prefix import prefix_keys, query_prefix
from ringkv.host.record import decode_header
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.sector_model import SectorImage
from ringkv.sim.top_bench import cocotb_start_top

P = cocotb_params()
CFG = RingKVConfig(**P["config"])
REGIONS, LINKS, BUCKETS = P["regions"], P["links"], P["buckets"]
SEED = hash_seed(CFG)
LIM = 1 << (8 * elem_bytes(CFG) - 1)


def req(op, **fields):
    return REQUESTS[op].pack(**fields)


@cocotb.test(timeout_time=400, timeout_unit="ms")
async def query_prefix_against_golden(dut):
    rng = random.Random(P["seed"])
    nrng = np.random.default_rng(P["seed"])
    lay = RecordLayout(CFG)
    image = SectorImage(None, REGIONS * lay.sectors_per_region)
    link = await cocotb_start_top(dut, image, rng=rng, link_idle=0.2, link_stall=0.5,
                                  storage_idle=0.1, storage_stall=0.1)

    # during the power-on scan: NOT_READY, like QUERY
    frame = await link.request(Op.QUERY_PREFIX, req(Op.QUERY_PREFIX, n=1))
    assert Status(frame.status) is Status.NOT_READY
    for _ in range(1000):
        st = RECOVERY_STATUS.unpack(await link.call(Op.STORAGE_STATUS))
        if st["state"] != RecoveryState.SCANNING.value:
            break
        for _ in range(100):
            await RisingEdge(dut.clk)
    assert st["state"] == RecoveryState.READY.value

    g = GoldenDirectory(buckets=BUCKETS, links=LINKS, regions=REGIONS)
    tokens = [rng.randrange(1 << CFG.token_width) for _ in range(CFG.max_tokens)]
    keys = dict(prefix_keys(tokens, SEED, CFG.max_tokens))
    seen = set()

    async def check(n, memory):
        want_status, want = query_prefix(memory, SEED, n, g)
        frame = await link.request(Op.QUERY_PREFIX, req(Op.QUERY_PREFIX, n=n))
        got = PREFIX_RESPONSE.unpack(frame.payload) if frame.payload else {}
        assert (Status(frame.status), got) == (want_status, want), n
        seen.add(want_status)

    async def insert(count, h):
        now = RESPONSES[Op.ALLOC_STATUS].unpack(await link.call(Op.ALLOC_STATUS))["dir_now"]
        r = DIR_RESPONSE.unpack(await link.call(Op.DIR_INSERT, req(
            Op.DIR_INSERT, count=count, hash=h, region=0, flags=1)))
        want = g.command({"op": 1, "count": count, "hash": h, "now": now, "evict": 1})
        assert (r["link"], r["region"], r["evicted"]) == (want["link"], want["region"],
                                                          want["evicted"])

    await check(1, [])                                   # empty token memory: BAD_ARG
    await link.call(Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=CFG.max_tokens)
               + pack_tokens(CFG, tokens))
    await check(CFG.max_tokens, tokens)                  # nothing stored
    for c in (1, 13, 30):
        await insert(c, keys[c])
    await insert(31, keys[30])                           # same hash, another count
    for n in (CFG.max_tokens, 31, 30, 29, 13, 12, 1):
        await check(n, tokens)
    await insert(CFG.max_tokens, keys[CFG.max_tokens])   # the whole sequence (evicts)
    await check(CFG.max_tokens, tokens)
    for _ in range(6):
        c = rng.randrange(1, CFG.max_tokens + 1)
        await insert(c, keys[c] if rng.random() < 0.7 else rng.getrandbits(64))
        for _ in range(2):
            await check(rng.randrange(1, CFG.max_tokens + 1), tokens)
    assert seen == {Status.HIT, Status.MISS, Status.BAD_ARG}

    # the real flow: a 6-token checkpoint, found and imported for a 20-token conversation
    await link.call(Op.DIR_CLEAR)
    await link.call(Op.SESSION_BEGIN)
    await link.call(Op.TOKENS_APPEND, req(Op.TOKENS_APPEND, n=6)
               + pack_tokens(CFG, tokens[:6]))
    for layer in range(CFG.layers):
        q = nrng.integers(-LIM, LIM, size=(6, CFG.q_heads, CFG.head_dim))
        k = nrng.integers(-LIM, LIM, size=(6, CFG.kv_heads, CFG.head_dim))
        await link.call(Op.ATTN_PREFILL, pack_attn(CFG, layer, q, k, k))
    r = SNAPSHOT_RESPONSE.unpack(await link.call(Op.EXPORT, req(
        Op.EXPORT, n=6, kind=RecordKind.CHECKPOINT.value)))
    assert r["record_status"] == 0
    assert decode_header(image.read(lay.region_lba(r["region"]), 1), CFG).kind == 1
    await link.call(Op.SESSION_BEGIN)
    await link.call(Op.TOKENS_WRITE, req(Op.TOKENS_WRITE, offset=0, n=20)
               + pack_tokens(CFG, tokens[:20]))
    p = PREFIX_RESPONSE.unpack(await link.call(Op.QUERY_PREFIX, req(Op.QUERY_PREFIX, n=20),
                                          Status.HIT))
    assert (p["count"], p["hash"], p["region"]) == (6, keys[6], r["region"])
    q = SNAPSHOT_RESPONSE.unpack(await link.call(Op.QUERY, req(Op.QUERY, n=6), Status.HIT))
    assert q["count"] == 6 and q["hash"] == keys[6]
