"""The definitions layer: one source for both sides, and the gateware's shapes mirror it."""

import binascii
import random
import zlib

import pytest
from amaranth import Shape
from amaranth.lib import crc
from amaranth.lib import enum as hdl_enum
from amaranth.lib.crc import catalog

from ringkv.defs import checks, protocol, record
from ringkv.defs import directory as dir_defs
from ringkv.defs.crc import CrcSpec
from ringkv.hw import protocol as hw_protocol
from ringkv.hw.enums import shaped
from ringkv.hw.storage import dma as hw_dma
from ringkv.hw.storage import port as hw_storage
from ringkv.hw.store import directory as hw_directory


@pytest.mark.parametrize("spec, fast, catalogued", [
    (protocol.FRAME_CRC, lambda d: binascii.crc_hqx(d, 0), catalog.CRC16_XMODEM),
    (record.RECORD_CRC, zlib.crc32, catalog.CRC32_ISO_HDLC),
])
def test_crc_parameters_host_and_gateware_agree(spec, fast, catalogued):
    """The host's stdlib CRC, Amaranth's catalogue entry and the parameters are one CRC."""
    rng = random.Random(spec.width)
    ours = crc.Algorithm(**spec.algorithm_kwargs())(data_width=8)
    for data in [b"", b"123456789", bytes(1), b"\xff" * 3] + [rng.randbytes(rng.randrange(64))
                                                            for _ in range(40)]:
        want = spec.compute(data)
        assert fast(data) == want
        assert ours.compute(data) == want
        assert catalogued(data_width=8).compute(data) == want
    assert spec.name in dir(catalog)


def test_crc_reference_catches_a_wrong_parameter():
    wrong = CrcSpec("CRC16_XMODEM", width=16, polynomial=0x1021, initial=0xFFFF, reflect=False,
                    xor_output=0)
    assert wrong.compute(b"123456789") != binascii.crc_hqx(b"123456789", 0)


@pytest.mark.parametrize("definition, hardware, bits", [
    (protocol.Op, hw_protocol.Op, protocol.OP_BITS),
    (protocol.Status, hw_protocol.Status, protocol.STATUS_BITS),
    (dir_defs.Op, hw_directory.Op, dir_defs.OP_BITS),
    (dir_defs.Status, hw_directory.Status, dir_defs.STATUS_BITS),
    (record.RecordStatus, hw_dma.RecordStatus, record.RECORD_STATUS_BITS),
    (protocol.StorageError, hw_storage.StorageError, 3),
    (protocol.CardType, hw_storage.CardType, 2),
])
def test_gateware_enums_mirror_the_definitions(definition, hardware, bits):
    assert issubclass(hardware, hdl_enum.Enum)
    assert [(m.name, m.value) for m in hardware] == [(m.name, m.value) for m in definition]
    assert Shape.cast(hardware) == Shape(bits)
    assert hardware.__qualname__ == definition.__qualname__
    assert all(m.value < 1 << bits for m in definition)


def test_shaped_rejects_a_value_that_does_not_fit():
    with pytest.raises(ValueError, match=r"Op.TOKENS_WRITE = 16 does not fit unsigned\(4\)"):
        shaped(protocol.Op, 4)


def test_every_implemented_request_has_a_length_rule_and_a_response():
    assert set(protocol.LENGTH) == set(protocol.REQUESTS) == set(protocol.RESPONSES)
    for op, rule in protocol.LENGTH.items():
        if rule is protocol.Length.OPTIONAL:
            assert protocol.REQUESTS[op].size > 0
        if rule is protocol.Length.ANY:
            assert protocol.REQUESTS[op].size == 0


def test_definitions_import_nothing_but_the_standard_library():
    """Also checked for every module by tests/repo/test_layers.py; here: importable in a bare
    interpreter without Amaranth or numpy on the path."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['amaranth'] = None; sys.modules['numpy'] = None\n"
            "import ringkv.defs.config, ringkv.defs.protocol, ringkv.defs.record, "
            "ringkv.defs.numerics, ringkv.defs.hash, ringkv.defs.directory\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sequence_numbers_follow_serial_arithmetic():
    top = record.SEQ_MOD - 1
    assert record.seq_next(top) == 0
    assert record.seq_newer(0, top) and not record.seq_newer(top, 0)
    assert record.seq_newer(5, 4) and not record.seq_newer(4, 5) and not record.seq_newer(4, 4)
    assert record.seq_newest([top, 0, 1]) == 1
    assert record.seq_newest([top - 2, top]) == top
    assert record.seq_newest([7]) == 7 and record.seq_newest([]) is None
    rng = random.Random(3)
    for _ in range(200):                # any arc shorter than half the circle: its last member
        start, n = rng.randrange(record.SEQ_MOD), rng.randrange(1, 20)
        arc = sorted(rng.sample(range(1 << 20), n))
        seqs = [(start + a) % record.SEQ_MOD for a in arc]
        rng.shuffle(seqs)
        assert record.seq_newest(seqs) == (start + arc[-1]) % record.SEQ_MOD


@pytest.mark.parametrize("call, exc, message", [
    (lambda: checks.check_int("n", 1.0), TypeError, "n must be an integer, not 1.0"),
    (lambda: checks.check_int("n", True, low=0), TypeError, "n must be an integer, not True"),
    (lambda: checks.check_int("n", 0, low=1), ValueError, "n must be a positive integer, not 0"),
    (lambda: checks.check_int("n", -1, low=0), ValueError,
     "n must be a non-negative integer, not -1"),
    (lambda: checks.check_int("n", 1, low=2), ValueError, "n must be at least 2, not 1"),
    (lambda: checks.check_int("n", 33, high=32), ValueError, "n must be at most 32, not 33"),
    (lambda: checks.check_int("Width", 0, low=1, high=8, unit=" bits"), ValueError,
     "Width must be between 1 and 8 bits, not 0"),
    (lambda: checks.check_pow2("n", "4"), TypeError, "n must be an integer, not '4'"),
    (lambda: checks.check_pow2("n", 6), ValueError, "n must be a positive power of two, not 6"),
    (lambda: checks.check_pow2("n", 0), ValueError, "n must be a positive power of two, not 0"),
    (lambda: checks.check_pow2("n", 2, low=4), ValueError,
     "n must be a power of two of at least 4, not 2"),
    (lambda: checks.check_pow2("n", 64, low=2, high=32), ValueError,
     "n must be a power of two between 2 and 32, not 64"),
    (lambda: checks.check_type("config", 3, dict), TypeError, "config must be a dict, not 3"),
    (lambda: checks.log2_exact(12), ValueError, "12 is not a power of two"),
])
def test_parameter_checks_one_rule(call, exc, message):
    """Wrong type: TypeError; right type, bad value: ValueError; the message names both."""
    with pytest.raises(exc) as info:
        call()
    assert str(info.value) == message


def test_parameter_checks_pass_values_through():
    assert checks.check_int("n", 5, low=1, high=5) == 5
    assert checks.check_pow2("n", 1) == 1 and checks.check_pow2("n", 32, low=2, high=32) == 32
    assert checks.check_type("d", {}, dict) == {}
    assert [checks.log2_exact(1 << k) for k in range(6)] == list(range(6))
    assert not checks.is_int(True) and checks.is_int(0) and not checks.is_pow2(True)


def test_tier_parameters():
    """``RingKVTop(tier=...)``'s parameters: the ULX3S's 32 MB part and compact slots of 16
    token sectors by default (240 conversations at the default shape, issue #35's target; 480
    in the 64 MB part), at most one slot per region, and the refusals."""
    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.defs.hot_tier import tier_parameters
    from ringkv.defs.record import RecordLayout
    lay = RecordLayout(DEFAULT_CONFIG)
    t = tier_parameters(lay, 4096)
    assert (t["part"], t["sdram_bytes"], t["slots"], t["slot_token_sectors"],
            t["slot_sectors"], t["sdram_sectors"]) == (
        "MT48LC16M16A2-6A", 32 << 20, 240, 16, 273, 240 * 273)
    assert tier_parameters(lay, 4096, part="AS4C32M16SB-7")["slots"] == 480
    assert tier_parameters(lay, 4096, slot_token_sectors=None)["slots"] == 204
    assert tier_parameters(lay, 64)["slots"] == 64                  # one copy per region
    assert tier_parameters(lay, 64, slots=10)["sdram_sectors"] == 2730
    with pytest.raises(ValueError, match=r"^Unknown SDRAM chip 'X'"):
        tier_parameters(lay, 64, part="X")
    with pytest.raises(ValueError, match=r"^slots must be between 2 and 1024, not 1$"):
        tier_parameters(lay, 64, slots=1)
    with pytest.raises(ValueError, match=r"^241 slots of 273 sectors need 33686016 bytes of "
                                         r"SDRAM, more than 33554432$"):
        tier_parameters(lay, 4096, slots=241)
    with pytest.raises(ValueError, match=r"^slot_token_sectors must be between 0 and 64, "
                                         r"not 65$"):
        tier_parameters(lay, 64, slot_token_sectors=65)
