"""The names of :mod:`anarchon_core.web.http_guard` (what every HTTP surface checks and
sends) under a shorter path: the same objects, so either import path works."""

from __future__ import annotations

from .web.http_guard import (
    DEFAULT_ALLOWED_HOSTS,
    SECURITY_HEADERS,
    HttpAnswer,
    action_refusal,
    allowed_hosts,
    bearer_token,
    check_token,
    file_answer,
    host_allowed,
    host_refusal,
    json_answer,
    token_matches,
    trusted_origins,
)

__all__ = [
    "DEFAULT_ALLOWED_HOSTS",
    "SECURITY_HEADERS",
    "HttpAnswer",
    "action_refusal",
    "allowed_hosts",
    "bearer_token",
    "check_token",
    "file_answer",
    "host_allowed",
    "host_refusal",
    "json_answer",
    "token_matches",
    "trusted_origins",
]
