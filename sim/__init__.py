"""``ringkv.sim`` (folder ``sim/``): simulation harness, device models and test helpers.

It may import ``ringkv.defs``, ``ringkv.hw`` and ``ringkv.host`` (it builds the gateware and
drives it with the host's code) and any installed tool, but not ``ringkv.boards``.
"""
