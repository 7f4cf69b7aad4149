"""The JSON API over claim-only stores: what they keep is shown, the rest is a clear 501.

Some claim-only stores keep an instance registry (Redis); none offers pause, trigger or
cancel, which need the run's lease.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from claim_requests import claim_only_request
from registry import CLAIM_ONLY_URLS, load_store_modules

from anarchon_core.backend import Backend, InstanceInfo
from anarchon_core.backends import backend_from_url
from anarchon_core.records import Outcome
from anarchon_core.web.endpoints import DashboardAPI

load_store_modules()


def instance_with(job: str) -> InstanceInfo:
    return InstanceInfo("api:1:000000", "api", 1, "test", 0, 0, {job: "0f3a9c1e5b7d2a64"})


def offers(backend: Backend, op: str) -> bool:
    """Whether the store implements ``op`` (the base class refuses it clearly)."""
    return getattr(type(backend), op) is not getattr(Backend, op)


@pytest.mark.parametrize("store", sorted(CLAIM_ONLY_URLS))
async def test_the_api_over_a_claim_only_store(store: str, tmp_path: Path) -> None:
    with CLAIM_ONLY_URLS[store](tmp_path) as url:
        backend = backend_from_url(url)
        endpoints = DashboardAPI(backend, allow_actions=True)
        try:
            health = await endpoints.handle("GET", "health", {})
            registry = offers(backend, "instances")
            assert (health.status, health.body["instances"]) == (200, 0 if registry else None)
            slot = health.body["now"]
            claim = await backend.claim(claim_only_request(slot, job="sync"))
            assert claim.outcome == Outcome.WON

            runs = await endpoints.handle("GET", "runs", {"job": "sync"})
            assert runs.status == 200
            kept = [(r["slot"], r["status"]) for r in runs.body["runs"]]
            # RabbitMQ cannot list a run's queue without risking its claim: it keeps none.
            assert kept == ([] if url.startswith("amqp") else [(slot, "claimed")])
            jobs = await endpoints.handle("GET", "jobs", {})
            assert jobs.status == 200
            assert [j["job"] for j in jobs.body["jobs"]] == ([] if not kept else ["sync"])

            instances = await endpoints.handle("GET", "instances", {})
            assert instances.status == (200 if registry else 501)
            if registry:  # so that trigger reaches the store instead of finding nobody
                await backend.register(instance_with("sync"), ttl_ms=60_000)
            for method, path, op, body in [
                ("POST", "jobs/sync/pause", "set_paused", b""),
                ("POST", "jobs/sync/resume", "set_paused", b""),
                ("POST", "jobs/sync/trigger", "trigger", b""),
                ("POST", "runs/cancel", "cancel", b'{"job": "sync", "slot": %d}' % slot),
            ]:
                reply = await endpoints.handle(method, path, {}, body)
                if offers(backend, op):  # done atomically by the store: its suite tests it
                    assert reply.status == 200, (path, reply)
                else:
                    assert reply.status == 501, (path, reply)
                    assert "claim-only" in reply.body["error"]
                    assert "sqlite://" in reply.body["error"]
        finally:
            await endpoints.close()
