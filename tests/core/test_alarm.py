"""The engine's shared timer: sleepers wake in time order, none early, cancelled ones
are skipped, and a sleeper sooner than all others re-arms the one timer."""

from __future__ import annotations

import asyncio
import time

from anarchon_core._alarm import Alarm


def test_sleepers_wake_in_order_and_never_early() -> None:
    async def main() -> list[tuple[int, float]]:
        alarm, loop = Alarm(), asyncio.get_running_loop()
        woken: list[tuple[int, float]] = []
        start = loop.time()

        async def sleeper(i: int, delay: float) -> None:
            await alarm.sleep(delay)
            woken.append((i, loop.time() - start - delay))

        # set out of order: the later ones first, then a sooner one that must re-arm
        delays = {0: 0.12, 1: 0.08, 2: 0.04, 3: 0.0, 4: 0.08}
        await asyncio.gather(*(sleeper(i, d) for i, d in delays.items()))
        return woken

    woken = asyncio.run(main())
    assert [i for i, _ in woken] == [3, 2, 1, 4, 0]  # by time; ties in the order set
    resolution = time.get_clock_info("monotonic").resolution  # as for asyncio.sleep
    assert all(late >= -resolution for _, late in woken)


def test_a_cancelled_sleeper_is_skipped_and_the_rest_still_wake() -> None:
    async def main() -> tuple[bool, bool]:
        alarm = Alarm()
        first, second = alarm.sleep(0.02), alarm.sleep(0.04)
        first.cancel()
        await second
        return first.cancelled(), second.done()

    assert asyncio.run(main()) == (True, True)


def test_close_cancels_the_timer_and_every_sleeper() -> None:
    """An engine's stop leaves no timer on a loop that runs on (a web app's)."""

    async def main() -> tuple[bool, bool, bool]:
        alarm = Alarm()
        sleeper = alarm.sleep(3600)
        timer = alarm._timer
        alarm.close()
        return sleeper.cancelled(), timer is not None and timer.cancelled(), alarm._timer is None

    assert asyncio.run(main()) == (True, True, True)
