"""The tasks of ``test_tasks_bridge`` on the ``django_tasks`` backport
(``bridge_tasks_django`` has the same on Django 6's own ``django.tasks``).

Django's backends import a task back by its path, so each task is the attribute of its
module by its function's name, as in a project's ``tasks.py``.
"""

from __future__ import annotations

from typing import Any

from django_tasks import task

FRAMEWORK = "django_tasks"
#: What the immediate backend ran: the keyword arguments of each call.
ran: list[dict[str, Any]] = []


@task
def send_report(*, anarchon_slot: int) -> None:
    ran.append({"anarchon_slot": anarchon_slot})


@task
def send_detailed(
    kind: str, *, anarchon_slot: int, anarchon_job: str, anarchon_attempt: int, lang: str = "en"
) -> str:
    ran.append(
        {
            "kind": kind,
            "lang": lang,
            "anarchon_slot": anarchon_slot,
            "anarchon_job": anarchon_job,
            "anarchon_attempt": anarchon_attempt,
        }
    )
    return f"{kind}@{anarchon_slot}"


@task
def takes_anything(**kwargs: Any) -> None:
    ran.append(kwargs)


@task
def no_slot() -> None: ...
