"""Train the host's Mistral-style byte model on the corpus and export it for
``host/model/transformer.py``.

``make train`` (``python tools/train.py``) trains the model of the default device shape
(``RingKVConfig()``: L=4, Hq=4, Hkv=2, d=64, W=128; hidden 256, SwiGLU 512) on the training
split of :mod:`ringkv.host.model.corpus`; ``--shape demo`` trains the small model of the end-to-end
demo's device (``DEMO_CONFIG``: L=2, d=16, W=32; hidden 64, SwiGLU 128).

The network is :class:`ringkv.host.model.Model` written again in torch, convention for
convention: RMSNorm ``x / sqrt(mean(x^2) + 1e-6) * g``; RoPE in the rotate-half form, theta
10000, on q and k; GQA with query head ``h`` on KV head ``h // G``; scale ``1/sqrt(d)``; the
causal sliding window of exactly ``W`` keys including the query's own (``i - W < j <= i``);
SwiGLU ``W2 (silu(W1 n) * W3 n)``; final RMSNorm and an untied output projection; weights as
``(in, out)`` matrices (``x @ W``). Sequences are ``T = 4 W`` tokens (512 for the default), so
that most queries see a full window and none sees further back than ``W``.

Reproducible: a fixed seed for the initialisation and for the batches (random crops of the
training stream ``[BOS] + chapter`` ...), AdamW, warm-up then cosine decay, a fixed number of
steps, torch on ``--threads`` threads (default 2). Progress (loss, held-out loss, tokens/s) is
printed; every ``--ckpt-every`` steps the weights are exported (so an interrupted run still
leaves its last checkpoint) and at the end:

* ``host/model/weights/<name>.npz``: float16 weights and float32 gains, loaded by
  :meth:`ringkv.host.model.Model.load` / :meth:`Model.trained`, with reference logits
  (``ref_tokens``, ``ref_logits``: this torch model's float64 forward of a held-out prefix
  longer than W, its last :data:`REF_ROWS` positions) that the tests reproduce with the numpy
  model, and ``qkv_fracs``, ``ringkv-fx1c``'s per-layer q/k/v scales for these weights
  (:func:`ringkv.host.model.calibrate.calibrate_fracs` on the training split); compressed, under 2
  MB;
* ``docs/train_<name>.png`` (the loss curve, matplotlib from the ``train`` extra) and
  ``docs/train_<name>.json`` (the log: every step's loss, the held-out evaluations, timings).

Before it writes anything, the export is checked: the numpy model, loaded from the exported
file, reproduces this model's logits (float64 torch to 1e-9, float32 torch to 1e-3 relative).
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG
from ringkv.host.model import corpus
from ringkv.host.model.calibrate import calibrate_fracs, write_fracs
from ringkv.host.model.transformer import BOS, VOCAB, Model, weights_path

ROOT = Path(__file__).resolve().parent.parent

SHAPES = {
    "default": dict(config=DEFAULT_CONFIG, hidden=128, ffn=384, seq=512, batch=8, steps=700,
                    lr=3e-3, warmup=30),
    "demo": dict(config=DEMO_CONFIG, hidden=64, ffn=128, seq=128, batch=16, steps=600,
                 lr=4e-3, warmup=40),
}


class Net(torch.nn.Module):
    """The numpy model's architecture in torch (see the module docstring)."""

    def __init__(self, config, hidden, ffn):
        super().__init__()
        self.config, self.hidden, self.ffn = config, hidden, ffn
        self.blocked = True
        c = config
        qd, kd = c.q_heads * c.head_dim, c.kv_heads * c.head_dim
        P = torch.nn.Parameter
        std = 0.02
        proj = std / math.sqrt(2 * c.layers)
        self.p = torch.nn.ParameterDict()
        self.p["emb"] = P(torch.randn(VOCAB, hidden) * std)
        self.p["norm"] = P(torch.ones(hidden))
        self.p["out"] = P(torch.randn(hidden, VOCAB) * std)
        for i in range(c.layers):
            self.p[f"l{i}_n1"] = P(torch.ones(hidden))
            self.p[f"l{i}_n2"] = P(torch.ones(hidden))
            self.p[f"l{i}_wq"] = P(torch.randn(hidden, qd) * std)
            self.p[f"l{i}_wk"] = P(torch.randn(hidden, kd) * std)
            self.p[f"l{i}_wv"] = P(torch.randn(hidden, kd) * std)
            self.p[f"l{i}_wo"] = P(torch.randn(qd, hidden) * proj)
            self.p[f"l{i}_w1"] = P(torch.randn(hidden, ffn) * std)
            self.p[f"l{i}_w3"] = P(torch.randn(hidden, ffn) * std)
            self.p[f"l{i}_w2"] = P(torch.randn(ffn, hidden) * proj)

    @staticmethod
    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g

    def rope_tables(self, T, dtype):
        d = self.config.head_dim
        inv = 10000.0 ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
        return (torch.tensor(np.cos(ang), dtype=dtype), torch.tensor(np.sin(ang), dtype=dtype))

    @staticmethod
    def rope(x, cos, sin):
        # x (B, H, T, D); cos/sin (T, D/2)
        d = x.shape[-1]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def window_attention(self, q, k, v):
        """The same sliding-window attention computed block by block: the queries of block
        ``b`` (W positions) see only the keys of blocks ``b - 1`` and ``b`` (2W), half the
        work of a full T x T masked product. q, k, v (B, H, T, d) with T a multiple of W."""
        W = self.config.window
        B, H, T, d = q.shape
        nb = T // W
        qb = q.view(B, H, nb, W, d)
        kb, vb = k.view(B, H, nb, W, d), v.view(B, H, nb, W, d)
        pad = torch.zeros_like(kb[:, :, :1])
        k2 = torch.cat([torch.cat([pad, kb[:, :, :-1]], 2), kb], 3)      # (B, H, nb, 2W, d)
        v2 = torch.cat([torch.cat([pad, vb[:, :, :-1]], 2), vb], 3)
        r = torch.arange(W)[:, None]
        col = torch.arange(2 * W)[None, :]
        diff = r + W - col                                                 # i - j
        keep = (diff >= 0) & (diff < W)                                    # (W, 2W)
        first = keep & (col >= W)                                          # block 0: no past
        mask = torch.stack([first] + [keep] * (nb - 1))                    # (nb, W, 2W)
        s = (qb @ k2.transpose(-1, -2)) / math.sqrt(d)
        s = s.masked_fill(~mask, float("-inf"))
        o = torch.softmax(s, dim=-1) @ v2                                  # (B, H, nb, W, d)
        return o.reshape(B, H, T, d)

    def window_mask(self, T):
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        return (j <= i) & (i - j < self.config.window)      # W keys including self

    def qkv(self, i, x, cos, sin):
        """q (B, Hq, T, d) and k, v (B, Hkv, T, d) of layer ``i``, RoPE applied."""
        c, p = self.config, self.p
        B, T, _ = x.shape
        n = self.rms(x, p[f"l{i}_n1"])
        q = (n @ p[f"l{i}_wq"]).view(B, T, c.q_heads, c.head_dim).transpose(1, 2)
        k = (n @ p[f"l{i}_wk"]).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        v = (n @ p[f"l{i}_wv"]).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        return self.rope(q, cos, sin), self.rope(k, cos, sin), v

    def forward(self, tokens, collect=None):
        """Logits (B, T, VOCAB) of ``tokens`` (B, T) at positions ``0..T-1``. ``collect``: a
        list that receives each layer's (q, k, v) (for calibration and range checks)."""
        c, p = self.config, self.p
        B, T = tokens.shape
        dtype = p["emb"].dtype
        cos, sin = self.rope_tables(T, dtype)
        mask = self.window_mask(T)
        x = p["emb"][tokens]
        for i in range(c.layers):
            q, k, v = self.qkv(i, x, cos, sin)
            if collect is not None:
                collect.append((q.detach(), k.detach(), v.detach()))
            G = c.group
            # GQA: query head h uses KV head h // G (consecutive query heads share one)
            k = k.repeat_interleave(G, dim=1)
            v = v.repeat_interleave(G, dim=1)
            if self.blocked and T % c.window == 0:
                o = self.window_attention(q, k, v)
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + o.transpose(1, 2).reshape(B, T, -1) @ p[f"l{i}_wo"]
            n = self.rms(x, p[f"l{i}_n2"])
            x = x + (F.silu(n @ p[f"l{i}_w1"]) * (n @ p[f"l{i}_w3"])) @ p[f"l{i}_w2"]
        return self.rms(x, p["norm"]) @ p["out"]

    def export(self) -> dict:
        """Weights under :class:`Model`'s names: matrices float16, gains float32."""
        out = {}
        for name, t in self.p.items():
            a = t.detach().to(torch.float64).numpy()
            gain = name == "norm" or name.endswith(("_n1", "_n2"))
            out[name.replace("_", ".")] = a.astype(np.float32 if gain else np.float16)
        return out

    def load_exported(self, w: dict):
        """Set the parameters to the (rounded) exported values."""
        with torch.no_grad():
            for name, t in self.p.items():
                t.copy_(torch.tensor(np.asarray(w[name.replace("_", ".")], dtype=np.float64)))


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def batches(stream, seq, batch, seed):
    """Endless random crops of ``seq + 1`` tokens of the training stream (fixed seed)."""
    rng = np.random.default_rng(seed)
    data = np.asarray(stream, dtype=np.int64)
    while True:
        starts = rng.integers(0, len(data) - seq - 1, batch)
        yield torch.from_numpy(np.stack([data[s:s + seq + 1] for s in starts]))


def heldout_batches(stream, seq, n):
    """``n`` fixed crops of the held-out stream, evenly spaced."""
    data = np.asarray(stream, dtype=np.int64)
    starts = np.linspace(0, len(data) - seq - 1, n).astype(np.int64)
    return torch.from_numpy(np.stack([data[s:s + seq + 1] for s in starts]))


def loss_of(net, xy):
    logits = net(xy[:, :-1])
    target = xy[:, 1:]
    # the model never has to predict BOS (a document start is given, not generated)
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1),
                           ignore_index=BOS)


def verify_export(net, w, shape, tokens):
    """The numpy model on the exported weights reproduces the torch model: returns
    (float64 max abs diff, float32 max abs diff relative to the logits' scale, ref logits)."""
    ref = Net(net.config, net.hidden, net.ffn).to(torch.float64)
    ref.load_exported(w)
    x = torch.tensor([tokens])
    with torch.no_grad():
        want64 = ref(x)[0].numpy()
        f32 = Net(net.config, net.hidden, net.ffn)
        f32.load_exported(w)
        want32 = f32(x)[0].numpy().astype(np.float64)
    model = Model(net.config, hidden=net.hidden, ffn=net.ffn,
                  weights={k: np.asarray(v, dtype=np.float64) for k, v in w.items()})
    got = model.forward_full(tokens)
    d64 = float(np.max(np.abs(got - want64)))
    d32 = float(np.max(np.abs(got - want32)) / np.max(np.abs(want64)))
    return d64, d32, want64


#: Rows of the reference logits kept in the weights file: the last positions of the
#: reference prefix (all past the window), so the shipped file stays under 2 MB.
REF_ROWS = 32


def save(path, net, w, meta, ref_tokens, ref_logits):
    np.savez_compressed(path, hidden=net.hidden, ffn=net.ffn, meta=json.dumps(meta),
                        ref_tokens=np.asarray(ref_tokens, dtype=np.int16),
                        ref_logits=ref_logits[-REF_ROWS:].astype(np.float32), **w)


def plot(log, png, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        print("matplotlib is missing (pip install -e '.[train]'): no plot", flush=True)
        return
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps = np.arange(len(log["train_loss"]))
    bpb = np.asarray(log["train_loss"]) / math.log(2)
    k = 25
    smooth = np.convolve(bpb, np.ones(k) / k, mode="valid") if len(bpb) > k else bpb
    ax.plot(steps, bpb, color="0.8", lw=0.6, label="train (per step)")
    ax.plot(steps[len(steps) - len(smooth):], smooth, color="C0", lw=1.5,
            label=f"train ({k}-step mean)")
    if log["eval"]:
        es, el = zip(*[(e["step"], e["loss"] / math.log(2)) for e in log["eval"]])
        ax.plot(es, el, "o-", color="C3", ms=3, label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.set_ylim(0, max(4.5, float(np.min(bpb[:5])) if len(bpb) else 4.5))
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def plot_title(name, log):
    return (f"{name}: {log['params'] / 1e6:.2f} M parameters, batch {log['batch']} x "
            f"{log['seq']}\n{log['corpus']}, held out: every 20th chapter")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="default")
    parser.add_argument("--steps", type=int, help="training steps (default: the shape's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--ckpt-every", type=int, default=50)
    parser.add_argument("--out", help="weights file (default host/model/weights/<name>.npz)")
    parser.add_argument("--docs", default=str(ROOT / "docs"), help="where the plot/log go")
    parser.add_argument("--plot-only", action="store_true",
                        help="redraw docs/train_<name>.png from its .json log and exit")
    args = parser.parse_args(argv)

    s = SHAPES[args.shape]
    if args.plot_only:
        name = (Path(args.out) if args.out else weights_path(s["config"])).stem
        log = json.loads((Path(args.docs) / f"train_{name}.json").read_text())
        plot(log, Path(args.docs) / f"train_{name}.png", plot_title(name, log))
        return 0
    config, hidden, ffn, seq, bsz = s["config"], s["hidden"], s["ffn"], s["seq"], s["batch"]
    steps = args.steps or s["steps"]
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out) if args.out else weights_path(config)
    name = out.stem
    docs = Path(args.docs)
    out.parent.mkdir(parents=True, exist_ok=True)
    docs.mkdir(parents=True, exist_ok=True)

    train_docs, held_docs = corpus.split()
    train = corpus.documents_tokens(train_docs, BOS)
    held = corpus.documents_tokens(held_docs, BOS)
    print(f"corpus {corpus.PACKAGE_DIST}=={corpus.PACKAGE_VERSION}: train {len(train)} tokens "
          f"({len(train_docs)} chapters), held out {len(held)} ({len(held_docs)} chapters)",
          flush=True)
    net = Net(config, hidden, ffn)
    nparams = sum(p.numel() for p in net.parameters())
    print(f"model {args.shape}: L={config.layers} Hq={config.q_heads} Hkv={config.kv_heads} "
          f"d={config.head_dim} W={config.window} hidden={hidden} ffn={ffn}: {nparams} "
          f"parameters; batch {bsz} x {seq} tokens, {steps} steps, {args.threads} threads",
          flush=True)
    decay = [p for n, p in net.p.items() if p.ndim == 2]
    other = [p for n, p in net.p.items() if p.ndim != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=s["lr"], betas=(0.9, 0.95), eps=1e-8)
    data = batches(train, seq, bsz, args.seed)
    held_xy = heldout_batches(held, seq, 16)
    ref_tokens = held[:seq // 2 + config.window + 40]          # longer than W
    log = {"shape": args.shape, "params": nparams, "steps": steps, "batch": bsz, "seq": seq,
           "seed": args.seed, "threads": args.threads, "train_loss": [], "eval": [],
           "corpus": f"{corpus.PACKAGE_DIST}=={corpus.PACKAGE_VERSION}"}
    t0 = time.monotonic()

    def evaluate(step):
        net.eval()
        with torch.no_grad():
            loss = float(loss_of(net, held_xy))
        net.train()
        log["eval"].append({"step": step, "loss": loss, "bpb": loss / math.log(2),
                            "elapsed_s": time.monotonic() - t0})
        return loss

    def checkpoint(step, final=False):
        w = net.export()
        d64, d32, ref_logits = verify_export(net, w, args.shape, ref_tokens)
        if d64 > 1e-9 or d32 > 1e-3:
            raise SystemExit(f"export check failed: numpy vs torch float64 {d64:.2e}, "
                             f"float32 {d32:.2e}")
        meta = {"corpus": log["corpus"], "held_out": f"chapter i % {corpus.HELD_OUT_EVERY} "
                f"== {corpus.HELD_OUT_EVERY - 1}", "shape": args.shape, "step": step,
                "steps": steps, "final": final, "seed": args.seed, "seq": seq,
                "batch": bsz, "params": nparams,
                "eval": log["eval"][-1] if log["eval"] else None,
                "config": json.loads(config.canonical()),
                "check": {"float64_max_abs": d64, "float32_max_rel": d32}}
        tmp = out.with_name(out.stem + ".tmp.npz")
        save(tmp, net, w, meta, ref_tokens, ref_logits)
        # ringkv-fx1c's per-layer q/k/v scales for these weights, on the training split
        fracs = calibrate_fracs(Model.load(tmp, config), train_docs)
        write_fracs(tmp, fracs)
        tmp.replace(out)
        log["check"] = meta["check"]
        (docs / f"train_{name}.json").write_text(json.dumps(log) + "\n")
        plot(log, docs / f"train_{name}.png", plot_title(name, log))
        shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
        print(f"  checkpoint step {step}: {shown} (numpy vs torch: float64 {d64:.1e}, "
              f"float32 {d32:.1e} rel)", flush=True)

    evaluate(0)
    for step in range(1, steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1, steps, s["lr"], s["warmup"])
        xy = next(data)
        loss = loss_of(net, xy)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        loss = loss.item()
        log["train_loss"].append(loss)
        if step % 10 == 0 or step == 1:
            el = time.monotonic() - t0
            print(f"step {step:5d}/{steps}  loss {loss:.4f} ({loss / math.log(2):.3f}"
                  f" bpb)  lr {opt.param_groups[0]['lr']:.2e}  {step * bsz * seq / el:,.0f} "
                  f"tok/s  {el:.0f} s", flush=True)
        if step % args.eval_every == 0 or step == steps:
            ev = evaluate(step)
            print(f"  held-out loss {ev:.4f} = {ev / math.log(2):.3f} bpb", flush=True)
        if step % args.ckpt_every == 0 or step == steps:
            log["elapsed_s"] = time.monotonic() - t0
            checkpoint(step, final=step == steps)
    print(f"done in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
