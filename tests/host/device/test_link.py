"""Link client: pyserial URLs, sequence numbers, retries, errors; against a FrameServer."""

import pytest
import serial

from ringkv.defs.protocol import Op, Status
from ringkv.host.device.link import DeviceError, FrameServer, Link, LinkError


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, op, payload):
        self.calls.append((op, payload))
        if op == Op.DIR_DELETE.value:
            return Status.BAD_ARG, b"why"
        if op == Op.QUERY.value:
            return Status.MISS, b""
        return Status.OK, payload[::-1]


def test_bad_parameters():
    with pytest.raises(ValueError, match=r"^retries must be non-negative, not -1$"):
        Link("loop://", retries=-1)
    with Link("loop://", max_payload=4) as link:
        with pytest.raises(ValueError, match=r"^payload of 5 bytes exceeds the device's "
                                             r"maximum of 4$"):
            link.request(Op.PING, b"12345")


def test_loop_url_times_out_cleanly():
    """loop:// echoes the request, which is not a response: a timeout, never a hang."""
    with Link("loop://", timeout=0.05, retries=1) as link:
        with pytest.raises(LinkError, match=r"^PING failed after 2 attempts "
                                            r"\(no valid response\)$"):
            link.request(Op.PING, b"x")
        assert link.stats["retries"] == 1
        with pytest.raises(LinkError, match=r"not idempotent"):
            link.request(Op.ATTN_DECODE, b"x")


def test_round_trip_and_statuses():
    handler = Recorder()
    with FrameServer(handler) as server, Link(server.url, timeout=2.0) as link:
        for n in (0, 1, 4096):
            payload = bytes(i & 0xFF for i in range(n))
            assert link.request(Op.PING, payload) == (Status.OK, payload[::-1])
        assert link.request(Op.QUERY, b"q") == (Status.MISS, b"")
        with pytest.raises(DeviceError, match=r"^device answered BAD_ARG to DIR_DELETE$") as e:
            link.request(Op.DIR_DELETE, b"\x01")
        assert e.value.status is Status.BAD_ARG and e.value.payload == b"why"
        assert len(handler.calls) == 5
        for _ in range(300):                # sequence numbers wrap
            link.request(Op.VERSION)
        assert link.seq == 305 % 256


def test_corrupted_response_retried_only_when_idempotent():
    handler = Recorder()
    state = {"n": 0}

    def corrupt_first_two(data):
        state["n"] += 1
        if state["n"] <= 2:
            data = bytearray(data)
            data[-1] ^= 0xFF
        return bytes(data)

    with FrameServer(handler, fault=corrupt_first_two) as server, \
            Link(server.url, timeout=0.3, retries=3) as link:
        assert link.request(Op.PING, b"ab") == (Status.OK, b"ba")
        assert link.stats["retries"] == 2 and len(handler.calls) == 3
        state["n"] = 0
        with pytest.raises(LinkError, match=r"not idempotent"):
            link.request(Op.ATTN_DECODE, b"zz")
        assert len(handler.calls) == 4          # ran once, not repeated


class _CorruptingPort:
    """A serial port whose first ``n`` writes get one byte flipped (the device sees BAD_CRC)."""

    def __init__(self, port, n):
        self.port, self.n = port, n

    def write(self, data):
        if self.n > 0:
            self.n -= 1
            data = bytearray(data)
            data[-3] ^= 0x10
        return self.port.write(bytes(data))

    def __getattr__(self, name):
        return getattr(self.port, name)


def test_device_side_bad_crc_retried_for_any_op():
    handler = Recorder()
    with FrameServer(handler) as server:
        port = _CorruptingPort(serial.serial_for_url(server.url, timeout=0.01), 2)
        with Link(port, timeout=2.0) as link:
            assert link.request(Op.ATTN_DECODE, b"kv") == (Status.OK, b"vk")
            assert link.stats["retries"] == 2
            assert handler.calls == [(Op.ATTN_DECODE.value, b"kv")]   # acted on exactly once
