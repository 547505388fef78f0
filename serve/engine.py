"""Many conversations on many devices: a worker per device, a router, an exact index of what
each device holds.

**Workers.** Each device has a :class:`Worker`: a thread with its own
:class:`~ringkv.host.scheduler.Scheduler` that serves one request at a time (a device has one
set of rings), taking them from a bounded queue. Devices run in parallel. Threads, not
processes: a board's worker waits on its link with the GIL released, and the software
device's model spends its time in numpy, which releases it too; the model's weights are
shared, read only, by every worker.

**Conversations find their state by content.** A request carries its whole prompt (that is how
the OpenAI API works). A worker continues the conversation resident in its rings when the
prompt begins with that conversation's whole token stream (the ``continue`` path: nothing to
import); otherwise the request is a new scheduler session, and the scheduler's longest stored
prefix query resumes it from the longest record the device holds: the previous turn's
snapshot, the checkpoint at the message an edit forks at, or the checkpoint at the end of a
system prompt that many conversations share. A request may pin a conversation with a
``session_id``: it then stays one scheduler session (and on one device while that device
serves), an edit of it cut back with the scheduler's ``rewind``.

**Router.** A request goes to the ready device holding its longest stored prefix (by the
server's index of that device), unless that device's queue is longer than the least loaded
one's by more than ``max_imbalance`` requests; without a stored prefix it goes to the least
loaded device (fewest queued and running requests, then the fewest records). When the device
holding the prefix is full or too busy, the conversation **moves**: the least loaded device
serves it, after copying the record of that prefix from the holder (``Device.read_record`` /
``write_record``, in the card's record format, taken between two of the holder's requests)
when the prefix is at least ``move_min_tokens`` (64, a prefill chunk) longer than what the
target holds: a copy moves one record (the tokens and the constant-size K/V rings) where a
recompute runs the model over every token of the prefix (on a board the copy replays the
record's K/V through the attention core, as much link traffic as the recompute's attention
part, without the host's model). A copy that fails (the record evicted meanwhile) leaves the
request to recompute. The index of a
device is the set of ``(count, hash)`` keys of its records, with the prefix hash of
:mod:`ringkv.host.golden_hash` (the device's own): it is read from the device's own listing
at start, after every recovery, and after every request on a software device (whose listing
costs nothing); on a board it follows the exports the worker makes and is read again from the
board's directory whenever the device answers other than the index predicted (a record
evicted by the board's allocator).

**Faults.** An exception from a device (a link dropped, a simulator killed, an error status)
takes the device out of the router; the request it was serving is sent again to another ready
device when none of its tokens has been sent to the client yet (it is recomputed there from
that device's own store), else it ends with an error; requests still queued on it go to the
other devices. The worker then reopens its device (a simulator started again on its image, a
link connected again, the board's power-on recovery waited for), reads its index from the
device's directory and rejoins. A token is only ever computed from the rings of the
conversation it belongs to: each request starts from the device's verified records or from
nothing.

**Overload.** At most ``max_queue`` requests wait or run per device; a request for which every
ready device is full is refused at once with :class:`~ringkv.host.errors.Overloaded` (HTTP
429), never queued without bound.
"""

import itertools
import logging
import queue
import threading
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from ringkv.host.errors import DeviceNotReady, Overloaded, RingKVError, UsageError
from ringkv.host.golden_hash import hash_step
from ringkv.host.sampling import Sampler, SamplingParams
from ringkv.host.scheduler import Scheduler

from .template import END_OF_MESSAGE, Prompt, TextStream

__all__ = ["Engine", "Worker", "Job", "JobResult", "Cancelled", "PLACEMENTS", "PrefixHasher"]

log = logging.getLogger(__name__)

#: ``placement=`` choices: by longest stored prefix, by load alone, in turn
PLACEMENTS = ("prefix", "least-loaded", "round-robin")


class Cancelled(Exception):
    """The client went away: the request ends where it is."""


@dataclass
class JobResult:
    tokens: list                 # generated tokens
    text: str
    finish_reason: str           # "stop" or "length"
    prompt_tokens: int
    cached_tokens: int           # prompt tokens not computed by this request
    reused: int                  # of those, imported from the device's store
    resident: int                # of those, already in the rings (the continue path)
    prefilled: int
    recomputed: int
    path: str
    device: str
    scheduler_s: float           # time inside Scheduler.request
    queue_s: float = 0.0         # time waiting in the device's queue


@dataclass
class Job:
    """One request on its way through the engine. ``sink(kind, value)`` receives ``("token",
    text)`` per generated token, then ``("done", JobResult)`` or ``("error", exception)``; it is
    called from the worker's thread."""
    prompt: Prompt
    params: SamplingParams
    sink: object
    chat: bool = False
    session: str | None = None
    received: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    emitted: int = 0
    attempts: int = 0
    predicted: int = 0           # the stored prefix the router expected on its device
    routed: float = 0.0          # when the router queued it
    move: tuple | None = None    # (worker, key): copy that device's record here first
    counted_by: object = None    # the worker whose load counts it (Worker._release)

    @property
    def stops(self) -> tuple:
        return self.params.stop + ((END_OF_MESSAGE,) if self.chat else ())


class PrefixHasher:
    """Prefix hashes of prompts for the router, remembering the hashes up to the last
    checkpoint position (message end) of recent prompts, so that a conversation's next turn
    hashes only what it adds; at most ``size`` prompts and ``budget`` hashes in all."""

    def __init__(self, seed: int, size: int = 512, budget: int = 1 << 21):
        self.seed, self.size, self.budget = seed, size, budget
        self.known: OrderedDict = OrderedDict()   # tokens[:p] as bytes -> (h_1 .. h_p)
        self.held = 0                             # hashes held in all (at most ``budget``)

    @staticmethod
    def _key(tokens) -> bytes:
        return array("H", tokens).tobytes()

    def hashes(self, tokens, limit: int, marks=()) -> list:
        """``[h_1 .. h_limit]`` of ``tokens``; ``marks``: checkpoint positions (the longest
        one within ``limit`` is remembered for the next prompt that starts with it)."""
        marks = sorted(p for p in marks if 0 < p <= limit)
        start, out = 0, []
        for p in reversed(marks):
            key = self._key(tokens[:p])
            got = self.known.get(key)
            if got is not None:
                self.known.move_to_end(key)
                start, out = p, list(got)
                break
        h = out[-1] if out else self.seed
        for t in tokens[start:limit]:
            h = hash_step(h, t)
            out.append(h)
        if marks and marks[-1] > start and marks[-1] <= self.budget:
            key = self._key(tokens[:marks[-1]])
            if key not in self.known:
                self.known[key] = tuple(out[:marks[-1]])
                self.held += marks[-1]
            while len(self.known) > self.size or self.held > self.budget:
                self.held -= len(self.known.popitem(last=False)[1])
        return out


class IndexedDevice:
    """The device as the scheduler sees it, keeping the worker's index in step with the
    records it exports and deletes."""

    def __init__(self, device, worker):
        self._device, self._worker = device, worker

    def __getattr__(self, name):
        return getattr(self._device, name)

    def export(self, tokens, replaces=None, *, checkpoint=False):
        key, moved = self._device.export(tokens, replaces, checkpoint=checkpoint)
        key = tuple(key)
        with self._worker.lock:
            self._worker.index.add(key)
            if replaces is not None and tuple(replaces) != key:
                self._worker.index.discard(tuple(replaces))
        self._worker.engine.metrics.device_exports.labels(self._worker.name).inc()
        return key, moved


class Worker:
    """A device's thread (see the module docstring). ``state``: ``starting``, ``ready`` or
    ``recovering``."""

    def __init__(self, engine, handle, number: int):
        self.engine, self.handle, self.number = engine, handle, number
        self.name = handle.name
        self.lock = threading.Lock()
        self.queue: queue.Queue = queue.Queue()
        self.load = 0                      # queued + running
        self.index: set = set()
        self.state = "starting"
        self.device = None
        self.scheduler = None
        self.pinned: OrderedDict = OrderedDict()      # session id -> None, recent last
        self.recoveries = 0
        #: held while the device serves a request; another worker copying a record out of
        #: this device takes it between two requests
        self.device_lock = threading.Lock()
        self._sids = itertools.count()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"ringkv-{self.name}",
                                       daemon=True)

    # -- life ----------------------------------------------------------------------------------
    def start(self):
        self.thread.start()

    def stop(self):
        self._stop.set()
        self.queue.put(None)

    def _open(self):
        """Open the device, read its index from its own listing, new scheduler."""
        device = self.handle.open()
        self.device = IndexedDevice(device, self)
        self.scheduler = Scheduler(self.engine.model, self.device, chunk=self.engine.chunk)
        self.pinned.clear()
        self._resync()

    def _resync(self):
        keys = {tuple(k) for k in self.handle.listing(self.device._device)}
        with self.lock:
            self.index = keys
        if self.scheduler is not None:
            self.scheduler.checkpoint_keys &= keys
        self.engine.metrics.device_records.labels(self.name).set(len(keys))

    def _bring_up(self, first: bool):
        delay = 0.5
        while not self._stop.is_set():
            try:
                self._open()
            except Exception as e:          # noqa: BLE001 - any failure: try again later
                msg = e.one_line() if isinstance(e, RingKVError) else f"{type(e).__name__}: {e}"
                log.warning("%s: cannot open the device (%s); retrying in %.1f s", self.name,
                            msg, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
                continue
            if not first:
                self.recoveries += 1
                self.engine.metrics.device_recoveries.labels(self.name).inc()
                log.info("%s: recovered, %d records in its directory", self.name,
                         len(self.index))
            self.state = "ready"
            self.engine.metrics.device_up.labels(self.name).set(1)
            return True
        return False

    def _main(self):
        if not self._bring_up(first=True):
            return
        while not self._stop.is_set():
            job = self.queue.get()
            if job is None:
                break
            try:
                if job.cancelled.is_set():
                    continue
                with self.device_lock:
                    self._serve(job)
            finally:
                self._release(job)
        self.handle.close()

    def _release(self, job):
        """The job no longer counts in this device's load (once): at its answer, so that the
        client's next turn, sent as soon as it has the answer, finds the device open while
        its bookkeeping (index, sessions) finishes."""
        if job.counted_by is not self:
            return
        job.counted_by = None
        with self.engine.lock:
            self.load -= 1
        self.engine.metrics.device_queue.labels(self.name).set(self.load)

    # -- one request ---------------------------------------------------------------------------
    def _place(self, tokens, session):
        """``(sid, tokens to feed, rewind, stream position they start at)`` for a prompt."""
        sched = self.scheduler
        if session is not None and session in sched.sessions:
            stream = sched.sessions[session].stream
            k = 0
            for a, b in zip(stream, tokens):
                if a != b:
                    break
                k += 1
            if k == len(stream) and len(tokens) > k:
                return session, tokens[k:], None, k
            k = min(k, len(tokens) - 1)
            return session, tokens[k:], k, k
        if session is None and sched.resident is not None:
            sid = sched.resident
            stream = sched.sessions[sid].stream
            if not isinstance(sid, str) and len(tokens) > len(stream) \
                    and tokens[:len(stream)] == stream:
                return sid, tokens[len(stream):], None, len(stream)
        sid = session if session is not None else next(self._sids)
        return sid, tokens, None, 0

    def _forget_sessions(self, keep):
        """Drop the scheduler's sessions but the resident one and recent pinned ones."""
        sched = self.scheduler
        for sid in [s for s in sched.sessions if not isinstance(s, str)]:
            if sid != sched.resident and sid != keep:
                del sched.sessions[sid]
        while len(self.pinned) > self.engine.max_sessions:
            sid, _ = self.pinned.popitem(last=False)
            if sid != sched.resident:
                sched.sessions.pop(sid, None)
        sched.events.clear()

    def _serve(self, job: Job):
        metrics, params = self.engine.metrics, job.params
        queue_s = time.perf_counter() - job.routed
        metrics.queue_wait.observe(queue_s)
        tokens = list(job.prompt.tokens)
        sid, feed, rewind, base = self._place(tokens, job.session)
        if job.session is not None:
            self.pinned[job.session] = None
            self.pinned.move_to_end(job.session)
        marks = [p for p in job.prompt.checkpoints if base < p <= len(tokens)]
        text = TextStream(job.stops)
        sampler = Sampler(params)
        last = [None]

        def on_token(token):
            if job.cancelled.is_set():
                raise Cancelled()
            now = time.perf_counter()
            if last[0] is None:
                metrics.ttft.observe(now - job.received)
            else:
                metrics.inter_token.observe(now - last[0])
            last[0] = now
            piece, stopped = text.push(token)
            job.emitted += 1
            job.sink("token", piece)
            return stopped

        t0 = time.perf_counter()
        try:
            if job.move is not None:
                self._copy_in(*job.move)
            out = self.scheduler.request(sid, feed, params.max_tokens, checkpoints=marks,
                                         rewind=rewind, sample=sampler, on_token=on_token)
        except Cancelled:
            log.info("%s: request cancelled by its client", self.name)
            self._forget_sessions(None)
            job.sink("error", Cancelled())
            return
        except UsageError as e:
            self._forget_sessions(None)
            job.sink("error", e)
            return
        except Exception as e:              # noqa: BLE001 - the device failed: recover it
            self._failed(job, e)
            return
        elapsed = time.perf_counter() - t0
        tail = text.finish()
        if tail:
            job.sink("token", tail)
        event = self.scheduler.events[-1]
        resident = base if event["path"] == "continue" else 0
        result = JobResult(
            tokens=out, text=text.full_text, prompt_tokens=len(tokens),
            finish_reason="stop" if text.stopped else "length",
            cached_tokens=min(len(tokens), event["reused"] + resident),
            reused=event["reused"], resident=resident, prefilled=event["prefilled"],
            recomputed=event["recomputed"], path=event["path"], device=self.name,
            scheduler_s=elapsed, queue_s=queue_s)
        self._account(event, result)
        self._release(job)
        job.sink("done", result)             # the answer first, the index after
        self._update_index(event, job, result)
        self._forget_sessions(job.session)

    def _copy_in(self, holder, key):
        """Copy the record ``key`` from ``holder``'s device into this one (the conversation
        moves here); the copy is skipped, and the request recomputes, when the holder is
        down, busy past a bound, or no longer has the record."""
        from ringkv.host.errors import ConfigError, StorageError
        if holder.state != "ready" or not holder.device_lock.acquire(timeout=30):
            return
        try:
            if holder.state != "ready" or holder.device is None:
                return
            data = holder.device._device.read_record(key)
        except (StorageError, ConfigError, NotImplementedError) as e:
            log.info("%s: record %s not copied from %s (%s)", self.name, key, holder.name, e)
            return
        finally:
            holder.device_lock.release()
        # the copy may go through the rings (a board replays it into them, then exports)
        self.scheduler.resident = None
        new = tuple(self.device._device.write_record(data))
        with self.lock:
            self.index.add(new)
        self.engine.metrics.device_moves.labels(holder.name, self.name).inc()
        log.info("%s: copied record of %d tokens from %s", self.name, new[0], holder.name)

    def _account(self, event, result):
        m, name = self.engine.metrics, self.name
        m.device_requests.labels(name, event["path"]).inc()
        if event["path"] in ("hit", "prefix"):
            m.device_hits.labels(name).inc()
        elif event["path"] in ("first", "miss"):
            m.device_misses.labels(name).inc()
        if event["path"] == "prefix":
            m.device_prefix_hits.labels(name).inc()
        m.tokens_reused.inc(result.reused)
        m.tokens_resident.inc(result.resident)
        m.tokens_prefilled.inc(result.prefilled)
        m.tokens_recomputed.inc(result.recomputed)
        m.scheduler_seconds.observe(result.scheduler_s)

    def _update_index(self, event, job, result):
        m, name = self.engine.metrics, self.name
        if self.handle.kind == "software":
            self._resync()
        elif event["path"] in ("prefix", "first", "miss") and result.reused != job.predicted:
            # the board answered other than the index said (its allocator evicted a record)
            self._resync()
        else:
            m.device_records.labels(name).set(len(self.index))

    def _failed(self, job, exc):
        msg = exc.one_line() if isinstance(exc, RingKVError) else f"{type(exc).__name__}: {exc}"
        log.error("%s: device failed during a request (%s); taking it out to recover",
                  self.name, msg)
        self.state = "recovering"
        self.engine.metrics.device_up.labels(self.name).set(0)
        # requests still queued here go to the other devices
        moved = []
        while True:
            try:
                queued = self.queue.get_nowait()
            except queue.Empty:
                break
            if queued is None:
                self._stop.set()
                break
            moved.append(queued)
            queued.counted_by = None
        with self.engine.lock:
            self.load -= len(moved)
        self._release(job)                   # before it may count on another device
        retry = job.emitted == 0 and job.attempts < 2
        for j in ([job] if retry else []) + moved:
            self.engine.resubmit(j)
        if not retry:
            err = DeviceNotReady(f"device {self.name} failed during the request ({msg}); "
                                 f"the tokens sent so far are valid, the rest is lost",
                                 hint="send the request again")
            job.sink("error", err)
        try:
            self.handle.disconnect()
        except Exception:                   # noqa: BLE001 - letting go of a broken device
            log.debug("%s: disconnect failed", self.name, exc_info=True)
        self.scheduler = None
        self._bring_up(first=False)


class Engine:
    """The workers and the router (module docstring). ``model``: the shared
    :class:`~ringkv.host.model.Model`; ``handles``: the devices; ``metrics``: a
    :class:`~ringkv.serve.metrics.Metrics`."""

    def __init__(self, model, config, handles, metrics, *, chunk: int = 64,
                 max_queue: int = 16, placement: str = "prefix", max_imbalance: int = 4,
                 max_sessions: int = 256, move_min_tokens: int = 64):
        if placement not in PLACEMENTS:
            raise UsageError(f"placement must be one of {', '.join(PLACEMENTS)}, not "
                             f"{placement!r}", param="--placement")
        if max_queue < 1:
            raise UsageError(f"max_queue must be at least 1, not {max_queue!r}",
                             param="--max-queue")
        from ringkv.defs.hash import hash_seed
        self.model, self.config, self.metrics = model, config, metrics
        self.chunk, self.max_queue, self.placement = chunk, max_queue, placement
        self.max_imbalance, self.max_sessions = max_imbalance, max_sessions
        self.move_min_tokens = move_min_tokens
        self.lock = threading.Lock()
        self.workers = [Worker(self, h, i) for i, h in enumerate(handles)]
        self.hasher = PrefixHasher(hash_seed(config))
        self.pins: dict = {}                # session id -> worker
        self._turn = itertools.count()

    def start(self):
        for w in self.workers:
            w.start()

    def stop(self, timeout: float = 10.0):
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.thread.join(timeout)

    def ready(self) -> list:
        return [w for w in self.workers if w.state == "ready"]

    def wait_ready(self, timeout: float | None = None, all_devices: bool = True) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            n = len(self.ready())
            if n == len(self.workers) or (n and not all_devices):
                return True
            time.sleep(0.02)
        return False

    def _matches(self, job, workers) -> dict:
        """``{worker: (count, key)}``: each device's longest stored prefix of the request."""
        tokens = job.prompt.tokens
        limit = len(tokens) - 1
        if limit < 1:
            return {w: (0, None) for w in workers}
        hashes = self.hasher.hashes(tokens, limit, job.prompt.checkpoints)
        out = {}
        for w in workers:
            with w.lock:
                keys = list(w.index)
            c = max((c for c, h in keys if c <= limit and hashes[c - 1] == h), default=0)
            out[w] = (c, (c, hashes[c - 1]) if c else None)
        return out

    def _choose(self, job, ready):
        open_ = [w for w in ready if w.load < self.max_queue]
        if not open_:
            raise Overloaded(f"all {len(ready)} ready devices have {self.max_queue} requests "
                             f"queued or running", hint="retry later")
        pinned = self.pins.get(job.session) if job.session is not None else None
        if pinned in open_:
            job.predicted = self._matches(job, [pinned])[pinned][0]
            return pinned
        if self.placement == "round-robin":
            n = next(self._turn)
            order = sorted(open_, key=lambda w: (w.number - n) % len(self.workers))
            choice = order[0]
            job.predicted = self._matches(job, [choice])[choice][0]
            return choice
        least = min(open_, key=lambda w: (w.load, len(w.index), w.number))
        if self.placement == "least-loaded":
            job.predicted = self._matches(job, [least])[least][0]
            return least
        matches = self._matches(job, ready)
        holder = max(ready, key=lambda w: (matches[w][0], w in open_, -w.load, -w.number))
        count = matches[holder][0]
        if count and holder in open_ and holder.load - least.load <= self.max_imbalance:
            job.predicted = count
            return holder
        # the device holding the prefix is full or too busy: the least loaded one serves,
        # and gets a copy of the record first when that saves enough prefill
        job.predicted = matches[least][0]
        if holder is not least and self.move_min_tokens and \
                count - matches[least][0] >= self.move_min_tokens:
            job.move = (holder, matches[holder][1])
            job.predicted = count
        return least

    def submit(self, job: Job):
        """Route ``job`` to a device's queue; :class:`Overloaded` or
        :class:`~ringkv.host.errors.DeviceNotReady` when none can take it."""
        job.attempts += 1
        with self.lock:
            ready = self.ready()
            if not ready:
                raise DeviceNotReady("no device is ready (starting or recovering)",
                                     hint="retry in a moment; GET /health shows the devices")
            w = self._choose(job, ready)
            w.load += 1
            job.counted_by = w
            if job.session is not None:
                self.pins[job.session] = w
                while len(self.pins) > self.max_sessions * len(self.workers):
                    self.pins.pop(next(iter(self.pins)))
        self.metrics.device_queue.labels(w.name).set(w.load)
        job.routed = time.perf_counter()
        w.queue.put(job)
        return w

    def resubmit(self, job: Job):
        """Send a job that its device could not serve to another device (or end it with the
        reason none can)."""
        try:
            self.submit(job)
        except RingKVError as e:
            job.sink("error", e)
