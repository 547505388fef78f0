"""Continuous batching: every running conversation of a device advanced in one step.

:class:`BatchScheduler` is :class:`~ringkv.host.scheduler.Scheduler` for many conversations at
once, the way vLLM's scheduler runs (``docs/blocks/host.md``, section Batching):

* **A step** advances every running request: each decoding request by one token, and
  prefilling requests by one chunk each (``chunk`` tokens, or up to the next checkpoint) while
  the step's token budget (``step_tokens``) lasts, first come first served, at least one chunk
  a step. The whole step is one :meth:`~ringkv.host.model.transformer.Model.forward_batch`:
  the matrix products over every row of the batch, each request's attention on its own rings
  (on the software device the bit-exact core model, vectorized over the batch).
* **Requests join and leave at any step**: :meth:`submit` queues one; it starts at the next
  step that has a free place (at most ``max_batch`` running, at most the device's
  :attr:`~ringkv.host.device.interface.Device.resident_limit`); a finished or cancelled
  request frees its place at once.
* **The hot tier.** A device holds ``resident_limit`` conversations' rings at once (its
  :class:`~ringkv.host.device.interface.Context` s: the software device's ``hot_bytes``; one
  on the FPGA today). A conversation whose rings are still resident continues without any
  import (path ``continue``); one that is not takes a free context, or the least recently
  used idle one (evicted: free, since the end of every turn exported its record; a dirty one
  is exported first), and then goes the scheduler's way through the store: the exact snapshot
  (``hit``), the longest stored prefix (``prefix``), or a recompute (``first``, ``miss``).
  The card stays the cold tier and the persistence point.
* **Each request's tokens are those of the same request run alone** (and of
  :func:`~ringkv.host.scheduler.plain_run`): a row's matrix products do not depend on the other
  rows (:func:`~ringkv.host.model.transformer.batch_matmul`), each request's attention reads
  only its own rings, its chunks are cut as :class:`Scheduler` cuts them (by ``chunk`` and its
  checkpoints, never by the budget), and its sampler is its own.

A request's life: ``waiting`` -> ``running`` (prefill, then decode) -> ``done`` (or
``failed``: :attr:`Request.error`). ``on_token(token)`` is called as each token is picked
(a true answer stops the request there; ``on_token(token, info)`` with its
:class:`~ringkv.host.model.logprobs.TokenLogprob` when the request asks for ``logprobs``),
``on_done(request)`` once at the end, success or not. ``prompt_logprobs`` (``echo``): every
fed token's logprob in the request's event, as :class:`Scheduler` gives them (the request's
prefill keeps the logits of every position: :meth:`Model.forward_batch`'s ``all_logits``;
nothing is reused, the session must be new). An exception from the device ends every running
request (each rolled back as :meth:`Scheduler.request` rolls back) and is raised from
:meth:`step`.
"""

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from .device.interface import Device
from .errors import UsageError
from .model.logprobs import prompt_logprobs as _prompt_logprobs
from .model.logprobs import token_logprob
from .model.transformer import Model
from .scheduler import CHECKPOINT_EVERY, KEEP_TURNS, Scheduler, Session

__all__ = ["BatchScheduler", "Request", "STEP_TOKENS"]

log = logging.getLogger(__name__)

#: Default token budget of a step (decode tokens and prefill chunks together).
STEP_TOKENS = 512


@dataclass(eq=False)
class Request:
    """One request in a :class:`BatchScheduler` (see :meth:`BatchScheduler.submit`)."""
    sid: object
    tokens: list
    n_new: int
    checkpoints: tuple = ()
    rewind: int | None = None
    sample: object = None
    on_token: object = None
    on_done: object = None
    tenant: object = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    #: ``waiting``, ``running``, ``done``, ``failed``
    state: str = "waiting"
    out: list = field(default_factory=list)
    event: dict | None = None
    error: BaseException | None = None
    stopped: bool = False             # ended by ``on_token`` (a stop sequence)
    # progress (the scheduler's)
    ctx: object = None
    inputs: list = field(default_factory=list)
    fed: int = 0
    pos: int = 0
    stops: list = field(default_factory=list)
    logits: object = None
    last: tuple | None = None
    saved: tuple | None = None
    cancelled: bool = False
    started: float = 0.0              # when it left the queue (time.perf_counter)
    rows: list | None = None          # with prompt_logprobs: the logits of every fed token

    @property
    def done(self) -> bool:
        return self.state in ("done", "failed")

    def cancel(self, error: BaseException | None = None) -> None:
        """End the request at the next step (``error``: what it ends with; default a
        :class:`~ringkv.host.errors.UsageError` saying it was cancelled)."""
        self.cancelled = True
        if error is not None:
            self.error = error


class BatchScheduler(Scheduler):
    """The batching scheduler; see the module docstring.

    ``chunk``, ``checkpoint_every``, ``keep_turns``, ``prefix_reuse`` and
    ``export_after_inference`` as :class:`Scheduler`'s; ``step_tokens``: the token budget of a
    step (:data:`STEP_TOKENS`); ``max_batch``: the most requests running at once (default: as
    many as the device holds conversations; 1 runs one request at a time, the baseline).
    """

    def __init__(self, model: Model, device: Device, *, chunk: int = 64,
                 step_tokens: int = STEP_TOKENS, max_batch: int | None = None,
                 export_after_inference: bool = True, sessions: dict | None = None,
                 checkpoint_every: int | None = CHECKPOINT_EVERY, keep_turns: int = KEEP_TURNS,
                 prefix_reuse: bool = True):
        super().__init__(model, device, chunk=chunk,
                         export_after_inference=export_after_inference, sessions=sessions,
                         checkpoint_every=checkpoint_every, keep_turns=keep_turns,
                         prefix_reuse=prefix_reuse)
        if not isinstance(step_tokens, int) or step_tokens < 1:
            raise ValueError(f"step_tokens must be a positive number of tokens, not "
                             f"{step_tokens!r}")
        if max_batch is not None and (not isinstance(max_batch, int) or max_batch < 1):
            raise ValueError(f"max_batch must be a positive number of requests, not "
                             f"{max_batch!r}")
        self.step_tokens = step_tokens
        self.contexts = [device.context(i) for i in range(device.resident_limit)]
        self.max_batch = min(max_batch or len(self.contexts), len(self.contexts))
        self.waiting: deque = deque()
        self.running: list[Request] = []
        #: session -> its context (resident conversations); idle ones in LRU order
        self.where: dict = {}
        self.idle: OrderedDict = OrderedDict()
        self._free = list(reversed(self.contexts))
        self.steps = 0

    # -- the public side --------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def resident(self):
        """The session of context 0 (the one conversation of a device without a hot tier; the
        one-at-a-time :class:`Scheduler`'s attribute)."""
        for sid, ctx in self.where.items():
            if ctx is self.contexts[0]:
                return sid
        return None

    @resident.setter
    def resident(self, sid):
        # (Scheduler.__init__ sets it before the contexts exist; the server's worker sets it to
        # None before a copied record goes through a board's one set of rings)
        if sid is None and hasattr(self, "where"):
            ctx = self.contexts[0]
            for other, c in list(self.where.items()):
                if c is ctx and not self._running(other):
                    self._unseat(other)

    def resident_sessions(self) -> list:
        """The sessions whose rings are resident, least recently used first (running ones
        last)."""
        return list(self.idle) + [s for s in self.where if s not in self.idle]

    def submit(self, sid, tokens, n_new: int, *, checkpoints=(), rewind: int | None = None,
               sample=None, on_token=None, on_done=None, tenant=None,
               logprobs: int | None = None, prompt_logprobs: int | None = None) -> Request:
        """Queue a request (the arguments of :meth:`Scheduler.request`; ``on_done(request)``
        is called once it ended). Checked when it starts: a bad request ends ``failed`` with
        a :class:`ValueError` or :class:`~ringkv.host.errors.UsageError`."""
        if not isinstance(n_new, int) or n_new < 0:
            raise ValueError(f"n_new must be a non-negative number of tokens, not {n_new!r}")
        req = Request(sid, [int(t) for t in tokens], n_new, tuple(checkpoints), rewind, sample,
                      on_token, on_done, tenant, logprobs=logprobs,
                      prompt_logprobs=prompt_logprobs)
        self.waiting.append(req)
        return req

    def request(self, sid, tokens, n_new: int, *, checkpoints=(), rewind: int | None = None,
                sample=None, on_token=None, tenant=None, logprobs: int | None = None,
                prompt_logprobs: int | None = None) -> list[int]:
        """One request run to its end (other requests queued meanwhile advance with it):
        :meth:`Scheduler.request`'s interface; its event is the last of :attr:`events`."""
        req = self.submit(sid, tokens, n_new, checkpoints=checkpoints, rewind=rewind,
                          sample=sample, on_token=on_token, tenant=tenant, logprobs=logprobs,
                          prompt_logprobs=prompt_logprobs)
        while not req.done:
            self.step()
        if req.error is not None:
            raise req.error
        return req.out

    def run(self, requests) -> list:
        """Run every request of ``requests`` (dicts of :meth:`submit`'s arguments, or
        ``(sid, tokens, n_new)``) to its end, all submitted at once; their outputs."""
        reqs = [self.submit(*r) if isinstance(r, tuple) else self.submit(**r) for r in requests]
        while self.busy:
            self.step()
        for r in reqs:
            if r.error is not None:
                raise r.error
        return [r.out for r in reqs]

    # -- contexts -----------------------------------------------------------------------------
    def _running(self, sid) -> bool:
        return any(r.sid == sid for r in self.running)

    def _unseat(self, sid):
        """``sid``'s rings are no longer resident (their context is free)."""
        ctx = self.where.pop(sid, None)
        self.idle.pop(sid, None)
        if ctx is not None:
            self._free.append(ctx)

    def _context_for(self, event):
        """A context for a conversation that is not resident: a free one, else the least
        recently used idle one (its conversation exported first if dirty); None when every
        context runs a request."""
        if not self._free and self.idle:
            sid, ctx = self.idle.popitem(last=False)
            s = self.sessions.get(sid)
            if s is not None and s.dirty and s.tokens:
                self.device.bind(ctx)
                self._export_turn(sid, s, event)
                event["exported"] = sid
            del self.where[sid]
            self._free.append(ctx)
        return self._free.pop() if self._free else None

    # -- a step -------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """One step (module docstring); returns the requests that ended in it."""
        ended: list[Request] = []
        try:
            self._admit(ended)
            self._advance(ended)
        except BaseException as e:
            for r in list(self.running):
                self._fail(r, e, ended)
            raise
        finally:
            for r in ended:
                if r.on_done is not None:
                    r.on_done(r)
        self.steps += 1
        return ended

    def _admit(self, ended):
        for r in [r for r in self.running if r.cancelled]:
            self._fail(r, r.error or UsageError("the request was cancelled"), ended)
        skipped = deque()
        while self.waiting and len(self.running) < self.max_batch:
            r = self.waiting.popleft()
            if r.cancelled:
                self._fail(r, r.error or UsageError("the request was cancelled"), ended)
                continue
            if self._running(r.sid) or any(w.sid == r.sid for w in skipped):
                skipped.append(r)           # its session is busy: after the running request
                continue
            try:
                started = self._start(r)
            except BaseException as e:
                self._fail(r, e, ended)
                if isinstance(e, (ValueError, UsageError)) and r.saved is None:
                    continue                # a bad request, refused before anything changed
                raise
            if not started:
                skipped.append(r)
                break
            if r.fed == len(r.inputs) and r.logits is None:
                self._prefilled(r, None, ended)
        skipped.extend(self.waiting)
        self.waiting = skipped

    def _check(self, r, s):
        """:meth:`Scheduler.request`'s checks, for the session as it is now."""
        if s.tenant != r.tenant:
            raise UsageError(f"session {r.sid!r} belongs to another tenant", param="session")
        if r.rewind is not None and (not isinstance(r.rewind, int)
                                     or not 0 <= r.rewind <= len(s.stream)):
            raise ValueError(f"rewind must be a position 0..{len(s.stream)} of session "
                             f"{r.sid!r}'s stream, not {r.rewind!r}")
        stream = s.stream if r.rewind is None else s.stream[:r.rewind]
        end = len(stream) + len(r.tokens)
        marks = set()
        for p in r.checkpoints:
            if not isinstance(p, (int, np.integer)) or not len(stream) < p <= end:
                raise ValueError(f"checkpoint {p!r} is not a position this request feeds "
                                 f"({len(stream) + 1}..{end} of session {r.sid!r}'s stream)")
            marks.add(int(p))
        kept = len(s.tokens) if r.rewind is None or r.rewind >= len(s.tokens) else 0
        if r.n_new > 0 and end == kept:
            raise ValueError("a request that generates must feed at least one token (the "
                             "session's pending token or new ones)")
        if r.prompt_logprobs is not None and (s.tokens or s.pending or r.rewind):
            raise ValueError("prompt_logprobs needs a new session (every token computed)")
        return marks

    def _start(self, r) -> bool:
        """Place a waiting request: its session's context (resident, or taken and filled
        through the store); False when no context is free."""
        new = r.sid not in self.sessions
        s = self.sessions[r.sid] if not new else Session(tenant=r.tenant)
        marks = self._check(r, s)
        event = {"session": r.sid, "path": None, "rewind": r.rewind, "exported": None,
                 "imported_bytes": 0, "exported_bytes": 0, "reused": 0, "prefilled": 0,
                 "recomputed": 0, "checkpoints": [], "deleted": [], "reason": ""}
        cut = r.rewind is not None and r.rewind < len(s.tokens)
        ctx = self.where.get(r.sid)
        if ctx is None or cut:
            if ctx is not None:
                self._unseat(r.sid)      # the rings are past the cut: not the session's state
            ctx = self._context_for(event)
            if ctx is None:
                return False
            fresh = True
        else:
            self.idle.pop(r.sid, None)
            fresh = False
        if new:
            self.sessions[r.sid] = s
        r.saved = (list(s.tokens), list(s.pending), s.dirty, s.key, list(s.turns))
        r.ctx, r.event, r.started = ctx, event, time.perf_counter()
        self.where[r.sid] = ctx
        self.running.append(r)
        r.state = "running"
        dev = self.device
        dev.bind(ctx)
        tokens = r.tokens
        if cut:
            s.tokens, s.pending = [], s.tokens[:r.rewind]
            s.dirty = False
            s.turns = [k for k in s.turns if k[0] <= r.rewind]
            s.key = s.turns[-1] if s.turns else None
            had = r.rewind
        else:
            if r.rewind is not None:
                s.pending = s.pending[:r.rewind - len(s.tokens)]
            had = len(s.tokens)
        event["before"] = had
        if not fresh:
            event["path"] = "continue"
        else:
            tokens = self._resume(s, tokens, r.n_new, had, event,
                                  reuse=r.prompt_logprobs is None)
        r.inputs = s.pending + tokens
        r.rows = [] if r.prompt_logprobs is not None else None
        r.pos = len(s.tokens)
        end = r.pos + len(r.inputs)
        stops = {p for p in marks if r.pos < p <= end}
        if self.checkpoint_every:
            c = self.checkpoint_every
            stops |= set(range((r.pos // c + 1) * c, end + 1, c))
        r.stops = sorted(stops)
        return True

    def _segment(self, r) -> list:
        """The request's next prefill chunk: up to ``chunk`` tokens, ending at the next
        checkpoint (as :meth:`Scheduler._run` and :meth:`Model.prefill` cut it)."""
        pos = r.pos
        nxt = next((p for p in r.stops if p > pos), r.pos - r.fed + len(r.inputs))
        # Model.prefill cuts a run between two stops into chunks from the run's start
        run_start = max([p for p in r.stops if p <= pos], default=pos - r.fed)
        run_start = max(run_start, pos - r.fed)
        done_in_run = pos - run_start
        size = min(self.chunk - done_in_run % self.chunk, nxt - pos)
        return r.inputs[r.fed:r.fed + size]

    def _advance(self, ended):
        batch = []
        for r in list(self.running):
            if r.logits is None:
                continue
            if self._pick(r, ended):
                batch.append((r, [r.out[-1]]))
        budget = self.step_tokens - len(batch)
        for r in self.running:
            if r.logits is not None or r.fed >= len(r.inputs):
                continue
            seg = self._segment(r)
            if len(seg) > budget and batch:
                break
            batch.append((r, seg))
            budget -= len(seg)
        if not batch:
            return
        logits = self.model.forward_batch(
            [(seg, r.pos, r.ctx.attention) for r, seg in batch],
            all_logits=[r.rows is not None and r.logits is None for r, _ in batch])
        for (r, seg), lg in zip(batch, logits):
            if r.logits is not None:            # a decode step
                r.logits, r.pos = lg, r.pos + 1
                continue
            if r.rows is not None:              # every position's logits (prompt_logprobs)
                r.rows.extend(lg)
                lg = lg[-1]
            s = self.sessions[r.sid]
            self.device.bind(r.ctx)
            self.device.append_tokens(seg)
            s.tokens += seg
            r.fed += len(seg)
            r.pos += len(seg)
            if r.pos in r.stops:
                key, moved = self.device.export(s.tokens, checkpoint=True, **self._tenant(s))
                r.last = (r.pos, tuple(key))
                self.checkpoint_keys.add(r.last[1])
                r.event["checkpoints"].append(r.pos)
                r.event["exported_bytes"] += moved
            if r.fed == len(r.inputs):
                self._prefilled(r, lg, ended)

    def _prefilled(self, r, logits, ended):
        s = self.sessions[r.sid]
        s.pending = []
        r.event["prefilled"] = len(r.inputs)
        if r.rows is not None:
            r.event["prompt_logprobs"] = _prompt_logprobs(r.rows, r.inputs, r.prompt_logprobs)
            r.rows = None
        if r.n_new == 0:
            self._finish(r, ended)
        else:
            r.logits = logits

    def _pick(self, r, ended) -> bool:
        """Pick the request's next token; True when it needs another decode step."""
        logits = r.logits
        token = int(np.argmax(logits)) if r.sample is None else int(r.sample(logits))
        r.out.append(token)
        stop = False
        if r.on_token is not None:
            try:
                stop = bool(r.on_token(token) if r.logprobs is None else
                            r.on_token(token, token_logprob(logits, token, r.logprobs)))
            except Exception as e:              # noqa: BLE001 - the request's own end
                self._fail(r, e, ended)
                return False
        if stop:
            r.stopped = True
        if stop or len(r.out) >= r.n_new:
            self._finish(r, ended)
            return False
        return True

    def _finish(self, r, ended):
        s, dev = self.sessions[r.sid], self.device
        dev.bind(r.ctx)
        decoded = r.out[:-1]
        if decoded:
            dev.append_tokens(decoded)
            s.tokens += decoded
            r.last = None
        s.pending = r.out[-1:]
        s.dirty = s.dirty or bool(r.inputs) or bool(decoded)
        event = r.event
        if self.export_after_inference and s.dirty and s.tokens:
            if r.last is not None and r.last[0] == len(s.tokens):
                s.turns = ([k for k in s.turns if k != r.last[1]]
                           + [r.last[1]])[-self.keep_turns:]
                s.key, s.dirty = r.last[1], False
            else:
                self._export_turn(r.sid, s, event)
            event["exported"] = event["exported"] or r.sid
        event.update(after=len(s.tokens), generated=len(r.out), device=dev.stats())
        self.events.append(event)
        self.running.remove(r)
        self.idle[r.sid] = r.ctx
        r.state, r.logits = "done", None
        ended.append(r)

    def _fail(self, r, error, ended):
        """End ``r`` with ``error``: the session's view back to before it, its rings no
        longer resident (their state is unknown)."""
        if r in self.running:
            self.running.remove(r)
            if r.saved is not None:
                s = self.sessions[r.sid]
                s.tokens, s.pending, s.dirty, s.key, s.turns = r.saved
            self._unseat(r.sid)
        r.state, r.error, r.logits = "failed", error, None
        ended.append(r)
