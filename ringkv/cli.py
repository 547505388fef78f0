"""``ringkv`` command line: demo, chat, serve, sim, bench, build, board, storage.

``demo`` runs the end-to-end scenario against simulated FPGAs (Verilator) — ``demo
--software`` the same host against the software device (golden models in the FPGA's place),
``demo --board ulx3s-85f`` against the pin-level simulation of the board top; ``board check
--link URL`` runs the bring-up self-test of a device (the board's serial port or ``ringkv
sim``'s socket); ``chat`` talks to the software device, or to a device at ``--link URL``
(``socket://`` for ``ringkv sim``, ``/dev/ttyUSB0`` for the board), greedy or sampled
(``--temperature``, ``--top-p``, ``--top-k``, ``--seed``, ``--max-tokens``, ``--stop``);
``serve`` is the OpenAI-compatible server (:mod:`ringkv.serve`); ``sim`` starts the
simulated device (``sim --board ulx3s-85f``: the board top at its pins), ``build``
the board bitstream, ``storage ls`` lists the records in a card image and ``storage fsck``
checks it, ``bench`` the benchmarks.

Errors: every ordinary failure is a :class:`~ringkv.host.errors.RingKVError`; :func:`main`
prints it as one line ``ringkv: ...`` (and a ``hint:`` line) on standard error and exits with
its code (:data:`EXIT_CODES`); the traceback only with ``--debug``. Ctrl-C and SIGTERM stop
every child process a command started and remove its temporary files
(:mod:`ringkv.sim.procs`), exit status 130. A new subcommand is a ``sub.add_parser`` in
:func:`build_parser` and an entry in :data:`COMMANDS`.
"""

import argparse
import importlib
import logging
import sys
import time
from pathlib import Path

from ringkv.host.errors import (
    ArgumentParser,
    ExitCode,
    LinkError,
    RingKVError,
    UsageError,
    error_lines,
)

__all__ = ["main", "run_demo"]


def _backend(name, config):
    from ringkv.host.model.transformer import FixedBackend, Float64Backend
    return FixedBackend(config) if name == "fixed" else Float64Backend(config)


def _model(args, config):
    """``--weights FILE``, else the random model (``--random``, of ``--seed``), else the trained
    weights shipped for ``config``'s shape."""
    import zipfile

    from ringkv.host.errors import ConfigError
    from ringkv.host.model.transformer import Model
    if args.weights:
        try:
            return Model.load(args.weights, config)
        except OSError as e:
            raise UsageError(f"cannot read the weights {args.weights}: {e.strerror or e}",
                             param="weights") from None
        except (ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise ConfigError(f"the weights {args.weights} do not fit the model "
                              f"(layers={config.layers} Hq={config.q_heads} "
                              f"Hkv={config.kv_heads} d={config.head_dim}): {e}",
                              param="weights") from None
    if args.random:
        small = config.head_dim * config.q_heads < 256
        return Model(config, hidden=64 if small else 256, ffn=128 if small else 512,
                     seed=getattr(args, "weights_seed", args.seed))
    try:
        return Model.trained(config)
    except FileNotFoundError as e:
        raise UsageError(str(e), param="weights") from None


def _model_name(model) -> str:
    if not model.meta:
        return "random weights"
    m = model.meta
    return f"trained on {m['corpus'].split('==')[0]}, step {m['step']} of {m['steps']}"


#: The system prompt the demo's assistant conversations share (the caller marks its end as a
#: checkpoint, the way prompt-caching APIs mark a cache breakpoint).
SYSTEM_PROMPT = ("You are a scribe of the King James Bible. Answer every question in its "
                 "words, briefly, and name the book, chapter and verse. ")


def demo_script(seed: int = 0):
    """The demo's requests ``(label, session, tokens, n_new, options)``: interleaved sessions
    (a resume by import, a continuation), three conversations behind one shared system prompt
    (the first stores a checkpoint at its end, the others import it), an edit-and-resend
    (``rewind``), a session evicted by then (recomputed) and one growing to several W."""
    import random

    from ringkv.host.model.transformer import BOS, encode_text
    rng = random.Random(seed)

    def text(n):
        words = ["And", "the", "king", "said", "unto", "his", "servants,", "Go", "up", "into",
                 "city", "of", "David", "and", "there", "was", "light", "upon", "earth"]
        return encode_text(" ".join(rng.choice(words) for _ in range(n)) + ". ")

    system = [BOS] + encode_text(SYSTEM_PROMPT)
    mark = {"checkpoints": (len(system),)}
    reqs = [("interleaved sessions", "alice", [BOS] + text(20), 12, {}),
            ("", "bob", [BOS] + text(12), 12, {}),
            ("resume after another", "alice", text(8), 12, {}),
            ("continuation", "alice", text(5), 8, {}),
            ("shared system prompt", "dave", system + text(6), 12, mark),
            ("", "erin", system + text(4), 12, mark),
            ("", "frank", system + text(7), 12, mark),
            ("", "erin", text(5), 12, {}),
            ("edit erin's last message", "erin", text(6), 12, {"rewind": None}),
            ("evicted meanwhile", "bob", text(6), 12, {})]
    for _ in range(3):                                      # alice grows to several W
        reqs += [("long conversation", "alice", text(24), 16, {}),
                 ("", "frank", text(4), 8, {})]
    return reqs


def _resolve(reqs):
    """Fill in each ``rewind: None`` (edit the session's last message) with the position where
    that message started in the session's stream."""
    streams, starts, out = {}, {}, []
    for label, sid, tokens, n_new, opts in reqs:
        if "rewind" in opts and opts["rewind"] is None:
            opts = dict(opts, rewind=starts[sid])
        base = streams.get(sid, [])[:opts.get("rewind", len(streams.get(sid, [])))]
        starts[sid] = len(base)
        streams[sid] = base + [None] * (len(tokens) + n_new)
        out.append((label, sid, tokens, n_new, opts))
    return out


def run_demo(args) -> int:

    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.host.device.software import SoftwareDevice
    from ringkv.host.model.transformer import show_text
    from ringkv.host.scheduler import Scheduler, event_notes, path_summary, plain_run
    model = _model(args, DEFAULT_CONFIG)
    config = _device_config(DEFAULT_CONFIG, getattr(args, "numerics", None), model)
    device = SoftwareDevice(config, attention=_backend(args.backend, config),
                            capacity=args.capacity, image=args.image)
    sched = Scheduler(model, device, chunk=args.chunk)
    reqs = _resolve(demo_script(args.seed))
    print(f"RingKV demo (software device, {args.backend} attention): layers={config.layers} "
          f"Hq={config.q_heads} Hkv={config.kv_heads} d={config.head_dim} W={config.window}, "
          f"numerics {_numerics_name(config)}, "
          f"store capacity {args.capacity} records; model {_model_name(model)}\n")
    header = (f"{'#':>2} {'step':24} {'session':7} {'path':8} {'tokens':>11} {'reused':>6} "
              f"{'computed':>8} {'recomp':>6} {'import B':>8} {'export B':>8} {'ms':>6}  "
              f"output")
    print(header)
    print("-" * len(header))
    outs, rows = [], []
    for i, (label, sid, tokens, n_new, opts) in enumerate(reqs):
        t0 = time.perf_counter()
        out = sched.request(sid, tokens, n_new, **opts)
        ms = (time.perf_counter() - t0) * 1e3
        e = sched.events[-1]
        outs.append(out)
        rows.append((e, ms))
        print(f"{i:>2} {label:24} {sid:7} {e['path']:8} {e['before']:>5}->{e['after']:<5} "
              f"{e['reused']:>6} {e['prefilled']:>8} {e['recomputed']:>6} "
              f"{e['imported_bytes']:>8} {e['exported_bytes']:>8} {ms:>6.0f}  "
              f"{show_text(out)!r}")
        note = event_notes(e)
        if note:
            print(note)
    print("\nchecking every generated token against a plain run with no reuse at all ...")
    ref = plain_run(model, [(sid, toks, n, opts) for _, sid, toks, n, opts in reqs],
                    lambda: _backend(args.backend, config), chunk=args.chunk)
    bad = [i for i, (a, b) in enumerate(zip(outs, ref)) if a != b]
    print("summary")
    for line in path_summary(e for e, _ in rows):
        print(line)
    fed = sum(len(toks) for _, _, toks, _, _ in reqs)
    computed = sum(e["prefilled"] for e, _ in rows)
    reused = sum(e["reused"] for e, _ in rows)
    print(f"  prompt tokens sent {fed}; prefilled {computed}, imported {reused} "
          f"(of which by longest prefix "
          f"{sum(e['reused'] for e, _ in rows if e['path'] == 'prefix')})")
    stats = device.stats()
    print(f"  device: {stats}")
    print("  store (least recently used first): " + ", ".join(
        f"{kind} {count}" for count, _, kind in device.listing()))
    longest = max(len(s.tokens) for s in sched.sessions.values())
    print(f"  longest session: {longest} tokens = {longest / config.window:.1f} x W")
    if bad:
        print(f"MISMATCH in requests {bad}")
        return 1
    print(f"all {sum(map(len, outs))} generated tokens identical to the plain run")
    return 0


#: ``--numerics`` choices; the default (None) is ringkv-fx1c with the weights' calibrated scales
#: when the weights carry them (the shipped trained ones do), else ringkv-fx1
NUMERICS_CHOICES = ["ringkv-fx1c", "ringkv-fx1", "ringkv-fx2"]


def _base_config(name):
    from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG
    return {"default": DEFAULT_CONFIG, "demo": DEMO_CONFIG}[name]


def _device_config(base, numerics, model=None):
    """The device configuration: ``base``'s shape in ``numerics``; ``ringkv-fx1c`` takes its
    per-layer scales from ``model``'s weights (``None``: fx1c when they carry them, else fx1)."""
    import dataclasses

    from ringkv.host.model.calibrate import calibrated_config
    fracs = getattr(model, "qkv_fracs", None)
    if numerics is None:
        numerics = "ringkv-fx1c" if fracs else "ringkv-fx1"
    if numerics == "ringkv-fx1c":
        if not fracs:
            raise UsageError("ringkv-fx1c needs weights with calibrated q/k/v scales (the "
                             "shipped trained ones, or python -m ringkv.host.model.calibrate FILE "
                             "--write)", param="numerics",
                             hint="use --numerics ringkv-fx1 with these weights")
        return calibrated_config(base, fracs)
    return dataclasses.replace(base, numerics=numerics, qkv_fracs=())


def _numerics_name(config) -> str:
    if not config.qkv_fracs:
        return config.numerics
    return (f"{config.numerics} (Fq,Fk,Fv) per layer "
            + " ".join("(" + ",".join(map(str, t)) + ")" for t in config.qkv_fracs))


def _trained_or_none(config):
    """The shipped trained model of ``config``'s shape, or ``None`` when there is none."""
    from ringkv.host.model.transformer import Model, weights_path
    return Model.trained(config) if weights_path(config).exists() else None


def _wait_device(device, where):
    """Wait for the device's own recovery scan (power-on), showing its progress."""
    from ringkv.host.errors import DeviceNotReady

    def progress(st):
        print(f"\rdevice at {where}: recovering its directory, {st['scanned']}/"
              f"{st['regions']} regions", end="", file=sys.stderr, flush=True)
    try:
        st = device.wait_ready(progress=progress)
    except TimeoutError:
        raise DeviceNotReady(f"device at {where} did not finish its recovery scan") from None
    finally:
        print("", end="\r", file=sys.stderr, flush=True)
    return st


def _open_device(link_url, config, timeout):
    """An :class:`~ringkv.host.device.fpga.FpgaDevice` at ``link_url`` whose configuration was
    checked and whose recovery scan has ended; ``(device, recovery status)``."""
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    device = FpgaDevice(Link(link_url, timeout=timeout), config)
    try:
        device.check_config()        # refuses a device built for another configuration
        return device, _wait_device(device, link_url)
    except BaseException:
        device.link.close()
        raise


def run_fsck_link(args) -> int:
    """``ringkv storage fsck --link URL``: the deep check over the link (read only)."""
    from ringkv.host.device.fpga import DeviceNotReady
    from ringkv.host.record import fsck_report
    base = _base_config(args.config or "default")
    config = _device_config(base, args.numerics, _trained_or_none(base))
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    device = FpgaDevice(Link(args.link, timeout=args.timeout), config)
    with device.link:
        device.check_config()
        try:
            st = _wait_device(device, args.link)
            print(f"device recovery: {st['scanned']} regions, {st['live']} live, "
                  f"{st['freed']} freed, next commit {st['next_seq']}, {st['cycles']} clocks")
        except DeviceNotReady as e:
            print(f"device recovery failed: {e} (the deep check reads the card anyway)")
        infos, _ = device.check()
    report, problems = fsck_report(infos)
    print(report)
    return 1 if problems else 0


CHAT_HELP = """commands:
  /session NAME   switch to (or start) the conversation NAME
  /retry          answer the last message of this conversation again
  /edit TEXT      replace the last message with TEXT and answer it
  /sessions       list the conversations
  /reconnect      open the link to the device again (after it dropped or restarted)
  /help           this list
  /quit           end (Ctrl-D too); conversations are kept in the state file"""


def _chat_state_path(args, config) -> Path | None:
    """Where chat keeps the host's side of its conversations (their tokens): beside the
    software device's ``--image``; for a ``--link`` device in the user's state directory,
    one file per link and device configuration, so that chat started again (after a device
    restart too) resumes its conversations without extra flags; ``--state`` overrides."""
    import hashlib
    import os
    if args.state:
        return Path(args.state)
    if args.image:
        return Path(args.image + ".sessions.json")
    if args.link:
        root = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
        key = hashlib.blake2b(args.link.encode() + config.digest(), digest_size=8).hexdigest()
        return root / "ringkv" / "chat" / f"{key}.json"
    return None


def _load_chat_state(path: Path | None) -> dict:
    import json

    from ringkv.host.scheduler import Session
    if path is None or not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {str(sid): Session(tokens=[int(t) for t in v["tokens"]],
                                  pending=[int(t) for t in v["pending"]],
                                  key=tuple(v["key"]) if v["key"] else None,
                                  turns=v.get("turns", []))
                for sid, v in raw.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise UsageError(f"cannot read the chat state {path}: {e}", param="state",
                         hint="give another --state FILE, or move this one away") from None


def _save_chat_state(path: Path | None, sessions) -> None:
    import json
    import os
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({k: {"tokens": v.tokens, "pending": v.pending, "key": v.key,
                                   "turns": v.turns} for k, v in sessions.items()}))
    os.replace(tmp, path)               # never a half-written state file


def _chat_lines(prompt):
    """The user's lines: with a terminal, ``input`` with the prompt ``prompt()`` and readline
    history (kept in the user's state directory); otherwise the lines of standard input."""
    if not sys.stdin.isatty():
        for line in sys.stdin:
            yield line.rstrip("\n")
        return
    import os
    try:
        import readline
    except ImportError:                 # no readline on this platform: no history
        readline = None
    history = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") \
        / "ringkv" / "chat_history"
    if readline is not None:
        try:
            readline.read_history_file(history)
        except OSError:
            pass
    try:
        while True:
            try:
                yield input(prompt())
            except EOFError:
                print()
                return
    finally:
        if readline is not None:
            try:
                history.parent.mkdir(parents=True, exist_ok=True)
                readline.set_history_length(1000)
                readline.write_history_file(history)
            except OSError:
                pass


def run_chat(args) -> int:
    from ringkv.host.device.software import SoftwareDevice
    from ringkv.host.model.sampling import Sampler, SamplingParams
    from ringkv.host.model.transformer import BOS, encode_text, show_text
    from ringkv.host.scheduler import Scheduler
    if args.tokens < 1:
        raise UsageError(f"--max-tokens (--tokens) must be a positive number, not "
                         f"{args.tokens}",
                         param="max_tokens")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, not {args.timeout}", param="timeout")
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, max_tokens=args.tokens,
                                stop=tuple(args.stop or ()))
    except UsageError as e:
        raise UsageError(f"--{(e.param or 'option').replace('_', '-')}: {e.message}",
                         param=e.param) from None
    stops = [x.encode("utf-8") for x in params.stop]
    sampler = Sampler(params)        # one generator for the chat: a seeded chat replays
    model = _model(args, _base_config(args.config))
    config = _device_config(_base_config(args.config), args.numerics, model)
    if args.link:
        device, st = _open_device(args.link, config, args.timeout)
        print(f"device at {args.link}: {st['live']} stored snapshots, {st['freed']} regions "
              f"freed by its recovery; next commit {st['next_seq']} "
              f"('ringkv storage fsck --link' checks every record in depth)")
        where = f"device at {args.link}"
    else:
        device = SoftwareDevice(config, attention=_backend(args.backend, config),
                                capacity=args.capacity, image=args.image)
        where = "software device"
    state = _chat_state_path(args, config)
    sessions = _load_chat_state(state)
    sched = Scheduler(model, device, chunk=args.chunk, sessions=sessions)
    sid = "default"
    last = {}       # session -> (stream position its last message started at, its tokens)
    connected = True
    print(f"ringkv chat ({where}, {_numerics_name(config)}; model {_model_name(model)}). "
          f"'/help' lists the commands, '/quit' ends."
          + (f" Resumed sessions: {', '.join(sorted(sessions))}." if sessions else ""),
          flush=True)

    def reconnect():
        nonlocal connected
        try:
            sched.device.link.close()
        except Exception:                                   # noqa: BLE001 (already gone)
            pass
        sched.device, st = _open_device(args.link, config, args.timeout)
        sched.resident = None           # the device restarted, or its rings are unknown
        connected = True
        print(f"[reconnected to {args.link}: {st['live']} stored snapshots]", flush=True)

    for line in _chat_lines(lambda: f"[{sid}] > "):  # noqa: B023 (the current one)
        cmd, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if cmd in ("/quit", "/exit"):
            break
        if cmd == "/help":
            print(CHAT_HELP, flush=True)
            continue
        if cmd == "/sessions":
            print(", ".join(f"{k} ({len(v.stream)} tokens)"
                            for k, v in sorted(sched.sessions.items())) or "no conversations",
                  flush=True)
            continue
        if cmd == "/session":
            if not rest:
                print(f"[{sid}] '/session NAME' needs a NAME", flush=True)
            else:
                sid = rest
            continue
        if cmd == "/reconnect":
            if not args.link:
                print("[the software device has no link]", flush=True)
                continue
            try:
                reconnect()
            except RingKVError as e:
                print(f"[reconnect failed: {e.one_line()}]", flush=True)
            continue
        if cmd.startswith("/") and cmd not in ("/retry", "/edit"):
            print(f"[unknown command {cmd!r}; '/help' lists them]", flush=True)
            continue
        if not line.strip() and cmd != "/retry":
            continue
        opts = {}
        if cmd in ("/retry", "/edit"):
            if cmd == "/edit" and not rest:
                print(f"[{sid}] '/edit TEXT' needs the new TEXT", flush=True)
                continue
            if sid not in last:
                print(f"[{sid}] no message of this chat to {cmd[1:]} yet", flush=True)
                continue
            start, tokens = last[sid]           # edit-and-resend: the stream cut before it
            if cmd == "/edit":
                tokens = ([BOS] if start == 0 else []) + encode_text(rest)
            opts = {"rewind": start}
        else:
            first = sid not in sched.sessions or not sched.sessions[sid].stream
            start = 0 if first else len(sched.sessions[sid].stream)
            tokens = ([BOS] if first else []) + encode_text(line)
        made = bytearray()

        def stop_at(token, made=made):
            made.append(token if token < 256 else 0)
            return any(made.endswith(x) for x in stops)

        try:
            if args.link and not connected:
                reconnect()
            out = sched.request(sid, tokens, params.max_tokens, sample=sampler,
                                on_token=stop_at, **opts)
        except LinkError as e:
            connected = False
            print(f"[{sid}] the link dropped: {e.one_line()}. The conversation is kept; the "
                  f"next message (or /retry) reconnects, or '/reconnect'.", flush=True)
            last[sid] = (start, tokens)           # /retry sends it again
            continue
        except RingKVError as e:
            print(f"[{sid}] {e.one_line()}; the conversation is kept", flush=True)
            continue
        for x in stops:                 # a stop sequence ends the answer and is not shown
            if made.endswith(x):
                out = out[:len(out) - len(x)]
        last[sid] = (start, tokens)
        e = sched.events[-1]
        print(f"[{sid} {e['path']} {e['after']} tokens] {show_text(out)}", flush=True)
        _save_chat_state(state, sched.sessions)
    if args.link and connected:
        sched.device.link.close()
    return 0


#: Exit statuses of every ``ringkv`` command (``ringkv --help``, README).
EXIT_CODES = f"""exit status:
  {ExitCode.OK:3}  success (storage fsck: clean)
  {ExitCode.FAILURE:3}  the command could not do its job (storage fsck: repairable regions)
  {ExitCode.USAGE:3}  bad option, value or file argument
  {ExitCode.CONFIG:3}  the device's or image's configuration differs from the host's
  {ExitCode.LINK:3}  the device cannot be reached, or the link dropped
  {ExitCode.NOT_A_CARD:3}  a file given as a card image is not one (it was not changed)
  {ExitCode.INTERRUPTED:3}  interrupted (Ctrl-C, SIGTERM): children stopped, temp files removed

--debug shows the traceback of an error; -v shows debug messages, -q only warnings."""


def _global_options(parser, *, default):
    """``--debug``, ``-v``/``--verbose``, ``-q``/``--quiet``: before the command, or after it
    (``default=SUPPRESS`` there, so the one before is not overwritten)."""
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show the traceback of an error")
    parser.add_argument("-v", "--verbose", action="count", default=default,
                        help="more messages (debug)")
    parser.add_argument("-q", "--quiet", action="count", default=default,
                        help="only warnings and errors")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("ringkv")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="ringkv", description=__doc__.splitlines()[0],
                            epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ringkv {_version()}")
    _global_options(parser, default=None)
    common = ArgumentParser(add_help=False)
    _global_options(common, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND",
                                parser_class=ArgumentParser)

    def model_args(p, sampling=False):
        p.add_argument("--backend", choices=["float64", "fixed"], default=None,
                       help="attention in the FPGA's place: float64 rings or the bit-exact "
                            "fixed-point core model (default: fixed with --image, whose card "
                            "format holds the fixed-point K/V; else float64)")
        p.add_argument("--weights", help=".npz weights (default: the trained weights shipped "
                                              "for the configuration's shape)")
        p.add_argument("--random", action="store_true",
                       help="the untrained model with random weights of --seed instead")
        if sampling:
            p.add_argument("--random-seed", dest="weights_seed", type=int, default=0,
                           help="seed of --random's weights")
            p.add_argument("--temperature", type=float, default=0.0,
                           help="sampling temperature, 0..2 (default 0: greedy)")
            p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling, (0, 1]")
            p.add_argument("--top-k", type=int, default=0, help="the k most likely (0: all)")
            p.add_argument("--seed", type=int, default=None,
                           help="the sampling generator's seed (reproducible answers)")
            p.add_argument("--stop", action="append", default=None,
                           help="stop sequence (repeatable, at most 4)")
        else:
            p.add_argument("--seed", type=int, default=0)
        p.add_argument("--chunk", type=_positive, default=64, help="prefill chunk")
        p.add_argument("--capacity", type=_positive, default=2,
                       help="records (turn snapshots and checkpoints) the store holds")
        p.add_argument("--image", help="persist the software store to this file")

    p = sub.add_parser("demo", parents=[common],
                       help="end-to-end scenario on simulated FPGAs (Verilator)")
    model_args(p)
    p.add_argument("--software", action="store_true",
                   help="run the scenario on the software device instead")
    p.add_argument("--workdir", help="keep images and simulator logs here")
    p.add_argument("--numerics", choices=NUMERICS_CHOICES, default=None,
                   help="the simulated device's attention numerics (default: ringkv-fx1c, int8 "
                        "K/V with the trained weights' calibrated scales; ringkv-fx1 with "
                        "random weights)")
    p.add_argument("--board", choices=["ulx3s-85f"], default=None,
                   help="run against the pin-level simulation of this board's top")
    p.set_defaults(capacity=6)      # room for kept turns and a shared checkpoint; still evicts
    p = sub.add_parser("chat", parents=[common],
                       help="interactive chat (software device, or a device at --link)",
                       epilog=CHAT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_args(p, sampling=True)
    p.add_argument("--link", help="socket://HOST:PORT (ringkv sim) or /dev/ttyUSB0 (board)")
    p.add_argument("--config", choices=["default", "demo"], default="default",
                   help="the device configuration (must match the device's)")
    p.add_argument("--numerics", choices=NUMERICS_CHOICES, default=None,
                   help="the device's attention numerics, must match the device's (default: "
                        "ringkv-fx1c with the trained weights' scales, as the board build; "
                        "ringkv-fx1 with random weights)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per device request")
    p.add_argument("--max-tokens", "--tokens", dest="tokens", type=int, default=32,
                   help="tokens to generate per line, at most")
    p.add_argument("--state", help="where the conversations are kept (default: beside "
                   "--image, or per --link in ~/.local/state/ringkv/chat/)")
    for name, text in (("sim", "run the simulated device behind a TCP socket "
                               "('ringkv sim --help')"),
                       ("serve", "OpenAI-compatible server ('ringkv serve --help')"),
                       ("bench", "run the benchmarks (a source checkout's bench/)"),
                       ("build", "synthesize a bitstream for --board"),
                       ("board", "board bring-up: 'board check --link URL' (self-test)")):
        sub.add_parser(name, help=text, add_help=False)
    p = sub.add_parser(
        "storage", parents=[common], help="list (ls) or check (fsck) a card image",
        description="List or check the records of a card image (its configuration read from "
                    "the records themselves), or check a device over its link.",
        epilog="ls lists every region: status, count, prefix hash, commit sequence, age, kind "
               "('turn' or 'checkpoint'), key ('open' or a sealed record's key id) and state: "
               "live, superseded (an older commit of a "
               "snapshot: normal), foreign (another configuration), torn (a write cut short) "
               "or corrupt. fsck reports what a rebuild keeps and frees; it changes nothing "
               "unless --repair. " + _fsck_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["ls", "fsck"])
    p.add_argument("image", nargs="?", help="the image (or --link)")
    p.add_argument("--link", help="fsck a device over its link (socket://HOST:PORT or a "
                   "serial port): every record read with SECTOR_READ and checked in depth "
                   "(header, config, payload CRC), nothing written")
    p.add_argument("--config", default=None,
                   help="an image: read it as this configuration ('default', 'demo' or fields "
                        "as JSON) instead of the one its records state (refused when the "
                        "records have another region layout); --link: the device's "
                        "(default or demo; default: default)")
    p.add_argument("--numerics", default=None, choices=NUMERICS_CHOICES,
                   help="the configuration's numerics (an image: default its records'; "
                        "--link: default ringkv-fx1c with the trained weights' scales, as the "
                        "board build)")
    p.add_argument("--all", action="store_true", help="ls: also list empty regions")
    p.add_argument("--regions", type=int, default=None,
                   help="scan only the first REGIONS regions")
    p.add_argument("--repair", action="store_true",
                   help="fsck: erase the headers of the foreign, torn and corrupt regions (the "
                        "device would free them at power-on); the only change fsck makes")
    p.add_argument("--key-file", default=None,
                   help="fsck of an image: verify sealed records' tags with the keys in this "
                        "file (one 'key_id hex' line per key; mode 0600 or stricter). Keys are "
                        "never taken from the command line")
    p.add_argument("--timeout", type=float, default=60.0, help="--link: seconds per request")
    return parser


def _fsck_help() -> str:
    from ringkv.host.record.image import FSCK_HELP
    return "fsck " + FSCK_HELP


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {value}")
    return value


def _cmd_demo(args, rest):
    _no_rest(rest, "demo")
    if args.software:
        return run_demo(args)
    if args.image:
        raise UsageError("--image goes with --software (the simulated devices keep their "
                         "images in the work directory)", param="image",
                         hint="use --workdir DIR to keep them")
    from ringkv.defs.config import DEMO_CONFIG
    from ringkv.sim.system_demo import run_system_demo
    model = None if args.random else _trained_or_none(DEMO_CONFIG)
    return run_system_demo(workdir=args.workdir, board=args.board,
                           config=_device_config(DEMO_CONFIG, args.numerics, model))


def _cmd_chat(args, rest):
    _no_rest(rest, "chat")
    return run_chat(args)


def _cmd_sim(args, rest):
    if any(a == "--board" or a.startswith("--board=") for a in rest):
        if "--sealed" in rest:
            raise UsageError("--sealed is not available with --board: the pin-level board "
                             "simulation is an open build",
                             hint="ringkv sim --sealed (without --board) simulates the sealed "
                                  "RingKVTop", param="sealed")
        from ringkv.sim.board_harness import main as board_main
        return board_main(rest)
    from ringkv.sim.harness import main as sim_main
    return sim_main(rest)


def _cmd_bench(args, rest):
    # the benchmarks live in the source checkout (bench/ beside the package), not installed
    root = Path(__file__).resolve().parent.parent
    if not (root / "bench" / "run.py").exists():
        raise UsageError("ringkv bench needs the source checkout's bench/ folder, which is "
                         f"not beside this installation ({root})",
                         hint="run it from a clone of the repository: make bench")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module("bench.run").main(rest)


def _cmd_serve(args, rest):
    from ringkv.serve.main import main as serve_main
    return serve_main(rest)


def _cmd_build(args, rest):
    from ringkv.boards.build import main as build_main
    return build_main(rest)


def _cmd_board(args, rest):
    if not rest or rest[0] != "check":
        raise UsageError("usage: ringkv board check --link URL [--config ...] [--force]",
                         hint="'ringkv board check --help' lists the options")
    from ringkv.host.device.board_check import main as check_main
    return check_main(rest[1:])


def _cmd_storage(args, rest):
    _no_rest(rest, "storage")
    if args.link:
        if args.action != "fsck":
            raise UsageError("--link goes with fsck", param="link")
        if args.image is not None:
            raise UsageError("give an IMAGE or --link, not both", param="link")
        if args.config not in (None, "default", "demo"):
            raise UsageError("--config with --link is 'default' or 'demo'", param="config")
        if args.repair:
            raise UsageError("--repair works on an image file; a device frees those regions "
                             "itself at power-on", param="repair")
        if args.key_file:
            raise UsageError("--key-file works on an image file", param="key_file")
        return run_fsck_link(args)
    if args.image is None:
        raise UsageError("storage needs an IMAGE (or fsck --link URL)", param="image")
    if args.action == "ls" and args.repair:
        raise UsageError("--repair goes with fsck", param="repair")
    if args.action == "ls" and args.key_file:
        raise UsageError("--key-file goes with fsck", param="key_file")
    from ringkv.host.record import main as record_main
    argv = [args.image] + (["--fsck"] if args.action == "fsck" else [])
    for flag, value in (("--config", args.config), ("--numerics", args.numerics),
                        ("--regions", args.regions), ("--key-file", args.key_file)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--all"] * args.all + ["--repair"] * args.repair
    return record_main(argv)


def _no_rest(rest, cmd):
    if rest:
        raise UsageError(f"unrecognized arguments: {' '.join(rest)}",
                         hint=f"'ringkv {cmd} --help' lists the options")


#: ``command -> handler(args, rest)``: ``rest`` are the arguments argparse left for a command
#: that parses its own (sim, bench, build, board).
COMMANDS = {"demo": _cmd_demo, "chat": _cmd_chat, "sim": _cmd_sim, "serve": _cmd_serve,
            "bench": _cmd_bench, "build": _cmd_build, "board": _cmd_board,
            "storage": _cmd_storage}


def _split_global(argv):
    """Pull ``--debug``, ``-v``, ``-q`` (and repeats) out of a delegated command's arguments,
    so that they work after any command."""
    keep, flags = [], {"debug": False, "verbose": 0, "quiet": 0}
    for a in argv:
        if a == "--debug":
            flags["debug"] = True
        elif a in ("-v", "--verbose") or (a.startswith("-v") and set(a[1:]) == {"v"}):
            flags["verbose"] += max(1, len(a) - 1) if a.startswith("-v") else 1
        elif a in ("-q", "--quiet"):
            flags["quiet"] += 1
        else:
            keep.append(a)
    return keep, flags


def setup_logging(level: int) -> None:
    """Messages of the ``ringkv`` loggers on standard error: progress (INFO) by default,
    ``-q`` warnings only, ``-v`` debug too. Other libraries' loggers stay at their own
    (warning) level: no chatter from the toolchain."""
    logger = logging.getLogger("ringkv")
    for h in list(logger.handlers):
        logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)

    class _Format(logging.Formatter):
        def format(self, record):
            text = record.getMessage()
            if record.levelno >= logging.WARNING:
                return f"ringkv: {record.levelname.lower()}: {text}"
            return text

    handler.setFormatter(_Format())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def main(argv=None) -> int:
    from ringkv.sim import procs
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args, rest = parser.parse_known_args(argv)
        rest, flags = _split_global(rest)
        debug = bool(args.debug or flags["debug"])
        verbose = (args.verbose or 0) + flags["verbose"] - (args.quiet or 0) - flags["quiet"]
        setup_logging(logging.DEBUG if verbose > 0 else
                      logging.WARNING if verbose < 0 else logging.INFO)
        if getattr(args, "backend", "") is None:
            args.backend = "fixed" if getattr(args, "image", None) else "float64"
        with procs.interruptible():
            return COMMANDS[args.cmd](args, rest) or 0
    except RingKVError as e:
        if debug:
            raise
        print("\n".join(error_lines(e)), file=sys.stderr)
        return int(e.exit_code)
    except KeyboardInterrupt:
        if debug:
            raise
        print("ringkv: interrupted; stopped its child processes and removed its temporary "
              "files", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:             # `ringkv storage ls IMAGE | head`
        sys.stderr.close()
        return int(ExitCode.FAILURE)


if __name__ == "__main__":
    sys.exit(main())
