"""``ringkv.host.golden``: the golden models -- one independent Python implementation per
block of the gateware, against which the block is checked bit for bit (hash, directory, record
MAC, the fixed-point attention datapath in each numerics, the UART line, QUERY_PREFIX), and the
float64 references of the attention itself (sliding window, ring buffer, masks).

It may import the standard library, numpy and ``ringkv.defs`` only: never the gateware, and
nothing else of the host (``tests/repo/test_layers.py``). Each model is a module of its own;
nothing is re-exported, so a test names the model it checks against
(``from ringkv.host.golden.hash import prefix_hashes``).
"""

__all__ = []
