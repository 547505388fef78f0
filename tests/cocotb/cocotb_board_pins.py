"""The ULX3S top at its pins, with cocotbext-uart as the line partner
(tests/boards/test_board_sim.py).

Run by :func:`ringkv.sim.board_harness.serve_board` on the pin-level build (parameters in
``RINGKV_BOARD``). ``clk25`` is driven at the PLL's output frequency, the SD pins meet the
card model of the top's storage kind (``SD_ADAPTERS``: the strict 4-bit card on the native
pins by default; a protocol violation fails the test); ``uart_0__rx__io`` is driven by
cocotbext-uart's ``UartSource`` and ``uart_0__tx__io`` read by its ``UartSink`` at 3 Mbaud
(a UART model written elsewhere: its bit time is ``int(1e9 / baud)`` ns = 333 ns, 0.1 % off
the device's exact average; the device's receiver and the sink's mid-bit sampling tolerate
it).

Responses are compared byte for byte with the frames the golden encoder builds from the
expected payloads (:func:`ringkv.host.device.frames.encode_response`).
"""

import json
import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, Timer
from cocotbext.uart import UartSink, UartSource

from ringkv.defs.config import RingKVConfig
from ringkv.defs.protocol import GATEWARE_VERSION, PROTOCOL_VERSION, RESPONSES, SYNC, Op, Status
from ringkv.defs.record import RecordLayout, token_bytes
from ringkv.host.device.frames import encode_request, encode_response
from ringkv.host.device.ops import pack_attn, unpack_attn
from ringkv.host.golden.fixed import FixedRingCore
from ringkv.sim.cocotb_board import PINS, SD_ADAPTERS, UartLine, clock_period_ps
from ringkv.sim.sector_model import SectorImage

BAUD_TIMEOUT_US = 4000
#: Card initialisation runs at <= 400 kHz: in native 4-bit mode about 3,300 SD clocks
#: (ACMD41 polls, CMD2/CMD9's R2, ACMD6, CMD6's two 512-bit switch statuses), ~8.3 ms.
INIT_TIMEOUT_US = 20000


def _params():
    return json.loads(os.environ["RINGKV_BOARD"])


def _led(dut, i):
    return int(getattr(dut, PINS["leds"][i]).value)


async def _power_up(dut):
    """Clock, SD card, UART partner; wait until the card is initialised (LED 1)."""
    params = _params()
    Clock(getattr(dut, PINS["clk"]), clock_period_ps(params["sys_hz"]), unit="ps").start()
    image = SectorImage(params["image"], params["sectors"])
    card = SD_ADAPTERS[params.get("storage", "spi")](dut, image, None)
    cocotb.start_soon(card.run())
    source = UartSource(getattr(dut, PINS["rx"]), baud=params["baud"])
    sink = UartSink(getattr(dut, PINS["tx"]), baud=params["baud"])
    await Timer(2, unit="us")
    assert _led(dut, 0) == 1, "LED 0 (clock alive: PLL lock) is dark after 2 us"
    assert _led(dut, 4) == 0 and _led(dut, 5) == 0, "activity/error LEDs lit before traffic"
    for _ in range(INIT_TIMEOUT_US // 10):
        if _led(dut, 1):
            break
        await Timer(10, unit="us")
    assert _led(dut, 1) == 1, f"LED 1 (SD card initialised) dark after {INIT_TIMEOUT_US} us"
    assert _led(dut, 2) == 1, "LED 2 (SDHC) dark: the card model is SDHC"
    return params, source, sink


async def _exchange(source, sink, frame: bytes, expect_len: int) -> bytes:
    await source.write(frame)
    got = bytearray()
    for _ in range(BAUD_TIMEOUT_US):
        got += sink.read_nowait()
        if len(got) >= expect_len:
            break
        await Timer(1, unit="us")
    await Timer(5, unit="us")          # nothing more may come
    got += sink.read_nowait()
    return bytes(got)


@cocotb.test()
async def ping_version_attention_bad_crc(dut):
    """PING, VERSION and three ATTN_DECODE steps byte-exact, LEDs 0, 1, 2 and 4 lit and 5
    dark; then a frame with a bad CRC: answered BAD_CRC (byte-exact), LED 5 lit."""
    params, source, sink = await _power_up(dut)
    config = RingKVConfig(**params["config"])

    payload = bytes([SYNC, 0x00, 0xFF, 0x55, SYNC, SYNC, 0x81]) + bytes(range(57))
    want = encode_response(Op.PING, 1, Status.OK, payload)
    got = await _exchange(source, sink, encode_request(Op.PING, 1, payload), len(want))
    assert got == want, f"PING: got {got.hex()} want {want.hex()}"
    assert _led(dut, 4) == 1, "LED 4 (link activity) dark after a PING"
    assert _led(dut, 5) == 0, "LED 5 (link error) lit after clean traffic"

    lay = RecordLayout(config)
    version = RESPONSES[Op.VERSION].pack(
        protocol=PROTOCOL_VERSION, gateware=GATEWARE_VERSION, max_payload=4096,
        lanes=params["lanes"], macs=params["macs"],
        regions=params["regions"], links=params["regions"],
        buckets=max(params["regions"] // 2, 2), sectors_per_region=lay.sectors_per_region,
        base_lba=0, hash_width=64, token_bytes=token_bytes(config))
    want = encode_response(Op.VERSION, 2, Status.OK, version)
    got = await _exchange(source, sink, encode_request(Op.VERSION, 2), len(want))
    assert got == want, f"VERSION: got {got.hex()} want {want.hex()}"

    rng = np.random.default_rng(5)
    golden = FixedRingCore.for_config(config, params["lanes"])
    g = config.group
    for seq, layer in ((3, 0), (4, 1), (5, 0)):
        q = rng.integers(-128, 128, (1, config.q_heads, config.head_dim))
        k = rng.integers(-128, 128, (1, config.kv_heads, config.head_dim))
        v = rng.integers(-128, 128, (1, config.kv_heads, config.head_dim))
        out = np.concatenate([golden.attend(layer, h, q[:, h * g:(h + 1) * g], k[:, h],
                                            v[:, h]) for h in range(config.kv_heads)], axis=1)
        out = out.reshape(1, config.q_heads, config.head_dim)
        # the response tail: KV head, token, group member, element, int16 little-endian
        tail = np.transpose(out.reshape(1, config.kv_heads, g, config.head_dim),
                            (1, 0, 2, 3)).astype("<i2").tobytes()
        want = encode_response(Op.ATTN_DECODE, seq, Status.OK, tail)
        request = encode_request(Op.ATTN_DECODE, seq, pack_attn(config, layer, q, k, v))
        got = await _exchange(source, sink, request, len(want))
        assert got == want, f"ATTN_DECODE {seq}: got {got.hex()} want {want.hex()}"
        assert np.array_equal(unpack_attn(config, got[6:-2], 1), out)
    assert _led(dut, 5) == 0, "LED 5 (link error) lit after clean traffic"

    frame = bytearray(encode_request(Op.PING, 7, b"abc"))
    frame[-1] ^= 0x01
    want = encode_response(Op.PING, 7, Status.BAD_CRC)
    got = await _exchange(source, sink, bytes(frame), len(want))
    assert got == want, f"bad CRC: got {got.hex()} want {want.hex()}"
    assert _led(dut, 5) == 1, "LED 5 dark after a frame-layer error"


@cocotb.test()
async def framing_error_lights_the_error_led(dut):
    """A character with a broken stop bit: no response, LED 5 lit; the link still works."""
    params, source, sink = await _power_up(dut)
    line = UartLine(getattr(dut, PINS["rx"]), getattr(dut, PINS["tx"]), params["baud"])
    await line.send(b"\x00", stop_bit=0)
    await Timer(3, unit="us")
    await RisingEdge(getattr(dut, PINS["clk"]))
    assert _led(dut, 5) == 1, "LED 5 dark after a UART framing error"
    want = encode_response(Op.PING, 9, Status.OK, b"ok")
    got = await _exchange(source, sink, encode_request(Op.PING, 9, b"ok"), len(want))
    assert got == want, f"PING after a framing error: got {got.hex()} want {want.hex()}"
