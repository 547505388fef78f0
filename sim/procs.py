"""Child processes, signals and temporary directories of the commands that start simulators
or servers (``ringkv demo``, ``sim``, ``chat``, ``board check``, ``serve``).

Every child is started in its own session (its own process group, :func:`spawn`), so a
Ctrl-C at the terminal reaches only the ``ringkv`` process, which then stops each child it
started with its whole group (the Verilator binary under the cocotb runner included):
SIGTERM, a grace period, then SIGKILL (:func:`stop`). :func:`interruptible` turns SIGTERM
and SIGHUP into the same ``KeyboardInterrupt`` as Ctrl-C and stops every registered child on
the way out, whatever ended the block; an ``atexit`` hook does it once more for a process
that ends otherwise. :func:`temp_dir` is a temporary directory removed on the way out (kept
when the caller asks, e.g. ``--workdir``).

Standard library only; any layer that may import ``ringkv.sim`` (and the ``ringkv`` command
line) uses it.
"""

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

__all__ = ["spawn", "stop", "stop_all", "children", "interruptible", "temp_dir"]

log = logging.getLogger(__name__)

_children: set[subprocess.Popen] = set()
_lock = threading.Lock()


def spawn(cmd, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)`` in a new session (its own process group), registered
    so that :func:`stop_all` (Ctrl-C, SIGTERM, exit) stops it."""
    proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    with _lock:
        _children.add(proc)
    return proc


def children() -> list[subprocess.Popen]:
    """The registered children still running."""
    with _lock:
        return [p for p in _children if p.poll() is None]


def stop(proc: subprocess.Popen, *, grace: float = 5.0, sig: int = signal.SIGTERM) -> int:
    """Stop ``proc`` and its process group: ``sig`` (SIGTERM), then SIGKILL after ``grace``
    seconds. Returns its exit status; unregisters it."""
    if proc.poll() is None:
        _signal_group(proc, sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    else:                               # its group may outlive it (a grandchild)
        _signal_group(proc, signal.SIGKILL)
    with _lock:
        _children.discard(proc)
    return proc.returncode


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)        # pgid == pid: the child leads its own session
    except (ProcessLookupError, PermissionError):
        pass


def stop_all(grace: float = 5.0, *, keep=frozenset()) -> None:
    """Stop every registered child but those in ``keep`` (all at once, then each waited
    for)."""
    with _lock:
        procs = [p for p in _children if p not in keep]
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    for p in procs:
        stop(p, grace=grace)


atexit.register(stop_all)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def interruptible():
    """Within the block SIGTERM and SIGHUP raise ``KeyboardInterrupt`` (as SIGINT does); on
    leaving it, however it ends, every child started by :func:`spawn` within the block is
    stopped (those started before it are the caller's). A second signal during that cleanup
    is ignored, so the cleanup finishes. Only the main thread may install handlers; elsewhere
    the block only cleans up."""
    with _lock:
        before = frozenset(_children)
    main = threading.current_thread() is threading.main_thread()
    old = {}
    if main:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, _raise_interrupt)
    try:
        yield
    finally:
        if main:
            sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
            for sig in old:
                signal.signal(sig, signal.SIG_IGN)
        try:
            stop_all(keep=before)
        finally:
            if main:
                signal.signal(signal.SIGINT, sigint)
                for sig, handler in old.items():
                    signal.signal(sig, handler)


@contextlib.contextmanager
def temp_dir(prefix: str = "ringkv-", keep: str | os.PathLike | None = None):
    """A working directory: ``keep`` (created if needed, never removed) or a new temporary
    directory that is removed on leaving the block, however it ends."""
    if keep is not None:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        log.debug("removed %s", path)
