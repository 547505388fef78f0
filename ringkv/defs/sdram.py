"""SDR SDRAM parts, their timings, and the command and mode-register encodings.

Both the controller (``ringkv.hw.sdram``) and its golden models and pin-level model
(``ringkv.host.golden.sdram``, ``ringkv.sim.sdram_model``) take their numbers from here.

The table holds the three parts found on ULX3S boards (the production run decides which):
Micron MT48LC16M16A2 (speed grades -6A and -7E), ISSI IS42S16160G-7 and, on the 64 MB boards,
Alliance AS4C32M16SB-7. The figures are the datasheets' minimums in nanoseconds (Micron "256Mb:
x4, x8, x16 SDRAM" MT48LC16M16A2, AC characteristics table; ISSI "IS42S16160G/IS45S16160G",
AC characteristics, -7; Alliance "AS4C32M16SB", AC characteristics, -7). They were transcribed
into this table, not read out of a file by a program: check them against the datasheet of the
part on your board before trusting a margin of less than one clock.

Timings in clocks come from :meth:`SdramChip.timing`: every interval in ns is rounded *up* to
whole clocks at the given clock period; those fixed in clocks (tMRD, the write recovery's one
clock of Micron's "1 CLK + 6 ns") are added as clocks.
"""

import enum
import math
from dataclasses import dataclass, replace

from .checks import check_int, check_type

__all__ = ["SdramChip", "SdramTiming", "CHIPS", "DEFAULT_CHIP", "Cmd", "CMD_BITS",
           "mode_register", "decode_mode_register", "BurstType", "chip_of",
           "address_fields", "check_burst_length", "check_cas_latency", "check_rate", "RATES",
           "slowest_of", "BOARD_CHIPS", "board_chip", "BistTest", "BistPhase", "BIST_ALL_TESTS"]


class BurstType(enum.Enum):
    SEQUENTIAL = 0
    INTERLEAVED = 1


class Cmd(enum.Enum):
    """SDRAM commands by their ``(cs_n, ras_n, cas_n, we_n)`` pins (CKE high throughout).

    The value is the 4-bit vector ``cs_n << 3 | ras_n << 2 | cas_n << 1 | we_n``, as the
    datasheets' truth tables list them. Auto-precharge (A10 on READ/WRITE) is never used, and
    A10 high on PRECHARGE means "all banks".
    """
    INHIBIT = 0b1111     # device deselect (CS# high): the power-up state
    NOP = 0b0111
    ACTIVE = 0b0011
    READ = 0b0101
    WRITE = 0b0100
    BURST_TERMINATE = 0b0110
    PRECHARGE = 0b0010
    REFRESH = 0b0001
    MODE = 0b0000        # LOAD MODE REGISTER


#: width of :class:`Cmd` as a bit vector
CMD_BITS = 4


@dataclass(frozen=True)
class SdramTiming:
    """One chip's timings in clocks at one clock period (from :meth:`SdramChip.timing`)."""
    tck_ns: float
    rcd: int        # ACTIVE to READ/WRITE, same bank
    rp: int         # PRECHARGE to ACTIVE/REFRESH, same bank
    ras: int        # ACTIVE to PRECHARGE, same bank (minimum)
    rc: int         # ACTIVE to ACTIVE, same bank
    rrd: int        # ACTIVE to ACTIVE, different banks
    wr: int         # last write data to PRECHARGE
    rfc: int        # REFRESH to any command
    mrd: int        # LOAD MODE REGISTER to any command
    power_up: int   # clocks of NOP/INHIBIT with stable clock before the first PRECHARGE
    refi: float     # average interval between refreshes, in clocks (refresh_ns / refreshes)
    ras_max: int    # ACTIVE to PRECHARGE, maximum

    def at_rate(self, rate: int) -> "SdramTiming":
        """The same intervals in clocks of a controller that runs at ``1 / rate`` of the SDRAM
        clock and issues its commands in the first SDRAM clock of each of its own: every
        minimum rounded up, the maximum row-open time down (:data:`RATES`)."""
        check_rate(rate)

        def up(clocks: int) -> int:
            return -(-clocks // rate)

        return SdramTiming(
            tck_ns=self.tck_ns * rate, rcd=up(self.rcd), rp=up(self.rp), ras=up(self.ras),
            rc=up(self.rc), rrd=up(self.rrd), wr=up(self.wr), rfc=up(self.rfc),
            mrd=up(self.mrd), power_up=up(self.power_up), refi=self.refi / rate,
            ras_max=self.ras_max // rate)


@dataclass(frozen=True)
class SdramChip:
    """A part's geometry (x16 only) and datasheet timings (minimums, nanoseconds)."""
    name: str
    rows: int
    cols: int
    banks: int
    t_rcd: float
    t_rp: float
    t_ras: float
    t_rc: float
    t_rrd: float
    t_wr: float           # write recovery: t_wr_ck clocks plus t_wr ns
    t_wr_ck: int
    t_rfc: float
    t_mrd_ck: int
    t_ras_max: float
    power_up_ns: float
    init_refreshes: int   # AUTO REFRESH commands the power-up sequence needs, at least
    refreshes: int        # rows refreshed per refresh period (8192 for these parts) ...
    refresh_ns: float     # ... the period (64 ms)
    min_tck_cl2: float    # shortest clock period at CAS latency 2 ...
    min_tck_cl3: float    # ... and 3
    t_ac: float           # clock to data out, CAS latency 3 (the worst of CL2/CL3)
    t_oh: float           # data out hold after the clock
    t_is: float           # input setup
    t_ih: float           # input hold
    t_hz: float           # clock to data out high-impedance (max)
    datasheet: str

    @property
    def words(self) -> int:
        """16-bit words in the part."""
        return self.rows * self.cols * self.banks

    @property
    def row_bits(self) -> int:
        return (self.rows - 1).bit_length()

    @property
    def col_bits(self) -> int:
        return (self.cols - 1).bit_length()

    @property
    def bank_bits(self) -> int:
        return (self.banks - 1).bit_length()

    @property
    def addr_bits(self) -> int:
        """Width of the A pins: the row address (at least 11: A10 is the precharge-all bit)."""
        return max(self.row_bits, self.col_bits + 1, 11)

    def min_tck(self, cl: int) -> float:
        check_cas_latency(cl)
        return self.min_tck_cl2 if cl == 2 else self.min_tck_cl3

    def timing(self, tck_ns: float) -> SdramTiming:
        """The timings in whole clocks at a clock period of ``tck_ns``."""
        if not isinstance(tck_ns, (int, float)) or isinstance(tck_ns, bool):
            raise TypeError(f"Clock period must be a number of nanoseconds, not {tck_ns!r}")
        if not tck_ns > 0:
            raise ValueError(f"Clock period must be positive, not {tck_ns!r}")

        def ck(ns: float) -> int:
            # a hair of tolerance so that 60 ns at 10 ns is 6 clocks, not 7
            return max(1, math.ceil(ns / tck_ns - 1e-9))

        return SdramTiming(
            tck_ns=tck_ns, rcd=ck(self.t_rcd), rp=ck(self.t_rp), ras=ck(self.t_ras),
            rc=ck(self.t_rc), rrd=ck(self.t_rrd), wr=self.t_wr_ck + math.ceil(
                self.t_wr / tck_ns - 1e-9) if self.t_wr else self.t_wr_ck,
            rfc=ck(self.t_rfc), mrd=self.t_mrd_ck, power_up=ck(self.power_up_ns),
            refi=self.refresh_ns / self.refreshes / tck_ns,
            ras_max=int(self.t_ras_max // tck_ns))

    def scaled(self, **changes) -> "SdramChip":
        """A copy with some fields changed (tests: a short power-up, a short refresh period)."""
        return replace(self, **changes)


_COMMON = dict(banks=4, rows=8192, t_mrd_ck=2, t_ras_max=120_000.0, refreshes=8192,
               refresh_ns=64e6, t_is=1.5, t_ih=0.8)

CHIPS = {
    chip.name: chip for chip in (
        SdramChip(name="MT48LC16M16A2-6A", cols=512, t_rcd=18, t_rp=18, t_ras=42, t_rc=60,
                  t_rrd=12, t_wr=6, t_wr_ck=1, t_rfc=60, power_up_ns=100_000,
                  init_refreshes=2, min_tck_cl2=7.5, min_tck_cl3=6.0, t_ac=5.4, t_oh=3.0,
                  t_hz=5.4, datasheet="Micron 256Mb SDRAM, MT48LC16M16A2, -6A", **_COMMON),
        SdramChip(name="MT48LC16M16A2-7E", cols=512, t_rcd=15, t_rp=15, t_ras=37, t_rc=60,
                  t_rrd=14, t_wr=7, t_wr_ck=1, t_rfc=66, power_up_ns=100_000,
                  init_refreshes=2, min_tck_cl2=7.5, min_tck_cl3=7.0, t_ac=5.4, t_oh=3.0,
                  t_hz=5.4, datasheet="Micron 256Mb SDRAM, MT48LC16M16A2, -7E", **_COMMON),
        SdramChip(name="IS42S16160G-7", cols=512, t_rcd=15, t_rp=15, t_ras=37, t_rc=60,
                  t_rrd=14, t_wr=14, t_wr_ck=0, t_rfc=60, power_up_ns=200_000,
                  init_refreshes=8, min_tck_cl2=7.5, min_tck_cl3=7.0, t_ac=5.4, t_oh=2.7,
                  t_hz=5.4, datasheet="ISSI IS42S16160G, -7", **_COMMON),
        SdramChip(name="AS4C32M16SB-7", cols=1024, t_rcd=21, t_rp=21, t_ras=42, t_rc=63,
                  t_rrd=14, t_wr=14, t_wr_ck=0, t_rfc=63, power_up_ns=200_000,
                  init_refreshes=2, min_tck_cl2=10.0, min_tck_cl3=7.0, t_ac=5.4, t_oh=2.5,
                  t_hz=5.4, datasheet="Alliance AS4C32M16SB, -7", **_COMMON),
    )
}
DEFAULT_CHIP = CHIPS["MT48LC16M16A2-6A"]


def chip_of(name: str) -> SdramChip:
    check_type("Chip name", name, str)
    if name not in CHIPS:
        raise ValueError(f"Unknown SDRAM chip {name!r}; known: {', '.join(CHIPS)}")
    return CHIPS[name]


def check_cas_latency(cl) -> int:
    check_int("CAS latency", cl)
    if cl not in (2, 3):
        raise ValueError(f"CAS latency must be 2 or 3, not {cl!r}")
    return cl


def check_burst_length(bl) -> int:
    check_int("Burst length", bl)
    if bl not in (1, 2, 4, 8):
        raise ValueError(f"Burst length must be 1, 2, 4 or 8, not {bl!r}")
    return bl


#: SDRAM clocks per controller clock: 1 (the controller at the SDRAM clock) or 2 (a half-rate
#: PHY: the controller at half the SDRAM clock, two words a clock; ``docs/blocks/sdram.md``)
RATES = (1, 2)


def check_rate(rate, bl: int | None = None) -> int:
    """``rate`` is 1 or 2, and a burst of ``bl`` words fills whole controller clocks."""
    check_int("Rate", rate)
    if rate not in RATES:
        raise ValueError(f"Rate must be 1 or 2 SDRAM clocks a controller clock, not {rate!r}")
    if bl is not None and bl < rate:
        raise ValueError(f"Burst length {bl} is shorter than the rate {rate}: a burst must "
                         f"fill whole controller clocks")
    return rate


_BL_CODE = {1: 0, 2: 1, 4: 2, 8: 3}


def mode_register(cl: int, bl: int, burst_type: BurstType = BurstType.SEQUENTIAL) -> int:
    """The LOAD MODE REGISTER value on A: burst length A0-A2, type A3, CAS latency A4-A6,
    operating mode A7-A8 (standard, 0) and write burst mode A9 (0: programmed burst length)."""
    check_cas_latency(cl)
    check_burst_length(bl)
    check_type("Burst type", burst_type, BurstType)
    return _BL_CODE[bl] | burst_type.value << 3 | cl << 4


def decode_mode_register(value: int) -> dict:
    """``{"bl", "burst_type", "cl", "op_mode", "write_burst"}`` of a mode register value;
    ``bl`` is ``"page"`` for a full-page burst and ``None`` for a reserved code, ``cl`` is the
    raw field (a caller checks 2 or 3)."""
    bl = {0: 1, 1: 2, 2: 4, 3: 8, 7: "page"}.get(value & 7)
    return {"bl": bl, "burst_type": BurstType((value >> 3) & 1), "cl": (value >> 4) & 7,
            "op_mode": (value >> 7) & 3, "write_burst": (value >> 9) & 1}


def address_fields(chip: SdramChip) -> tuple[int, int, int]:
    """``(col_bits, bank_bits, row_bits)``: a word address is ``row | bank | col`` from the most
    significant end, so that a sequential stream that leaves a row goes on in the next bank
    (whose row a bank machine can open while this one still transfers)."""
    return chip.col_bits, chip.bank_bits, chip.row_bits


def slowest_of(name: str, chips) -> SdramChip:
    """One part that is any of ``chips`` (same geometry): every minimum time the largest of
    theirs, every clock-to-output time the largest, every output hold the smallest, the
    longest power-up and the most initial refreshes. A controller built for it meets the
    datasheet of whichever of them is fitted (the ULX3S's production runs differ)."""
    chips = list(chips)
    first = chips[0]
    for c in chips[1:]:
        if (c.rows, c.cols, c.banks, c.refreshes, c.refresh_ns) != (
                first.rows, first.cols, first.banks, first.refreshes, first.refresh_ns):
            raise ValueError(f"{c.name} has another geometry than {first.name}")

    def most(field):
        return max(getattr(c, field) for c in chips)

    # write recovery "k CLK + t ns": the worst at any clock period is the largest of each
    return replace(first, name=name, datasheet="; ".join(c.datasheet for c in chips),
                   **{f: most(f) for f in ("t_rcd", "t_rp", "t_ras", "t_rc", "t_rrd", "t_wr",
                                           "t_wr_ck", "t_rfc", "t_mrd_ck", "power_up_ns",
                                           "init_refreshes", "min_tck_cl2", "min_tck_cl3",
                                           "t_ac", "t_is", "t_ih", "t_hz")},
                   t_ras_max=min(c.t_ras_max for c in chips),
                   t_oh=min(c.t_oh for c in chips))


#: The parts a ULX3S may carry, by the size a user knows (``ULX3STop(sdram=...)``,
#: ``docs/BOARD.md``): ``"32MB"`` is the slowest of the three 32 MB parts (any of them works
#: with a bitstream built for it), ``"64MB"`` the Alliance part of the 64 MB boards.
BOARD_CHIPS = {
    "32MB": slowest_of("ULX3S 32 MB (MT48LC16M16A2-6A/-7E or IS42S16160G-7)",
                       [CHIPS["MT48LC16M16A2-6A"], CHIPS["MT48LC16M16A2-7E"],
                        CHIPS["IS42S16160G-7"]]),
    "64MB": CHIPS["AS4C32M16SB-7"],
}


def board_chip(name: str) -> SdramChip:
    """A :data:`BOARD_CHIPS` entry, or a part of :data:`CHIPS` by its name."""
    check_type("SDRAM part", name, str)
    if name in BOARD_CHIPS:
        return BOARD_CHIPS[name]
    if name in CHIPS:
        return CHIPS[name]
    raise ValueError(f"Unknown SDRAM part {name!r}; known: "
                     f"{', '.join([*BOARD_CHIPS, *CHIPS])}")


class BistTest(enum.IntFlag):
    """The memory self-test's parts (``SDRAM_TEST``'s ``tests`` bits; the gateware
    :class:`ringkv.hw.sdram.bist.SdramBist`, the golden
    :class:`ringkv.host.golden.sdram_bist.GoldenBist`)."""
    DATA = 1        #: walking ones and walking zeros on DQ0-15 (32 words at word 0)
    ADDRESS = 2     #: one burst at word 0 and at every single address bit above the burst
    BANKS = 4       #: the first and the last row of every bank
    FULL = 8        #: every word of the range written with its own pattern, then read back
    RETENTION = 16  #: after FULL, a pause (refreshes running), the range read back again


#: Every part of the self-test.
BIST_ALL_TESTS = BistTest.DATA | BistTest.ADDRESS | BistTest.BANKS | BistTest.FULL \
    | BistTest.RETENTION


class BistPhase(enum.Enum):
    """``failed`` of ``SDRAM_TEST``'s answer: the part of the first word read back wrong."""
    PASS = 0
    DATA = 1
    ADDRESS = 2
    BANKS = 3
    FULL = 4
    RETENTION = 5
