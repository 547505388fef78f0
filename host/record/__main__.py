"""``python -m ringkv.host.record IMAGE ...``: the storage tool (:func:`.image.main`), its
errors as one line and an exit status (:func:`ringkv.host.errors.run_main`)."""

import sys

from ..errors import run_main
from .image import main

__all__ = []

if __name__ == "__main__":
    sys.exit(run_main(main))
