"""``python -m ringkv.cli``: the command line, as ``python -m ringkv`` (:func:`ringkv.cli.main`)."""

import sys

from .entry import main

__all__: list[str] = []

sys.exit(main())
