"""``ringkv bench``: the benchmarks of a source checkout (``bench/run.py`` beside the package;
they are not installed), which parse their own options.
"""

import importlib
import sys
from pathlib import Path

from ringkv.host.errors import UsageError

__all__ = ["add_parser", "run"]


def add_parser(sub, common):
    """``ringkv bench`` on the subparsers ``sub``: its options are ``bench.run``'s."""
    sub.add_parser("bench", help="run the benchmarks (a source checkout's bench/)",
                   add_help=False)


def run(args, rest) -> int:
    """``ringkv bench ARGS``: ``bench.run.main(ARGS)`` of the checkout this package is in."""
    # the benchmarks live in the source checkout (bench/ beside the package), not installed
    root = Path(__file__).resolve().parent.parent.parent
    if not (root / "bench" / "run.py").exists():
        raise UsageError("ringkv bench needs the source checkout's bench/ folder, which is "
                         f"not beside this installation ({root})",
                         hint="run it from a clone of the repository: make bench")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module("bench.run").main(rest)
