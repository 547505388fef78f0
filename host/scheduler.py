"""The CPU scheduler with longest-prefix reuse, against an abstract device.

Per request ``(session, new tokens)`` the :class:`Scheduler` decides (``docs/blocks/host.md``,
section Scheduler):

* a continuation of the session resident in the accelerator: run inference directly
  (path ``continue``);
* a session with computed tokens, not resident: export the resident session if it is dirty
  (its rings hold tokens that no stored snapshot has), then **query** the device for the exact
  ``(count, hash)`` of the session's computed tokens: a **hit** imports the stored snapshot
  (path ``hit``);
* a new session, or one whose exact snapshot is gone (or that was rewound into its computed
  tokens): ask the device for the **longest stored prefix** of everything this request feeds
  (:meth:`Device.query_prefix`, at most ``len - 1`` tokens: the last input token must still go
  through the model to give the logits of the first generated token). A hit imports that
  prefix -- a shared system prompt, a document another conversation read, an earlier turn of
  this one -- and only the rest is prefilled (path ``prefix``); a miss clears the rings and
  prefills everything (path ``first`` for a session with nothing computed before, ``miss``
  for one that had to recompute its own tokens);
* prefill runs in chunks of ``chunk`` tokens and **stops at checkpoint positions**: positions
  the caller marks on the request (``checkpoints=``, e.g. the end of the system prompt, the
  way prompt-caching APIs mark a cache breakpoint) and, automatically, every multiple of
  ``checkpoint_every`` that a prefill crosses. At a checkpoint ``p`` the rings hold exactly the
  state after ``p`` tokens (its window, its ring head, nothing after it) and the token memory
  exactly the first ``p`` tokens, and the scheduler exports them as a *checkpoint* record;
  then prefill goes on. A checkpoint is an ordinary record (same format, same checks, the same
  LRU) that any conversation starting with those ``p`` tokens can continue from; no session's
  export ever deletes one;
* after inference, **export** the rings as the session's turn snapshot, unless
  ``export_after_inference=False`` (then the session stays dirty and is exported when another
  session needs the rings). A session keeps its last ``keep_turns`` turn snapshots (the oldest
  one beyond that is deleted by the export that replaces it, unless another session's turns
  name the same record), so that an edited message resumes from the turn it forks at.

**Edit-and-resend** is ``request(sid, tokens, n_new, rewind=k)``: the session's stream (its
computed tokens and its pending generated token) is cut to its first ``k`` tokens before
``tokens`` are fed, as a chat front end does when the user edits the message that starts at
stream position ``k`` (or regenerates an answer). If the cut goes into the computed tokens, the
session's rings no longer hold its state; the request then goes the longest-prefix way (the
turn snapshot or checkpoint at or before ``k``, reused; the rest prefilled). The branch left
behind is not deleted: its records age out by LRU, and a client that resends it resumes it.

A session's *computed* tokens are those whose K/V went through the rings; the last generated
token of a turn is *pending* and is fed at the start of the next turn. Every decision is one
entry of :attr:`Scheduler.events` (a dict: path, tokens, ``reused`` (tokens imported),
``prefilled`` (tokens through chunked prefill), ``recomputed`` (of those, the tokens this
session had computed before), checkpoints exported, bytes moved, and the device's counters;
on a device that models the SDRAM hot tier ``import_clocks``, the storage clocks of the
request's imports: an import from SDRAM costs the SDRAM's clocks, from the card the card's).
Every generated token is the same as without any reuse (:func:`plain_run`): an import gives
the rings bit for bit as they were exported, and a checkpoint is exported at a chunk boundary.

**Log probabilities** (the API's ``logprobs``, :mod:`ringkv.host.model.logprobs`): with
``logprobs=n`` each generated token's :class:`~ringkv.host.model.logprobs.TokenLogprob` (its
logprob under the model's raw logits and the ``n`` most likely tokens) goes to
``on_token(token, info)``. ``prompt_logprobs=n`` (``echo``) gives every fed token's in the
event (``event["prompt_logprobs"]``, ``None`` first): those need the logits at every position,
so such a request reuses nothing (no resident rings, no stored prefix: the whole stream is
computed again, as vLLM turns prefix caching off for ``prompt_logprobs``), and its session must
be new. Its exports and checkpoints are stored as usual.

:class:`~ringkv.host.device.interface.Device` (module :mod:`ringkv.host.device.interface`) is the
seam to the accelerator. :class:`~ringkv.host.device.software.SoftwareDevice` (module
:mod:`ringkv.host.device.software`) is the whole device in software with golden models. The FPGA
(:class:`~ringkv.host.device.fpga.FpgaDevice`: ``QUERY``/``QUERY_PREFIX``/``EXPORT`` requests of
:mod:`ringkv.defs.protocol`) plugs in the same way.
"""

from dataclasses import dataclass, field

import numpy as np

from .device.interface import Device
from .errors import UsageError
from .model.logprobs import prompt_logprobs as _prompt_logprobs
from .model.logprobs import token_logprob
from .model.transformer import Float64Backend, Model

__all__ = ["Scheduler", "Session", "plain_run", "path_summary", "event_notes", "PATHS",
           "CHECKPOINT_EVERY", "KEEP_TURNS"]

#: The scheduler's paths, in the order :func:`path_summary` lists them.
PATHS = ("first", "continue", "hit", "prefix", "miss")

#: Default of ``Scheduler(checkpoint_every=)``: an automatic checkpoint every 256 tokens of
#: prefill. On the board an export costs about what one token of prefill costs (bench
#: ``system``: ``system.export_s.n512`` 14 ms; recompute 14.8 s for 1,024 tokens, 14.5 ms a
#: token, bound by the UART), so a checkpoint every 256 tokens adds about 0.4 % to a long
#: prefill; what it costs is storage: a region per checkpoint (one of the board card's 4,096),
#: 64 regions for a 16,384-token document. A conversation that shares a prefix with one
#: computed before recomputes at most 255 tokens of the shared part beyond the last checkpoint
#: (about 3.7 s on the board) when no one marked the boundary.
CHECKPOINT_EVERY = 256

#: Miss reasons that only say nothing was stored (not shown for a new session): the software
#: device's and ``FpgaDevice``'s.
_NOTHING_STORED = ("no record", "no stored prefix")

#: Default of ``Scheduler(keep_turns=)``: turn snapshots a session keeps (an edit can go back
#: this many turns and still import; further back it reuses a checkpoint or recomputes).
KEEP_TURNS = 4


def _import_clocks(device):
    """The device's storage clocks of its imports so far, where it models them (a
    :class:`~ringkv.host.device.software.SoftwareDevice` with an SDRAM hot tier: an import
    from SDRAM costs the SDRAM's clocks, from the card the card's); else None (the FPGA
    reports its own clocks in its counters' ``device_cycles``)."""
    return getattr(device, "counters", {}).get("import_clocks") if getattr(
        device, "tier", None) is not None else None


@dataclass
class Session:
    tokens: list = field(default_factory=list)     # computed tokens (K/V went through the rings)
    pending: list = field(default_factory=list)    # generated but not yet fed
    dirty: bool = False
    key: tuple | None = None                       # the session's newest turn snapshot
    turns: list = field(default_factory=list)      # its turn snapshots kept, oldest first
    tenant: object = None                          # whose keys its records use (sealed device)

    def __post_init__(self):
        if self.key is not None:
            self.key = tuple(self.key)
            if not self.turns:
                self.turns = [self.key]
        self.turns = [tuple(k) for k in self.turns]

    @property
    def stream(self) -> list:
        """The session's token stream: computed tokens, then the pending one."""
        return self.tokens + self.pending


class Scheduler:
    """The host's session scheduler. See the module docstring.

    ``chunk``: prefill chunk (tokens per attention request); ``checkpoint_every``: an
    automatic checkpoint at every multiple of it that a prefill crosses (``None`` or ``0``:
    only the caller's; default :data:`CHECKPOINT_EVERY`, why there); ``keep_turns``: turn
    snapshots a session keeps (default :data:`KEEP_TURNS`; 1 replaces the previous
    one); ``prefix_reuse=False`` never asks for a stored prefix (every new session
    computes its tokens: the no-reuse baseline of the benchmarks).
    """

    def __init__(self, model: Model, device: Device, *, chunk: int = 64,
                 export_after_inference: bool = True, sessions: dict | None = None,
                 checkpoint_every: int | None = CHECKPOINT_EVERY, keep_turns: int = KEEP_TURNS,
                 prefix_reuse: bool = True):
        if chunk < 1:
            raise ValueError(f"chunk must be positive, not {chunk!r}")
        if checkpoint_every is not None and checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be a positive number of tokens or None, "
                             f"not {checkpoint_every!r}")
        if keep_turns < 1:
            raise ValueError(f"keep_turns must be at least 1, not {keep_turns!r}")
        self.model, self.device, self.chunk = model, device, chunk
        self.export_after_inference = export_after_inference
        self.checkpoint_every = checkpoint_every or None
        self.keep_turns = keep_turns
        self.prefix_reuse = prefix_reuse
        self.sessions: dict = sessions if sessions is not None else {}
        self.resident = None
        self.events: list[dict] = []
        #: keys this scheduler exported as checkpoints: never deleted by a session's export
        self.checkpoint_keys: set = set()

    # -- snapshots ------------------------------------------------------------------------
    def _protected(self, key, sid) -> bool:
        return key in self.checkpoint_keys or any(
            key in s.turns for other, s in self.sessions.items() if other != sid)

    @staticmethod
    def _tenant(s) -> dict:
        """The device call's ``tenant=`` for session ``s`` (none for a session without one, so
        that a device that knows no tenants is called as before)."""
        return {} if s.tenant is None else {"tenant": s.tenant}

    def _export_turn(self, sid, s, event):
        """Export the rings as ``sid``'s turn snapshot; its oldest turn beyond ``keep_turns``
        is deleted by the same export unless it is a checkpoint or another session's turn."""
        victim = s.turns.pop(0) if len(s.turns) >= self.keep_turns else None
        replaces = victim if victim is not None and not self._protected(victim, sid) else None
        key, moved = self.device.export(s.tokens, replaces, **self._tenant(s))
        key = tuple(key)
        s.turns = [k for k in s.turns if k != key] + [key]
        s.key, s.dirty = key, False
        event["exported_bytes"] += moved
        if replaces is not None and replaces != key:
            event["deleted"].append(replaces)
        return key

    def _release_resident(self, event):
        if self.resident is None:
            return
        rid = self.resident
        s = self.sessions[rid]
        if s.dirty and s.tokens:
            self._export_turn(rid, s, event)
            event["exported"] = rid
        self.resident = None

    # -- requests -------------------------------------------------------------------------
    def request(self, sid, tokens, n_new: int, *, checkpoints=(), rewind: int | None = None,
                sample=None, on_token=None, tenant=None, logprobs: int | None = None,
                prompt_logprobs: int | None = None) -> list[int]:
        """Feed ``tokens`` to session ``sid`` and generate up to ``n_new`` tokens.

        ``sample(logits) -> token`` picks each token (default greedy: ``argmax``, as
        :func:`plain_run`; :class:`~ringkv.host.model.sampling.Sampler` samples).
        ``on_token(token)`` is called with each token as soon as it is picked; a true answer ends
        the generation there (a stop sequence, an end of text): that token is the last one
        returned. An exception it raises (a client gone) ends the request like any other, the
        session's view back to before it. With ``logprobs=n`` (0..20) it is called
        ``on_token(token, info)``, ``info`` the token's
        :class:`~ringkv.host.model.logprobs.TokenLogprob` with the ``n`` most likely tokens.
        ``prompt_logprobs=n``: every token fed gets one too, in this request's event (module
        docstring); only for a new session.

        ``checkpoints``: positions in the session's token stream (``p`` tokens from its start)
        to store a checkpoint at, each within what this request feeds (after ``rewind``:
        ``len(stream) < p <= len(stream) + len(tokens)``); a position that the imported
        prefix already covers is not stored again. ``rewind=k``: first cut the session's
        stream to its first ``k`` tokens (edit-and-resend; see the module docstring).

        ``tenant``: whose records the session's queries, imports and exports use, on a sealed
        device (:class:`~ringkv.host.device.software.SoftwareDevice` and
        :class:`~ringkv.host.device.fpga.FpgaDevice` with ``sealed=True``: the tenant's key
        seals its records and seeds its prefix hash, so one tenant never finds another's). It
        is the session's from its first request on; a request for the session under another
        tenant is refused (:class:`~ringkv.host.errors.UsageError`), nothing changed.
        """
        tokens = [int(t) for t in tokens]
        if not isinstance(n_new, int) or n_new < 0:
            raise ValueError(f"n_new must be a non-negative number of tokens, not {n_new!r}")
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = Session(tenant=tenant)
        elif s.tenant != tenant:
            raise UsageError(f"session {sid!r} belongs to another tenant",
                             param="session")
        if rewind is not None and (not isinstance(rewind, int)
                                   or not 0 <= rewind <= len(s.stream)):
            raise ValueError(f"rewind must be a position 0..{len(s.stream)} of session "
                             f"{sid!r}'s stream, not {rewind!r}")
        stream = s.stream if rewind is None else s.stream[:rewind]
        end = len(stream) + len(tokens)
        marks = set()
        for p in checkpoints:
            if not isinstance(p, (int, np.integer)) or not len(stream) < p <= end:
                raise ValueError(f"checkpoint {p!r} is not a position this request feeds "
                                 f"({len(stream) + 1}..{end} of session {sid!r}'s stream)")
            marks.add(int(p))
        kept = len(s.tokens) if rewind is None or rewind >= len(s.tokens) else 0
        if n_new > 0 and end == kept:
            raise ValueError("a request that generates must feed at least one token (the "
                             "session's pending token or new ones)")
        if prompt_logprobs is not None and (s.tokens or s.pending or rewind):
            raise ValueError("prompt_logprobs needs a new session (every token computed)")
        saved = (list(s.tokens), list(s.pending), s.dirty, s.key, list(s.turns))
        try:
            return self._request(sid, s, tokens, n_new, marks, rewind, sample, on_token,
                                 logprobs, prompt_logprobs)
        except BaseException:
            # the host's view goes back to before the request; the rings' state is unknown
            s.tokens, s.pending, s.dirty, s.key, s.turns = saved
            if self.resident == sid:
                self.resident = None
            raise

    def _request(self, sid, s, tokens, n_new, marks, rewind, sample=None, on_token=None,
                 logprobs=None, prompt_logprobs=None):
        dev = self.device
        event = {"session": sid, "path": None, "rewind": rewind, "exported": None,
                 "imported_bytes": 0, "exported_bytes": 0, "reused": 0, "prefilled": 0,
                 "recomputed": 0, "checkpoints": [], "deleted": [], "reason": ""}
        clocks = _import_clocks(dev)
        if rewind is not None and rewind < len(s.tokens):
            # the rings are past the cut: what is kept of the stream is fed again, after
            # whatever prefix of it the device still has
            s.tokens, s.pending = [], s.tokens[:rewind]
            s.dirty = False
            s.turns = [k for k in s.turns if k[0] <= rewind]
            s.key = s.turns[-1] if s.turns else None
            if self.resident == sid:
                self.resident = None
            had = rewind
        else:
            if rewind is not None:
                s.pending = s.pending[:rewind - len(s.tokens)]
            had = len(s.tokens)
        event["before"] = had
        if sid == self.resident:
            event["path"] = "continue"
        else:
            self._release_resident(event)
            tokens = self._resume(s, tokens, n_new, had, event,
                                  reuse=prompt_logprobs is None)
        self.resident = sid
        rows = [] if prompt_logprobs is not None else None
        out, last = self._run(s, s.pending + tokens, n_new, marks, event, sample, on_token,
                              logprobs, rows)
        if rows is not None:
            event["prompt_logprobs"] = _prompt_logprobs(rows, tokens, prompt_logprobs)
        if self.export_after_inference and s.dirty and s.tokens:
            if last is not None and last[0] == len(s.tokens):
                # the rings are the checkpoint just stored: it is the turn's snapshot too (the
                # oldest turn beyond keep_turns leaves the list undeleted, to age out by LRU)
                s.turns = ([k for k in s.turns if k != last[1]] + [last[1]])[-self.keep_turns:]
                s.key, s.dirty = last[1], False
            else:
                self._export_turn(sid, s, event)
            event["exported"] = event["exported"] or sid
        event.update(after=len(s.tokens), generated=len(out), device=dev.stats())
        if clocks is not None:
            event["import_clocks"] = _import_clocks(dev) - clocks
        self.events.append(event)
        return out

    def _resume(self, s, tokens, n_new, had, event, *, reuse=True):
        """Fill the device's rings for session ``s``, whose rings are not resident: its own
        snapshot (path ``hit``), else the longest stored prefix of all it feeds (``prefix``;
        not when ``reuse`` is false or ``prefix_reuse`` is off), else nothing (``first``,
        ``miss``: the rings cleared). ``had``: the tokens the session had computed. Returns
        the tokens still to feed (``s.tokens`` and ``s.pending`` updated, ``event`` filled)."""
        dev, tenant = self.device, self._tenant(s)
        if s.tokens:
            result = dev.query(s.tokens, **tenant)
            if result.hit:
                event["imported_bytes"] = dev.import_(result, **tenant)
                event["path"], event["reused"] = "hit", len(s.tokens)
                event["recomputed"] = max(0, had - len(s.tokens))
                return tokens
            event["reason"] = result.reason
        everything = s.tokens + s.pending + tokens
        limit = len(everything) - (1 if n_new > 0 else 0)
        result = (dev.query_prefix(everything, limit, **tenant)
                  if reuse and self.prefix_reuse and limit > 0 else None)
        if result is not None and result.hit:
            event["imported_bytes"] = dev.import_(result, **tenant)
            event["path"], event["reused"] = "prefix", result.count
            event["reason"] = ""
            s.tokens, s.pending = everything[:result.count], []
            tokens = everything[result.count:]
        else:
            dev.attention.reset()
            dev.write_tokens([])
            event["path"] = "miss" if had else "first"
            if result is not None and result.reason not in _NOTHING_STORED:
                event["reason"] = result.reason
            elif not event["reason"] and had:
                event["reason"] = "no record"
            s.tokens, s.pending, tokens = [], [], everything
        event["recomputed"] = max(0, had - len(s.tokens))
        return tokens

    def _run(self, s, inputs, n_new, marks, event, sample=None, on_token=None, logprobs=None,
             rows=None):
        """Prefill ``inputs`` in chunks, stopping at every checkpoint to export it, keeping the
        token memory in step; then decoding (greedy, or by ``sample``; ``on_token`` may end
        it early; ``logprobs``: see :meth:`request`). ``rows``: a list to collect the logits
        of every input position in (the same chunks as :meth:`Model.prefill`). Returns the
        generated tokens and ``(position, key)`` of the last checkpoint stored (or None)."""
        dev, attn, model = self.device, self.device.attention, self.model
        pos = len(s.tokens)
        end = pos + len(inputs)
        stops = {p for p in marks if pos < p <= end}
        if self.checkpoint_every:
            c = self.checkpoint_every
            stops |= set(range((pos // c + 1) * c, end + 1, c))
        logits, last = None, None
        for stop in sorted(stops | {end}):
            seg = inputs[len(s.tokens) - pos:stop - pos]
            if seg and rows is not None:
                for c in range(0, len(seg), self.chunk):
                    rows.extend(model.forward(seg[c:c + self.chunk], len(s.tokens) + c, attn))
                logits = rows[-1]
            elif seg:
                logits = model.prefill(seg, len(s.tokens), attn, self.chunk)
            if seg:
                dev.append_tokens(seg)
                s.tokens += seg
            if stop in stops:
                key, moved = dev.export(s.tokens, checkpoint=True, **self._tenant(s))
                last = (stop, tuple(key))
                self.checkpoint_keys.add(last[1])
                event["checkpoints"].append(stop)
                event["exported_bytes"] += moved
        s.pending = []
        event["prefilled"] = len(inputs)
        out = []
        for step in range(n_new):
            token = int(np.argmax(logits)) if sample is None else int(sample(logits))
            out.append(token)
            if on_token is not None and (
                    on_token(token) if logprobs is None
                    else on_token(token, token_logprob(logits, token, logprobs))):
                break
            if step + 1 < n_new:
                logits = model.forward([token], len(s.tokens) + step, attn)[0]
        decoded = out[:-1]
        if decoded:
            dev.append_tokens(decoded)
            s.tokens += decoded
            last = None
        s.pending = out[-1:]
        s.dirty = s.dirty or bool(inputs) or bool(decoded)
        return out, last


def plain_run(model: Model, requests, backend_factory=None, chunk: int = 64) -> list[list[int]]:
    """Reference without scheduling: each session on its own never-evicted backend, nothing
    ever reused.

    ``requests`` = ``[(session, tokens, n_new), ...]`` or ``(session, tokens, n_new, options)``
    with the options of :meth:`Scheduler.request` (``rewind=k`` restarts the session on a new
    backend from the first ``k`` tokens of its stream; ``checkpoints`` change nothing here);
    returns the generated tokens per request.
    """
    backend_factory = backend_factory or (lambda: Float64Backend(model.config))
    state, outs = {}, []
    for sid, tokens, n_new, *opts in requests:
        opts = opts[0] if opts else {}
        backend, pos, pending, stream = state.get(sid, (None, 0, [], []))
        if opts.get("rewind") is not None:
            k = opts["rewind"]
            backend, pos, pending, stream = None, 0, stream[:k], stream[:k]
        if backend is None:
            backend = backend_factory()
        inputs = pending + list(tokens)
        out = model.generate(inputs, pos, backend, n_new, chunk)
        stream = stream + list(tokens) + out
        state[sid] = (backend, pos + len(inputs) + max(len(out) - 1, 0), out[-1:], stream)
        outs.append(out)
    return outs


def event_notes(event) -> str | None:
    """The demo tables' note under a request row: a rewind, the checkpoints stored and why
    it missed (``event`` as one of :attr:`Scheduler.events`); ``None`` when there is none."""
    notes = []
    if event["rewind"] is not None:
        notes.append(f"stream cut to {event['rewind']} tokens before feeding the edited "
                     f"message")
    if event["checkpoints"]:
        notes.append("checkpoint stored at " + ", ".join(map(str, event["checkpoints"])))
    if event["reason"]:
        notes.append(f"miss: {event['reason']}")
    return "   (" + "; ".join(notes) + ")" if notes else None


def path_summary(events) -> list[str]:
    """One line per scheduler path (:data:`PATHS`): requests, tokens reused (imported),
    prefilled and, of those, recomputed, bytes imported; ``events`` as
    :attr:`Scheduler.events`."""
    events, lines = list(events), []
    for path in PATHS:
        sel = [e for e in events if e["path"] == path]
        if sel:
            lines.append(f"  {path:9} {len(sel):>3} requests: reused "
                         f"{sum(e.get('reused', 0) for e in sel):>6} tokens (imported "
                         f"{sum(e['imported_bytes'] for e in sel):>8} B), prefilled "
                         f"{sum(e.get('prefilled', 0) for e in sel):>6}, recomputed "
                         f"{sum(e['recomputed'] for e in sel):>5} tokens")
    return lines

