"""``ringkv build``: the board bitstream (:mod:`ringkv.boards.build`, which parses the
command's options).
"""

__all__ = ["add_parser", "run"]


def add_parser(sub, common):
    """``ringkv build`` on the subparsers ``sub``: its options are the board build's own."""
    sub.add_parser("build", help="synthesize a bitstream for --board", add_help=False)


def run(args, rest) -> int:
    """``ringkv build ARGS``: :func:`ringkv.boards.build.main` ``(ARGS)``."""
    from ringkv.boards.build import main as build_main
    return build_main(rest)
