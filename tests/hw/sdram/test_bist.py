"""The SDRAM self-test (``hw/sdram/bist.py``) on the real controller and the strict pin-level
model, against its golden model (``host/golden/sdram_bist.py``): a good chip passes every test;
a chip with a stuck data line, two shorted address lines or cells that forget (faults
injected through the pin model) fails the test that looks for it, with the golden's first
failing word, word for word; the broken self-tests miss them."""

import pytest

from ringkv.defs.sdram import BIST_ALL_TESTS, BOARD_CHIPS, BistPhase, BistTest
from ringkv.host.golden.sdram_bist import GoldenBist, WordMemory, full_word
from ringkv.hw.sdram.bist import SdramBist
from ringkv.sim.sdram_bist_sim import BistTop, run_bist
from ringkv.sim.sdram_model import SdramModel

#: the board's part (the slowest of the 32 MB parts) at the board's 40 MHz, CL 2, BL 8, with
#: a short power-up (the rules are the datasheet's, refresh at its interval)
CHIP = BOARD_CHIPS["32MB"].scaled(power_up_ns=500)
CTRL = dict(chip=CHIP, tck_ns=25.0, cl=2, bl=8)
WORDS = 2048        # the full pattern: row 0 of every bank


def result_of(run):
    return {k: run[k] for k in ("failed", "address", "expected", "got", "errors", "words")}


def golden_of(tests, words, **faults):
    g = GoldenBist(CHIP, bl=8).run(tests, words, WordMemory(CHIP, **faults))
    return {"failed": g.failed.value, "address": g.address, "expected": g.expected,
            "got": g.got, "errors": g.errors, "words": g.words}


def test_parameter_errors():
    with pytest.raises(TypeError, match=r"^Chip must be a SdramChip, not 'x'$"):
        SdramBist("x")
    with pytest.raises(ValueError, match=r"^Burst length must be 1, 2, 4 or 8, not 3$"):
        SdramBist(CHIP, bl=3)
    with pytest.raises(ValueError, match=r"^Clocks per ms must be between 1 and 16777216, "
                                         r"not 0$"):
        SdramBist(CHIP, clocks_per_ms=0)
    with pytest.raises(ValueError, match=r"^Unknown bug 'x'"):
        SdramBist(CHIP, _bug="x")


def test_a_good_chip_passes_every_test():
    run = run_bist(BistTop(CTRL), int(BIST_ALL_TESTS), WORDS, pause_ms=3)
    assert result_of(run) == golden_of(int(BIST_ALL_TESTS), WORDS)
    assert run["failed"] == BistPhase.PASS.value and run["errors"] == 0
    assert run["words"] == WORDS and run["chip_words"] == CHIP.words
    assert not run["model"].violations
    # three passes over the full pattern (write, read, read after the pause) at about a word
    # a clock, the 3 ms pause of 100 clocks each, and the small tests
    assert 3 * WORDS + 300 < run["cycles"] < 3 * WORDS * 1.1 + 300 + 1000


@pytest.mark.parametrize("fault, tests, phase", [
    ({"dq_stuck": (5, 0)}, BIST_ALL_TESTS, BistPhase.DATA),
    ({"dq_stuck": (14, 1)}, BIST_ALL_TESTS, BistPhase.DATA),
    ({"a_short": (11, 12)}, BIST_ALL_TESTS, BistPhase.ADDRESS),
    ({"a_short": (11, 12)}, BistTest.FULL | BistTest.BANKS, BistPhase.PASS),
])
def test_faults_at_the_pins_are_found(fault, tests, phase):
    """A fault injected at the pins: the self-test's answer is the golden's on a word memory
    with the same fault, exactly (its first wrong word and the count); a shorted pair of
    high row lines is invisible to the banks and full tests (rows 0 and the last) and found
    by the address test only."""
    model = SdramModel(CHIP, 25.0, **fault)
    run = run_bist(BistTop(CTRL), int(tests), WORDS, model=model)
    assert result_of(run) == golden_of(int(tests), WORDS, **fault)
    assert run["failed"] == phase.value
    assert not model.violations


def test_weak_cells_fail_the_retention_test_only_after_a_pause():
    """Cells that hold their charge 5,000 clocks (a weak chip; the controller refreshes each
    row only every 8192 refreshes): the full pattern read right after writing passes, and
    with no pause the second read passes too; after a pause longer than the cells' retention
    the retention test fails at the first word."""
    tests = int(BistTest.FULL | BistTest.RETENTION)
    quick = run_bist(BistTop(CTRL), tests, WORDS, pause_ms=0,
                     model=SdramModel(CHIP, 25.0, retention_clocks=5000))
    assert quick["failed"] == BistPhase.PASS.value, quick
    slow = run_bist(BistTop(CTRL), tests, WORDS, pause_ms=60,
                    model=SdramModel(CHIP, 25.0, retention_clocks=5000))
    assert slow["failed"] == BistPhase.RETENTION.value, slow
    assert (slow["address"], slow["expected"]) == (0, full_word(0))
    assert slow["got"] != full_word(0) and slow["errors"] > 0


@pytest.mark.parametrize("bug, fault", [("no_compare", {"dq_stuck": (5, 0)}),
                                        ("low_bits", {"a_short": (11, 12)})])
def test_broken_self_tests_miss_the_faults(bug, fault):
    """The broken variants pass a faulty chip, where the golden (and the real block) fail."""
    tests = int(BistTest.DATA | BistTest.ADDRESS)
    run = run_bist(BistTop(CTRL, _bug=bug), tests, 0, model=SdramModel(CHIP, 25.0, **fault))
    assert run["failed"] == BistPhase.PASS.value
    assert golden_of(tests, 0, **fault)["failed"] != BistPhase.PASS.value


#: the half-rate controller at 60 MHz (the SDRAM at 120, CL 3), the self-test through the
#: 16-bit port widener, as on a half-rate board
HALF = dict(chip=CHIP, tck_ns=1000 / 60, cl=3, bl=8, rate=2)


@pytest.mark.parametrize("fault, tests, phase", [
    ({}, BIST_ALL_TESTS, BistPhase.PASS),
    ({"dq_stuck": (9, 1)}, BIST_ALL_TESTS, BistPhase.DATA),
    ({"a_short": (11, 12)}, BistTest.ADDRESS, BistPhase.ADDRESS),
])
def test_half_rate_self_test_against_golden(fault, tests, phase):
    """At half rate the self-test's answer is still the golden's, word for word (a good chip
    passes every test; a stuck line and a short are found where the golden finds them)."""
    model = SdramModel(CHIP, 1000 / 120, **fault)
    run = run_bist(BistTop(HALF), int(tests), WORDS, pause_ms=1, model=model)
    assert result_of(run) == golden_of(int(tests), WORDS, **fault)
    assert run["failed"] == phase.value
    assert not model.violations
