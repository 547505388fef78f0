"""cocotb on Verilator: the board's storage path, DMA engine -> SD controller (SPI, or native
4-bit with ``mode="sd4"``) -> SD card model over an image file: export, power cycle (reset,
same image), rebuild scan, import."""

import random

import cocotb
import cocotb_dma as common  # noqa: E402  (same harness helpers)
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import RecordLayout, RecordStatus
from ringkv.host.record import encode_record, rebuild, scan_image
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.sd4_model import CocotbSD4Card, SDCard4
from ringkv.sim.sdcard_model import CocotbSDCard, SDCardSPI
from ringkv.sim.sector_model import SectorImage

P = cocotb_params()
CONFIG = RingKVConfig(**P["config"])
REGIONS = P["regions"]


@cocotb.test(timeout_time=4000, timeout_unit="ms")
async def export_power_cycle_import(dut):
    Clock(dut.clk, 10, unit="ns").start()
    rng = random.Random(7)
    lay = RecordLayout(CONFIG)
    image = SectorImage(sectors=REGIONS * lay.sectors_per_region)
    if P.get("mode") == "sd4":
        card = SDCard4(image, busy_clocks=4, nac=6)
        cocotb.start_soon(CocotbSD4Card(dut, "sdbus", card).run())
    else:
        card = SDCardSPI(image, busy_bytes=2)
        cocotb.start_soon(CocotbSDCard(dut, "spi", card).run())
    bench = common.Bench(dut, image, 11, p=0.2)
    await bench.reset()
    rings, count, head, tokens = common.random_state(rng, CONFIG.window + 5)
    await bench.load(rings, count, head, tokens)
    st = await bench.op(common.EXPORT, 1, hash=0xABCDEF, seq=4)
    assert st == (RecordStatus.OK, count, 0xABCDEF, 4)
    writes = encode_record(CONFIG, tokens, rings, count=count, ring_head=head,
                           prefix_hash=0xABCDEF, commit_seq=4)
    base = lay.region_lba(1)
    for off, data in writes:
        assert image.read(base + off, len(data) // 512) == data
    # power cycle: reset the FPGA (the card keeps its image; it must be initialised again)
    card.power_cycle()
    bench = common.Bench(dut, image, 12, p=0.2)
    await bench.reset()
    got = [await bench.op(common.VERIFY, r) for r in range(REGIONS)]
    infos = scan_image(CONFIG, image.read, REGIONS)
    assert [g[0] for g in got] == [i.status for i in infos]
    assert got[1] == (RecordStatus.OK, count, 0xABCDEF, 4)
    assert rebuild(infos)[0] == [(count, 0xABCDEF, 1, 4)]
    stale = np.zeros_like(rings)
    await bench.load(stale, 0, 0, tokens)
    assert (await bench.op(common.IMPORT, 1, count=count, hash=0xABCDEF))[0] is RecordStatus.OK
    got_rings, meta = await bench.read_rings()
    assert meta == [(count, head)] * CONFIG.layers
    for s in common.valid_slots(count, head):
        assert (got_rings[:, :, :, s, :] == rings[:, :, :, s, :]).all()
    if P.get("mode") == "sd4":
        assert card.violations == [] and card.crc_errors == 0
    await RisingEdge(dut.clk)
