"""A device's own process: the device, its scheduler and the model, serving the requests the
server's router sends it, one at a time.

Why a process: the model and the software device's attention core model are numpy code of
many small operations, so a request spends most of its time in the interpreter holding the
GIL; in the server's process that time would be taken from the event loop that parses
requests and streams tokens (and from the other devices' workers). In a process of its own
each device computes in parallel with the others and with the HTTP side.

The server starts it with :func:`start` (through :mod:`ringkv.sim.procs`: its own session, so
a Ctrl-C at the terminal reaches only the server, which stops it; registered, so that the
server's exit, SIGTERM or Ctrl-C stops it with its process group) and talks to it over one
socket with :mod:`multiprocessing.connection` (pickled messages). The first message is the
setup (the device's handle, the pickled model, the scheduler's chunk); then one command at a
time, each answered:

* ``("open",)``: open the device (a simulator started, a link connected, a board's recovery
  waited for), a new scheduler on it -> ``("opened", keys, info)``: the device's own listing
  and ``{"pid", "sim_pid"}``;
* ``("serve", spec)``: one request -> ``("token", text, info)`` per generated token
  (``info``: its :class:`~ringkv.host.model.logprobs.TokenLogprob` when the spec asks for
  ``logprobs``, else ``None``), ``("tail", text)`` for the text held back at the end,
  ``("export", key, replaced)`` per record exported, ``("moved", key)`` for a record copied in
  first, then ``("done", result)`` and ``("end", keys)`` (the device's listing when the
  server's index must be read again, else ``None``); or ``("cancelled",)``,
  ``("usage", error)`` (a bad request: the device is fine) or ``("failed", error)`` (the
  device failed: the server takes it out and recovers it);
* ``("cancel", seq)`` (not answered; looked for at each token while a request runs): the
  client of request ``seq`` went away, end it at its next token;
* ``("listing",)``, ``("read_record", key)``, ``("disconnect",)`` (let go of a failed link,
  keep the simulator and its card) -> ``("listing", keys)``, ``("record", data)``, ``("ok",)``;
* ``("stop",)`` or the socket closed (the server gone): close the device (a simulator
  started here is stopped) and end.

Any other failure is answered ``("error", exception)``. Exceptions cross as pickles (the
host's errors pickle whole); one that does not pickle crosses as its type and message.
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

from ringkv.host.errors import UsageError
from ringkv.host.model.sampling import Sampler, SamplingParams
from ringkv.host.scheduler import Scheduler

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
        self.device = self.scheduler = None
        self.pinned: OrderedDict = OrderedDict()   # session id -> None, recent last
        self.cancel = -1                           # the request whose client went away
        self.got = 0.0                             # when the last command was read
        self._sids = itertools.count()

    def send(self, msg):
        self.conn.send(msg)

    def _cancels(self):
        """Read the cancels sent while a request runs (the server sends nothing else
        then)."""
        while self.conn.poll():
            msg = self.conn.recv()
            if msg[0] == "cancel":
                self.cancel = msg[1]

    def run(self):
        try:
            while True:
                try:
                    op, *args = self.conn.recv()
                    self.got = time.perf_counter()
                except (EOFError, OSError):         # the server is gone
                    return
                if op == "stop":
                    return
                if op == "cancel":                  # for a request already ended
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
        device = self.handle.open()
        self.device = _Exporting(device, self)
        self.scheduler = Scheduler(self.model, self.device, chunk=self.chunk)
        self.pinned.clear()
        sim = getattr(self.handle, "sim", None)
        info = {"pid": os.getpid(), "sim_pid": sim.proc.pid if sim is not None else None}
        _warm_up()
        self.send(("opened", self._listing(), info))

    def _op_listing(self):
        self.send(("listing", self._listing()))

    def _op_read_record(self, key):
        self.send(("record", self.device._device.read_record(key)))

    def _op_disconnect(self):
        self.device = self.scheduler = None
        self.handle.disconnect()
        self.send(("ok",))

    def _listing(self) -> list:
        keys = [tuple(k) for k in self.handle.listing(self.device._device)]
        if self.scheduler is not None:
            self.scheduler.checkpoint_keys &= set(keys)
        return keys

    # -- one request ---------------------------------------------------------------------------
    def _place(self, tokens, session, tenant=None):
        """``(sid, tokens to feed, rewind, stream position they start at)`` for a prompt.

        Sessions are the scheduler's: a pinned one under ``session`` (``(tenant, session)``
        for a tenant's: two tenants' same session id are two sessions), the others under a
        number; a prompt without a session continues the resident one only if that is
        anonymous, of the same tenant, and the prompt extends its stream."""
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
        if session is None and sched.resident is not None:
            sid = sched.resident
            stream = sched.sessions[sid].stream
            if isinstance(sid, int) and sched.sessions[sid].tenant == tenant \
                    and len(tokens) > len(stream) and tokens[:len(stream)] == stream:
                return sid, tokens[len(stream):], None, len(stream)
        sid = session if session is not None else next(self._sids)
        return sid, tokens, None, 0

    def _forget_sessions(self, keep):
        """Drop the scheduler's sessions but the resident one and recent pinned ones."""
        sched = self.scheduler
        for sid in [s for s in sched.sessions if isinstance(s, int)]:
            if sid != sched.resident and sid != keep:
                del sched.sessions[sid]
        while len(self.pinned) > self.max_sessions:
            sid, _ = self.pinned.popitem(last=False)
            if sid != sched.resident:
                sched.sessions.pop(sid, None)
        sched.events.clear()

    def _op_serve(self, spec):
        seq, session, tenant = spec["seq"], spec["session"], spec.get("tenant")
        by_tenant = {} if tenant is None else {"tenant": tenant}
        tokens = list(spec["tokens"])
        params = spec["params"]
        text = TextStream(spec["stops"], min_tokens=params.min_tokens,
                          ignore_eos=params.ignore_eos)
        sampler = Sampler(params)
        logprobs, prompt_logprobs = spec.get("logprobs"), spec.get("prompt_logprobs")

        def on_token(token, info=None):
            self._cancels()
            if self.cancel == seq:
                raise Cancelled()
            piece, stopped = text.push(token)
            self.send(("token", piece, info))
            return stopped

        t0 = time.perf_counter()
        try:
            if spec["move"] is not None:
                # the copy may go through the rings (a board replays it into them, exports)
                self.scheduler.resident = None
                new = tuple(self.device._device.write_record(spec["move"], **by_tenant))
                self.send(("moved", new))
            if prompt_logprobs is None:
                sid, feed, rewind, base = self._place(tokens, session, tenant)
            else:       # every prompt token computed: a session of its own, nothing reused
                sid, feed, rewind, base = next(self._sids), tokens, None, 0
            if session is not None:
                self.pinned[sid] = None
                self.pinned.move_to_end(sid)
            marks = [p for p in spec["checkpoints"] if base < p <= len(tokens)]
            out = self.scheduler.request(sid, feed, params.max_tokens,
                                         checkpoints=marks, rewind=rewind, sample=sampler,
                                         on_token=on_token, tenant=tenant, logprobs=logprobs,
                                         prompt_logprobs=prompt_logprobs)
        except Cancelled:
            log.info("%s: request cancelled by its client", self.handle.name)
            self._forget_sessions(None)
            self.send(("cancelled",))
            return
        except UsageError as e:
            self._forget_sessions(None)
            self.send(("usage", portable(e)))
            return
        except Exception as e:                  # noqa: BLE001 - the device failed
            self.send(("failed", portable(e)))
            return
        elapsed = time.perf_counter() - t0
        tail = text.finish()
        if tail:
            self.send(("tail", tail))
        event = self.scheduler.events[-1]
        resident = base if event["path"] == "continue" else 0
        self.send(("done", {
            "tokens": out, "text": text.full_text, "prompt_tokens": len(tokens),
            "finish_reason": "stop" if text.stopped else "length",
            "cached_tokens": min(len(tokens), event["reused"] + resident),
            "reused": event["reused"], "resident": resident, "prefilled": event["prefilled"],
            "recomputed": event["recomputed"], "path": event["path"],
            "prompt_logprobs": event.get("prompt_logprobs"),
            "scheduler_s": elapsed, "got": self.got, "started": t0, "ended": t0 + elapsed}))
        # the answer first, the index after: a software device's listing costs nothing; a
        # board's is read again when it answered other than the index predicted (a record
        # evicted by its allocator)
        if self.handle.kind == "software" or (event["path"] in ("prefix", "first", "miss")
                                              and event["reused"] != spec["predicted"]):
            keys = self._listing()
        else:
            keys = None
        self._forget_sessions(session)
        self.send(("end", keys))


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
