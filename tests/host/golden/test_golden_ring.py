"""Ring-buffer KV cache reference: slot rules, write-then-attend decode, chunked prefill."""

import numpy as np
import pytest

from ringkv.host.golden.ring import SLOT_RULES, RingKVCache
from ringkv.host.golden.swa import swa_attention

HQ, HKV, D = 4, 2, 5


def sequence(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, HQ, D)), rng.standard_normal((n, HKV, D)),
            rng.standard_normal((n, HKV, D)))


def run(W, rule, q, k, v, plan):
    """Feed the sequence through a cache following ``plan``: ("prefill", c) | ("chunk", c) |
    ("decode", c). Returns the outputs of every token (prefill uses chunked_prefill on the
    empty cache so its outputs exist too) and the cache."""
    cache = RingKVCache(W, HKV, D, rule)
    outs, p = [], 0
    for kind, c in plan:
        if kind == "decode":
            for _ in range(c):
                outs.append(cache.decode_step(q[p], k[p], v[p])[None])
                p += 1
        else:
            if kind == "prefill":
                assert cache.n == 0
            outs.append(cache.chunked_prefill(q[p:p + c], k[p:p + c], v[p:p + c]))
            p += c
        assert cache.n == p
        assert len(cache.valid_slots()) == min(p, W)
    return np.concatenate(outs) if outs else np.zeros((0, HQ, D)), cache


def check_state(cache, k, v):
    """Slots hold exactly the last min(n, W) tokens, each with its own position."""
    n, W = cache.n, cache.W
    s = cache.valid_slots()
    assert sorted(cache.slot_pos[s]) == list(range(max(0, n - W), n))
    for slot in s:
        p = cache.slot_pos[slot]
        assert np.array_equal(cache.k_slots[slot], k[p])
        assert np.array_equal(cache.v_slots[slot], v[p])
    ku, vu = cache.unrotate()
    assert np.array_equal(ku, k[max(0, n - W):n]) and np.array_equal(vu, v[max(0, n - W):n])
    if n:
        assert cache.slot_pos[cache.head] == n - 1


# ---- decode in ring order equals full recompute ---------------------------------------------

@pytest.mark.parametrize("rule", SLOT_RULES)
@pytest.mark.parametrize("W", [1, 2, 3, 5, 8])
def test_decode_equals_full_recompute(rule, W):
    n_total = 4 * W + 7  # several wrap-arounds
    q, k, v = sequence(n_total, seed=W)
    full = swa_attention(q, k, v, W)
    for prompt in sorted({0, 1, W - 1, W, W + 1, 2 * W + 3}):
        prompt = max(prompt, 0)
        plan = ([("prefill", prompt)] if prompt else []) + [("decode", n_total - prompt)]
        o, cache = run(W, rule, q, k, v, plan)
        np.testing.assert_allclose(o, full, rtol=0, atol=1e-12)
        check_state(cache, k, v)


@pytest.mark.parametrize("rule", SLOT_RULES)
def test_decode_every_length(rule):
    """Each prefix length n = 0..N: decoding token n from a cache built by prefill of n tokens."""
    W, N = 6, 40
    q, k, v = sequence(N, seed=3)
    full = swa_attention(q, k, v, W)
    for n in range(N):
        cache = RingKVCache(W, HKV, D, rule)
        cache.prefill(k[:n], v[:n])
        check_state(cache, k, v)
        np.testing.assert_allclose(cache.decode_step(q[n], k[n], v[n]), full[n], rtol=0,
                                   atol=1e-12)


def test_first_decode_on_empty_cache_attends_itself():
    q, k, v = sequence(1, seed=4)
    for rule in SLOT_RULES:
        cache = RingKVCache(3, HKV, D, rule)
        o = cache.decode_step(q[0], k[0], v[0])
        np.testing.assert_allclose(o, v[0][np.arange(HQ) // (HQ // HKV)], rtol=0, atol=1e-15)
        assert cache.head == 0 and list(cache.slot_pos) == [0, -1, -1]


@pytest.mark.parametrize("P", [1, 2, 3, 5, 7])
def test_decode_split_kv_lanes(P):
    W, N = 5, 23
    q, k, v = sequence(N, seed=5)
    full = swa_attention(q, k, v, W)
    for rule in SLOT_RULES:
        cache = RingKVCache(W, HKV, D, rule)
        for p in range(N):
            o = cache.decode_step(q[p], k[p], v[p], P=P)
            np.testing.assert_allclose(o, full[p], rtol=0, atol=1e-12)


# ---- slot rules ------------------------------------------------------------------------------

def test_packed_slot_rule():
    W = 4
    _, k, v = sequence(12, seed=6)
    c = RingKVCache(W, HKV, D, "packed")
    c.prefill(k[:3], v[:3])  # k <= W: slots 0..k-1
    assert list(c.slot_pos) == [0, 1, 2, -1] and c.head == 2
    c = RingKVCache(W, HKV, D, "packed")
    c.prefill(k[:7], v[:7])  # k > W: last W tokens in slots 0..W-1, in order
    assert list(c.slot_pos) == [3, 4, 5, 6] and c.head == 3
    q = np.zeros((HQ, D))
    heads = []
    for p in range(7, 12):  # decode: slot = (last + 1) % W
        c.decode_step(q, k[p], v[p])
        heads.append(c.head)
    assert heads == [0, 1, 2, 3, 0]
    assert list(c.slot_pos) == [11, 8, 9, 10]


def test_mod_slot_rule_matches_mixtral_example():
    """Mixtral's chunked-prefill example: chunk_size 5, W 3: after chunk 0 the cache holds
    [3, 4, 2], after chunk 1 [9, 7, 8]."""
    q, k, v = sequence(10, seed=7)
    c = RingKVCache(3, HKV, D, "mod")
    c.chunked_prefill(q[:5], k[:5], v[:5])
    assert list(c.slot_pos) == [3, 4, 2]
    c.chunked_prefill(q[5:], k[5:], v[5:])
    assert list(c.slot_pos) == [9, 7, 8]
    s = RingKVCache(3, HKV, D, "packed")
    s.chunked_prefill(q[:5], k[:5], v[:5])
    assert list(s.slot_pos) == [2, 3, 4]


@pytest.mark.parametrize("W", [1, 2, 4, 7])
def test_both_rules_same_outputs_different_layout(W):
    N = 5 * W + 3
    q, k, v = sequence(N, seed=20 + W)
    plan = [("prefill", W + 1), ("decode", 2), ("chunk", W), ("decode", N - 2 * W - 3)]
    oa, ca = run(W, "packed", q, k, v, plan)
    ob, cb = run(W, "mod", q, k, v, plan)
    np.testing.assert_allclose(oa, ob, rtol=0, atol=1e-12)
    if W > 1:  # the rules really do place tokens differently (prompt W + 1: offset by 1)
        assert not np.array_equal(ca.slot_pos, cb.slot_pos)
    assert all(cb.slot_pos[s] % W == s for s in cb.valid_slots())


def test_constructor_and_input_checks():
    with pytest.raises(ValueError):
        RingKVCache(0, 1, 1)
    with pytest.raises(ValueError):
        RingKVCache(4, 1, 1, rule="lru")
    c = RingKVCache(4, HKV, D)
    with pytest.raises(ValueError):
        c.prefill(np.zeros((3, HKV + 1, D)), np.zeros((3, HKV + 1, D)))
    c.prefill(np.zeros((2, HKV, D)), np.zeros((2, HKV, D)))
    with pytest.raises(RuntimeError):
        c.prefill(np.zeros((2, HKV, D)), np.zeros((2, HKV, D)))
    with pytest.raises(ValueError):
        c.chunked_prefill(np.zeros((3, HQ, D)), np.zeros((2, HKV, D)), np.zeros((2, HKV, D)))
    with pytest.raises(ValueError):
        c.decode_step(np.zeros((3, D)), np.zeros((HKV, D)), np.zeros((HKV, D)))


# ---- chunked prefill --------------------------------------------------------------------------

@pytest.mark.parametrize("rule", SLOT_RULES)
@pytest.mark.parametrize("W", [1, 2, 4, 6])
@pytest.mark.parametrize("C", [1, 3, 4, 6, 9, 13])
def test_chunked_prefill_equals_full_recompute(rule, W, C):
    """C below, equal to and above W, chunks not dividing the prompt, then decode."""
    N = 3 * C + 2 * W + 5
    q, k, v = sequence(N, seed=100 * W + C)
    full = swa_attention(q, k, v, W)
    n_chunks = 3
    plan = [("chunk", C)] * n_chunks + [("chunk", 2)] + [("decode", N - n_chunks * C - 2)]
    o, cache = run(W, rule, q, k, v, plan)
    np.testing.assert_allclose(o, full, rtol=0, atol=1e-12)
    check_state(cache, k, v)


@pytest.mark.parametrize("rule", SLOT_RULES)
def test_irregular_chunks(rule):
    W = 5
    rng = np.random.default_rng(42)
    sizes = [int(x) for x in rng.integers(1, 13, size=12)]
    N = sum(sizes) + 6
    q, k, v = sequence(N, seed=43)
    plan = [("chunk", s) if i % 3 else ("decode", s) for i, s in enumerate(sizes)]
    plan.append(("decode", 6))
    o, cache = run(W, rule, q, k, v, plan)
    np.testing.assert_allclose(o, swa_attention(q, k, v, W), rtol=0, atol=1e-12)
    check_state(cache, k, v)


# ---- traps: wrong decode variants must differ ------------------------------------------------

def wrong_decode(cache, q, k_new, v_new, mode):
    """Ring decode done wrong. 'read_before_write': attend the old valid slots, then write;
    'w_plus_1': attend old slots plus the new token (W+1 keys once full), then write."""
    s = cache.valid_slots()
    keys, vals, pos = cache.k_slots[s], cache.v_slots[s], cache.slot_pos[s]
    if mode == "w_plus_1":
        keys = np.concatenate([keys, k_new[None]])
        vals = np.concatenate([vals, v_new[None]])
        pos = np.concatenate([pos, [cache.n]])
    if len(pos):
        o = swa_attention(q[None], keys, vals, None, q_pos=[cache.n], k_pos=pos)[0]
    else:
        o = np.zeros_like(q)
    cache.decode_step(np.zeros_like(q), k_new, v_new)  # the write
    return o


@pytest.mark.parametrize("mode", ["read_before_write", "w_plus_1"])
@pytest.mark.parametrize("W", [1, 2, 5])
def test_wrong_decode_orders_are_caught(mode, W):
    N = 3 * W + 4
    q, k, v = sequence(N, seed=60 + W)
    full = swa_attention(q, k, v, W)
    good, bad = RingKVCache(W, HKV, D), RingKVCache(W, HKV, D)
    diffs = []
    for p in range(N):
        o = good.decode_step(q[p], k[p], v[p])
        np.testing.assert_allclose(o, full[p], rtol=0, atol=1e-12)
        diffs.append(np.abs(wrong_decode(bad, q[p], k[p], v[p], mode) - o).max())
    assert max(diffs) > 1e-3
    if mode == "w_plus_1":  # agrees until the ring is full, differs afterwards
        assert max(diffs[:W]) < 1e-12 and min(diffs[W:]) > 1e-6


def test_wrong_slot_rule_is_caught():
    """Overwriting the newest slot instead of (last + 1) % W loses tokens still in the window."""
    W, N = 4, 14
    q, k, v = sequence(N, seed=70)
    full = swa_attention(q, k, v, W)

    class Stuck(RingKVCache):
        def slot_for(self, p):
            return max(self.head, 0) if self.n >= W else super().slot_for(p)

    c = Stuck(W, HKV, D)
    o = np.stack([c.decode_step(q[p], k[p], v[p]) for p in range(N)])
    assert np.abs(o - full).max() > 1e-3
