"""``INSTALLED_APPS = [..., "anarchon_django"]``.

``ready()`` runs for every management command, twice under ``runserver`` and before
``migrate``: it only registers the system checks and imports each installed app's
``jobs`` module (and ``ANARCHON["IMPORT_PATHS"]``). It never starts a thread, opens a
connection or queries the database; problems are reported by the checks, not raised.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Iterable

from django.apps import AppConfig, apps
from django.utils.module_loading import module_has_submodule

from anarchon_core.errors import ConfigurationError

from . import checks
from ._scheduler import check_id, current_settings
from .conf import Problem

__all__ = ["AnarchonConfig", "discover"]


class AnarchonConfig(AppConfig):
    name = "anarchon_django"
    label = "anarchon_django"
    verbose_name = "anarchon"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register()
        conf = current_settings()  # validated; problems are reported by the checks
        modules: list[str] = []
        if conf.autodiscover:
            modules += [
                f"{app.name}.{conf.autodiscover}"
                for app in apps.get_app_configs()
                if module_has_submodule(app.module, conf.autodiscover)
            ]
        modules += [m for m in conf.import_paths if m not in modules]
        checks.DISCOVERY_PROBLEMS[:] = discover(modules)


def discover(modules: Iterable[str]) -> list[Problem]:
    """Import each module; return a problem per module that failed (never raises)."""
    problems: list[Problem] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            code = check_id(exc) if isinstance(exc, ConfigurationError) else None
            problems.append(
                _import_failed(name, exc)
                if code is None
                else Problem(code, f"{_where(name, exc)}: {exc}", "fix the job definition")
            )
    return problems


def _import_failed(name: str, exc: BaseException) -> Problem:
    text = " ".join(str(exc).split())
    return Problem(
        "anarchon.E010",
        f"importing the jobs module {name!r} failed at {_where(name, exc)}: "
        f"{type(exc).__name__}: {text}",
        "the module must import without errors; run "
        f"'python -c \"import {name}\"' to see the traceback",
    )


def _where(module: str, exc: BaseException) -> str:
    """``module (path/jobs.py, line N)``: the innermost frame in the module's own file."""
    tail = module.rsplit(".", 1)[-1]
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(f"{tail}.py")
    ]
    if not frames:
        return module
    return f"{module} ({frames[-1].filename}, line {frames[-1].lineno})"
