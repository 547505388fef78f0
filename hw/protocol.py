"""The link protocol's Amaranth shapes; the protocol itself is :mod:`ringkv.defs.protocol`.

``Op`` and ``Status`` are the definitions' opcodes and response codes as 8-bit
``amaranth.lib.enum`` shapes (:func:`ringkv.hw.enums.shaped`); ``CRC16`` is the frame CRC
(``FRAME_CRC``) as ``amaranth.lib.crc`` parameters for the frame decoder and encoder.
"""

from amaranth.lib import crc

from ringkv.defs import protocol as defs

from .enums import shaped

__all__ = ["Op", "Status", "CRC16"]

Op = shaped(defs.Op, defs.OP_BITS, module=__name__)
Status = shaped(defs.Status, defs.STATUS_BITS, module=__name__)
#: The frame CRC, byte-wide input.
CRC16 = crc.Algorithm(**defs.FRAME_CRC.algorithm_kwargs())(data_width=8)
