"""The names of :mod:`anarchon_core.web.endpoints` (the HTTP API with no web framework)
under a shorter path: the same objects, so either import path works."""

from __future__ import annotations

from .web.endpoints import ERRORS, ROUTES, DashboardAPI, Reply, Route, dashboard_file

__all__ = ["ERRORS", "ROUTES", "DashboardAPI", "Reply", "Route", "dashboard_file"]
