"""Per-opcode payload helpers (host/device/ops.py) for both numerics: ATTN tails and sizes."""

import numpy as np
import pytest

from ringkv.defs.config import DEMO_CONFIG, RingKVConfig
from ringkv.defs.protocol import REQUESTS, Op, attn_in_bytes, attn_out_bytes, max_attn_tokens
from ringkv.defs.record import elem_bytes
from ringkv.host.device.ops import pack_attn, unpack_attn

FX1 = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=4, window=8, max_tokens=64)
FX2 = RingKVConfig(**{**FX1.__dict__, "numerics": "ringkv-fx2"})


def test_sizes_scale_with_element_bytes():
    assert (elem_bytes(FX1), elem_bytes(FX2)) == (1, 2)
    assert attn_in_bytes(FX1, 3) == 3 * (4 + 2 * 2) * 4
    assert attn_in_bytes(FX2, 3) == 2 * attn_in_bytes(FX1, 3)
    # the output is int16 in both numerics
    assert attn_out_bytes(FX2, 3) == attn_out_bytes(FX1, 3) == 3 * 4 * 4 * 2
    # a 100-byte frame: fx1 carries 3 tokens (in 4 + 3*32 bytes), fx2 only 1 (4 + 64)
    assert max_attn_tokens(FX1, 100) == 3
    assert max_attn_tokens(FX2, 100) == 1
    assert max_attn_tokens(FX2, 67) == 0
    d2 = RingKVConfig(**{**DEMO_CONFIG.__dict__, "numerics": "ringkv-fx2"})
    assert max_attn_tokens(d2, 4096) == (4096 - 4) // (8 * 16 * 2)


def test_pack_attn_fx1_int8_bytes():
    rng = np.random.default_rng(1)
    q = rng.integers(-128, 128, (2, 4, 4))
    k = rng.integers(-128, 128, (2, 2, 4))
    v = rng.integers(-128, 128, (2, 2, 4))
    data = pack_attn(FX1, 1, q, k, v)
    assert REQUESTS[Op.ATTN_PREFILL].unpack(data) == {"layer": 1, "flags": 0, "count": 2}
    tail = np.frombuffer(data[4:], dtype=np.int8).reshape(2, 2, 4, 4)   # kvh, t, vec, dim
    assert len(data) == 4 + attn_in_bytes(FX1, 2)
    for h in range(2):
        for t in range(2):
            assert (tail[h, t, :2] == q[t, 2 * h:2 * h + 2]).all()
            assert (tail[h, t, 2] == k[t, h]).all() and (tail[h, t, 3] == v[t, h]).all()


def test_pack_attn_fx2_int16_little_endian():
    rng = np.random.default_rng(2)
    q = rng.integers(-32768, 32768, (3, 4, 4))
    k = rng.integers(-32768, 32768, (3, 2, 4))
    v = rng.integers(-32768, 32768, (3, 2, 4))
    k[0, 0, 0], v[0, 0, 0] = 0x1234, -2              # known bytes at known places
    data = pack_attn(FX2, 0, q, k, v)
    assert len(data) == 4 + attn_in_bytes(FX2, 3)
    # KV head 0, token 0: q heads 0, 1 (2 * 4 elements), then k[0, 0], then v[0, 0]
    k_at = 4 + 2 * 4 * 2
    assert data[k_at:k_at + 2] == b"\x34\x12"
    v_at = k_at + 4 * 2
    assert data[v_at:v_at + 2] == b"\xfe\xff"
    tail = np.frombuffer(data[4:], dtype="<i2").reshape(2, 3, 4, 4)
    for h in range(2):
        for t in range(3):
            assert (tail[h, t, :2] == q[t, 2 * h:2 * h + 2]).all()
            assert (tail[h, t, 2] == k[t, h]).all() and (tail[h, t, 3] == v[t, h]).all()


@pytest.mark.parametrize("config", [FX1, FX2])
def test_unpack_attn_order(config):
    out = np.arange(2 * 4 * 4).reshape(2, 4, 4) - 20       # (C, Hq, d) int16 values
    g = config.group
    # the device's order: KV head, token, group member, element
    raw = np.stack([out[:, h * g:(h + 1) * g] for h in range(config.kv_heads)])
    got = unpack_attn(config, raw.astype("<i2").tobytes(), 2)
    assert np.array_equal(got, out)
