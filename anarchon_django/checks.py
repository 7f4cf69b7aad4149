"""System checks (``manage.py check``, and before ``manage.py anarchon run``).

=================  =========================================================
id                 problem
=================  =========================================================
anarchon.E001      ``ANARCHON`` is not a dict
anarchon.E002      unknown key in ``ANARCHON`` (with a did-you-mean)
anarchon.E003      ``BACKEND`` is not a valid store URL / unknown scheme
anarchon.E004      ``BACKEND`` is ``django://ALIAS`` and ALIAS is not in DATABASES
anarchon.E005      a bad value of any other key (the message names key and form)
anarchon.E006      ``BACKEND``'s database needs a driver that is not installed
anarchon.E010      a ``jobs`` module (or an ``IMPORT_PATHS`` module) failed to import
anarchon.E011      bad job name
anarchon.E012      bad duration (``every()`` interval or offset)
anarchon.E013      bad cron expression
anarchon.E014      bad time zone
anarchon.E015      bad job option (unknown option or bad value)
anarchon.E016      one job name defined twice (names both modules)
anarchon.W001      ``cron()`` without ``tz`` while ``TIME_ZONE`` is not UTC
=================  =========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core import checks

from anarchon_core.errors import ConfigurationError

from . import _scheduler
from .conf import Problem, alias_from_url

__all__ = ["DISCOVERY_PROBLEMS", "TAG", "check_anarchon"]

TAG = "anarchon"

#: Problems found while importing the jobs modules in ``AppConfig.ready()``.
DISCOVERY_PROBLEMS: list[Problem] = []

_UTC_NAMES = ("UTC", "Etc/UTC", "Etc/UCT", "UCT", "Universal", "Zulu", "Etc/Universal", "Etc/Zulu")


def _message(problem: Problem) -> checks.CheckMessage:
    kind = checks.Warning if problem.warning else checks.Error
    return kind(problem.msg, hint=problem.hint, id=problem.id)


def check_anarchon(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Every anarchon problem of the project: settings, jobs modules, zones."""
    from django.conf import settings

    conf = _scheduler.current_settings()
    messages = [_message(p) for p in conf.problems]
    messages += _driver_messages(conf.backend, settings.DATABASES)
    messages += [_message(p) for p in DISCOVERY_PROBLEMS]
    scheduler = _scheduler._current
    zone = getattr(settings, "TIME_ZONE", None) or "UTC"
    if scheduler is not None and zone not in _UTC_NAMES:
        for name in scheduler.default_zone_jobs:
            messages.append(
                checks.Warning(
                    f"cron job {name!r} (in {scheduler.origins.get(name, '?')}) has no tz: it "
                    f"is evaluated in UTC, not in TIME_ZONE {zone!r}",
                    hint=f"pass tz={zone!r} (or tz='UTC') to scheduler.cron() to say which "
                    f"zone is meant",
                    id="anarchon.W001",
                )
            )
    return messages


def _driver_messages(url: str, databases: Any) -> list[checks.CheckMessage]:
    """``anarchon.E006``: the database of a ``django://`` store needs a driver (psycopg 3
    and its pool on PostgreSQL, mysqlclient on MySQL) this environment lacks."""
    if not url.startswith("django://"):
        return []
    try:
        engine = str(databases[alias_from_url(url)].get("ENGINE", ""))
    except (ConfigurationError, KeyError):  # E003/E004 say why
        return []
    vendor = {"postgresql": "postgresql", "mysql": "mysql"}.get(engine.rsplit(".", 1)[-1], "")
    from .backend import missing_driver  # not at import: the app builds nothing then

    problem = missing_driver(vendor)
    if problem is None:
        return []
    return [checks.Error(problem, hint="install it, then run this check again", id="anarchon.E006")]


def register() -> None:
    checks.register(check_anarchon, TAG)
