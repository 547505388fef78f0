"""The SDRAM PHY: one register stage between the controller and the pins, both ways.

Output pins (command, address, DQM, DQ and its enable) leave from a register and DQ comes
back through one, so that on the ECP5 each bit can sit in the I/O cell's own flip-flop and the
pin timing does not depend on placement (``docs/blocks/sdram.md``, "The clock and its phase").
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.sdram import Cmd, SdramChip

__all__ = ["SdramPinsSignature", "DfiSignature", "SdramPhy"]


class SdramPinsSignature(wiring.Signature):
    """The SDRAM's pins as the controller sees them (x16). DQ is split into ``dq_o``,
    ``dq_oe`` and ``dq_i`` (the tristate buffer is the platform's); ``dqm`` bit 0 is LDQM.
    The SDRAM clock is not here: it comes from a PLL output (``docs/blocks/sdram.md``)."""

    def __init__(self, chip: SdramChip):
        super().__init__({
            "cke": Out(1), "cs_n": Out(1, init=1), "ras_n": Out(1, init=1),
            "cas_n": Out(1, init=1), "we_n": Out(1, init=1), "ba": Out(chip.bank_bits),
            "a": Out(chip.addr_bits), "dqm": Out(2, init=3), "dq_o": Out(16), "dq_oe": Out(1),
            "dq_i": In(16),
        })


class DfiSignature(wiring.Signature):
    """The controller's side of the PHY: ``cmd`` a :class:`~ringkv.defs.sdram.Cmd` value,
    bank, address, write data with its enable and byte mask; ``rdata`` the DQ input register."""

    def __init__(self, chip: SdramChip):
        super().__init__({
            "cmd": Out(4, init=Cmd.INHIBIT.value), "ba": Out(chip.bank_bits),
            "a": Out(chip.addr_bits), "dq_o": Out(16), "dq_oe": Out(1), "dqm": Out(2, init=3),
            "rdata": In(16),
        })


class SdramPhy(wiring.Component):
    """Registers every pin once: ``dfi`` (from the controller) -> ``pins``, ``pins.dq_i`` ->
    ``dfi.rdata``.

    Latency: one clock each way. A command on ``dfi`` in clock ``c`` is on the pins after edge
    ``c + 1``; the word the SDRAM returns for a READ launched at edge ``e`` is in ``rdata``
    after edge ``e + CL`` (the 90-degree SDRAM clock of ``docs/blocks/sdram.md``). CKE is held
    high from reset: the power-up wait runs with the clock and CKE stable and INHIBIT on the
    command pins (``cs_n`` resets high).
    """

    def __init__(self, chip: SdramChip):
        self._chip = chip
        super().__init__({"dfi": In(DfiSignature(chip)), "pins": Out(SdramPinsSignature(chip))})

    def elaborate(self, platform):
        m = Module()
        dfi, pins = self.dfi, self.pins
        m.d.sync += [
            pins.cke.eq(1),
            Cat(pins.we_n, pins.cas_n, pins.ras_n, pins.cs_n).eq(dfi.cmd),
            pins.ba.eq(dfi.ba), pins.a.eq(dfi.a), pins.dqm.eq(dfi.dqm),
            pins.dq_o.eq(dfi.dq_o), pins.dq_oe.eq(dfi.dq_oe),
            dfi.rdata.eq(pins.dq_i),
        ]
        return m
