"""The MAC core (``hw/seal/mac.py``) and the key slots (``hw/seal/key_slots.py``) in the Amaranth
simulator, bit-exact against ``hashlib.blake2s`` (the golden :func:`ringkv.host.golden.mac.mac`).

Every message is fed with the source's random idle gaps, and the tag is taken with random
stalls; while a message is open the feeder checks ``i.ready`` at every byte it presents (the
core must never stall inside a message), and the clocks from the ``last`` byte to the tag are
recorded for the overhead checks.
"""

import random

import pytest
from amaranth.sim import Simulator
from conftest import examples, requires_verilator
from hypothesis import given, settings
from hypothesis import strategies as st
from mac_vectors import KAT, KAT_KEY, kat_input

from ringkv.defs.config import DEFAULT_CONFIG
from ringkv.defs.mac import KEY_ID_BYTES, PERSONS, TAG_BYTES
from ringkv.host.golden.mac import mac, tenant_seed
from ringkv.hw.seal.key_slots import KeySlots
from ringkv.hw.seal.mac import BLOCK_CLOCKS, MacCore, MacUnit
from ringkv.sim.streams import stream_put, write_key


def key_bytes(key_id: int, key: bytes) -> list[dict]:
    raw = key_id.to_bytes(KEY_ID_BYTES, "little") + key
    return [{"slot": 0, "index": i, "data": b, "clear": 0} for i, b in enumerate(raw)]


async def set_key(ctx, dut, slot, key_id, key):
    await write_key(ctx, dut.key_write, slot, key_id, key)


class Run:
    """What one simulation saw: tags, clocks from ``last`` (or ``cmd``) to the tag, and every
    byte the source presented while ``i.ready`` was low."""

    def __init__(self):
        self.tags, self.latency, self.stalled = [], [], []


def rtl_mac(jobs, keys, *, seed=0, idle=0.0, stall=0.0, digest_bytes=TAG_BYTES,
            persons=PERSONS) -> Run:
    """Run ``jobs`` = ``[(slot, person, message), ...]`` through a :class:`MacUnit` whose
    slots are set from ``keys`` = ``{slot: (key_id, key)}``."""
    dut = MacUnit(digest_bytes=digest_bytes, persons=persons)
    rng = random.Random(seed)
    run = Run()
    clock = [0]

    async def counter(ctx):
        while True:
            await ctx.tick()
            clock[0] += 1

    async def tb(ctx):
        for slot, (key_id, key) in keys.items():
            await set_key(ctx, dut, slot, key_id, key)
        for slot, person, message in jobs:
            await stream_put(ctx, dut.cmd, {"person": person, "slot": slot,
                                            "empty": int(not message)}, rng=rng, idle=idle)
            mark = clock[0]
            for j, byte in enumerate(message):
                ctx.set(dut.i.valid, 0)
                while rng.random() < idle:
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": byte, "last": int(j == len(message) - 1)})
                while not ctx.get(dut.i.ready):
                    run.stalled.append((len(run.tags), j))
                    await ctx.tick()
                await ctx.tick()
                mark = clock[0]
            ctx.set(dut.i.valid, 0)
            while rng.random() < stall:
                await ctx.tick()
            ctx.set(dut.o.ready, 1)
            while not ctx.get(dut.o.valid):
                await ctx.tick()
            run.latency.append(clock[0] - mark)
            run.tags.append(ctx.get(dut.o.payload).to_bytes(digest_bytes, "little"))
            await ctx.tick()
            ctx.set(dut.o.ready, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(counter)
    sim.add_testbench(tb)
    sim.run()
    return run


def check(jobs, keys, **kwargs) -> Run:
    run = rtl_mac(jobs, keys, **kwargs)
    persons = kwargs.get("persons", PERSONS)
    digest_bytes = kwargs.get("digest_bytes", TAG_BYTES)
    expected = [mac(keys[slot][1], msg, person=persons[person], digest_bytes=digest_bytes)
                for slot, person, msg in jobs]
    assert run.tags == expected
    assert run.stalled == []
    return run


BOUNDARY = (0, 1, 2, 31, 32, 33, 42, 43, 63, 64, 65, 127, 128, 129, 191, 192, 193)


def test_published_keyed_vectors():
    """The BLAKE2 reference repository's keyed KATs (BLAKE2s-256, no person) on the RTL."""
    jobs = [(1, 0, kat_input(n)) for n in sorted(KAT)]
    run = rtl_mac(jobs, {1: (7, KAT_KEY)}, digest_bytes=32, persons=(b"",))
    assert run.tags == [bytes.fromhex(KAT[n]) for n in sorted(KAT)]


def test_boundary_lengths_both_persons():
    rng = random.Random(1)
    keys = {0: (1, rng.randbytes(32)), 3: (0xBEEF, rng.randbytes(32))}
    jobs = [(rng.choice((0, 3)), person, rng.randbytes(n))
            for n in BOUNDARY for person in range(len(PERSONS))]
    check(jobs, keys)


def test_idle_and_stalls():
    rng = random.Random(2)
    keys = {s: (s + 1, rng.randbytes(32)) for s in range(4)}
    jobs = [(rng.randrange(4), rng.randrange(2), rng.randbytes(rng.choice(BOUNDARY)))
            for _ in range(24)]
    check(jobs, keys, seed=3, idle=0.5, stall=0.7)


def test_several_kilobytes():
    rng = random.Random(4)
    keys = {2: (9, rng.randbytes(32))}
    check([(2, 0, rng.randbytes(4096 + 5))], keys, seed=5,
          idle=0.05, stall=0.5)


def test_overhead():
    """Clock edges from the one that transfers the ``last`` byte to ``o.valid`` high (the
    empty message: from ``cmd``'s transfer). ``BLOCK_CLOCKS`` when the engine is idle as the
    final block fills; otherwise the final block waits for the previous one: the key block
    (loaded in 8 clocks, then compressed) for a message under 50 bytes, the last full block
    for a final block under ``BLOCK_CLOCKS`` bytes."""
    key = bytes(range(32))
    lengths = [*range(0, 52), 63, 64, 65, 100, 106, 107, 108, 127, 128, 129, 150, 170, 171, 192,
               193, 235, 236]
    run = check([(0, 0, bytes(n)) for n in lengths], {0: (1, key)})
    for n, got in zip(lengths, run.latency):
        if n == 0:
            expected = BLOCK_CLOCKS + 8
        elif n <= 64:
            expected = max(BLOCK_CLOCKS, 2 * BLOCK_CLOCKS + 8 - n)
        else:
            expected = max(BLOCK_CLOCKS, 2 * BLOCK_CLOCKS - ((n - 1) % 64 + 1))
        assert got == expected, n
    assert max(run.latency) == 2 * BLOCK_CLOCKS + 7


@settings(max_examples=examples(fast=4, thorough=40))
@given(st.data())
def test_property(data):
    n_jobs = data.draw(st.integers(1, 3))
    keys = {data.draw(st.integers(0, 3)): (data.draw(st.integers(1, 0xFFFF)),
                                           data.draw(st.binary(min_size=32, max_size=32)))}
    slot = next(iter(keys))
    jobs = [(slot, data.draw(st.integers(0, 1)), data.draw(st.binary(max_size=300)))
            for _ in range(n_jobs)]
    check(jobs, keys, seed=data.draw(st.integers(0, 2**16)),
          idle=data.draw(st.sampled_from((0.0, 0.3))),
          stall=data.draw(st.sampled_from((0.0, 0.8))))



# --- key slots -----------------------------------------------------------------------------

def slots_run(writes, *, slots=4):
    """Apply ``writes`` to a :class:`KeySlots`; return (set bits, key ids, refused count, the
    words the read port gives for every slot)."""
    dut = KeySlots(slots)
    result = {}

    async def tb(ctx):
        refused = 0
        for w in writes:
            await stream_put(ctx, dut.write, {"clear": 0, "data": 0, "index": 0, **w})
            refused += ctx.get(dut.refused)
        await ctx.tick()
        words = {}
        for s in range(slots):
            ctx.set(dut.read.slot, s)
            words[s] = b""
            for k in range(8):
                ctx.set(dut.read.word, k)
                words[s] += ctx.get(dut.read.data).to_bytes(4, "little")
        result.update(set=ctx.get(dut.set), ids=[ctx.get(dut.key_ids[s]) for s in range(slots)],
                      refused=refused, words=words)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return result


def full_write(slot, key_id, key):
    return [{**w, "slot": slot} for w in key_bytes(key_id, key)]


def test_slots_set_read_clear():
    k1, k3 = bytes(range(32)), bytes(range(100, 132))
    r = slots_run(full_write(1, 0x1234, k1) + full_write(3, 7, k3))
    assert r["set"] == 0b1010 and r["ids"] == [0, 0x1234, 0, 7] and r["refused"] == 0
    assert r["words"][1] == k1 and r["words"][3] == k3
    assert r["words"][0] == r["words"][2] == bytes(32)
    r = slots_run(full_write(1, 0x1234, k1) + [{"slot": 1, "clear": 1}])
    assert r["set"] == 0 and r["ids"][1] == 0 and r["words"][1] == bytes(32)
    # a rewrite replaces the key and id
    r = slots_run(full_write(2, 5, k1) + full_write(2, 6, k3))
    assert r["set"] == 0b0100 and r["ids"][2] == 6 and r["words"][2] == k3


def test_slots_bad_slot_changes_nothing():
    k = bytes(range(32))
    before = slots_run(full_write(0, 9, k))
    after = slots_run(full_write(0, 9, k) + full_write(4, 1, bytes(32))
                      + [{"slot": 200, "clear": 1}])
    assert after["refused"] == len(full_write(4, 1, bytes(32))) + 1
    assert {k: after[k] for k in ("set", "ids", "words")} == \
        {k: before[k] for k in ("set", "ids", "words")}


def test_slots_partial_or_out_of_order_write_is_unset():
    k = bytes(range(32))
    w = full_write(0, 9, k)
    r = slots_run(w[:-1])                        # one byte short
    assert r["set"] == 0 and r["words"][0] == bytes(32)
    r = slots_run(w[:10] + w[11:])               # a byte skipped
    assert r["set"] == 0 and r["refused"] == len(w) - 11
    r = slots_run(full_write(1, 3, k) + w[:5])   # a new write unsets slot 0 only
    assert r["set"] == 0b10
    # interleaving another slot's write abandons the first
    r = slots_run(w[:5] + full_write(1, 3, k) + w[5:])
    assert r["set"] == 0b10 and r["refused"] == len(w) - 5
    # key id 0 is the open-mode id: never set
    r = slots_run(full_write(2, 0, k))
    assert r["set"] == 0


def test_unset_slot_reads_zero_key():
    """A slot without a complete key gives the MAC zeros, never stale RAM contents (the
    dispatcher refuses unset slots before it gets there)."""
    k = bytes(range(32))
    run = rtl_mac([(0, 0, b"abc")], {0: (5, k), 1: (0, bytes(range(1, 33)))})
    assert run.tags == [mac(k, b"abc")]
    run = rtl_mac([(1, 0, b"abc")], {0: (5, k), 1: (0, bytes(range(1, 33)))})
    assert run.tags == [mac(bytes(32), b"abc")]


@pytest.mark.parametrize("kwargs, exc, text", [
    (dict(digest_bytes=0), ValueError, "digest_bytes must be between 1 and 32, not 0"),
    (dict(digest_bytes=True), TypeError, "digest_bytes must be an integer"),
    (dict(persons=()), TypeError, "persons must be a non-empty tuple of bytes"),
    (dict(persons=(b"123456789",)), ValueError, "each person must be at most 8 bytes"),
    (dict(slots=0), ValueError, "slots must be between 1 and 256, not 0"),
])
def test_mac_params(kwargs, exc, text):
    with pytest.raises(exc, match=text):
        MacCore(**kwargs)


def test_slots_params():
    with pytest.raises(ValueError, match="slots must be between 1 and 256, not 257"):
        KeySlots(257)


@requires_verilator
def test_cocotb_verilator():
    from ringkv.sim.cocotb_run import run_cocotb
    run_cocotb(MacUnit(), toplevel="mac_unit", test_module="cocotb_mac",
               params={"seed": 3, "messages": 40, "long": 20000, "idle": 0.2, "stall": 0.5})


def test_key_reaches_only_the_tag():
    """Non-interference at the unit's ports: two runs that differ only in the key bytes give
    the same value on every output at every clock (ready/valid, ``set``, ``key_ids``,
    ``refused``), and differ only in the tag."""
    rng = random.Random(9)
    messages = [rng.randbytes(n) for n in (0, 1, 64, 100)]

    def trace(key):
        dut = MacUnit()
        seen = []
        ports = [dut.cmd.ready, dut.i.ready, dut.o.valid, dut.set, dut.key_ids.as_value(),
                 dut.refused]

        async def watch(ctx):
            async for _, _, *values in ctx.tick().sample(*ports):
                seen.append(tuple(values))

        async def tb(ctx):
            await set_key(ctx, dut, 1, 0x55AA, key)
            tags = []
            for msg in messages:
                await stream_put(ctx, dut.cmd, {"person": 0, "slot": 1, "empty": int(not msg)})
                for j, byte in enumerate(msg):
                    await stream_put(ctx, dut.i, {"data": byte, "last": int(j == len(msg) - 1)})
                ctx.set(dut.o.ready, 1)
                while not ctx.get(dut.o.valid):
                    await ctx.tick()
                tags.append(ctx.get(dut.o.payload))
                await ctx.tick()
                ctx.set(dut.o.ready, 0)
            seen.append(tags)

        sim = Simulator(dut)
        sim.add_clock(1e-6)
        sim.add_process(watch)
        sim.add_testbench(tb)
        sim.run()
        return seen[:-1], seen[-1]

    ports_a, tags_a = trace(bytes(32))
    ports_b, tags_b = trace(bytes(range(0x80, 0xA0)))
    assert ports_a == ports_b
    assert all(a != b for a, b in zip(tags_a, tags_b))


def test_tenant_seed_on_the_core():
    """The core with person 1 over the configuration digest gives the tenant's prefix-hash
    seed (its first 8 tag bytes), as the dispatcher will derive it when a slot is set."""
    rng = random.Random(12)
    key = rng.randbytes(32)
    digest = DEFAULT_CONFIG.digest()
    run = check([(3, 1, digest)], {3: (2, key)})
    assert int.from_bytes(run.tags[0][:8], "little") == tenant_seed(key, digest)


@pytest.mark.parametrize("abort_at", [0, 3, 40, 64, 70, 130, 200])
def test_abort_frees_the_core(abort_at):
    """``abort`` in the middle of a message (during the key load, inside a block, on a block
    boundary, with the final block compressing, with the tag waiting): the core is idle the
    clock after (``cmd.ready`` high, ``i.ready`` and ``o.valid`` low), and the next message's
    tag is ``hashlib``'s, whatever the aborted message left in the buffers."""
    rng = random.Random(abort_at)
    key = rng.randbytes(32)
    first, second = rng.randbytes(100), rng.randbytes(77)
    dut = MacUnit()
    out = {}

    async def tb(ctx):
        await set_key(ctx, dut, 2, 9, key)
        await stream_put(ctx, dut.cmd, {"person": 0, "slot": 2, "empty": 0})
        sent = 0
        for _ in range(abort_at):
            if sent < len(first) and ctx.get(dut.i.ready):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": first[sent], "last": int(sent == 99)})
                sent += 1
            else:
                ctx.set(dut.i.valid, 0)
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.abort, 1)
        await ctx.tick()
        ctx.set(dut.abort, 0)
        out["after"] = (ctx.get(dut.cmd.ready), ctx.get(dut.i.ready), ctx.get(dut.o.valid))
        await stream_put(ctx, dut.cmd, {"person": 0, "slot": 2, "empty": 0})
        for j, byte in enumerate(second):
            await stream_put(ctx, dut.i, {"data": byte, "last": int(j == len(second) - 1)})
        ctx.set(dut.o.ready, 1)
        while not ctx.get(dut.o.valid):
            await ctx.tick()
        out["tag"] = ctx.get(dut.o.payload).to_bytes(TAG_BYTES, "little")
        await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert out["after"] == (1, 0, 0)
    assert out["tag"] == mac(key, second)
