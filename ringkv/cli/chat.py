"""``ringkv chat``: an interactive chat with the software device, or with a device at ``--link
URL`` (``socket://`` for ``ringkv sim``, ``/dev/ttyUSB0`` for the board), greedy or sampled
(``--temperature``, ``--top-p``, ``--top-k``, ``--seed``, ``--max-tokens``, ``--stop``).

The whole loop lives here (:func:`run_chat`): the user's lines (readline history on a terminal),
the slash commands (:data:`CHAT_HELP`), a link that drops and comes back, and the host's side of
the conversations kept in a state file so that chat started again resumes them.
"""

import argparse
import sys
from pathlib import Path

from ringkv.host.errors import LinkError, RingKVError, UsageError

from .common import (
    NUMERICS_CHOICES,
    backend,
    base_config,
    device_config,
    load_model,
    model_args,
    model_name,
    no_rest,
    numerics_name,
    open_device,
)

__all__ = ["add_parser", "run", "run_chat", "CHAT_HELP"]


#: chat's slash commands (``/help``, and the epilog of ``ringkv chat --help``)
CHAT_HELP = """commands:
  /session NAME   switch to (or start) the conversation NAME
  /retry          answer the last message of this conversation again
  /edit TEXT      replace the last message with TEXT and answer it
  /sessions       list the conversations
  /reconnect      open the link to the device again (after it dropped or restarted)
  /help           this list
  /quit           end (Ctrl-D too); conversations are kept in the state file"""


def add_parser(sub, common):
    """``ringkv chat``'s options on the subparsers ``sub`` (``common``: the global options)."""
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


def run(args, rest) -> int:
    """``ringkv chat``: the chat loop until ``/quit`` or the end of the input."""
    no_rest(rest, "chat")
    return run_chat(args)


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
    from ringkv.host.model import BOS, encode_text, show_text
    from ringkv.host.model.sampling import Sampler, SamplingParams
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
    model = load_model(args, base_config(args.config))
    config = device_config(base_config(args.config), args.numerics, model)
    if args.link:
        device, st = open_device(args.link, config, args.timeout)
        print(f"device at {args.link}: {st['live']} stored snapshots, {st['freed']} regions "
              f"freed by its recovery; next commit {st['next_seq']} "
              f"('ringkv storage fsck --link' checks every record in depth)")
        where = f"device at {args.link}"
    else:
        device = SoftwareDevice(config, attention=backend(args.backend, config),
                                capacity=args.capacity, image=args.image)
        where = "software device"
    state = _chat_state_path(args, config)
    sessions = _load_chat_state(state)
    sched = Scheduler(model, device, chunk=args.chunk, sessions=sessions)
    sid = "default"
    last = {}       # session -> (stream position its last message started at, its tokens)
    connected = True
    print(f"ringkv chat ({where}, {numerics_name(config)}; model {model_name(model)}). "
          f"'/help' lists the commands, '/quit' ends."
          + (f" Resumed sessions: {', '.join(sorted(sessions))}." if sessions else ""),
          flush=True)

    def reconnect():
        nonlocal connected
        try:
            sched.device.link.close()
        except Exception:                                   # noqa: BLE001 (already gone)
            pass
        sched.device, st = open_device(args.link, config, args.timeout)
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
