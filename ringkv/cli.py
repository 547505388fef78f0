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
the board bitstream, ``storage ls`` lists the records in an image and ``storage fsck`` checks
it (exit status 1 when a rebuild would free a region), ``bench`` the benchmarks.
"""

import argparse
import importlib
import sys
import time

__all__ = ["main", "run_demo"]


def _need(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise SystemExit(f"ringkv: {what} is not available yet: module {module} is missing "
                             f"(it comes with the whole-system issue)") from None
        raise


def _backend(name, config):
    from ringkv.host.model import FixedBackend, Float64Backend
    return FixedBackend(config) if name == "fixed" else Float64Backend(config)


def _model(args, config):
    """``--weights FILE``, else the random model (``--random``, of ``--seed``), else the trained
    weights shipped for ``config``'s shape."""
    from ringkv.host.model import Model
    if args.weights:
        return Model.load(args.weights, config)
    if args.random:
        small = config.head_dim * config.q_heads < 256
        return Model(config, hidden=64 if small else 256, ffn=128 if small else 512,
                     seed=args.weights_seed if hasattr(args, "weights_seed") else args.seed)
    return Model.trained(config)


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

    from ringkv.host.model import BOS, encode_text
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
    from ringkv.host.model import show_text
    from ringkv.host.scheduler import (
        Scheduler,
        SoftwareDevice,
        event_notes,
        path_summary,
        plain_run,
    )
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

    from ringkv.host.calibrate import calibrated_config
    fracs = getattr(model, "qkv_fracs", None)
    if numerics is None:
        numerics = "ringkv-fx1c" if fracs else "ringkv-fx1"
    if numerics == "ringkv-fx1c":
        if not fracs:
            raise SystemExit("ringkv: ringkv-fx1c needs weights with calibrated q/k/v scales "
                             "(the shipped trained ones, or python -m ringkv.host.calibrate "
                             "FILE --write); use --numerics ringkv-fx1 with these")
        return calibrated_config(base, fracs)
    return dataclasses.replace(base, numerics=numerics, qkv_fracs=())


def _numerics_name(config) -> str:
    if not config.qkv_fracs:
        return config.numerics
    return (f"{config.numerics} (Fq,Fk,Fv) per layer "
            + " ".join("(" + ",".join(map(str, t)) + ")" for t in config.qkv_fracs))


def _trained_or_none(config):
    """The shipped trained model of ``config``'s shape, or ``None`` when there is none."""
    from ringkv.host.model import Model, weights_path
    return Model.trained(config) if weights_path(config).exists() else None


def _wait_device(device, where):
    """Wait for the device's own recovery scan (power-on), showing its progress."""
    def progress(st):
        print(f"\rdevice at {where}: recovering its directory, {st['scanned']}/"
              f"{st['regions']} regions", end="", file=sys.stderr, flush=True)
    try:
        st = device.wait_ready(progress=progress)
    finally:
        print("", end="\r", file=sys.stderr, flush=True)
    return st


def run_fsck_link(args) -> int:
    """``ringkv storage fsck --link URL``: the deep check over the link (read only)."""
    from ringkv.host.fpga_device import DeviceNotReady, FpgaDevice
    from ringkv.host.link import Link
    from ringkv.host.record import fsck_report
    config = _device_config(_base_config(args.config), args.numerics,
                            _trained_or_none(_base_config(args.config)))
    device = FpgaDevice(Link(args.link, timeout=args.timeout), config)
    device.check_config()
    try:
        st = _wait_device(device, args.link)
        print(f"device recovery: {st['scanned']} regions, {st['live']} live, {st['freed']} "
              f"freed, next commit {st['next_seq']}, {st['cycles']} clocks")
    except DeviceNotReady as e:
        print(f"device recovery failed: {e} (the deep check reads the card anyway)")
    infos, _ = device.check()
    report, to_free = fsck_report(infos)
    print(report)
    return 1 if to_free else 0


def run_chat(args) -> int:
    import json
    from pathlib import Path

    from ringkv.host.errors import UsageError
    from ringkv.host.model import BOS, encode_text, show_text
    from ringkv.host.sampling import Sampler, SamplingParams
    from ringkv.host.scheduler import Scheduler, Session, SoftwareDevice
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, max_tokens=args.tokens,
                                stop=tuple(args.stop or ()))
    except UsageError as e:
        print(f"ringkv chat: --{e.param.replace('_', '-')}: {e}", file=sys.stderr)
        return 2
    stops = [x.encode("utf-8") for x in params.stop]
    sampler = Sampler(params)        # one generator for the chat: a seeded chat replays
    model = _model(args, _base_config(args.config))
    config = _device_config(_base_config(args.config), args.numerics, model)
    if args.link:
        from ringkv.host.fpga_device import FpgaDevice
        from ringkv.host.link import Link
        link = Link(args.link, timeout=args.timeout)
        device = FpgaDevice(link, config)
        device.check_config()        # refuses a device built for another configuration
        st = _wait_device(device, args.link)
        print(f"device at {args.link}: {st['live']} stored snapshots, {st['freed']} regions "
              f"freed by its recovery; next commit {st['next_seq']} "
              f"('ringkv storage fsck --link' checks every record in depth)")
        where = f"device at {args.link}"
    else:
        device = SoftwareDevice(config, attention=_backend(args.backend, config),
                                capacity=args.capacity, image=args.image)
        where = "software device"
    # the host's side of each conversation (its tokens) beside the device's image, so that a
    # chat started again on the same image resumes its sessions where they stopped
    state = Path(args.image + ".sessions.json") if args.image else None
    sessions = {}
    if state is not None and state.exists():
        sessions = {sid: Session(tokens=v["tokens"], pending=v["pending"],
                                 key=tuple(v["key"]) if v["key"] else None,
                                 turns=v.get("turns", []))
                    for sid, v in json.loads(state.read_text()).items()}
    sched = Scheduler(model, device, chunk=args.chunk, sessions=sessions)
    sid = "default"
    last = {}       # session -> (stream position its last message started at, its tokens)
    print(f"ringkv chat ({where}, {_numerics_name(config)}; model {_model_name(model)}). "
          f"'/session NAME' switches, "
          f"'/retry' answers the last message again, '/edit TEXT' replaces it, '/quit' ends."
          + (f" Resumed sessions: {', '.join(sorted(sessions))}." if sessions else ""))
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line in ("/quit", "/exit"):
            break
        if line.startswith("/session "):
            sid = line.split(None, 1)[1]
            continue
        opts = {}
        if line == "/retry" or line.startswith("/edit "):
            if sid not in last:
                print(f"[{sid}] no message of this chat to {line[1:].split()[0]} yet",
                      flush=True)
                continue
            start, tokens = last[sid]           # edit-and-resend: the stream cut before it
            if line.startswith("/edit "):
                tokens = ([BOS] if start == 0 else []) + encode_text(line.split(None, 1)[1])
            opts = {"rewind": start}
        else:
            first = sid not in sched.sessions
            start = 0 if first else len(sched.sessions[sid].stream)
            tokens = ([BOS] if first else []) + encode_text(line)
        made = bytearray()

        def stop_at(token, made=made):
            made.append(token if token < 256 else 0)
            return any(made.endswith(x) for x in stops)

        out = sched.request(sid, tokens, params.max_tokens, sample=sampler, on_token=stop_at,
                            **opts)
        for x in stops:                 # a stop sequence ends the answer and is not shown
            if made.endswith(x):
                out = out[:len(out) - len(x)]
        last[sid] = (start, tokens)
        e = sched.events[-1]
        print(f"[{sid} {e['path']} {e['after']} tokens] {show_text(out)}", flush=True)
        if state is not None:
            state.write_text(json.dumps({k: {"tokens": v.tokens, "pending": v.pending,
                                             "key": v.key, "turns": v.turns}
                                         for k, v in sched.sessions.items()}))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ringkv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    def model_args(p, sampling=False):
        p.add_argument("--backend", choices=["float64", "fixed"], default="float64",
                       help="attention in the FPGA's place: float64 rings or the bit-exact "
                            "fixed-point core model")
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
        p.add_argument("--chunk", type=int, default=64, help="prefill chunk")
        p.add_argument("--capacity", type=int, default=2,
                       help="records (turn snapshots and checkpoints) the store holds")
        p.add_argument("--image", help="persist the software store to this file")

    p = sub.add_parser("demo", help="end-to-end scenario on simulated FPGAs (Verilator)")
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
    p = sub.add_parser("chat", help="interactive chat (software device, or check a --link)")
    model_args(p, sampling=True)
    p.add_argument("--link", help="socket://HOST:PORT (ringkv sim) or /dev/ttyUSB0 (board)")
    p.add_argument("--config", choices=["default", "demo"], default="default",
                   help="the device configuration (must match the device's)")
    p.add_argument("--numerics", choices=NUMERICS_CHOICES, default=None,
                   help="the device's attention numerics, must match the device's (default: "
                        "ringkv-fx1c with the trained weights' scales, as the board build; "
                        "ringkv-fx1 with random weights)")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--max-tokens", "--tokens", dest="tokens", type=int, default=32,
                   help="tokens to generate per line, at most")
    sub.add_parser("sim", help="run the simulated device behind a TCP socket",
                   add_help=False)
    sub.add_parser("bench", help="run the benchmarks (python -m bench.run)", add_help=False)
    sub.add_parser("serve", help="OpenAI-compatible server (ringkv serve --help)",
                   add_help=False)
    sub.add_parser("build", help="synthesize a bitstream for --board", add_help=False)
    sub.add_parser("board", help="board bring-up: 'board check --link URL' (self-test)",
                   add_help=False)
    p = sub.add_parser(
        "storage", help="inspect (ls) or check (fsck) a storage image",
        description="Inspect a storage image with the golden record scan (read only).",
        epilog="ls: list the records (status, count, prefix hash, commit sequence, age, kind: "
               "'turn' for a session's snapshot or 'checkpoint' for a prefix checkpoint, why a "
               "region is unusable or superseded). fsck: report the live records a rebuild "
               "keeps and every non-empty region it would free, with the reason; exit status "
               "0 when clean, 1 when it found a region to free (2: the image cannot be "
               "read). Options after IMAGE: "
               "--regions R, --numerics N, --all (ls).")
    p.add_argument("action", choices=["ls", "fsck"])
    p.add_argument("image", nargs="?", help="the image (or --link)")
    p.add_argument("--link", help="fsck a device over its link (socket://HOST:PORT or a "
                   "serial port): every record read with SECTOR_READ and checked in depth "
                   "(header, config, payload CRC), nothing written")
    p.add_argument("--config", default="default", choices=["default", "demo"],
                   help="the device's configuration "
                   "(with --link): default or demo")
    p.add_argument("--numerics", default=None, choices=NUMERICS_CHOICES,
                   help="the device's numerics (an image: default ringkv-fx1, ringkv-fx1c is "
                        "the board's; --link: default ringkv-fx1c with the trained weights' "
                        "scales, as the board build)")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    args, rest = parser.parse_known_args(argv)
    if args.cmd == "demo":
        if args.software:
            return run_demo(args)

        from ringkv.defs.config import DEMO_CONFIG
        from ringkv.sim.system_demo import run_system_demo
        model = None if args.random else _trained_or_none(DEMO_CONFIG)
        return run_system_demo(workdir=args.workdir, board=args.board,
                               config=_device_config(DEMO_CONFIG, args.numerics, model))
    if args.cmd == "chat":
        return run_chat(args)
    if args.cmd == "sim":
        if any(a == "--board" or a.startswith("--board=") for a in rest):
            return _need("ringkv.sim.board_harness", "the board simulation").main(rest)
        return _need("ringkv.sim.harness", "the simulator server").main(rest)
    if args.cmd == "serve":
        return _need("ringkv.serve.main", "the server").main(rest)
    if args.cmd == "bench":
        return _need("bench.run", "the benchmark runner").main(rest)
    if args.cmd == "build":
        return _need("ringkv.boards.build", "the board build").main(rest)
    if args.cmd == "board":
        if not rest or rest[0] != "check":
            print("usage: ringkv board check --link URL [--config ...] [--force] "
                  "(ringkv board check --help)", file=sys.stderr)
            return 2
        return _need("ringkv.host.board_check", "the board check").main(rest[1:])
    if args.cmd == "storage":
        if args.link is None and "--link" in args.rest:
            # argparse gives the options after an omitted IMAGE to the remainder
            extra = argparse.ArgumentParser(prog="ringkv storage fsck")
            for name, default in (("--link", None), ("--config", args.config),
                                  ("--numerics", args.numerics), ("--timeout", args.timeout)):
                extra.add_argument(name, default=default,
                                   type=float if name == "--timeout" else str)
            for key, value in vars(extra.parse_args(args.rest)).items():
                setattr(args, key, value)
        if args.link:
            if args.action != "fsck":
                parser.error("--link goes with fsck")
            return run_fsck_link(args)
        if args.image is None:
            parser.error("storage needs an IMAGE (or fsck --link URL)")
        fsck = ["--fsck"] if args.action == "fsck" else []
        if args.numerics not in (None, "ringkv-fx1"):
            fsck += ["--numerics", args.numerics]
        return _need("ringkv.host.record", "the record scanner").main(
            [args.image, *args.rest, *fsck])
    parser.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
