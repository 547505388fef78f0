"""A conversation's worth of random attention inputs for the system tests that drive a device
through :class:`~ringkv.host.device.fpga.FpgaDevice` (``test_recovery_system.py``,
``test_sealed_system.py``). A plain module, not a test module: test modules import it, never
each other."""

import numpy as np

__all__ = ["RandomSession"]


class RandomSession:
    """``n`` tokens and every layer's q/k/v for them, then one decode step's q/k/v, drawn from
    ``seed`` (in that order: the same seed gives the same tokens and prefill inputs whatever
    ``n``'s use)."""

    def __init__(self, config, seed, n):
        rng = np.random.default_rng(seed)
        c = self.config = config
        self.tokens = [int(t) for t in rng.integers(0, 1 << c.token_width, size=n)]
        self.qkv = [tuple(rng.standard_normal((n, h, c.head_dim)) * 2
                          for h in (c.q_heads, c.kv_heads, c.kv_heads))
                    for _ in range(c.layers)]
        self.step = [tuple(rng.standard_normal((h, c.head_dim)) * 2
                           for h in (c.q_heads, c.kv_heads, c.kv_heads))
                     for _ in range(c.layers)]

    def compute(self, dev, n):
        """Token memory and the rings hold the first ``n`` tokens (computed, no reuse)."""
        dev.reset()
        dev.write_tokens(self.tokens[:n])
        for layer, (q, k, v) in enumerate(self.qkv):
            dev.prefill(layer, q[:n], k[:n], v[:n])

    def decode(self, dev):
        """One decode step on every layer: the outputs."""
        return [dev.decode(layer, *qkv) for layer, qkv in enumerate(self.step)]
