"""This instance's registry entry, and its view of the others.

An entry holds who the instance is, its targets and the digest of its job set: each
job's store name with its definition fingerprint, nothing else (the schedules and
options are in the store's job table). The ranking reads only the ids and digests.

An instance stays in the registry while its slot loop claims: it refreshes its entry
every heartbeat (the entry expires one lease after the last refresh) and leaves as soon
as it stops claiming, at a stop or when an engine loop dies, long before its runs are
handed over. Each refresh reads the live entries back: the candidate ranking follows
them (:mod:`.candidates`), instances that left have their passed slots rescued, and
every few refreshes replicas that disagree about a job's definition are reported.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import replace

from ..backend import Backend, InstanceInfo
from ..errors import CapabilityError
from ..job import Job
from ..operations import fingerprint_mismatches
from .candidates import Candidates
from .support import EngineConfig, EngineLog

__all__ = ["Registry", "job_digest"]

#: Compare the live instances' job fingerprints every this many registry refreshes.
MISMATCH_CHECK_PERIODS = 30
#: How long leaving the registry may take (it expires on its own after one lease).
LEAVE_TIMEOUT_S = 2.0


class Registry:
    """Keeps this instance's entry and feeds the candidate ranking."""

    def __init__(
        self,
        backend: Backend,
        config: EngineConfig,
        log: EngineLog,
        jobs: dict[str, Job],
        candidates: Candidates,
        *,
        skew: Callable[[], int],
        on_departed: Callable[[int], None],
    ) -> None:
        self.backend = backend
        self.config = config
        self.log = log
        self.jobs = jobs
        self.candidates = candidates
        self.telemetry = config.telemetry
        self._skew = skew
        self._on_departed = on_departed
        self._started_at = config.clock()
        self._reported_mismatches: set[str] = set()
        self._info: InstanceInfo | None = None

    def changed(self) -> None:
        """The job set changed (a stored definition): the next refresh says so."""
        self._info = None

    def instance_info(self) -> InstanceInfo:
        """What this instance tells the registry: who it is, its targets and the digest of
        its jobs, store name → fingerprint (built again only after :meth:`changed`)."""
        if self._info is not None:
            return self._info
        self._info = InstanceInfo(
            instance_id=self.config.instance_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=_version(),
            started_at=self._started_at,
            last_seen=0,
            # A job whose target this instance lacks is not held here: not listed.
            jobs=job_digest(j for j in self.jobs.values() if j.missing_target is None),
            targets=tuple(sorted(self.config.targets)),
        )
        return self._info

    async def loop(self) -> None:
        """Stay in the registry while alive (expiring one lease after the last refresh)."""
        periods = 0
        while True:
            try:
                await self.backend.register(
                    replace(self.instance_info(), skew_ms=self._skew()), self.config.lease_ms
                )
                ranking = self.candidates.k is not None
                if ranking or periods % MISMATCH_CHECK_PERIODS == 0:
                    live = await self.backend.instances()
                    if ranking:
                        self.new_view(live)
                    if periods % MISMATCH_CHECK_PERIODS == 0:
                        self._check_fingerprints(live)
            except CapabilityError as exc:  # a store without a registry: nothing to refresh
                self.log.warn("no instance registry: %s", exc)
                return
            except Exception as exc:
                self.telemetry.store_error("registry")
                self.log.warn("registry refresh failed: %s", exc)
            periods += 1
            await asyncio.sleep(self.config.heartbeat_ms / 1000)

    def new_view(self, live: list[InstanceInfo]) -> None:
        """Rank by a fresh registry read; rescue the passed slots of departed instances.

        An instance that stops leaves at once; one that died leaves one lease after its
        last refresh, so its slots are rescued at most ``lease_ms + heartbeat_ms`` after.
        """
        now = self.config.clock()
        departed = self.candidates.update({info.instance_id: info.jobs for info in live}, now)
        self.candidates.targets_held = frozenset(t for info in live for t in info.targets)
        if departed:
            self.log.info("instance(s) left the registry: %s", sorted(departed))
            self._on_departed(now)

    async def leave(self) -> None:
        """Leave the registry now (it expires on its own if this fails)."""
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await self.backend.unregister(self.config.instance_id)
        except CapabilityError:
            pass
        except Exception as exc:
            self.log.warn("could not leave the instance registry: %s", exc)

    def _check_fingerprints(self, live: list[InstanceInfo]) -> None:
        """Warn when live replicas disagree about one of our jobs (a rolling deploy)."""
        mismatches = {
            job: prints for job, prints in fingerprint_mismatches(live).items() if job in self.jobs
        }
        changed = mismatches.keys() != self._reported_mismatches
        self.telemetry.fingerprints(self.jobs, set(mismatches), changed=changed)
        if mismatches and changed:
            self.log.warn(
                "live instances disagree about the schedule or options of: %s",
                "; ".join(f"{job} ({len(p)} versions)" for job, p in mismatches.items()),
            )
        self._reported_mismatches = set(mismatches)


def job_digest(jobs: Iterable[Job]) -> dict[str, str]:
    """The digest of a job set that a registry entry holds: store name → fingerprint
    (a stored definition's job carries the definition's, which covers its version)."""
    return {job.store_name: job.fingerprint for job in jobs}


@functools.cache
def _version() -> str:
    """The package's version (read once: its metadata is an e-mail header to parse)."""
    try:
        return importlib.metadata.version("anarchon")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"
