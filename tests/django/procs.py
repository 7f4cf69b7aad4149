"""Run ``manage.py`` of the test project in child processes (the process tests' helpers).

Children use the parent's *test* database (``ANARCHON_TEST_DJANGO_NAME``), so a test
that starts them needs ``transactional_db`` (their writes must be visible to it and
the database must be a file or a server), and it must end them before pytest-django
drops the database: :class:`Cluster` is a context manager that kills every child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from processes import Children, freeze_unlocked, sqlite_locked, store_locked

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
MANAGE = TESTS / "django_project" / "manage.py"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: this checkout importable, the same database engine."""
    path = os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path.rstrip(os.pathsep), "PYTHONUNBUFFERED": "1"}
    env["DJANGO_SETTINGS_MODULE"] = "django_project.settings"
    env.pop("ANARCHON_ENABLED", None)
    env.update(extra)
    return env


def manage(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(**(env or {})),
        check=False,
    )


def django_store_skip_reason() -> str | None:
    """Why ``django://default`` cannot be tested here, or None."""
    from importlib.metadata import entry_points

    try:
        import anarchon_django.backend  # noqa: F401
    except ImportError as exc:
        return f"the ORM backend (anarchon_django.backend) is not importable yet: {exc}"
    if not any(ep.name == "django" for ep in entry_points(group="anarchon.backends")):
        return "the 'django' entry point of anarchon.backends is not installed: pip install -e ."
    return None


def database_name() -> str:
    from django.db import connection

    return str(connection.settings_dict["NAME"])


@dataclass
class Cluster(Children):
    """``manage.py anarchon run`` children sharing one store, one events file."""

    tmp: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, instance_id: str, *extra: str) -> subprocess.Popen[bytes]:
        env = child_env(**self.env, ANARCHON_TEST_EVENTS=str(self.events_path))
        with open(self.log_path(instance_id), "ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(MANAGE),
                    "anarchon",
                    "run",
                    "--instance-id",
                    instance_id,
                    *extra,
                ],
                env=env,
                stdout=log,
                stderr=log,
            )
        self.procs[instance_id] = proc
        return proc

    def start_all(self, count: int, prefix: str = "w") -> None:
        for n in range(count):
            self.start(f"{prefix}{n}")
        for n in range(count):
            self.wait_log(f"{prefix}{n}", "anarchon started", 30)

    def wait_log(self, instance_id: str, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            path = self.log_path(instance_id)
            if path.exists() and text in path.read_text(errors="replace"):
                return
            if self.procs[instance_id].poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{instance_id} never logged {text!r}; logs:\n{self.logs()}")

    def freeze(self, instance_id: str, job: str, slot: int) -> None:
        """SIGSTOP ``instance_id`` at a moment it holds no store lock (see
        :func:`processes.freeze_unlocked`): the ORM store's lock is probed
        through Django's connection, a core store's through its URL."""
        store = self.env["ANARCHON_TEST_BACKEND"]
        if store.startswith("django://"):
            locked = partial(django_store_locked, job, slot)
        else:
            locked = partial(store_locked, store, job, slot)
        freeze_unlocked(self.procs[instance_id], instance_id, locked)


@contextmanager
def cluster(
    tmp: Path,
    store: str,
    jobs: list[dict[str, Any]],
    **settings: Any,
) -> Iterator[Cluster]:
    """Children on ``store`` with ``jobs``; ``settings`` are merged into ``ANARCHON``."""
    env = {
        "ANARCHON_TEST_DJANGO_NAME": database_name(),
        "ANARCHON_TEST_BACKEND": store,
        "ANARCHON_TEST_JOBS": json.dumps(jobs),
        "ANARCHON_TEST_SETTINGS": json.dumps(settings),
    }
    c = Cluster(tmp, env)
    try:
        yield c
    finally:
        c.stop_all()
        c.kill_all()  # never leave a child connected when the test database is dropped


def django_store_locked(job: str, slot: int) -> bool:
    """Whether another process holds what a takeover of the run needs on the ORM store:
    SQLite's write lock, the run's row on PostgreSQL, the store-wide lock (the
    ``schema_version`` row) on MySQL/MariaDB."""
    from django.db import OperationalError, connection, transaction

    if connection.vendor == "sqlite":
        return sqlite_locked(connection.settings_dict["NAME"], wait_s=0.2)
    if connection.vendor == "mysql":
        probe = "SELECT 1 FROM anarchon_meta WHERE `key` = 'schema_version' FOR UPDATE NOWAIT"
        params: list[object] = []
    else:
        probe = "SELECT 1 FROM anarchon_runs WHERE job = %s AND slot = %s FOR UPDATE NOWAIT"
        params = [job, slot]
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(probe, params)
        return False
    except OperationalError:
        return True


def store_url(kind: str, tmp: Path) -> str:
    """``core``: the core's own store for this database engine (a SQLite file beside
    MySQL, which has no core store); ``django``: the ORM one."""
    if kind == "django":
        reason = django_store_skip_reason()
        if reason:
            pytest.skip(reason)
        return "django://default"
    from django.db import connection

    if connection.vendor == "postgresql":
        s = connection.settings_dict
        schema = f"anarchon_{os.getpid()}_{time.monotonic_ns() % 10**9}"
        return f"postgresql://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}?schema={schema}"
    return f"sqlite:///{tmp / 'store.sqlite3'}"
