"""Golden model of the link's framing: encoder and resynchronising decoder.

Bit-exact with :mod:`ringkv.hw.link.framing`: the RTL ``FrameDecoder`` accepts exactly the frames
:class:`Decoder` accepts, and reports the same errors in the same order, for any byte string. A
link timeout (the line idle for longer than the decoder's ``timeout`` while inside a frame) is
the item :data:`GAP` in the input.

The decoder is a state machine without backtracking: after an error it hunts for the next SYNC
byte *after* the bytes it has consumed. A frame whose length field was corrupted to a larger
value therefore swallows what follows until its length is reached or the line goes idle
(timeout); the host, which waits for each response, sees a timeout and retries.
"""

import binascii
from collections.abc import Iterable
from dataclasses import dataclass

from ringkv.defs.protocol import DEFAULT_MAX_PAYLOAD, RESPONSE_FLAG, SYNC, Op, Status

__all__ = ["GAP", "Frame", "FrameError", "Decoder", "encode_request", "encode_response",
           "decode_frames", "crc16", "VALID_OPS"]

#: Marks an idle line longer than the decoder's timeout in a byte sequence.
GAP = None

VALID_OPS = frozenset(op.value for op in Op)


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM of ``data`` (the frame CRC, :data:`ringkv.defs.protocol.FRAME_CRC`)."""
    return binascii.crc_hqx(bytes(data), 0)


@dataclass(frozen=True)
class Frame:
    """A frame whose CRC checked. ``status`` is ``None`` for requests."""
    op: int
    seq: int
    payload: bytes
    status: int | None = None


@dataclass(frozen=True)
class FrameError:
    """A dropped frame: ``status`` is a :class:`Status` value; ``op``/``seq`` as received so far
    (0 where not yet received)."""
    status: int
    op: int
    seq: int


def _u8(name, value):
    value = int(value.value if hasattr(value, "value") else value)
    if not 0 <= value <= 0xFF:
        raise ValueError(f"{name} must be in 0..255, not {value!r}")
    return value


def encode_request(op, seq: int, payload: bytes = b"") -> bytes:
    """``SYNC op seq len_lo len_hi payload crc_hi crc_lo``."""
    payload = bytes(payload)
    if len(payload) > 0xFFFF:
        raise ValueError(f"payload of {len(payload)} bytes exceeds the 16-bit length field")
    body = bytes([_u8("op", op), _u8("seq", seq)]) + len(payload).to_bytes(2, "little") + payload
    return bytes([SYNC]) + body + crc16(body).to_bytes(2, "big")


def encode_response(op, seq: int, status, payload: bytes = b"") -> bytes:
    """``SYNC op|0x80 seq status len_lo len_hi payload crc_hi crc_lo``."""
    payload = bytes(payload)
    if len(payload) > 0xFFFF:
        raise ValueError(f"payload of {len(payload)} bytes exceeds the 16-bit length field")
    body = (bytes([_u8("op", op) | RESPONSE_FLAG, _u8("seq", seq), _u8("status", status)])
            + len(payload).to_bytes(2, "little") + payload)
    return bytes([SYNC]) + body + crc16(body).to_bytes(2, "big")


class Decoder:
    """Incremental frame decoder (requests, or responses with ``response=True``).

    :meth:`feed` takes bytes and :data:`GAP` items and returns the completed events
    (:class:`Frame` or :class:`FrameError`). Checks, in order: length bound (as soon as the length
    field is in), CRC, then (requests only) the opcode.
    """

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD, *, response: bool = False):
        self.max_payload = max_payload
        self.response = response
        self.reset()

    def reset(self):
        self.state = "hunt"
        self.op = self.seq = self.status = self.length = 0
        self.body = bytearray()
        self.payload = bytearray()
        self.crc = 0

    @property
    def idle(self) -> bool:
        """True when between frames (hunting for SYNC)."""
        return self.state == "hunt"

    def _error(self, status):
        event = FrameError(int(status.value), self.op, self.seq)
        self.state = "hunt"
        return event

    def feed(self, data: Iterable) -> list:
        events = []
        for b in data:
            event = self._step(b)
            if event is not None:
                events.append(event)
        return events

    def _step(self, b):
        if b is GAP:
            if self.state != "hunt":
                return self._error(Status.TIMEOUT)
            return None
        st = self.state
        if st == "hunt":
            if b == SYNC:
                self.op = self.seq = self.status = self.length = 0
                self.body = bytearray()
                self.payload = bytearray()
                self.state = "op"
            return None
        if st in ("crc0", "crc1"):
            self.crc = (self.crc << 8) | b
            if st == "crc0":
                self.state = "crc1"
                return None
            self.state = "hunt"
            if (self.crc & 0xFFFF) != crc16(self.body):
                return FrameError(int(Status.BAD_CRC.value), self.op, self.seq)
            if self.response:
                if not self.op & RESPONSE_FLAG:
                    return FrameError(int(Status.UNKNOWN_OP.value), self.op, self.seq)
                return Frame(self.op & ~RESPONSE_FLAG, self.seq, bytes(self.payload), self.status)
            if self.op not in VALID_OPS:
                return FrameError(int(Status.UNKNOWN_OP.value), self.op, self.seq)
            return Frame(self.op, self.seq, bytes(self.payload))
        self.body.append(b)
        if st == "op":
            self.op = b
            self.state = "seq"
        elif st == "seq":
            self.seq = b
            self.state = "status" if self.response else "len0"
        elif st == "status":
            self.status = b
            self.state = "len0"
        elif st == "len0":
            self.length = b
            self.state = "len1"
        elif st == "len1":
            self.length |= b << 8
            if self.length > self.max_payload:
                return self._error(Status.BAD_LENGTH)
            self.crc = 0
            self.state = "payload" if self.length else "crc0"
        elif st == "payload":
            self.payload.append(b)
            if len(self.payload) == self.length:
                self.crc = 0
                self.state = "crc0"
        return None


def decode_frames(data: Iterable, max_payload: int = DEFAULT_MAX_PAYLOAD, *,
                  response: bool = False) -> list:
    """Decode a whole byte sequence (with :data:`GAP` items); see :class:`Decoder`."""
    return Decoder(max_payload, response=response).feed(data)
