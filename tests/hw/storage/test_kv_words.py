"""The wide import's K/V writer (hw/storage/kv_words.py) against its golden model
(host/golden/kv_words.py) and against the record codec: the writes in order, and the ring image
they leave equal to the codec's rings on every valid slot and untouched elsewhere; random idle
on the input and backpressure on the output; the valid-slot counts at and around the column
and word boundaries; exact clocks; flush; each broken variant caught."""

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import RecordLayout
from ringkv.host.golden.kv_words import kv_word_clocks, kv_word_writes
from ringkv.host.record.codec import encode_payload, ring_image
from ringkv.hw.storage.kv_words import KV_WORDS_BUGS, KvWordWriter, kv_words_supported

#: a K row of 4 bytes (one word), two rings per layer
SMALL = RingKVConfig(layers=2, q_heads=2, kv_heads=2, head_dim=4, window=8, token_width=12,
                     max_tokens=50)
#: two bytes an element: a chunk is 2 dimensions
SMALL2 = RingKVConfig(**{**SMALL.__dict__, "numerics": "ringkv-fx2"})
#: longer rows and columns: a K row of 4 words, 4 chunks a ring's V, a 16-slot window
WIDE = RingKVConfig(layers=1, q_heads=2, kv_heads=1, head_dim=16, window=16, token_width=16,
                    max_tokens=40)
WIDE2 = RingKVConfig(**{**WIDE.__dict__, "numerics": "ringkv-fx2"})
CONFIGS = {"small": SMALL, "small_fx2": SMALL2, "wide": WIDE, "wide_fx2": WIDE2}


def _area(config, count, head, seed):
    """(valid slots, first slot, rings, the K/V area's bytes) of a random record."""
    rng = np.random.default_rng(seed)
    eb = RecordLayout(config).elem_bytes
    rings = rng.integers(0, 1 << (8 * eb), size=(config.layers, config.kv_heads, 2,
                                                  config.window, config.head_dim))
    _, kv = encode_payload(config, [0] * count, rings, count, head)
    v = min(count, config.window)
    return v, (head - v + 1) % config.window, rings, kv


def simulate(dut, runs, *, seed=0, idle=0.0, stall=0.0, flush_at=None):
    """Each run ``(valid_slots, first_slot, kv)``: start, the words in (random idle), the
    writes out (random stall). Returns per run ``(writes, clocks from the first word taken to
    the last write taken, clocks words.ready was low while a word was offered)``.
    ``flush_at``: flush after that many words of the first run, then do it again whole."""
    rng = random.Random(seed)
    results = []

    async def bench(ctx):
        for n, (v, s0, kv) in enumerate(runs):
            words = [int.from_bytes(kv[i:i + 4], "little") for i in range(0, len(kv), 4)]
            ctx.set(dut.valid_slots, v)
            ctx.set(dut.first_slot, s0)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            if n == 0 and flush_at is not None:
                ctx.set(dut.writes.ready, 1)
                for word in words[:flush_at]:
                    ctx.set(dut.words.valid, 1)
                    ctx.set(dut.words.payload, word)
                    await ctx.tick().until(dut.words.ready)
                ctx.set(dut.writes.ready, 0)
                ctx.set(dut.words.valid, 0)
                ctx.set(dut.flush, 1)
                await ctx.tick()
                ctx.set(dut.flush, 0)
                assert ctx.get(dut.idle) and not ctx.get(dut.writes.valid)
                ctx.set(dut.start, 1)
                await ctx.tick()
                ctx.set(dut.start, 0)
            writes, sent, clock, first, last, refused = [], 0, 0, None, None, 0
            while len(writes) < len(words):
                offer = sent < len(words) and not (idle and rng.random() < idle)
                take = not (stall and rng.random() < stall)
                ctx.set(dut.words.valid, offer)
                if offer:
                    ctx.set(dut.words.payload, words[sent])
                ctx.set(dut.writes.ready, take)
                if offer and ctx.get(dut.words.ready):
                    first = clock if first is None else first
                    sent += 1
                elif offer:
                    refused += 1
                if take and ctx.get(dut.writes.valid):
                    w = ctx.get(dut.writes.payload)
                    writes.append((w.addr, w.data))
                    last = clock
                await ctx.tick()
                clock += 1
                assert clock < 20 * len(words) + 200, "the writer hangs"
            ctx.set(dut.words.valid, 0)
            ctx.set(dut.writes.ready, 0)
            assert ctx.get(dut.idle)
            results.append((writes, last - first, refused))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results


def _apply(config, writes):
    image = bytearray(len(ring_image(config, np.zeros((config.layers, config.kv_heads, 2,
                                                       config.window, config.head_dim), int))))
    for addr, data in writes:
        assert addr % 4 == 0 and addr + 4 <= len(image), hex(addr)
        image[addr:addr + 4] = data.to_bytes(4, "little")
    return bytes(image)


def _check_rings(config, rings, v, s0, image):
    """The image holds the codec's rings on the valid slots, zeros elsewhere."""
    eb = RecordLayout(config).elem_bytes
    want = np.frombuffer(ring_image(config, rings), np.uint8).reshape(
        config.layers, config.kv_heads, 2, config.window, config.head_dim * eb).copy()
    valid = [(s0 + t) % config.window for t in range(v)]
    mask = np.zeros(config.window, bool)
    mask[valid] = True
    want[:, :, :, ~mask, :] = 0
    assert image == want.tobytes()


def _counts(config):
    W = config.window
    return sorted({1, 2, 3, 4, 5, W - 1, W, W + 3})


def test_parameter_errors():
    one = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=2, window=2, token_width=8,
                       max_tokens=9)
    assert not kv_words_supported(one) and kv_words_supported(SMALL)
    assert kv_words_supported(RingKVConfig(**{**one.__dict__, "numerics": "ringkv-fx2"}))
    with pytest.raises(ValueError, match=r"^the K/V area cannot move four bytes a clock: a K "
                                         r"row is 2 bytes, not a multiple of 4$"):
        KvWordWriter(one)
    with pytest.raises(ValueError, match=r"^Unknown bug 'x'"):
        KvWordWriter(SMALL, _bug="x")
    with pytest.raises(TypeError):
        KvWordWriter("small")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_writes_equal_the_golden_and_fill_the_rings(name):
    """Every valid-slot count around the boundaries (1 to 5: columns shorter than a word and
    words across column ends; W - 1, W, a wrapped ring) and the oldest slot anywhere, one run
    after another on one writer, with random idle and stall: the writes are the golden
    model's, in its order, and leave the codec's rings on the valid slots, nothing elsewhere."""
    config = CONFIGS[name]
    rng = random.Random(name)
    runs, meta = [], []
    for count in _counts(config):
        head = rng.randrange(config.window)
        v, s0, rings, kv = _area(config, count, head, rng.randrange(1 << 30))
        runs.append((v, s0, kv))
        meta.append((v, s0, rings, kv))
    results = simulate(KvWordWriter(config), runs, seed=1, idle=0.3, stall=0.3)
    for (v, s0, rings, kv), (writes, _, _) in zip(meta, results):
        assert writes == kv_word_writes(config, v, s0, kv), (v, s0)
        _check_rings(config, rings, v, s0, _apply(config, writes))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_exact_clocks_at_full_rate(name):
    """Every word offered at once and every write taken: never a refused word, and the last
    write ``words + v + 1`` clocks after the first word (the input register, the last
    chunk's drain)."""
    config = CONFIGS[name]
    runs = [_area(config, count, count % config.window, count)[:2]
            + (_area(config, count, count % config.window, count)[3],)
            for count in _counts(config)]
    for (v, _, _), (writes, clocks, refused) in zip(runs, simulate(KvWordWriter(config),
                                                                  runs)):
        assert refused == 0, v
        assert clocks == kv_word_clocks(config, v) == len(writes) + v + 1, v


def test_flush_drops_a_half_done_area():
    """A flush in the middle of V (a chunk buffered, another filling) leaves the writer idle;
    the same area again from the start gives the golden writes."""
    config = WIDE
    v, s0, _, kv = _area(config, 11, 3, 5)
    k_words = len(kv) // 8
    (writes, _, _), = simulate(KvWordWriter(config), [(v, s0, kv)], seed=2, stall=0.2,
                               flush_at=k_words + v + 3)
    assert writes == kv_word_writes(config, v, s0, kv)


@pytest.mark.parametrize("bug", KV_WORDS_BUGS)
def test_every_broken_variant_is_caught(bug):
    """Each broken writer fails here: wrong writes, or (one buffer) a refused word at full
    rate and clocks beyond the golden."""
    config = SMALL if bug != "sub_bank" else WIDE
    runs = [(v, s0, kv) for v, s0, _, kv in (_area(config, n, n, n) for n in (3, 5, 9))]
    results = simulate(KvWordWriter(config, _bug=bug), runs)
    wrong = any(writes != kv_word_writes(config, v, s0, kv)
                for (v, s0, kv), (writes, _, _) in zip(runs, results))
    slow = any(refused or clocks != kv_word_clocks(config, v)
               for (v, _, _), (_, clocks, refused) in zip(runs, results))
    assert wrong or slow, bug
    if bug == "one_buffer":
        assert slow and not wrong
