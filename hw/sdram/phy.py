"""The SDRAM PHY: one register stage between the controller and the pins, both ways.

Output pins (command, address, DQM, DQ and its enable) leave from a register and DQ comes
back through one, so that on the ECP5 each bit can sit in the I/O cell's own flip-flop and the
pin timing does not depend on placement (``docs/blocks/sdram.md``, "The clock and its phase").

At ``rate`` 2 (half rate, ``docs/blocks/sdram.md`` "Half rate") those registers run at twice
the controller's clock, in a domain from the same PLL whose every other edge is the
controller's: the controller hands over one command and two words a clock, the PHY puts the
command and the first word on the pins in the first SDRAM clock and the second word in the
next, and gives back the two words the SDRAM returned in two SDRAM clocks. The field does the
same (LiteDRAM's ``HalfRateGENSDRPHY``, LiteX's ULX3S target's ``sdram_rate="1:2"``); the
design here is our own.
"""

from amaranth import *
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.sdram import Cmd, SdramChip, check_rate

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
    bank, address, write data with its enable and byte mask; ``rdata`` the DQ input register.
    At ``rate`` 2 the data, its mask and ``rdata`` carry two words, the first SDRAM clock's in
    the low half."""

    def __init__(self, chip: SdramChip, rate: int = 1):
        super().__init__({
            "cmd": Out(4, init=Cmd.INHIBIT.value), "ba": Out(chip.bank_bits),
            "a": Out(chip.addr_bits), "dq_o": Out(16 * rate), "dq_oe": Out(1),
            "dqm": Out(2 * rate, init=(1 << 2 * rate) - 1), "rdata": In(16 * rate),
        })


def half_rate_read_even(cl: int, read_delay: int = 0) -> bool:
    """At rate 2: whether the first word of a READ's burst reaches the input register at an
    edge that is also the controller's (then a burst's words pair up as the PHY's last two
    input words at the controller's next edge; otherwise the pair is one fast clock older).
    The READ is on the pins from the fast edge ``2c + 3`` (its choice in controller clock
    ``c``, the command register, the PHY's output register at the middle of the next clock),
    its first word in the input register at edge ``2c + 3 + CL + read_delay``."""
    return (3 + cl + read_delay) % 2 == 0


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

    ``rate`` 2: the pins' registers (and the I/O cells' with ``pads``) are in ``fast_domain``,
    twice the controller's clock with every other edge on the controller's (the same PLL);
    ``sdram_clk_domain`` is then the SDRAM clock at that rate. ``dfi`` as registered by the
    controller in clock ``c`` is on the pins from the fast edge in the middle of clock ``c + 1``
    (the command and the low word) and from the controller's edge after it (INHIBIT, the high
    word, the same bank, address and DQ enable). ``rdata`` (a controller register) holds two
    words the SDRAM returned at consecutive fast edges, paired as
    :func:`half_rate_read_even` says for ``read_cl`` and ``read_delay`` (the controller's
    :func:`~ringkv.hw.sdram.controller.read_latency` counts the clocks).
    """

    def __init__(self, chip: SdramChip, *, pads=None, sdram_clk_domain: str = "sdram",
                 rate: int = 1, fast_domain: str = "sync2x", read_cl: int = 2,
                 read_delay: int = 0):
        check_rate(rate)
        self._chip, self._pads, self._clk_domain = chip, pads, sdram_clk_domain
        self._rate, self._fast = rate, fast_domain
        self._read_even = half_rate_read_even(read_cl, read_delay)
        super().__init__({"dfi": In(DfiSignature(chip, rate)),
                          "pins": Out(SdramPinsSignature(chip))})

    def elaborate(self, platform):
        m = Module()
        dfi, pins = self.dfi, self.pins
        if self._rate == 2:
            return self._elaborate_half_rate(m)
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

    def _elaborate_half_rate(self, m):
        dfi, pins, fast = self.dfi, self.pins, self._fast
        # which half of the controller's clock the fast clock is in: a register that toggles
        # every controller clock, seen by the fast domain half a controller clock later,
        # differs from it in the first half (the fast edge in the middle of the controller's
        # clock ends that half), and agrees in the second
        toggle, seen, first = Signal(), Signal(), Signal()
        m.d.sync += toggle.eq(~toggle)
        m.d[fast] += seen.eq(toggle)
        m.d.comb += first.eq(toggle != seen)
        # the first SDRAM clock: the command and the low word; the second: INHIBIT, the high
        # word (the command register keeps its value through the controller's clock, so both
        # halves come from one command)
        outputs = {"cmd": Mux(first, dfi.cmd, Cmd.INHIBIT.value), "ba": dfi.ba, "a": dfi.a,
                   "dqm": Mux(first, dfi.dqm[:2], dfi.dqm[2:]),
                   "dq_o": Mux(first, dfi.dq_o[:16], dfi.dq_o[16:]), "dq_oe": dfi.dq_oe}
        word = [Signal(16, name=f"rd_word{k}") for k in range(3)]   # the newest first
        m.d[fast] += [word[1].eq(word[0]), word[2].eq(word[1])]
        pair = Cat(word[1], word[0]) if self._read_even else Cat(word[2], word[1])
        m.d.sync += dfi.rdata.eq(pair)
        if self._pads is None:
            m.d[fast] += [
                pins.cke.eq(1),
                Cat(pins.we_n, pins.cas_n, pins.ras_n, pins.cs_n).eq(outputs["cmd"]),
                pins.ba.eq(outputs["ba"]), pins.a.eq(outputs["a"]),
                pins.dqm.eq(outputs["dqm"]), pins.dq_o.eq(outputs["dq_o"]),
                pins.dq_oe.eq(outputs["dq_oe"]), word[0].eq(pins.dq_i),
            ]
            return m
        pads, cmd = self._pads, outputs["cmd"]
        values = {"clk_en": C(1), "cs": ~cmd[3], "ras": ~cmd[2], "cas": ~cmd[1], "we": ~cmd[0],
                  "ba": outputs["ba"], "a": outputs["a"], "dqm": outputs["dqm"]}
        for name, value in values.items():
            m.submodules[f"io_{name}"] = buf = io.FFBuffer("o", getattr(pads, name),
                                                           o_domain=fast)
            m.d.comb += buf.o.eq(value)
        m.submodules.io_dq = dq = io.FFBuffer("io", pads.dq, i_domain=fast, o_domain=fast)
        m.d.comb += [dq.o.eq(outputs["dq_o"]), dq.oe.eq(outputs["dq_oe"]),
                     word[0].eq(dq.i)]
        m.submodules.io_clk = clk = io.DDRBuffer("o", pads.clk, o_domain=self._clk_domain)
        m.d.comb += [clk.o[0].eq(1), clk.o[1].eq(0)]
        return m
