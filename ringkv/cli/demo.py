"""``ringkv demo``: the end-to-end scenario on simulated FPGAs (Verilator,
:mod:`ringkv.sim.system_demo`; ``--board ulx3s-85f``: the pin-level simulation of the board top),
or with ``--software`` on the software device (:func:`run_demo`): interleaved sessions, three
conversations behind one shared system prompt, an edit-and-resend, an evicted session and one
growing to several W, every generated token checked against a plain run with no reuse.
"""

import time

from ringkv.host.errors import UsageError

from .common import (
    NUMERICS_CHOICES,
    backend,
    check_weights,
    device_config,
    load_model,
    model_args,
    model_name,
    no_rest,
    numerics_name,
    trained_or_none,
)

__all__ = ["add_parser", "run", "run_demo", "demo_script", "SYSTEM_PROMPT"]


def add_parser(sub, common):
    """``ringkv demo``'s options on the subparsers ``sub`` (``common``: the global options)."""
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
    p.add_argument("--sdram", nargs="?", const="", default=None, metavar="PART",
                   help="the simulated devices with the SDRAM hot tier (ringkv sim --sdram; "
                        "PART default the ULX3S's 32 MB part); not with --board or "
                        "--software")
    p.set_defaults(capacity=6)      # room for kept turns and a shared checkpoint; still evicts


def run(args, rest) -> int:
    """``ringkv demo``: the software device's scenario, or the simulated devices'."""
    no_rest(rest, "demo")
    check_weights(args)
    if args.software and args.sdram is not None:
        raise UsageError("--sdram goes with the simulated demo (not --software)",
                         param="sdram")
    if args.software:
        return run_demo(args)
    if args.image:
        raise UsageError("--image goes with --software (the simulated devices keep their "
                         "images in the work directory)", param="image",
                         hint="use --workdir DIR to keep them")
    _software_only(args)
    if args.sdram is not None and args.board:
        raise UsageError("--sdram is not available with --board: the board top has no SDRAM "
                         "hot tier yet", param="sdram")
    from ringkv.defs.config import DEMO_CONFIG
    from ringkv.sim.system_demo import run_system_demo
    model = None if args.random else trained_or_none(DEMO_CONFIG)
    return run_system_demo(workdir=args.workdir, board=args.board, sdram=args.sdram,
                           config=device_config(DEMO_CONFIG, args.numerics, model))


#: The options only ``demo --software`` reads, with their defaults: the simulated demo runs the
#: shipped trained model (or ``--random``'s) through the devices' own fixed-point cores with its
#: own store, so a value given for one of these would be silently ignored there. (``--backend``
#: is float64 by then unless given: the entry module fills it in, ``--image`` being refused.)
SOFTWARE_ONLY = {"weights": None, "backend": "float64", "seed": 0, "chunk": 64, "capacity": 6}


def _software_only(args) -> None:
    given = [name for name, default in SOFTWARE_ONLY.items()
             if getattr(args, name, default) != default]
    if given:
        options = ", ".join(f"--{name}" for name in given)
        raise UsageError(f"{options} {'goes' if len(given) == 1 else 'go'} with --software: the "
                         "simulated demo runs the shipped trained model (or --random's) on the "
                         "devices' own cores and store", param=given[0],
                         hint="add --software to run the scenario on the software device "
                              "with these options")


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
    """``demo --software``: the scenario on the software device, every generated token checked
    against a plain run with no reuse (exit status 1 on a mismatch)."""
    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.host.device.software import SoftwareDevice
    from ringkv.host.model import show_text
    from ringkv.host.scheduler import Scheduler, event_notes, path_summary, plain_run
    model = load_model(args, DEFAULT_CONFIG)
    config = device_config(DEFAULT_CONFIG, getattr(args, "numerics", None), model)
    device = SoftwareDevice(config, attention=backend(args.backend, config),
                            capacity=args.capacity, image=args.image)
    sched = Scheduler(model, device, chunk=args.chunk)
    reqs = _resolve(demo_script(args.seed))
    print(f"RingKV demo (software device, {args.backend} attention): layers={config.layers} "
          f"Hq={config.q_heads} Hkv={config.kv_heads} d={config.head_dim} W={config.window}, "
          f"numerics {numerics_name(config)}, "
          f"store capacity {args.capacity} records; model {model_name(model)}\n")
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
                    lambda: backend(args.backend, config), chunk=args.chunk)
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

