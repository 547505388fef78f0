"""The simulated FPGA: ``RingKVTop`` built with Verilator, reachable over a TCP socket.

``ringkv sim`` (:func:`main`) builds the top for a configuration (cached in ``build/``), starts
it under cocotb with the storage port served from an image file, and prints
``socket://127.0.0.1:PORT`` — the URL that :class:`ringkv.host.link.Link` (pyserial's
``serial_for_url``) connects to, exactly as it would open ``/dev/ttyUSB0`` for the board.

:class:`SimDevice` runs the same thing as a child process for scripts and tests: it starts the
simulator, waits for the URL, and ``stop()`` / ``kill()`` end it (``kill`` is a power cut: the
image keeps what was written, sector by sector).
"""

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig, named_config

from .cocotb_run import BUILD_ROOT
from .toolchain import setup_environ
from .verilog import write_verilog

__all__ = ["build_top", "serve", "SimDevice", "main", "TOP_NAME"]

TOP_NAME = "ringkv_top"


def _top(config, top_kwargs):
    from ringkv.hw.top import RingKVTop
    return RingKVTop(config, **top_kwargs)


def _build_dir(config: RingKVConfig, top_kwargs: dict) -> Path:
    key = config.digest().hex()[:12] + "".join(f"_{k}{v}" for k, v in sorted(top_kwargs.items()))
    return BUILD_ROOT / "sim" / key


def build_top(config: RingKVConfig = DEFAULT_CONFIG, **top_kwargs) -> tuple[Path, int]:
    """Verilate the top (skipped when the Verilog is unchanged); return (build dir, sectors)."""
    setup_environ()
    from cocotb_tools.runner import get_runner

    top = _top(config, top_kwargs)
    sectors = top.base_lba + top.regions * top.record_layout.sectors_per_region
    build_dir = _build_dir(config, top_kwargs)
    build_dir.mkdir(parents=True, exist_ok=True)
    # One build at a time per directory: parallel test workers (and a `ringkv sim` started
    # beside a test run) would otherwise verilate into the same files at once.
    with open(build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        source = build_dir / f"{TOP_NAME}.v"
        old = source.read_text() if source.exists() else None
        write_verilog(top, TOP_NAME, source)
        binary = build_dir / TOP_NAME
        if old != source.read_text() or not binary.exists():
            runner = get_runner("verilator")
            runner.build(sources=[source], hdl_toplevel=TOP_NAME, build_dir=build_dir,
                         build_args=["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-O2"],
                         timescale=("1ns", "1ps"), always=True,
                         log_file=build_dir / "verilator-build.log")
    (build_dir / "sectors").write_text(str(sectors))
    return build_dir, sectors


def serve(image, *, config: RingKVConfig = DEFAULT_CONFIG, port: int = 0, once: bool = False,
          prebuilt: bool = False, cut_after: int | None = None, **top_kwargs):
    """Build if needed, then run the simulated device until killed (or one connection).

    ``prebuilt``: the caller has just run :func:`build_top` with the same arguments; skip the
    elaboration (tens of seconds for a large top) and use the build directory as it is.
    ``cut_after``: the power fails after that many bytes written to storage (the sector being
    written is torn, holding the bytes received so far) and the simulator exits at once.
    """
    build_dir = _build_dir(config, top_kwargs)
    if prebuilt and (build_dir / TOP_NAME).exists() and (build_dir / "sectors").exists():
        sectors = int((build_dir / "sectors").read_text())
        setup_environ()
    else:
        build_dir, sectors = build_top(config, **top_kwargs)
    from cocotb_tools.runner import get_runner
    runner = get_runner("verilator")
    env = {"RINGKV_SERVE": json.dumps({"image": str(Path(image).resolve()), "port": port,
                                       "sectors": sectors, "once": once,
                                       "cut_after": cut_after}),
           "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "WARNING")}
    runner.test(hdl_toplevel=TOP_NAME, hdl_toplevel_lang="verilog",
                test_module="ringkv.sim.cocotb_server",
                build_dir=build_dir, test_dir=build_dir / "run", extra_env=env,
                timescale=("1ns", "1ps"))


class SimDevice:
    """A simulated device in a child process (``python -m ringkv.sim.harness``; a subclass
    names another server module with the same command line in ``MODULE``)."""

    MODULE = "ringkv.sim.harness"

    def __init__(self, image, *, config: RingKVConfig = DEFAULT_CONFIG, log=None,
                 startup_timeout: float = 900.0, prebuilt: bool = False,
                 cut_after: int | None = None, server_args=(), **top_kwargs):
        self.image = Path(image)
        self.config = config
        cmd = [sys.executable, "-m", self.MODULE, "--image", str(self.image),
               "--config", json.dumps(config.__dict__), "--top", json.dumps(top_kwargs)]
        if prebuilt:
            cmd.append("--prebuilt")
        if cut_after is not None:
            cmd += ["--cut-after", str(cut_after)]
        cmd += list(server_args)            # the server module's own options
        self.log = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     start_new_session=True)
        self.url = None
        deadline = time.monotonic() + startup_timeout
        for line in self.proc.stdout:
            if line.startswith("RINGKV-SIM listening on "):
                self.url = line.split()[-1]
                break
            if time.monotonic() > deadline:
                break
        if self.url is None:
            self.kill()
            raise RuntimeError(f"the simulator did not start (exit {self.proc.poll()}); "
                               f"see {log or 'its log'}")

    def wait_power_cut(self, timeout: float = 60.0) -> bool:
        """Wait until the simulator has ended by itself (a ``cut_after`` power cut): True if it
        did within ``timeout`` seconds, else False (it is still running)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        self._close_log()
        return True

    def kill(self):
        """Power cut: the process ends at once; the image keeps every completed sector."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
        self.proc.wait()
        self._close_log()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def _close_log(self):
        if self.log not in (None, subprocess.DEVNULL) and not self.log.closed:
            self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="ringkv sim", description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="ringkv.img", help="storage image file (created)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: any free port)")
    parser.add_argument("--config", default=None,
                        help="'default' (the board build's: the default shape in ringkv-fx1c "
                             "with the trained model's scales, TRAINED_CONFIG), 'demo' (the "
                             "demo shape, likewise) or RingKVConfig fields as JSON")
    parser.add_argument("--numerics", default=None,
                        choices=["ringkv-fx1", "ringkv-fx2", "ringkv-fx1c"],
                        help="override the configuration's attention numerics")
    parser.add_argument("--top", default="{}", help="RingKVTop keyword arguments as JSON")
    parser.add_argument("--once", action="store_true", help="exit after one connection")
    parser.add_argument("--prebuilt", action="store_true",
                        help="use the existing Verilator build without re-elaborating")
    parser.add_argument("--cut-after", type=int, default=None, metavar="BYTES",
                        help="power cut after BYTES written to storage (the sector being "
                             "written is torn); the simulator then exits")
    args = parser.parse_args(argv)
    config = named_config(args.config, args.numerics)
    print(f"building the simulated RingKV top (config digest {config.digest().hex()[:16]}) ...",
          file=sys.stderr, flush=True)
    serve(args.image, config=config, port=args.port, once=args.once, prebuilt=args.prebuilt,
          cut_after=args.cut_after, **json.loads(args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
