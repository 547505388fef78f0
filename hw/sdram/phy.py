"""The SDRAM PHY: one register stage between the controller and the pins, both ways.

Output pins (command, address, DQM, DQ and its enable) leave from a register and DQ comes
back through one, so that on the ECP5 each bit can sit in the I/O cell's own flip-flop and the
pin timing does not depend on placement (``docs/blocks/sdram.md``, "The clock and its phase").
"""

from amaranth import *
from amaranth.lib import io, wiring
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

    ``pads`` (optional): the platform's SDRAM resource requested with ``dir="-"``
    (``platform.request("sdram", 0, dir="-")``, amaranth-boards' ``SDRAMResource``). With it the
    registers are the I/O cells' own (``io.FFBuffer``: on the ECP5 ``OFS1P3DX``/``IFS1P3DX`` in
    the IOLOGIC, so the pin timing does not depend on placement), DQ is a registered tristate,
    and the SDRAM clock leaves through an ``io.DDRBuffer`` (``ODDRX1F``: 1 then 0) clocked by the
    domain ``sdram_clk_domain``, the PLL output 90 degrees behind ``sync``
    (``docs/blocks/sdram.md``); ``pins`` then stays at its reset values. Without it (simulation,
    out-of-context synthesis) the same registers are fabric flip-flops driving ``pins``.

    Latency: one clock each way. A command on ``dfi`` in clock ``c`` is on the pins after edge
    ``c + 1``; the word the SDRAM returns for a READ launched at edge ``e`` is in ``rdata``
    after edge ``e + CL`` (the 90-degree SDRAM clock of ``docs/blocks/sdram.md``). CKE is held
    high from reset: the power-up wait runs with the clock and CKE stable and INHIBIT on the
    command pins (``cs_n`` resets high).
    """

    def __init__(self, chip: SdramChip, *, pads=None, sdram_clk_domain: str = "sdram"):
        self._chip, self._pads, self._clk_domain = chip, pads, sdram_clk_domain
        super().__init__({"dfi": In(DfiSignature(chip)), "pins": Out(SdramPinsSignature(chip))})

    def elaborate(self, platform):
        m = Module()
        dfi, pins = self.dfi, self.pins
        if self._pads is not None:
            return self._elaborate_pads(m)
        m.d.sync += [
            pins.cke.eq(1),
            Cat(pins.we_n, pins.cas_n, pins.ras_n, pins.cs_n).eq(dfi.cmd),
            pins.ba.eq(dfi.ba), pins.a.eq(dfi.a), pins.dqm.eq(dfi.dqm),
            pins.dq_o.eq(dfi.dq_o), pins.dq_oe.eq(dfi.dq_oe),
            dfi.rdata.eq(pins.dq_i),
        ]
        return m

    def _elaborate_pads(self, m):
        pads, dfi = self._pads, self.dfi
        # the resource's cs/ras/cas/we are active high (the platform inverts the pins)
        outputs = {"clk_en": C(1), "cs": ~dfi.cmd[3], "ras": ~dfi.cmd[2], "cas": ~dfi.cmd[1],
                   "we": ~dfi.cmd[0], "ba": dfi.ba, "a": dfi.a, "dqm": dfi.dqm}
        for name, value in outputs.items():
            m.submodules[f"io_{name}"] = buf = io.FFBuffer("o", getattr(pads, name))
            m.d.comb += buf.o.eq(value)
        m.submodules.io_dq = dq = io.FFBuffer("io", pads.dq)
        m.d.comb += [dq.o.eq(dfi.dq_o), dq.oe.eq(dfi.dq_oe), dfi.rdata.eq(dq.i)]
        m.submodules.io_clk = clk = io.DDRBuffer("o", pads.clk, o_domain=self._clk_domain)
        m.d.comb += [clk.o[0].eq(1), clk.o[1].eq(0)]
        return m
