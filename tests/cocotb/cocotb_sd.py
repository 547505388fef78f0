"""cocotb on Verilator: the SD-SPI controller against the bit-level SD card model."""

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from ringkv.hw.storage.port import StorageError, StorageOp
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.sdcard_model import CocotbSDCard, SDCardSPI
from ringkv.sim.sector_model import SectorImage
from ringkv.sim.storage_host import CocotbStorageHost

P = cocotb_params()


class SDBench(CocotbStorageHost):
    """The controller's storage port driven from Python, the card model on its pins."""

    def __init__(self, dut, card, seed, p):
        super().__init__(dut, seed, p)
        self.card = card
        self.model = CocotbSDCard(dut, "spi", card)
        self.task = cocotb.start_soon(self.model.run())


@cocotb.test(timeout_time=2000, timeout_unit="ms")
async def round_trips(dut):
    """Random single and multi-block writes and reads, random idle/backpressure, for SDHC, SDSC
    and v1 cards; the image and the data read back equal what was written."""
    Clock(dut.clk, 10, unit="ns").start()
    rng = random.Random(P.get("seed", 3))
    for kind in ("sdhc", "sdsc", "v1"):
        image = SectorImage(sectors=128)
        image.write(0, rng.randbytes(128 * 512))
        card = SDCardSPI(image, sdhc=kind == "sdhc", v2=kind != "v1",
                         read_latency=rng.randrange(0, 5), busy_bytes=rng.randrange(1, 6))
        bench = SDBench(dut, card, rng.randrange(1 << 30), p=0.2)
        await bench.reset()
        for _ in range(P.get("transfers", 4)):
            count = rng.choice([1, 1, 2, rng.randrange(3, 6)])
            lba = rng.randrange(128 - count)
            data = rng.randbytes(count * 512)
            assert await bench.write(lba, data) is StorageError.OK
            assert image.read(lba, count) == data
            lba2 = rng.randrange(128 - count)
            st, got = await bench.read(lba2, count)
            assert st is StorageError.OK and got == image.read(lba2, count), kind
        assert card.crc_errors == 0
        assert int(dut.sdhc.value) == (kind == "sdhc")


@cocotb.test(timeout_time=2000, timeout_unit="ms")
async def card_that_stops_answering(dut):
    """No card, a card gone mid-read, a card stuck busy, a bad CRC, count 0: an error status
    every time, and the controller works again when the card comes back."""
    Clock(dut.clk, 10, unit="ns").start()
    image = SectorImage(sectors=32)
    card = SDCardSPI(image, dead="high")
    bench = SDBench(dut, card, 5, p=0.1)
    await bench.reset()
    assert (await bench.read(1, 1))[0] is StorageError.NOT_READY
    assert await bench.write(1, bytes(512)) is StorageError.NOT_READY
    card.dead = None
    assert await bench.write(1, bytes(range(256)) * 4) is StorageError.OK
    # the card dies in the middle of a multi-block read
    task = cocotb.start_soon(bench.read(0, 6))
    for _ in range(20000):
        await RisingEdge(dut.clk)
    card.dead = "high"
    st, got = await task
    assert st is StorageError.TIMEOUT and len(got) < 6 * 512
    card.dead = None
    card.busy_bytes = 100_000
    assert await bench.write(4, bytes(512)) is StorageError.TIMEOUT
    card.busy_bytes = 2
    card.bad_read_crc = 1
    assert (await bench.read(1, 1))[0] is StorageError.CRC
    st, got = await bench.read(1, 2)
    assert st is StorageError.OK and got[:1024] == (bytes(range(256)) * 4)
    await bench.send_cmd(StorageOp.READ, 0, 0)
    assert await bench.recv_status() is StorageError.RANGE
