"""The ULX3S top's SDRAM: the clock phase's arithmetic (``boards/ulx3s.py``
``sdram_clock_plan``), the part table the board is built for, and the elaborated top on the
ULX3S platform (the PLL's second output, the I/O cells at the SDRAM's pins, the hot tier's
parameters). Nothing is synthesized; the pin-level runs are in ``test_board_sim.py``."""

import re
from collections import Counter

import pytest

from ringkv.boards.ulx3s import ECP5_IO, ULX3STop, pll_params, sdram_clock_plan
from ringkv.defs.sdram import BOARD_CHIPS, CHIPS, board_chip, slowest_of
from ringkv.sim.gatesim import SMOKE_CONFIG, SMOKE_TOP

CHIP = BOARD_CHIPS["32MB"]


def test_the_board_part_is_the_slowest_of_the_32_mb_parts():
    parts = [CHIPS[n] for n in ("MT48LC16M16A2-6A", "MT48LC16M16A2-7E", "IS42S16160G-7")]
    for field in ("t_rcd", "t_rp", "t_ras", "t_rc", "t_rrd", "t_wr", "t_rfc", "power_up_ns",
                  "init_refreshes", "min_tck_cl2", "min_tck_cl3", "t_ac", "t_is", "t_ih"):
        assert getattr(CHIP, field) == max(getattr(p, field) for p in parts), field
    assert CHIP.t_oh == min(p.t_oh for p in parts) == 2.7
    assert (CHIP.rows, CHIP.cols, CHIP.banks, CHIP.words) == (8192, 512, 4, 1 << 24)
    assert BOARD_CHIPS["64MB"] is CHIPS["AS4C32M16SB-7"]
    assert board_chip("64MB").words == 1 << 25 and board_chip("IS42S16160G-7") is parts[2]
    with pytest.raises(ValueError, match=r"^Unknown SDRAM part 'x'; known: 32MB, 64MB, "):
        board_chip("x")
    with pytest.raises(ValueError, match=r"AS4C32M16SB-7 has another geometry than"):
        slowest_of("x", [parts[0], CHIPS["AS4C32M16SB-7"]])


def test_phase_at_40_mhz():
    """40 MHz, CAS latency 2: the window 2.5..8.5 ns (command setup 1.5 + 1 ns of skew; read
    setup 25 - 7 - 1 - 7.5 - 1), its middle rounded to the PLL's 1/8 of a 600 MHz VCO
    period: 26 steps, 5.42 ns, 78 degrees, about 3 ns of margin either side."""
    pll = pll_params(25.0, 40.0)
    plan = sdram_clock_plan(CHIP, 25.0, 2, vco_mhz=pll["f_vco_mhz"])
    assert pll["f_vco_mhz"] == 600 and pll["CLKOP_DIV"] == 15
    assert plan.window == pytest.approx((2.5, 8.5))
    assert plan.steps == 26 and plan.delay_ns == pytest.approx(26 / 4.8)
    assert plan.phase_deg == pytest.approx(78.0)
    m = plan.margins
    assert m["command_setup"] == pytest.approx(26 / 4.8 - 2.5)
    assert m["read_setup"] == pytest.approx(8.5 - 26 / 4.8)
    assert m["command_hold"] == pytest.approx(25 - 26 / 4.8 - 1.8)
    assert m["read_hold"] == pytest.approx(26 / 4.8 + 2 + 1 + 2.7 - 3)
    assert min(m.values()) > 2.9


def test_phase_at_60_mhz_has_no_window_with_these_figures():
    """At 60 MHz (16.67 ns) the read path alone (clock to pad 7 ns, traces 1 ns, tAC 7.5 or
    5.4 ns, input setup 1 ns) leaves less than the command setup needs for a word taken
    ``CL`` edges after the READ (``read_delay`` 0): the window is empty, the plan takes its
    middle (the least loss on both bounds) and says it does not close; a phase given by hand
    is taken, with its margins."""
    for cl, hi in ((2, 1000 / 60 - 16.5), (3, 1000 / 60 - 14.4)):
        plan = sdram_clock_plan(CHIP, 1000 / 60, cl, vco_mhz=600, read_delay=0)
        assert plan.window == pytest.approx((2.5, hi)) and not plan.closes
        assert plan.steps == round((2.5 + hi) / 2 * 4.8)
        m = plan.margins
        assert m["command_setup"] < 0 and m["read_setup"] < 0
        assert abs(m["command_setup"] - m["read_setup"]) < 0.21    # one step apart at most
    plan = sdram_clock_plan(CHIP, 1000 / 60, 3, vco_mhz=600, phase_deg=45, read_delay=0)
    assert plan.steps == 10 and plan.margins["command_setup"] < 0 < plan.margins["read_setup"]
    assert sdram_clock_plan(CHIP, 25.0, 2, vco_mhz=600).closes


def test_phase_at_60_mhz_with_the_word_taken_an_edge_later():
    """``read_delay`` 1: the read setup gains a period and the read hold loses one, so the
    window sits just under a whole period, between the read's hold (T + in_hold - tco_min -
    2 trace - tOH = T - 2.7) and the command's hold (T - tIH - skew = T - 1.8): 0.9 ns at
    any clock with these figures. At 60 MHz: 13.97..14.87 ns, the middle rounded to 69 steps
    (14.38 ns, 310.5 degrees), margins 0.49 and 0.41 ns on the holds. The plan's own choice
    (``read_delay=None``) takes it at 60 and 66.7 MHz and keeps ``read_delay`` 0 at 40 and 50
    MHz, where its margins are larger; a read_delay other than 0 or 1 is refused."""
    t = 1000 / 60
    plan = sdram_clock_plan(CHIP, t, 2, vco_mhz=600, read_delay=1)
    assert plan.read_delay == 1 and plan.closes
    assert plan.window == pytest.approx((t - 2.7, t - 1.8))
    assert plan.steps == 69 and plan.phase_deg == pytest.approx(310.5)
    m = plan.margins
    assert m["command_hold"] == pytest.approx(t - 69 / 4.8 - 1.8)
    assert m["read_hold"] == pytest.approx(69 / 4.8 + 2 + 1 + 2.7 - 3 - t)
    assert m["read_setup"] == pytest.approx(2 * t - 69 / 4.8 - 7 - 1 - 7.5 - 1)
    assert m["command_setup"] == pytest.approx(69 / 4.8 - 2.5)
    assert min(m.values()) == pytest.approx(m["read_hold"]) and 0.4 < m["read_hold"] < 0.5
    for mhz, want in ((40, 0), (50, 0), (60, 1), (66.7, 1)):
        chosen = sdram_clock_plan(CHIP, 1000 / mhz, 2, vco_mhz=600, read_delay=None)
        assert chosen.read_delay == want and chosen.closes, mhz
    with pytest.raises(ValueError, match="read_delay must be 0 or 1, not 2"):
        sdram_clock_plan(CHIP, t, 2, vco_mhz=600, read_delay=2)


def test_ecp5_figures_are_the_documented_assumptions():
    assert (ECP5_IO.tco_min, ECP5_IO.tco_max, ECP5_IO.in_setup, ECP5_IO.in_hold,
            ECP5_IO.skew, ECP5_IO.trace) == (2.0, 7.0, 1.0, 3.0, 1.0, 0.5)


def test_parameter_errors():
    with pytest.raises(ValueError, match=r"^Unknown SDRAM part '16MB'"):
        ULX3STop(SMOKE_CONFIG, clock="sim", sdram="16MB", **SMOKE_TOP)
    with pytest.raises(ValueError, match=r"^CAS latency must be 2 or 3, not 4$"):
        ULX3STop(SMOKE_CONFIG, sdram_cl=4, **SMOKE_TOP)
    at60 = ULX3STop(SMOKE_CONFIG, sys_mhz=60, **SMOKE_TOP).sdram_plan
    assert at60.closes and at60.read_delay == 1
    assert ULX3STop(SMOKE_CONFIG, **SMOKE_TOP).sdram_plan == at60        # the default clock
    at40 = ULX3STop(SMOKE_CONFIG, sys_mhz=40, **SMOKE_TOP).sdram_plan
    assert at40.closes and at40.read_delay == 0
    forced = ULX3STop(SMOKE_CONFIG, sys_mhz=60, sdram_read_delay=0, **SMOKE_TOP).sdram_plan
    assert not forced.closes and forced.read_delay == 0
    top = ULX3STop(SMOKE_CONFIG, sys_mhz=60, sdram_phase=90, **SMOKE_TOP)
    assert top.sdram_plan.phase_deg == pytest.approx(90)
    assert ULX3STop(SMOKE_CONFIG, sdram=None, **SMOKE_TOP).sdram_chip is None


def _rtlil(top):
    from amaranth_boards.ulx3s import ULX3S_85F_Platform
    plan = ULX3S_85F_Platform().prepare(top, name="top")
    return plan.files["top.il"]


#: system clock (None: the default) -> (CLKOP_DIV, CLKOP_CPHASE, CLKOS_CPHASE, CLKOS_FPHASE,
#: the controller's read_delay): 69 phase steps at 60 MHz (310.5 degrees), 26 at 40 (78)
PLL_PHASES = {None: (10, 4, 4 + 8, 5, 1), 40: (15, 6, 6 + 3, 2, 0)}


@pytest.mark.parametrize("mhz", [None, pytest.param(40, marks=pytest.mark.slow)])
def test_the_board_top_with_its_sdram(mhz):
    """The bitstream's top (the PLL) at the default clock, 60 MHz, and at the 40 MHz fallback:
    EHXPLLL's CLKOS enabled at CLKOP's divider and the plan's phase steps behind it (60 MHz:
    69 steps, CPHASE 4 + 8, FPHASE 5; 40 MHz: 26 steps, CPHASE 6 + 3, FPHASE 2); the SDRAM
    pins in the I/O cells' registers and the clock from an ODDRX1F; the hot tier with its
    compact slots (the small configuration: 4 regions, so 4 slots); LED 6; the top executes
    SDRAM_TEST."""
    top = ULX3STop(SMOKE_CONFIG, **({} if mhz is None else {"sys_mhz": mhz}), **SMOKE_TOP)
    div, op_cphase, os_cphase, os_fphase, read_delay = PLL_PHASES[mhz]
    assert top.sys_hz == (mhz or 60) * 1e6 and top.sdram_plan.read_delay == read_delay
    assert top.top.has_sdram_test
    assert top.tier_params is top.top.tier
    assert (top.tier_params["slots"], top.tier_params["slot_token_sectors"]) == (4, 1)
    assert top.top.tier_storage.slots == 4
    il = _rtlil(top)
    pll = il[il.index("cell \\EHXPLLL"):]
    pll = pll[:pll.index("\n  end")]
    params = dict(re.findall(r"parameter \\(\w+) (\S+)", pll))
    assert params["CLKOS_ENABLE"] == '"ENABLED"' and params["CLKOS_DIV"] == params["CLKOP_DIV"]
    assert int(params["CLKOP_DIV"]) == div and int(params["CLKOP_CPHASE"]) == op_cphase
    assert int(params["CLKOS_CPHASE"]) == os_cphase and int(params["CLKOS_FPHASE"]) == os_fphase
    cells = Counter(re.findall(r"cell \\(\w+) ", il))
    assert cells["IFS1P3DX"] == 16 and cells["ODDRX1F"] == 1
    assert cells["OFS1P3DX"] >= 22 + 2 * 16
    assert "led_6__io" in il and "sdram_0__dq__io" in il
    if mhz is not None:
        return
    # without the SDRAM: the top of before (no SDRAM pins, six LEDs, no SDRAM_TEST)
    bare = ULX3STop(SMOKE_CONFIG, sdram=None, **SMOKE_TOP)
    assert not bare.top.has_sdram_test
    il = _rtlil(bare)
    assert "ODDRX1F" not in il and "CLKOS_ENABLE" not in il and "led_6__io" not in il


def test_the_64_mb_part():
    top = ULX3STop(SMOKE_CONFIG, sdram="64MB", clock="sim", regions=64, lanes=2, macs=4)
    assert top.sdram_chip.words == 1 << 25
    assert top.tier_params["slots"] == 64      # capped by the regions


def test_the_board_top_at_half_rate():
    """``sdram_rate=2`` at 60 MHz: the PLL's CLKOS at half CLKOP's divider in phase with it
    (the ``sync2x`` domain, 120 MHz), CLKOS2 at the same divider the plan's steps behind it
    (the SDRAM's clock); every SDRAM pin register on ``sync2x``; CAS latency 3 by default, the
    SDRAM's period 8.33 ns. With the assumed ECP5 figures no phase closes at 120 MHz (the plan
    takes the least bad: 171 degrees, near the 180 the field's ULX3S targets use at 1:2) --
    a phase a real board's sweep must settle (docs/BOARD.md)."""
    top = ULX3STop(SMOKE_CONFIG, sys_mhz=60, sdram_rate=2, **SMOKE_TOP)
    assert top.sdram_cl == 3 and abs(top.sdram_tck_ns - 1000 / 120) < 1e-9
    plan = top.sdram_plan
    assert not plan.closes and (plan.read_delay, plan.steps, round(plan.phase_deg)) == (1, 19, 171)
    il = _rtlil(top)
    pll = il[il.index("cell \\EHXPLLL"):]
    pll = pll[:pll.index("\n  end")]
    params = {k: v.strip('"') for k, v in re.findall(r"parameter \\(\w+) (\S+)", pll)}
    assert (params["CLKOP_DIV"], params["CLKOS_DIV"], params["CLKOS2_DIV"]) == ("10", "5", "5")
    assert params["CLKOS_CPHASE"] == params["CLKOP_CPHASE"] == "4"
    assert (params["CLKOS2_CPHASE"], params["CLKOS2_FPHASE"]) == ("6", "3")    # 19 steps
    assert "CLKOS3_ENABLE" not in params
    clocks = Counter(re.search(r"connect \\SCLK (\S+)", body).group(1) for body in
                     re.findall(r"cell \\(?:OFS1P3DX|IFS1P3DX) \S+\n(.*?)\n  end", il, re.S))
    fast = [net for net in clocks if "sync2x" in net]
    assert len(fast) == 1 and clocks[fast[0]] >= 16 + 22 + 2 * 16
    with pytest.raises(ValueError, match="Rate must be 1 or 2"):
        ULX3STop(SMOKE_CONFIG, sdram_rate=4, **SMOKE_TOP)
    # the simulation seam takes the fast clock from its own pin
    assert "sim_clk2x_0__io" in _rtlil(ULX3STop(SMOKE_CONFIG, sys_mhz=60, sdram_rate=2,
                                               clock="sim", **SMOKE_TOP))
