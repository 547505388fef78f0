"""The simulated FPGA: ``RingKVTop`` built with Verilator, reachable over a TCP socket.

``ringkv sim`` (:func:`main`) builds the top for a configuration (cached in ``build/``), starts
it under cocotb with the storage port served from an image file, and prints
``socket://127.0.0.1:PORT`` — the URL that :class:`ringkv.host.device.link.Link` (pyserial's
``serial_for_url``) connects to, exactly as it would open ``/dev/ttyUSB0`` for the board.
``--sealed`` (``sealed=True`` here) builds the sealed top (``RingKVTop(sealed=True)``: key
slots, tenant slots, the record MAC; docs/blocks/mac.md), a build of its own. ``--sdram
[PART]`` (``tier=`` in ``--top``) builds the top with its SDRAM hot tier
(``RingKVTop(tier=...)``, docs/blocks/tiered_storage.md), a build of its own: the card is still
the image file, and the SDRAM is served at the sector level, one byte per clock, from memory
(lost when the simulator stops, as the SDRAM's contents at a power cut; the pin-level SDRAM
model and controller run in the Amaranth and cocotb tests of the SDRAM blocks, not here: a
Python call per clock would hold up the event-driven server).

:class:`SimDevice` runs the same thing as a child process for scripts and tests: it starts the
simulator, waits for the URL, and ``stop()`` / ``kill()`` end it (``kill`` is a power cut: the
image keeps what was written, sector by sector).
"""

import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from ringkv.defs.checks import check_type
from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig, named_config
from ringkv.defs.record import SECTOR
from ringkv.host.errors import (
    ArgumentParser,
    ConfigError,
    LinkError,
    NotACardImage,
    RingKVError,
    UsageError,
    run_main,
)

from . import procs
from .cocotb_run import BUILD_ROOT
from .toolchain import setup_environ
from .verilog import write_verilog

__all__ = ["build_top", "serve", "SimDevice", "main", "TOP_NAME", "DEMO_TOP", "build_key",
           "check_image", "check_port", "check_cut_after", "progress", "sources_digest",
           "top_parameters", "sdram_sectors"]

log = logging.getLogger(__name__)

TOP_NAME = "ringkv_top"
#: ``RingKVTop`` parameters of the demo's simulated devices (``make demo``), which ``ringkv sim
#: --config demo`` uses too (so it reuses the demo's build): a 2-region store, so that the
#: allocator must evict, 4 lanes of 8 MACs.
DEMO_TOP = {"regions": 2, "lanes": 4, "macs": 8}
#: Verilator's options for the top; part of the build key.
BUILD_ARGS = ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-O2"]


def top_parameters(top_kwargs: dict, sealed: bool = False) -> dict:
    """``top_kwargs`` with ``sealed`` folded in: ``{..., "sealed": True}`` for a sealed top,
    no ``sealed`` entry for an open one (so that ``sealed=False`` and an open ``top_kwargs``
    name the same build). Raises ``TypeError`` for a ``sealed`` that is not a bool and
    ``ValueError`` when ``sealed=True`` meets ``top_kwargs["sealed"]`` false."""
    check_type("sealed", sealed, bool)
    kw = dict(top_kwargs)
    if "sealed" in kw:
        check_type("top_kwargs' sealed", kw["sealed"], bool)
        if sealed and not kw["sealed"]:
            raise ValueError('sealed=True contradicts top_kwargs["sealed"]=False')
        sealed = kw.pop("sealed")
    if sealed:
        kw["sealed"] = True
    return kw


def _top(config, top_kwargs):
    from ringkv.hw.top import RingKVTop
    return RingKVTop(config, **top_kwargs)


def sources_digest(packages=("ringkv.hw", "ringkv.defs"), files=(),
                    dists=("amaranth", "verilator", "cocotb")) -> str:
    """Digest of every source a model's Verilog comes from (the modules of ``packages``, by
    default ``ringkv.hw`` and ``ringkv.defs``, and the files ``files``) and of the tool
    versions that turn it into a model (the distributions ``dists``)."""
    import importlib
    from importlib.metadata import PackageNotFoundError, version
    h = hashlib.blake2b(digest_size=16)
    for name in packages:
        folder = Path(importlib.import_module(name).__file__).parent
        for f in sorted(folder.glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    for f in files:
        h.update(Path(f).name.encode() + b"\0" + Path(f).read_bytes())
    for dist in dists:
        try:
            h.update(f"{dist}={version(dist)};".encode())
        except PackageNotFoundError:
            h.update(f"{dist}=none;".encode())
    return h.hexdigest()


def build_key(config: RingKVConfig, top_kwargs: dict) -> str:
    """The build cache's key: everything that determines the simulated model -- the
    configuration, the top's parameters, the gateware sources, the tool versions and the
    Verilator options. A build with the same key is reused as it is, without elaborating."""
    recipe = json.dumps({"config": config.canonical().decode(), "top": top_kwargs,
                         "sources": sources_digest(), "args": BUILD_ARGS, "name": TOP_NAME},
                        sort_keys=True)
    return hashlib.blake2b(recipe.encode(), digest_size=8).hexdigest()


def _build_dir(config: RingKVConfig, top_kwargs: dict) -> Path:
    return BUILD_ROOT / "sim" / build_key(config, top_kwargs)


@contextmanager
def progress(what: str, every: float = 10.0):
    """Log ``what`` at the start, then its elapsed time every ``every`` seconds until the
    block ends, and the total at the end (``ringkv`` shows INFO messages by default; ``-q``
    hides them)."""
    started = time.monotonic()
    done = threading.Event()
    log.info("%s ...", what)

    def tick():
        while not done.wait(every):
            log.info("%s ... %.0f s", what, time.monotonic() - started)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    log.info("%s: done in %.0f s", what, time.monotonic() - started)


def build_top(config: RingKVConfig = DEFAULT_CONFIG, *, sealed: bool = False,
              **top_kwargs) -> tuple[Path, int]:
    """Verilate the top unless the build cache holds it (:func:`build_key`); return (build
    dir, sectors). ``sealed``: the sealed top (:func:`top_parameters`; part of the build
    key, a build of its own)."""
    top_kwargs = top_parameters(top_kwargs, sealed)
    setup_environ()
    build_dir = _build_dir(config, top_kwargs)
    build_dir.mkdir(parents=True, exist_ok=True)
    # One build at a time per directory: parallel test workers (and a `ringkv sim` started
    # beside a test run) would otherwise verilate into the same files at once.
    import fcntl
    with open(build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        binary, stamp = build_dir / TOP_NAME, build_dir / "sectors"
        if binary.exists() and stamp.exists():
            log.debug("reusing the simulated top built in %s", build_dir)
            return build_dir, int(stamp.read_text())
        from cocotb_tools.runner import get_runner
        tag = f"config {config.digest().hex()[:8]}" + "".join(
            f", {k} {v}" for k, v in sorted(top_kwargs.items()))
        with progress(f"building the simulated RingKV top ({tag}): elaborating (Amaranth)"):
            top = _top(config, top_kwargs)
            sectors = top.base_lba + top.regions * top.record_layout.sectors_per_region
            source = build_dir / f"{TOP_NAME}.v"
            write_verilog(top, TOP_NAME, source)
        with progress("building the simulated RingKV top: Verilator and the C++ compiler "
                      f"(log: {build_dir / 'verilator-build.log'})"):
            runner = get_runner("verilator")
            try:
                runner.build(sources=[source], hdl_toplevel=TOP_NAME, build_dir=build_dir,
                             build_args=BUILD_ARGS, timescale=("1ns", "1ps"), always=True,
                             log_file=build_dir / "verilator-build.log")
            except RuntimeError as e:
                raise RingKVError(f"the Verilator build failed ({e})",
                                  hint=f"see {build_dir / 'verilator-build.log'}") from None
        stamp.write_text(str(sectors))
    return build_dir, sectors


def _tier(config: RingKVConfig, top_kwargs: dict) -> dict | None:
    """The top's hot tier (``tier`` of ``top_kwargs``) resolved, without elaborating
    (:func:`ringkv.defs.hot_tier.tier_parameters`); None without one."""
    tier = top_kwargs.get("tier")
    if tier is None:
        return None
    from ringkv.defs.hot_tier import tier_parameters
    from ringkv.defs.record import RecordLayout
    regions = top_kwargs.get("regions", _sectors_defaults()["regions"])
    params = {k: v for k, v in tier.items() if k != "_bug"}
    return tier_parameters(RecordLayout(config), regions, **params)


def sdram_sectors(config: RingKVConfig, top_kwargs: dict) -> int:
    """Sectors of SDRAM the top's hot tier uses (``tier`` of ``top_kwargs``), 0 without one."""
    tier = _tier(config, top_kwargs)
    return 0 if tier is None else tier["sdram_sectors"]


def serve(image, *, config: RingKVConfig = DEFAULT_CONFIG, port: int = 0, once: bool = False,
          prebuilt: bool = False, cut_after: int | None = None, sealed: bool = False,
          **top_kwargs):
    """Build if needed, then run the simulated device until killed (or one connection).

    ``prebuilt``: kept for callers that have just run :func:`build_top` (the build cache makes
    every call after the first one fast anyway).
    ``cut_after``: the power fails after that many bytes written to storage (the sector being
    written is torn, holding the bytes received so far) and the simulator exits at once.
    ``sealed``: the sealed top (:func:`build_top`).
    Raises :class:`~ringkv.host.errors.RingKVError` when the simulator stops with an error
    (it cannot listen on ``port``, the image cannot be used).
    """
    build_dir, sectors = build_top(config, sealed=sealed, **top_kwargs)
    from cocotb_tools.runner import get_runner
    runner = get_runner("verilator")
    env = {"RINGKV_SERVE": json.dumps({"image": str(Path(image).resolve()), "port": port,
                                       "sectors": sectors, "once": once,
                                       "cut_after": cut_after,
                                       "sdram_sectors": sdram_sectors(config, top_kwargs)}),
           "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "WARNING"),
           "GPI_LOG_LEVEL": os.environ.get("GPI_LOG_LEVEL", "WARNING")}
    try:
        runner.test(hdl_toplevel=TOP_NAME, hdl_toplevel_lang="verilog",
                    test_module="ringkv.sim.cocotb_server",
                    build_dir=build_dir, test_dir=build_dir / "run", extra_env=env,
                    timescale=("1ns", "1ps"))
    except RuntimeError as e:           # the simulator exited non-zero
        from .cocotb_server import LISTEN_FAILED_EXIT, POWER_CUT_EXIT
        if f"return code: {POWER_CUT_EXIT}" in str(e):
            return
        if f"return code: {LISTEN_FAILED_EXIT}" in str(e):
            raise LinkError(f"the simulator cannot listen on 127.0.0.1:{port}",
                            hint="choose another --port, or --port 0 for any free port") \
                from None
        raise RingKVError(f"the simulator stopped: {e}") from None


def check_cut_after(cut_after: int | None) -> None:
    """Refuse a negative ``--cut-after`` (0: the power fails at the first byte written)."""
    if cut_after is not None and cut_after < 0:
        raise UsageError(f"--cut-after must be 0 or more bytes, not {cut_after}",
                         param="cut_after")


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """Raise :class:`~ringkv.host.errors.LinkError` when ``host:port`` cannot be listened on
    (in use, not allowed), before anything is built; port 0 (any free port) always can."""
    if port == 0:
        return
    if not 0 < port < 65536:
        raise UsageError(f"--port must be 0..65535, not {port}", param="port")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise LinkError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                            hint="choose another --port, or --port 0 for any free port") \
                from None


def _foreign_header_sector(sector: bytes) -> bool:
    """A region's header sector that no export of this device wrote: neither erased (all
    0x00 or 0xFF), nor a header (the magic), nor a header torn within its magic (a prefix of
    it, then the erased value)."""
    from ringkv.defs.record import MAGIC
    if not sector.strip(b"\0") or not sector.strip(b"\xff") or sector.startswith(MAGIC):
        return False
    for erased in (b"\0", b"\xff"):
        head = sector.rstrip(erased)
        if head and MAGIC.startswith(head):
            return False
    return True


def check_image(path, config: RingKVConfig, sectors: int, *, create: bool = False) -> str:
    """Decide whether the simulator may use ``path`` as its card image; changes nothing.

    Usable: a missing file (created), an empty or blank one (all 0x00 or 0xFF), a card image
    of ``config`` -- every region header sector of its layout erased or a record header
    (intact, torn or corrupt: the device's recovery frees those), no intact header of another
    configuration. Refused, untouched: a directory, an unreadable file or one in a folder that
    does not exist (:class:`UsageError`),
    a file that is not a RingKV card image (:class:`NotACardImage`: text, random bytes, not a
    whole number of sectors, larger than the device's storage), a card image of another
    configuration (:class:`ConfigError`). ``create``: the file will be replaced by a new blank
    image, whatever it holds (only a directory or a missing folder is refused). Returns what
    the image is, in words.
    """
    from ringkv.defs.record import RecordLayout
    from ringkv.host.record import read_image_file, survey_image
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--image {path} is a directory", param="image")
    if not path.parent.is_dir():
        raise UsageError(f"--image {path}: there is no folder {path.parent}", param="image")
    if create:
        return "new blank image (--create)"
    if not path.exists():
        return "new image"
    data = read_image_file(path)
    size = len(data)
    if size == 0:
        return "empty file, made a blank image"
    keep = "; the simulator leaves it as it is"
    hint = "use a new file, or --create to replace it by a blank card image"
    if size % SECTOR:
        raise NotACardImage(f"{path} is {size} bytes, not a whole number of {SECTOR}-byte "
                            f"sectors: not a RingKV card image{keep}", param="image", hint=hint)
    survey = survey_image(data)
    ours = survey.intact.get(config.digest(), (config, []))[1]
    others = [c for d, (c, _) in survey.intact.items() if d != config.digest()]
    if others and not ours:
        raise ConfigError(f"{path} holds records of another configuration "
                          f"({'; '.join(others[0].diff(config))}){keep}", param="image",
                          fields=others[0].diff(config),
                          hint="start the simulator with the image's --config, or use "
                               "another --image")
    spr = RecordLayout(config).sectors_per_region
    if any(_foreign_header_sector(bytes(data[lba * SECTOR:(lba + 1) * SECTOR]))
           for lba in range(0, size // SECTOR, spr)):
        raise NotACardImage(f"{path} is not a RingKV card image of this configuration (a "
                            f"region's header sector holds something else){keep}",
                            param="image", hint=hint)
    if size > sectors * SECTOR:
        raise NotACardImage(f"{path} is {size} bytes, larger than this device's storage "
                            f"({sectors} sectors){keep}", param="image",
                            hint="start the simulator with the image's --top regions, or "
                                 "use another --image")
    if survey.blank:
        return f"blank image ({size // SECTOR} sectors)"
    return (f"card image: {len(ours)} intact record header(s)"
            + (f", {len(survey.damaged)} damaged" if survey.damaged else ""))


class SimDevice:
    """A simulated device in a child process (``python -m ringkv.sim.harness``; a subclass
    names another server module with the same command line in ``MODULE``). ``sealed``: the
    sealed top (``--sealed``; :attr:`sealed` says which it is)."""

    MODULE = "ringkv.sim.harness"

    def __init__(self, image, *, config: RingKVConfig = DEFAULT_CONFIG, log=None,
                 startup_timeout: float = 900.0, prebuilt: bool = False,
                 cut_after: int | None = None, server_args=(), sealed: bool = False,
                 **top_kwargs):
        self.image = Path(image)
        self.config = config
        top_kwargs = top_parameters(top_kwargs, sealed)
        self.sealed = top_kwargs.pop("sealed", False)
        if self.sealed and self.MODULE != SimDevice.MODULE:
            raise ValueError(f"{type(self).__name__} has no sealed build (sealed=True is "
                             f"RingKVTop's simulation: SimDevice)")
        cmd = [sys.executable, "-m", self.MODULE, "--image", str(self.image),
               "--config", json.dumps(config.__dict__), "--top", json.dumps(top_kwargs)]
        if self.sealed:
            cmd.append("--sealed")
        if prebuilt:
            cmd.append("--prebuilt")
        if cut_after is not None:
            cmd += ["--cut-after", str(cut_after)]
        cmd += list(server_args)            # the server module's own options
        self.log = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
        # its own process group, stopped with it by Ctrl-C or SIGTERM of this process
        self.proc = procs.spawn(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = None
        deadline = time.monotonic() + startup_timeout
        try:
            for line in self.proc.stdout:
                if line.startswith("RINGKV-SIM listening on "):
                    self.url = line.split()[-1]
                    break
                if time.monotonic() > deadline:
                    break
        finally:
            if self.url is None:
                self.kill()
        if self.url is None:
            why = ""
            if log:
                lines = [x for x in Path(log).read_text().splitlines()
                         if x.startswith("ringkv: ")]
                why = f": {lines[-1][len('ringkv: '):]}" if lines else ""
            raise RingKVError(f"the simulator did not start (exit {self.proc.returncode})"
                              f"{why}", hint=f"see {log}" if log else None)

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
        import signal
        procs.stop(self.proc, sig=signal.SIGKILL)
        self._close_log()

    def stop(self):
        procs.stop(self.proc, grace=10)
        self._close_log()

    def _close_log(self):
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        if self.log not in (None, subprocess.DEVNULL) and not self.log.closed:
            self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _sectors_defaults() -> dict:
    """``RingKVTop``'s keyword defaults."""
    import inspect

    from ringkv.hw.top import RingKVTop
    return {k: p.default for k, p in inspect.signature(RingKVTop).parameters.items()}


def _sectors(config: RingKVConfig, top_kwargs: dict) -> int:
    """Sectors of the top's storage (``base_lba`` + its regions), without elaborating it."""
    from ringkv.defs.record import RecordLayout
    kw = {**_sectors_defaults(), **top_kwargs}
    return kw["base_lba"] + kw["regions"] * RecordLayout(config).sectors_per_region


def main(argv=None):
    parser = ArgumentParser(prog="ringkv sim", description=__doc__.splitlines()[0],
                            epilog="It refuses an --image that is not a RingKV card image of "
                                   "its configuration (and leaves it as it is), unless the "
                                   "file is new, empty or blank, or --create is given. It "
                                   "exits non-zero when it cannot serve.")
    parser.add_argument("--image", default="ringkv.img",
                        help="card image file (created when missing)")
    parser.add_argument("--create", action="store_true",
                        help="start a new blank image at --image, replacing what the file "
                             "holds")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: any free port)")
    parser.add_argument("--config", default=None,
                        help="'default' (the board build's: the default shape in ringkv-fx1c "
                             "with the trained model's scales, TRAINED_CONFIG), 'demo' (the "
                             "demo shape, likewise, and the demo's top: DEMO_TOP) or "
                             "RingKVConfig fields as JSON")
    parser.add_argument("--numerics", default=None,
                        choices=["ringkv-fx1", "ringkv-fx2", "ringkv-fx1c"],
                        help="override the configuration's attention numerics")
    parser.add_argument("--top", default=None,
                        help="RingKVTop keyword arguments as JSON (default: {} -- 64 regions "
                             "--, with --config demo the demo's)")
    parser.add_argument("--sealed", action="store_true",
                        help="the sealed device: key slots, tenant slots and the record MAC "
                             "(docs/blocks/mac.md), a build of its own; default: open")
    parser.add_argument("--sdram", nargs="?", const="", default=None, metavar="PART",
                        help="the SDRAM hot tier between the DMA and the card "
                             "(docs/blocks/tiered_storage.md), a build of its own: PART an "
                             "SDRAM part of ringkv.defs.sdram.CHIPS (default the ULX3S's "
                             "32 MB MT48LC16M16A2-6A), compact slots of 16 token sectors, as "
                             "many slots as fit (at most the regions); --top's \"tier\" sets "
                             "the rest (slots, slot_token_sectors, sdram_bytes)")
    parser.add_argument("--once", action="store_true", help="exit after one connection")
    parser.add_argument("--prebuilt", action="store_true",
                        help="(kept for scripts: a matching build is always reused)")
    parser.add_argument("--cut-after", type=int, default=None, metavar="BYTES",
                        help="power cut after BYTES written to storage (the sector being "
                             "written is torn); the simulator then exits")
    args = parser.parse_args(argv)
    try:
        config = named_config(args.config, args.numerics)
        top = json.loads(args.top) if args.top is not None else (
            dict(DEMO_TOP) if args.config == "demo" else {})
        if not isinstance(top, dict):
            raise ValueError("--top is a JSON object")
        sectors = _sectors(config, top)
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad --config or --top: {e}", param="config") from None
    if not isinstance(top.get("sealed", False), bool):
        raise UsageError(f"bad --top: \"sealed\" is true or false, not "
                         f"{json.dumps(top['sealed'])}", param="top")
    if args.sealed and top.get("sealed") is False:
        raise UsageError("--sealed contradicts --top's \"sealed\": false",
                         hint="give --sealed alone (or --top with \"sealed\": true)",
                         param="sealed")
    if args.sdram is not None:
        tier = top.get("tier") or {}
        if not isinstance(tier, dict):
            raise UsageError("bad --top: \"tier\" is a JSON object", param="top")
        top["tier"] = {**tier, **({"part": args.sdram} if args.sdram else {})}
    top = top_parameters(top, args.sealed)
    try:
        _top(config, top)               # RingKVTop's own parameter checks, before any build
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad --top: {e}", param="top") from None
    sealed = top.pop("sealed", False)
    check_cut_after(args.cut_after)
    check_port(args.port)
    what = check_image(args.image, config, sectors, create=args.create)
    image = Path(args.image).resolve()
    if args.create:
        image.write_bytes(b"")
    tier, t = "", _tier(config, top)
    if t is not None:
        tier = (f"; SDRAM hot tier: {t['part']}, {t['sdram_bytes'] >> 20} MiB, {t['slots']} "
                f"slots of {t['slot_sectors']} sectors (SDRAM served from memory)")
    print(f"ringkv sim: image {image} ({what}); config digest {config.digest().hex()[:16]}; "
          + ("sealed (key slots, tenants, record MAC)" if sealed else "open") + tier,
          file=sys.stderr, flush=True)
    serve(image, config=config, port=args.port, once=args.once, prebuilt=args.prebuilt,
          cut_after=args.cut_after, sealed=sealed, **top)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
