"""Many conversations on many devices: a worker per device, a router, an exact index of what
each device holds.

**Workers.** Each device has a :class:`Worker`: a thread in the server that takes requests
from the device's bounded queue, one at a time (a device has one set of rings), and the
device's own process (:mod:`ringkv.serve.worker`) that holds the device, a
:class:`~ringkv.host.scheduler.Scheduler` on it and a copy of the model, and runs each request
there, streaming its tokens back. Devices run in parallel. Processes, not threads: the model
and the software device's core model are numpy code of many small operations that holds the
GIL most of the time, which in the server's process would be taken from the event loop that
parses requests and streams tokens, and from the other devices; the server's thread of a
device only waits on its socket and forwards tokens. The router, the index of each device,
the metrics and the pinned sessions' devices stay in the server's process.

**Conversations find their state by content.** A request carries its whole prompt (that is how
the OpenAI API works). A worker continues the conversation resident in its rings when the
prompt begins with that conversation's whole token stream (the ``continue`` path: nothing to
import); otherwise the request is a new scheduler session, and the scheduler's longest stored
prefix query resumes it from the longest record the device holds: the previous turn's
snapshot, the checkpoint at the message an edit forks at, or the checkpoint at the end of a
system prompt that many conversations share. A request may pin a conversation with a
``session_id``: it then stays one scheduler session (and on one device while that device
serves), an edit of it cut back with the scheduler's ``rewind``.

**Tenants** (a sealed server): a request carries its tenant (:attr:`Job.tenant`, a record key
id); the router hashes its prompt with that tenant's seed (``Engine(seeds=)``, the devices'
own), so it finds only the tenant's records, pins are per tenant and session, and the device's
process runs the request as the tenant's (its scheduler session and every device call).

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
:mod:`ringkv.host.golden.hash` (the device's own): it is read from the device's own listing
at start, after every recovery, and after every request on a software device (whose listing
costs nothing); on a board it follows the exports the worker makes and is read again from the
board's directory whenever the device answers other than the index predicted (a record
evicted by the board's allocator).

**Faults.** An exception from a device (a link dropped, a simulator killed, an error status),
or its process ending, takes the device out of the router; the request it was serving is sent
again to another ready device when none of its tokens has been sent to the client yet (it is
recomputed there from that device's own store), else it ends with an error; requests still
queued on it go to the other devices. The worker then reopens its device (a simulator started
again on its image, a link connected again, the board's power-on recovery waited for; a
process that ended is started again first: an in-memory software device then starts empty),
reads its index from the device's directory and rejoins. A token is only ever computed from
the rings of the conversation it belongs to: each request starts from the device's verified
records or from nothing.

**Overload.** A device runs up to its batch at once (:attr:`Worker.batch`: as many requests
as its hot tier holds conversations, at most ``max_batch``; one on a board today) and at most
``max_queue`` more wait for it; a request for which every ready device is full is refused at
once with :class:`~ringkv.host.errors.Overloaded` (HTTP 429), never queued without bound.
"""

import itertools
import logging
import os
import pickle
import queue
import signal
import subprocess
import threading
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from ringkv.host.errors import DeviceNotReady, LinkError, Overloaded, RingKVError, UsageError
from ringkv.host.golden.hash import ROUND_CONSTANTS
from ringkv.host.model.sampling import SamplingParams

from . import worker as worker_process
from .template import END_OF_MESSAGE, Prompt
from .worker import Cancelled

__all__ = ["Engine", "Worker", "WorkerGone", "Job", "JobResult", "Cancelled", "PLACEMENTS",
           "PrefixHasher"]

log = logging.getLogger(__name__)

#: ``placement=`` choices: by longest stored prefix, by load alone, in turn
PLACEMENTS = ("prefix", "least-loaded", "round-robin")


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
    scheduler_s: float           # time inside Scheduler.request (in the device's process),
    #                              and copying a moving conversation's record
    queue_s: float = 0.0         # time waiting in the device's queue
    #: moments of the request on the host's monotonic clock (``time.perf_counter``, the same
    #: in every process): received, routed, picked (by the device's thread), got (by the
    #: device's process), started and ended (the scheduler), answered (the result back)
    times: dict = field(default_factory=dict)
    #: with ``Job.prompt_logprobs``: each prompt token's TokenLogprob (``None`` first)
    prompt_logprobs: list | None = None


@dataclass
class Job:
    """One request on its way through the engine. ``sink(kind, value)`` receives ``("token",
    (text, info))`` per generated token (``info``: its TokenLogprob with ``logprobs``, else
    ``None``), a last ``("tail", text)`` with the text held back (no token), then ``("done",
    JobResult)`` or ``("error", exception)``; it is called from the worker's thread.
    ``logprobs``: the top tokens to give with each generated one (None: no logprobs);
    ``prompt_logprobs``: the same for every prompt token (``echo``; nothing is reused)."""
    prompt: Prompt
    params: SamplingParams
    sink: object
    chat: bool = False
    session: str | None = None
    tenant: int | None = None    # a sealed server's tenant (the key id the request's API key names)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    received: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    emitted: int = 0
    attempts: int = 0
    predicted: int = 0           # the stored prefix the router expected on its device
    routed: float = 0.0          # when the router queued it
    move: tuple | None = None    # (worker, key): copy that device's record here first
    #: a record copied from another instance (``--valkey``), written to the device first
    record: bytes | None = None
    remote: int = 0              # the prefix it holds (tokens)
    copy_s: float = 0.0          # time reading that record out of its device
    counted_by: object = None    # the worker whose load counts it (Worker._release)
    picked: float = 0.0          # when its device's thread sent it to the device
    queue_s: float = 0.0         # time waiting for its device
    last: float | None = None    # when its last token arrived
    answered: bool = False
    cancel_sent: bool = False

    @property
    def stops(self) -> tuple:
        # ignore_eos: the end of a chat message is the chat's end of text
        eom = self.chat and not self.params.ignore_eos
        return self.params.stop + ((END_OF_MESSAGE,) if eom else ())


_M32 = (1 << 32) - 1
_K0, _K1 = ROUND_CONSTANTS[0] & _M32, ROUND_CONSTANTS[1] & _M32


def _chain(h: int, tokens) -> list:
    """``[h_1 .. h_n]`` after ``tokens`` from state ``h``: :func:`~ringkv.host.golden.hash.
    hash_step` (64 bits, 2 rounds: the device's prefix hash) with its two rounds written out,
    a few times faster in the router, which hashes the tokens of every prompt it places."""
    x, y = h & _M32, h >> 32
    out = []
    for t in tokens:
        y ^= t & _M32
        x = (((((x >> 8) | (x << 24)) & _M32) + y) & _M32) ^ _K0
        y = (((y << 3) | (y >> 29)) & _M32) ^ x
        x = (((((x >> 8) | (x << 24)) & _M32) + y) & _M32) ^ _K1
        y = (((y << 3) | (y >> 29)) & _M32) ^ x
        out.append(x | (y << 32))
    return out


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
        out += _chain(out[-1] if out else self.seed, tokens[start:limit])
        if marks and marks[-1] > start and marks[-1] <= self.budget:
            key = self._key(tokens[:marks[-1]])
            if key not in self.known:
                self.known[key] = tuple(out[:marks[-1]])
                self.held += marks[-1]
            while len(self.known) > self.size or self.held > self.budget:
                self.held -= len(self.known.popitem(last=False)[1])
        return out


#: put in a worker's queue when its device failed (its thread then recovers it)
_FAILED = object()


class WorkerGone(LinkError):
    """The device's process ended (or its socket failed): the process is started again."""


class Worker:
    """A device's thread in the server and its process (see the module docstring).
    ``state``: ``starting``, ``ready`` or ``recovering``; ``index``: the ``(count, hash)`` keys
    of the device's records; ``hot``: those of the conversations resident in its hot tier;
    ``batch``: how many requests the device runs at once; ``info``: the process's ``pid``,
    ``batch`` and ``resident`` and, for a simulated board, its simulator's ``sim_pid``."""

    def __init__(self, engine, handle, number: int):
        self.engine, self.handle, self.number = engine, handle, number
        self.name = handle.name
        self.lock = threading.Lock()
        self.queue: queue.Queue = queue.Queue()
        self.load = 0                      # queued + running
        self.index: set = set()
        self.hot: set = set()
        self.state = "starting"
        self.recoveries = 0
        self.info: dict = {}
        self.proc = None                   # the device's process and its socket
        self.conn = None
        #: held while a command (open, listing, a copy out, disconnect) waits for its answer:
        #: one command at a time, between the requests' messages
        self.device_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._replies: queue.Queue = queue.Queue()
        #: requests on the device: seq -> job; room for more while fewer than ``batch``
        self.jobs: dict = {}
        self.batch = 1
        self._room = threading.Condition()
        self._failure = None               # the device's failure, until it is handled
        self._generation = 0               # of the process and its reader thread
        self._seq = itertools.count()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"ringkv-{self.name}",
                                       daemon=True)

    # -- life ----------------------------------------------------------------------------------
    def start(self):
        self.thread.start()

    def stop(self):
        self._stop.set()
        self.queue.put(None)
        with self._room:
            self._room.notify_all()

    def _start_process(self):
        self._end_process()
        self.proc, self.conn = worker_process.start(self.engine.setup(self.handle))
        self._generation += 1
        self._replies = queue.Queue()
        threading.Thread(target=self._read, args=(self.conn, self._generation, self._replies),
                         name=f"ringkv-{self.name}-reader", daemon=True).start()

    def _end_process(self, grace: float = 10.0):
        """Stop the device's process (it closes its device first), then whatever it started
        that may have outlived it."""
        from ringkv.sim import procs
        proc, conn, sim_pid = self.proc, self.conn, self.info.get("sim_pid")
        self.proc = self.conn = None
        self._generation += 1              # its reader's last words are not news
        if conn is not None:
            try:
                with self._send_lock:
                    conn.send(("stop",))
            except OSError:
                pass
        if proc is not None:
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
            if procs.stop(proc, grace=5) != 0 and sim_pid is not None:
                # it did not end cleanly: its simulator (a session of its own) may be left
                try:
                    os.killpg(sim_pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        if conn is not None:
            conn.close()

    def _send(self, msg):
        try:
            with self._send_lock:
                self.conn.send(msg)
        except (OSError, AttributeError) as e:
            raise self._gone(e) from None

    def _gone(self, e) -> WorkerGone:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
        how = "is gone" if code is None else f"ended with status {code}"
        return WorkerGone(f"the device's process {how} ({type(e).__name__})")

    def _call(self, *command):
        """One command to the device's process and its answer (``device_lock`` held)."""
        replies = self._replies
        self._send(command)
        kind, *answer = replies.get()
        if kind == "error":
            raise answer[0]
        if kind == "gone":
            raise answer[0]
        return answer

    def listing(self) -> list:
        """``(count, hash)`` of every record the device holds, from the device itself."""
        with self.device_lock:
            return self._call("listing")[0]

    def read_record(self, key, timeout: float = 30.0) -> bytes | None:
        """The record ``key`` in the card format, read out of the device between two of its
        steps; None when the device is not ready, busy past ``timeout`` or without it."""
        if self.state != "ready" or not self.device_lock.acquire(timeout=timeout):
            return None
        try:
            if self.state != "ready":
                return None
            return self._call("read_record", key)[0]
        except Exception as e:              # noqa: BLE001 - the asker recomputes
            msg = e.one_line() if isinstance(e, RingKVError) else f"{type(e).__name__}: {e}"
            log.info("%s: record %s not read (%s)", self.name, key, msg)
            return None
        finally:
            self.device_lock.release()

    def record_tokens(self, timeout: float = 30.0) -> dict:
        """``{(count, hash): tokens}`` of the records the device holds, from its directory
        (``{}`` when the device is not ready or busy past ``timeout``)."""
        if self.state != "ready" or not self.device_lock.acquire(timeout=timeout):
            return {}
        try:
            return {tuple(k): (None if t is None else tuple(t))
                    for k, t in self._call("tokens")[0]}
        except Exception as e:              # noqa: BLE001 - the events wait for the next one
            log.info("%s: the records' tokens not read (%s)", self.name, e)
            return {}
        finally:
            self.device_lock.release()

    def _open(self):
        """Open the device in its process (started if needed) and read the index from the
        device's own listing."""
        if self.proc is None or self.proc.poll() is not None:
            self._start_process()
        try:
            keys, self.info = self._call("open")
        except WorkerGone:
            self._end_process()
            raise
        self.batch = max(1, int(self.info.get("batch", 1)))
        self._set_index(keys)
        with self.lock:
            self.hot = set()

    def _set_index(self, keys):
        keys = {tuple(k) for k in keys}
        with self.lock:
            changed, self.index = keys != self.index, keys
        self.engine.metrics.device_records.labels(self.name).set(len(keys))
        if changed:
            self.engine.index_changed()

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
        try:
            with self.device_lock:
                up = self._bring_up(first=True)
            while up and not self._stop.is_set():
                job = self.queue.get()
                if job is None:
                    break
                if job is _FAILED:
                    self._recover()
                    continue
                if job.cancelled.is_set():
                    self._release(job)
                    continue
                with self._room:
                    self._room.wait_for(lambda: len(self.jobs) < self.batch
                                        or self._failure is not None or self._stop.is_set())
                if self._failure is not None or self._stop.is_set():
                    # the device failed meanwhile: the job goes back to be placed again
                    self._release(job)
                    self.engine.resubmit(job)
                    continue
                fetch = time.perf_counter()
                record = job.record if job.record is not None else self._fetch_move(job)
                job.copy_s = time.perf_counter() - fetch
                try:
                    self._dispatch(job, record)
                except WorkerGone as e:
                    self._lost(self._generation, e)
        finally:
            self.state = "stopped"
            with self.device_lock:
                self._end_process()
            self._abandon(DeviceNotReady(f"device {self.name} stopped"))

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
    def _fetch_move(self, job):
        """The record ``job.move`` names, read out of its holder's device (between two of
        the holder's steps), or None: the copy is skipped, and the request recomputes,
        when the holder is down, busy past a bound, or no longer has the record."""
        if job.move is None:
            return None
        holder, key = job.move
        if holder.state != "ready" or not holder.device_lock.acquire(timeout=30):
            return None
        try:
            if holder.state != "ready":
                return None
            return holder._call("read_record", key)[0]
        except Exception as e:              # noqa: BLE001 - the holder's trouble is its own
            msg = e.one_line() if isinstance(e, RingKVError) else f"{type(e).__name__}: {e}"
            log.info("%s: record %s not copied from %s (%s)", self.name, key, holder.name, msg)
            return None
        finally:
            holder.device_lock.release()

    def _dispatch(self, job: Job, record):
        """Send ``job`` to the device's process; its messages come back to :meth:`_read`."""
        # the copy of a moving conversation's record is the devices' time, not the queue's
        job.picked = time.perf_counter()
        seq = next(self._seq)
        spec = {"seq": seq, "tokens": list(job.prompt.tokens),
                "checkpoints": list(job.prompt.checkpoints), "params": job.params,
                "stops": job.stops, "session": job.session, "predicted": job.predicted,
                "move": record, "tenant": job.tenant, "logprobs": job.logprobs,
                "prompt_logprobs": job.prompt_logprobs}
        with self._room:
            self.jobs[seq] = job
        self._send(("serve", spec))

    def _read(self, conn, generation, replies):
        """The device process's messages (a thread per process): requests' tokens and ends go
        to their jobs, answers to commands to :meth:`_call`."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError) as e:
                if generation == self._generation:
                    gone = self._gone(e)
                    replies.put(("gone", gone))
                    self._lost(generation, gone)
                else:
                    replies.put(("gone", WorkerGone("the device's process was stopped")))
                return
            if generation != self._generation:
                continue
            try:
                self._message(msg, replies)
            except Exception:               # noqa: BLE001 - keep reading: log it
                log.exception("%s: message %s not handled", self.name, msg[0])

    def _message(self, msg, replies):
        kind = msg[0]
        metrics = self.engine.metrics
        if kind == "tail":                  # text held back at the end, no token
            _, seq, piece = msg
            job = self.jobs.get(seq)
            if job is not None:
                job.sink("tail", piece)
        elif kind == "token":
            _, seq, piece, info = msg
            job = self.jobs.get(seq)
            if job is None:
                return
            now = time.perf_counter()
            if job.last is None:
                metrics.ttft.observe(now - job.received)
            else:
                metrics.inter_token.observe(now - job.last)
            job.last = now
            job.emitted += 1
            job.sink("token", (piece, info))
            if job.cancelled.is_set() and not job.cancel_sent:
                job.cancel_sent = True
                try:
                    self._send(("cancel", seq))
                except WorkerGone:
                    pass
        elif kind == "export":
            _, key, replaced = msg
            with self.lock:
                self.index.add(key)
                if replaced is not None and replaced != key:
                    self.index.discard(replaced)
            metrics.device_exports.labels(self.name).inc()
            self.engine.index_changed()
        elif kind == "moved":
            _, seq, key = msg
            job = self.jobs.get(seq)
            with self.lock:
                self.index.add(key)
            self.engine.index_changed()
            if job is not None and job.move is not None:
                metrics.device_moves.labels(job.move[0].name, self.name).inc()
            elif job is not None and job.record is not None:
                metrics.cluster_copies.labels("copied").inc()
            log.info("%s: copied record of %d tokens", self.name, key[0])
        elif kind == "done":
            _, seq, fields = msg
            job = self.jobs.get(seq)
            if job is None:
                return
            fields = dict(fields)
            times = {"received": job.received, "routed": job.routed, "picked": job.picked,
                     "got": fields.pop("got", None), "started": fields.pop("started", None),
                     "ended": fields.pop("ended", None), "answered": time.perf_counter()}
            fields["scheduler_s"] += job.copy_s
            # the device's queue: the server's (routed -> picked) and, on a batching device,
            # the wait for the step it arrived during (picked -> got, with the socket's hop)
            job.queue_s = max(0.0, (times["got"] or job.picked) - job.routed - job.copy_s)
            metrics.queue_wait.observe(job.queue_s)
            result = JobResult(**fields, device=self.name, queue_s=job.queue_s, times=times)
            self._account(result)
            self._release(job)
            job.answered = True
            job.sink("done", result)
        elif kind == "end":
            _, seq, keys, hot = msg
            if keys is not None:
                self._set_index(keys)
            else:
                metrics.device_records.labels(self.name).set(len(self.index))
            with self.lock:
                self.hot = {tuple(k) for k in hot}
            metrics.device_resident.labels(self.name).set(len(self.hot))
            self._finished(seq)
        elif kind in ("cancelled", "usage"):
            seq = msg[1]
            job = self.jobs.get(seq)
            if job is not None:
                if kind == "cancelled":
                    log.info("%s: request cancelled by its client", self.name)
                self._release(job)
                job.sink("error", Cancelled() if kind == "cancelled" else msg[2])
            self._finished(seq)
        elif kind == "refused":
            _, seq, exc = msg
            job = self.jobs.get(seq)
            if job is not None:
                self._release(job)
                job.sink("error", DeviceNotReady(
                    f"device {self.name} could not start the request ({type(exc).__name__}: "
                    f"{exc})", hint="see the server's log"))
            self._finished(seq)
        elif kind == "failed":
            self._lost(self._generation, msg[1])
        else:                               # the answer to a command
            replies.put(msg)

    def _finished(self, seq):
        with self._room:
            self.jobs.pop(seq, None)
            self._room.notify_all()

    def _account(self, result):
        m, name, path = self.engine.metrics, self.name, result.path
        m.device_requests.labels(name, path).inc()
        if path in ("hit", "prefix"):
            m.device_hits.labels(name).inc()
        elif path in ("first", "miss"):
            m.device_misses.labels(name).inc()
        elif path == "continue":
            m.device_hot_hits.labels(name).inc()
        if path == "prefix":
            m.device_prefix_hits.labels(name).inc()
        m.tokens_reused.inc(result.reused)
        m.tokens_resident.inc(result.resident)
        m.tokens_prefilled.inc(result.prefilled)
        m.tokens_recomputed.inc(result.recomputed)
        m.scheduler_seconds.observe(result.scheduler_s)

    def _lost(self, generation, exc):
        """The device failed (an error during a step, its process gone): its thread
        recovers it (:meth:`_recover`)."""
        if generation != self._generation:
            return
        with self._room:
            if self._failure is not None:
                return
            self._failure = exc
            self._room.notify_all()
        self.queue.put(_FAILED)

    def _abandon(self, exc):
        """End the requests on the device: each one that sent nothing yet is placed again
        (at most twice), the others end with an error."""
        with self._room:
            jobs, self.jobs = list(self.jobs.values()), {}
            self._room.notify_all()
        msg = exc.one_line() if isinstance(exc, RingKVError) else f"{type(exc).__name__}: {exc}"
        for job in jobs:
            if job.answered:
                continue
            self._release(job)              # before it may count on another device
            if job.emitted == 0 and job.attempts < 2 and not self._stop.is_set():
                self.engine.resubmit(job)
            else:
                job.sink("error", DeviceNotReady(
                    f"device {self.name} failed during the request ({msg}); the tokens sent "
                    f"so far are valid, the rest is lost", hint="send the request again"))

    def _recover(self):
        """The device failed: its requests go elsewhere (or end), the requests queued here go
        to the other devices, then the device is reopened."""
        exc = self._failure
        if exc is None:
            return
        msg = exc.one_line() if isinstance(exc, RingKVError) else f"{type(exc).__name__}: {exc}"
        log.error("%s: device failed (%s); taking it out to recover", self.name, msg)
        self.state = "recovering"
        self.engine.metrics.device_up.labels(self.name).set(0)
        self._abandon(exc)
        moved = []
        while True:
            try:
                queued = self.queue.get_nowait()
            except queue.Empty:
                break
            if queued is None:
                self._stop.set()
                break
            if queued is _FAILED:
                continue
            moved.append(queued)
            queued.counted_by = None
        with self.engine.lock:
            self.load -= len(moved)
        for j in moved:
            self.engine.resubmit(j)
        with self.lock:
            self.hot = set()
        with self.device_lock:
            if isinstance(exc, WorkerGone):
                self._end_process()
            else:
                try:
                    self._call("disconnect")
                except Exception:               # noqa: BLE001 - letting go of a broken device
                    log.debug("%s: disconnect failed; starting its process again", self.name,
                              exc_info=True)
                    self._end_process()
            with self._room:
                self._failure = None
            self._bring_up(first=False)


class Engine:
    """The workers and the router (module docstring). ``model``: the shared
    :class:`~ringkv.host.model.Model`; ``handles``: the devices; ``metrics``: a
    :class:`~ringkv.serve.metrics.Metrics`."""

    def __init__(self, model, config, handles, metrics, *, chunk: int = 64,
                 max_queue: int = 16, placement: str = "prefix", max_imbalance: int = 4,
                 max_sessions: int = 256, move_min_tokens: int = 64, seeds=None,
                 step_tokens: int = 512, max_batch: int | None = None):
        if placement not in PLACEMENTS:
            raise UsageError(f"placement must be one of {', '.join(PLACEMENTS)}, not "
                             f"{placement!r}", param="--placement")
        if max_queue < 0:
            raise UsageError(f"max_queue must be at least 0, not {max_queue!r}",
                             param="--max-queue")
        if max_batch is not None and max_batch < 1:
            raise UsageError(f"max_batch must be at least 1, not {max_batch!r}",
                             param="--max-batch")
        from ringkv.defs.hash import hash_seed
        self.model, self.config, self.metrics = model, config, metrics
        self.chunk, self.max_queue, self.placement = chunk, max_queue, placement
        self.max_imbalance, self.max_sessions = max_imbalance, max_sessions
        self.move_min_tokens = move_min_tokens
        self.step_tokens, self.max_batch = step_tokens, max_batch
        self.lock = threading.Lock()
        self.workers = [Worker(self, h, i) for i, h in enumerate(handles)]
        #: tenant -> the prefix hashes of its prompts (a sealed server: the tenant's key's seed,
        #: ``seeds``; open: the configuration's seed, tenant None)
        seeds = {None: hash_seed(config)} if seeds is None else dict(seeds)
        self.hashers = {t: PrefixHasher(seed) for t, seed in seeds.items()}
        self.pins: dict = {}                # (tenant, session id) -> worker
        #: ``--valkey``: this instance's membership of the cluster (serve/cluster.py)
        self.cluster = None
        #: ``--kv-events``: the KV events publisher (serve/events.py)
        self.events = None
        self._turn = itertools.count()
        self._model_blob = None
        self._blob_lock = threading.Lock()

    def setup(self, handle) -> dict:
        """The first message to a device's process (:mod:`ringkv.serve.worker`)."""
        with self._blob_lock:            # (not the router's lock: the event loop takes that)
            if self._model_blob is None:
                self._model_blob = pickle.dumps(self.model, protocol=pickle.HIGHEST_PROTOCOL)
        return {"handle": handle, "model": self._model_blob, "chunk": self.chunk,
                "step_tokens": self.step_tokens, "max_batch": self.max_batch,
                "max_sessions": self.max_sessions,
                "log_level": logging.getLogger("ringkv").getEffectiveLevel()}

    def start(self):
        for w in self.workers:
            w.start()
        if self.cluster is not None:
            self.cluster.start()
        if self.events is not None:
            self.events.start()

    def index_changed(self):
        """A device's index changed: the cluster and the KV events publish it at once."""
        if self.cluster is not None:
            self.cluster.changed.set()
        if self.events is not None:
            self.events.changed.set()

    def remote(self, prompt, tenant):
        """``(peer, count)``: another instance (``--valkey``) holding at least
        ``move_min_tokens`` more of ``prompt`` than any device here (``peer.keys`` names the
        record and its device), else ``(None, 0)`` (cheap: a lookup in the cluster's copy of
        the index)."""
        cluster = self.cluster
        tokens = prompt.tokens
        limit = len(tokens) - 1
        if cluster is None or not cluster.up or limit < 1 or not self.move_min_tokens:
            return None, 0
        t0 = time.perf_counter()
        hashes = self.hashers[tenant].hashes(tokens, limit, prompt.checkpoints)
        count, peer = cluster.longest(hashes, tenant)
        here = 0
        if count >= self.move_min_tokens:
            for w in self.ready():
                with w.lock:
                    keys = list(w.index | w.hot)
                here = max([here] + [c for c, h in keys if c <= limit and hashes[c - 1] == h])
        self.metrics.cluster_lookup.observe(time.perf_counter() - t0)
        if peer is None or count - here < self.move_min_tokens:
            return None, 0
        return peer, count

    def stop(self, timeout: float = 30.0):
        """Stop the workers: each ends its request, then its device's process (which closes
        its device: a simulator started there is stopped); first this instance's entries in
        the cluster are deleted, so that the others stop routing here."""
        if self.cluster is not None:
            self.cluster.stop()
        if self.events is not None:
            self.events.stop()
        for w in self.workers:
            w.stop()
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.thread.join(max(0.0, deadline - time.monotonic()))

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
        """``{worker: (count, key)}``: each device's longest prefix of the request, stored or
        resident in its hot tier."""
        tokens = job.prompt.tokens
        limit = len(tokens) - 1
        if limit < 1:
            return {w: (0, None) for w in workers}
        hashes = self.hashers[job.tenant].hashes(tokens, limit, job.prompt.checkpoints)
        out = {}
        for w in workers:
            with w.lock:
                keys = list(w.index | w.hot)     # both tiers
            c = max((c for c, h in keys if c <= limit and hashes[c - 1] == h), default=0)
            out[w] = (c, (c, hashes[c - 1]) if c else None)
        return out

    def _choose(self, job, ready):
        open_ = [w for w in ready if w.load < w.batch + self.max_queue]
        if not open_:
            raise Overloaded(f"all {len(ready)} ready devices run as many requests as they "
                             f"batch and have {self.max_queue} more queued",
                             hint="retry later")
        pinned = self.pins.get((job.tenant, job.session)) if job.session is not None else None
        if pinned in open_:
            job.predicted = self._matches(job, [pinned])[pinned][0]
            return pinned
        if self.placement == "round-robin":
            n = next(self._turn)
            order = sorted(open_, key=lambda w: (w.number - n) % len(self.workers))
            choice = order[0]
            job.predicted = self._matches(job, [choice])[choice][0]
            return choice
        # the load a device has beyond what it runs at once (a batching device takes many)
        least = min(open_, key=lambda w: (w.load / w.batch, len(w.index), w.number))
        if job.record is not None:          # copied from another instance: the least loaded
            job.predicted = job.remote
            return least
        if self.placement == "least-loaded":
            job.predicted = self._matches(job, [least])[least][0]
            return least
        matches = self._matches(job, ready)
        # the longest prefix wins; between equals, the device holding it in its hot tier
        holder = max(ready, key=lambda w: (matches[w][0], matches[w][1] in w.hot, w in open_,
                                           -w.load / w.batch, -w.number))
        count = matches[holder][0]
        if count and holder in open_ and \
                (holder.load - holder.batch) - (least.load - least.batch) <= self.max_imbalance:
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
        job.move, job.copy_s = None, 0.0       # (a retry is placed afresh)
        with self.lock:
            ready = self.ready()
            if not ready:
                raise DeviceNotReady("no device is ready (starting or recovering)",
                                     hint="retry in a moment; GET /health shows the devices")
            w = self._choose(job, ready)
            w.load += 1
            job.counted_by = w
            if job.session is not None:
                self.pins[(job.tenant, job.session)] = w
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
