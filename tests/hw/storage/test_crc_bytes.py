"""The one-to-four-bytes CRC unit (hw/storage/crc_bytes.py) against zlib.crc32, the spec's
bitwise definition and amaranth.lib.crc, on random byte streams split at random."""

import random
import zlib

import pytest
from amaranth.lib import crc as amaranth_crc
from amaranth.sim import Simulator

from ringkv.defs.crc import CrcSpec
from ringkv.defs.record import RECORD_CRC
from ringkv.hw.storage.crc_bytes import CrcBytes, crc_step_matrix

#: a non-reflected CRC-32 (CRC-32/BZIP2), so both branches of the derivation run
BZIP2 = CrcSpec("CRC32_BZIP2", width=32, polynomial=0x04C11DB7, initial=0xFFFFFFFF,
                reflect=False, xor_output=0xFFFFFFFF)


def run(spec, messages, *, seed=0, idle=0.3):
    """Each message fed in random pieces of 1 to 4 bytes (idle clocks between, zero-byte
    transfers and noise in the unused bytes); the CRC read one clock after its last piece;
    ``start`` together with the first piece or alone before it."""
    dut = CrcBytes(spec)
    rng = random.Random(seed)
    got = []

    async def bench(ctx):
        for msg in messages:
            i, first = 0, True
            if rng.random() < 0.5:                  # start alone
                ctx.set(dut.start, 1)
                await ctx.tick()
                ctx.set(dut.start, 0)
                first = False
            while i < len(msg) or first:
                while rng.random() < idle:
                    # idle, or a transfer of no byte (n 0), or a bad count (5..7)
                    ctx.set(dut.valid, int(rng.random() < 0.5))
                    ctx.set(dut.n, rng.choice([0, 5, 6, 7]))
                    ctx.set(dut.data, rng.randrange(1 << 32))
                    await ctx.tick()
                n = min(rng.randint(1, 4), len(msg) - i) if i < len(msg) else 0
                piece = msg[i:i + n]
                noise = rng.randrange(1 << 32) & ~((1 << (8 * n)) - 1)
                ctx.set(dut.start, int(first))
                ctx.set(dut.valid, int(n > 0))
                ctx.set(dut.n, n)
                ctx.set(dut.data, int.from_bytes(piece, "little") | noise)
                await ctx.tick()
                ctx.set(dut.start, 0)
                ctx.set(dut.valid, 0)
                first = False
                i += n
            got.append(ctx.get(dut.crc))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return got


def _messages(seed):
    rng = random.Random(seed)
    lengths = [0, 1, 2, 3, 4, 5, 7, 8, 64, 509] + [rng.randrange(1, 200) for _ in range(8)]
    return [bytes(rng.randrange(256) for _ in range(n)) for n in lengths]


def test_record_crc_equals_zlib_and_lib_crc():
    msgs = _messages(1)
    got = run(RECORD_CRC, msgs, seed=2)
    lib = amaranth_crc.Algorithm(**RECORD_CRC.algorithm_kwargs())(data_width=8)
    assert got == [zlib.crc32(m) for m in msgs] == [lib.compute(m) for m in msgs]


def test_a_non_reflected_crc():
    msgs = _messages(3)
    lib = amaranth_crc.Algorithm(**BZIP2.algorithm_kwargs())(data_width=8)
    assert run(BZIP2, msgs, seed=4) == [BZIP2.compute(m) for m in msgs] == \
        [lib.compute(m) for m in msgs]


def test_matrices_are_linear_maps_of_the_definition():
    """The derived networks reproduce the bitwise definition on random states and data."""
    rng = random.Random(5)
    for n in range(1, 5):
        rows = crc_step_matrix(RECORD_CRC, n)
        for _ in range(50):
            state, data = rng.randrange(1 << 32), rng.randrange(1 << (8 * n))
            want = RECORD_CRC.update(state, data.to_bytes(n, "little"))
            got = sum(((bin(state & s).count("1") + bin(data & d).count("1")) & 1) << i
                      for i, (s, d) in enumerate(rows))
            assert got == want


def test_parameter_errors():
    with pytest.raises(TypeError):
        CrcBytes("crc32")
    with pytest.raises(ValueError, match=r"^the CRC must be at least 8 bits wide, not 5$"):
        CrcBytes(CrcSpec("X", width=5, polynomial=0x15, initial=0, reflect=False,
                         xor_output=0))
