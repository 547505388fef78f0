"""``serve/app.py``'s ``Inbox``: events put from a device's reader thread reach the request's
coroutine in order, none lost, and one burst of events for many requests wakes the event loop
once (the inboxes of a loop share their wake-ups)."""

import asyncio
import threading

from ringkv.serve.app import Inbox


def test_events_in_order_none_lost_across_threads():
    async def main():
        loop = asyncio.get_running_loop()
        boxes = [Inbox(loop) for _ in range(8)]
        per_box = 500

        def producer(k):
            for i in range(per_box):
                for j, box in enumerate(boxes):
                    if j % 2 == k:
                        box.put((j, i))

        threads = [threading.Thread(target=producer, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()

        async def consume(j, box):
            got = []
            while len(got) < per_box:
                got += await box.get_burst() if j % 3 else [await box.get()]
            return got

        results = await asyncio.gather(*(consume(j, b) for j, b in enumerate(boxes)))
        for t in threads:
            t.join()
        for j, got in enumerate(results):
            assert got == [(j, i) for i in range(per_box)]

    asyncio.run(main())


def test_one_wakeup_for_a_burst_of_many_inboxes():
    """32 requests' tokens put while the loop is busy: one ``call_soon_threadsafe`` (a write
    to the loop's self-pipe), not 32; every request's coroutine still sees its token."""
    async def main():
        loop = asyncio.get_running_loop()
        calls = []
        original = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):
            calls.append(callback)
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting
        boxes = [Inbox(loop) for _ in range(32)]
        waiters = [asyncio.ensure_future(b.get_burst()) for b in boxes]
        await asyncio.sleep(0)                  # every waiter is waiting
        step = threading.Thread(target=lambda: [b.put(("token", i)) for i, b in
                                                enumerate(boxes)])
        step.start()
        step.join()                             # the loop ran nothing meanwhile
        got = await asyncio.gather(*waiters)
        assert got == [[("token", i)] for i in range(32)]
        assert len(calls) == 1
        # a second burst after the first was taken: one more wake-up
        waiters = [asyncio.ensure_future(b.get()) for b in boxes]
        await asyncio.sleep(0)
        step = threading.Thread(target=lambda: [b.put(i) for i, b in enumerate(boxes)])
        step.start()
        step.join()
        assert await asyncio.gather(*waiters) == list(range(32))
        assert len(calls) == 2

    asyncio.run(main())
