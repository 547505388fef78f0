"""Float64 reference of the ring-buffer KV cache of one decoder layer.

The cache holds ``W`` slots of K and ``W`` slots of V for each of the layer's ``Hkv`` KV heads
(``k_slots``/``v_slots``, shape ``(W, Hkv, D)``), so it never grows. Conventions:
``docs/CONVENTIONS.md`` (``#ring-buffer``, ``#slots``, ``#chunked-prefill``):

* Tokens have absolute positions ``0, 1, 2, ...``; ``n`` counts the tokens seen so far, so the
  next token is at position ``n``. ``slot_pos[s]`` is the absolute position stored in slot ``s``
  (``-1``: empty) and ``head`` the slot of the newest token (``-1`` while empty).
* **Slot rules.**

  - ``"packed"``: a prefill of ``k`` tokens into the empty cache puts them in slots
    ``0..k-1`` if ``k <= W``, else the last ``W`` tokens in slots ``0..W-1`` in order; each
    decoded token goes to ``(last + 1) % W`` where ``last`` (= ``head``) is the slot written most
    recently. Chunked prefill uses the same rule token by token: the chunk's cached tokens take
    ``head + 1, head + 2, ...`` (mod W).
  - ``"mod"`` (Mixtral's): the token at position ``p`` goes to slot ``p % W``.

  The two rules fill different slots but hold the same set of tokens, so every attention output
  is the same; the hardware implements one and the snapshot stores ``head`` so either resumes.
* **Decode** (:meth:`RingKVCache.decode_step`) writes the new token's K/V first and then attends
  all ``min(n + 1, W)`` valid slots **in slot order** (no unrotate: the softmax sum does not
  depend on order). With the window ``W`` equal to the ring size every valid slot is inside the
  window; the positions kept per slot make the mask exact anyway.
* **Chunked prefill** (:meth:`RingKVCache.chunked_prefill`): a chunk of ``C`` queries attends
  ``[valid cache slots (slot order) | chunk]`` under the window, then only the chunk's last
  ``min(C, W)`` tokens enter the cache (in position order, by the slot rule). ``C < W``,
  ``C == W`` and ``C > W`` all work: keys of the cache that the window excludes are masked by
  position, and chunk tokens older than the last ``W`` never reach the ring.
* Attention follows :mod:`ringkv.host.golden.swa` (GQA ``h // G``, scale ``1/sqrt(D)``).
"""

import numpy as np

from .swa import split_kv_decode, swa_attention

__all__ = ["RingKVCache", "SLOT_RULES"]

SLOT_RULES = ("packed", "mod")


class RingKVCache:
    """Ring-buffer K/V cache of one layer: ``W`` slots per KV head, float64.

    Parameters: ``W`` ring size (= sliding window), ``Hkv`` KV heads, ``D`` head dim, ``rule``
    one of :data:`SLOT_RULES`.
    """

    def __init__(self, W, Hkv, D, rule="packed"):
        for name, val in (("W", W), ("Hkv", Hkv), ("D", D)):
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
                raise ValueError(f"{name} must be a positive integer, not {val!r}")
        if rule not in SLOT_RULES:
            raise ValueError(f"rule must be one of {SLOT_RULES}, not {rule!r}")
        self.W, self.Hkv, self.D, self.rule = int(W), int(Hkv), int(D), rule
        self.k_slots = np.zeros((self.W, self.Hkv, self.D))
        self.v_slots = np.zeros((self.W, self.Hkv, self.D))
        self.slot_pos = np.full(self.W, -1, dtype=np.int64)
        self.n = 0
        self.head = -1

    # -- slot bookkeeping ------------------------------------------------------------------

    def slot_for(self, p):
        """Slot that the token at absolute position ``p`` goes to (``p`` must be the next one
        to be written: for ``"packed"`` the answer depends on ``head``)."""
        if self.rule == "mod":
            return int(p) % self.W
        return (self.head + 1) % self.W

    def _write(self, p, k, v):
        s = self.slot_for(p)
        self.k_slots[s] = k
        self.v_slots[s] = v
        self.slot_pos[s] = p
        self.head = s

    def _append(self, k, v):
        """Account for ``len(k)`` new tokens at positions ``n..``; cache the last ``min(., W)``."""
        c = k.shape[0]
        for i in range(max(0, c - self.W), c):
            self._write(self.n + i, k[i], v[i])
        self.n += c

    def valid_slots(self):
        """Indices of the occupied slots, in slot order (``min(n, W)`` of them)."""
        return np.flatnonzero(self.slot_pos >= 0)

    def unrotate(self):
        """``(k, v)`` of the cached tokens in position order, each ``(min(n, W), Hkv, D)``."""
        s = self.valid_slots()
        s = s[np.argsort(self.slot_pos[s], kind="stable")]
        return self.k_slots[s].copy(), self.v_slots[s].copy()

    # -- input checks ----------------------------------------------------------------------

    def _kv(self, k, v, what):
        k = np.asarray(k, dtype=np.float64)
        v = np.asarray(v, dtype=np.float64)
        want = (self.Hkv, self.D)
        if k.ndim != 3 or k.shape[1:] != want or v.shape != k.shape:
            raise ValueError(f"{what}: k and v must be (C, {self.Hkv}, {self.D}); "
                             f"got {k.shape} and {v.shape}")
        return k, v

    def _q(self, q, ndim, what):
        q = np.asarray(q, dtype=np.float64)
        if q.ndim != ndim or q.shape[-1] != self.D or q.shape[-2] % self.Hkv:
            raise ValueError(f"{what}: q must have {ndim} dims, last {self.D} and a head count "
                             f"that is a multiple of {self.Hkv}; got {q.shape}")
        return q

    # -- operations ------------------------------------------------------------------------

    def prefill(self, k, v):
        """First fill of an empty cache with ``k``/``v`` ``(S, Hkv, D)`` of positions ``0..S-1``.

        Only the cache is written (attention of the prompt itself: :meth:`chunked_prefill` on an
        empty cache does both).
        """
        if self.n:
            raise RuntimeError("prefill needs an empty cache; use chunked_prefill to continue")
        k, v = self._kv(k, v, "prefill")
        self._append(k, v)

    def decode_step(self, q, k_new, v_new, P=None):
        """One decode token at position ``n``: ``q`` ``(Hq, D)``, ``k_new``/``v_new``
        ``(Hkv, D)``; returns ``(Hq, D)``.

        Writes the new K/V into its slot first, then attends the ``min(n + 1, W)`` valid slots
        in slot order. ``P`` (optional) evaluates it split-KV with ``P`` lanes and LSE merge.
        """
        q = self._q(q, 2, "decode_step")
        k_new, v_new = self._kv(np.asarray(k_new)[None], np.asarray(v_new)[None], "decode_step")
        p = self.n
        self._append(k_new, v_new)  # write first ...
        s = self.valid_slots()  # ... then attend, in slot order
        if P is None:
            o = swa_attention(q[None], self.k_slots[s], self.v_slots[s], window=self.W,
                              causal=True, q_pos=[p], k_pos=self.slot_pos[s])
            return o[0]
        assert np.all(p - self.slot_pos[s] < self.W) and np.all(self.slot_pos[s] <= p)
        return split_kv_decode(q, self.k_slots[s], self.v_slots[s], P)

    def chunked_prefill(self, q_chunk, k_chunk, v_chunk):
        """A chunk of ``C`` tokens at positions ``n..n+C-1``: ``q_chunk`` ``(C, Hq, D)``,
        ``k_chunk``/``v_chunk`` ``(C, Hkv, D)``; returns ``(C, Hq, D)``.

        The chunk attends ``[valid cache slots | chunk]`` under the window, then its last
        ``min(C, W)`` tokens enter the cache.
        """
        q = self._q(q_chunk, 3, "chunked_prefill")
        k, v = self._kv(k_chunk, v_chunk, "chunked_prefill")
        c = k.shape[0]
        if q.shape[0] != c:
            raise ValueError(f"chunked_prefill: {q.shape[0]} queries for {c} keys")
        s = self.valid_slots()
        keys = np.concatenate([self.k_slots[s], k])
        vals = np.concatenate([self.v_slots[s], v])
        qpos = np.arange(self.n, self.n + c)
        kpos = np.concatenate([self.slot_pos[s], qpos])
        o = swa_attention(q, keys, vals, window=self.W, causal=True, q_pos=qpos, k_pos=kpos)
        self._append(k, v)
        return o
