"""Verilog of every core at fixed parameters, for refactors that must not change the hardware.

``python -m ringkv.sim.netlist_snapshot DIR`` writes one ``.v`` file per core (and per numerics
where the core has one) into ``DIR``; run it before and after a change that should leave the
gateware alone (moving constants, renaming imports, splitting a module) and compare the two
directories with ``diff -r``. Identical text is the strongest check; where only names or
attributes differ, a yosys equivalence check (``equiv_make``/``equiv_induct``) is the next step.
"""

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from amaranth.back import verilog

__all__ = ["cores", "write_snapshot", "main"]


def cores():
    """``{name: factory}`` for every core at the parameters the tests and the board use."""
    from ringkv.defs.config import DEFAULT_CONFIG, DEMO_CONFIG
    from ringkv.defs.hash import hash_seed
    from ringkv.hw.attention.core import AttentionCore
    from ringkv.hw.attention.merge import Reciprocal
    from ringkv.hw.link.framing import FrameDecoder, FrameEncoder
    from ringkv.hw.link.uart import UART, divisor_for
    from ringkv.hw.sdram.controller import SdramController
    from ringkv.hw.seal.mac import MacCore, MacUnit
    from ringkv.hw.storage.dma import DmaEngine
    from ringkv.hw.storage.dma_stream import WritePipeline
    from ringkv.hw.storage.record_header import HeaderEncoder, HeaderParser
    from ringkv.hw.storage.sdnative import SDNativeController
    from ringkv.hw.storage.sdphy import (
        SDClocker,
        SDCmdReader,
        SDCmdWriter,
        SDDataPHY,
        SPIByteEngine,
    )
    from ringkv.hw.storage.sdspi import SDSPIController
    from ringkv.hw.storage.tiered import TieredStorage
    from ringkv.hw.store.directory import CacheDirectory
    from ringkv.hw.store.directory_alloc import FreeLinks, RegionAllocator
    from ringkv.hw.store.directory_lists import BucketLists
    from ringkv.hw.store.hash_engine import HashEngine
    from ringkv.hw.store.hot_tier import HotTier
    from ringkv.hw.store.token_memory import TokenMemory
    from ringkv.hw.top import RingKVTop

    fx2 = replace(DEFAULT_CONFIG, numerics="ringkv-fx2")
    out = {
        "hash_engine": lambda: HashEngine(seed=hash_seed(DEFAULT_CONFIG)),
        "token_memory": lambda: TokenMemory(1024, 16),
        "directory": lambda: CacheDirectory(buckets=64, links=128, regions=128),
        "directory_region_allocator": lambda: RegionAllocator(regions=128, b_threshold=64),
        "directory_free_links": lambda: FreeLinks(links=128),
        "directory_lists": lambda: BucketLists(buckets=64, links=128),
        "hot_tier": lambda: HotTier(regions=128, slots=24),
        "tiered_storage": lambda: TieredStorage(regions=128, sectors_per_region=321, slots=24),
        "frame_decoder": lambda: FrameDecoder(),
        "frame_encoder": lambda: FrameEncoder(),
        "uart": lambda: UART(divisor_for(40_000_000, 3_000_000)),
        "sdspi": lambda: SDSPIController(),
        "sdnative": lambda: SDNativeController(hs_half_period=1),
        "sd_clocker": lambda: SDClocker(init_half_period=50, half_period=1, hs_half_period=1),
        "sd_cmd_writer": lambda: SDCmdWriter(),
        "sd_cmd_reader": lambda: SDCmdReader(resp_timeout=64),
        "sd_data_phy": lambda: SDDataPHY(resp_timeout=64, data_timeout=1 << 21,
                                         busy_timeout=1 << 23),
        "spi_byte_engine": lambda: SPIByteEngine(init_half_period=63, half_period=1),
        "dma_fx1": lambda: DmaEngine(DEFAULT_CONFIG, 64),
        "dma_fx2": lambda: DmaEngine(fx2, 64),
        "record_header_encoder": lambda: HeaderEncoder(DEFAULT_CONFIG),
        "record_header_parser": lambda: HeaderParser(DEFAULT_CONFIG),
        "dma_write_pipeline": lambda: WritePipeline(DEFAULT_CONFIG),
        "attention_fx1": lambda: AttentionCore(layers=2, window=32, head_dim=16),
        "attention_fx2": lambda: AttentionCore(layers=2, window=32, head_dim=16,
                                               numerics="ringkv-fx2"),
        "attention_fx1c": lambda: AttentionCore(layers=2, window=32, head_dim=16,
                                                numerics="ringkv-fx1c",
                                                qkv_fracs=((4, 4, 6), (5, 5, 5))),
        "mac_core": lambda: MacCore(),
        "sdram_controller": lambda: SdramController(tck_ns=1000 / 60, cl=2, bl=8, ports=2),
        "mac_unit": lambda: MacUnit(),
        # the merge's divider at the default core's width of L (W = 128, P = 4)
        "attention_reciprocal": lambda: Reciprocal(25),
        "top_demo": lambda: RingKVTop(DEMO_CONFIG, regions=16),
        "top_demo_fx2": lambda: RingKVTop(replace(DEMO_CONFIG, numerics="ringkv-fx2"), regions=16),
        "top_demo_sealed": lambda: RingKVTop(DEMO_CONFIG, regions=16, sealed=True),
    }
    return out


def write_snapshot(directory, only=None) -> list[Path]:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, core in cores().items():
        if only and name not in only:
            continue
        path = directory / f"{name}.v"
        path.write_text(verilog.convert(core(), name=name, emit_src=False))
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--only", nargs="*", help="core names (default: all)")
    args = parser.parse_args(argv)
    for path in write_snapshot(args.directory, args.only):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
