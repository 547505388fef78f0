"""RingKV on the ULX3S (LFE5U-85F): PLL, USB UART, SD card (native 4-bit or SPI), the whole top.

``ULX3STop`` wraps :class:`ringkv.hw.top.RingKVTop` for the board, by default in
:data:`~ringkv.defs.config.TRAINED_CONFIG` (the default shape with ``ringkv-fx1c``: int8 K/V
with the shipped trained model's calibrated per-layer scales, the numerics that meets the
accuracy targets and fits the block RAM; ``docs/BENCHMARKS.md``):

* the 25 MHz oscillator drives an ECP5 ``EHXPLLL`` to the system clock (``sys_mhz``, default
  60 MHz, :data:`SYS_MHZ`; 40 MHz is the tested fallback, ``docs/BOARD.md``; parameters from
  :func:`pll_params`, the same search as Trellis' ``ecppll``); the system reset is held until
  the PLL locks;
* the FT231X USB UART (pins M1/L4) carries the framed protocol through
  :class:`ringkv.hw.link.uart.UART` at ``baud`` (default 3 Mbaud, a fractional divisor, so the
  average bit time is exact);
* the micro-SD slot on the top's storage port, by default (``storage="sd4"``) in native mode
  with the 4-bit bus through :class:`ringkv.hw.storage.sdnative.SDNativeController` at SD CLK =
  f_sys / 4 at 60 MHz (15 MHz; f_sys / 2, 20 MHz, at 40 MHz: the fastest even division
  <= ``sd4_mhz``, 25 MHz, default speed), 400 kHz or less during initialisation. The pins are
  our own resource :data:`SD_NATIVE` (``sd_card_native``: CLK out, CMD and DAT0-3
  bidirectional with the FPGA's pull-ups), because amaranth-boards 0.0.21's
  ``SDCardResources`` declares the 4-bit resource's CMD pin as output only, while the card
  answers on CMD. ``storage="spi"`` keeps SPI mode (``sd_card_spi``: CS on DAT3, CLK, COPI on
  CMD, CIPO on DAT0) through :class:`ringkv.hw.storage.sdspi.SDSPIController` at ``sd_mhz``;
* the SDRAM (``sdram="32MB"``, the default; ``"64MB"`` for the boards with the 64 MB part;
  ``None`` for none): amaranth-boards' ``sdram`` resource through
  :class:`ringkv.hw.sdram.controller.SdramController` at the system clock (its PHY in the I/O
  cells' registers, the SDRAM clock from the ``EHXPLLL``'s second output ``CLKOS``, behind the
  system clock by the phase of :func:`sdram_clock_plan`: ``docs/BOARD.md``), with two ports:
  the SDRAM sector store (:class:`ringkv.hw.storage.sdram_store.SdramSectorStore`) on the
  top's ``sdram`` port (``RingKVTop(tier=...)``: the
  :class:`ringkv.hw.storage.tiered.TieredStorage` inside the top, between its DMA and the SD
  controller; the hot tier: compact slots, as many as fit), and the self-test
  (:class:`ringkv.hw.sdram.bist.SdramBist`) behind the top's ``SDRAM_TEST`` (the top holds the
  tier in reset while it runs: its copies are gone, the card keeps the records);
* LEDs: 0 = PLL locked (clock alive), 1 = SD card initialised, 2 = SDHC/SDXC, 3 = heartbeat,
  4 = link activity (a byte received or sent in the last ~50 ms), 5 = link error (a UART
  framing error or overrun, or a frame-layer error: bad CRC, timeout, bad length, unknown
  opcode, in the last ~0.4 s), 6 = the SDRAM's power-up sequence done.

**The simulation seam** (``clock="sim"``, used only by :mod:`ringkv.sim.board_harness`): the
``EHXPLLL`` is left out and the ``clk25`` pin drives the system clock directly; the
testbench drives that pin at the PLL's *output* frequency (``sys_hz``), and ``locked`` rises
after :data:`SIM_LOCK_CYCLES` clocks as a PLL's lock output would. Everything else (the
reset hold after lock, the UART and its fractional divisor, the SD controller, the LEDs, the
pin buffers of the platform) is the same elaborated design as the bitstream's. The SDRAM's
clock domain is the system clock itself there (no phase: the pin-level SDRAM model takes the
commands launched at one edge and returns read data for the edge ``CL`` later, the timing the
phase is chosen to give; ``sim/sdram_model.py``).

Built by ``ringkv build --board ulx3s-85f`` (:mod:`ringkv.boards.build`). This path is
synthesized, placed, routed and timed here, but untested on hardware.
"""

import math
from dataclasses import dataclass
from fractions import Fraction

from amaranth import *
from amaranth.build import Attrs, Pins, Resource, Subsignal
from amaranth.lib import io, wiring

from ringkv.defs.config import TRAINED_CONFIG, RingKVConfig
from ringkv.defs.hot_tier import BOARD_SDRAM_PART
from ringkv.defs.protocol import StorageKind
from ringkv.defs.record import RecordLayout
from ringkv.defs.sdram import SdramChip, board_chip, check_rate
from ringkv.hw.link.skid import StreamRegister
from ringkv.hw.link.uart import UART
from ringkv.hw.sdram.bist import SdramBist
from ringkv.hw.sdram.controller import SdramController
from ringkv.hw.sdram.widener import PortWidener
from ringkv.hw.storage.kv_words import kv_words_supported
from ringkv.hw.storage.sdnative import SDNativeController
from ringkv.hw.storage.sdram_store import SdramSectorStore
from ringkv.hw.storage.sdspi import SDSPIController
from ringkv.hw.top import RingKVTop

__all__ = ["ULX3STop", "SYS_MHZ", "pll_params", "SD_NATIVE", "SIM_CLK2X", "STORAGE_MODES",
           "SIM_LOCK_CYCLES", "CLOCKS", "ACTIVITY_CYCLES", "ERROR_CYCLES", "IoTiming", "ECP5_IO",
           "T_AC_CL2", "SdramClockPlan", "sdram_clock_plan", "SDRAM_BL"]

#: the micro-SD slot in native mode with CMD bidirectional (amaranth-boards' ``sd_card_4bit``
#: has CMD output only); the same pins as amaranth-boards' ULX3S ``SDCardResources``. The
#: FPGA's pull-ups hold CMD and DAT high when neither side drives them (the ECP5 default pull
#: is down, which would read as a start bit).
SD_NATIVE = Resource(
    "sd_card_native", 0,
    Subsignal("clk", Pins("J1", dir="o")),
    Subsignal("cmd", Pins("J3", dir="io")),
    Subsignal("dat", Pins("K2 K1 H2 H1", dir="io")),
    Attrs(IO_TYPE="LVCMOS33", SLEW="FAST", PULLMODE="UP"))

#: The simulation seam's second clock (``clock="sim"`` with ``sdram_rate=2`` only; never in a
#: bitstream): a pin of the GPIO header that the testbench drives at twice ``sys_hz``, every
#: other edge at the instant of one of ``clk25``'s, as the ``EHXPLLL``'s ``CLKOS`` would be.
SIM_CLK2X = Resource("sim_clk2x", 0, Pins("B11", dir="i"), Attrs(IO_TYPE="LVCMOS33"))

#: ``storage=`` values: the SD card's mode
STORAGE_MODES = ("sd4", "spi")
#: ``clock="sim"``: clocks from the first edge until the stand-in for the PLL's LOCK rises.
SIM_LOCK_CYCLES = 16
#: System clock cycles the reset is held after the PLL (or its stand-in) locks.
POR_HOLD_CYCLES = 2**8
#: The default system clock (MHz) of :class:`ULX3STop`, ``ringkv build --sys-mhz`` and ``make
#: gatesim``: the PLL's output. 60 MHz: the build of bab76a5 met timing there with 11.7 %
#: slack (``docs/BOARD.md`` says what else was checked at it); 40 MHz is the fallback
#: (``ringkv build --sys-mhz 40``) until ``ringkv board check`` has passed on a real board at
#: 60 MHz.
SYS_MHZ = 60.0
#: The clock sources of :class:`ULX3STop`: the board's PLL, or the simulation seam.
CLOCKS = ("pll", "sim")
#: the part named in the hot tier's parameters for each of ``BOARD_CHIPS`` (only its size counts:
#: the 32 MB entry is the slowest of three parts of one geometry)
_TIER_PART = {"32MB": BOARD_SDRAM_PART, "64MB": "AS4C32M16SB-7"}


def pll_params(f_in_mhz: float, f_out_mhz: float, *, even: bool = False) -> dict:
    """``EHXPLLL`` dividers for ``f_out`` from ``f_in`` with CLKOP feedback.

    ``f_out = f_in * CLKFB_DIV / CLKI_DIV``, ``f_vco = f_out * CLKOP_DIV`` in 400..800 MHz,
    ``f_pfd = f_in / CLKI_DIV`` in 3.125..400 MHz; the closest output wins, then the VCO
    nearest 600 MHz. ``even``: only even ``CLKOP_DIV`` (a second output at twice the
    frequency, ``CLKOP_DIV / 2``, for a half-rate SDRAM). Raises ``ValueError`` when nothing
    is within 0.5%.
    """
    best = None
    for clki in range(1, 129):
        pfd = f_in_mhz / clki
        if not 3.125 <= pfd <= 400:
            continue
        for clkfb in range(1, 81):
            out = pfd * clkfb
            for clkop in range(2 if even else 1, 129, 2 if even else 1):
                vco = out * clkop
                if not 400 <= vco <= 800:
                    continue
                key = (abs(out - f_out_mhz), abs(vco - 600))
                if best is None or key < best[0]:
                    best = (key, {"CLKI_DIV": clki, "CLKFB_DIV": clkfb, "CLKOP_DIV": clkop,
                                  "f_out_mhz": out, "f_vco_mhz": vco})
    if best is None or best[0][0] > f_out_mhz * 0.005:
        raise ValueError(f"no EHXPLLL setting gives {f_out_mhz} MHz from {f_in_mhz} MHz")
    return best[1]


@dataclass(frozen=True)
class IoTiming:
    """The FPGA's side of the SDRAM interface timing, in ns (:func:`sdram_clock_plan`).

    ``tco_min``/``tco_max``: an I/O cell's output register to its pad (the command, address
    and data pads and, through the ``ODDRX1F``, the SDRAM clock's pad: the same kind of cell,
    so the clock and the command pads move together); ``in_setup``/``in_hold``: the input
    register at the pad; ``skew``: what may separate the clock's pad and trace from a command
    or data pad's (pad to pad within the chip, trace length mismatch); ``trace``: one way along
    the board. Read paths add ``tco`` of the clock and two traces to the SDRAM's access time."""
    tco_min: float
    tco_max: float
    in_setup: float
    in_hold: float
    skew: float
    trace: float


#: The ECP5 figures used (LFE5U-85F, speed grade 6, LVCMOS33, 4 mA): **assumed, not
#: transcribed** -- Lattice's ECP5 data sheet (FPGA-DS-02012, "External Switching
#: Characteristics") could not be read on this machine; these are wide, conservative
#: bounds (a slow clock-to-pad of 7 ns, an input register needing 1 ns before and 3 ns after
#: its edge). Check them before trusting a margin below 1 ns (``docs/BOARD.md``).
ECP5_IO = IoTiming(tco_min=2.0, tco_max=7.0, in_setup=1.0, in_hold=3.0, skew=1.0, trace=0.5)
#: The SDRAM's access time at CAS latency 2 (ns): the chip table's ``t_ac`` is the CL 3 figure;
#: at CL 2 the parts' data sheets give up to 7.5 ns (Micron -6A as recalled, not transcribed),
#: taken for all of them.
T_AC_CL2 = 7.5
#: The SDRAM's burst length on the board (the sector store's and the self-test's bursts).
SDRAM_BL = 8


@dataclass(frozen=True)
class SdramClockPlan:
    """The SDRAM clock's phase behind the system clock: ``window`` (ns, the delays at which
    every margin is >= 0), the chosen ``delay_ns`` (a whole number of the PLL's phase steps,
    1/8 of a VCO period) and ``phase_deg``, the ``margins`` (ns) at it, and the ``EHXPLLL``
    settings relative to ``CLKOP`` (``steps``: phase steps; CPHASE += steps // 8, FPHASE =
    steps % 8); ``read_delay``: the controller's (the input register takes a read word that
    many edges after ``CL``). ``closes``: every margin >= 0 (with :data:`ECP5_IO`'s assumed
    figures)."""
    tck_ns: float
    cl: int
    window: tuple
    delay_ns: float
    phase_deg: float
    steps: int
    margins: dict
    read_delay: int = 0

    @property
    def closes(self) -> bool:
        return min(self.margins.values()) >= 0


def sdram_clock_plan(chip: SdramChip, tck_ns: float, cl: int, *, vco_mhz: float,
                     phase_deg: float | None = None, io_timing: IoTiming = ECP5_IO,
                     read_delay: int | None = 0) -> SdramClockPlan:
    """The phase of the SDRAM clock behind the system clock (the controller, its PHY's I/O
    registers and the SDRAM at one frequency; a command leaves its register at the system
    clock's edge and the SDRAM takes it at its own next edge, ``delay`` later; read data of
    CAS latency ``CL`` is taken by the input register at the system clock's edge ``CL`` after
    the READ left):

    * command and write data setup at the SDRAM: ``delay - tIS - skew >= 0``;
    * their hold: ``T - delay - tIH - skew >= 0``;
    * read setup at the FPGA: the SDRAM's edge comes ``delay + tco`` after the FPGA's, its data
      ``tAC`` later and two traces away: ``T - delay - tco_max - 2 trace - tAC - in_setup >= 0``;
    * read hold: ``delay + tco_min + 2 trace + tOH - in_hold >= 0``.

    With ``read_delay`` 1 the input register takes the word an edge later (the controller's
    ``read_delay``): the read setup gains a period, ``T``, and the read hold loses one, so the
    window moves to a delay of nearly a whole period (the SDRAM's edge just before the
    FPGA's next one), bounded by the command's hold above and the read's hold below. At 60 MHz
    with :data:`ECP5_IO`'s figures only that window is open (0.7 ns wide). ``read_delay``
    None: the one of 0 and 1 whose plan has the larger worst margin (0 on a tie).

    ``phase_deg`` None: the middle of the window, rounded to the PLL's steps (when the window
    is empty, ``hi < lo``, the same middle is the delay that loses least on the two conditions
    that bound it: :attr:`SdramClockPlan.closes` is then False and the margins say by how
    much); else that phase, rounded likewise, whatever its margins."""
    if read_delay is None:
        plans = [sdram_clock_plan(chip, tck_ns, cl, vco_mhz=vco_mhz, phase_deg=phase_deg,
                                  io_timing=io_timing, read_delay=r) for r in (0, 1)]
        return max(plans, key=lambda p: (min(p.margins.values()), -p.read_delay))
    if read_delay not in (0, 1):
        raise ValueError(f"read_delay must be 0 or 1, not {read_delay!r}")
    io_ = io_timing
    r = read_delay * tck_ns
    t_ac = chip.t_ac if cl == 3 else max(chip.t_ac, T_AC_CL2)
    lo = max(chip.t_is + io_.skew, io_.in_hold - io_.tco_min - 2 * io_.trace - chip.t_oh + r)
    hi = min(tck_ns - chip.t_ih - io_.skew,
             tck_ns + r - io_.tco_max - 2 * io_.trace - t_ac - io_.in_setup)
    step = 1000 / (8 * vco_mhz)
    wanted = (lo + hi) / 2 if phase_deg is None else (phase_deg % 360) / 360 * tck_ns
    steps = round(wanted / step)
    delay = steps * step
    margins = {
        "command_setup": delay - chip.t_is - io_.skew,
        "command_hold": tck_ns - delay - chip.t_ih - io_.skew,
        "read_setup": tck_ns + r - delay - io_.tco_max - 2 * io_.trace - t_ac - io_.in_setup,
        "read_hold": delay + io_.tco_min + 2 * io_.trace + chip.t_oh - io_.in_hold - r,
    }
    return SdramClockPlan(tck_ns=tck_ns, cl=cl, window=(lo, hi), delay_ns=delay,
                          phase_deg=delay / tck_ns * 360, steps=steps, margins=margins,
                          read_delay=read_delay)


#: LED 4 stays lit this many clocks after a byte on the link (~35 ms at 60 MHz, ~52 at 40).
ACTIVITY_CYCLES = 1 << 21
#: LED 5 stays lit this many clocks after a link error (~0.28 s at 60 MHz, ~0.42 at 40).
ERROR_CYCLES = 1 << 24


def _stretch(m, event, cycles: int):
    """A signal high while fewer than ``cycles`` clocks have passed since ``event``."""
    left = Signal(range(cycles + 1))
    with m.If(event):
        m.d.sync += left.eq(cycles)
    with m.Elif(left != 0):
        m.d.sync += left.eq(left - 1)
    return left != 0


class ULX3STop(Elaboratable):
    """The board top level; see the module docstring. ``sys_mhz``: the system clock (the
    PLL's output, :func:`pll_params`'s nearest; default :data:`SYS_MHZ`). ``sealed``: the
    sealed device (:class:`~ringkv.hw.top.RingKVTop`'s ``sealed``: key slots, tenant slots,
    the record MAC).
    ``sdram``: the SDRAM part (:data:`ringkv.defs.sdram.BOARD_CHIPS` or a part's name; None:
    no SDRAM), ``sdram_cl`` its CAS latency, ``sdram_phase`` the SDRAM clock's phase in degrees
    (None: :func:`sdram_clock_plan`'s), ``sdram_read_delay`` the controller's ``read_delay``
    (None: the plan's choice, the larger worst margin: 0 at 40 MHz, 1 at 60 MHz);
    ``sdram_rate`` 2: the controller at half rate (``docs/blocks/sdram.md``, "Half rate"): the
    PHY's I/O registers and the SDRAM at twice the system clock (the ``EHXPLLL``'s ``CLKOS``
    at half CLKOP's divider, in phase, the ``sync2x`` domain; the SDRAM's clock ``CLKOS2``
    at the same frequency, the plan's phase behind it), ``sdram_cl`` then 3 by default; the
    self-test through a :class:`~ringkv.hw.sdram.widener.PortWidener`."""

    def __init__(self, config: RingKVConfig = TRAINED_CONFIG, *, sys_mhz: float = SYS_MHZ,
                 baud: int = 3_000_000, regions: int = 4096, lanes: int = 4, macs: int = 8,
                 sd_mhz: float = 10.0, storage: str = "sd4", sd4_mhz: float = 25.0,
                 clock: str = "pll", sealed: bool = False, sdram: str | None = "32MB",
                 sdram_cl: int | None = None, sdram_phase: float | None = None,
                 sdram_read_delay: int | None = None, sdram_rate: int = 1):
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, not {clock!r}")
        check_rate(sdram_rate)
        self.clock = clock
        self.config = config
        self.sdram_rate = sdram_rate
        self.pll = pll_params(25.0, sys_mhz, even=sdram_rate == 2)
        self.sys_hz = self.pll["f_out_mhz"] * 1e6
        self.baud = baud
        self.divisor = Fraction(round(self.sys_hz), baud)
        if storage not in STORAGE_MODES:
            raise ValueError(f"storage must be one of {STORAGE_MODES}, not {storage!r}")
        self.storage = storage
        # SD clock = sys / (2 * half_period); 400 kHz or less during initialisation. Native
        # mode: never above sd4_mhz (default speed: 25 MHz).
        if storage == "sd4":
            self.sd_half = max(1, math.ceil(self.sys_hz / (2 * sd4_mhz * 1e6) - 1e-9))
        else:
            self.sd_half = max(1, round(self.sys_hz / (2 * sd_mhz * 1e6)))
        # (the smallest half period at or below 400 kHz: 50 at 40 MHz, 75 at 60 MHz)
        self.sd_init_half = max(self.sd_half, math.ceil(self.sys_hz / (2 * 400e3) - 1e-9))
        kind = StorageKind.SD_NATIVE if storage == "sd4" else StorageKind.SD_SPI
        # the SDRAM's hot tier inside the top (RingKVTop's tier: STORAGE_INFO reports it, the
        # directory's deletes drop their copies, SDRAM_TEST holds it in reset)
        if sdram is not None:
            board_chip(sdram)                   # a part of BOARD_CHIPS or CHIPS, else an error
        tier = None if sdram is None else {"part": _TIER_PART.get(sdram, sdram)}
        # at half rate the store hands over 32-bit port words: the four-byte import, where
        # the shape allows it (a K row and a bank word of whole four-byte groups)
        eb = RecordLayout(config).elem_bytes
        self.storage_width = 4 if (sdram is not None and sdram_rate == 2
                                   and kv_words_supported(config)
                                   and (macs * eb) % 4 == 0) else 1
        self.top = RingKVTop(config, regions=regions, lanes=lanes, macs=macs,
                             storage_kind=kind,
                             sd_clock_hz=round(self.sys_hz / (2 * self.sd_half)),
                             sealed=sealed, tier=tier, sdram_test=sdram is not None,
                             storage_width=self.storage_width)
        self._sdram_setup(sdram, (2 if sdram_rate == 1 else 3) if sdram_cl is None else sdram_cl,
                          sdram_phase, sdram_read_delay)

    def _sdram_setup(self, sdram, cl, phase, read_delay):
        """The SDRAM's part, clock plan and hot tier (``sdram_chip`` None: no SDRAM)."""
        self.sdram_chip = self.sdram_plan = self.tier_params = None
        if sdram is None:
            return
        self.sdram_chip = chip = board_chip(sdram)
        self.sdram_cl = cl
        #: the SDRAM's clock period (the system clock's, or half of it at half rate)
        self.sdram_tck_ns = 1000 / self.pll["f_out_mhz"] / self.sdram_rate
        # the controller's own checks (CAS latency at this clock, ...) before any elaboration;
        # this instance is never elaborated (the real one takes the platform's pins)
        self.sdram_plan = sdram_clock_plan(chip, self.sdram_tck_ns, cl,
                                           vco_mhz=self.pll["f_vco_mhz"], phase_deg=phase,
                                           read_delay=read_delay)
        probe = SdramController(chip, tck_ns=self.sdram_tck_ns * self.sdram_rate, cl=cl,
                                bl=SDRAM_BL, ports=2, read_delay=self.sdram_plan.read_delay,
                                rate=self.sdram_rate)
        probe._MustUse__silence = True
        #: the hot tier's parameters (:attr:`RingKVTop.tier <ringkv.hw.top.RingKVTop.tier>`)
        self.tier_params = self.top.tier

    def _clock_source(self, m, platform, clk):
        """Drive ``clk`` at ``sys_hz``; return the lock signal. The one place where the
        simulation (``clock="sim"``) differs from the bitstream: see the module docstring."""
        m.submodules.clk25_buffer = clk25 = io.Buffer("i", platform.request("clk25", 0,
                                                                            dir="-"))
        locked = Signal()
        if self.clock == "sim":
            # The testbench drives clk25 at sys_hz; LOCK after SIM_LOCK_CYCLES of it.
            m.domains.pll_sim = ClockDomain("pll_sim", reset_less=True)
            lock_count = Signal(range(SIM_LOCK_CYCLES + 1))
            m.d.comb += [clk.eq(clk25.i), ClockSignal("pll_sim").eq(clk25.i),
                         locked.eq(lock_count == SIM_LOCK_CYCLES)]
            if self.sdram_chip is not None and self.sdram_rate == 2:
                # the fast clock from a second pin the testbench drives at twice sys_hz, its
                # every other edge at the instant of one of clk25's (SIM_CLK2X)
                if "sim_clk2x" not in {r.name for r in platform.resources.values()}:
                    platform.add_resources([SIM_CLK2X])
                m.submodules.clk2x_buffer = clk2x = io.Buffer(
                    "i", platform.request("sim_clk2x", 0, dir="-"))
                m.d.comb += [ClockSignal("sync2x").eq(clk2x.i),
                             ClockSignal("sdram").eq(clk2x.i)]
            elif self.sdram_chip is not None:
                m.d.comb += ClockSignal("sdram").eq(clk25.i)   # no phase: see the docstring
            with m.If(~locked):
                m.d.pll_sim += lock_count.eq(lock_count + 1)
            return locked
        p = self.pll
        # the SDRAM clock: CLKOS, CLKOP's divider, sdram_plan.steps phase steps behind it (an
        # output's edges come CPHASE VCO periods, plus FPHASE eighths, after the common
        # reference, so equal CPHASE puts the edges of two dividers at the same instants)
        sdram = {}
        if self.sdram_chip is not None and self.sdram_rate == 1:
            sdram = dict(
                a_FREQUENCY_PIN_CLKOS=f"{p['f_out_mhz']:g}", p_CLKOS_ENABLE="ENABLED",
                p_CLKOS_DIV=p["CLKOP_DIV"],
                p_CLKOS_CPHASE=p["CLKOP_DIV"] // 2 - 1 + self.sdram_plan.steps // 8,
                p_CLKOS_FPHASE=self.sdram_plan.steps % 8, o_CLKOS=ClockSignal("sdram"))
        elif self.sdram_chip is not None:
            # half rate: CLKOS the fast domain in phase with CLKOP (every other edge), CLKOS2
            # the SDRAM's clock at the same frequency, the plan's steps behind CLKOS
            fast = f"{2 * p['f_out_mhz']:g}"
            sdram = dict(
                a_FREQUENCY_PIN_CLKOS=fast, p_CLKOS_ENABLE="ENABLED",
                p_CLKOS_DIV=p["CLKOP_DIV"] // 2, p_CLKOS_CPHASE=p["CLKOP_DIV"] // 2 - 1,
                p_CLKOS_FPHASE=0, o_CLKOS=ClockSignal("sync2x"),
                a_FREQUENCY_PIN_CLKOS2=fast, p_CLKOS2_ENABLE="ENABLED",
                p_CLKOS2_DIV=p["CLKOP_DIV"] // 2,
                p_CLKOS2_CPHASE=p["CLKOP_DIV"] // 2 - 1 + self.sdram_plan.steps // 8,
                p_CLKOS2_FPHASE=self.sdram_plan.steps % 8, o_CLKOS2=ClockSignal("sdram"))
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI="25",
            a_FREQUENCY_PIN_CLKOP=f"{p['f_out_mhz']:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=p["CLKI_DIV"], p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=p["CLKOP_DIV"],
            p_CLKOP_CPHASE=p["CLKOP_DIV"] // 2 - 1, p_CLKOP_FPHASE=0,
            p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=p["CLKFB_DIV"],
            i_RST=0, i_STDBY=0, i_CLKI=clk25.i, o_CLKOP=clk, i_CLKFB=clk,
            i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1,
            i_PLLWAKESYNC=0, i_ENCLKOP=0, o_LOCK=locked, **sdram)
        return locked

    def elaborate(self, platform):
        m = Module()
        cd_sync = ClockDomain("sync")
        m.domains += cd_sync
        if self.sdram_chip is not None:
            # the SDRAM clock (only the PHY's ODDRX1F runs on it: the pin's clock)
            m.domains.sdram = ClockDomain("sdram", reset_less=True)
            if self.sdram_rate == 2:
                # the half-rate PHY's registers (reset-less: they need none)
                m.domains.sync2x = ClockDomain("sync2x", reset_less=True)
        pll_clk = cd_sync.clk   # the PLL drives the domain's clock net directly
        locked = self._clock_source(m, platform, pll_clk)
        # Reset held for POR_HOLD_CYCLES after lock.
        hold = Signal(range(POR_HOLD_CYCLES))
        m.domains.por = ClockDomain("por", reset_less=True)
        m.d.comb += [ClockSignal("por").eq(pll_clk), ResetSignal("sync").eq(~hold.all())]
        with m.If(~locked):
            m.d.por += hold.eq(0)
        with m.Elif(~hold.all()):
            m.d.por += hold.eq(hold + 1)
        # No constraint of our own on the PLL output: nextpnr-ecp5 derives it from the
        # 25 MHz constraint of clk25 and the EHXPLLL dividers (a net name given here is not
        # stable through yosys' flattening).

        m.submodules.top = top = self.top
        m.submodules.uart = uart = UART(self.divisor)
        # Pins through amaranth.lib.io buffers (platform.request with dir="-"); the UART's
        # RTS and DTR lines, unused, get no buffer and stay unconstrained inputs.
        uart_pins = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = uart_rx = io.Buffer("i", uart_pins.rx)
        m.submodules.uart_tx = uart_tx = io.Buffer("o", uart_pins.tx)
        m.d.comb += [uart.rx.eq(uart_rx.i), uart_tx.o.eq(uart.tx)]
        wiring.connect(m, uart.o, top.rx)
        wiring.connect(m, top.tx, uart.i)

        if self.storage == "sd4":
            # timeouts in SD clocks: read access <= 100 ms, write busy <= 250 ms (SDHC) at
            # 20 MHz, with margin
            m.submodules.sd = sd = SDNativeController(
                init_half_period=self.sd_init_half, half_period=self.sd_half,
                data_timeout=1 << 22, busy_timeout=1 << 23)
            if "sd_card_native" not in {r.name for r in platform.resources.values()}:
                platform.add_resources([SD_NATIVE])
            ports = platform.request("sd_card_native", 0, dir="-")
            m.submodules.sd_clk = sd_clk = io.Buffer("o", ports.clk)
            m.submodules.sd_cmd = sd_cmd = io.Buffer("io", ports.cmd)
            m.submodules.sd_dat = sd_dat = io.Buffer("io", ports.dat)
            m.d.comb += [sd_clk.o.eq(sd.sd.clk),
                         sd_cmd.o.eq(sd.sd.cmd.o), sd_cmd.oe.eq(sd.sd.cmd.oe),
                         sd.sd.cmd.i.eq(sd_cmd.i),
                         sd_dat.o.eq(sd.sd.dat.o), sd_dat.oe.eq(sd.sd.dat.oe),
                         sd.sd.dat.i.eq(sd_dat.i),
                         top.storage_info.high_speed.eq(sd.high_speed),
                         top.storage_info.sectors.eq(sd.sectors)]
        else:
            m.submodules.sd = sd = SDSPIController(init_half_period=self.sd_init_half,
                                                   half_period=self.sd_half)
            ports = platform.request("sd_card_spi", 0, dir="-")
            m.submodules.sd_clk = sd_clk = io.Buffer("o", ports.clk)
            m.submodules.sd_copi = sd_copi = io.Buffer("o", ports.copi)
            m.submodules.sd_cipo = sd_cipo = io.Buffer("i", ports.cipo)
            m.submodules.sd_cs = sd_cs = io.Buffer("io", ports.cs)
            m.d.comb += [sd_clk.o.eq(sd.spi.sclk), sd_copi.o.eq(sd.spi.mosi),
                         sd_cs.o.eq(~sd.spi.cs_n), sd_cs.oe.eq(1),
                         sd.spi.miso.eq(sd_cipo.i)]
        if self.sdram_chip is not None:
            self._sdram(m, platform)
        # The storage port through a register slice per stream (one clock each way): the DMA's
        # state decode (its command's valid, its read data's ready) no longer runs on into the
        # SD controller's FSMs, nor the controller's into the DMA's (the leading paths of the
        # 60 MHz netlist after the dispatcher's and the directory's cuts, docs/BOARD.md). The
        # DMA takes every read byte it has asked for in the clock it is offered, so the
        # status still reaches it after the last byte.
        for name in ("cmd", "wdata"):
            port = getattr(top.storage, name)
            m.submodules[f"storage_{name}"] = reg = StreamRegister(
                port.signature.members["payload"].shape)
            wiring.connect(m, port, reg.i)
            wiring.connect(m, reg.o, getattr(sd.storage, name))
        for name in ("rdata", "status"):
            port = getattr(sd.storage, name)
            m.submodules[f"storage_{name}"] = reg = StreamRegister(
                port.signature.members["payload"].shape)
            wiring.connect(m, port, reg.i)
            wiring.connect(m, reg.o, getattr(top.storage, name))
        # STORAGE_INFO: the controller's state (SPI mode: no high speed, capacity unknown)
        m.d.comb += [top.storage_info.ready.eq(sd.ready),
                     top.storage_info.card_type.eq(sd.card_type)]

        beat = Signal(26)
        m.d.sync += beat.eq(beat + 1)
        # Link activity and link errors, stretched so that an eye sees one byte or one error.
        activity = _stretch(m, (uart.o.valid & uart.o.ready) | (uart.i.valid & uart.i.ready),
                            ACTIVITY_CYCLES)
        frame_error = top.decoder.error.valid & top.decoder.error.ready
        link_error = _stretch(m, uart.error | frame_error, ERROR_CYCLES)
        leds = []
        for i in range(6 if self.sdram_chip is None else 7):
            m.submodules[f"led_{i}"] = led = io.Buffer("o", platform.request("led", i, dir="-"))
            leds.append(led)
        m.d.comb += [leds[0].o.eq(locked), leds[1].o.eq(sd.ready), leds[2].o.eq(sd.sdhc),
                     leds[3].o.eq(beat[-1]), leds[4].o.eq(activity), leds[5].o.eq(link_error)]
        if self.sdram_chip is not None:
            m.d.comb += leds[6].o.eq(self.sdram_ready)
        return m

    def _sdram(self, m, platform):
        """The SDRAM controller on the board's pins, its sector store on the top's ``sdram``
        port (the hot tier's SDRAM side, inside the top), the self-test on its second port."""
        chip = self.sdram_chip
        pads = platform.request("sdram", 0, dir="-")
        m.submodules.sdram = ctrl = SdramController(
            chip, tck_ns=self.sdram_tck_ns * self.sdram_rate, cl=self.sdram_cl, bl=SDRAM_BL,
            ports=2, read_delay=self.sdram_plan.read_delay, pads=pads, rate=self.sdram_rate)
        m.submodules.sdram_store = store = SdramSectorStore.for_controller(
            ctrl, width=self.storage_width)
        m.submodules.sdram_bist = bist = SdramBist(chip, bl=SDRAM_BL,
                                                   clocks_per_ms=round(self.sys_hz / 1000))
        wiring.connect(m, store.sdram, ctrl.port[0])
        if self.sdram_rate == 1:
            wiring.connect(m, bist.port, ctrl.port[1])
        else:
            count_bits = len(ctrl.port[1].cmd.payload.count)
            m.submodules.sdram_bist_widener = widener = PortWidener(ctrl.addr_bits, count_bits)
            wiring.connect(m, bist.port, widener.narrow)
            wiring.connect(m, widener.wide, ctrl.port[1])
        wiring.connect(m, self.top.sdram_test, bist.bist)
        wiring.connect(m, self.top.sdram, store.storage)
        self.sdram_ready = ctrl.ready
