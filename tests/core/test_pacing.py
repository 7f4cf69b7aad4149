"""SQLite's pacing: a few answers are handed back per event-loop iteration, so that an
application sharing the loop (a web server) is polled between portions of a burst.
Observed one loop iteration at a time: each ``await asyncio.sleep(0)`` of the observer
lets exactly one iteration pass.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from itertools import pairwise
from typing import Any

from anarchon_core.backends.sqlite._batch import MAX_BATCH, SETTLE_PER_TURN, WriteQueue


def increments(counts: list[int]) -> list[int]:
    return [b - a for a, b in pairwise(counts) if b != a]


class InlineExecutor:
    """Runs each batch at once: its answers reach the loop in a known number of turns."""

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args))
        return done


def doubled(batch: list[Any]) -> list[Any]:
    return [2 * decision for decision in batch]


def test_answers_are_handed_back_a_portion_per_iteration() -> None:
    count = 2 * MAX_BATCH + 5

    async def main() -> tuple[list[int], list[int]]:
        queue = WriteQueue(InlineExecutor(), doubled)  # type: ignore[arg-type]
        futures = [queue.submit(i) for i in range(count)]  # type: ignore[arg-type]
        counts = []
        while not all(f.done() for f in futures):
            counts.append(sum(f.done() for f in futures))
            await asyncio.sleep(0)
        counts.append(count)
        return [f.result() for f in futures], counts

    answers, counts = asyncio.run(main())
    assert answers == [2 * i for i in range(count)]
    steps = increments(counts)
    assert max(steps) == SETTLE_PER_TURN and sum(steps) == count, counts


def test_drain_hands_back_every_answer_at_once() -> None:
    async def main() -> list[int]:
        queue = WriteQueue(InlineExecutor(), doubled)  # type: ignore[arg-type]
        futures = [queue.submit(i) for i in range(3 * SETTLE_PER_TURN)]  # type: ignore[arg-type]
        await queue.drain()
        assert all(f.done() for f in futures)
        return [f.result() for f in futures]

    assert asyncio.run(main()) == [2 * i for i in range(3 * SETTLE_PER_TURN)]


def test_a_cancelled_caller_neither_gets_nor_uses_an_answer() -> None:
    async def main() -> list[Any]:
        queue = WriteQueue(InlineExecutor(), doubled)  # type: ignore[arg-type]
        futures = [queue.submit(i) for i in range(MAX_BATCH)]  # type: ignore[arg-type]
        futures[3].cancel()
        await queue.drain()
        return [f.result() if not f.cancelled() else None for f in futures]

    answers = asyncio.run(main())
    assert answers[3] is None
    assert [a for a in answers if a is not None] == [2 * i for i in range(MAX_BATCH) if i != 3]
