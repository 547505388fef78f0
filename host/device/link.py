"""Link client over pyserial, and a TCP frame server for software devices and tests.

``Link("socket://127.0.0.1:PORT")`` reaches the simulator, ``Link("/dev/ttyUSB0")`` the board,
``Link("loop://")`` an echo pipe: the same code, through ``serial.serial_for_url``.

One request is in flight at a time (the gateware's UART FIFO relies on it). Each request gets
the next 8-bit sequence number; a response with another number is stale and skipped.

Retries: a ``BAD_CRC`` or ``TIMEOUT`` status from the device means the device dropped the
request without acting on it, so any request is re-sent. A missing or corrupted *response* is
ambiguous (the request may have run), so only :data:`~ringkv.defs.protocol.IDEMPOTENT_OPS` are
re-sent then; other ops raise :class:`LinkError`.
"""

import socket
import threading
import time

import serial

from ringkv.defs.protocol import DEFAULT_MAX_PAYLOAD, IDEMPOTENT_OPS, Op, Status

from ..errors import DeviceError, LinkError
from .frames import Decoder, Frame, encode_request, encode_response

__all__ = ["Link", "LinkError", "DeviceError", "ANSWERS", "FrameServer"]

#: Statuses that are answers, returned by :meth:`Link.request`; every other status raises.
#: ``NOT_READY`` (the device is recovering its directory) carries the recovery status record.
ANSWERS = frozenset({Status.OK, Status.HIT, Status.MISS, Status.NOT_READY})


class Link:
    """Request/response client. ``port`` may be a URL or an open serial-like object."""

    def __init__(self, port, *, baudrate: int = 3_000_000, timeout: float = 1.0,
                 retries: int = 3, max_payload: int = DEFAULT_MAX_PAYLOAD):
        if retries < 0:
            raise ValueError(f"retries must be non-negative, not {retries!r}")
        self.url = port if isinstance(port, str) else getattr(port, "name", None) or "the link"
        if isinstance(port, str):
            try:
                port = serial.serial_for_url(port, baudrate=baudrate, timeout=0.01)
            except (OSError, ValueError) as e:   # SerialException is an OSError
                raise LinkError(f"cannot open {port}: {_reason(e)}",
                                hint="check the URL (socket://HOST:PORT for ringkv sim, "
                                     "/dev/ttyUSB0 for the board) and that the device is "
                                     "running") from None
        self.port = port
        self.timeout = timeout
        self.retries = retries
        self.max_payload = max_payload
        self.seq = 0
        self.stats = {"requests": 0, "retries": 0, "bytes_out": 0, "bytes_in": 0}
        self._decoder = Decoder(0xFFFF, response=True)

    def close(self):
        self.port.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, op: Op, payload: bytes = b"") -> tuple[Status, bytes]:
        """Send ``op`` with ``payload``; return ``(status, payload)`` of the answer. A link
        that fails underneath (a closed socket, an unplugged adapter) is a :class:`LinkError`
        naming the link."""
        try:
            return self._request(op, payload)
        except LinkError:
            raise
        except OSError as e:                    # pyserial's SerialException included
            raise LinkError(f"the link to {self.url} dropped during {Op(op).name}: "
                            f"{_reason(e)}",
                            hint="is the device (or ringkv sim) still running?") from None

    def _request(self, op: Op, payload: bytes) -> tuple[Status, bytes]:
        op = Op(op)
        payload = bytes(payload)
        if len(payload) > self.max_payload:
            raise ValueError(f"payload of {len(payload)} bytes exceeds the device's maximum "
                             f"of {self.max_payload}")
        self.stats["requests"] += 1
        attempts = 0
        while True:
            self.seq = (self.seq + 1) & 0xFF
            frame = encode_request(op, self.seq, payload)
            self.port.reset_input_buffer()
            self._decoder.reset()
            self.port.write(frame)
            self.stats["bytes_out"] += len(frame)
            response = self._await(op, self.seq)
            if response is not None:
                status = Status(response.status)
                dropped = status in (Status.BAD_CRC, Status.TIMEOUT)
                if not dropped:
                    if status in ANSWERS:
                        return status, response.payload
                    raise DeviceError(status, op, response.payload)
            elif op not in IDEMPOTENT_OPS:
                raise LinkError(f"no valid response to {op.name} (seq {self.seq}) within "
                                f"{self.timeout} s; not retried: the operation is not "
                                f"idempotent")
            attempts += 1
            if attempts > self.retries:
                what = status.name if response is not None else "no valid response"
                raise LinkError(f"{op.name} failed after {attempts} attempts ({what})")
            self.stats["retries"] += 1

    def _await(self, op, seq):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            chunk = self.port.read(max(1, self.port.in_waiting))
            self.stats["bytes_in"] += len(chunk)
            for event in self._decoder.feed(chunk):
                if isinstance(event, Frame) and event.seq == seq and event.op == op.value:
                    return event
        return None


def _reason(e: BaseException) -> str:
    """An OS or pyserial error in words: the last ``[Errno N] text``, without the port name
    pyserial repeats around it."""
    text = str(e)
    if "[Errno" in text:
        text = text.rsplit("] ", 1)[-1]
        text = text.split(": '", 1)[0]
    return text


class FrameServer:
    """Serve a ``handler(op: int, payload: bytes) -> (Status, bytes)`` on a TCP port.

    Speaks the device's side of the protocol with the golden decoder (same checks as the RTL
    front end: frame-level errors are answered with the request's opcode and sequence number).
    ``fault(data) -> data`` may corrupt or drop outgoing responses (tests). Port 0 picks a free
    port; see :attr:`url`.
    """

    def __init__(self, handler, *, host="127.0.0.1", port=0, max_payload=DEFAULT_MAX_PAYLOAD,
                 timeout: float = 0.2, fault=None):
        self.handler = handler
        self.max_payload = max_payload
        self.timeout = timeout
        self.fault = fault
        self._sock = socket.create_server((host, port))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"socket://{host}:{port}"

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                self._serve(conn)

    def _serve(self, conn):
        decoder = Decoder(self.max_payload)
        conn.settimeout(self.timeout)
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                data = [None]                # an idle line: the decoder's timeout
            except OSError:
                return
            if not data:
                return
            for event in decoder.feed(data):
                if isinstance(event, Frame):
                    try:
                        status, payload = self.handler(event.op, event.payload)
                    except Exception:        # a handler bug must not kill the server
                        status, payload = Status.INTERNAL, b""
                    out = encode_response(event.op, event.seq, status, payload)
                else:
                    out = encode_response(event.op & 0x7F, event.seq, event.status)
                if self.fault is not None:
                    out = self.fault(out)
                try:
                    conn.sendall(out)
                except OSError:
                    return
