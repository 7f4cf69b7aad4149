"""Pydantic models of the JSON API (``docs/api.md``), for OpenAPI and for clients.

The answers come from :class:`anarchon_core.endpoints.DashboardAPI` unchanged, so these
models describe them (``extra="allow"``: a newer core may add fields) rather than
reshape them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

StatusWord = Literal[
    "claimed", "running", "success", "failed", "interrupted", "skipped", "paused", "cancelled"
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorAnswer(_Model):
    error: str


class RunRecordModel(_Model):
    job: str
    slot: int
    scheduled_at: str
    attempt: int
    origin: Literal["schedule", "catch_up", "manual"]
    status: StatusWord
    instance_id: str | None = None
    claimed_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_ms: int | None = None
    lateness_ms: int | None = None
    error: str | None = None
    meta: dict[str, Any] = {}


class SlotModel(_Model):
    slot: int
    at: str


class MeanP95(_Model):
    mean: float | None = None
    p95: int | float | None = None


class JobStats(_Model):
    runs: int
    success: int
    failures: int
    interrupted: int
    cancelled: int
    takeovers: int
    retries: int
    skips: int
    paused: int
    duration_ms: MeanP95 | None = None
    lateness_ms: MeanP95 | None = None
    records: int
    truncated: bool


class WindowModel(_Model):
    since: int
    since_at: str


class JobModel(_Model):
    job: str
    schedule: str | None = None
    tz: str | None = None
    paused: bool
    instances: int
    fingerprints: list[str] = []
    options: dict[str, Any] | None = None
    next_slots: list[SlotModel] = []
    last_run: RunRecordModel | None = None
    stats: JobStats | None = None


class JobsAnswer(_Model):
    now: int
    now_at: str
    actions: bool
    window: WindowModel
    jobs: list[JobModel]


class RunsAnswer(_Model):
    runs: list[RunRecordModel]
    next_cursor: str | None = None


class InstanceModel(_Model):
    instance_id: str
    host: str
    pid: int
    version: str
    started_at: str
    last_seen_at: str
    skew_ms: int
    jobs: dict[str, dict[str, Any]]


class InstancesAnswer(_Model):
    now: int
    now_at: str
    instances: list[InstanceModel]
    mismatches: dict[str, dict[str, list[str]]]


class HealthAnswer(_Model):
    status: Literal["ok", "unavailable"]
    backend: str
    now: int | None = None
    now_at: str | None = None
    instances: int | None = None
    error: str | None = None


class PausedAnswer(_Model):
    job: str
    paused: bool


class TriggerAnswer(_Model):
    job: str
    slot: int
    scheduled_at: str


class CancelRequest(_Model):
    job: str
    slot: int


class CancelAnswer(_Model):
    job: str
    slot: int
    cancelled: bool
