"""A small Mistral-style decoder in numpy, with attention behind a pluggable backend.

Architecture (per layer): ``x += Wo · attn(RoPE(Wq·n1(x)), RoPE(Wk·n1(x)), Wv·n1(x))`` then
``x += W2 · (silu(W1·n2(x)) * W3·n2(x))`` with RMSNorm ``n1``/``n2``; GQA (query head ``h`` uses KV
head ``h // G``), sliding-window attention of ``W`` keys (``docs/CONVENTIONS.md#window``), RoPE
applied to q and k before k enters the cache. Byte tokenizer: tokens 0..255 are bytes, 256 is BOS.
Weights come from a fixed seed (scaled so that activations stay O(1) through the layers; q/k/v stay
inside the range of the fixed-point core: -4 .. 4 for ``ringkv-fx1``, -16 .. 16 for ``ringkv-fx2``)
or from an ``.npz`` file (:meth:`Model.save` / :meth:`Model.load`).

The host runs everything but attention; :class:`AttentionBackend` is the seam where the
accelerator plugs in:

* :class:`Float64Backend`: :class:`~ringkv.host.golden.ring.RingKVCache` per layer (float64).
* :class:`FixedBackend`: the bit-exact model of the FPGA core
  (:class:`~ringkv.host.golden.fixed.FixedRingCore`) in the configuration's numerics
  (``ringkv-fx1``: q/k/v quantized to int8; ``ringkv-fx2``: to int16), output dequantized. A
  link backend (the same calls as ``ATTN_DECODE`` / ``ATTN_PREFILL`` requests) implements the
  same protocol.
"""

import copy
import ctypes
import glob
import json
import os
from pathlib import Path
from typing import Protocol

import numpy as np

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.numerics import numerics_of

from ..golden.fixed import (
    FixedRingCore,
    attend_indexed,
    attend_rows,
    dequantize_out,
    quantize,
    ring_sources,
)
from ..golden.ring import RingKVCache
from ..golden.swa import swa_attention

__all__ = ["AttentionBackend", "Float64Backend", "FixedBackend", "Model", "BOS", "VOCAB",
           "encode_text", "decode_text", "show_text", "rms_norm", "rope", "limit_blas_threads",
           "batch_matmul", "ROW_TILE", "RingPool",
           "weights_path", "WEIGHTS_DIR"]

BOS = 256
VOCAB = 257

#: The trained weights shipped with the package (``tools/train.py``, ``make train``).
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
#: Keys of a weights file that are not weights.
_META_KEYS = ("hidden", "ffn", "meta", "ref_tokens", "ref_logits", "qkv_fracs")


def weights_path(config: RingKVConfig = DEFAULT_CONFIG) -> Path:
    """Where the trained weights for ``config``'s model shape live (numerics do not matter:
    the model is the same whatever the attention core's fixed-point format)."""
    c = config
    return WEIGHTS_DIR / (f"kjv-L{c.layers}-Hq{c.q_heads}-Hkv{c.kv_heads}-d{c.head_dim}"
                          f"-W{c.window}.npz")


def limit_blas_threads(n: int = 1) -> bool:
    """Run numpy's bundled OpenBLAS on ``n`` threads (True if it could be set).

    The model's matrices are small (a chunk × 256): BLAS threads only fight each other and the
    simulator for the cores, making each product ~30x slower on a loaded 2-core machine.
    """
    pattern = os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*")
    for path in glob.glob(pattern):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                     "openblas_set_num_threads"):
            if hasattr(lib, name):
                getattr(lib, name)(int(n))
                return True
    return False


limit_blas_threads()


def encode_text(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode_text(tokens) -> str:
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


def show_text(tokens) -> str:
    """Generated tokens as printable text: bytes decoded as UTF-8, newlines kept, other
    control characters, invalid bytes and BOS escaped (``\\x07``, ``\\xff``, ``<BOS>``)."""
    out, run = [], bytearray()

    def flush():
        text = bytes(run).decode("utf-8", errors="backslashreplace")
        out.append("".join(ch if ch.isprintable() or ch in "\n\t" else
                           ch.encode("unicode_escape").decode("ascii") for ch in text))
        run.clear()

    for t in tokens:
        if t < 256:
            run.append(t)
        else:
            flush()
            out.append("<BOS>")
    flush()
    return "".join(out)


def rms_norm(x, gain, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def rope(x, positions, theta=10000.0):
    """Rotary embedding (rotate-half form) of ``x`` (C, H, D) at ``positions`` (C,)."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]      # (C, D/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


#: Rows per matrix product (:func:`batch_matmul`).
ROW_TILE = 16


def batch_matmul(x, w):
    """``x @ w`` with every row's result independent of the other rows of ``x``.

    A BLAS matrix product does not promise that: OpenBLAS picks its kernels and blocking by the
    number of rows (one row goes to ``gemv``, and the rounding of a row differs between
    ``gemm`` calls of 2, 17 or 200 rows by a few units in the last place), so a request's
    logits would depend on which other requests shared its batch, and a greedy token or a
    quantized K/V word could flip. Here every product is made of ``ROW_TILE``-row ``gemm``
    calls (one batched ``matmul`` over the tiles, the last one padded with zeros): each row is
    computed by the same call shape whatever its neighbours, so a request's tokens are the same
    alone or in any batch (``tests/host/model/test_model_batch.py`` checks this property of the
    installed BLAS: row results independent of their tile position and of the other rows).
    Costs about 1.4x one ``gemm`` over the whole batch at 256 rows, nothing at 16.

    ``w``'s columns are padded with zeros to a multiple of ``COL_TILE`` (a padded copy kept
    per weight matrix) and the result cut back: OpenBLAS's AVX-512 ``dgemm`` kernel
    (``SkylakeX``, which it picks on AVX-512 machines such as this project's AMD EPYC ones)
    rounds the last column of an odd width (the 257-token output head) differently for rows
    12 to 15 of a 16-row call than for rows 0 to 11, so a row's result depended on its
    place in the tile; in full column blocks it does not (found by the test below on such a
    machine: 88 of 150 random cases at 256 x 257, 30 seeds of 1 to 40 rows; 0 padded, with
    the ``Haswell``, ``Zen`` and ``SkylakeX`` kernels).
    """
    w = _col_padded(w)
    x = np.asarray(x, dtype=np.float64)
    n, k = x.shape
    tiles = -(-n // ROW_TILE)
    if tiles * ROW_TILE != n:
        x = np.concatenate([x, np.zeros((tiles * ROW_TILE - n, k))])
    out = np.matmul(x.reshape(tiles, ROW_TILE, k), w.padded).reshape(tiles * ROW_TILE, -1)
    return out[:n, :w.columns]


#: ``batch_matmul`` pads a weight matrix's columns to a multiple of this.
COL_TILE = 16
_PADDED: dict = {}


class _Padded:
    __slots__ = ("original", "padded", "columns")

    def __init__(self, w):
        self.original, self.columns = w, w.shape[1]
        pad = -self.columns % COL_TILE
        w64 = np.asarray(w, dtype=np.float64)
        self.padded = np.concatenate([w64, np.zeros((w.shape[0], pad))], axis=1) if pad \
            else w64


def _col_padded(w) -> _Padded:
    """``w`` with its columns padded (``batch_matmul``), kept per matrix: the entry holds
    ``w`` itself, so its ``id`` cannot be reused while it is cached; at most 256 entries
    (a model's weight matrices; the oldest dropped first)."""
    entry = _PADDED.get(id(w))
    if entry is None or entry.original is not w:
        entry = _Padded(w)
        if len(_PADDED) >= 256:
            _PADDED.pop(next(iter(_PADDED)))
        _PADDED[id(w)] = entry
    return entry


class AttentionBackend(Protocol):
    """Per-layer sliding-window attention with the ring-buffer KV cache (the accelerator).

    ``decode(layer, q (Hq,d), k (Hkv,d), v (Hkv,d)) -> (Hq,d)`` writes the token's K/V first,
    then attends. ``prefill(layer, q (C,Hq,d), k (C,Hkv,d), v (C,Hkv,d)) -> (C,Hq,d)`` is a
    chunk. ``reset()`` empties every ring; ``snapshot()`` / ``restore(s)`` copy the whole state
    (export/import); ``n`` is the number of tokens seen by layer 0.
    """

    n: int

    def decode(self, layer: int, q, k, v): ...
    def prefill(self, layer: int, q, k, v): ...
    def reset(self) -> None: ...
    def snapshot(self): ...
    def restore(self, snapshot) -> None: ...


class Float64Backend:
    """Float64 rings (:class:`RingKVCache`, slot rule ``p % W`` like the hardware)."""

    def __init__(self, config: RingKVConfig = DEFAULT_CONFIG):
        self.config = config
        self.reset()

    def reset(self):
        c = self.config
        self.layers = [RingKVCache(c.window, c.kv_heads, c.head_dim, rule="mod")
                       for _ in range(c.layers)]

    @property
    def n(self) -> int:
        return self.layers[0].n

    def decode(self, layer, q, k, v):
        return self.layers[layer].decode_step(q, k, v)

    def prefill(self, layer, q, k, v):
        return self.layers[layer].chunked_prefill(q, k, v)

    def snapshot(self):
        return copy.deepcopy(self.layers)

    def restore(self, snapshot):
        self.layers = copy.deepcopy(snapshot)


class FixedBackend:
    """The FPGA core's bit-exact model in ``config.numerics``: ``ringkv-fx1`` int8 q/k/v
    (scale 2**-5), int16 output (2**-13); ``ringkv-fx2`` int16 q/k/v and output (2**-11);
    ``ringkv-fx1c`` int8 q/k/v with layer ``l``'s scales ``config.qkv_fracs[l]``, output
    2**-(Fv + 8)."""

    def __init__(self, config: RingKVConfig = DEFAULT_CONFIG, lanes: int = 4, *,
                 pool: "RingPool | None" = None, slot: int | None = None):
        self.config = config
        self.numerics = numerics_of(config.numerics)
        self.fracs = self.numerics.layer_fracs(config.layers, config.qkv_fracs)
        self.lanes = lanes
        if (pool is None) != (slot is None):
            raise ValueError("a pooled backend needs both its pool and its slot")
        self.pool, self.slot = pool, slot
        self.reset()

    def reset(self):
        c = self.config
        self.core = FixedRingCore.for_config(c, self.lanes)
        if self.pool is not None:
            # the core's state is the pool's slot (views): a batch of decode steps over many
            # backends of one pool reads and writes every ring in a few array operations
            core, pool, i = self.core, self.pool, self.slot
            pool.rings[i] = 0
            pool.count[i] = 0
            pool.head[i] = c.window - 1
            core.rings, core.count, core.head = pool.rings[i], pool.count[i], pool.head[i]

    @property
    def n(self) -> int:
        return int(self.core.count[0])

    def _rows(self, layer, q, k, v):
        """Write a chunk's K/V into the rings of ``layer`` and return what its queries attend,
        one ring per KV head: ``(sources k, sources v, index, valid, q, finish)`` for
        :func:`attend_indexed` (sources ``(Hkv, W + C, d)``: the ring before the chunk, then
        the chunk) and ``finish(outputs (Hkv, C, G, d)) -> (C, Hq, d)``, the dequantized
        output."""
        c, nx, core = self.config, self.numerics, self.core
        g, w, hk = c.group, c.window, c.kv_heads
        fr = self.fracs[layer]
        qi, ki, vi = (quantize(np.asarray(x), nx, f) for x, f in zip((q, k, v), fr))
        n = len(ki)
        ksrc = np.concatenate([core.rings[layer, :, 0], ki.transpose(1, 0, 2)], axis=1)
        vsrc = np.concatenate([core.rings[layer, :, 1], vi.transpose(1, 0, 2)], axis=1)
        index = np.empty((hk, n, w), dtype=np.int64)
        valid = np.empty((hk, n), dtype=np.int64)
        for h in range(hk):
            ring = layer * hk + h
            index[h], valid[h], core.count[ring], core.head[ring] = ring_sources(
                core.count[ring], core.head[ring], n, w)
            core.rings[layer, h, 0] = ksrc[h, index[h, -1]]
            core.rings[layer, h, 1] = vsrc[h, index[h, -1]]
        qs = qi.reshape(n, hk, g, c.head_dim).transpose(1, 0, 2, 3)

        def finish(o):
            return dequantize_out(o.transpose(1, 0, 2, 3).reshape(n, c.q_heads, c.head_dim),
                                  nx, fr[2])
        return ksrc, vsrc, index, valid, qs, finish

    def prefill(self, layer, q, k, v):
        """A chunk (C tokens) of ``layer``: each token's K/V written, then its queries attend
        the ring (:meth:`FixedRingCore.attend`'s result, integer for integer, computed for the
        whole chunk and every KV head at once by :func:`attend_indexed`)."""
        ksrc, vsrc, index, valid, qs, finish = self._rows(layer, q, k, v)
        return finish(attend_indexed(ksrc, vsrc, index, valid, qs,
                                     self.core.cs_layers[layer], self.lanes, self.numerics))

    @staticmethod
    def _decode_pooled(layer, items):
        """Decode steps (one token each) of backends of one pool, as one array program:
        each backend's K/V written into its slot, every ring gathered, :func:`attend_rows`
        once. Equal to each backend's own :meth:`prefill` of its token."""
        first = items[0][0]
        pool, c, nx = first.pool, first.config, first.numerics
        g, w, hk = c.group, c.window, c.kv_heads
        fr = first.fracs[layer]
        slots = np.array([b.slot for b, *_ in items])
        qi, ki, vi = (quantize(np.concatenate([np.asarray(it[j]).reshape(1, -1, c.head_dim)
                                               for it in items]), nx, f)
                      for j, f in zip((1, 2, 3), fr))               # (B, H, d)
        rings = slice(layer * hk, (layer + 1) * hk)
        count, head = pool.count[slots, rings], pool.head[slots, rings]     # (B, Hkv)
        head = (head + 1) % w
        count = (count + 1) & 0xFFFFFFFF
        pool.head[slots, rings], pool.count[slots, rings] = head, count
        heads = np.arange(hk)[None, :]
        pool.rings[slots[:, None], layer, heads, 0, head] = ki
        pool.rings[slots[:, None], layer, heads, 1, head] = vi
        kv = pool.rings[slots, layer, :, 0].reshape(-1, w, c.head_dim)
        vv = pool.rings[slots, layer, :, 1].reshape(-1, w, c.head_dim)
        o = attend_rows(kv, vv, np.minimum(count, w).reshape(-1),
                        qi.reshape(-1, g, c.head_dim), first.core.cs_layers[layer],
                        first.lanes, nx)
        out = dequantize_out(o.reshape(len(items), 1, c.q_heads, c.head_dim), nx, fr[2])
        return list(out)

    @staticmethod
    def attend_many(layer, items):
        """:meth:`prefill` of several backends' chunks in one batch (``items``: ``(backend, q,
        k, v)``, each its own rings): one :func:`attend_rows` over every row of every backend
        of the same core shape, numerics and score constant. Returns the outputs in order,
        each equal to that backend's own :meth:`prefill`."""
        outs = [None] * len(items)
        pools: dict = {}
        for i, (b, q, *_rest) in enumerate(items):
            if b.pool is not None and len(q) == 1:
                pools.setdefault(id(b.pool), []).append(i)
        pooled = set()
        for members in pools.values():
            if len(members) > 1:
                for i, o in zip(members, FixedBackend._decode_pooled(
                        layer, [items[i] for i in members])):
                    outs[i] = o
                pooled.update(members)
        rest = [i for i in range(len(items)) if i not in pooled]
        plans = {i: items[i][0]._rows(layer, *items[i][1:]) for i in rest}
        groups: dict = {}
        for i in rest:
            b = items[i][0]
            key = (b.lanes, b.numerics.name, int(b.core.cs_layers[layer]), b.config.window,
                   b.config.head_dim, b.config.group)
            groups.setdefault(key, []).append(i)
        for (lanes, numerics, cs, window, dim, group), members in groups.items():
            # one product for all: sources and queries padded to the longest chunk (a padded
            # query attends slot 0 of its ring and is dropped)
            n_src = max(plans[i][0].shape[1] for i in members)
            n_q = max(plans[i][2].shape[1] for i in members)
            rings = sum(plans[i][0].shape[0] for i in members)
            ksrc = np.zeros((rings, n_src, dim), dtype=np.int64)
            vsrc = np.zeros((rings, n_src, dim), dtype=np.int64)
            index = np.broadcast_to(np.arange(window), (rings, n_q, window)).copy()
            valid = np.ones((rings, n_q), dtype=np.int64)
            qs = np.zeros((rings, n_q, group, dim), dtype=np.int64)
            at = 0
            for i in members:
                ks, vs, ix, va, qq, _ = plans[i]
                h, s_, t = ks.shape[0], ks.shape[1], ix.shape[1]
                ksrc[at:at + h, :s_], vsrc[at:at + h, :s_] = ks, vs
                index[at:at + h, :t], valid[at:at + h, :t], qs[at:at + h, :t] = ix, va, qq
                at += h
            o = attend_indexed(ksrc, vsrc, index, valid, qs, cs, lanes, numerics)
            at = 0
            for i in members:
                h, t = plans[i][0].shape[0], plans[i][2].shape[1]
                outs[i] = plans[i][5](o[at:at + h, :t])
                at += h
        return outs

    def decode(self, layer, q, k, v):
        return self.prefill(layer, np.asarray(q)[None], np.asarray(k)[None],
                            np.asarray(v)[None])[0]

    def snapshot(self):
        return (self.core.rings.copy(), self.core.count.copy(), self.core.head.copy())

    def restore(self, snapshot):
        rings, count, head = snapshot
        self.core.rings[...] = rings
        self.core.count[...] = count
        self.core.head[...] = head


class RingPool:
    """The rings of many conversations in one array: the hot tier of a software device.

    ``slots`` conversations, each the attention core's whole state (rings ``[layer, kv_head,
    K/V, slot, dim]`` in the core's element width: int8 for ``ringkv-fx1``/``fx1c``, int16
    for ``ringkv-fx2``, as in block RAM and on the card; ``count`` and ``head`` per ring).
    :meth:`backend` gives slot ``i`` as a :class:`FixedBackend` whose core lives in the pool,
    so that a batch of decode steps over many conversations is a handful of array operations
    (:meth:`FixedBackend.attend_many`). :func:`slots_for_bytes` sizes a pool by its bytes.
    """

    def __init__(self, config: RingKVConfig, slots: int, lanes: int = 4):
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"a ring pool needs at least one slot, not {slots!r}")
        c, nx = config, numerics_of(config.numerics)
        self.config, self.slots, self.lanes = config, slots, lanes
        dtype = np.int8 if nx.elem_bits == 8 else np.int16
        self.rings = np.zeros((slots, c.layers, c.kv_heads, 2, c.window, c.head_dim), dtype)
        self.count = np.zeros((slots, c.layers * c.kv_heads), dtype=np.int64)
        self.head = np.full((slots, c.layers * c.kv_heads), c.window - 1, dtype=np.int64)

    @staticmethod
    def slot_bytes(config: RingKVConfig) -> int:
        """Bytes of one slot: the K/V rings in the element width and their metadata."""
        c = config
        return (c.layers * c.kv_heads * 2 * c.window * c.head_dim
                * numerics_of(c.numerics).elem_bytes + 16 * c.layers * c.kv_heads)

    @classmethod
    def slots_for_bytes(cls, config: RingKVConfig, budget: int) -> int:
        """How many slots fit in ``budget`` bytes (at least one)."""
        return max(1, int(budget) // cls.slot_bytes(config))

    @property
    def nbytes(self) -> int:
        return self.rings.nbytes + self.count.nbytes + self.head.nbytes

    def backend(self, slot: int) -> FixedBackend:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot!r} is not one of the pool's {self.slots}")
        return FixedBackend(self.config, self.lanes, pool=self, slot=slot)


class Model:
    """The decoder. ``forward(tokens, pos, backend)`` runs a chunk at positions ``pos..``."""

    def __init__(self, config: RingKVConfig = DEFAULT_CONFIG, *, hidden: int = 256,
                 ffn: int = 512, seed: int = 0, weights: dict | None = None):
        if hidden <= 0 or ffn <= 0:
            raise ValueError(f"hidden and ffn must be positive, not {hidden!r}, {ffn!r}")
        self.config, self.hidden, self.ffn = config, hidden, ffn
        self.w = weights if weights is not None else self._init(seed)
        self.meta: dict = {}
        #: per-layer ``(Fq, Fk, Fv)`` for ``ringkv-fx1c`` stored with trained weights
        #: (:mod:`ringkv.host.model.calibrate`); ``None`` when the weights carry none
        self.qkv_fracs: tuple | None = None

    def _init(self, seed):
        c, h, f = self.config, self.hidden, self.ffn
        rng = np.random.default_rng(seed)
        qd, kd = c.q_heads * c.head_dim, c.kv_heads * c.head_dim

        def mat(n_in, n_out, gain=1.0):
            return rng.standard_normal((n_in, n_out)) * gain / np.sqrt(n_in)

        w = {"emb": rng.standard_normal((VOCAB, h)), "norm": np.ones(h), "out": mat(h, VOCAB, 3.0)}
        for i in range(c.layers):
            w[f"l{i}.n1"] = np.ones(h)
            w[f"l{i}.n2"] = np.ones(h)
            w[f"l{i}.wq"] = mat(h, qd, 0.8)
            w[f"l{i}.wk"] = mat(h, kd, 0.8)
            w[f"l{i}.wv"] = mat(h, kd, 0.8)
            w[f"l{i}.wo"] = mat(qd, h, 0.5)
            w[f"l{i}.w1"] = mat(h, f)
            w[f"l{i}.w3"] = mat(h, f)
            w[f"l{i}.w2"] = mat(f, h, 0.5)
        return w

    def save(self, path):
        np.savez(path, hidden=self.hidden, ffn=self.ffn, **self.w)

    @classmethod
    def load(cls, path, config: RingKVConfig = DEFAULT_CONFIG) -> "Model":
        """Weights from an ``.npz`` (:meth:`save`, or ``tools/train.py``'s export: float16
        matrices, computed in float64 here). ``model.meta`` holds the training metadata of an
        exported file (``{}`` otherwise)."""
        with np.load(Path(path)) as z:
            w = {k: np.asarray(z[k], dtype=np.float64) for k in z.files if k not in _META_KEYS}
            model = cls(config, hidden=int(z["hidden"]), ffn=int(z["ffn"]), weights=w)
            model.meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
            if "qkv_fracs" in z.files:
                model.qkv_fracs = tuple(tuple(int(f) for f in t) for t in z["qkv_fracs"])
        shapes = {"wq": (model.hidden, config.q_heads * config.head_dim),
                  "wk": (model.hidden, config.kv_heads * config.head_dim)}
        for name, shape in shapes.items():
            if (w["l0." + name].shape != shape or f"l{config.layers - 1}.wq" not in w
                    or f"l{config.layers}.wq" in w):
                raise ValueError(f"{path}: weights of another model shape than {config}")
        return model

    @classmethod
    def trained(cls, config: RingKVConfig = DEFAULT_CONFIG) -> "Model":
        """The trained model shipped for ``config``'s shape (:func:`weights_path`); a clear
        error when there is none (train one with ``tools/train.py``)."""
        path = weights_path(config)
        if not path.exists():
            raise FileNotFoundError(f"no trained weights for this model shape ({path.name}); "
                                    f"make train, or use the random model (--random)")
        return cls.load(path, config)

    def _qkv(self, i, x, positions):
        c = self.config
        n = rms_norm(x, self.w[f"l{i}.n1"])
        q = batch_matmul(n, self.w[f"l{i}.wq"]).reshape(-1, c.q_heads, c.head_dim)
        k = batch_matmul(n, self.w[f"l{i}.wk"]).reshape(-1, c.kv_heads, c.head_dim)
        v = batch_matmul(n, self.w[f"l{i}.wv"]).reshape(-1, c.kv_heads, c.head_dim)
        return rope(q, positions), rope(k, positions), v

    def _rest(self, i, x, o):
        x = x + batch_matmul(o.reshape(len(x), -1), self.w[f"l{i}.wo"])
        n = rms_norm(x, self.w[f"l{i}.n2"])
        a = batch_matmul(n, self.w[f"l{i}.w1"])
        return x + batch_matmul((a / (1 + np.exp(-a))) * batch_matmul(n, self.w[f"l{i}.w3"]),
                                self.w[f"l{i}.w2"])

    def _logits(self, x):
        return batch_matmul(rms_norm(x, self.w["norm"]), self.w["out"])

    def forward(self, tokens, pos: int, backend: AttentionBackend):
        """Logits (C, VOCAB) of a chunk of tokens at positions ``pos..pos+C-1``; the backend
        must already hold positions ``0..pos-1``. A chunk of one uses ``decode``."""
        return self.forward_batch([(tokens, pos, backend)], all_logits=[True])[0]

    def forward_batch(self, items, all_logits=None):
        """One step over many sequences: ``items`` = ``[(tokens, pos, backend), ...]``, each a
        chunk of its own sequence on its own backend (a decode step is a chunk of one).

        The matrix products run once over every row of the batch (:func:`batch_matmul`: a
        row's result does not depend on the others); attention runs per sequence on its own
        rings, all :class:`FixedBackend` chunks of a layer in one vectorized call
        (:meth:`FixedBackend.attend_many`). Returns per item the logits of its last token
        (VOCAB,), or of every token (C, VOCAB) where ``all_logits[i]``; each equal, bit for
        bit, to :meth:`forward` of that item alone."""
        if not items:
            return []
        all_logits = all_logits or [False] * len(items)
        sizes = [len(t) for t, _, _ in items]
        if min(sizes) < 1:
            raise ValueError("every sequence of a step needs at least one token")
        tokens = np.concatenate([np.asarray(t, dtype=np.int64) for t, _, _ in items])
        positions = np.concatenate([np.arange(p, p + n) for (_, p, _), n in zip(items, sizes)])
        cuts = np.cumsum(sizes)[:-1]
        x = self.w["emb"][tokens]
        fixed = all(type(b) is FixedBackend for _, _, b in items) and len(items) > 1
        for i in range(self.config.layers):
            q, k, v = self._qkv(i, x, positions)
            qs, ks, vs = (np.split(a, cuts) for a in (q, k, v))
            if fixed:
                outs = FixedBackend.attend_many(i, [(b, qq, kk, vv) for (_, _, b), qq, kk, vv
                                                    in zip(items, qs, ks, vs)])
            else:
                outs = [b.decode(i, qq[0], kk[0], vv[0])[None] if len(qq) == 1
                        else b.prefill(i, qq, kk, vv)
                        for (_, _, b), qq, kk, vv in zip(items, qs, ks, vs)]
            x = self._rest(i, x, np.concatenate(outs))
        ends = np.cumsum(sizes)
        rows = [np.arange(e - n, e) if full else np.array([e - 1])
                for e, n, full in zip(ends, sizes, all_logits)]
        logits = self._logits(x[np.concatenate(rows)])
        out, at = [], 0
        for r, full in zip(rows, all_logits):
            out.append(logits[at:at + len(r)] if full else logits[at])
            at += len(r)
        return out

    def prefill(self, tokens, pos: int, backend, chunk: int = 64):
        """Chunked prefill of ``tokens`` at ``pos..``; returns the last position's logits."""
        if chunk <= 0:
            raise ValueError(f"chunk must be positive, not {chunk!r}")
        logits = None
        for s in range(0, len(tokens), chunk):
            part = tokens[s:s + chunk]
            logits = self.forward(part, pos + s, backend)[-1]
        return logits

    def forward_full(self, tokens):
        """Reference: all logits of ``tokens`` at positions ``0..``, attention recomputed over
        the whole sequence with :func:`~ringkv.host.golden.swa.swa_attention` (no cache)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = np.arange(len(tokens))
        x = self.w["emb"][tokens]
        for i in range(self.config.layers):
            q, k, v = self._qkv(i, x, positions)
            o = swa_attention(q, k, v, window=self.config.window, causal=True)
            x = self._rest(i, x, o)
        return self._logits(x)

    def generate(self, tokens, pos: int, backend, n_new: int, chunk: int = 64):
        """Greedy: prefill ``tokens`` at ``pos``, then ``n_new`` tokens. The last generated token
        is returned but not fed (its K/V are not in the cache): the caller feeds it next turn.
        """
        logits = self.prefill(tokens, pos, backend, chunk)
        pos += len(tokens)
        out = []
        for step in range(n_new):
            token = int(np.argmax(logits))
            out.append(token)
            if step + 1 < n_new:
                logits = self.forward([token], pos, backend)[0]
                pos += 1
        return out
