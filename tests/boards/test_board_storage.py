"""The ULX3S top's storage choice: SD native 4-bit by default (CMD bidirectional, pull-ups),
SPI mode as an option; elaborated for the real platform (no place and route)."""

import re

import pytest

from ringkv.boards.ulx3s import ULX3STop
from ringkv.defs.config import DEMO_CONFIG


def test_storage_parameter():
    with pytest.raises(ValueError, match=r"^storage must be one of \('sd4', 'spi'\), "
                                         r"not 'sdio'$"):
        ULX3STop(DEMO_CONFIG, regions=16, storage="sdio")
    assert ULX3STop(DEMO_CONFIG, regions=16, sys_mhz=40).sd_half == 1  # 20 MHz
    assert ULX3STop(DEMO_CONFIG, regions=16, sys_mhz=50).sd_half == 1  # 25 MHz
    assert ULX3STop(DEMO_CONFIG, regions=16, sys_mhz=60).sd_half == 2  # 15 MHz, not 30
    assert ULX3STop(DEMO_CONFIG, regions=16).sd_half == 2              # the default, 60 MHz
    assert ULX3STop(DEMO_CONFIG, regions=16, sys_mhz=40, storage="spi").sd_half == 2  # 10 MHz
    assert ULX3STop(DEMO_CONFIG, regions=16, storage="spi").sd_half == 3               # 10 MHz


def _prepare(storage):
    from amaranth_boards.ulx3s import ULX3S_85F_Platform
    plan = ULX3S_85F_Platform().prepare(ULX3STop(DEMO_CONFIG, regions=16, storage=storage),
                                        name="top")
    return plan.files["top.il"], plan.files["top.lpf"]


def _ports(rtlil):
    """Top-level ports: name -> direction."""
    top = rtlil[rtlil.index("attribute \\top 1"):]
    top = top[:top.index("\nend\n")]
    pattern = r"wire (?:width \d+ )?(input|output|inout) \d+\s+\\(\S+)"
    return {name: d for d, name in re.findall(pattern, top)}


@pytest.mark.parametrize("storage", ["sd4", pytest.param("spi", marks=pytest.mark.slow)])
def test_board_sd_pins(storage):
    rtlil, lpf = _prepare(storage)
    ports = _ports(rtlil)
    if storage == "sd4":
        assert ports["sd_card_native_0__clk__io"] == "output"
        assert ports["sd_card_native_0__cmd__io"] == "inout"      # the card answers on CMD
        assert ports["sd_card_native_0__dat__io"] == "inout"
        for pin, site in (("clk__io", "J1"), ("cmd__io", "J3"), ("dat__io[0]", "K2"),
                          ("dat__io[3]", "H1")):
            assert f'LOCATE COMP "sd_card_native_0__{pin}" SITE "{site}";' in lpf
        assert 'IOBUF PORT "sd_card_native_0__cmd__io" IO_TYPE=LVCMOS33 SLEW=FAST ' \
               'PULLMODE=UP;' in lpf
        assert not any(p.startswith("sd_card_spi") for p in ports)
    else:
        assert ports["sd_card_spi_0__copi__io"] == "output"
        assert ports["sd_card_spi_0__cipo__io"] == "input"
        assert not any(p.startswith("sd_card_native") for p in ports)
