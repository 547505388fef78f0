"""RingKV: persistent KV-cache snapshots and sliding-window attention on an FPGA.

The package ``ringkv`` is the command-line tool (:mod:`ringkv.cli`, which may import everything)
and :mod:`ringkv.defs`; ``pyproject.toml`` maps the folders ``hw/``, ``host/``, ``sim/`` and
``boards/`` to ``ringkv.hw``, ``ringkv.host``, ``ringkv.sim`` and ``ringkv.boards``.
"""
