"""``SDRAM_TEST`` through the whole top (Amaranth simulator): a build with the self-test hands
the request's fields to its ``sdram_test`` port and answers with the result, field for field
(a stand-in for the BIST here; the BIST itself is ``tests/hw/sdram/test_bist.py``, the board
``tests/boards/test_board_sim.py``); while the recovery scan runs it answers ``NOT_READY``;
a build without it answers ``UNKNOWN_OP``; both answer every other request as before."""

from top_helpers import make_top, req

from ringkv.defs.protocol import SDRAM_TEST_RESPONSE, Op, Status, build_requests
from ringkv.hw.commands import SdramTestUnit
from ringkv.sim.streams import tick_until
from ringkv.sim.top_bench import image_for, run_top

RESULT = dict(failed=4, address=0x00AB_CDEF, expected=0x1234, got=0x1235, errors=77,
              words=4096, chip_words=1 << 24, cycles=123_456)


def test_sdram_test_is_a_build_option():
    assert Op.SDRAM_TEST not in build_requests(False)
    assert Op.SDRAM_TEST in build_requests(False, True)
    assert Op.SDRAM_TEST in build_requests(True, True) and SdramTestUnit.SDRAM
    assert not make_top().has_sdram_test and make_top(sdram_test=True).has_sdram_test


def test_sdram_test_goes_to_the_port_and_back():
    top = make_top(sdram_test=True)
    port = top.sdram_test
    seen = []

    async def bist(ctx):
        ctx.set(port.cmd.ready, 1)
        fields = [getattr(port.cmd.payload, k) for k in ("tests", "words", "pause_ms")]
        while True:
            valid, *values = (await ctx.tick().sample(port.cmd.valid, *fields))[2:]
            if not valid:
                continue
            seen.append(dict(zip(("tests", "words", "pause_ms"), values)))
            ctx.set(port.cmd.ready, 0)
            for _ in range(50):                 # a test takes its time
                await ctx.tick()
            for k, v in RESULT.items():
                ctx.set(getattr(port.result.payload, k), v)
            ctx.set(port.result.valid, 1)
            await tick_until(ctx, port.result.ready)
            ctx.set(port.result.valid, 0)
            ctx.set(port.cmd.ready, 1)

    async def scenario(ctx, link):
        payload = req(Op.SDRAM_TEST, tests=0x1F, words=4096, pause_ms=100)
        got = await link.call(ctx, Op.SDRAM_TEST, payload)
        assert SDRAM_TEST_RESPONSE.unpack(got) == RESULT
        assert seen == [dict(tests=0x1F, words=4096, pause_ms=100)]
        # a wrong length is refused before the port sees anything; PING still answers
        await link.call(ctx, Op.SDRAM_TEST, payload[:-1], status=Status.BAD_LENGTH)
        assert await link.call(ctx, Op.PING, b"ok") == b"ok"
        assert len(seen) == 1

    run_top(top, image_for(top), scenario, monitors=[bist])


def test_sdram_test_waits_for_the_recovery_scan_and_other_builds_refuse_it():
    top = make_top(sdram_test=True)

    async def early(ctx, link):
        # at once after reset: the scan owns the storage port (and so the SDRAM's tier)
        await link.call(ctx, Op.SDRAM_TEST, req(Op.SDRAM_TEST, tests=1, words=0, pause_ms=0),
                        status=Status.NOT_READY)

    run_top(top, image_for(top), early, wait_ready=False)
    top = make_top()

    async def plain(ctx, link):
        await link.call(ctx, Op.SDRAM_TEST, req(Op.SDRAM_TEST, tests=1, words=0, pause_ms=0),
                        status=Status.UNKNOWN_OP)

    run_top(top, image_for(top), plain)
