"""A device's own process: the device, its batching scheduler and the model, serving every
request the server's router sends it, many at once.

Why a process: the model and the software device's attention core model are numpy code of
many small operations, so a request spends most of its time in the interpreter holding the
GIL; in the server's process that time would be taken from the event loop that parses
requests and streams tokens (and from the other devices' workers). In a process of its own
each device computes in parallel with the others and with the HTTP side.

The process runs a :class:`~ringkv.host.batch.BatchScheduler` on its device: requests join
it as they arrive and leave it as they end, and every step advances all of them (one token
for each decoding request, prefill chunks under the step's token budget). Between two steps
it reads what the server sent; with nothing running it waits for it.

The server starts it with :func:`start` (through :mod:`ringkv.sim.procs`: its own session, so
a Ctrl-C at the terminal reaches only the server, which stops it; registered, so that the
server's exit, SIGTERM or Ctrl-C stops it with its process group) and talks to it over one
socket with :mod:`multiprocessing.connection` (pickled messages). The first message is the
setup (the device's handle, the pickled model, the scheduler's chunk, step budget and batch
bound); then:

* ``("open",)``: open the device (a simulator started, a link connected, a board's recovery
  waited for), a new scheduler on it -> ``("opened", keys, info)``: the device's own listing
  and ``{"pid", "sim_pid", "batch", "resident"}`` (how many requests it runs at once, how
  many conversations it holds);
* ``("serve", spec)``: a request (``spec["seq"]`` names it), answered as it runs by
  ``("token", seq, text, info)`` per generated token (``info``: its
  :class:`~ringkv.host.model.logprobs.TokenLogprob` when the spec asks for ``logprobs``, else
  ``None``), ``("tail", seq, text)`` for the text held back at the end, ``("export", key,
  replaced)`` per record
  exported, ``("moved", seq, key)`` for a record copied in first, then ``("done", seq,
  result)`` and ``("end", seq, keys, hot)`` (the device's listing when the server's index must
  be read again, else ``None``; the keys of the conversations resident in the hot tier); or
  ``("cancelled", seq)``, ``("usage", seq, error)`` (a bad request: the device is fine),
  ``("refused", seq, error)`` (the request could not start: a fault of this server, logged);
* ``("cancel", seq)`` (not answered): the client of request ``seq`` went away, end it at the
  next step;
* ``("listing",)``, ``("tokens",)``, ``("read_record", key)``, ``("disconnect",)`` (let go
  of a failed link, keep the simulator and its card) -> ``("listing", keys)``, ``("tokens",
  [(key, tokens)])`` (the records' tokens, from the device's directory), ``("record", data)``,
  ``("ok",)``,
  answered between two steps;
* ``("stop",)`` or the socket closed (the server gone): close the device (a simulator started
  here is stopped) and end.

A failure of the device during a step ends every running request: ``("failed", error)`` (the
server takes the device out and recovers it). Any other failure of a command is answered
``("error", exception)``. Exceptions cross as pickles (the host's errors pickle whole); one
that does not pickle crosses as its type and message.
"""

import gc
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from multiprocessing.connection import Connection

from ringkv.host.batch import BatchScheduler
from ringkv.host.errors import RingKVError, UsageError
from ringkv.host.model.sampling import Sampler, SamplingParams

from .template import TextStream

__all__ = ["start", "main", "Cancelled", "LOG_FORMAT"]

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"



class Cancelled(Exception):
    """The client went away: the request ends where it is."""


def start(setup: dict):
    """Start a device process: ``(process, connection)``; ``setup`` is its first message
    (``handle``, ``model`` (pickled), ``chunk``, ``max_sessions``, ``log_level``)."""
    from ringkv.sim import procs
    ours, theirs = socket.socketpair()
    try:
        cmd = [sys.executable, "-c", "import sys; from ringkv.serve.worker import main; "
               "sys.exit(main(sys.argv[1:]))", str(theirs.fileno())]
        proc = procs.spawn(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    try:
        conn.send(setup)
    except OSError:
        pass                  # it ended at once: the first command finds the socket closed
    return proc, conn


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a ``RuntimeError`` with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:                    # noqa: BLE001 - any failure to pickle
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _warm_up():
    """What a request's setup does for the first time in the process, done once here: numpy's
    random generator (a sampler's) costs milliseconds at its first use and microseconds
    after."""
    Sampler(SamplingParams(temperature=1.0, seed=0))([0.0, 0.0])
    TextStream(("\n\n",)).push(65)


class _Exporting:
    """The device as the scheduler sees it, telling the server each record it exports (its
    index follows)."""

    def __init__(self, device, server):
        self._device, self._server = device, server

    def __getattr__(self, name):
        return getattr(self._device, name)

    def export(self, tokens, replaces=None, *, checkpoint=False, **tenant):
        key, moved = self._device.export(tokens, replaces, checkpoint=checkpoint, **tenant)
        self._server.send(("export", tuple(key),
                           None if replaces is None else tuple(replaces)))
        return key, moved


class DeviceServer:
    """The process's loop (module docstring)."""

    def __init__(self, conn, setup):
        self.conn = conn
        self.handle = setup["handle"]
        self.model = pickle.loads(setup["model"])
        self.chunk, self.max_sessions = setup["chunk"], setup["max_sessions"]
        self.step_tokens = setup.get("step_tokens", 512)
        self.max_batch = setup.get("max_batch")
        self.device = self.scheduler = None
        self.pinned: OrderedDict = OrderedDict()   # session id -> None, recent last
        self.live: dict = {}                       # seq -> (Request, spec, TextStream, times)
        self._sids = itertools.count()

    def send(self, msg):
        self.conn.send(msg)

    def run(self):
        try:
            while True:
                busy = self.scheduler is not None and self.scheduler.busy
                try:
                    if busy and not self.conn.poll():
                        self._step()
                        continue
                    op, *args = self.conn.recv()
                    got = time.perf_counter()
                except (EOFError, OSError):         # the server is gone
                    return
                if op == "stop":
                    return
                if op == "cancel":
                    self._cancel(*args)
                    continue
                if op == "serve":
                    try:
                        self._serve(args[0], got)
                    except Exception as e:      # noqa: BLE001 - that request's end, not a reply
                        log.exception("%s: request not started", self.handle.name)
                        self.send(("refused", args[0]["seq"], portable(e)))
                    continue
                try:
                    getattr(self, "_op_" + op)(*args)
                except Exception as e:          # noqa: BLE001 - the server decides
                    self.send(("error", portable(e)))
        finally:
            self.handle.close()

    # -- commands ------------------------------------------------------------------------------
    def _op_open(self):
        self.device = self.scheduler = None
        self.live.clear()
        device = self.handle.open()
        self.device = _Exporting(device, self)
        self.scheduler = BatchScheduler(self.model, self.device, chunk=self.chunk,
                                        step_tokens=self.step_tokens, max_batch=self.max_batch)
        self.pinned.clear()
        sim = getattr(self.handle, "sim", None)
        info = {"pid": os.getpid(), "sim_pid": sim.proc.pid if sim is not None else None,
                "batch": self.scheduler.max_batch, "resident": device.resident_limit}
        _warm_up()
        self.send(("opened", self._listing(), info))

    def _op_listing(self):
        self.send(("listing", self._listing()))

    def _op_tokens(self):
        try:
            held = self.device._device.holdings(tokens=True)
        except NotImplementedError:
            held = []
        self.send(("tokens", [(h.key, h.tokens) for h in held]))

    def _op_read_record(self, key):
        self.send(("record", self.device._device.read_record(key)))

    def _op_disconnect(self):
        self.device = self.scheduler = None
        self.live.clear()
        self.handle.disconnect()
        self.send(("ok",))

    def _listing(self) -> list:
        keys = [tuple(k) for k in self.handle.listing(self.device._device)]
        if self.scheduler is not None:
            self.scheduler.checkpoint_keys &= set(keys)
        return keys

    def _hot(self) -> list:
        """The keys of the conversations resident in the hot tier (their last turn's
        record: the rings hold exactly its tokens)."""
        sched = self.scheduler
        return [sched.sessions[sid].key for sid in sched.idle
                if sid in sched.sessions and sched.sessions[sid].key is not None
                and not sched.sessions[sid].dirty]

    # -- requests ------------------------------------------------------------------------------
    def _place(self, tokens, session, tenant=None):
        """``(sid, tokens to feed, rewind, stream position they start at)`` for a prompt.

        Sessions are the scheduler's: a pinned one under ``session`` (``(tenant, session)``
        for a tenant's: two tenants' same session id are two sessions), the others under a
        number; a prompt without a session continues the anonymous conversation of the same
        tenant, resident in the hot tier and not running, whose whole stream it extends (the
        longest such), else it is a new session (resumed from the store by the scheduler)."""
        sched = self.scheduler
        if session is not None and tenant is not None:
            session = (tenant, session)
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
        if session is None:
            best, size = None, -1
            for sid in sched.idle:
                s = sched.sessions.get(sid)
                if s is None or not isinstance(sid, int) or s.tenant != tenant:
                    continue
                n = len(s.tokens) + len(s.pending)
                if size < n < len(tokens) and tokens[:n] == s.stream:
                    best, size = sid, n
            if best is not None:
                return best, tokens[size:], None, size
        sid = session if session is not None else next(self._sids)
        return sid, tokens, None, 0

    def _forget_sessions(self):
        """Drop the sessions neither resident, running nor pinned recently."""
        sched = self.scheduler
        busy = {r.sid for r in sched.running} | {r.sid for r in sched.waiting}
        for sid in [s for s in sched.sessions if isinstance(s, int)]:
            if sid not in sched.where and sid not in busy:
                del sched.sessions[sid]
        while len(self.pinned) > self.max_sessions:
            sid, _ = self.pinned.popitem(last=False)
            if sid not in sched.where and sid not in busy:
                sched.sessions.pop(sid, None)
        sched.events.clear()

    def _serve(self, spec, got):
        seq, session, tenant = spec["seq"], spec["session"], spec.get("tenant")
        by_tenant = {} if tenant is None else {"tenant": tenant}
        tokens = list(spec["tokens"])
        params = spec["params"]
        text = TextStream(spec["stops"], min_tokens=params.min_tokens,
                          ignore_eos=params.ignore_eos)
        sampler = Sampler(params)
        logprobs, prompt_logprobs = spec.get("logprobs"), spec.get("prompt_logprobs")
        if spec["move"] is not None:
            # a board replays a copied record through its one set of rings: none of its
            # conversations stays resident (the software device writes only its store)
            if self.device.resident_limit == 1:
                self.scheduler.resident = None
            try:
                new = tuple(self.device._device.write_record(spec["move"], **by_tenant))
            except (RingKVError, ValueError) as e:
                # the copy only saves prefill: without it the request recomputes
                log.warning("%s: copied record refused (%s); the request recomputes",
                            self.handle.name, e)
            else:
                self.send(("moved", seq, new))
        if prompt_logprobs is None:
            sid, feed, rewind, base = self._place(tokens, session, tenant)
        else:       # every prompt token computed: a session of its own, nothing reused
            sid, feed, rewind, base = next(self._sids), tokens, None, 0
        if session is not None:
            self.pinned[sid] = None
            self.pinned.move_to_end(sid)
        marks = [p for p in spec["checkpoints"] if base < p <= len(tokens)]

        def on_token(token, info=None):
            piece, stopped = text.push(token)
            self.send(("token", seq, piece, info))
            return stopped

        req = self.scheduler.submit(sid, feed, params.max_tokens, checkpoints=marks,
                                    rewind=rewind, sample=sampler, on_token=on_token,
                                    on_done=self._done, tenant=tenant, logprobs=logprobs,
                                    prompt_logprobs=prompt_logprobs)
        self.live[id(req)] = (seq, spec, text, got, base)

    def _cancel(self, seq):
        for req in list(self.scheduler.running if self.scheduler else ()) + \
                list(self.scheduler.waiting if self.scheduler else ()):
            entry = self.live.get(id(req))
            if entry is not None and entry[0] == seq:
                req.cancel(Cancelled())

    def _step(self):
        try:
            self.scheduler.step()
        except Exception as e:                  # noqa: BLE001 - the device failed
            # every running request ended (the scheduler rolled each back): the server
            # resends or ends them, and the queued ones, and recovers the device
            log.error("%s: the device failed during a step: %s", self.handle.name, e)
            self.scheduler.waiting.clear()
            self.live.clear()
            self.send(("failed", portable(e)))

    def _done(self, req):
        entry = self.live.pop(id(req), None)
        if entry is None:
            return
        seq, spec, text, got, base = entry
        ended = time.perf_counter()
        started = req.started or got
        if req.state == "failed":
            if isinstance(req.error, Cancelled):
                log.info("%s: request cancelled by its client", self.handle.name)
                self.send(("cancelled", seq))
            elif isinstance(req.error, (UsageError, ValueError)):
                self.send(("usage", seq, portable(UsageError(str(req.error)) if isinstance(
                    req.error, ValueError) else req.error)))
            else:
                # a device failure: the step raises it next; the request's own end is
                # reported with the failure
                pass
            self._forget_sessions()
            return
        tail = text.finish()
        if tail:
            self.send(("tail", seq, tail))
        event = req.event
        resident = base if event["path"] == "continue" else 0
        tokens = spec["tokens"]
        self.send(("done", seq, {
            "tokens": req.out, "text": text.full_text, "prompt_tokens": len(tokens),
            "finish_reason": "stop" if text.stopped else "length",
            "cached_tokens": min(len(tokens), event["reused"] + resident),
            "reused": event["reused"], "resident": resident, "prefilled": event["prefilled"],
            "recomputed": event["recomputed"], "path": event["path"],
            "prompt_logprobs": event.get("prompt_logprobs"),
            "scheduler_s": ended - got, "got": got, "started": started, "ended": ended}))
        # the answer first, the index after: a software device's listing costs little; a
        # board's is read again when it answered other than the index predicted (a record
        # evicted by its allocator)
        if self.handle.kind == "software" or (event["path"] in ("prefix", "first", "miss")
                                              and event["reused"] != spec["predicted"]):
            keys = self._listing()
        else:
            keys = None
        self._forget_sessions()
        self.send(("end", seq, keys, self._hot()))


def main(argv=None) -> int:
    """The process's entry point: ``argv[0]`` is the socket's file descriptor."""
    # a Ctrl-C at the terminal is the server's to handle: it stops this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    argv = sys.argv[1:] if argv is None else argv
    conn = Connection(int(argv[0]))
    try:
        setup = conn.recv()
    except (EOFError, OSError):
        return 1
    logging.basicConfig(level=setup["log_level"], format=LOG_FORMAT)
    from ringkv.sim import procs
    try:
        with procs.interruptible():        # SIGTERM: a simulator started here is stopped
            server = DeviceServer(conn, setup)
            # the modules and the model stay: out of the cyclic collector's way (a full
            # collection over them pauses a request for tens of milliseconds)
            gc.freeze()
            server.run()
    except KeyboardInterrupt:
        return 130
    return 0
