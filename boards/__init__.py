"""``ringkv.boards`` (folder ``boards/``): board top-levels, synthesis and bitstream builds.

It may import ``ringkv.defs``, ``ringkv.hw`` and the toolchain helpers of ``ringkv.sim``
(``toolchain``, ``verilog``), and any installed tool.
"""
