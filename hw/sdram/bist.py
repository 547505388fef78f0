"""The SDRAM self-test (BIST): a board's memory checked from the gateware, for ``SDRAM_TEST``.

:class:`SdramBist` sits on one user port of the :class:`~.controller.SdramController` and runs
the tests of :class:`~ringkv.defs.sdram.BistTest` -- data lines (walking ones and zeros),
address lines (one burst at each single address bit), every bank (first and last row), a
full-memory pattern, and retention across a pause -- with the data of the golden model
:class:`ringkv.host.golden.sdram_bist.GoldenBist` (the tests and their words are described
there). Each test writes all its words, then reads them all back and compares; the answer
names the first word read back wrong (its test, word address, the word expected and the word
read) and counts the wrong words.

Latency, throughput, backpressure: one burst command per ``BL`` words (``count`` 1), through a
register slice (one clock); the
write data and the read data move at one word per clock when the controller takes them, so
a test of ``n`` words takes about ``2 n`` clocks plus the controller's row changes and
refreshes, the retention test its pause (``pause_ms`` times ``clocks_per_ms``) and one more
read of the range: the whole 32 MB part, three passes over 16.8 million words, about 50
million clocks, 1.3 s at 40 MHz, and the pause (2,048 words and a 300-clock pause: 7,432
clocks, measured in ``tests/hw/sdram/test_bist.py``'s first run; 7,320 before the 60 MHz
cuts of the controller and this slice). The read
data is always taken (``r.ready`` is 1). ``cmd`` is taken only when idle; ``result`` holds until
taken; ``busy`` is high from the command to the result's transfer.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int, check_type
from ringkv.defs.sdram import BistPhase, BistTest, SdramChip, check_burst_length

from ..link.skid import StreamRegister
from .arbiter import UserPortSignature

__all__ = ["SdramBist", "BIST_REQUEST", "BIST_RESULT", "BistSignature", "BIST_BUGS"]

#: ``SDRAM_TEST``'s request as the BIST takes it: ``tests`` (:class:`BistTest` bits),
#: ``words`` of the full pattern (0: the whole part), ``pause_ms`` of the retention test.
BIST_REQUEST = data.StructLayout({"tests": 8, "words": 32, "pause_ms": 16})
#: The answer: ``failed`` (:class:`BistPhase`: 0 passed, else the test of the first wrong
#: word), its word ``address``, ``expected`` and ``got``; ``errors`` (wrong words, saturating),
#: ``words`` of the full pattern, ``chip_words`` (the part's size in 16-bit words), ``cycles``
#: (clocks from the command to the answer).
BIST_RESULT = data.StructLayout({"failed": 8, "address": 32, "expected": 16, "got": 16,
                                 "errors": 32, "words": 32, "chip_words": 32, "cycles": 32})
#: Deliberately broken variants (private knob ``_bug``) for the tests: ``no_compare`` (every
#: word read back counts as right), ``low_bits`` (the address test stops below the row
#: address: the row lines are never driven alone).
BIST_BUGS = ("no_compare", "low_bits")

_TAGS = {BistPhase.ADDRESS: 0xA500, BistPhase.BANKS: 0x3C00}
_FULL_XOR = 0x5555


class BistSignature(wiring.Signature):
    """A self-test port, from the requester's side: ``cmd`` out, ``result`` in."""

    def __init__(self):
        super().__init__({"cmd": Out(stream.Signature(BIST_REQUEST)),
                          "result": In(stream.Signature(BIST_RESULT))})


class SdramBist(wiring.Component):
    """The self-test on one user port (see the module docstring).

    Parameters: ``chip`` (geometry), ``bl`` and ``count_bits`` (the controller's: the port's
    burst length and command width), ``clocks_per_ms`` (the retention pause's unit: the system
    clock's clocks per millisecond).

    Ports: ``port`` (to a controller's ``port[i]``), ``bist`` (In(:class:`BistSignature`):
    ``cmd`` and ``result``), ``busy``.
    """

    def __init__(self, chip: SdramChip, *, bl: int = 8, count_bits: int = 12,
                 clocks_per_ms: int = 40_000, _bug=None):
        check_type("Chip", chip, SdramChip)
        check_burst_length(bl)
        check_int("Count width", count_bits, low=1, high=24, unit=" bits")
        check_int("Clocks per ms", clocks_per_ms, low=1, high=1 << 24)
        if _bug is not None and _bug not in BIST_BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {BIST_BUGS}")
        self._chip, self._bl, self._count_bits = chip, bl, count_bits
        self._clocks_per_ms, self._bug = clocks_per_ms, _bug
        self._addr_bits = (chip.words - 1).bit_length()
        super().__init__({
            "port": Out(UserPortSignature(self._addr_bits, count_bits)),
            "bist": In(BistSignature()),
            "busy": Out(1),
        })

    chip = property(lambda self: self._chip)
    bl = property(lambda self: self._bl)
    clocks_per_ms = property(lambda self: self._clocks_per_ms)

    def elaborate(self, platform):
        m = Module()
        chip, bl, ab, bug = self._chip, self._bl, self._addr_bits, self._bug
        blb = (bl - 1).bit_length()
        port, req, res = self.port, self.bist.cmd, self.bist.result
        # the commands through a register slice (one clock): the pass's counters and compares
        # that make ``valid`` no longer run on into the controller's arbiter and, through it,
        # into the other port's command (the self-test's longest paths at 60 MHz)
        m.submodules.cmd_slice = cmd_slice = StreamRegister(port.cmd.payload.shape())
        wiring.connect(m, cmd_slice.o, wiring.flipped(port.cmd))
        cmd = cmd_slice.i
        n_address = ab - blb + 1
        if bug == "low_bits":
            n_address = chip.col_bits + chip.bank_bits - blb + 1

        tests = Signal(8)
        words = Signal(ab + 1)          # words of the full pattern (whole bursts)
        pause_ms = Signal(16)
        phase = Signal(BistPhase)
        k_issue = Signal(ab + 1)        # bursts commanded in this pass
        k_data = Signal(ab + 1)         # bursts whose words moved in this pass
        j_data = Signal(range(bl))      # the word inside that burst
        failed = Signal(BistPhase)
        address = Signal(32)
        expected = Signal(16)
        got = Signal(16)
        errors = Signal(32)
        cycles = Signal(32)

        # bursts of the current test
        n = Signal(ab + 1)
        with m.Switch(phase):
            with m.Case(BistPhase.DATA):
                m.d.comb += n.eq(32 // bl)
            with m.Case(BistPhase.ADDRESS):
                m.d.comb += n.eq(n_address)
            with m.Case(BistPhase.BANKS):
                m.d.comb += n.eq(2 * chip.banks)
            with m.Default():
                m.d.comb += n.eq(words >> blb)

        def burst_address(k):
            """Word address of burst ``k`` of the current test."""
            a = Signal(ab, name="burst_addr")
            with m.Switch(phase):
                with m.Case(BistPhase.DATA):
                    m.d.comb += a.eq(k << blb)
                with m.Case(BistPhase.ADDRESS):
                    m.d.comb += a.eq(Mux(k == 0, 0, Const(1 << blb, ab) << (k - 1)[:6]))
                with m.Case(BistPhase.BANKS):
                    last_row = Mux(k[0], chip.rows - 1, 0)
                    m.d.comb += a.eq(Cat(Const(0, chip.col_bits), k[1:1 + chip.bank_bits],
                                         last_row))
                with m.Default():
                    m.d.comb += a.eq(k << blb)
            return a

        data_addr = Signal(ab)          # the word address of the data side's word
        m.d.comb += data_addr.eq(burst_address(k_data) + j_data)
        word = Signal(16)               # the data side's word (to write, or expected)
        high = data_addr[16:]
        with m.Switch(phase):
            with m.Case(BistPhase.DATA):
                i = Cat(j_data, k_data)[:5]
                one = Const(1, 16) << i[:4]
                m.d.comb += word.eq(Mux(i[4], ~one, one))
            for ph, tag in _TAGS.items():
                with m.Case(ph):
                    m.d.comb += word.eq(tag ^ Cat(j_data, Const(0, 3 - blb), k_data)[:16])
            with m.Default():
                m.d.comb += word.eq(data_addr[:16] ^ (high + (high << 8))[:16] ^ _FULL_XOR)

        issue_addr = burst_address(k_issue)
        cmd_write = Signal()
        # the whole command in one assignment: a constant field assigned alone (count 1) next
        # to a field the FSM drives became an ``always @*`` block with no inputs in the
        # Verilog, which Verilator never ran (count 0: the controller took the commands and
        # did nothing; found by the pin-level board simulation)
        m.d.comb += [cmd.payload.eq(Cat(issue_addr, cmd_write, Const(1, self._count_bits))),
                     port.w.payload.data.eq(word), port.w.payload.mask.eq(0),
                     res.payload.failed.eq(failed), res.payload.address.eq(address),
                     res.payload.expected.eq(expected), res.payload.got.eq(got),
                     res.payload.errors.eq(errors), res.payload.words.eq(words),
                     res.payload.chip_words.eq(chip.words), res.payload.cycles.eq(cycles)]

        def advance_data():
            with m.If(j_data == bl - 1):
                m.d.sync += [j_data.eq(0), k_data.eq(k_data + 1)]
            with m.Else():
                m.d.sync += j_data.eq(j_data + 1)

        # the tests in order; ``enabled`` per phase, and the next enabled after ``phase``
        full = full_req(tests)
        enabled = {BistPhase.DATA: tests[0], BistPhase.ADDRESS: tests[1],
                   BistPhase.BANKS: tests[2], BistPhase.FULL: full,
                   BistPhase.RETENTION: tests[4]}
        order = list(enabled)
        pause_left = Signal(16)
        tick = Signal(range(self._clocks_per_ms))

        def start_next(after):
            """Go to the first enabled test after ``after`` (``None``: from the first), or
            answer when none is left."""
            later = order if after is None else order[order.index(after) + 1:]
            for idx, ph in enumerate(later):
                with (m.If if idx == 0 else m.Elif)(enabled[ph]):
                    m.d.sync += [phase.eq(ph), k_issue.eq(0), k_data.eq(0), j_data.eq(0),
                                 pause_left.eq(pause_ms), tick.eq(0)]
                    m.next = "PAUSE" if ph is BistPhase.RETENTION else "WRITE"
            if later:
                with m.Else():
                    m.next = "DONE"
            else:
                m.next = "DONE"

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += req.ready.eq(1)
                with m.If(req.valid):
                    w = req.payload.words
                    limited = Mux((w == 0) | (w > chip.words), chip.words, w)
                    m.d.sync += [tests.eq(req.payload.tests), pause_ms.eq(req.payload.pause_ms),
                                 words.eq(Mux(full_req(req.payload.tests),
                                              limited & ((1 << (ab + 1)) - bl), 0)),
                                 failed.eq(BistPhase.PASS), address.eq(0), expected.eq(0),
                                 got.eq(0), errors.eq(0), cycles.eq(0), phase.eq(0)]
                    m.next = "NEXT"
            with m.State("NEXT"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += cycles.eq(cycles + 1)
                # phase 0 (PASS) means "before the first"
                with m.If(phase == BistPhase.PASS):
                    start_next(None)
                for ph in order:
                    with m.Elif(phase == ph):
                        start_next(ph)
            with m.State("WRITE"):
                m.d.comb += [self.busy.eq(1), cmd.valid.eq(k_issue < n),
                             cmd_write.eq(1), port.w.valid.eq(k_data < n)]
                m.d.sync += cycles.eq(cycles + 1)
                with m.If(cmd.valid & cmd.ready):
                    m.d.sync += k_issue.eq(k_issue + 1)
                with m.If(port.w.valid & port.w.ready):
                    advance_data()
                with m.If((k_issue >= n) & (k_data >= n)):
                    m.d.sync += [k_issue.eq(0), k_data.eq(0), j_data.eq(0)]
                    m.next = "READ"
            with m.State("READ"):
                m.d.comb += [self.busy.eq(1), cmd.valid.eq(k_issue < n),
                             port.r.ready.eq(1)]
                m.d.sync += cycles.eq(cycles + 1)
                with m.If(cmd.valid & cmd.ready):
                    m.d.sync += k_issue.eq(k_issue + 1)
                with m.If(port.r.valid):
                    advance_data()
                    wrong = port.r.payload != word
                    if bug == "no_compare":
                        wrong = Const(0)
                    with m.If(wrong):
                        m.d.sync += errors.eq(errors + (errors != 0xFFFF_FFFF))
                        with m.If(failed == BistPhase.PASS):
                            m.d.sync += [failed.eq(phase), address.eq(data_addr),
                                         expected.eq(word), got.eq(port.r.payload)]
                with m.If((k_issue >= n) & (k_data >= n)):
                    m.next = "NEXT"
            with m.State("PAUSE"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += cycles.eq(cycles + 1)
                with m.If(pause_left == 0):
                    m.next = "READ"
                with m.Elif(tick == self._clocks_per_ms - 1):
                    m.d.sync += [tick.eq(0), pause_left.eq(pause_left - 1)]
                with m.Else():
                    m.d.sync += tick.eq(tick + 1)
            with m.State("DONE"):
                m.d.comb += [self.busy.eq(1), res.valid.eq(1)]
                with m.If(res.ready):
                    m.next = "IDLE"
        return m


def full_req(tests):
    """The full pattern runs when the request asks for it or for the retention test."""
    return (tests & int(BistTest.FULL | BistTest.RETENTION)).any()
