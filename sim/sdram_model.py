"""A pin-level SDR SDRAM model of our own: it stores the data and fails on any violation.

:class:`SdramModel` is plain Python, one call per clock: ``step(pins) -> dq`` takes the pins the
controller launched at the last rising edge (the PHY's output registers) and returns what the
SDRAM puts on DQ for the controller's input register to sample at the coming edge (``None``:
the SDRAM does not drive). Thin adapters drive it from the Amaranth simulator
(:func:`amaranth_sdram`) and from cocotb on Verilator (:class:`CocotbSdram`); the same object
can be inspected afterwards (``violations``, ``memory``, ``commands``).

The clock relation it assumes is the one of ``docs/blocks/sdram.md`` (the SDRAM clock 90
degrees behind the controller's): a command launched at the controller's edge ``e`` is taken by
the SDRAM a quarter period later, and word ``i`` of a READ with CAS latency ``CL`` is sampled by
the controller's input register at edge ``e + CL + i``. In calls of ``step``: a READ seen in
call ``n`` returns word ``i`` from call ``n + CL - 1 + i``; the SDRAM keeps driving the bus in
the call after the last word (its output turns off ``tHZ`` after the clock), so a WRITE whose
data the controller drives in that call collides with it.

Rules (``RULES``; each violation is recorded with its clock and rule, and raises
:class:`SdramViolation` at once when ``strict``):

* ``power_up``: a command other than NOP/INHIBIT before the power-up wait;
* ``init_precharge``: the first command after it is not PRECHARGE ALL;
* ``init_refresh``: ACTIVE/READ/WRITE before the chip's number of AUTO REFRESH commands;
* ``init_mode``: ACTIVE/READ/WRITE before LOAD MODE REGISTER;
* ``mode``: a reserved or unsupported mode-register value (burst length, CAS latency 2 or 3
  only, standard operation, programmed write bursts), a CAS latency too short for the clock,
  or LOAD MODE REGISTER with a bank open;
* ``trcd``, ``trp``, ``tras``, ``trc``, ``trrd``, ``twr``, ``trfc``, ``tmrd``: the intervals
  of their names (``tras`` also the maximum row-open time);
* ``closed_bank``: READ or WRITE to a bank with no open row;
* ``open_bank``: ACTIVE to a bank with a row open;
* ``refresh_open``: AUTO REFRESH with a bank open;
* ``refresh_interval``: fewer than ``refreshes`` AUTO REFRESH commands in a refresh period
  (8192 per 64 ms): the clock at which the oldest of the last ``refreshes`` commands (or the end
  of initialization) is more than the period ago;
* ``burst``: a READ, WRITE or PRECHARGE that cuts a burst short (legal on the chip, never
  meant by our controller), or auto-precharge (A10 on READ/WRITE, not modelled);
* ``bus``: the controller drives DQ in a clock when the SDRAM drives it (contention), or
  when no write burst takes data; or leaves DQ undriven in a write burst word that DQM does
  not mask.

Faults (for tests that a memory test finds a broken board; none by default): ``dq_stuck =
(bit, level)`` holds one DQ line at a level both ways (what is stored and what is read);
``a_short = (i, j)`` wires address lines A``i`` and A``j`` together (each reads as
``A[i] & A[j]``, a wired AND) in every command; ``retention_clocks`` makes a weak chip: a row
whose cells were last restored (by an ACTIVE of the row, or by the AUTO REFRESH whose internal
row counter reaches it: one row, in all banks, per refresh) more than that many clocks ago has
lost its data when it is next opened or refreshed (its words read back as garbage).

DQM: on writes it masks the byte at once (bit 0 the low byte), on reads two clocks later (the
datasheets' DQM read latency of 2): a masked read byte is not driven. A read of a word never
written returns a fixed pseudo-random value, as a powered-up chip returns garbage.
"""

import collections
import random
from dataclasses import dataclass

from ringkv.defs.sdram import BurstType, Cmd, SdramChip, decode_mode_register

__all__ = ["SdramModel", "SdramPins", "SdramViolation", "RULES", "amaranth_sdram",
           "CocotbSdram", "burst_columns", "PinDelay", "add_controller_clocks",
           "model_for_controller"]

RULES = ("power_up", "init_precharge", "init_refresh", "init_mode", "mode", "trcd", "trp",
         "tras", "trc", "trrd", "twr", "trfc", "tmrd", "closed_bank", "open_bank",
         "refresh_open", "refresh_interval", "burst", "bus")


class SdramViolation(AssertionError):
    """The controller broke one of the chip's rules (``rule``, one of :data:`RULES`)."""

    def __init__(self, cycle: int, rule: str, message: str):
        super().__init__(f"clock {cycle}: {rule}: {message}")
        self.cycle, self.rule, self.message = cycle, rule, message


@dataclass
class SdramPins:
    """The pins in one clock (the controller's side; ``dq``/``dq_oe`` the controller's
    driver)."""
    cs_n: int = 1
    ras_n: int = 1
    cas_n: int = 1
    we_n: int = 1
    ba: int = 0
    a: int = 0
    dqm: int = 3
    dq: int = 0
    dq_oe: int = 0
    cke: int = 1

    @property
    def cmd(self) -> Cmd:
        if self.cs_n:
            return Cmd.INHIBIT
        return Cmd(self.ras_n << 2 | self.cas_n << 1 | self.we_n)


def burst_columns(start: int, bl: int, burst_type: BurstType) -> list[int]:
    """The columns of a burst of ``bl`` starting at column ``start`` (datasheet burst
    ordering: the burst wraps inside its ``bl``-aligned block)."""
    base = start & ~(bl - 1)
    if burst_type is BurstType.SEQUENTIAL:
        return [base | ((start + i) & (bl - 1)) for i in range(bl)]
    return [base | ((start ^ i) & (bl - 1)) for i in range(bl)]


class _Bank:
    def __init__(self):
        self.open = False
        self.row = 0
        self.act = -(10 ** 9)       # clock of the last ACTIVE
        self.pre = -(10 ** 9)       # clock of the last PRECHARGE
        self.write_end = -(10 ** 9)  # clock of the last write data word
        self.read_end = -(10 ** 9)   # first clock after the last READ's burst


class SdramModel:
    """One x16 SDR SDRAM of ``chip`` clocked at ``tck_ns``.

    ``strict=True`` raises :class:`SdramViolation` at the first violation; otherwise they are
    collected in ``violations`` (``(clock, rule, message)``). ``seed`` fixes the garbage of
    unwritten words and of undriven bytes.
    """

    def __init__(self, chip: SdramChip, tck_ns: float, *, strict: bool = True, seed: int = 0,
                 dq_stuck: tuple[int, int] | None = None, a_short: tuple[int, int] | None = None,
                 retention_clocks: int | None = None):
        self.chip = chip
        self.dq_stuck = None if dq_stuck is None else (int(dq_stuck[0]), int(dq_stuck[1]))
        self.a_short = None if a_short is None else (int(a_short[0]), int(a_short[1]))
        self.retention_clocks = retention_clocks
        self.restored: dict[tuple[int, int], int] = {}   # (bank, row) -> clock last restored
        self.refresh_row = 0                               # the chip's internal row counter
        self.t = chip.timing(tck_ns)
        self.tck_ns = tck_ns
        self.strict = strict
        self.rng = random.Random(seed)
        self.memory: dict[tuple[int, int, int], int] = {}
        self.violations: list[tuple[int, str, str]] = []
        self.commands: list[tuple[int, Cmd, int, int]] = []   # (clock, command, ba, a)
        self.banks = [_Bank() for _ in range(chip.banks)]
        self.cycle = -1
        self.mode = None
        self.precharged_all = False
        self.init_refreshes = 0
        self.init_done_at = None
        self.refresh_times = collections.deque(maxlen=chip.refreshes)
        self.refresh_period = chip.refresh_ns / tck_ns
        self.last_ref = -(10 ** 9)
        self.last_mode = -(10 ** 9)
        self.last_act = -(10 ** 9)
        self.write_words: dict[int, tuple[int, int, int]] = {}   # clock -> (bank, row, col)
        self.read_words: dict[int, tuple[int, int, int]] = {}    # call -> (bank, row, col)
        self.read_tail: set[int] = set()
        self.burst_end = -(10 ** 9)    # first clock after the current READ/WRITE burst
        self.dqm_history = collections.deque([3, 3], maxlen=2)
        self.reported_refresh = False
        self.data_clocks: list[int] = []   # every clock a word crossed DQ (read or write)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _violate(self, rule: str, message: str):
        assert rule in RULES
        self.violations.append((self.cycle, rule, message))
        if self.strict:
            raise SdramViolation(self.cycle, rule, message)

    def _since(self, then: int, need: int, rule: str, what: str):
        if self.cycle - then < need:
            self._violate(rule, f"{what}: {self.cycle - then} clocks, needs {need}")

    def garbage(self) -> int:
        return self.rng.randrange(1 << 16)

    @property
    def ready(self) -> bool:
        return self.init_done_at is not None

    # -- one clock -----------------------------------------------------------------------------
    def step(self, pins: SdramPins) -> int | None:
        """Take the pins of one clock; return DQ as the SDRAM drives it (``None``: not)."""
        self.cycle += 1
        n = self.cycle
        if self.a_short is not None:
            i, j = self.a_short
            both = (pins.a >> i) & (pins.a >> j) & 1
            a = pins.a & ~(1 << i) & ~(1 << j) | both << i | both << j
            pins = SdramPins(**{**pins.__dict__, "a": a})
        cmd = pins.cmd if pins.cke else Cmd.INHIBIT
        if cmd not in (Cmd.INHIBIT, Cmd.NOP):
            self.commands.append((n, cmd, pins.ba, pins.a))
            self._command(cmd, pins)
        self._refresh_deadline()
        for bank in self.banks:
            if bank.open and n - bank.act > self.t.ras_max:
                self._violate("tras", f"row open {n - bank.act} clocks, at most "
                              f"{self.t.ras_max}")
                bank.act = n
        drive = self._data(pins)
        self.dqm_history.append(pins.dqm)
        return drive

    def _refresh_deadline(self):
        if self.init_done_at is None or self.reported_refresh:
            return
        since = (self.refresh_times[0] if len(self.refresh_times) == self.chip.refreshes
                 else self.init_done_at)
        if self.cycle - since > self.refresh_period:
            self.reported_refresh = True
            self._violate("refresh_interval", f"fewer than {self.chip.refreshes} refreshes "
                          f"in {self.refresh_period:g} clocks")

    def _command(self, cmd: Cmd, pins: SdramPins):
        n, t = self.cycle, self.t
        if n < t.power_up:
            self._violate("power_up", f"{cmd.name} after {n} clocks, the power-up wait is "
                          f"{t.power_up}")
        if not self.precharged_all:
            if cmd is Cmd.PRECHARGE and pins.a >> 10 & 1:
                self.precharged_all = True
            else:
                self._violate("init_precharge", f"{cmd.name} before the first PRECHARGE ALL")
        self._since(self.last_ref, t.rfc, "trfc", f"{cmd.name} after REFRESH")
        self._since(self.last_mode, t.mrd, "tmrd", f"{cmd.name} after LOAD MODE REGISTER")
        if cmd in (Cmd.ACTIVE, Cmd.READ, Cmd.WRITE) and self.init_done_at is None:
            if self.init_refreshes < self.chip.init_refreshes:
                self._violate("init_refresh", f"{cmd.name} after {self.init_refreshes} "
                              f"refreshes, needs {self.chip.init_refreshes}")
            if self.mode is None:
                self._violate("init_mode", f"{cmd.name} before LOAD MODE REGISTER")
        bank = self.banks[pins.ba]
        if cmd is Cmd.ACTIVE:
            if bank.open:
                self._violate("open_bank", f"ACTIVE to bank {pins.ba}, row {bank.row} open")
            self._since(bank.pre, t.rp, "trp", f"ACTIVE to bank {pins.ba} after PRECHARGE")
            self._since(bank.act, t.rc, "trc", f"ACTIVE to bank {pins.ba} after ACTIVE")
            if self.last_act_bank != pins.ba:
                self._since(self.last_act, t.rrd, "trrd", "ACTIVE after ACTIVE to another bank")
            bank.open, bank.row, bank.act = True, pins.a & (self.chip.rows - 1), n
            self._restore(pins.ba, bank.row)
            self.last_act, self.last_act_bank = n, pins.ba
        elif cmd in (Cmd.READ, Cmd.WRITE):
            self._column(cmd, bank, pins)
        elif cmd is Cmd.PRECHARGE:
            targets = range(self.chip.banks) if pins.a >> 10 & 1 else [pins.ba]
            for b in targets:
                self._precharge(b)
        elif cmd is Cmd.REFRESH:
            for b, other in enumerate(self.banks):
                if other.open:
                    self._violate("refresh_open", f"REFRESH with bank {b} open")
                self._since(other.pre, t.rp, "trp", f"REFRESH after PRECHARGE of bank {b}")
            self.last_ref = n
            for b in range(self.chip.banks):
                self._restore(b, self.refresh_row)
            self.refresh_row = (self.refresh_row + 1) % self.chip.rows
            if self.init_done_at is None:
                self.init_refreshes += 1
                self._check_init_done()
            else:
                self.refresh_times.append(n)
        elif cmd is Cmd.MODE:
            if any(b.open for b in self.banks):
                self._violate("mode", "LOAD MODE REGISTER with a bank open")
            self._load_mode(pins.a)
            self.last_mode = n
            self._check_init_done()
        elif cmd is Cmd.BURST_TERMINATE:
            self._violate("burst", "BURST TERMINATE is not used by our controller")

    last_act_bank = -1

    def _restore(self, bank: int, row: int):
        """A row's cells restored now (ACTIVE, or AUTO REFRESH); a weak chip
        (``retention_clocks``) has lost the row's data if its last restore is too old."""
        if self.retention_clocks is None:
            return
        last = self.restored.get((bank, row))
        if last is not None and self.cycle - last > self.retention_clocks:
            for key in [k for k in self.memory if k[0] == bank and k[1] == row]:
                del self.memory[key]
        self.restored[(bank, row)] = self.cycle

    def _check_init_done(self):
        if (self.init_done_at is None and self.mode is not None
                and self.init_refreshes >= self.chip.init_refreshes):
            self.init_done_at = self.cycle

    def _load_mode(self, value: int):
        fields = decode_mode_register(value)
        problems = []
        if fields["bl"] not in (1, 2, 4, 8):
            problems.append(f"burst length code {value & 7} (1, 2, 4 or 8 modelled)")
        if fields["cl"] not in (2, 3):
            problems.append(f"CAS latency {fields['cl']}")
        elif self.tck_ns < self.chip.min_tck(fields["cl"]) - 1e-9:
            problems.append(f"CAS latency {fields['cl']} needs a clock period of at least "
                            f"{self.chip.min_tck(fields['cl'])} ns, not {self.tck_ns:g}")
        if fields["op_mode"]:
            problems.append(f"operating mode {fields['op_mode']}")
        if fields["write_burst"]:
            problems.append("single-location write bursts")
        for problem in problems:
            self._violate("mode", problem)
        self.mode = fields

    def _precharge(self, b: int):
        bank, t, n = self.banks[b], self.t, self.cycle
        if bank.open:
            self._since(bank.act, t.ras, "tras", f"PRECHARGE of bank {b} after ACTIVE")
            if n - bank.write_end < t.wr:
                self._violate("twr", f"PRECHARGE of bank {b} {n - bank.write_end} clocks "
                              f"after the last write data, needs {t.wr}")
            if n < bank.read_end:
                self._violate("burst", f"PRECHARGE of bank {b} cuts its read burst short")
        bank.open = False
        bank.pre = n

    def _column(self, cmd: Cmd, bank: _Bank, pins: SdramPins):
        n, chip = self.cycle, self.chip
        if not bank.open:
            self._violate("closed_bank", f"{cmd.name} to bank {pins.ba} with no row open")
            return
        self._since(bank.act, self.t.rcd, "trcd", f"{cmd.name} to bank {pins.ba} after ACTIVE")
        if pins.a >> 10 & 1:
            self._violate("burst", f"{cmd.name} with auto-precharge (not modelled)")
        if n < self.burst_end:
            self._violate("burst", f"{cmd.name} cuts the previous burst short")
        if self.mode is None:
            return
        bl = self.mode["bl"]
        cols = burst_columns(pins.a & (chip.cols - 1), bl, self.mode["burst_type"])
        self.burst_end = n + bl
        where = [(pins.ba, bank.row, col) for col in cols]
        if cmd is Cmd.WRITE:
            for i, w in enumerate(where):
                self.write_words[n + i] = w
            bank.write_end = n + bl - 1
        else:
            first = n + self.mode["cl"] - 1
            for i, w in enumerate(where):
                self.read_words[first + i] = w
            self.read_tail.add(first + bl)
            bank.read_end = n + bl

    def _data(self, pins: SdramPins) -> int | None:
        n = self.cycle
        out = None
        word = self.read_words.pop(n, None)
        tail = n in self.read_tail
        self.read_tail.discard(n)
        if word is not None:
            value = self.memory.get(word)
            if value is None:
                value = self.memory[word] = self.garbage()
            mask = self.dqm_history[-1]        # DQM of the previous clock: read latency 2
            for byte in (0, 1):
                if mask >> byte & 1:
                    value = value & ~(0xFF << 8 * byte) | (self.garbage() & 0xFF) << 8 * byte
            out = self._stuck(value)
            self.data_clocks.append(n)
        target = self.write_words.pop(n, None)
        if pins.dq_oe and (word is not None or tail):
            self._violate("bus", "the controller drives DQ while the SDRAM does")
        if target is not None:
            if not pins.dq_oe and pins.dqm != 3:
                self._violate("bus", "write data not driven")
            elif pins.dq_oe:
                self.data_clocks.append(n)
                old = self.memory.get(target)
                if old is None:
                    old = self.garbage()
                keep = (0xFF if pins.dqm & 1 else 0) | (0xFF00 if pins.dqm & 2 else 0)
                self.memory[target] = self._stuck((old & keep) | (pins.dq & ~keep & 0xFFFF))
        elif pins.dq_oe and word is None and not tail:
            self._violate("bus", "the controller drives DQ outside a write burst")
        return out

    @property
    def quiet(self) -> bool:
        """No burst in flight: the coming clocks need no data from the pins until the next
        command (an adapter may then wait for one and :meth:`advance` over the clocks
        between)."""
        return not (self.read_words or self.write_words or self.read_tail)

    def advance(self, clocks: int):
        """``clocks`` clocks of INHIBIT with DQ undriven by either side, at once (only while
        :attr:`quiet`): the same checks as that many :meth:`step` calls (the refresh
        deadline, a row open too long), reported at the last of them."""
        if clocks <= 0:
            return
        if not self.quiet:
            raise RuntimeError("advance() with a burst in flight")
        self.cycle += clocks
        self._refresh_deadline()
        for bank in self.banks:
            if bank.open and self.cycle - bank.act > self.t.ras_max:
                self._violate("tras", f"row open {self.cycle - bank.act} clocks, at most "
                              f"{self.t.ras_max}")
                bank.act = self.cycle

    def _stuck(self, value: int) -> int:
        if self.dq_stuck is None:
            return value
        bit, level = self.dq_stuck
        return value & ~(1 << bit) | (level & 1) << bit

    # -- inspection ----------------------------------------------------------------------------
    def word(self, bank: int, row: int, col: int) -> int | None:
        return self.memory.get((bank, row, col))


def _pins_now(ctx, pins) -> SdramPins:
    get = ctx.get
    return SdramPins(cs_n=get(pins.cs_n), ras_n=get(pins.ras_n), cas_n=get(pins.cas_n),
                     we_n=get(pins.we_n), ba=get(pins.ba), a=get(pins.a), dqm=get(pins.dqm),
                     dq=get(pins.dq_o), dq_oe=get(pins.dq_oe), cke=get(pins.cke))


class PinDelay:
    """The pins as the SDRAM takes them ``clocks`` edges after the controller launched them:
    the cycle-level picture of an SDRAM clock that lags the system clock by nearly a whole
    period (the phase of a controller with ``read_delay`` 1: ``docs/blocks/sdram.md``, "The
    clock and its phase"), where each command, address and write word reaches the SDRAM's
    edge just before the controller's next one. Read data is not delayed: it reaches the
    input register one edge later than at a small phase, which ``read_delay`` accounts for.
    Before the first ``clocks`` edges the SDRAM sees the pins' reset values (INHIBIT)."""

    def __init__(self, clocks: int = 0):
        if clocks not in (0, 1):
            raise ValueError(f"pin delay must be 0 or 1 clocks, not {clocks!r}")
        self.clocks, self._held = clocks, SdramPins()

    def __call__(self, pins: SdramPins) -> SdramPins:
        if not self.clocks:
            return pins
        out, self._held = self._held, pins
        return out


def amaranth_sdram(model: SdramModel, pins, *, stop=None, pin_delay: int = 0,
                   domain: str = "sync"):
    """An Amaranth testbench (``sim.add_testbench(amaranth_sdram(model, dut.pins),
    background=True)``) that runs ``model`` on the pins of a ``SdramPinsSignature``:
    after each edge it reads the settled pins and sets ``dq_i`` for the next edge (garbage
    where the SDRAM does not drive, as a floating bus). ``pin_delay`` 1: the SDRAM takes
    the pins an edge later (:class:`PinDelay`; a controller with ``read_delay=1``).
    ``domain``: the clock of the pins' registers (a half-rate controller's ``fast_domain``)."""
    delay = PinDelay(pin_delay)

    async def testbench(ctx):
        while stop is None or not stop():
            await ctx.tick(domain)
            drive = model.step(delay(_pins_now(ctx, pins)))
            ctx.set(pins.dq_i, model.garbage() if drive is None else drive)
    return testbench


def add_controller_clocks(sim, ctrl) -> str:
    """Clock ``sim`` for the SDRAM controller ``ctrl`` (a
    :class:`~ringkv.hw.sdram.controller.SdramController` anywhere in the simulated design) and
    return the domain of its pins: ``sync`` at its ``tck_ns``; at half rate also its
    ``fast_domain`` at twice the rate, every other edge at the instant of one of ``sync``'s
    (periods of an even number of femtoseconds: the simulator toggles a clock every half
    period, in whole femtoseconds, and an odd period would drift the two clocks apart by a
    femtosecond a clock, until the edges no longer meet)."""
    rate = getattr(ctrl, "rate", 1)
    if rate == 1:
        sim.add_clock(ctrl.tck_ns * 1e-9)
        return "sync"
    fast_fs = 2 * max(1, round(ctrl.tck_ns * 1e6 / rate / 2))
    sim.add_clock(fast_fs * rate * 1e-15, phase=fast_fs * rate * 1e-15)
    sim.add_clock(fast_fs * 1e-15, phase=fast_fs * rate * 1e-15, domain=ctrl.fast_domain)
    return ctrl.fast_domain


def model_for_controller(ctrl, **kw) -> SdramModel:
    """A :class:`SdramModel` of ``ctrl``'s chip at its SDRAM clock (``tck_ns / rate``)."""
    return SdramModel(ctrl.chip, ctrl.tck_ns / getattr(ctrl, "rate", 1), **kw)


class CocotbSdram:
    """The model on a Verilator top's pins (``prefix`` + ``__cs_n`` ...), in cocotb: at every
    falling edge it reads the pins the controller launched at the rising edge before and sets
    ``dq_i`` for the next rising edge (``pin_delay``: :class:`PinDelay`)."""

    def __init__(self, dut, prefix: str, model: SdramModel, clk=None, pin_delay: int = 0):
        self.dut, self.model, self.delay = dut, model, PinDelay(pin_delay)
        self.clk = clk if clk is not None else dut.clk
        self.sig = {name: getattr(dut, f"{prefix}__{name}") for name in
                    ("cs_n", "ras_n", "cas_n", "we_n", "ba", "a", "dqm", "dq_o", "dq_oe",
                     "cke", "dq_i")}

    async def run(self):
        from cocotb.triggers import FallingEdge

        s = self.sig
        while True:
            await FallingEdge(self.clk)
            pins = SdramPins(**{k: int(s[k].value) for k in
                                ("cs_n", "ras_n", "cas_n", "we_n", "ba", "a", "dqm", "dq_oe",
                                 "cke")}, dq=int(s["dq_o"].value))
            drive = self.model.step(self.delay(pins))
            s["dq_i"].value = self.model.garbage() if drive is None else drive
