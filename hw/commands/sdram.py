"""Dispatcher unit: the board's SDRAM self-test (SDRAM_TEST), in builds with an SDRAM only.

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop` that only
a build with ``sdram_test=True`` has (any other build answers ``UNKNOWN_OP``, like a key op in
an open build). The request's ``tests``, ``words`` and ``pause_ms`` go to the top's
``sdram_test`` port (:class:`~ringkv.hw.sdram.bist.BistSignature`: the ULX3S top connects it to
its :class:`~ringkv.hw.sdram.bist.SdramBist`), and the answer, ``OK`` with
:data:`~ringkv.defs.protocol.SDRAM_TEST_RESPONSE`, comes when the self-test's result does: a
failed test is a result (``failed`` != 0), not an error status.

The self-test writes over the whole SDRAM: the board top resets its hot tier while the test
runs (every copy in SDRAM dropped; the records stay on the card). The request is refused
``NOT_READY`` while the recovery scan runs (it uses the storage port, and so the tier), as the
other requests of :data:`~ringkv.defs.protocol.RECOVERY_SCAN_GATED`. Latency: the self-test's
(``hw/sdram/bist.py``: about 1.3 s for the whole 32 MB at 40 MHz, plus the pause); the
dispatcher answers nothing else meanwhile.
"""

from amaranth import Signal

from ringkv.defs.protocol import Op

from ..sdram.bist import BIST_RESULT
from .dispatch import CommandUnit

__all__ = ["SdramTestUnit"]


class SdramTestUnit(CommandUnit):
    OPS = (Op.SDRAM_TEST,)
    SDRAM = True

    def signals(self, d):
        self.result = Signal(BIST_RESULT)

    def responses(self, d):
        r = self.result
        return {Op.SDRAM_TEST: dict(failed=r.failed, address=r.address, expected=r.expected,
                                    got=r.got, errors=r.errors, words=r.words,
                                    chip_words=r.chip_words, cycles=r.cycles)}

    def dispatch(self, d):
        m = d.m
        with m.Case(Op.SDRAM_TEST.value):
            m.next = "SDRAM_TEST_CMD"

    def states(self, d):
        m, port = d.m, d.top.sdram_test
        with m.State("SDRAM_TEST_CMD"):
            m.d.comb += [port.cmd.valid.eq(1),
                         port.cmd.payload.tests.eq(d.arg(Op.SDRAM_TEST, "tests")),
                         port.cmd.payload.words.eq(d.arg(Op.SDRAM_TEST, "words")),
                         port.cmd.payload.pause_ms.eq(d.arg(Op.SDRAM_TEST, "pause_ms"))]
            with m.If(port.cmd.ready):
                m.next = "SDRAM_TEST_WAIT"
        with m.State("SDRAM_TEST_WAIT"):
            m.d.comb += port.result.ready.eq(1)
            with m.If(port.result.valid):
                m.d.sync += self.result.eq(port.result.payload)
                d.ok_fixed(Op.SDRAM_TEST)
