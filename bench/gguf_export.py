"""The trained model as a GGUF file for llama.cpp (the ``peer`` benchmark's llama-server).

Written with the ``gguf`` package (PyPI; the ``peer`` extra pins it). The architecture is
llama.cpp's ``granite_swa`` (``src/models/granite-swa.cpp`` of the llama.cpp built by ``make
peer``): of the architectures that llama.cpp runs with a sliding window, it is the one whose
graph is ours once its extras are made neutral. Its layer is the llama one (pre-RMSNorm,
``x + Wo·attn(RoPE q, RoPE k, v)``, ``x + W2(silu(W1 n) * W3 n)``, GQA, separate ``output``
matrix), every layer's attention goes through the interleaved-SWA KV cache with a per-layer
sliding-window flag (``granite_swa.attention.sliding_window_pattern``: all true here), and the
window is ``STANDARD``: a key at ``j`` is hidden from the query at ``i`` when ``i - j >= n_swa``
(``llama-hparams.h``, ``is_masked_swa``), so ``n_swa = W`` keeps the same ``W`` keys as ours
(``docs/CONVENTIONS.md#window``), on every layer. Its extras, and what makes each neutral:

* attention sinks (a learned logit per head added to the softmax's denominator; a required
  tensor): ``-1e30``, whose ``exp`` is 0 in float, so the softmax is the plain one;
* Granite's multipliers: ``logit_scale`` 1 (logits divided by it); no residual, embedding or
  attention scale (absent keys: none applied, and the score scale is ``1/sqrt(head_dim)``).

Other architectures with a sliding window have no dense llama layer (Gemma 2/3: post-norms,
``(1 + w)`` norm gains, scaled embeddings, soft-capping; OLMo 2, EXAONE 4: QK-norm and
post-norms; Mellum, AFMoE, Laguna, MiMo 2, Step 3.5: experts; Cohere 2: LayerNorm, parallel
block; Llama 4: chunked, not sliding; Phi-3: its sliding window is disabled in llama.cpp).
``llama`` and ``qwen2`` have no sliding window at all: full causal attention, equal to ours only
while a sequence is at most ``W`` tokens.

RoPE: ``granite_swa`` rotates with llama.cpp's "normal" RoPE (adjacent pairs ``(2i, 2i+1)``),
ours is the rotate-half (NeoX) form (pairs ``(i, i + d/2)``), same frequencies
``theta^(-2i/d)``. As Hugging Face's ``convert_hf_to_gguf.py`` does for Llama, the output rows
of ``Wq`` and ``Wk`` are permuted per head so that the pair ``(i, i + d/2)`` lands on ``(2i,
2i+1)``: scores ``q·k`` are sums over the same pairs, so attention is unchanged (``Wv`` and
``Wo`` are not touched).

Tokenizer: a byte-level BPE (``gpt2``) vocabulary of 257 tokens: token ``b`` is byte ``b``
(written with GPT-2's byte-to-unicode map, as every byte-level BPE vocabulary is), token 256
``<BOS>`` a control token; BOS and EOS are 256 (a generated BOS ends a generation in ``ringkv
serve`` too), ``add_bos_token`` true. No merges apply (the format needs at least one; the one
written joins two multi-character strings that never occur), so text tokenizes byte by byte,
as ours does.

Precision: F32 tensors (the trained weights are float16 values, so F32 holds them exactly; the
norm gains too). llama.cpp computes in float32 (its CPU matrix products convert activations to
F32 or F16 depending on the weight type: F32 weights keep F32), we compute in float64.

Usage: ``python -m bench.gguf_export --shape demo -o build/peer/ringkv-demo.gguf``.
"""

import argparse
from pathlib import Path

import numpy as np

from ringkv.host.model.vocab import byte_chars

__all__ = ["ARCH", "BOS_TEXT", "export", "rope_permutation", "byte_tokens", "SINK"]

ARCH = "granite_swa"
BOS_TEXT = "<BOS>"
#: the attention sinks' logit: exp(SINK - max) is 0 in float32 and float64
SINK = -1e30
#: the context length written (llama.cpp's default context size when none is given; our model
#: has none: its rings hold the last W tokens whatever the position)
CONTEXT_LENGTH = 1 << 16


def byte_tokens() -> list[str]:
    """The 257 token texts: bytes 0..255 as the shipped tokenizer writes them (GPT-2's
    byte-to-unicode map, :func:`ringkv.host.model.vocab.byte_chars`), then ``<BOS>``."""
    return byte_chars() + [BOS_TEXT]


def rope_permutation(head_dim: int) -> np.ndarray:
    """Index ``p`` with ``new[:, p]`` order: new dimension ``2i`` is our ``i`` and ``2i + 1`` is
    our ``i + d/2`` (rotate-half pairs onto llama.cpp's adjacent pairs)."""
    half = head_dim // 2
    return np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)


def _permute_heads(w: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """``w`` (in, heads·d): each head's output columns in :func:`rope_permutation` order."""
    p = rope_permutation(head_dim)
    cols = np.concatenate([h * head_dim + p for h in range(heads)])
    return w[:, cols]


def export(model, path) -> Path:
    """Write ``model`` (:class:`~ringkv.host.model.transformer.Model`) as a GGUF file."""
    import gguf

    from ringkv.host.model.transformer import BOS, VOCAB

    c, w = model.config, model.w
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(f"ringkv-L{c.layers}-Hq{c.q_heads}-Hkv{c.kv_heads}-d{c.head_dim}-W{c.window}")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(model.hidden)
    writer.add_block_count(c.layers)
    writer.add_feed_forward_length(model.ffn)
    writer.add_head_count(c.q_heads)
    writer.add_head_count_kv(c.kv_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(c.window)
    writer.add_sliding_window_pattern([True] * c.layers)
    writer.add_logit_scale(1.0)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(byte_tokens())
    writer.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL])
    # the format wants merges; this one never applies (its halves are never symbols)
    writer.add_token_merges(["<no> <merges>"])
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(BOS)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    def t(name, a):
        writer.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))

    # GGUF shapes are numpy's (out, in): ours are stored (in, out), hence the transposes
    t("token_embd.weight", w["emb"])
    t("output_norm.weight", w["norm"])
    t("output.weight", w["out"].T)
    for i in range(c.layers):
        t(f"blk.{i}.attn_norm.weight", w[f"l{i}.n1"])
        t(f"blk.{i}.attn_q.weight", _permute_heads(w[f"l{i}.wq"], c.q_heads, c.head_dim).T)
        t(f"blk.{i}.attn_k.weight", _permute_heads(w[f"l{i}.wk"], c.kv_heads, c.head_dim).T)
        t(f"blk.{i}.attn_v.weight", w[f"l{i}.wv"].T)
        t(f"blk.{i}.attn_output.weight", w[f"l{i}.wo"].T)
        t(f"blk.{i}.attn_sinks.weight", np.full(c.q_heads, SINK))
        t(f"blk.{i}.ffn_norm.weight", w[f"l{i}.n2"])
        t(f"blk.{i}.ffn_gate.weight", w[f"l{i}.w1"].T)
        t(f"blk.{i}.ffn_up.weight", w[f"l{i}.w3"].T)
        t(f"blk.{i}.ffn_down.weight", w[f"l{i}.w2"].T)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _config(shape: str):
    from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG
    return {"demo": DEMO_CONFIG, "default": DEFAULT_CONFIG}[shape]


def main(argv=None):
    from ringkv.host.model.transformer import Model
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=("demo", "default"), default="demo")
    p.add_argument("-o", "--output", type=Path, required=True)
    args = p.parse_args(argv)
    out = export(Model.trained(_config(args.shape)), args.output)
    print(out)


if __name__ == "__main__":
    main()
