"""The ``ringkv`` entry point: the top-level parser, the dispatch to the command modules and
the mapping of errors to exit codes.

Errors: every ordinary failure is a :class:`~ringkv.host.errors.RingKVError`; :func:`main`
prints it as one line ``ringkv: ...`` (and a ``hint:`` line) on standard error and exits with
its code (:data:`EXIT_CODES`); the traceback only with ``--debug``. Ctrl-C and SIGTERM stop
every child process a command started and remove its temporary files
(:mod:`ringkv.sim.procs`), exit status 130.

A new command is a module beside this one with ``add_parser(sub, common)`` (its subparser on
``sub``; ``common``: the global options, as a parent parser) and ``run(args, rest) -> int``
(``rest``: the arguments argparse left, for a command that parses its own), and an entry in
:data:`COMMANDS`.
"""

import argparse
import logging
import sys

from ringkv.host.errors import ArgumentParser, ExitCode, RingKVError, error_lines

from . import bench, board, build, chat, demo, serve, sim, storage, tokenizer
from .common import global_options

__all__ = ["main", "build_parser", "setup_logging", "COMMANDS", "EXIT_CODES"]

#: ``ringkv --help``'s first line
DESCRIPTION = ("``ringkv`` command line: demo, chat, serve, sim, bench, build, board, storage, "
               "tokenizer.")

#: ``command -> module`` (its ``add_parser`` and ``run``), in the order ``ringkv --help`` lists
#: them. sim, serve, bench, build, board and storage parse their own options (``rest``).
COMMANDS = {"demo": demo, "chat": chat, "sim": sim, "serve": serve, "bench": bench,
            "build": build, "board": board, "storage": storage, "tokenizer": tokenizer}

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


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("ringkv")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser, with one subparser per command of :data:`COMMANDS`."""
    parser = ArgumentParser(prog="ringkv", description=DESCRIPTION,
                            epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ringkv {_version()}")
    global_options(parser, default=None)
    common = ArgumentParser(add_help=False)
    global_options(common, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND",
                                parser_class=ArgumentParser)
    for command in COMMANDS.values():
        command.add_parser(sub, common)
    return parser


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
            return COMMANDS[args.cmd].run(args, rest) or 0
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

