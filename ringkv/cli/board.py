"""``ringkv board check``: the bring-up self-test of a device at ``--link URL`` (the board's
serial port, or ``ringkv sim``'s socket; :mod:`ringkv.host.board_check` parses its options).
"""

from ringkv.host.errors import UsageError

__all__ = ["add_parser", "run"]


def add_parser(sub, common):
    """``ringkv board`` on the subparsers ``sub``: ``check``'s options are its own."""
    sub.add_parser("board", help="board bring-up: 'board check --link URL' (self-test)",
                   add_help=False)


def run(args, rest) -> int:
    """``ringkv board check ARGS``: :func:`ringkv.host.board_check.main` ``(ARGS)``."""
    if not rest or rest[0] != "check":
        raise UsageError("usage: ringkv board check --link URL [--config ...] [--force]",
                         hint="'ringkv board check --help' lists the options")
    from ringkv.host.board_check import main as check_main
    return check_main(rest[1:])
