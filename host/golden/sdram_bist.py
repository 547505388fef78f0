"""Golden model of the SDRAM self-test (``hw/sdram/bist.py``, ``SDRAM_TEST``).

:class:`GoldenBist` runs the same tests, in the same order, with the same data, on a word
memory (a ``read(addr) -> word`` / ``write(addr, word)`` pair: :class:`WordMemory`, optionally
with the faults the pin-level model injects), and returns the answer the gateware gives:
the first failing part (:class:`~ringkv.defs.sdram.BistPhase`), its word address, the word
expected and the word read, the number of words read back wrong, and the words of the full
pattern. The pause of the retention test is not modelled (a word memory keeps its words):
the retention part reads the full pattern back a second time.

The tests, each written whole and then read back whole (so that two addresses that land on
one cell are seen):

* **data**: 32 words at word 0: word ``i < 16`` is ``1 << i`` (walking one), word ``16 + i``
  is ``~(1 << i)`` (walking zero): every DQ line high alone and low alone;
* **address**: a burst at word 0 and at word ``1 << b`` for every address bit ``b`` above the
  burst's (``log2(BL)`` .. the top): the ``k``-th burst's word ``j`` is
  ``0xA500 ^ (k << 3 | j)``; two address bits that reach one cell leave the later burst's
  words where the earlier's should be;
* **banks**: the first and the last row of every bank (column 0), burst ``k`` (bank ``k // 2``,
  the last row when ``k`` is odd), word ``j``: ``0x3C00 ^ (k << 3 | j)``;
* **full**: words ``0 .. words - 1`` (a multiple of BL; 0 in the request: the whole part), word
  ``a`` holding :func:`full_word` ``(a)``, which differs between any two addresses that differ
  in one bit and changes every DQ line along the range;
* **retention**: (after the full pattern) a pause of ``pause_ms`` milliseconds while the
  controller refreshes, then the full range read back again.
"""

from dataclasses import dataclass

from ringkv.defs.sdram import BistPhase, BistTest, SdramChip

__all__ = ["GoldenBist", "BistResult", "WordMemory", "data_words", "address_bursts",
           "bank_bursts", "full_word", "ADDRESS_TAG", "BANK_TAG", "FULL_XOR", "full_words"]

#: Data of the address and banks tests: ``TAG ^ (k << 3 | j)`` (burst ``k``, word ``j``).
ADDRESS_TAG, BANK_TAG = 0xA500, 0x3C00
#: The full pattern's constant (so that word 0 is not 0).
FULL_XOR = 0x5555


def full_word(addr: int) -> int:
    """The full pattern's word at word address ``addr``: its low 16 bits, XOR its higher bits
    in both bytes, XOR :data:`FULL_XOR`."""
    high = addr >> 16
    return ((addr & 0xFFFF) ^ ((high + (high << 8)) & 0xFFFF) ^ FULL_XOR) & 0xFFFF


def data_words() -> list[int]:
    """The data test's 32 words (at words 0..31)."""
    return [1 << i for i in range(16)] + [~(1 << i) & 0xFFFF for i in range(16)]


def address_bursts(chip: SdramChip, bl: int) -> list[int]:
    """Word addresses of the address test's bursts: 0, then ``1 << b`` for every bit ``b``
    from ``log2(bl)`` to the top of the word address."""
    addr_bits = (chip.words - 1).bit_length()
    return [0] + [1 << b for b in range((bl - 1).bit_length(), addr_bits)]


def bank_bursts(chip: SdramChip) -> list[int]:
    """Word addresses of the banks test's bursts: per bank, its first and its last row."""
    out = []
    for bank in range(chip.banks):
        for row in (0, chip.rows - 1):
            out.append(row << (chip.col_bits + chip.bank_bits) | bank << chip.col_bits)
    return out


def full_words(chip: SdramChip, bl: int, words: int) -> int:
    """Words of the full pattern for a request of ``words`` (0: the whole part; at most the
    part's size; rounded down to whole bursts)."""
    words = chip.words if words == 0 else min(words, chip.words)
    return words & ~(bl - 1)


class WordMemory:
    """A word memory with the pin-level model's faults, at word level: ``dq_stuck = (bit,
    level)`` forces one data bit both ways; ``a_short = (i, j)`` wires the A lines ``i`` and
    ``j`` together (wired AND) in the row address of an ACTIVE (lines above the column
    address's only: the model's command rows); words never written read as ``None``."""

    def __init__(self, chip: SdramChip, *, dq_stuck=None, a_short=None):
        self.chip, self.dq_stuck, self.a_short = chip, dq_stuck, a_short
        self.cells: dict[int, int] = {}

    def _cell(self, addr: int) -> int:
        if self.a_short is None:
            return addr
        c = self.chip
        col = addr & (c.cols - 1)
        bank = addr >> c.col_bits & (c.banks - 1)
        row = addr >> (c.col_bits + c.bank_bits)
        i, j = self.a_short
        both = (row >> i) & (row >> j) & 1
        row = row & ~(1 << i) & ~(1 << j) | both << i | both << j
        return row << (c.col_bits + c.bank_bits) | bank << c.col_bits | col

    def _stuck(self, word):
        if self.dq_stuck is None or word is None:
            return word
        bit, level = self.dq_stuck
        return word & ~(1 << bit) | (level & 1) << bit

    def write(self, addr: int, word: int):
        self.cells[self._cell(addr)] = self._stuck(word)

    def read(self, addr: int):
        return self._stuck(self.cells.get(self._cell(addr)))


@dataclass
class BistResult:
    """The answer of ``SDRAM_TEST`` (its layout, :data:`ringkv.defs.protocol.SDRAM_TEST_RESPONSE`,
    less the clocks)."""
    failed: BistPhase
    address: int = 0
    expected: int = 0
    got: int = 0
    errors: int = 0
    words: int = 0

    @property
    def ok(self) -> bool:
        return self.failed is BistPhase.PASS


class GoldenBist:
    """The self-test of ``chip`` through bursts of ``bl`` words (see the module docstring)."""

    def __init__(self, chip: SdramChip, *, bl: int = 8):
        self.chip, self.bl = chip, bl

    def phases(self, tests: int, words: int):
        """``[(phase, [(addr, word), ...], write_first)]`` in the order the test runs them."""
        bl = self.bl
        out = []
        tests = BistTest(tests)
        if BistTest.DATA in tests:
            out.append((BistPhase.DATA, list(enumerate(data_words())), True))
        if BistTest.ADDRESS in tests:
            out.append((BistPhase.ADDRESS, [(a + j, ADDRESS_TAG ^ (k << 3 | j))
                                            for k, a in enumerate(address_bursts(self.chip, bl))
                                            for j in range(bl)], True))
        if BistTest.BANKS in tests:
            out.append((BistPhase.BANKS, [(a + j, BANK_TAG ^ (k << 3 | j))
                                          for k, a in enumerate(bank_bursts(self.chip))
                                          for j in range(bl)], True))
        if tests & (BistTest.FULL | BistTest.RETENTION):
            n = full_words(self.chip, bl, words)
            full = [(a, full_word(a)) for a in range(n)]
            out.append((BistPhase.FULL, full, True))
            if BistTest.RETENTION in tests:
                out.append((BistPhase.RETENTION, full, False))
        return out

    def run(self, tests: int, words: int, memory: WordMemory | None = None) -> BistResult:
        memory = WordMemory(self.chip) if memory is None else memory
        result = BistResult(BistPhase.PASS,
                            words=full_words(self.chip, self.bl, words)
                            if tests & (BistTest.FULL | BistTest.RETENTION) else 0)
        for phase, pattern, write in self.phases(tests, words):
            if write:
                for addr, word in pattern:
                    memory.write(addr, word)
            for addr, word in pattern:
                got = memory.read(addr)
                if got != word:
                    if result.failed is BistPhase.PASS:
                        result.failed, result.address = phase, addr
                        result.expected, result.got = word, got
                    result.errors += 1
        return result
