"""The GGUF export (``bench/gguf_export.py``) read back and run the way llama.cpp's
``granite_swa`` graph runs it (numpy, float64): adjacent-pair RoPE on the permuted q/k rows,
GGUF's (out, in) matrices, attention sinks, the logit scale, the sliding window of
``n_swa`` keys on every layer, equals :meth:`Model.forward_full` past the window. Needs only the
``gguf`` package (the ``dev`` and ``peer`` extras), not llama.cpp; skipped without it."""

import numpy as np
import pytest

from bench.gguf_export import byte_tokens, export, rope_permutation
from ringkv.defs.config import DEMO_CONFIG
from ringkv.host.model.transformer import BOS, Model

gguf = pytest.importorskip("gguf")


def _field(reader, key):
    f = reader.fields[key]
    if len(f.types) > 1 or f.types[0] == gguf.GGUFValueType.ARRAY:
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def _rope_adjacent(x, positions, base):
    """llama.cpp's "normal" RoPE: pairs (2i, 2i + 1), angle ``p * base^(-2i/d)``."""
    d = x.shape[-1]
    ang = positions[:, None] * base ** (-np.arange(0, d, 2) / d)          # (T, d/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def _llama_cpp_forward(path, tokens):
    """All logits of ``tokens`` from the GGUF file, following ``granite-swa.cpp``."""
    r = gguf.GGUFReader(str(path))
    arch = _field(r, "general.architecture")
    key = lambda k: _field(r, f"{arch}.{k}")                            # noqa: E731
    t = {x.name: np.asarray(x.data, dtype=np.float64) for x in r.tensors}
    n_layer, hq, hk = key("block_count"), key("attention.head_count"), \
        key("attention.head_count_kv")
    d, eps, base = key("attention.key_length"), key("attention.layer_norm_rms_epsilon"), \
        key("rope.freq_base")
    n_swa, pattern = key("attention.sliding_window"), key("attention.sliding_window_pattern")
    assert all(pattern) and len(pattern) == n_layer

    def norm(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    pos = np.arange(len(tokens), dtype=np.float64)
    i, j = np.arange(len(tokens))[:, None], np.arange(len(tokens))[None, :]
    masked = (j > i) | (i - j >= n_swa)
    x = t["token_embd.weight"][tokens]
    for il in range(n_layer):
        b = f"blk.{il}."
        n = norm(x, t[b + "attn_norm.weight"])
        q = _rope_adjacent((n @ t[b + "attn_q.weight"].T).reshape(-1, hq, d), pos, base)
        k = _rope_adjacent((n @ t[b + "attn_k.weight"].T).reshape(-1, hk, d), pos, base)
        v = (n @ t[b + "attn_v.weight"].T).reshape(-1, hk, d)
        o = np.empty_like(q)
        for h in range(hq):
            s = q[:, h] @ k[:, h // (hq // hk)].T / np.sqrt(d)
            s = np.where(masked, -np.inf, s)
            m = np.maximum(s.max(axis=1, keepdims=True), t[b + "attn_sinks.weight"][h])
            p = np.exp(s - m)
            p /= p.sum(axis=1, keepdims=True) + np.exp(t[b + "attn_sinks.weight"][h] - m)
            o[:, h] = p @ v[:, h // (hq // hk)]
        x = x + o.reshape(len(x), -1) @ t[b + "attn_output.weight"].T
        n = norm(x, t[b + "ffn_norm.weight"])
        g = n @ t[b + "ffn_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (n @ t[b + "ffn_up.weight"].T)) \
            @ t[b + "ffn_down.weight"].T
    logits = norm(x, t["output_norm.weight"]) @ t["output.weight"].T
    return logits / key("logit_scale")


def test_export_runs_as_llama_cpp_reads_it(tmp_path):
    model = Model.trained(DEMO_CONFIG)
    path = export(model, tmp_path / "m.gguf")
    rng = np.random.default_rng(3)
    tokens = [BOS] + list(b"In the beginning God created the heaven and the earth. ") \
        + rng.integers(0, 256, 2 * DEMO_CONFIG.window).tolist()
    assert len(tokens) > 3 * DEMO_CONFIG.window
    ours = model.forward_full(tokens)
    theirs = _llama_cpp_forward(path, np.array(tokens))
    # float32 weights are the float16-trained values exactly: float64 on both sides
    assert np.allclose(ours, theirs, atol=1e-9, rtol=1e-9)
    assert (ours.argmax(1) == theirs.argmax(1)).all()


def test_vocabulary_is_the_bytes_then_bos(tmp_path):
    r = gguf.GGUFReader(str(export(Model.trained(DEMO_CONFIG), tmp_path / "m.gguf")))
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert tokens == byte_tokens() and len(set(tokens)) == 257
    assert _field(r, "tokenizer.ggml.bos_token_id") == BOS
    # every byte's text is one character, and no merge joins two of them
    assert all(len(s) == 1 for s in tokens[:256])
    for merge in _field(r, "tokenizer.ggml.merges"):
        assert all(len(half) > 1 for half in merge.split(" "))


def test_rope_permutation_pairs_halves():
    p = rope_permutation(8)
    assert p.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
