"""Calibration of the per-layer power-of-two q/k/v scales of ``ringkv-fx1c``.

``ringkv-fx1c`` keeps K/V int8 (so the rings, records and link bytes of ``ringkv-fx1``) but gives
every layer its own fraction bits for q, k and v (``RingKVConfig.qkv_fracs``, see
:mod:`ringkv.defs.numerics`). This module chooses them from the activations of a trained model on
**training** text, never on the held-out split the accuracy is measured on:

* text: ``CAL_SESSIONS`` sessions of ``CAL_TOKENS`` tokens, ``[BOS]`` + the start of training
  chapters spread evenly over the training split (:func:`sessions`; fixed, no seed);
* the float64 model runs each as chunked prefill (chunks of ``CAL_CHUNK``) and every q, k and v
  element entering attention is recorded, per layer and kind;
* per layer and kind, the fraction is the largest ``F`` in ``0 .. FRAC_MAX`` whose int8 range
  ``|x| <= 127 * 2**-F`` clips at most ``CLIP_SHARE`` of those elements (the range covers the
  activations' bulk and leaves the rare outliers to saturate; a finer step for a kind whose
  values are small: v of the first layer gets 2**-6);
* then, if the layer's score constant would not fit the core
  (:func:`~ringkv.defs.numerics.layer_score_consts`), the coarser of ``Fq``, ``Fk`` is refined
  (or, for a constant below 1, the finer coarsened) until it does.

The result is deterministic: the same weights give the same fractions. ``tools/train.py`` stores
them in the weights file it exports (``qkv_fracs``, an ``(L, 3)`` array), ``python -m
ringkv.host.model.calibrate FILE --write`` adds them to an existing file, and
:attr:`Model.qkv_fracs <ringkv.host.model.Model>` reads them back;
:func:`calibrated_config` is the device configuration that carries them.
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG, RingKVConfig
from ringkv.defs.numerics import CS_MAX, FRAC_MAX, FX1C, score_const

from .transformer import BOS, Float64Backend, Model, weights_path

__all__ = ["CAL_SESSIONS", "CAL_TOKENS", "CAL_CHUNK", "CLIP_SHARE", "sessions", "activations",
           "choose_fracs", "calibrate_fracs", "calibrated_config", "write_fracs", "main"]

CAL_SESSIONS = 4        # training chapters
CAL_TOKENS = 1024       # tokens of each (8 W at the default shape)
CAL_CHUNK = 64          # the scheduler's prefill chunk
CLIP_SHARE = 1e-4       # at most this share of a layer's q (k, v) elements saturates


def sessions(docs, n: int, tokens: int) -> list[list[int]]:
    """``n`` sessions: ``[BOS]`` + the first ``tokens - 1`` bytes of chapters spread evenly over
    ``docs`` (only chapters long enough count)."""
    long = [d for d in docs if len(d.encode()) >= tokens]
    if not long:
        raise ValueError(f"no document has {tokens} bytes")
    picks = [long[round(i * (len(long) - 1) / max(1, n - 1))] for i in range(n)]
    return [[BOS] + list(d.encode()[:tokens - 1]) for d in picks]


def activations(model: Model, texts, chunk: int = CAL_CHUNK):
    """``|q|``, ``|k|``, ``|v|`` per layer (a list of three 1-D arrays per layer) of the float64
    model on ``texts`` (token lists, each a session run as chunked prefill)."""
    layers = model.config.layers
    seen = [[[], [], []] for _ in range(layers)]

    class Recording(Float64Backend):
        def prefill(self, layer, q, k, v):
            for j, x in enumerate((q, k, v)):
                seen[layer][j].append(np.abs(np.ravel(x)))
            return super().prefill(layer, q, k, v)

        def decode(self, layer, q, k, v):
            return self.prefill(layer, *(np.asarray(x)[None] for x in (q, k, v)))[0]

    for toks in texts:
        model.prefill(toks, 0, Recording(model.config), chunk)
    return [[np.concatenate(kind) for kind in layer] for layer in seen]


def choose_fracs(acts, head_dim: int, clip_share: float = CLIP_SHARE) -> tuple:
    """The fractions (see the module docstring) for recorded activations ``acts``."""
    out = []
    for layer in acts:
        fr = []
        for a in layer:
            f = FRAC_MAX
            while f > 0 and np.mean(a * 2.0 ** f > 127) > clip_share:
                f -= 1
            fr.append(f)
        out.append(fr)
    for layer, fr in enumerate(out):
        # the layer's score constant must fit the core: too large (q/k too coarse), refine the
        # coarser of q, k; too small (too fine), coarsen the finer (ties: q)
        while True:
            cs = score_const(head_dim, None, 2 * FX1C.qkv_frac - fr[0] - fr[1])
            if cs > CS_MAX:
                fr[0 if fr[0] <= fr[1] else 1] += 1
            elif cs < 1:
                fr[0 if fr[0] >= fr[1] else 1] -= 1
            else:
                break
        out[layer] = tuple(fr)
    return tuple(out)


def calibrate_fracs(model: Model, train_docs=None, n: int = CAL_SESSIONS,
                    tokens: int = CAL_TOKENS, clip_share: float = CLIP_SHARE) -> tuple:
    """Per-layer ``(Fq, Fk, Fv)`` of ``model`` from ``n`` sessions of the training split
    (``train_docs``; default: :func:`ringkv.host.model.corpus.split`'s, which needs the corpus
    package)."""
    if train_docs is None:
        from . import corpus
        train_docs, _ = corpus.split()
    acts = activations(model, sessions(train_docs, n, tokens))
    return choose_fracs(acts, model.config.head_dim, clip_share)


def calibrated_config(config: RingKVConfig, fracs) -> RingKVConfig:
    """``config``'s shape with ``ringkv-fx1c`` and ``fracs``."""
    return dataclasses.replace(config, numerics=FX1C.name,
                               qkv_fracs=tuple(tuple(int(f) for f in t) for t in fracs))


def write_fracs(path, fracs) -> None:
    """Store ``fracs`` in the weights file ``path`` as ``qkv_fracs`` (an ``(L, 3)`` int8 array);
    every other array is kept as it is (compressed, like ``tools/train.py`` writes it)."""
    path = Path(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["qkv_fracs"] = np.array(fracs, dtype=np.int8)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


def main(argv=None) -> int:
    """``python -m ringkv.host.model.calibrate [--config default|demo] [FILE] [--write]``."""
    p = argparse.ArgumentParser(prog="python -m ringkv.host.model.calibrate",
                                description="choose ringkv-fx1c's per-layer q/k/v scales for "
                                            "a trained model (training split)")
    p.add_argument("weights", nargs="?", help="weights file (default: the shipped one)")
    p.add_argument("--config", choices=["default", "demo"], default="default")
    p.add_argument("--write", action="store_true", help="store them in the weights file")
    args = p.parse_args(argv)
    config = {"default": DEFAULT_CONFIG, "demo": DEMO_CONFIG}[args.config]
    path = Path(args.weights) if args.weights else weights_path(config)
    model = Model.load(path, config)
    fracs = calibrate_fracs(model)
    print(f"{path.name}: qkv_fracs (Fq, Fk, Fv) per layer = {fracs}")
    if args.write:
        write_fracs(path, fracs)
        print(f"written to {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
