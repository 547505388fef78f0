"""Golden framing model: layout, round trips, resynchronisation, fuzz; opcodes defined once."""

import random

import pytest

from ringkv.defs.protocol import IDEMPOTENT_OPS, RESPONSE_FLAG, SYNC, Op, Status
from ringkv.host.device.frames import (
    GAP,
    Decoder,
    Frame,
    FrameError,
    crc16,
    decode_frames,
    encode_request,
    encode_response,
)
from ringkv.hw.protocol import CRC16


def test_enums_are_8_bit_and_unique():
    assert all(0 < op.value < RESPONSE_FLAG for op in Op)
    assert len({op.value for op in Op}) == len(Op)
    assert len({s.value for s in Status}) == len(Status)
    assert Status.OK.value == 0 and IDEMPOTENT_OPS <= set(Op)


def test_byte_layout():
    assert crc16(b"123456789") == 0x31C3 == CRC16.compute(b"123456789")   # XMODEM check value
    frame = encode_request(Op.PING, 0x12, b"\x01\x02")
    assert frame == bytes([SYNC, 0x01, 0x12, 0x02, 0x00, 0x01, 0x02]) + \
        crc16(bytes([0x01, 0x12, 0x02, 0x00, 0x01, 0x02])).to_bytes(2, "big")
    resp = encode_response(Op.PING, 0x12, Status.MISS, b"")
    assert resp[:6] == bytes([SYNC, 0x81, 0x12, 0x07, 0x00, 0x00])
    # running the CRC over the trailing CRC bytes too leaves the residue 0
    assert crc16(frame[1:]) == 0 and crc16(resp[1:]) == 0


def test_encode_argument_errors():
    with pytest.raises(ValueError, match=r"^op must be in 0\.\.255, not 256$"):
        encode_request(256, 0)
    with pytest.raises(ValueError, match=r"^seq must be in 0\.\.255, not -1$"):
        encode_request(Op.PING, -1)
    with pytest.raises(ValueError, match=r"exceeds the 16-bit length field"):
        encode_request(Op.PING, 0, bytes(65536))


def test_request_response_round_trip():
    rng = random.Random(0)
    reqs = [(rng.choice(list(Op)).value, rng.randrange(256), rng.randbytes(rng.randrange(50)))
            for _ in range(200)]
    data = b"".join(encode_request(*r) for r in reqs)
    assert decode_frames(data) == [Frame(*r) for r in reqs]
    resps = [(op, seq, rng.choice(list(Status)).value, p) for op, seq, p in reqs]
    data = b"".join(encode_response(*r) for r in resps)
    assert decode_frames(data, response=True) == \
        [Frame(op, seq, p, st) for op, seq, st, p in resps]
    # a request is not a response and vice versa
    events = decode_frames(list(encode_request(Op.PING, 1, b"ab")) + [GAP], response=True)
    assert events and not any(isinstance(e, Frame) for e in events)
    events = decode_frames(list(encode_response(Op.PING, 1, Status.OK)) + [GAP])
    assert events and not any(isinstance(e, Frame) for e in events)


def test_errors_and_resync():
    good = encode_request(Op.PING, 5, b"x")
    assert decode_frames(b"\x00\xff" + good) == [Frame(1, 5, b"x")]
    bad = bytearray(good)
    bad[-1] ^= 1
    assert decode_frames(bytes(bad) + good) == [FrameError(Status.BAD_CRC.value, 1, 5),
                                                Frame(1, 5, b"x")]
    assert decode_frames(list(good[:4]) + [GAP] + list(good)) == \
        [FrameError(Status.TIMEOUT.value, 1, 5), Frame(1, 5, b"x")]
    assert decode_frames([GAP] + list(good)) == [Frame(1, 5, b"x")]     # idle line: nothing
    over = encode_request(Op.PING, 6, bytes(17))
    assert decode_frames(over + good, max_payload=16)[0] == \
        FrameError(Status.BAD_LENGTH.value, 1, 6)
    assert decode_frames(encode_request(0x70, 7)) == [FrameError(Status.UNKNOWN_OP.value, 0x70, 7)]


def test_fuzz_single_corruptions_never_accepted():
    """Every single-byte change of many frames: no frame but the intact follower is accepted."""
    rng = random.Random(1)
    for _ in range(300):
        frame = bytearray(encode_request(rng.choice(list(Op)), rng.randrange(256),
                                         rng.randbytes(rng.randrange(20))))
        pos = rng.randrange(len(frame))
        frame[pos] ^= rng.randrange(1, 256)
        follower = encode_request(Op.PING, 1, b"ok")
        events = decode_frames(list(frame) + [GAP] + list(follower))
        assert [e for e in events if isinstance(e, Frame)] == [Frame(1, 1, b"ok")]


def test_fuzz_thousands_random_strings_return_to_idle():
    rng = random.Random(2)
    dec = Decoder(64)
    for _ in range(3000):
        dec.feed(rng.randbytes(rng.randrange(40)))
        if rng.random() < 0.5:
            dec.feed([GAP])
            assert dec.idle
    dec.feed([GAP])
    assert dec.feed(encode_request(Op.VERSION, 3)) == [Frame(Op.VERSION.value, 3, b"")]
