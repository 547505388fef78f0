"""Golden models of the SDRAM controller's pieces (``ringkv.hw.sdram``), independent of the
gateware: what the ports read back (:class:`SdramGolden`), how a command splits into bursts
(:func:`split_command`), the power-up sequence (:func:`init_commands`), the refresh interval
(:func:`refresh_interval`), a bank machine's decisions (:class:`BankGolden`) and where the
SDRAM sector store (``ringkv.hw.storage.sdram_store``) keeps a sector's bytes
(:func:`sector_words`). The chip's rules themselves are checked by the pin-level model,
``ringkv.sim.sdram_model``.
"""

import math

from ringkv.defs.record import SECTOR
from ringkv.defs.sdram import Cmd, SdramChip, SdramTiming

__all__ = ["SdramGolden", "split_command", "init_commands", "refresh_interval",
           "refresh_ceiling", "BankGolden", "SECTOR_WORDS", "sector_words"]

#: 16-bit words per 512-byte sector in the SDRAM sector store
SECTOR_WORDS = SECTOR // 2


class SdramGolden:
    """The memory as the ports see it: bytes written so far (``None``: never written, the chip
    returns whatever it holds)."""

    def __init__(self):
        self.bytes: dict[int, int] = {}

    def write(self, addr: int, words, masks=None):
        for i, word in enumerate(words):
            mask = 0 if masks is None else masks[i]
            for byte in (0, 1):
                if not mask >> byte & 1:
                    self.bytes[2 * (addr + i) + byte] = word >> 8 * byte & 0xFF

    def read(self, addr: int, n: int) -> list[tuple[int | None, int | None]]:
        """Per word ``(low byte, high byte)``, each ``None`` if never written."""
        return [(self.bytes.get(2 * (addr + i)), self.bytes.get(2 * (addr + i) + 1))
                for i in range(n)]

    def matches(self, addr: int, got) -> bool:
        for (lo, hi), word in zip(self.read(addr, len(got)), got, strict=True):
            if (lo is not None and word & 0xFF != lo) or (hi is not None and word >> 8 != hi):
                return False
        return True


def sector_words(lba: int, data: bytes, *, base: int = 0) -> dict[int, int]:
    """Word address -> word of the sectors ``data`` (a whole number of them) written at sector
    ``lba`` of the SDRAM sector store whose sector 0 is at word ``base``: sector ``s`` is the
    256 words from ``base + s * 256``, and byte ``2 * i`` of it is the low byte of word ``i``,
    byte ``2 * i + 1`` the high byte (little endian)."""
    if len(data) % SECTOR:
        raise ValueError(f"data must be whole sectors of {SECTOR} bytes, not {len(data)} bytes")
    first = base + lba * SECTOR_WORDS
    return {first + i: data[2 * i] | data[2 * i + 1] << 8 for i in range(len(data) // 2)}


def split_command(chip: SdramChip, bl: int, addr: int, count: int) -> list[tuple[int, int, int]]:
    """The bursts ``(bank, row, col)`` of a port command: ``count`` bursts of ``bl`` words from
    word ``addr`` (its low bits ignored), the address ``row | bank | col`` from the top."""
    out = []
    addr &= ~(bl - 1)
    for k in range(count):
        word = (addr + k * bl) % chip.words
        col = word % chip.cols
        bank = word // chip.cols % chip.banks
        row = word // (chip.cols * chip.banks)
        out.append((bank, row, col))
    return out


def init_commands(t: SdramTiming, mode: int, refreshes: int) -> list[tuple[int, Cmd, int]]:
    """``(clock, command, A)`` of the power-up sequence from reset, and the clock at which the
    bus is the controller's, as ``(clock, None, 0)`` last."""
    out = [(t.power_up, Cmd.PRECHARGE, 1 << 10)]
    clock = t.power_up + t.rp
    for _ in range(refreshes):
        out.append((clock, Cmd.REFRESH, 0))
        clock += t.rfc
    out.append((clock, Cmd.MODE, mode))
    out.append((clock + t.mrd, None, 0))
    return out


def refresh_interval(chip: SdramChip, tck_ns: float) -> int:
    """Clocks between the refresher's refreshes: 7/8 of the datasheet's average interval
    (64 ms / 8192 rows), so that late refreshes still make the period."""
    return math.floor(chip.refresh_ns / chip.refreshes * 7 / 8 / tck_ns)


def refresh_ceiling(t: SdramTiming, interval: int) -> float:
    """The most a controller of this refresh policy can move on one long stream in one
    direction: every clock a word but the ``tRP + tRFC`` clocks of each refresh (PRECHARGE ALL
    to the end of ``tRFC``) once per ``interval``."""
    return 1 - (t.rp + t.rfc) / interval


class BankGolden:
    """The bank machine's decisions, clock by clock (``ringkv.hw.sdram.bank.BankMachine``).

    ``outputs()`` is what the machine says in the current clock: ``want_act``, ``want_pre``,
    ``col_ready`` and ``head`` were decided in the clock before, from the state then (a counter
    at one then is zero now), and are all false in the clock after a command to this bank
    (PRECHARGE ALL included) or while a burst that entered an empty queue is not yet seen;
    ``idle``, ``pre_ok``, ``open`` and ``row`` are the state now. ``clock(push, issued)``
    advances one clock: ``push`` a burst ``(row, col, write, port)`` offered to its queue (or
    ``None``; returns whether it was taken), ``issued`` the command on the bus ``(Cmd, ba,
    a)``. Each counter holds the clocks until its command is allowed: a command at clock ``c``
    that needs ``k`` clocks before the next makes it allowed at ``c + k``, and a later
    requirement never shortens an earlier one.

    ``rate`` 2 (a half-rate controller): ``t`` and ``bl`` are the SDRAM's; the machine counts
    its own clocks, two SDRAM clocks each, every interval rounded up (the write recovery from
    the burst's last word, ``bl - 1`` SDRAM clocks after the WRITE).
    """

    def __init__(self, index: int, t: SdramTiming, *, bl: int, depth: int = 4, rate: int = 1):
        self.index, self.t, self.bl, self.depth, self.rate = index, t, bl, depth, rate
        self.queue: list[tuple] = []
        self.open, self.row = False, 0
        self.to_act = self.to_col = self.to_pre = 0
        self._said = {"want_act": False, "want_pre": False, "col_ready": False, "head": None}

    def outputs(self) -> dict:
        return {**self._said, "idle": not self.queue, "pre_ok": self.to_pre == 0,
                "open": self.open, "row": self.row}

    def _decide(self, touched: bool) -> dict:
        """What the machine will say in the next clock, from its state in this one."""
        head = self.queue[0] if self.queue else None
        ask = head is not None and not touched
        hit = ask and self.open and self.row == head[0]
        return {"want_act": ask and not self.open and self.to_act <= 1,
                "want_pre": ask and self.open and not hit and self.to_pre <= 1,
                "col_ready": hit and self.to_col <= 1, "head": head}

    def clock(self, push, issued) -> bool:
        cmd, ba, a = issued
        t, bl, mine = self.t, self.bl, ba == self.index

        def ck(sdram_clocks):
            return -(-sdram_clocks // self.rate)

        nxt = {k: max(getattr(self, k) - 1, 0) for k in ("to_act", "to_col", "to_pre")}
        touched = ((mine and cmd in (Cmd.ACTIVE, Cmd.PRECHARGE, Cmd.READ, Cmd.WRITE))
                   or (cmd is Cmd.PRECHARGE and a >> 10 & 1 == 1))
        self._said = self._decide(touched)

        def need(name, k):
            nxt[name] = max(nxt[name], k - 1)

        if cmd is Cmd.ACTIVE and mine:
            self.open, self.row = True, a
            need("to_col", ck(t.rcd))
            need("to_pre", ck(t.ras))
            need("to_act", ck(t.rc))
        elif cmd is Cmd.READ and mine:
            need("to_pre", ck(bl))
        elif cmd is Cmd.WRITE and mine:
            need("to_pre", ck(bl - 1 + t.wr))
        elif cmd is Cmd.PRECHARGE and (mine or a >> 10 & 1):
            self.open = False
            need("to_act", ck(t.rp))
        taken = push is not None and len(self.queue) < self.depth
        if cmd in (Cmd.READ, Cmd.WRITE) and mine:
            self.queue.pop(0)
        if taken:
            self.queue.append(push)
        self.to_act, self.to_col, self.to_pre = nxt["to_act"], nxt["to_col"], nxt["to_pre"]
        return taken
