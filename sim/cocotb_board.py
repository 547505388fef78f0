"""cocotb side of the pin-level board simulation: the board top's pins behind a TCP socket.

Started by :func:`ringkv.sim.board_harness.serve_board` (``ringkv sim --board``), never by
pytest directly. The parameters come as JSON in ``RINGKV_BOARD`` (image, sectors, port,
``sys_hz``, ``baud``, the SD adapter's name, ``cut_after``, ``card``).

* ``clk25_0__io`` is driven at ``sys_hz`` (the PLL seam, :mod:`ringkv.boards.ulx3s`), its
  period in whole, even picoseconds (:func:`clock_period_ps`: 16,666 ps at 60 MHz); a top
  with a half-rate SDRAM also has ``sim_clk2x_0__io``, driven at twice that from the same
  instant (the seam's stand-in for the PLL's in-phase ``CLKOS``), the system clock's period
  then a multiple of 4 ps.
* :class:`UartLine` is the host's side of the serial line, like the FT231X: it sends the
  socket's bytes on ``uart_0__rx__io`` as 8N1 characters at the baud rate (bit edges at the
  exact ideal times, rounded to the picosecond, back to back) and receives
  ``uart_0__tx__io``: a falling edge starts a character, every bit is sampled at its middle
  by the ideal bit time, a stop bit read as 0 counts a framing error (the byte is dropped, as
  a real receiver does) and a start bit that is high again at its middle counts a glitch. At
  the default 60 MHz a bit is exactly 20 clocks; at 40 MHz the device's transmitter spreads its
  fractional divisor (40 MHz / 3 Mbaud = 13 1/3 clocks) over the bits, each edge within one
  clock (25 ns of 333 ns) of the ideal one: mid-bit sampling tolerates it. Received bytes go
  to the socket when the line has been idle for two bit times.
  The counters are printed to the simulator's log (stderr) at the end of every connection.
* The SD pins go to the card model chosen by name in :data:`SD_ADAPTERS`: ``"sd4"`` (the
  bitstream's default, native 4-bit: :class:`CocotbSD4Pads` with the strict 4-bit card model
  on the split ``BB`` pads) or ``"spi"`` (:class:`~ringkv.sim.sdcard_model.SDCardSPI`).
  Each adapter takes ``(dut, image, cut_after, card)`` (``card``: the card model's keyword
  arguments, ``--card``) and returns an object with an
  ``async run()`` that serves the card until a :class:`~ringkv.sim.sector_model.PowerCut`
  (then the process exits with :data:`~ringkv.sim.cocotb_server.POWER_CUT_EXIT`, as the
  byte-level server does) or a protocol violation (exit status 1).
* The SDRAM pins (``sdram_0__*``, when the top has its SDRAM: ``sdram`` in the parameters)
  meet the strict pin-level SDRAM model (:class:`CocotbSdramPads` on
  :class:`~ringkv.sim.sdram_model.SdramModel`, with the faults of ``sdram_faults``, if any):
  any violation of the chip's rules stops the simulated board (exit status 1). A top whose
  controller has ``read_delay`` 1 (the board at 60 MHz, its default) meets the model through
  :class:`~ringkv.sim.sdram_model.PinDelay`: the SDRAM takes the pins an edge later.
"""

import json
import os
import queue
import signal
import sys
from fractions import Fraction
from types import SimpleNamespace

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, First, RisingEdge, Timer

from ringkv.defs.sdram import board_chip

from .cocotb_server import POWER_CUT_EXIT, _Socket
from .sd4_model import SDCard4
from .sdcard_model import CocotbSDCard, SDCardSPI
from .sdram_model import PinDelay, SdramModel, SdramPins, SdramViolation
from .sector_model import PowerCut, SectorImage

__all__ = ["UartLine", "SD_ADAPTERS", "CocotbSD4Pads", "SDProtocolViolation", "start_board",
           "clock_period_ps", "serve", "PINS", "CocotbSdramPads", "SDRAM_PADS"]

#: The board top's port names (amaranth-boards' resource names, ``__io`` the pad).
PINS = {"clk": "clk25_0__io", "clk2x": "sim_clk2x_0__io", "rx": "uart_0__rx__io",
        "tx": "uart_0__tx__io",
        "leds": [f"led_{i}__io" for i in range(6)]}


class UartLine:
    """The host end of an 8N1 serial line on two pins; see the module docstring.

    ``send(data)`` drives ``rx`` (a coroutine that returns when the last stop bit ends);
    ``run()`` receives ``tx`` forever, calling ``on_bytes(bytes)`` after each burst.
    Counters: ``framing_errors``, ``glitches``, ``sent``, ``received``.
    """

    def __init__(self, rx_pin, tx_pin, baud: int, on_bytes=None):
        self.rx, self.tx = rx_pin, tx_pin
        self.bit_ps = Fraction(10**12, baud)
        self.on_bytes = on_bytes or (lambda data: None)
        self.framing_errors = self.glitches = self.sent = self.received = 0
        self.rx.value = 1

    async def _hold(self, t, bits):
        """Wait ``bits`` bit times from ideal time ``t`` (ps, a Fraction); return the end."""
        end = t + bits * self.bit_ps
        await Timer(round(end) - round(t), unit="ps")
        return end

    async def send(self, data: bytes, *, stop_bit: int = 1):
        """Characters back to back; ``stop_bit=0`` sends broken frames (framing errors)."""
        t = Fraction(0)
        for byte in data:
            bits = [0] + [(byte >> i) & 1 for i in range(8)] + [stop_bit]
            run = 1
            for i, bit in enumerate(bits):
                if i + 1 < len(bits) and bits[i + 1] == bit:
                    run += 1                    # one timer per run of equal bits
                    continue
                self.rx.value = bit
                t = await self._hold(t, run)
                run = 1
            self.sent += 1
        self.rx.value = 1

    async def run(self):
        pending = bytearray()
        idle = Timer(round(2 * 10 * self.bit_ps), unit="ps")
        while True:
            if int(self.tx.value) == 0:
                await RisingEdge(self.tx)        # a break or a stuck line: wait for idle
            fired = await First(FallingEdge(self.tx), idle) if pending else \
                await FallingEdge(self.tx)
            if fired is idle:
                self.on_bytes(bytes(pending))
                pending.clear()
                continue
            t = await self._hold(Fraction(0), Fraction(1, 2))
            if int(self.tx.value) != 0:
                self.glitches += 1
                continue
            byte = 0
            for k in range(8):
                t = await self._hold(t, 1)
                byte |= int(self.tx.value) << k
            t = await self._hold(t, 1)
            if int(self.tx.value) != 1:
                self.framing_errors += 1
                continue
            pending.append(byte)
            self.received += 1


class SDProtocolViolation(AssertionError):
    """The 4-bit card model saw the host break the SD protocol (or both sides drive a line)."""


class CocotbSD4Pads:
    """The 4-bit card (:class:`~ringkv.sim.sd4_model.SDCard4`) on the board top's native-mode
    pins ``{pin}__clk__io``, ``{pin}__cmd__io``, ``{pin}__dat__io`` (``sd_card_native_0``).

    CMD and DAT0-3 are the platform's ``BB`` pads, split in two sides by
    :func:`ringkv.sim.board_harness.expose_bidir_pads`: the FPGA's drive is read from
    ``{pad}__fpga_oe``/``{pad}__fpga_o``; the pad itself is the line's external side, which
    this adapter drives with the card's bit where the card drives and 1 elsewhere (the pad's
    pull-up, ``PULLMODE=UP``). The FPGA reads its own bit while it drives, the pad otherwise
    (``sim/ecp5_io_sim.v``). The card is stepped at every rising edge of SD CLK with the FPGA's
    drive sampled there (as :class:`~ringkv.sim.sd4_model.CocotbSD4Card`); its outputs change at
    the falling edge in default speed and right after the rising edge in high speed. Strict:
    the first entry in the card's ``violations`` (a protocol breach, or the FPGA and the card
    driving a line at once) raises :class:`SDProtocolViolation` from :meth:`run`.
    """

    def __init__(self, dut, pin, card):
        def pad(name):
            return getattr(dut, f"{pin}__{name}")
        self.clk = pad("clk__io")
        self.cmd, self.cmd_oe, self.cmd_o = (pad("cmd__io"), pad("cmd__io__fpga_oe"),
                                             pad("cmd__io__fpga_o"))
        self.dat, self.dat_oe, self.dat_o = (pad("dat__io"), pad("dat__io__fpga_oe"),
                                             pad("dat__io__fpga_o"))
        self.card = card
        self.cmd.value = 1
        self.dat.value = 0xF

    async def run(self):
        from cocotb.triggers import Edge
        card = self.card
        edge = Edge(self.clk)
        while True:
            await edge
            clk = int(self.clk.value)
            if clk:
                card.clock(int(self.cmd_oe.value), int(self.cmd_o.value),
                           int(self.dat_oe.value), int(self.dat_o.value))
                if card.violations:
                    raise SDProtocolViolation(f"SD card (4-bit): {card.violations[0]}")
            if bool(clk) == card.high_speed:
                self.cmd.value = 1 if card.cmd_out is None else card.cmd_out
                dat = 0xF
                if card.dat_out is not None:
                    mask, value = card.dat_out
                    dat = (value & mask) | (~mask & 0xF)
                self.dat.value = dat


class _DrivenCS:
    """The SPI-mode card with chip select read from the FPGA's drive of the CS/DAT3 pad.

    amaranth-boards declares CS a bidirectional pad (``BB``) and the top drives it always
    (``cs.oe`` = 1), so the line's level is the FPGA's ``{pad}__fpga_o``; the pad's external
    side is held at 1 (the board's pull-up). The SPI model has no pulled-up, undriven CS: the
    FPGA releasing CS after power-up raises :class:`SDProtocolViolation`."""

    def __init__(self, card, pad, oe):
        self.card, self.oe = card, oe
        pad.value = 1

    async def _watch(self):
        await FallingEdge(self.oe)
        raise SDProtocolViolation("SD card (SPI): the FPGA released CS (no model of a "
                                  "pulled-up CS)")

    async def run(self):
        watch = cocotb.start_soon(self._watch())
        try:
            await self.card.run()
        finally:
            watch.cancel()


def _spi_card(dut, image, cut_after, card=None):
    """The SPI-mode card (:class:`~ringkv.sim.sdcard_model.SDCardSPI`) on ``sd_card_spi_0``
    (CS is the active-low DAT3 pad: amaranth-boards declares it ``PinsN``, a ``BB``;
    :class:`_DrivenCS`). A build whose pads are not split (none of ours: the RTL's and the
    gate-level netlist's both are) would have the card read the CS pad itself."""
    cs = "sd_card_spi_0__cs__io"
    split = hasattr(dut, f"{cs}__fpga_o")
    pins = SimpleNamespace(sd__sclk=dut.sd_card_spi_0__clk__io,
                           sd__mosi=dut.sd_card_spi_0__copi__io,
                           sd__miso=dut.sd_card_spi_0__cipo__io,
                           sd__cs_n=getattr(dut, f"{cs}__fpga_o" if split else cs))
    card = CocotbSDCard(pins, "sd", SDCardSPI(image, cut_after=cut_after, **(card or {})))
    if not split:
        return card
    return _DrivenCS(card, getattr(dut, cs), getattr(dut, f"{cs}__fpga_oe"))


def _sd4_card(dut, image, cut_after, card=None):
    """The native-mode card (:class:`~ringkv.sim.sd4_model.SDCard4`, default timing, high
    speed supported) on ``sd_card_native_0`` (:class:`CocotbSD4Pads`)."""
    return CocotbSD4Pads(dut, "sd_card_native_0",
                         SDCard4(image, cut_after=cut_after, **(card or {})))


#: Card models by the board top's storage kind (``ULX3STop.storage``; ``"spi"`` when absent).
SD_ADAPTERS = {"sd4": _sd4_card, "spi": _spi_card}


#: The SDRAM model's pins and the board top's pads (amaranth-boards' ``sdram`` resource; the
#: pads of CS#, RAS#, CAS#, WE# are at their electrical, active-low, levels).
SDRAM_PADS = {"cs_n": "cs", "ras_n": "ras", "cas_n": "cas", "we_n": "we", "cke": "clk_en",
              "ba": "ba", "a": "a", "dqm": "dqm"}


class CocotbSdramPads:
    """The pin-level SDRAM model on the board top's SDRAM pads (``sdram_0__*__io``).

    At every falling edge of the system clock it reads what the I/O cells' registers launched
    at the rising edge before (the command pads; DQ's FPGA side from the split ``BB`` pads'
    ``__fpga_o``/``__fpga_oe``) and steps the model; the model's DQ, if it drives, goes on the
    pads' external side for the input registers at the next rising edge (else 0: a floating
    bus reads anything). The 16 DQ output enables must agree (the PHY drives them from one
    register); the first violation raises :class:`~ringkv.sim.sdram_model.SdramViolation`.

    Speed: while no burst is in flight and CS# is high (no command), it waits for CS# to fall
    or DQ's output enables to change instead of waking at every clock, and advances the model
    over the clocks between at once (:meth:`~ringkv.sim.sdram_model.SdramModel.advance`: the
    same refresh and row-open checks); the controller refreshes every ~270 clocks, so an idle
    SDRAM costs a wake-up per refresh, not one per clock."""

    def __init__(self, dut, model: SdramModel, clk, period_ps: int, prefix: str = "sdram_0",
                 pin_delay: int = 0):
        self.model, self.clk, self.period_ps = model, clk, period_ps
        self.delay = PinDelay(pin_delay)
        self.pads = {k: getattr(dut, f"{prefix}__{v}__io") for k, v in SDRAM_PADS.items()}
        self.dq = getattr(dut, f"{prefix}__dq__io")
        self.dq_o = getattr(dut, f"{prefix}__dq__io__fpga_o")
        self.dq_oe = getattr(dut, f"{prefix}__dq__io__fpga_oe")
        self.dq.value = 0
        self.driven = 0

    async def run(self):
        from cocotb.triggers import Edge
        from cocotb.utils import get_sim_time

        model, falling = self.model, FallingEdge(self.clk)
        cs, oe_pad = self.pads["cs_n"], self.dq_oe
        last = None                         # sim time (ps) of the last step
        while True:
            if model.quiet and self.driven == 0 and int(cs.value) == 1 and last is not None \
                    and not self.delay.clocks:
                await First(FallingEdge(cs), Edge(oe_pad))
            await falling
            now = get_sim_time("ps")
            if last is not None:
                model.advance(round((now - last) / self.period_ps) - 1)
            last = now
            values = {k: int(p.value) for k, p in self.pads.items()}
            oe = int(oe_pad.value)
            if oe not in (0, 0xFFFF):
                raise SdramViolation(model.cycle + 1, "bus", f"DQ output enables {oe:#06x} "
                                     f"disagree")
            drive = model.step(self.delay(SdramPins(**values, dq=int(self.dq_o.value),
                                                    dq_oe=oe & 1)))
            value = 0 if drive is None else drive
            if value != self.driven:
                self.dq.value = value
                self.driven = value


def _sdram(dut, params):
    """The SDRAM model on the pads, or None (a top without its SDRAM)."""
    sdram = params.get("sdram")
    if not sdram:
        return None
    model = SdramModel(board_chip(sdram["part"]), sdram["tck_ns"],
                       **{k: tuple(v) if isinstance(v, list) else v
                          for k, v in (params.get("sdram_faults") or {}).items()})
    # at half rate the pads' registers and the SDRAM run on the seam's second clock
    fast = sdram.get("rate", 1) == 2
    return CocotbSdramPads(dut, model, getattr(dut, PINS["clk2x" if fast else "clk"]),
                           _board_period_ps(params) // (2 if fast else 1),
                           pin_delay=sdram.get("read_delay", 0))


async def _serve_sdram(sdram):
    try:
        await sdram.run()
    except SdramViolation as bad:       # strict: the simulated board stops, loudly
        print(f"RINGKV-SIM SDRAM violation: {bad}", file=sys.stderr, flush=True)
        os._exit(1)


async def _serve_card(card):
    try:
        await card.run()
    except PowerCut as cut:
        print(f"RINGKV-SIM power cut: {cut}", flush=True)
        os._exit(POWER_CUT_EXIT)
    except SDProtocolViolation as bad:      # strict: the simulated board stops, loudly
        print(f"RINGKV-SIM SD protocol violation: {bad}", file=sys.stderr, flush=True)
        os._exit(1)


def clock_period_ps(sys_hz: float, rate: int = 1) -> int:
    """The board clock's period on the simulated ``clk25`` pin: whole picoseconds (the
    simulation's precision) and even, since cocotb's ``Clock`` splits a period into two equal
    halves and refuses an odd one. 25,000 ps at 40 MHz (exact); 16,666 ps at 60 MHz, whose
    16,666.7 ps would round to an odd 16,667: the simulated board runs 40 ppm fast
    (60.0024 MHz), far inside what the UART's mid-bit sampling tolerates; the SDRAM model
    counts clocks, not time. With the half-rate SDRAM (``rate`` 2) a multiple of 4 ps, so that
    the second clock's half period is whole picoseconds too and every other edge of it falls
    at the instant of one of the system clock's (16,668 ps at 60 MHz, 0.01 % slow). Every use
    of the period (the clocks, the SDRAM adapter's skipped clocks, the waits) takes this
    one."""
    step = 2 * rate
    return step * round(10**12 / sys_hz / step)


def _board_period_ps(params: dict) -> int:
    return clock_period_ps(params["sys_hz"], (params.get("sdram") or {}).get("rate", 1))


def start_board(dut, params: dict, on_bytes=None):
    """Clock, UART line and SD card on the pins; returns ``(line, image, card)``."""
    period_ps = _board_period_ps(params)
    Clock(getattr(dut, PINS["clk"]), period_ps, unit="ps").start()
    if (params.get("sdram") or {}).get("rate", 1) == 2:
        # the seam's second clock (ULX3STop's SIM_CLK2X), started in the same instant
        Clock(getattr(dut, PINS["clk2x"]), period_ps // 2, unit="ps").start()
    line = UartLine(getattr(dut, PINS["rx"]), getattr(dut, PINS["tx"]), params["baud"],
                    on_bytes)
    image = SectorImage(params["image"], params["sectors"])
    card = SD_ADAPTERS[params.get("storage", "spi")](dut, image, params.get("cut_after"),
                                                     params.get("card"))
    cocotb.start_soon(_serve_card(card))
    sdram = _sdram(dut, params)
    if sdram is not None:
        cocotb.start_soon(_serve_sdram(sdram))
    cocotb.start_soon(line.run())
    return line, image, card


@cocotb.test(timeout_time=None)
async def serve(dut):
    params = json.loads(os.environ["RINGKV_BOARD"])
    # Ctrl-C at a terminal reaches the whole foreground process group: the ringkv process
    # that started this simulator stops it; here it would only print a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = _Socket(params["port"])
    line, image, _ = start_board(dut, params, on_bytes=sock.send)
    period_ps = _board_period_ps(params)
    # The board is configured and out of reset before a host opens its port: the URL is
    # printed once the PLL stand-in has locked and the power-on reset hold is over. (A byte
    # that arrives while the reset is held is lost, as on the board; the RTL simulation runs
    # past those 272 cycles before a host can connect, the gate-level one does not: the
    # first request of every gate-level session was lost and the host waited out its
    # timeout.)
    await Timer((params["reset_cycles"] + 16) * period_ps, unit="ps")
    print(f"RINGKV-SIM listening on socket://127.0.0.1:{sock.port}", flush=True)
    connections = idle_rounds = 0
    while True:
        try:
            chunk = sock.rx.get_nowait()
        except queue.Empty:
            chunk = b""
        if chunk is None:
            connections += 1
            # the line's own counters, per connection, in the simulator's log (stderr)
            print(f"RINGKV-SIM uart line after connection {connections}: {line.sent} B sent, "
                  f"{line.received} B received, {line.framing_errors} framing errors, "
                  f"{line.glitches} glitches", file=sys.stderr, flush=True)
            if params.get("once") and connections >= 1:
                break
            continue
        if not chunk:
            idle_rounds += 1
            if idle_rounds > 64:
                sock.closed.wait(0.0005)    # nothing in flight: let the host catch up
            await Timer(256 * period_ps, unit="ps")
            continue
        idle_rounds = 0
        await line.send(chunk)
    image.close()
    sock.listener.close()
