"""The port arbiter: round robin between the user ports' command streams, each command split
into bursts of ``BL`` words for the bank machines.

Golden model: :func:`ringkv.host.golden.sdram.split_command`.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int
from ringkv.defs.sdram import SdramChip, check_burst_length

__all__ = ["UserPortSignature", "command_layout", "burst_layout", "PortArbiter"]


def command_layout(addr_bits: int, count_bits: int) -> data.StructLayout:
    """A port command: ``addr`` the first 16-bit word (its low ``log2(BL)`` bits are
    ignored: transfers are whole bursts), ``write``, ``count`` the number of ``BL``-word
    bursts (0: nothing is done)."""
    return data.StructLayout({"addr": addr_bits, "write": 1, "count": count_bits})


def burst_layout(chip: SdramChip, port_bits: int) -> data.StructLayout:
    return data.StructLayout({"bank": max(chip.bank_bits, 1), "row": chip.row_bits,
                              "col": chip.col_bits, "write": 1, "port": max(port_bits, 1)})


class UserPortSignature(wiring.Signature):
    """A user port, from the user's side: ``cmd`` commands out, ``w`` write data out (one
    word and its byte mask a transfer, ``mask`` bit set: that byte is not written, as DQM),
    ``r`` read data in, in command order. ``rate`` 2: a transfer is two 16-bit words (the
    one at the even address in the low half)."""

    def __init__(self, addr_bits: int, count_bits: int, rate: int = 1):
        super().__init__({
            "cmd": Out(stream.Signature(command_layout(addr_bits, count_bits))),
            "w": Out(stream.Signature(data.StructLayout({"data": 16 * rate,
                                                         "mask": 2 * rate}))),
            "r": In(stream.Signature(16 * rate)),
        })


class PortArbiter(wiring.Component):
    """Takes one command at a time from ``i[0..ports-1]``, in round-robin order, and emits its
    bursts on ``o`` ({bank, row, col, write, port}; word address = row | bank | col), one a
    clock while ``o.ready``. ``pause`` (a refresh is owed) holds the bursts back.

    Latency: a command's first burst is on ``o`` the clock after the command's transfer;
    commands are taken back to back (the next in the clock the last burst leaves).
    """

    def __init__(self, chip: SdramChip, *, ports: int, bl: int, count_bits: int):
        check_int("Ports", ports, low=1, high=16)
        check_burst_length(bl)
        check_int("Count width", count_bits, low=1, high=24, unit=" bits")
        self._chip, self._ports, self._bl = chip, ports, bl
        self._port_bits = (ports - 1).bit_length()
        addr_bits = (chip.words - 1).bit_length()
        self._addr_bits = addr_bits
        layout = command_layout(addr_bits, count_bits)
        super().__init__({
            "i": In(stream.Signature(layout)).array(ports),
            "pause": In(1),
            "o": Out(stream.Signature(burst_layout(chip, self._port_bits))),
        })

    def elaborate(self, platform):
        m = Module()
        chip, bl, n = self._chip, self._bl, self._ports
        addr = Signal(self._addr_bits)
        left = Signal(len(self.i[0].payload.count))
        write = Signal()
        port = Signal(max(self._port_bits, 1))
        last = Signal(max(self._port_bits, 1), init=n - 1)   # the port served last
        busy = left != 0

        cb, bb = chip.col_bits, chip.bank_bits
        m.d.comb += [
            self.o.valid.eq(busy & ~self.pause),
            self.o.payload.col.eq(addr[:cb] & ~(bl - 1)),
            self.o.payload.bank.eq(addr[cb:cb + bb]),
            self.o.payload.row.eq(addr[cb + bb:]),
            self.o.payload.write.eq(write), self.o.payload.port.eq(port),
        ]
        leaving = self.o.valid & self.o.ready
        with m.If(leaving):
            m.d.sync += [addr.eq(addr + bl), left.eq(left - 1)]
        free = ~busy | (leaving & (left == 1))
        # round robin: the first valid port after the one served last
        with m.If(free):
            chosen = Signal(max(self._port_bits, 1))
            any_valid = Signal()
            for k in range(n):
                with m.If(last == k):
                    for offset in reversed(range(1, n + 1)):
                        p = (k + offset) % n
                        with m.If(self.i[p].valid):
                            m.d.comb += [chosen.eq(p), any_valid.eq(1)]
            with m.If(any_valid):
                for p in range(n):
                    with m.If(chosen == p):
                        m.d.comb += self.i[p].ready.eq(1)
                        m.d.sync += [addr.eq(self.i[p].payload.addr),
                                     left.eq(self.i[p].payload.count),
                                     write.eq(self.i[p].payload.write), port.eq(p),
                                     last.eq(p)]
        return m
