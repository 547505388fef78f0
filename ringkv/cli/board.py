"""``ringkv board check``: the bring-up self-test of a device at ``--link URL`` (the board's
serial port, or ``ringkv sim``'s socket; :mod:`ringkv.host.device.board_check` parses its options).
"""

from ringkv.host.errors import ArgumentParser, UsageError

__all__ = ["add_parser", "run"]


def add_parser(sub, common):
    """``ringkv board`` on the subparsers ``sub``: ``check``'s options are its own."""
    sub.add_parser("board", help="board bring-up: 'board check --link URL' (self-test)",
                   add_help=False)


def _help_parser() -> ArgumentParser:
    """What ``ringkv board --help`` prints."""
    p = ArgumentParser(prog="ringkv board", usage="%(prog)s [-h] check --link URL [OPTIONS]",
                       description="Board bring-up.",
                       epilog="'ringkv board check --help' lists check's options.")
    p.add_argument("action", choices=["check"],
                   help="check: the bring-up self-test of a device at --link URL (the board's "
                        "serial port, or ringkv sim's socket)")
    return p


def run(args, rest) -> int:
    """``ringkv board check ARGS``: :func:`ringkv.host.device.board_check.main` ``(ARGS)``."""
    if rest[:1] in (["-h"], ["--help"]):
        _help_parser().print_help()
        return 0
    if not rest or rest[0] != "check":
        raise UsageError("usage: ringkv board check --link URL [--config ...] [--force]",
                         hint="'ringkv board check --help' lists the options")
    from ringkv.host.device.board_check import main as check_main
    return check_main(rest[1:])
