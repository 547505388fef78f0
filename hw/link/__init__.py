"""``ringkv.hw.link``: the byte link to the host -- the UART and the frame decoder/encoder.

A byte stream in (``UART.rx`` pin or any ``stream.Signature(8)``), request headers and
CRC-checked payload bytes out; responses framed back into bytes. It may import Amaranth, the
standard library, ``ringkv.defs`` and the shared ``ringkv.hw.protocol`` shapes; it knows
nothing of the store, storage, attention or sealing (``tests/repo/test_layers.py``).
"""

from .framing import FrameDecoder, FrameEncoder
from .uart import UART, UARTReceiver, UARTTransmitter, divisor_for

__all__ = ["UART", "UARTReceiver", "UARTTransmitter", "divisor_for", "FrameDecoder",
           "FrameEncoder"]
