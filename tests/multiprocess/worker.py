"""One instance for the multi-process tests, configured by the JSON in ``$ANARCHON_TEST_SPEC``.

Every handler appends JSON lines to the events file (``O_APPEND`` keeps lines whole
across processes) so that the tests see what really executed, not only what the
store recorded. With ``metrics_out`` in the spec, a worker that stops writes its
``anarchon_*`` Prometheus samples and its ``Scheduler.stats`` there as JSON (a killed
worker writes nothing).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from anarchon_core import RunContext, Scheduler


def emit(path: str, **event: Any) -> None:
    event.update(pid=os.getpid(), t=time.time())
    line = (json.dumps(event) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def make_handler(events: str, spec: dict[str, Any]) -> Any:
    sleep_s = float(spec.get("sleep_s", 0))
    cpu_s = float(spec.get("cpu_s", 0))
    stubborn_s = float(spec.get("stubborn_s", 0))  # sleeps ignoring the cancellation signal
    gate = spec.get("wait_for_file")  # the first run waits until this file exists

    def record(ctx: RunContext, what: str, **extra: Any) -> None:
        emit(
            events,
            e=what,
            job=ctx.job,
            slot=ctx.slot,
            attempt=ctx.attempt,
            origin=str(ctx.origin),
            instance=ctx.instance_id,
            **extra,
        )

    if spec.get("kind", "sync") == "async":

        async def handler(ctx: RunContext) -> None:
            record(ctx, "start")
            await asyncio.sleep(sleep_s)
            record(ctx, "end")

        return handler

    def sync_handler(ctx: RunContext) -> None:
        record(ctx, "start")
        if cpu_s:
            deadline = time.monotonic() + cpu_s
            n = 0
            while time.monotonic() < deadline:  # pure-Python CPU work, holding the GIL
                n += sum(i * i for i in range(2000))
        time.sleep(stubborn_s)
        while gate and not os.path.exists(gate) and not ctx.cancelled:
            ctx.wait(0.02)
        cancelled = ctx.wait(sleep_s) if sleep_s else False
        record(ctx, "end", cancelled=ctx.cancel_reason if cancelled else None)

    return sync_handler


def make_target(events: str, spec: dict[str, Any]) -> Any:
    """A target: records its start (with the definition's args) and end."""
    sleep_s = float(spec.get("sleep_s", 0))

    async def target(ctx: RunContext, *args: Any, **kwargs: Any) -> None:
        where = {"job": ctx.job, "slot": ctx.slot, "attempt": ctx.attempt}
        emit(events, e="start", instance=ctx.instance_id, args=list(args), **where)
        await asyncio.sleep(sleep_s)
        emit(events, e="end", instance=ctx.instance_id, **where)

    return target


def dump_metrics(path: str, scheduler: Scheduler) -> None:
    """Write this process's ``anarchon_*`` samples and stats; atomically (rename)."""
    from prometheus_client import REGISTRY

    samples = [
        {"name": sample.name, "labels": sample.labels, "value": sample.value}
        for metric in REGISTRY.collect()
        if metric.name.startswith("anarchon_")
        for sample in metric.samples
    ]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        json.dump({"stats": dict(scheduler.stats), "samples": samples}, out)
    os.replace(tmp, path)


def main() -> None:
    spec = json.loads(os.environ["ANARCHON_TEST_SPEC"])
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {spec['instance_id']} %(levelname)s %(message)s",
    )
    scheduler = Scheduler(
        spec["backend"], instance_id=spec["instance_id"], **spec.get("scheduler", {})
    )
    for job in spec["jobs"]:
        scheduler.every(
            job["name"], job["every"], make_handler(spec["events"], job), **job.get("options", {})
        )
    for target in spec.get("targets", []):  # what stored definitions may run
        scheduler.add_target(target["name"], make_target(spec["events"], target))

    async def serve() -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await scheduler.start()
        if spec.get("deaf"):  # reads the definitions once, then never polls for changes
            engine = scheduler._engine
            assert engine is not None and engine.follower is not None
            engine.follower.kept = False
        emit(spec["events"], e="ready", instance=spec["instance_id"])
        await stop.wait()
        await scheduler.stop()
        if spec.get("metrics_out"):
            dump_metrics(spec["metrics_out"], scheduler)
        emit(spec["events"], e="stopped", instance=spec["instance_id"])

    asyncio.run(serve())


if __name__ == "__main__":
    main()
