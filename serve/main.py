"""``ringkv serve``: the OpenAI-compatible server, its command line.

::

    ringkv serve [--host 127.0.0.1] [--port 8000] [--device SPEC ...] [--config default|demo]
                 [--api-key KEY ...] [--api-key-file FILE]     (or RINGKV_API_KEY=KEY[,KEY])
                 [--valkey URL [--advertise-url URL]]          (several instances, one index)
                 [--kv-events tcp://*:5557 [--kv-events-replay tcp://*:5558]]

The model is the trained one shipped for the configuration's shape (``--weights FILE`` for
another, ``--random`` for the untrained one); devices as :mod:`ringkv.serve.devices` describes.
With ``--valkey`` the instance shares one index with the others
(:mod:`ringkv.serve.cluster`); with ``--kv-events`` it publishes its devices' records as
vLLM's KV events (:mod:`ringkv.serve.events`). With API keys, ``/v1`` needs one of them
(:class:`ringkv.serve.app.ApiKeyGate`); they are read and checked before any device starts.
uvicorn serves the application in this process; Ctrl-C or SIGTERM stops it cleanly (uvicorn's
own signal handling: open requests end, the workers stop, simulators started here are
stopped) and the command exits with status 130.
"""

import argparse
import dataclasses
import logging
import socket
import sys

from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG
from ringkv.host.errors import (
    ArgumentParser,
    ConfigError,
    ExitCode,
    LinkError,
    RingKVError,
    UsageError,
    error_lines,
)

__all__ = ["main", "build_parser", "build_server", "listen", "serve_in_thread", "api_keys",
           "tenancy", "NUMERICS_CHOICES", "API_KEY_ENV", "HOT_BYTES"]

NUMERICS_CHOICES = ["ringkv-fx1c", "ringkv-fx1", "ringkv-fx2"]

log = logging.getLogger("ringkv.serve")


def _count(minimum: int):
    """An argparse type: a whole number at least ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


#: ``--hot-bytes`` by default: 64 MiB, 512 conversations at the default shape
HOT_BYTES = 64 << 20

_UNITS = {"": 1, "K": 1 << 10, "KI": 1 << 10, "M": 1 << 20, "MI": 1 << 20, "G": 1 << 30,
          "GI": 1 << 30}


def _bytes(text: str) -> int:
    """A size in bytes: ``65536``, ``64K``, ``64M``, ``1G`` (binary units; ``MiB``, ``MB``
    read the same)."""
    t = text.strip().upper().removesuffix("B")
    digits = t.rstrip("KMGI")
    unit = t[len(digits):]
    if not digits.isdigit() or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size in bytes (e.g. 64M): {text!r}")
    value = int(digits) * _UNITS[unit]
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, not {text!r}")
    return value


def _port(text: str) -> int:
    value = _count(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535, not {value}")
    return value


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before any device starts, so that a port in use
    (or a host that is not this machine's) is one line and exit status 4, not a traceback
    after the devices came up; port 0 takes any free port."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host!r}: {e.strerror or e}", param="host") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise LinkError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                        hint="choose another --port, or --port 0 for any free port") from None
    sock.set_inheritable(True)
    return sock


def _loopback(host: str) -> bool:
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="ringkv serve",
        description="An OpenAI-compatible server (completions, chat completions, streaming) "
                    "putting many conversations on one or many RingKV devices.",
        epilog="Devices: software (in memory), software:IMAGE, sim[:IMAGE] (a simulated board, "
               "built with Verilator on first use), socket://HOST:PORT, or a serial port; "
               "default: the software device on a card image in the user's data directory.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8000, help="TCP port (0: any free port)")
    p.add_argument("--device", action="append", default=None, metavar="SPEC",
                   help="a device to serve on (repeatable)")
    p.add_argument("--config", choices=["default", "demo"], default="default",
                   help="the model and device shape (must match the devices')")
    p.add_argument("--numerics", choices=NUMERICS_CHOICES, default=None,
                   help="the attention numerics (default: ringkv-fx1c with the trained "
                        "weights' scales, as the board build; ringkv-fx1 with random weights)")
    p.add_argument("--weights", help=".npz weights (default: the shipped trained weights)")
    p.add_argument("--random", action="store_true", help="the untrained model (random weights)")
    p.add_argument("--random-seed", type=int, default=0, help="seed of --random's weights")
    p.add_argument("--backend", choices=["fixed", "float64"], default="fixed",
                   help="the software device's attention: the bit-exact model of the FPGA core "
                        "(default) or float64 rings")
    p.add_argument("--capacity", type=_count(1), default=256,
                   help="records a software device holds (least recently used evicted)")
    p.add_argument("--chunk", type=_count(1), default=64, help="prefill chunk (tokens)")
    p.add_argument("--hot-bytes", type=_bytes, default=HOT_BYTES, metavar="SIZE",
                   help="a software device's hot tier: the conversations whose rings it holds "
                        "at once, in bytes (K, M, G: binary units; default 64M: 512 "
                        "conversations of the default shape, 128 KiB each). The card image "
                        "stays the persistence point")
    p.add_argument("--max-batch", type=_count(1), default=None, metavar="N",
                   help="requests a device runs at once (continuous batching; default: as "
                        "many as its hot tier holds; 1: one request at a time)")
    p.add_argument("--step-tokens", type=_count(1), default=512, metavar="N",
                   help="tokens one batched step may compute: a decode token per running "
                        "request and prefill chunks (default 512)")
    p.add_argument("--max-queue", type=_count(0), default=16,
                   help="requests waiting per device beyond those it runs at once "
                        "(--max-batch); beyond that on every device: 429")
    p.add_argument("--placement", choices=["prefix", "least-loaded", "round-robin"],
                   default="prefix", help="how the router picks a device")
    p.add_argument("--max-imbalance", type=_count(0), default=4,
                   help="requests by which the device holding a prefix may be busier than the "
                        "least loaded one and still get the request")
    p.add_argument("--move-min-tokens", type=_count(0), default=64,
                   help="copy a conversation's record to the device that serves it when that "
                        "saves at least this many tokens of prefill (0: never copy)")
    p.add_argument("--model-name", default=None,
                   help="the model's id in the API (default ringkv-kjv, or ringkv-random)")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require this key on every /v1 route (Authorization: Bearer KEY; "
                        "repeatable). Other users of the machine can read a command line: "
                        "prefer --api-key-file or RINGKV_API_KEY")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="require one of the keys in FILE (one a line, 'KEY' or, with "
                        "--sealed, 'KEY KEY_ID': whose records its requests use; blank lines "
                        "and # comments skipped; only its owner may read it). With neither "
                        f"option, the keys in {API_KEY_ENV} (comma-separated), if it is set")
    p.add_argument("--sealed", action="store_true",
                   help="sealed devices: every record sealed (keyed MAC) under its tenant's "
                        "key and found only by that tenant; software devices in sealed mode, "
                        "'sim' the sealed top, boards must be sealed builds. A tenant is a "
                        "record key id: the one key of --key-file, or the id the request's API "
                        "key names")
    p.add_argument("--key-file", metavar="FILE",
                   help="the record keys of --sealed ('KEY_ID HEX' a line, owner-only; "
                        "default: RINGKV_KEYS)")
    p.add_argument("--valkey", metavar="URL",
                   help="share one exact index with the other instances on this Valkey (or "
                        "Redis) server (valkey://HOST:PORT, redis://HOST:PORT): a request whose "
                        "prefix another instance holds is forwarded there")
    p.add_argument("--advertise-url", metavar="URL",
                   help="this instance's base URL as the other instances reach it (default: "
                        "http://HOST:PORT of --host and --port)")
    p.add_argument("--cluster-interval", type=_seconds, default=1.0, metavar="S",
                   help="seconds between two heartbeats (and readings of the others' entries)")
    p.add_argument("--cluster-move", choices=["auto", "forward", "copy"], default="auto",
                   help="a request whose prefix another instance holds: forwarded there, or "
                        "that instance's record copied here (auto: forward while it has room "
                        "for the request, else copy)")
    p.add_argument("--cluster-ttl", type=_seconds, default=3.0, metavar="S",
                   help="a heartbeat's time-to-live: an instance that stops beating is no "
                        "longer routed to after this plus --cluster-interval")
    p.add_argument("--kv-events", metavar="ENDPOINT",
                   help="publish the records the devices hold as vLLM's KV events (msgpack "
                        "batches over a ZMQ PUB socket, e.g. tcp://*:5557) for KV-aware routers")
    p.add_argument("--kv-events-replay", metavar="ENDPOINT",
                   help="the replay socket (ZMQ ROUTER, e.g. tcp://*:5558): batches again from "
                        "a sequence number")
    p.add_argument("--kv-events-block-size", type=_count(1), default=16, metavar="N",
                   help="tokens per block in the events (default 16, vLLM's)")
    p.add_argument("--kv-events-topic", default="", metavar="TOPIC")
    p.add_argument("--timeout", type=_seconds, default=60.0, help="link timeout (s)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    return p


#: The environment variable read for API keys when neither ``--api-key`` nor
#: ``--api-key-file`` is given (keys separated by commas).
API_KEY_ENV = "RINGKV_API_KEY"


def _key_id(text: str, where: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        # (the text is not shown: a key with a space in it would be half shown)
        raise UsageError(f"{where}: the key id after the key must be a number 1..65535",
                         param="--api-key-file")
    return int(text)


def _check_key(key: str, where: str, param: str) -> str:
    if not key or not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise UsageError(f"{where}: an API key must be printable ASCII without spaces (it "
                         f"travels in an HTTP header)", param=param)
    return key


def api_keys(args, environ=None) -> dict:
    """The API keys ``ringkv serve`` requires, each with the record key id its requests use
    (None where the line names none; empty: no keys): ``--api-key`` and ``--api-key-file``
    together, else :data:`API_KEY_ENV`. The file is read as the record key files are
    (:func:`ringkv.host.keys.read_private_file`: a regular file of this user's that only its
    owner may access); a line is ``KEY`` or ``KEY KEY_ID``. A file that cannot be used, holds
    no key, or a key that cannot be sent in a header is a :class:`UsageError` naming where it
    is, never the key."""
    import os
    environ = os.environ if environ is None else environ
    keys = {_check_key(k, "--api-key", "--api-key"): None for k in args.api_key or ()}
    if args.api_key_file:
        from ringkv.host.keys import read_private_file
        path = args.api_key_file
        try:
            lines = read_private_file(path, "--api-key-file").splitlines()
        except ConfigError as e:           # a bad option's value: exit status 2, as the rest
            raise UsageError(e.message, hint=e.hint, param="--api-key-file") from None
        found = [(n, line.strip()) for n, line in enumerate(lines, 1)
                 if line.strip() and not line.lstrip().startswith("#")]
        if not found:
            raise UsageError(f"--api-key-file {path}: holds no key (one a line)",
                             param="--api-key-file")
        for n, line in found:
            where = f"--api-key-file {path} line {n}"
            key, *rest = line.split()
            if len(rest) > 1:
                raise UsageError(f"{where}: expected 'KEY' or 'KEY KEY_ID'",
                                 param="--api-key-file")
            keys[_check_key(key, where, "--api-key-file")] = \
                _key_id(rest[0], where) if rest else None
    if not keys and environ.get(API_KEY_ENV):
        keys = {_check_key(k.strip(), API_KEY_ENV, API_KEY_ENV): None
                for k in environ[API_KEY_ENV].split(",")}
    return keys


def tenancy(args, keys: dict, config, environ=None):
    """``(record key ring, default tenant, tenant seeds)`` of the server: all None for an open
    one. ``--sealed``: the ring from ``--key-file`` or ``RINGKV_KEYS``; a tenant is a key id
    (the ring's only one by default; with several, every API key must name its own); the
    seeds are the router's prefix-hash seeds per tenant (the devices' own). Anything that does
    not fit is a :class:`UsageError` before any device starts (a bad key file: the
    :class:`ConfigError` of :mod:`ringkv.host.keys`)."""
    named = sorted({k for k in keys.values() if k is not None})
    if not args.sealed:
        if named:
            raise UsageError(f"--api-key-file names key id {named[0]}: only a sealed server "
                             f"(--sealed) has tenants", param="--api-key-file")
        if args.key_file:
            raise UsageError("--key-file holds record keys for --sealed", param="--key-file")
        return None, None, None
    from ringkv.host.golden.mac import tenant_seed
    from ringkv.host.keys import load_keys
    ring = load_keys(args.key_file, environ)
    if ring is None or not len(ring):
        raise UsageError("--sealed needs the record keys: --key-file FILE or RINGKV_KEYS",
                         param="--key-file")
    missing = [k for k in named if k not in ring]
    if missing:
        raise UsageError(f"--api-key-file names key id {missing[0]}, which the record keys do "
                         f"not hold (ids {', '.join(map(str, ring.ids()))})",
                         param="--api-key-file")
    default = ring.ids()[0] if len(ring) == 1 else None
    if default is None and (not keys or None in keys.values()):
        raise UsageError(f"--sealed with {len(ring)} record keys (ids "
                         f"{', '.join(map(str, ring.ids()))}): every API key must name the key "
                         f"id its requests use ('KEY KEY_ID' lines in --api-key-file)",
                         param="--api-key-file")
    seeds = {kid: tenant_seed(ring[kid], config.digest()) for kid in ring.ids()}
    return ring, default, seeds


def _model_and_config(args):
    from ringkv.host.model.calibrate import calibrated_config
    from ringkv.host.model.transformer import Model
    base = DEMO_CONFIG if args.config == "demo" else DEFAULT_CONFIG
    try:
        if args.weights:
            model = Model.load(args.weights, base)
        elif args.random:
            small = base.head_dim * base.q_heads < 256
            model = Model(base, hidden=64 if small else 256, ffn=128 if small else 512,
                          seed=args.random_seed)
        else:
            model = Model.trained(base)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the model: {e}", param="--weights") from None
    numerics = args.numerics
    if numerics is None:
        numerics = "ringkv-fx1c" if model.qkv_fracs else "ringkv-fx1"
    if numerics == "ringkv-fx1c":
        if not model.qkv_fracs:
            raise UsageError("ringkv-fx1c needs weights with calibrated q/k/v scales (the "
                             "shipped trained ones); use --numerics ringkv-fx1 with these",
                             param="--numerics")
        config = calibrated_config(base, model.qkv_fracs)
    else:
        config = dataclasses.replace(base, numerics=numerics, qkv_fracs=())
    return model, config


def build_server(args):
    """``(engine, app, model_name)`` for parsed arguments (nothing started yet)."""
    keys = api_keys(args)
    from ringkv.host.model.transformer import FixedBackend, Float64Backend

    from .app import create_app
    from .devices import default_image, parse_device
    from .engine import Engine
    from .metrics import Metrics
    model, config = _model_and_config(args)
    ring, tenant, seeds = tenancy(args, keys, config)
    backend = FixedBackend if args.backend == "fixed" else Float64Backend
    specs = args.device or [f"software:{default_image()}"]
    repeated = {s for s in specs if specs.count(s) > 1}
    if repeated - {"software", "sim"}:
        raise UsageError(f"--device {sorted(repeated - {'software', 'sim'})[0]} is named twice "
                         f"(only 'software', in memory, and 'sim', on a temporary card, may be "
                         f"repeated)", param="--device")
    # a simulated board has ``ringkv sim``'s top for the shape: the demo's for the demo shape
    top = {}
    if args.config == "demo" and any(s.partition(":")[0] == "sim" for s in specs):
        from ringkv.sim.harness import DEMO_TOP
        top = dict(DEMO_TOP)
    handles = [parse_device(s, config, capacity=args.capacity, attention_factory=backend,
                            timeout=args.timeout, top_kwargs=top, keys=ring,
                            hot_bytes=args.hot_bytes) for s in specs]
    for i, h in enumerate(handles):
        if h.spec in repeated:
            h.name = f"{h.spec}-{i}"
    metrics = Metrics()
    for h in handles:
        metrics.add_device(h.name)
    engine = Engine(model, config, handles, metrics, chunk=args.chunk,
                    max_queue=args.max_queue, placement=args.placement,
                    max_imbalance=args.max_imbalance,
                    move_min_tokens=args.move_min_tokens, seeds=seeds,
                    step_tokens=args.step_tokens, max_batch=args.max_batch)
    if args.valkey:
        from .cluster import Cluster, identity
        engine.cluster = Cluster(engine, args.valkey, args.advertise_url,
                                 identity(config, model), interval=args.cluster_interval,
                                 ttl=args.cluster_ttl, move=args.cluster_move)
    if args.kv_events:
        from .events import KVEvents
        engine.events = KVEvents(engine, args.kv_events, args.kv_events_replay,
                                 block_size=args.kv_events_block_size,
                                 topic=args.kv_events_topic)
    elif args.kv_events_replay:
        raise UsageError("--kv-events-replay replays --kv-events: give both",
                         param="--kv-events-replay")
    name = args.model_name or ("ringkv-kjv" if model.meta else "ringkv-random")
    app = create_app(engine, model_name=name, api_keys=keys, tenant=tenant,
                     fingerprint="ringkv-" + config.digest().hex()[:12])
    app.state.api_keys = len(keys)
    return engine, app, name


def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0, *,
                    timeout: float = 60.0):
    """Serve ``app`` with uvicorn in a daemon thread of this process, on ``port`` (0: any free
    one): ``(server, thread, base URL)`` once it listens (tests, notebooks, embedding). Stop it
    with ``server.should_exit = True`` and ``thread.join()``."""
    import threading
    import time

    import uvicorn
    sock = listen(host, port)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        sock.close()
        raise LinkError(f"the server did not start on {host}:{port} within {timeout} s")
    return server, thread, f"http://{host}:{port}"


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        print("\n".join(error_lines(e, "ringkv serve")), file=sys.stderr)
        return int(e.exit_code)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sock = listen(args.host, args.port)
        try:
            engine, app, name = build_server(args)
        except BaseException:
            sock.close()
            raise
    except RingKVError as e:
        print("\n".join(error_lines(e, "ringkv serve")), file=sys.stderr)
        return int(e.exit_code)
    import uvicorn
    port = sock.getsockname()[1]
    log.info("serving %s on http://%s:%d/v1 with %d device(s): %s", name, args.host, port,
             len(engine.workers), ", ".join(w.name for w in engine.workers))
    if args.sealed:
        log.info("sealed: records sealed under the tenants' keys (%s)",
                 "one tenant" if len(engine.hashers) == 1 else
                 f"{len(engine.hashers)} tenants, by API key")
    if app.state.api_keys:
        log.info("/v1 requires an API key (%d accepted); /health and /metrics are open",
                 app.state.api_keys)
    elif not _loopback(args.host):
        log.warning("no API key (--api-key, --api-key-file or %s): anyone who reaches "
                    "%s:%d can use the server", API_KEY_ENV, args.host, port)
    if engine.cluster is not None:
        if engine.cluster.advertise is None:
            engine.cluster.advertise = f"http://{args.host}:{port}"
        log.info("cluster: sharing the index on %s as %s", args.valkey,
                 engine.cluster.advertise)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=port,
                                           log_level=args.log_level,
                                           access_log=args.log_level == "debug"))
    import signal
    # uvicorn handles SIGINT/SIGTERM itself (a clean shutdown) and then raises the signal
    # again for the handler that was there before: this one lets the command end normally
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    # what is loaded now stays (modules, the model): out of the cyclic collector's way, whose
    # full collections over it would pause the event loop for tens of milliseconds
    import gc
    gc.freeze()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    finally:
        sock.close()
    if not server.started:
        return int(ExitCode.FAILURE)
    # uvicorn stops only on SIGINT or SIGTERM: the command's interruption
    return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
