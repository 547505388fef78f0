"""The whole device in software: what :class:`~ringkv.host.scheduler.Scheduler` drives when
there is no FPGA.

:class:`SoftwareDevice` implements the :class:`~ringkv.host.scheduler.Device` seam with golden
models: the prefix hash of :mod:`ringkv.host.golden_hash`, a directory keyed by
``(count, hash)`` with LRU eviction at a capacity, token verification before a hit, the
longest-prefix query, the model's attention backend as the rings, and optional persistence to
an image file so that a "power cycle" is a new ``SoftwareDevice`` on the same image.
"""

import pickle
from collections import OrderedDict
from pathlib import Path

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.hash import hash_seed

from .golden_hash import prefix_hashes, sequence_hash
from .model import Float64Backend
from .scheduler import Device, QueryResult, snapshot_bytes

__all__ = ["SoftwareDevice"]


class SoftwareDevice(Device):
    """The device in software (golden models); see the module docstring.

    Records are ``{"tokens", "rings", "digest", "kind"}`` by key ``(count, hash)`` (``kind``
    ``"turn"`` or ``"checkpoint"``), in LRU order: a hit or an export makes a record the most
    recent; an export beyond ``capacity`` records evicts the least recent. ``export`` refuses,
    like the FPGA's ``EXPORT`` (``BAD_ARG``), rings that do not hold exactly ``len(tokens)``
    tokens or a token memory that does not begin with ``tokens``.
    """

    def __init__(self, config: RingKVConfig = DEFAULT_CONFIG, *, attention=None,
                 capacity: int | None = None, image=None):
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be a positive number of records, not {capacity!r}")
        self.config = config
        self.attention = attention if attention is not None else Float64Backend(config)
        self.capacity = capacity
        self.image = Path(image) if image is not None else None
        self.seed = hash_seed(config)
        self.tokens: list[int] = []
        self.records: OrderedDict = OrderedDict()      # (count, hash) -> record dict
        self.counters = {"queries": 0, "hits": 0, "misses": 0, "prefix_queries": 0,
                         "prefix_hits": 0, "prefix_misses": 0, "probes": 0, "imports": 0,
                         "exports": 0, "checkpoints": 0, "evictions": 0, "bytes_in": 0,
                         "bytes_out": 0}
        self._imported = None                          # the last query_prefix hit, imported
        if self.image is not None and self.image.exists():
            with open(self.image, "rb") as f:
                self.records = pickle.load(f)
            for rec in self.records.values():          # images from before record kinds
                rec.setdefault("kind", "turn")

    def key_of(self, tokens) -> tuple:
        return (len(tokens), sequence_hash(list(tokens), self.seed))

    def write_tokens(self, tokens):
        self.tokens = list(tokens)

    def append_tokens(self, tokens):
        self.tokens += list(tokens)

    def query(self, tokens) -> QueryResult:
        self.counters["queries"] += 1
        count, h = self.key_of(tokens)
        rec = self.records.get((count, h))
        reason = ""
        if rec is None:
            reason = "no record"
        elif rec["digest"] != self.config.digest():
            reason = "foreign config"
        elif rec["tokens"] != tuple(tokens):
            reason = "tokens differ"         # a hash collision never counts as a hit
        hit = not reason
        self.counters["hits" if hit else "misses"] += 1
        if hit:
            self.records.move_to_end((count, h))
        self._imported = None
        return QueryResult(hit, count, h, reason)

    def query_prefix(self, tokens, limit: int) -> QueryResult:
        """Hash ``tokens[:limit]`` once, probing ``(n, h_n)`` for every ``n`` (``probes``
        counts them); of the stored keys, the longest whose record verifies wins: a record of
        other tokens (a hash collision) is skipped for the next shorter one, a record of a
        foreign configuration makes the query a miss. A hit is imported at once."""
        if not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative number of tokens, not {limit!r}")
        tokens = [int(t) for t in tokens]
        limit = min(limit, len(tokens))
        self.counters["prefix_queries"] += 1
        self.counters["probes"] += limit
        self._imported = None
        hashes = prefix_hashes(tokens[:limit], self.seed)
        reason = "no record"
        for n in range(limit, 0, -1):
            key = (n, hashes[n - 1])
            rec = self.records.get(key)
            if rec is None:
                continue
            if rec["digest"] != self.config.digest():
                reason = "foreign config"
                break
            if rec["tokens"] != tuple(tokens[:n]):
                reason = "tokens differ"     # a collision: the next shorter prefix may do
                continue
            self.records.move_to_end(key)
            result = QueryResult(True, n, key[1])
            self._imported = (result, self._restore(rec))
            self.counters["prefix_hits"] += 1
            return result
        self.counters["prefix_misses"] += 1
        return QueryResult(False, 0, hashes[limit - 1] if limit else self.seed, reason)

    def _restore(self, rec) -> int:
        self.attention.restore(rec["rings"])
        self.tokens = list(rec["tokens"])
        moved = snapshot_bytes(self.config, len(rec["tokens"]))
        self.counters["imports"] += 1
        self.counters["bytes_in"] += moved
        return moved

    def import_(self, result: QueryResult) -> int:
        if not result.hit:
            raise ValueError("import needs the result of a hit")
        if self._imported is not None and self._imported[0] == result:
            return self._imported[1]                   # imported by query_prefix
        return self._restore(self.records[(result.count, result.prefix_hash)])

    def export(self, tokens, replaces=None, *, checkpoint=False):
        tokens = tuple(int(t) for t in tokens)
        n = len(tokens)
        if n == 0:
            raise ValueError("export needs at least one token")
        if self.attention.n != n:
            raise ValueError(f"export of {n} tokens: the rings hold {self.attention.n}")
        if tuple(self.tokens[:n]) != tokens:
            raise ValueError(f"export of {n} tokens: the token memory holds other tokens")
        key = self.key_of(tokens)
        if replaces is not None and tuple(replaces) != key:
            self.records.pop(tuple(replaces), None)
        self.records[key] = {"tokens": tokens, "rings": self.attention.snapshot(),
                             "digest": self.config.digest(),
                             "kind": "checkpoint" if checkpoint else "turn"}
        self.records.move_to_end(key)
        while self.capacity is not None and len(self.records) > self.capacity:
            self.records.popitem(last=False)
            self.counters["evictions"] += 1
        moved = snapshot_bytes(self.config, n)
        self.counters["exports"] += 1
        self.counters["checkpoints"] += bool(checkpoint)
        self.counters["bytes_out"] += moved
        if self.image is not None:
            tmp = self.image.with_suffix(self.image.suffix + ".tmp")
            with open(tmp, "wb") as f:
                pickle.dump(self.records, f)
            tmp.replace(self.image)          # commit last: a crash keeps the old image
        return key, moved

    def listing(self) -> list[tuple[int, int, str]]:
        """The stored records, least recently used first: ``(count, hash, kind)``."""
        return [(c, h, rec["kind"]) for (c, h), rec in self.records.items()]

    def stats(self) -> dict:
        return dict(self.counters, records=len(self.records),
                    checkpoint_records=sum(r["kind"] == "checkpoint"
                                           for r in self.records.values()))
