"""Sealed device, tenants: what QUERY_PREFIX's timing still tells tenant B about tenant A.

A sealed ``RingKVTop`` (``sealed=True``) at the default configuration (``DEFAULT_CONFIG``, 64
regions: 64 directory links in 32 buckets, P=4 lanes x M=8 MACs) in the Amaranth simulator,
driven through byte frames; two tenants' keys in slots 0 (A) and 1 (B) by ``KEY_SET``. Tenant
B asks ``QUERY_PREFIX n`` (slot 1) over ``SEQUENCES`` random conversations of ``N`` tokens,
first with an empty directory, then with tenant A's records present: A's keys (the prefix
hashes of A's own conversations under A's seed, ``golden_mac.tenant_seed``) inserted with
``DIR_INSERT`` up to a number of live links (the directory holds only a record's key, so an
export of A's would add the same entry). Every answer is checked field for field, ``cycles``
included, against the golden model :func:`ringkv.host.golden.prefix.query_prefix` with B's
seed (plus the sealed request's one extra argument byte): B's answer never changes (a miss:
isolation), only its clocks do. The spread is over B's conversations: min, mean and max of
the device's own ``cycles`` (from the request's header to the answer, exact).

Also measured: what ``KEY_SET`` costs (its key write and the tenant-seed derivation through the
MAC) against ``KEY_CLEAR``: clocks from the request's last byte on ``rx`` to the last byte of
its answer on ``tx`` (both answer 8 bytes: a status, no payload), with no idle or stall.
"""

import random
import statistics

from bench.run import table
from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.protocol import (
    DIR_RESPONSE,
    PREFIX_RESPONSE,
    REQUESTS,
    RESPONSES,
    Op,
    Status,
    build_requests,
)
from ringkv.host.device.ops import pack_tokens
from ringkv.host.golden.directory import GoldenDirectory
from ringkv.host.golden.mac import tenant_seed
from ringkv.host.golden.prefix import prefix_keys, query_prefix

__all__ = ["TITLE", "run", "markdown"]

TITLE = "Sealed device: tenant B's QUERY_PREFIX with and without tenant A's records"
REGIONS, LANES, MACS = 64, 4, 8
N, SEQUENCES = 256, 8
#: live directory links holding tenant A's records, per measurement
A_RECORDS = (0, 16, 32, 64)
#: the smoke run: the tests' small shape (L=2 Hq=4 Hkv=2 d=8 W=8, P=2 x M=4), 16 regions (16
#: links in 8 buckets), 32-token conversations, 3 of them
SMOKE_CONFIG = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=8, window=8,
                            max_tokens=64)
SMOKE = {"regions": 16, "n": 32, "sequences": 3, "a_records": (0, 8, 16),
         "config": SMOKE_CONFIG, "lanes": 2, "macs": 4}
KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))


def _measure(regions, n, sequences, a_records, config=DEFAULT_CONFIG, lanes=LANES, macs=MACS):
    from ringkv.hw.top import RingKVTop
    from ringkv.sim.top_bench import image_for, run_top

    top = RingKVTop(config, regions=regions, lanes=lanes, macs=macs, sealed=True)
    digest = config.digest()
    seed_a, seed_b = tenant_seed(KEY_A, digest), tenant_seed(KEY_B, digest)
    rng = random.Random(23)
    convs_b = [[rng.randrange(1 << config.token_width) for _ in range(n)]
               for _ in range(sequences)]
    # A's records: every prefix key of A's conversations, longest conversations first
    keys_a = []
    while len(keys_a) < max(a_records):
        conv = [rng.randrange(1 << config.token_width) for _ in range(n)]
        keys_a += prefix_keys(conv, seed_a, n)
    sealed = build_requests(True)
    out = {}

    async def call(ctx, link, op, payload=b""):
        frame = await link.request(ctx, op, payload)
        return Status(frame.status), frame.payload

    async def scenario(ctx, link):
        for slot, key_id, key in ((0, 1, KEY_A), (1, 2, KEY_B)):
            status, _ = await call(ctx, link, Op.KEY_SET, REQUESTS[Op.KEY_SET].pack(
                slot=slot, key_id=key_id) + key)
            if status is not Status.OK:
                raise AssertionError(f"KEY_SET: {status}")
            out.setdefault("key_set", []).append(link.cycles)
        status, _ = await call(ctx, link, Op.KEY_CLEAR, REQUESTS[Op.KEY_CLEAR].pack(slot=2))
        if status is not Status.OK:
            raise AssertionError(f"KEY_CLEAR: {status}")
        out["key_clear"] = link.cycles
        g = GoldenDirectory(buckets=top.buckets, links=top.links, regions=top.regions)
        inserted = 0
        for count in a_records:
            for c, h in keys_a[inserted:count]:
                _, data = await call(ctx, link, Op.ALLOC_STATUS)
                now = RESPONSES[Op.ALLOC_STATUS].unpack(data)["dir_now"]
                status, data = await call(ctx, link, Op.DIR_INSERT, REQUESTS[Op.DIR_INSERT]
                                          .pack(count=c, hash=h, region=0, flags=0))
                want = g.command({"op": 1, "count": c, "hash": h, "now": now})
                if (status, DIR_RESPONSE.unpack(data)["link"]) != (Status.OK, want["link"]):
                    raise AssertionError("directory insert disagrees with the golden model")
            inserted = count
            cycles, probes = [], []
            for conv in convs_b:
                await call(ctx, link, Op.TOKENS_WRITE, REQUESTS[Op.TOKENS_WRITE].pack(
                    offset=0, n=n) + pack_tokens(config, conv))
                status, data = await call(ctx, link, Op.QUERY_PREFIX,
                                          sealed[Op.QUERY_PREFIX].pack(n=n, slot=1))
                got = PREFIX_RESPONSE.unpack(data)
                want_status, want = query_prefix(conv, seed_b, n, g)
                want = dict(want, cycles=want["cycles"] + 1)      # the slot byte
                if (status, got) != (want_status, want) or status is not Status.MISS:
                    raise AssertionError(f"QUERY_PREFIX: device {status} {got}, golden "
                                         f"{want_status} {want}")
                cycles.append(got["cycles"])
                probes.append(got["probes"])
            chains = [len(g.chain(b)) for b in range(g.buckets)]
            out[count] = {"cycles": cycles, "probes": probes, "live": len(g.live),
                          "empty_buckets": chains.count(0)}

    run_top(top, image_for(top), scenario)
    return top, out


def run(smoke: bool = False):
    p = SMOKE if smoke else {"regions": REGIONS, "n": N, "sequences": SEQUENCES,
                             "a_records": A_RECORDS}
    top, out = _measure(p["regions"], p["n"], p["sequences"], p["a_records"],
                        **{k: p[k] for k in ("config", "lanes", "macs") if k in p})
    base = {"config": "small" if smoke else "DEFAULT_CONFIG", "regions": p["regions"],
            "links": top.links,
            "buckets": top.buckets, "n": p["n"], "sequences": p["sequences"],
            "simulator": "Amaranth", "tenant_slot": 1}
    empty = out[0]["cycles"]
    if len(set(out["key_set"])) != 1:
        raise AssertionError(f"KEY_SET's clocks vary with the key: {out['key_set']}")
    results = [{"name": "sealed.key_set_cycles", "value": out["key_set"][0], "unit": "cycles",
                "params": {**base, "how": "last request byte on rx to last answer byte on tx",
                           "key_clear_cycles": out["key_clear"]}}]
    for count in p["a_records"]:
        c = out[count]
        extra = [a - b for a, b in zip(c["cycles"], empty)]
        params = {**base, "a_records": count, "live_links": c["live"],
                  "empty_buckets": c["empty_buckets"], "cycles_min": min(c["cycles"]),
                  "cycles_max": max(c["cycles"]), "cycles": c["cycles"],
                  "links_compared": c["probes"], "extra_vs_empty_min": min(extra),
                  "extra_vs_empty_max": max(extra)}
        results.append({"name": f"sealed.prefix_b_cycles_mean.a{count}",
                        "value": round(statistics.mean(c["cycles"]), 2), "unit": "cycles",
                        "params": params})
    return results


def markdown(results) -> str:
    rows = []
    key_set = results[0]
    results = results[1:]
    for r in results:
        p = r["params"]
        rows.append([p["a_records"], p["empty_buckets"], p["cycles_min"], f"{r['value']:g}",
                     p["cycles_max"], f"{p['extra_vs_empty_min']}..{p['extra_vs_empty_max']}",
                     f"{min(p['links_compared'])}..{max(p['links_compared'])}"])
    p = results[0]["params"]
    shape = "default" if p["config"] == "DEFAULT_CONFIG" else p["config"]
    lines = [f"Tenant B's `QUERY_PREFIX n={p['n']}` (slot {p['tenant_slot']}) on a sealed "
             f"`RingKVTop` ({shape} configuration, {p['regions']} regions: {p['links']} links "
             f"in {p['buckets']} buckets; Amaranth simulator, the device's own cycle count, "
             "checked against the golden model with B's seed) over "
             f"{p['sequences']} random conversations, with tenant A's records (keys under A's "
             "seed) in the directory. B's answer is a miss in every row (A's records are "
             "never B's hits); its clocks grow with A's records in the buckets B's keys fall "
             "into: timing shows B how full the directory is, not what A stored.", ""]
    lines.append(table(["A's records", "empty buckets", "B cycles min", "mean", "max",
                        "extra vs empty (per conversation)", "links compared"], rows))
    lines += ["", f"`KEY_SET` (the slot write and the tenant-seed derivation through the MAC): "
              f"{key_set['value']} clocks from the request's last byte to the answer's last, "
              f"against {key_set['params']['key_clear_cycles']} for `KEY_CLEAR` (both answer "
              "8 bytes; no idle or stall)."]
    return "\n".join(lines)
