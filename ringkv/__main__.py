"""``python -m ringkv``: the command line (see :mod:`ringkv.cli`)."""

import sys

from .cli import main

sys.exit(main())
