"""Claim requests for backend tests that build them by hand."""

from __future__ import annotations

import secrets
import time

from anarchon_core.backend import ClaimRequest
from anarchon_core.records import Origin

HOUR = 3_600_000


def claim_only_request(
    slot: int,
    token: str | None = None,
    job: str = "job",
    *,
    horizon_ms: int = HOUR,
    lease_ms: int = 0,
) -> ClaimRequest:
    """A scheduled claim as a claim-only store sees it: no lease (``lease_ms`` for a lease
    store asked the same), no overlap check."""
    token = token or secrets.token_hex(8)
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token,
        instance_id=f"worker:{token[:6]}",
        lease_ms=lease_ms,
        horizon_ms=horizon_ms,
        skip_overlap=False,
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000
