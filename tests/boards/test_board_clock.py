"""The ULX3S top's clock-derived constants at the system clocks it is built for (60 MHz, the
default, and 40 MHz, the fallback): the PLL's dividers, the UART's baud divisor, the SD clock
dividers (transfer and initialisation) and what the top reports of them, the LED timings; the
one default clock of the top, the board build and the gate-level smoke. Elaboration only."""

import pytest

from ringkv.boards.ulx3s import (
    ACTIVITY_CYCLES,
    ERROR_CYCLES,
    POR_HOLD_CYCLES,
    SYS_MHZ,
    ULX3STop,
    pll_params,
)
from ringkv.defs.config import DEMO_CONFIG
from ringkv.hw.link.uart import baud_error

# sys MHz: (CLKI_DIV, CLKFB_DIV, CLKOP_DIV), UART clocks per bit, SD CLK (native, SPI), init clock
CLOCKS = {
    40: ((5, 8, 15), 40 / 3, 20_000_000, 10_000_000, 50),
    60: ((5, 12, 10), 20, 15_000_000, 10_000_000, 75),
}


@pytest.mark.parametrize("mhz", sorted(CLOCKS))
def test_clock_derived_constants(mhz):
    dividers, per_bit, sd4_hz, spi_hz, init_half = CLOCKS[mhz]
    pll = pll_params(25.0, mhz)
    assert (pll["CLKI_DIV"], pll["CLKFB_DIV"], pll["CLKOP_DIV"]) == dividers
    assert pll["f_out_mhz"] == mhz and 400 <= pll["f_vco_mhz"] <= 800
    top = ULX3STop(DEMO_CONFIG, regions=16, sys_mhz=mhz)
    assert top.sys_hz == mhz * 1e6
    # 3 Mbaud: the average bit time exact (60 MHz: 20 clocks, an integer divisor)
    assert top.divisor == pytest.approx(per_bit) and baud_error(round(top.sys_hz), top.baud,
                                                                top.divisor) == 0
    if mhz == 60:
        assert top.divisor.denominator == 1
    # SD CLK: the fastest sys / (2 * half) at or below 25 MHz (default speed); 400 kHz or less
    # while the card initialises; STORAGE_INFO reports the transfer clock
    assert top.sys_hz / (2 * top.sd_half) == sd4_hz <= 25e6
    assert top.top.sd_clock_hz == sd4_hz
    assert top.sd_init_half == init_half and top.sys_hz / (2 * init_half) <= 400e3
    assert top.sys_hz / (2 * (init_half - 1)) > 400e3        # the fastest such clock
    spi = ULX3STop(DEMO_CONFIG, regions=16, sys_mhz=mhz, storage="spi")
    assert spi.sys_hz / (2 * spi.sd_half) == spi_hz
    # LEDs: heartbeat bit 25 blinks at about a second or so; the stretches are visible
    assert 0.5 < (1 << 25) / top.sys_hz < 1.0
    assert 0.03 < ACTIVITY_CYCLES / top.sys_hz < 0.06
    assert 0.25 < ERROR_CYCLES / top.sys_hz < 0.5
    assert POR_HOLD_CYCLES / top.sys_hz < 10e-6


def test_the_default_clock_is_60_mhz_everywhere(monkeypatch):
    """60 MHz is the board's default system clock: the top's, ``ringkv build``'s (its option
    and its function), the gate-level smoke's and the pin-level simulation's (which take the
    board's); 40 MHz is only ever asked for."""
    import inspect

    from ringkv.boards import build
    from ringkv.sim.board_harness import board_clock
    assert SYS_MHZ == 60.0
    assert inspect.signature(ULX3STop).parameters["sys_mhz"].default == SYS_MHZ
    assert inspect.signature(build.build).parameters["sys_mhz"].default == SYS_MHZ
    assert ULX3STop(DEMO_CONFIG, regions=16).sys_hz == 60e6
    assert board_clock() == SYS_MHZ and board_clock(40) == 40.0
    parsed = {}

    def stop(_board, **kwargs):
        parsed.update(kwargs)
        raise SystemExit(0)
    monkeypatch.setattr(build, "build", stop)
    for argv, mhz in (([], 60.0), (["--sys-mhz", "40"], 40.0)):
        with pytest.raises(SystemExit):
            build.main(argv)
        assert parsed["sys_mhz"] == mhz, argv


@pytest.mark.parametrize("mhz", sorted(CLOCKS))
def test_the_simulated_clock_pin_period(mhz):
    """The pin-level simulations drive ``clk25`` with a period in whole, even picoseconds
    (cocotb's ``Clock`` refuses an odd one: 60 MHz's 16,666.7 ps rounded to 16,667 stopped the
    60 MHz board simulation before its first clock), within a picosecond of the exact one."""
    from ringkv.sim.cocotb_board import clock_period_ps
    period = clock_period_ps(ULX3STop(DEMO_CONFIG, regions=16, sys_mhz=mhz).sys_hz)
    assert period % 2 == 0 and abs(period - 1e6 / mhz) <= 1
    assert period == {40: 25_000, 60: 16_666}[mhz]
    # with the half-rate SDRAM's second clock: a multiple of 4 ps (both half periods whole),
    # within 2 ps of the exact one
    half = clock_period_ps(mhz * 1e6, 2)
    assert half % 4 == 0 and abs(half - 1e6 / mhz) <= 2
    assert half == {40: 25_000, 60: 16_668}[mhz]
