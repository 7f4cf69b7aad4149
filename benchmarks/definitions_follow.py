"""How long a running cluster takes to follow a change of a stored definition, per store.

For each store (``--stores``: sqlite, postgres, redis, nats), ``--replicas`` schedulers
(each with a store connection of its own, one process, the default ``heartbeat_ms``
of 2 s) follow the definitions of one namespace. The benchmark then changes one
definition ``--changes`` times through another connection and measures, for each change,
the time from the write's return to the moment every replica has applied it (its
follower's version reached the change's). Two modes run interleaved, change by change:
**notified** (the store's notifications where it has them, plus the poll) and **polled**
(notifications off: the heartbeat poll alone). A store with no notifications polls in
both modes.

Each write comes at a random point of the replicas' poll period. Run:
``python -m benchmarks.definitions_follow`` (about 6 minutes), or
``--stores redis --replicas 8 --changes 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from anarchon_core import RunContext, Scheduler, backend_from_url
from anarchon_core.definitions import Definition
from anarchon_core.errors import CapabilityError
from anarchon_core.schedules import Every

from ._chaos_stores import open_store
from ._util import machine, percentile, print_table

NATS_URL = "nats://127.0.0.1:4222"


@contextlib.contextmanager
def store_url(name: str, tmp: Path) -> Iterator[str]:
    if name != "nats":
        with open_store(name, tmp) as store:
            yield store.url
        return
    bucket = f"anarchon_b{secrets.token_hex(5)}"
    try:
        yield f"{NATS_URL}/?bucket={bucket}"
    finally:
        asyncio.run(_delete_nats(bucket))


async def _delete_nats(bucket: str) -> None:
    import nats

    nc = await nats.connect(NATS_URL)
    try:
        for name in (bucket, f"{bucket}_definitions"):
            with contextlib.suppress(Exception):
                await nc.jetstream().delete_key_value(name)
    finally:
        await nc.close()


async def _no_notifications(changed: object) -> None:
    raise CapabilityError("notifications off (the polled mode)")


async def measure(url: str, replicas: int, changes: int) -> dict[str, list[float]]:
    """Follow delays in ms, by mode."""
    schedulers = []
    for mode in ("notified", "polled"):
        for i in range(replicas):
            scheduler = Scheduler(url, instance_id=f"{mode}-{i}", namespace=mode)

            def nothing(ctx: RunContext) -> None:
                pass

            scheduler.add_target("t", nothing)
            if mode == "polled":
                scheduler.backend.watch_definitions = _no_notifications  # type: ignore[method-assign]
            schedulers.append((mode, scheduler))
    for _, scheduler in schedulers:
        await scheduler.start()
    writer = backend_from_url(url)
    await writer.open()
    delays: dict[str, list[float]] = {"notified": [], "polled": []}
    versions = {"notified": 0, "polled": 0}
    try:
        await asyncio.sleep(1)
        for n in range(changes):
            for mode in ("notified", "polled") if n % 2 else ("polled", "notified"):
                every = Every(f"{1 + n % 5}h")
                body = Definition.create("job", every, "t").body()
                versions[mode] = await writer.write_definition(
                    f"{mode}:job", body, expected=versions[mode]
                )
                written = time.perf_counter()
                followers = [s._engine.follower for m, s in schedulers if m == mode and s._engine]
                while any(f is None or f.seen < versions[mode] for f in followers):
                    await asyncio.sleep(0.001)
                delays[mode].append((time.perf_counter() - written) * 1000)
                # The next write at a random point of the poll period, not right after
                # the poll that followed this one (that would measure the worst case).
                await asyncio.sleep(random.uniform(0, 2.0))
    finally:
        await writer.close()
        await asyncio.gather(*(s.stop() for _, s in schedulers))
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,postgres,redis,nats")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--changes", type=int, default=20)
    args = parser.parse_args()
    print(machine())
    print(
        f"{args.replicas} replicas per mode, heartbeat 2 s, {args.changes} changes per mode: "
        "ms from a write's return until every replica applied it"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.stores.split(","):
            with store_url(name, Path(tmp)) as url:
                delays = asyncio.run(measure(url, args.replicas, args.changes))
            for mode, samples in delays.items():
                ordered = sorted(samples)
                rows.append(
                    (
                        name,
                        mode,
                        f"{statistics.median(ordered):.1f}",
                        f"{percentile(ordered, 95):.1f}",
                        f"{ordered[-1]:.1f}",
                    )
                )
    print_table("follow delay", ("store", "mode", "p50 ms", "p95 ms", "max ms"), rows)


if __name__ == "__main__":
    main()
