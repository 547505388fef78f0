"""What the command-line tests share (``test_cli_misuse.py``, ``test_cli_keys.py``): running
``ringkv`` as a user does (a subprocess with its own state and temporary folders) and the check
that a failure is clean. A plain module, not a test module: test modules import it, never each
other."""

import os
import subprocess
import sys
from pathlib import Path

from ringkv.defs.config import TRAINED_DEMO_CONFIG

__all__ = ["CFG", "ringkv", "assert_clean_failure", "mentioning", "cli_env"]

CFG = TRAINED_DEMO_CONFIG          # `ringkv sim --config demo`, `ringkv chat --config demo`


def mentioning(token: str) -> list[int]:
    """Processes (other than this one) whose command line or environment mentions
    ``token``: the children a command left behind."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            text = (d / "cmdline").read_bytes() + (d / "environ").read_bytes()
        except OSError:
            continue
        if token.encode() in text:
            found.append(int(d.name))
    return found


def cli_env(tmp: Path) -> dict:
    return {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "TMPDIR": str(tmp / "tmp"),
            "RINGKV_TEST_TAG": str(tmp), "PYTHONWARNINGS": "default"}


def ringkv(args, tmp: Path, *, stdin: str = "", timeout: float = 300.0, env: dict | None = None):
    """``ringkv ARGS`` in ``tmp`` (its state and temporary folders there); ``env``: more
    environment variables."""
    (tmp / "tmp").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "ringkv", *args], input=stdin, text=True,
                          capture_output=True, cwd=tmp, env={**cli_env(tmp), **(env or {})},
                          timeout=timeout)


def assert_clean_failure(r, code: int, tmp: Path, *, message: str | None = None):
    """Exit ``code``, one ``ringkv:`` line (plus at most a hint), no traceback, nothing left
    running."""
    both = r.stdout + r.stderr
    assert "Traceback" not in both, both
    assert r.returncode == code, both
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("ringkv: ")]
    hints = [x for x in lines if x.startswith("  hint: ")]
    assert len(errors) == 1 and len(hints) <= 1, r.stderr
    if message is not None:
        assert message in errors[0], errors[0]
    assert not mentioning(str(tmp)), "a child process was left running"
