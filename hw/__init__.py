"""``ringkv.hw`` (folder ``hw/``): the gateware, one ``wiring.Component`` per module.

It may import only Amaranth, the standard library and ``ringkv.defs``: a core never sees the
host, the simulation harness or the boards, so it can be lifted into another design with
``ringkv.defs`` alone.
"""
