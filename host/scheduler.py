"""Seed 001's CPU scheduler, against an abstract device; and the device in software.

Per request ``(session, new tokens)`` the :class:`Scheduler` decides (SPEC §4):

* the session's first request, or a continuation of the session resident in the accelerator:
  run inference directly and store the tokens in the device's token memory;
* otherwise: export the resident session if it is dirty (its ring holds tokens that no stored
  snapshot has), then **query** the device with the session's computed tokens: a **hit**
  imports the stored snapshot into the rings, a **miss** recomputes the rings by chunked
  prefill of the session's tokens;
* after inference, **export** the rings (seed 001), unless ``export_after_inference=False``
  (then the session stays dirty and is exported when another session needs the rings).

A session's *computed* tokens are those whose K/V went through the rings; the last generated
token of a turn is *pending* and is fed at the start of the next turn. Every decision is one
entry of :attr:`Scheduler.events` (a dict: path, tokens, bytes moved, recomputed tokens, and
device cycles when the device reports them).

:class:`Device` is the seam to the accelerator. :class:`SoftwareDevice` is the whole device in
software with golden models: the prefix hash of :mod:`ringkv.host.golden_hash`, a directory keyed
by ``(count, hash)`` with LRU eviction at a capacity, token verification before a hit, the
model's attention backend as the rings, and optional persistence to an image file so that a
"power cycle" is a new ``SoftwareDevice`` on the same image. A link device (the same calls as
``QUERY``/``IMPORT``/``EXPORT`` requests of :mod:`ringkv.defs.protocol`) plugs in the same way.
"""

import abc
import pickle
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.hash import hash_seed
from ringkv.defs.record import kv_bytes_of

from .golden_hash import sequence_hash
from .model import AttentionBackend, Float64Backend, Model

__all__ = ["Device", "SoftwareDevice", "QueryResult", "Scheduler", "Session", "plain_run",
           "snapshot_bytes", "path_summary"]


def snapshot_bytes(config: RingKVConfig, count: int) -> int:
    """Bytes a snapshot of ``count`` tokens moves: the tokens and the K/V rings (``EB`` bytes per
    element: int8 for ``ringkv-fx1``, int16 for ``ringkv-fx2``)."""
    return count * (config.token_width // 8) + kv_bytes_of(config, count)


@dataclass(frozen=True)
class QueryResult:
    hit: bool
    count: int
    prefix_hash: int
    reason: str = ""          # why a miss: "no record", "tokens differ", "foreign config"


class Device(abc.ABC):
    """What the scheduler needs from the accelerator side (FPGA or software)."""

    config: RingKVConfig
    attention: AttentionBackend

    @abc.abstractmethod
    def write_tokens(self, tokens) -> None:
        """Replace the token memory with ``tokens`` (the resident session's computed tokens)."""

    @abc.abstractmethod
    def append_tokens(self, tokens) -> None:
        """Append computed tokens to the token memory."""

    @abc.abstractmethod
    def query(self, tokens) -> QueryResult:
        """Hash ``tokens``, look ``(count, hash)`` up, verify the stored tokens."""

    @abc.abstractmethod
    def import_(self, result: QueryResult) -> int:
        """Load the snapshot found by a hit into the rings; return the bytes moved."""

    @abc.abstractmethod
    def export(self, tokens, replaces: tuple | None = None) -> tuple[tuple, int]:
        """Store the rings as the snapshot of ``tokens``; delete the record ``replaces`` (the
        session's previous snapshot). Return ``(key, bytes moved)``."""

    def stats(self) -> dict:
        return {}


class SoftwareDevice(Device):
    """The device in software (golden models); see the module docstring."""

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
        self.counters = {"queries": 0, "hits": 0, "misses": 0, "imports": 0, "exports": 0,
                         "evictions": 0, "bytes_in": 0, "bytes_out": 0}
        if self.image is not None and self.image.exists():
            with open(self.image, "rb") as f:
                self.records = pickle.load(f)

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
        return QueryResult(hit, count, h, reason)

    def import_(self, result: QueryResult) -> int:
        if not result.hit:
            raise ValueError("import needs the result of a hit")
        rec = self.records[(result.count, result.prefix_hash)]
        self.attention.restore(rec["rings"])
        self.tokens = list(rec["tokens"])
        moved = snapshot_bytes(self.config, result.count)
        self.counters["imports"] += 1
        self.counters["bytes_in"] += moved
        return moved

    def export(self, tokens, replaces=None):
        key = self.key_of(tokens)
        if replaces is not None and replaces != key:
            self.records.pop(replaces, None)
        self.records[key] = {"tokens": tuple(tokens), "rings": self.attention.snapshot(),
                             "digest": self.config.digest()}
        self.records.move_to_end(key)
        while self.capacity is not None and len(self.records) > self.capacity:
            self.records.popitem(last=False)
            self.counters["evictions"] += 1
        moved = snapshot_bytes(self.config, len(tokens))
        self.counters["exports"] += 1
        self.counters["bytes_out"] += moved
        if self.image is not None:
            tmp = self.image.with_suffix(self.image.suffix + ".tmp")
            with open(tmp, "wb") as f:
                pickle.dump(self.records, f)
            tmp.replace(self.image)          # commit last: a crash keeps the old image
        return key, moved

    def stats(self) -> dict:
        return dict(self.counters, records=len(self.records))


@dataclass
class Session:
    tokens: list = field(default_factory=list)     # computed tokens (K/V went through the rings)
    pending: list = field(default_factory=list)    # generated but not yet fed
    dirty: bool = False
    key: tuple | None = None                       # the session's stored snapshot


class Scheduler:
    """The host's session scheduler (seed 001). See the module docstring."""

    def __init__(self, model: Model, device: Device, *, chunk: int = 64,
                 export_after_inference: bool = True, sessions: dict | None = None):
        if chunk < 1:
            raise ValueError(f"chunk must be positive, not {chunk!r}")
        self.model, self.device, self.chunk = model, device, chunk
        self.export_after_inference = export_after_inference
        self.sessions: dict = sessions if sessions is not None else {}
        self.resident = None
        self.events: list[dict] = []

    def _release_resident(self, event):
        if self.resident is None:
            return
        s = self.sessions[self.resident]
        if s.dirty:
            s.key, moved = self.device.export(s.tokens, s.key)
            s.dirty = False
            event["exported_bytes"] += moved
            event["exported"] = self.resident
        self.resident = None

    def request(self, sid, tokens, n_new: int) -> list[int]:
        """Feed ``tokens`` to session ``sid`` and generate ``n_new`` tokens (greedy)."""
        dev, attn = self.device, self.device.attention
        s = self.sessions.setdefault(sid, Session())
        event = {"session": sid, "path": None, "before": len(s.tokens), "exported": None,
                 "imported_bytes": 0, "exported_bytes": 0, "recomputed": 0, "reason": ""}
        if sid == self.resident:
            event["path"] = "continue"
        elif not s.tokens:
            self._release_resident(event)
            attn.reset()
            dev.write_tokens([])
            event["path"] = "first"
        else:
            self._release_resident(event)
            result = dev.query(s.tokens)
            if result.hit:
                event["imported_bytes"] = dev.import_(result)
                event["path"] = "hit"
            else:
                attn.reset()
                dev.write_tokens(s.tokens)
                self.model.prefill(s.tokens, 0, attn, self.chunk)
                event["path"] = "miss"
                event["reason"] = result.reason
                event["recomputed"] = len(s.tokens)
        self.resident = sid
        inputs = s.pending + list(tokens)
        out = self.model.generate(inputs, len(s.tokens), attn, n_new, self.chunk)
        computed = inputs + out[:-1]
        dev.append_tokens(computed)
        s.tokens += computed
        s.pending = out[-1:]
        s.dirty = True
        if self.export_after_inference:
            s.key, moved = dev.export(s.tokens, s.key)
            s.dirty = False
            event["exported_bytes"] += moved
            event["exported"] = event["exported"] or sid
        event.update(after=len(s.tokens), generated=len(out), device=dev.stats())
        self.events.append(event)
        return out


def plain_run(model: Model, requests, backend_factory=None, chunk: int = 64) -> list[list[int]]:
    """Reference without scheduling: each session on its own never-evicted backend.

    ``requests`` = ``[(session, tokens, n_new), ...]``; returns the generated tokens per request.
    """
    backend_factory = backend_factory or (lambda: Float64Backend(model.config))
    state, outs = {}, []
    for sid, tokens, n_new in requests:
        backend, pos, pending = state.get(sid, (None, 0, []))
        if backend is None:
            backend = backend_factory()
        inputs = pending + list(tokens)
        out = model.generate(inputs, pos, backend, n_new, chunk)
        state[sid] = (backend, pos + len(inputs) + max(len(out) - 1, 0), out[-1:])
        outs.append(out)
    return outs


def path_summary(events) -> list[str]:
    """One line per scheduler path (first, continue, hit, miss): requests, bytes imported,
    tokens recomputed; ``events`` as :attr:`Scheduler.events`."""
    events, lines = list(events), []
    for path in ("first", "continue", "hit", "miss"):
        sel = [e for e in events if e["path"] == path]
        if sel:
            lines.append(f"  {path:9} {len(sel):>3} requests: imported "
                         f"{sum(e['imported_bytes'] for e in sel):>6} B, recomputed "
                         f"{sum(e['recomputed'] for e in sel):>5} tokens")
    return lines
