"""cocotb on Verilator: the SD native 4-bit controller against the bit-level 4-bit card model."""

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from ringkv.hw.storage.port import StorageError, StorageOp
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.sd4_model import CocotbSD4Card, SDCard4
from ringkv.sim.sector_model import SectorImage
from ringkv.sim.storage_host import CocotbStorageHost

P = cocotb_params()


class SD4Bench(CocotbStorageHost):
    """The controller's storage port driven from Python, the card model on its pins."""

    def __init__(self, dut, card, seed, p):
        super().__init__(dut, seed, p)
        self.card = card
        self.model = CocotbSD4Card(dut, "sd", card)
        self.task = cocotb.start_soon(self.model.run())


@cocotb.test(timeout_time=4000, timeout_unit="ms")
async def round_trips(dut):
    """Random single and multi-block writes and reads with random idle/backpressure on every
    stream, on cards with random timing; the image and the data read back equal what was
    written, and the card saw no protocol violation."""
    Clock(dut.clk, 10, unit="ns").start()
    rng = random.Random(P.get("seed", 3))
    for hs in (False, True)[:P.get("cards", 1)]:
        image = SectorImage(sectors=128)
        image.write(0, rng.randbytes(128 * 512))
        card = SDCard4(image, high_speed=hs, nac=rng.randrange(2, 30),
                       block_gap=rng.randrange(1, 6), busy_clocks=rng.randrange(0, 20),
                       ncr=rng.randrange(2, 10))
        bench = SD4Bench(dut, card, rng.randrange(1 << 30), p=0.3)
        await bench.reset()
        for _ in range(P.get("transfers", 3)):
            count = rng.choice([1, 2, rng.randrange(3, 9)])
            lba = rng.randrange(128 - count)
            data = rng.randbytes(count * 512)
            assert await bench.write(lba, data) is StorageError.OK
            assert image.read(lba, count) == data
            lba2 = rng.randrange(128 - count)
            st, got = await bench.read(lba2, count)
            assert st is StorageError.OK and got == image.read(lba2, count)
        assert card.violations == [] and card.crc_errors == 0
        assert int(dut.ready.value) == 1 and int(dut.high_speed.value) == hs
        bench.task.cancel()


@cocotb.test(timeout_time=4000, timeout_unit="ms")
async def card_that_stops_answering(dut):
    """No card, a card gone mid-read, a card stuck busy, a bad read CRC, count 0: an error
    status every time, and the controller works again when the card comes back."""
    Clock(dut.clk, 10, unit="ns").start()
    image = SectorImage(sectors=32)
    card = SDCard4(image, dead="high")
    bench = SD4Bench(dut, card, 5, p=0.2)
    await bench.reset()
    assert (await bench.read(1, 1))[0] is StorageError.NOT_READY
    card.dead = None
    assert await bench.write(1, bytes(range(256)) * 4) is StorageError.OK
    task = cocotb.start_soon(bench.read(0, 6))
    for _ in range(4000):
        await RisingEdge(dut.clk)
    card.dead = "high"
    st, got = await task
    assert st is StorageError.TIMEOUT and len(got) < 6 * 512
    card.dead = None
    st, got = await bench.read(1, 2)                   # initialised again
    assert st is StorageError.OK and got[:1024] == bytes(range(256)) * 4
    card.busy_clocks = 100_000
    assert await bench.write(4, bytes(512)) is StorageError.TIMEOUT
    card.busy_clocks = 2
    card.bad_read_crc = 1
    assert (await bench.read(1, 1))[0] is StorageError.CRC
    st, got = await bench.read(1, 2)
    assert st is StorageError.OK and got == bytes(range(256)) * 4
    await bench.send_cmd(StorageOp.READ, 0, 0)
    assert await bench.recv_status() is StorageError.RANGE
    assert card.violations == []
