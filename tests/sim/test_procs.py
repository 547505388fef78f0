"""ringkv.sim.procs: children stopped with their process group, signals, temporary dirs."""

import os
import signal
import subprocess
import sys
import time

import pytest

from ringkv.sim import procs

SLEEPER = [sys.executable, "-c", "import subprocess, sys, time; "
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
           "time.sleep(60)"]


def _group_gone(pgid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_interruptible_stops_its_children_and_their_groups_only():
    outer = procs.spawn(SLEEPER)
    try:
        with procs.interruptible():
            inner = procs.spawn(SLEEPER)
            assert os.getpgid(inner.pid) == inner.pid != os.getpgid(0)
        assert inner.poll() is not None and _group_gone(inner.pid)   # grandchild too
        assert outer.poll() is None and outer in procs.children()
    finally:
        procs.stop(outer)
    assert _group_gone(outer.pid) and outer not in procs.children()


def test_sigterm_becomes_keyboard_interrupt_and_cleans_up(tmp_path):
    # the handler that was there before (SIG_DFL in a plain run; coverage.py's own under
    # `make coverage`, which saves its data on SIGTERM) is the one put back
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with procs.interruptible(), procs.temp_dir("ringkv-test-") as work:
            child = procs.spawn(SLEEPER)
            (work / "f").write_text("x")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)                       # interrupted before this ends
    assert not work.exists()
    assert child.poll() is not None and _group_gone(child.pid)
    assert signal.getsignal(signal.SIGTERM) is before


def test_temp_dir_keeps_a_given_directory(tmp_path):
    with procs.temp_dir(keep=tmp_path / "keep") as work:
        (work / "f").write_text("x")
    assert (tmp_path / "keep" / "f").exists()


def test_stop_kills_what_ignores_sigterm():
    proc = procs.spawn([sys.executable, "-c", "import signal, time; "
                        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
                        "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    assert procs.stop(proc, grace=0.5) == -signal.SIGKILL
    proc.stdout.close()
