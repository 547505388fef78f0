"""SD-SPI controller against the bit-level SD card model, in the Amaranth simulator."""

import random

import pytest
from amaranth.sim import Simulator

from ringkv.hw.storage.port import CardType, StorageError
from ringkv.hw.storage.sdspi import SDSPIController
from ringkv.sim.sdcard_model import SDCardSPI, amaranth_sd_card
from ringkv.sim.sector_model import SectorImage
from ringkv.sim.storage_host import storage_read, storage_write

# background testbenches (the storage server, the card) are abandoned when the body ends
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

FAST = dict(init_half_period=2, half_period=1, resp_timeout=16, token_timeout=64,
            busy_timeout=64, init_retries=8)


def simulate(card, body, **params):
    dut = SDSPIController(**{**FAST, **params})
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    result = {}

    async def bench(ctx):
        result["value"] = await body(ctx, dut)

    async def card_process(ctx):
        await amaranth_sd_card(ctx, dut.spi, card)

    sim.add_testbench(card_process, background=True)
    sim.add_testbench(bench)
    sim.run()
    return result["value"]


def test_parameter_errors():
    with pytest.raises(ValueError, match=r"^half_period must be a positive integer, not 0$"):
        SDSPIController(half_period=0)
    with pytest.raises(TypeError, match=r"^init_half_period must be an integer, not 2\.5$"):
        SDSPIController(init_half_period=2.5)
    with pytest.raises(ValueError, match=r"^resp_timeout must be at least 2, not 1$"):
        SDSPIController(resp_timeout=1)
    with pytest.raises(ValueError, match=r"^half_period \(8\) must not exceed init_half_period "
                                         r"\(4\)$"):
        SDSPIController(init_half_period=4, half_period=8)


@pytest.mark.parametrize("kind", ["sdhc", pytest.param("sdsc", marks=pytest.mark.slow),
                                  pytest.param("v1", marks=pytest.mark.slow)])
def test_init_and_round_trip(kind):
    rng = random.Random(hash(kind) & 0xFFFF)
    image = SectorImage(sectors=64)
    image.write(0, rng.randbytes(64 * 512))
    card = SDCardSPI(image, sdhc=kind == "sdhc", v2=kind != "v1")
    one = rng.randbytes(512)
    three = rng.randbytes(2 * 512)

    async def body(ctx, dut):
        r = [await storage_write(ctx, dut.storage, 5, one, rng=rng, idle=0.2)]
        r.append(await storage_write(ctx, dut.storage, 10, three, rng=rng, idle=0.2))
        r.append(await storage_read(ctx, dut.storage, 5, 1, rng=rng, stall=0.2))
        r.append(await storage_read(ctx, dut.storage, 9, 3, rng=rng, stall=0.2))
        return r, ctx.get(dut.ready), ctx.get(dut.sdhc), ctx.get(dut.card_type)

    (w1, w3, r1, r5), ready, sdhc, card_type = simulate(card, body)
    assert ready == 1 and sdhc == (kind == "sdhc")
    assert card_type == (CardType.SDHC if kind == "sdhc" else CardType.SDSC)
    assert w1 == (StorageError.OK, 512) and w3 == (StorageError.OK, 1024)
    assert image.read(5, 1) == one and image.read(10, 2) == three
    assert r1 == (StorageError.OK, one)
    assert r5[0] is StorageError.OK and r5[1] == image.read(9, 3)
    cmds = [c for c, _ in card.log]
    init = {"sdhc": [0, 8, 55, 41, 55, 41, 55, 41, 55, 41, 58],
            "sdsc": [0, 8, 55, 41, 55, 41, 55, 41, 55, 41, 58, 16],
            "v1": [0, 8, 55, 41, 55, 41, 55, 41, 55, 41, 16]}[kind]
    assert cmds[:len(init)] == init
    assert cmds[len(init):] == [24, 25, 17, 18, 12]
    assert card.crc_errors == 0


@pytest.mark.slow          # the cocotb test card_that_stops_answering covers these in `make test`
def test_errors_never_hang():
    image = SectorImage(sectors=16)
    card = SDCardSPI(image, bad_read_crc=1)

    async def body(ctx, dut):
        out = {"range": await storage_write(ctx, dut.storage, 0, b"")}
        out["crc"] = (await storage_read(ctx, dut.storage, 2, 1))[0]
        out["ok_after"] = (await storage_read(ctx, dut.storage, 2, 1))[0]
        out["beyond"] = (await storage_read(ctx, dut.storage, 100, 1))[0]
        card.bad_read_crc = 1
        out["crc_multi"] = (await storage_read(ctx, dut.storage, 2, 2))[0]
        card.dead = "high"          # the card stops answering
        out["dead_read"] = (await storage_read(ctx, dut.storage, 2, 2))[0]
        out["dead_ready"] = ctx.get(dut.ready)
        out["dead_again"] = (await storage_read(ctx, dut.storage, 2, 1))[0]
        card.dead = None
        out["revived"] = (await storage_write(ctx, dut.storage, 3, bytes(range(256)) * 2))[0]
        return out

    out = simulate(card, body)
    assert out["range"] == (StorageError.RANGE, 0)
    assert out["crc"] is StorageError.CRC
    assert out["ok_after"] is StorageError.OK
    assert out["beyond"] is StorageError.CARD
    assert out["crc_multi"] is StorageError.CRC
    assert out["dead_read"] is StorageError.TIMEOUT and out["dead_ready"] == 0
    assert out["dead_again"] is StorageError.NOT_READY
    assert out["revived"] is StorageError.OK
    assert image.read(3, 1) == bytes(range(256)) * 2


def test_stuck_busy_times_out():
    image = SectorImage(sectors=16)
    card = SDCardSPI(image)

    async def body(ctx, dut):
        first = await storage_write(ctx, dut.storage, 1, bytes(512))
        card.busy_bytes = 10_000          # a card that never finishes programming
        second = await storage_write(ctx, dut.storage, 1, bytes(1024))
        return first[0], second[0]

    assert simulate(card, body) == (StorageError.OK, StorageError.TIMEOUT)
