"""``ringkv serve``: the OpenAI-compatible server (:mod:`ringkv.serve`), which parses its own
options (:mod:`ringkv.serve.main`).
"""

__all__ = ["add_parser", "run"]


def add_parser(sub, common):
    """``ringkv serve`` on the subparsers ``sub``: its options are the server's own."""
    sub.add_parser("serve", help="OpenAI-compatible server ('ringkv serve --help')",
                   add_help=False)


def run(args, rest) -> int:
    """``ringkv serve ARGS``: :func:`ringkv.serve.main.main` ``(ARGS)``."""
    from ringkv.serve.main import main as serve_main
    return serve_main(rest)
