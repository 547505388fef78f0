"""SD native 4-bit controller against the bit-level 4-bit card model, in the Amaranth
simulator."""

import random

import pytest
from amaranth.sim import Simulator

from ringkv.hw.storage.port import CardType, StorageError
from ringkv.hw.storage.sdnative import SDNativeController
from ringkv.sim.sd4_model import SDCard4, amaranth_sd4_card, csd_sectors
from ringkv.sim.sector_model import PowerCut, SectorImage
from ringkv.sim.storage_host import storage_read, storage_write

# background testbenches (the card) are abandoned when the body ends
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

FAST = dict(init_half_period=1, half_period=1, resp_timeout=64, data_timeout=256,
            busy_timeout=256, init_retries=8)
INIT = [0, 8, 55, 41, 55, 41, 55, 41, 55, 41, 2, 3, 9, 7, 55, 6]


def simulate(card, body, deadline=None, **params):
    dut = SDNativeController(**{**FAST, **params})
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    result = {}

    async def bench(ctx):
        result["value"] = await body(ctx, dut)

    async def card_process(ctx):
        await amaranth_sd4_card(ctx, dut.sd, card)

    async def watchdog(ctx):
        await ctx.delay(deadline * 1e-8)
        raise AssertionError(f"no result within {deadline} cycles: a hang")

    sim.add_testbench(card_process, background=True)
    if deadline is not None:
        sim.add_testbench(watchdog, background=True)
    sim.add_testbench(bench)
    sim.run()
    return result["value"]


def test_parameter_errors():
    with pytest.raises(ValueError, match=r"^half_period must be a positive integer, not 0$"):
        SDNativeController(half_period=0)
    with pytest.raises(TypeError, match=r"^init_half_period must be an integer, not 2\.5$"):
        SDNativeController(init_half_period=2.5)
    with pytest.raises(ValueError, match=r"^resp_timeout must be at least 2, not 1$"):
        SDNativeController(resp_timeout=1)
    with pytest.raises(ValueError, match=r"^hs_half_period must be a positive integer, not 0$"):
        SDNativeController(hs_half_period=0)
    with pytest.raises(ValueError, match=r"^half_period \(8\) must not exceed init_half_period "
                                         r"\(4\)$"):
        SDNativeController(init_half_period=4, half_period=8)
    with pytest.raises(ValueError, match=r"^hs_half_period \(2\) must not exceed half_period "
                                         r"\(1\)$"):
        SDNativeController(hs_half_period=2)


def _image(sectors, seed):
    image = SectorImage(sectors=sectors)
    image.write(0, random.Random(seed).randbytes(sectors * 512))
    return image


@pytest.mark.parametrize("kind", ["hs", pytest.param("no_hs_card", marks=pytest.mark.slow),
                                  pytest.param("hs_off", marks=pytest.mark.slow)])
def test_init_and_round_trip(kind):
    """Initialisation (with high speed granted, refused by the card, not asked for), then single
    and multi-block writes and reads with random stalls on every stream, bit-exact against the
    image; read data starting while the response is still on CMD (N_AC = 2)."""
    rng = random.Random(hash(kind) & 0xFFFF)
    image = _image(64, 7)
    card = SDCard4(image, high_speed=kind != "no_hs_card", nac=2, busy_clocks=5, ncr=3)
    one = rng.randbytes(512)
    three = rng.randbytes(3 * 512)

    async def body(ctx, dut):
        r = [await storage_write(ctx, dut.storage, 5, one, rng=rng, idle=0.3)]
        r.append(await storage_write(ctx, dut.storage, 10, three, rng=rng, idle=0.3))
        r.append(await storage_read(ctx, dut.storage, 5, 1, rng=rng, stall=0.3))
        r.append(await storage_read(ctx, dut.storage, 9, 4, rng=rng, stall=0.3))
        return r, ctx.get(dut.ready), ctx.get(dut.sdhc), ctx.get(dut.high_speed), \
            ctx.get(dut.sectors), ctx.get(dut.card_type)

    hs = None if kind == "hs_off" else 1
    (w1, w3, r1, r4), ready, sdhc, high_speed, sectors, card_type = simulate(
        card, body, init_half_period=2, half_period=2, hs_half_period=hs)
    assert (ready, sdhc, sectors, card_type) == (1, 1, 1024, CardType.SDHC)
    assert high_speed == (kind == "hs")
    assert card.high_speed == (kind == "hs")
    assert w1 == (StorageError.OK, 512) and w3 == (StorageError.OK, 3 * 512)
    assert image.read(5, 1) == one and image.read(10, 3) == three
    assert r1 == (StorageError.OK, one)
    assert r4[0] is StorageError.OK and r4[1] == image.read(9, 4)
    cmds = [c for c, _, _ in card.log]
    init = INIT + {"hs": [6, 6], "no_hs_card": [6], "hs_off": []}[kind]
    assert cmds[:len(init)] == init
    assert cmds[len(init):] == [24, 13, 25, 12, 13, 17, 18, 12]
    assert card.width == 4
    assert card.violations == [] and card.crc_errors == 0


def test_card_model_csd_and_ocr():
    """The card model's CSD: version 2.0 (SDHC, units of 1024 sectors) or 1.0 (SDSC, C_SIZE,
    C_SIZE_MULT, READ_BL_LEN), the image size rounded up, decoded by the spec's formulas."""
    for sdhc, version, sectors, expect in ((True, 2, 16, 1024), (True, 2, 5000, 5120),
                                           (False, 1, 16, 512), (False, 1, 5000, 5120),
                                           (False, 1, 2_097_152, 2_097_152),
                                           (True, 1, 1000, 1024), (False, 2, 16, 1024)):
        card = SDCard4(SectorImage(sectors=sectors), sdhc=sdhc, csd_version=version)
        assert card.sectors == expect == csd_sectors(card._csd())
        assert card._csd() >> 126 == version - 1
    # by default the CSD version follows the card type, as on real cards
    assert SDCard4(SectorImage(sectors=16)).csd_version == 2
    assert SDCard4(SectorImage(sectors=16), sdhc=False).csd_version == 1
    with pytest.raises(ValueError, match="do not fit a version 1.0 CSD"):
        SDCard4(SectorImage(sectors=2_097_153), sdhc=False)
    with pytest.raises(ValueError, match="csd_version must be 1 or 2"):
        SDCard4(SectorImage(sectors=16), csd_version=3)


@pytest.mark.parametrize("kind", ["v1", "sdsc"])
def test_unsupported_cards_are_not_ready(kind):
    """An SD v1 card (no answer to CMD8) and an SDSC card (CCS = 0): NOT_READY, no hang."""
    card = SDCard4(SectorImage(sectors=16), v2=kind != "v1", sdhc=kind != "sdsc")

    async def body(ctx, dut):
        status = (await storage_read(ctx, dut.storage, 0, 1))[0]
        return status, ctx.get(dut.ready), ctx.get(dut.card_type)

    # the SDSC card is reported as such (its ACMD41 answer: CCS = 0); the v1 card never
    # answers ACMD41 (it is refused at CMD8): unknown
    assert simulate(card, body) == (StorageError.NOT_READY, 0,
                                    CardType.SDSC if kind == "sdsc" else CardType.UNKNOWN)
    assert [c for c, _, _ in card.log][:2] == [0, 8]
    assert card.violations == []


@pytest.mark.slow
def test_random_transfers():
    """Random lba and count (1..12 sectors), random stalls, on a card with random timing."""
    rng = random.Random(12)
    image = _image(128, 3)
    card = SDCard4(image, nac=rng.randrange(2, 40), block_gap=rng.randrange(1, 9),
                   busy_clocks=rng.randrange(0, 30), ncr=rng.randrange(2, 20))

    async def body(ctx, dut):
        for _ in range(12):
            count = rng.choice([1, 2, rng.randrange(3, 13)])
            lba = rng.randrange(128 - count + 1)
            p = rng.choice([0.0, 0.1, 0.5])
            if rng.random() < 0.5:
                data = rng.randbytes(count * 512)
                assert await storage_write(ctx, dut.storage, lba, data, rng=rng, idle=p) == \
                    (StorageError.OK, len(data))
                assert image.read(lba, count) == data
            else:
                st, got = await storage_read(ctx, dut.storage, lba, count, rng=rng, stall=p)
                assert st is StorageError.OK and got == image.read(lba, count)

    simulate(card, body)
    assert card.violations == [] and card.crc_errors == 0


def test_errors_never_hang():
    """No card, CRC errors on read data (single, multi) and on a response, a written block
    the card rejects (CRC, write error), an error answer, RANGE (count 0, beyond the CSD
    capacity; the card's OUT_OF_RANGE), a card that dies in a multi-block read: a status every
    time, and it works again when the card comes back."""
    image = _image(1024, 5)
    card = SDCard4(image, dead="high")

    async def body(ctx, dut):
        out = {"none": (await storage_read(ctx, dut.storage, 2, 1))[0],
               "none_ready": ctx.get(dut.ready)}
        card.dead = None
        out["back"] = await storage_write(ctx, dut.storage, 3, bytes(range(256)) * 2)
        card.bad_read_crc = 1
        out["crc"] = (await storage_read(ctx, dut.storage, 2, 1))[0]
        out["ok_after"] = await storage_read(ctx, dut.storage, 3, 1)
        card.bad_read_crc = 1
        out["crc_multi"] = (await storage_read(ctx, dut.storage, 2, 2))[0]
        card.bad_resp_crc = 1
        out["resp_crc"] = (await storage_read(ctx, dut.storage, 2, 1))[0]
        card.bad_write_bus = 1
        out["wr_crc"] = await storage_write(ctx, dut.storage, 7, bytes(1024))
        card.write_error = 1
        out["wr_err"] = (await storage_write(ctx, dut.storage, 7, bytes(512)))[0]
        card.fail_next = 1 << 19
        out["card_err"] = (await storage_read(ctx, dut.storage, 7, 2))[0]
        out["range0"] = await storage_write(ctx, dut.storage, 0, b"", count=0)
        out["range"] = (await storage_read(ctx, dut.storage, 1020, 5))[0]
        out["log_len"] = len(card.log)
        out["ok_end"] = (await storage_read(ctx, dut.storage, 1022, 2))[0]
        card.dead = "high"          # the card stops answering
        out["dead_read"] = (await storage_read(ctx, dut.storage, 2, 2))[0]
        out["dead_ready"] = ctx.get(dut.ready)
        out["dead_again"] = (await storage_read(ctx, dut.storage, 2, 1))[0]
        card.dead = None
        out["revived"] = (await storage_read(ctx, dut.storage, 3, 1))
        return out

    out = simulate(card, body, hs_half_period=1)
    assert out["none"] is StorageError.NOT_READY and out["none_ready"] == 0
    assert out["back"] == (StorageError.OK, 512)
    assert out["crc"] is StorageError.CRC
    assert out["ok_after"] == (StorageError.OK, bytes(range(256)) * 2)
    assert out["crc_multi"] is StorageError.CRC
    assert out["resp_crc"] is StorageError.CRC
    assert out["wr_crc"][0] is StorageError.CRC and out["wr_crc"][1] <= 1024
    assert out["wr_err"] is StorageError.CARD
    assert image.read(7, 2) == _image(1024, 5).read(7, 2)       # nothing written
    assert out["card_err"] is StorageError.CARD
    assert out["range0"] == (StorageError.RANGE, 0)
    assert out["range"] is StorageError.RANGE
    assert out["ok_end"] is StorageError.OK
    assert out["dead_read"] is StorageError.TIMEOUT and out["dead_ready"] == 0
    assert out["dead_again"] is StorageError.NOT_READY
    assert out["revived"] == (StorageError.OK, bytes(range(256)) * 2)
    assert card.violations == []


def test_card_beyond_image_and_stuck_busy():
    """A card whose CSD capacity (1024 sectors) exceeds what it can serve answers OUT_OF_RANGE
    (CARD); a card that never ends its busy phase ends in TIMEOUT, and the next command
    initialises the card again."""
    image = _image(64, 9)
    card = SDCard4(image)

    async def body(ctx, dut):
        out = {"oor": (await storage_read(ctx, dut.storage, 100, 1))[0]}
        card.busy_clocks = 10_000
        out["busy"] = (await storage_write(ctx, dut.storage, 1, bytes(512)))[0]
        out["busy_ready"] = ctx.get(dut.ready)
        card.busy_clocks = 4
        out["after"] = await storage_write(ctx, dut.storage, 2, bytes(range(256)) * 4)
        return out

    out = simulate(card, body)
    assert out["oor"] is StorageError.CARD
    assert out["busy"] is StorageError.TIMEOUT and out["busy_ready"] == 0
    assert out["after"] == (StorageError.OK, 1024)
    assert image.read(2, 2) == bytes(range(256)) * 4
    assert [c for c, _, _ in card.log].count(0) == 2      # initialised again
    assert card.violations == []


def test_short_timeouts_never_hang():
    """Timeouts shorter than the card's latencies (data timeout below N_AC, response timeout
    below N_CR): an error status within a bounded time, never a hang."""
    card = SDCard4(_image(16, 2), nac=40, init_polls=0)

    async def body(ctx, dut):
        out = [(await storage_read(ctx, dut.storage, 1, 2))[0]]
        card.ncr = 20
        out.append((await storage_read(ctx, dut.storage, 1, 1))[0])
        return out

    assert simulate(card, body, deadline=40_000, data_timeout=8, resp_timeout=12) == \
        [StorageError.TIMEOUT, StorageError.NOT_READY]


@pytest.mark.slow          # the cocotb test card_that_stops_answering covers it in `make test`
def test_card_pulled_out_mid_read():
    """A card pulled out in the second block of a multi-block read: TIMEOUT (the bytes already
    streamed are not vouched for: the status is), and the card is initialised again when it
    comes back."""
    image = _image(64, 9)
    card = SDCard4(image)

    async def body(ctx, dut):
        out = {"first": await storage_read(ctx, dut.storage, 2, 1)}
        card.die_after = 1500
        out["pulled"] = await storage_read(ctx, dut.storage, 2, 4)
        out["pulled_ready"] = ctx.get(dut.ready)
        card.dead = None
        out["back"] = await storage_read(ctx, dut.storage, 2, 2)
        return out

    out = simulate(card, body)
    assert out["first"] == (StorageError.OK, image.read(2, 1))
    st, got = out["pulled"]
    assert st is StorageError.TIMEOUT and out["pulled_ready"] == 0
    assert 512 <= len(got) <= 1024 and got[:512] == image.read(2, 1)
    assert out["back"] == (StorageError.OK, image.read(2, 2))
    assert [c for c, _, _ in card.log].count(0) == 2      # initialised again
    assert card.violations == []


def test_power_cut_tears_the_block():
    """``cut_after`` bytes into a multi-block write the power fails: the sectors before are
    whole, the one being written holds the bytes received so far."""
    image = _image(64, 4)
    old = image.read(20, 3)
    card = SDCard4(image, cut_after=512 + 100)
    data = random.Random(8).randbytes(3 * 512)

    async def body(ctx, dut):
        return await storage_write(ctx, dut.storage, 20, data)

    with pytest.raises(PowerCut):
        simulate(card, body)
    assert image.read(20, 1) == data[:512]
    assert image.read(21, 1) == data[512:612] + old[612:1024]
    assert image.read(22, 1) == old[1024:]


OPS = 16
VERBOSE = False


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_random_faults(seed):
    """Random transfers with a random fault injected into each (a bad CRC on read data, on a
    response or on a written block, a write error, an error answer, a card pulled out at a
    random clock, a long busy phase): every command ends in a status within a bounded time; an
    OK read returns the image's bytes, an OK write is on the image; a failed write leaves every
    sector either old or new, never anything else."""
    rng = random.Random(seed)
    image = _image(64, seed)
    card = SDCard4(image, nac=rng.randrange(2, 12), block_gap=rng.randrange(1, 5),
                   busy_clocks=rng.randrange(0, 12), init_polls=1)
    faults = ["none", "read_crc", "resp_crc", "write_bus", "write_error", "fail_next", "die",
              "busy"]
    log = []

    async def body(ctx, dut):
        for _ in range(OPS):
            fault = rng.choice(faults)
            count = rng.choice([1, 2, rng.randrange(3, 6)])
            lba = rng.randrange(64 - count + 1)
            write = rng.random() < 0.5
            card.bad_read_crc = int(fault == "read_crc")
            card.bad_resp_crc = int(fault == "resp_crc")
            card.bad_write_bus = int(fault == "write_bus")
            card.write_error = int(fault == "write_error")
            card.fail_next = (1 << 19) if fault == "fail_next" else 0
            card.die_after = rng.randrange(20, 3000) if fault == "die" else None
            card.busy_clocks = 1000 if fault == "busy" else 4
            before = image.read(lba, count)
            if write:
                data = rng.randbytes(count * 512)
                st, _ = await storage_write(ctx, dut.storage, lba, data, rng=rng, idle=0.2)
                after = image.read(lba, count)
                if st is StorageError.OK:
                    assert after == data, (fault, lba, count)
                for k in range(count):
                    sector = after[512 * k:512 * (k + 1)]
                    assert sector in (before[512 * k:512 * (k + 1)],
                                      data[512 * k:512 * (k + 1)]), (fault, k)
            else:
                st, got = await storage_read(ctx, dut.storage, lba, count, rng=rng, stall=0.2)
                if st is StorageError.OK:
                    assert got == before, (fault, lba, count)
            log.append((fault, write, st))
            if VERBOSE:
                print(fault, "write" if write else "read", lba, count, st)
            card.dead, card.die_after = None, None
        return log

    simulate(card, body, deadline=60_000 * OPS, busy_timeout=400)
    assert card.violations == []
    assert {st for f, _, st in log if f == "none"} <= {StorageError.OK}
