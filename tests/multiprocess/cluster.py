"""Start, signal and observe worker processes for the multi-process tests."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from processes import Children, freeze_unlocked, sqlite_locked, starts, store_locked

from anarchon_core import backend_from_url
from anarchon_core.records import HistoryQuery, RunRecord

__all__ = ["Cluster", "cluster", "freeze_unlocked", "sqlite_locked", "starts", "store_locked"]

WORKER = Path(__file__).with_name("worker.py")


@dataclass
class Cluster(Children):
    """A set of worker processes sharing one store URL and one events file."""

    backend: str
    tmp: Path
    scheduler: dict[str, Any]
    jobs: list[dict[str, Any]]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: Targets the workers register (``{"name": …, "sleep_s": …}``) for stored definitions.
    targets: list[dict[str, Any]] = field(default_factory=list)
    #: Workers dump their Prometheus samples and stats at stop (see :meth:`metrics`).
    dump_metrics: bool = False

    def start(
        self, instance_id: str, *, deaf: bool = False, **overrides: Any
    ) -> subprocess.Popen[bytes]:
        """Start a worker; ``deaf``: it reads the stored definitions at start only."""
        spec = {
            "deaf": deaf,
            "backend": self.backend,
            "instance_id": instance_id,
            "events": str(self.events_path),
            "scheduler": {**self.scheduler, **overrides},
            "jobs": self.jobs,
            "targets": self.targets,
        }
        if self.dump_metrics:
            spec["metrics_out"] = str(self.metrics_path(instance_id))
        env = {**os.environ, "ANARCHON_TEST_SPEC": json.dumps(spec), "PYTHONUNBUFFERED": "1"}
        log = open(self.log_path(instance_id), "ab")  # noqa: SIM115 - closed by the child
        proc = subprocess.Popen([sys.executable, str(WORKER)], env=env, stdout=log, stderr=log)
        log.close()
        self.procs[instance_id] = proc
        return proc

    def start_all(self, count: int, prefix: str = "w") -> None:
        for n in range(count):
            self.start(f"{prefix}{n}")
        self.wait_for(lambda ev: sum(e["e"] == "ready" for e in ev) >= count, 20, "workers ready")

    def freeze(self, instance_id: str, job: str, slot: int) -> None:
        """SIGSTOP ``instance_id`` at a moment it holds no lock on the run of ``slot``."""
        locked = partial(store_locked, self.backend, job, slot)
        freeze_unlocked(self.procs[instance_id], instance_id, locked)

    def metrics_path(self, instance_id: str) -> Path:
        return self.tmp / f"{instance_id}.metrics.json"

    def metrics(self, instance_id: str) -> dict[str, Any] | None:
        """What a stopped worker dumped: ``{"stats": {...}, "samples": [...]}``, or None."""
        path = self.metrics_path(instance_id)
        return json.loads(path.read_text()) if path.exists() else None

    def history(self, job: str | None = None) -> list[RunRecord]:
        async def read() -> list[RunRecord]:
            backend = backend_from_url(self.backend)
            await backend.open()
            try:
                return await backend.history(HistoryQuery(job=job, limit=100_000))
            finally:
                await backend.close()

        return asyncio.run(read())


@contextmanager
def cluster(
    backend: str,
    tmp: Path,
    *,
    jobs: list[dict[str, Any]],
    dump_metrics: bool = False,
    targets: list[dict[str, Any]] | None = None,
    **scheduler: Any,
) -> Iterator[Cluster]:
    c = Cluster(backend, tmp, scheduler, jobs, targets=targets or [], dump_metrics=dump_metrics)
    try:
        yield c
    finally:
        c.stop_all()
