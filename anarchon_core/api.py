"""The names of :mod:`anarchon_core.web.api` (the read API) under a shorter path: the
same objects, so either import path works."""

from __future__ import annotations

from .web.api import (
    DEFAULT_RUNS_LIMIT,
    DEFAULT_WINDOW_MS,
    MAX_RUNS_LIMIT,
    MAX_WINDOW_MS,
    SCHEMAS,
    decode_cursor,
    encode_cursor,
    instance_json,
    instances,
    jobs,
    parse_status,
    runs,
    window_stats,
)

__all__ = [
    "DEFAULT_RUNS_LIMIT",
    "DEFAULT_WINDOW_MS",
    "MAX_RUNS_LIMIT",
    "MAX_WINDOW_MS",
    "SCHEMAS",
    "decode_cursor",
    "encode_cursor",
    "instance_json",
    "instances",
    "jobs",
    "parse_status",
    "runs",
    "window_stats",
]
