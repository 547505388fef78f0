"""``ringkv.defs``: the definitions both sides share, in plain Python.

The device configuration and its digest (:mod:`.config`), the link protocol (:mod:`.protocol`:
opcodes, statuses, frame constants, every request and response layout), the record format
(:mod:`.record`), the attention numerics (:mod:`.numerics`), the hash constants (:mod:`.hash`),
the directory's and the hot tier's interfaces (:mod:`.directory`, :mod:`.hot_tier`), the CRC
parameters (:mod:`.crc`) and the parameter checks every core and definition uses
(:mod:`.checks`). It may import only the standard library: the gateware (``ringkv.hw``) and
the host (``ringkv.host``) both import it, and it imports neither.
"""
