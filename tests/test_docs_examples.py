"""The code blocks of the getting-started page and the three adapter guides run.

Every ``python`` and shell block of those pages carries a marker, an HTML comment on
the line right before its fence, that says what this test does with it:

``<!-- test: file PATH -->``
    write the block to ``PATH`` in the page's temporary project (replacing the file);
``<!-- test: append PATH -->``
    append the block to ``PATH`` (a later part of a file shown earlier);
``<!-- test: run -->``
    run it in the project: a python block as a script, a shell block command by
    command (a command ending in ``&`` starts in the background and is stopped with
    SIGTERM at the end of the test, which expects exit 0);
``<!-- test: skip REASON -->``
    leave it (installs, servers, the repository's own suites), with the reason.

A marker may span several lines: the lines after ``<!-- test: ...`` and before ``-->``
are a prelude written before the block (the names a fragment takes from an earlier
block). An unmarked block fails the test, so that a new block is never silently
untested.

Each page's test writes every ``file``/``append`` block, runs every ``run`` block in
page order, then exercises what the blocks define in subprocesses of this
interpreter (the venv's), on SQLite files in ``tmp_path``: the getting-started app runs
in three ``anarchon run`` processes until a manual run is recorded; the Django blocks
form a throwaway project that is migrated, checked and whose jobs run through
``run_once``; the FastAPI apps go through their lifespans; the Celery configuration is
mapped by ``anarchon_celery.Scheduler`` without starting beat.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import django
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = ["getting-started.md", "django.md", "fastapi.md", "celery.md"]
PYTHON_LANGS = {"python", "py", "python3", "pycon"}
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
ACTIONS = {"file", "append", "run", "skip"}

COMMAND_TIMEOUT_S = 120  # one command or script; the machine may be loaded
POLL_TIMEOUT_S = 60  # waiting for instances and runs (they take about 2 s)
STOP_TIMEOUT_S = 60  # a background process after SIGTERM

FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*test:\s*(?P<body>.*?)\s*(?P<end>-->)?\s*$")

T = TypeVar("T")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    action: str
    argument: str
    prelude: str

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def parse(page: str, text: str | None = None) -> tuple[list[Block], list[str]]:
    """The page's python and shell blocks with their markers, and every marker problem."""
    lines = ((DOCS / page).read_text() if text is None else text).splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    used_markers: set[int] = set()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        lang = (opening["info"].split() or [""])[0].lower()
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        code = "\n".join(line[indent:] for line in lines[index + 1 : end]) + "\n"
        marker = _marker_before(lines, index)
        if lang in PYTHON_LANGS | SHELL_LANGS:
            where = f"docs/{page}:{index + 1}"
            if marker is None:
                problems.append(f"{where}: a {lang} block without a <!-- test: ... --> marker")
            else:
                start, body, prelude = marker
                used_markers.add(start)
                action, _, argument = body.partition(" ")
                argument = argument.strip()
                problem = _check_marker(action, argument, lang)
                if problem:
                    problems.append(f"{where}: {problem}")
                else:
                    blocks.append(Block(page, index + 1, lang, code, action, argument, prelude))
        elif marker is not None:
            used_markers.add(marker[0])
        index = end + 1
    for number, line in enumerate(lines):
        if MARKER.match(line) and number not in used_markers:
            problems.append(f"docs/{page}:{number + 1}: a marker not right before a fence")
    return blocks, problems


def _marker_before(lines: list[str], fence: int) -> tuple[int, str, str] | None:
    """The marker ending on the line before ``fence``: (its first line, body, prelude)."""
    last = fence - 1
    if last < 0 or not lines[last].rstrip().endswith("-->"):
        return None
    start = last
    while start >= 0 and MARKER.match(lines[start]) is None:
        if start < last and "-->" in lines[start]:
            return None  # another comment
        start -= 1
    if start < 0:
        return None
    match = MARKER.match(lines[start])
    assert match is not None
    if start == last:
        return start, match["body"], ""
    if match["end"]:
        return None
    prelude = textwrap.dedent("\n".join(lines[start + 1 : last])) + "\n"
    closing = lines[last].strip()
    if closing != "-->":
        prelude += textwrap.dedent(closing[: -len("-->")]) + "\n"
    return start, match["body"], prelude


def _check_marker(action: str, argument: str, lang: str) -> str | None:
    if action not in ACTIONS:
        return f"unknown marker action {action!r}; expected one of {sorted(ACTIONS)}"
    if action == "skip" and not argument:
        return "a skip marker needs a reason: <!-- test: skip REASON -->"
    if action in {"file", "append"}:
        path = PurePosixPath(argument)
        if not argument or path.is_absolute() or ".." in path.parts or " " in argument:
            return f"{action} needs a relative path inside the project, not {argument!r}"
        if lang not in PYTHON_LANGS:
            return f"{action} is for python blocks"
    if action == "run" and argument:
        return f"run takes no argument (got {argument!r})"
    return None


def load(page: str) -> list[Block]:
    blocks, problems = parse(page)
    assert not problems, "\n".join(problems)
    return blocks


def poll(what: str, probe: Callable[[], T | None], timeout_s: float = POLL_TIMEOUT_S) -> T:
    """Call ``probe`` until it returns a value other than None, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


class Project:
    """A temporary project directory in which a page's blocks are written and run."""

    def __init__(self, root: Path, **env: str) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        bin_dir = str(Path(sys.executable).parent)
        base = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("ANARCHON_", "DJANGO_", "CELERY_", "PYTHON"))
        }
        self.env = {
            **base,
            "PATH": f"{bin_dir}{os.pathsep}{base.get('PATH', '')}",
            "PYTHONPATH": str(root),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.background: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.outputs: dict[str, str] = {}

    def write(self, path: str, text: str, *, append: bool = False) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if append and target.exists():
            text = target.read_text() + "\n\n" + text
        target.write_text(text)

    def write_blocks(self, blocks: list[Block]) -> None:
        for block in blocks:
            if block.action in {"file", "append"}:
                self.write(
                    block.argument, block.prelude + block.code, append=block.action == "append"
                )

    def run_blocks(self, blocks: list[Block]) -> None:
        for block in blocks:
            if block.action != "run":
                continue
            if block.lang in PYTHON_LANGS:
                script = f"_docs_block_{block.line}.py"
                self.write(script, block.prelude + block.code)
                self.outputs[block.where] = self.run([sys.executable, script], block.where)
                continue
            for command in shell_commands(block):
                if command.endswith("&") and not command.endswith("&&"):
                    self.start(command[:-1].strip(), block.where)
                else:
                    self.outputs[command] = self.run(["bash", "-c", command], block.where)

    def run(self, argv: list[str], what: str, *, expect: int = 0) -> str:
        result = subprocess.run(
            argv,
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == expect, (
            f"{what}: {' '.join(argv)} exited {result.returncode} (expected {expect}):\n{output}"
        )
        return result.stdout

    def python(self, *args: str, what: str = "python", expect: int = 0) -> str:
        return self.run([sys.executable, *args], what, expect=expect)

    def start(self, command: str, what: str) -> None:
        log = (self.root / f"_background_{len(self.background)}.log").open("wb")
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.root,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.background.append((f"{what}: {command}", process))

    def log(self, number: int) -> str:
        return (self.root / f"_background_{number}.log").read_text(errors="replace")

    def stop_background(self) -> None:
        """SIGTERM every background process; each must exit 0 (a graceful stop)."""
        for _, process in self.background:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for number, (what, process) in enumerate(self.background):
            code = process.wait(timeout=STOP_TIMEOUT_S)
            assert code == 0, f"{what} exited {code} after SIGTERM:\n{self.log(number)}"

    def kill_background(self) -> None:
        for _, process in self.background:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)


def shell_commands(block: Block) -> Iterator[str]:
    """The commands of a shell block: ``$ ``-prompted lines of a console block."""
    pending = ""
    for raw in block.code.splitlines():
        line = raw.rstrip()
        if not pending:
            if block.lang == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        if pending:
            line = line.strip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        command = (pending + line).strip()
        pending = ""
        yield _strip_comment(command)


def _strip_comment(command: str) -> str:
    """``cmd  # note`` -> ``cmd`` (a ``#`` after whitespace, outside quotes)."""
    quote = ""
    for position, char in enumerate(command):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and position and command[position - 1].isspace():
            return command[:position].rstrip()
    return command


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    store = tmp_path / "store.sqlite3"
    project = Project(tmp_path / "project", ANARCHON_BACKEND=f"sqlite:///{store}")
    try:
        yield project
    finally:
        project.kill_background()


@pytest.mark.parametrize("page", PAGES)
def test_every_block_is_marked(page: str) -> None:
    blocks, problems = parse(page)
    assert not problems, "\n".join(problems)
    assert blocks, f"no python or shell blocks found in docs/{page}"


SAMPLE = """\
# Sample

```python
print("unmarked")
```

<!-- test: file pkg/app.py
from base import scheduler
-->
```python
scheduler.every("x", "1s")
```

- an item:

  <!-- test: run -->
  ```console
  $ anarchon jobs app:scheduler \\
        --count 2   # two slots
  some output
  $ sleep 100 &
  ```

<!-- test: skip -->
```bash
pip install anarchon
```

<!-- test: jump -->
```sh
true
```

<!-- test: run -->

Text between a marker and its fence.

```yaml
key: value
```
"""


def test_the_marker_parser_reports_every_problem() -> None:
    blocks, problems = parse("sample.md", SAMPLE)
    assert problems == [
        "docs/sample.md:3: a python block without a <!-- test: ... --> marker",
        "docs/sample.md:25: a skip marker needs a reason: <!-- test: skip REASON -->",
        "docs/sample.md:30: unknown marker action 'jump'; expected one of "
        "['append', 'file', 'run', 'skip']",
        "docs/sample.md:34: a marker not right before a fence",
    ]
    assert [(b.line, b.lang, b.action, b.argument) for b in blocks] == [
        (10, "python", "file", "pkg/app.py"),
        (17, "console", "run", ""),
    ]
    assert blocks[0].prelude == "from base import scheduler\n"
    assert blocks[0].code == 'scheduler.every("x", "1s")\n'
    assert list(shell_commands(blocks[1])) == [
        "anarchon jobs app:scheduler --count 2",
        "sleep 100 &",
    ]


# -- getting started ---------------------------------------------------------------------


def test_getting_started(project: Project) -> None:
    """``app.py`` runs in three ``anarchon run`` processes; a manual run is recorded."""
    blocks = load("getting-started.md")
    project.write_blocks(blocks)
    project.run_blocks(blocks)
    pids = {process.pid for _, process in project.background}
    assert len(pids) == 3, "the page starts three instances"
    backend = ["--backend", project.env["ANARCHON_BACKEND"]]
    cli = ["-m", "anarchon_core"]  # the `anarchon` command

    def live() -> list[dict[str, Any]] | None:
        for number, (what, process) in enumerate(project.background):
            assert process.poll() is None, f"{what} exited:\n{project.log(number)}"
        lines = project.python(*cli, "instances", *backend, "--json").splitlines()
        found = [json.loads(line) for line in lines if line.startswith("{")]
        return found if {entry["pid"] for entry in found} >= pids else None

    instances = poll("the three instances to register", live)
    assert all(set(entry["jobs"]) == {"cache.refresh", "reports.daily"} for entry in instances)
    reply = project.python(*cli, "trigger", "cache.refresh", *backend)
    requested = re.search(r"slot (\d+)", reply)
    assert requested is not None, reply
    slot = int(requested.group(1))

    def recorded() -> dict[str, Any] | None:
        lines = project.python(
            *cli, "history", *backend, "--job", "cache.refresh", "--json"
        ).splitlines()
        for record in map(json.loads, lines):
            if record["slot"] == slot and record["status"] == "success":
                return dict(record)
        return None

    record = poll("the manual run of cache.refresh to succeed", recorded)
    assert record["origin"] == "manual"
    runners = {instance["instance_id"]: instance["pid"] for instance in instances}
    assert runners.get(record["instance_id"]) in pids
    project.stop_background()


# -- Django -------------------------------------------------------------------------------

MANAGE_PY = """\
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "myproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""

SETTINGS_PROLOGUE = """\
# The test project's settings; the docs' settings block follows.
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "docs-examples-only"
DEBUG = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
PROJECT_APPS = list(INSTALLED_APPS)
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

"""

SETTINGS_EPILOGUE = """\
# The docs write `...` for the project's own apps: these are the test project's.
INSTALLED_APPS = [
    *PROJECT_APPS,
    *(app for app in INSTALLED_APPS if app is not Ellipsis and app not in PROJECT_APPS),
    "orders",
    "reports",
]
"""

ORDERS_MODELS = """\
from django.db import models


class Order(models.Model):
    synced = models.BooleanField(default=False)


class Account(models.Model):
    active = models.BooleanField(default=True)
    balance = models.IntegerField(default=0)
    rate = models.IntegerField(default=0)
"""

DJANGO_JOBS = {
    "orders.sync",
    "billing.nightly",
    "search.reindex",
    "billing.accrue",
    "reports.daily",
}

CHECK_DJANGO = """\
import runpy

import django

django.setup()

from anarchon_core.testing import run_once
from anarchon_django import scheduler
from orders.models import Account
from reports.models import ReportRun

import myproject.asgi

assert callable(myproject.asgi.application)
hooks = runpy.run_path("gunicorn.conf.py")
assert callable(hooks["post_worker_init"]) and callable(hooks["worker_exit"])

assert set(scheduler.jobs) == JOBS, sorted(scheduler.jobs)
for name in ("orders.sync", "billing.nightly", "search.reindex"):
    run_once(scheduler, name)

# transactional=True: the update runs (and commits) inside the job's transaction.
Account.objects.create(active=True, balance=10, rate=2)
Account.objects.create(active=False, balance=10, rate=2)
run_once(scheduler, "billing.accrue")
assert sorted(Account.objects.values_list("balance", flat=True)) == [10, 12]

# task=: each run enqueues send_report (the immediate backend runs it at once), and
# the task does its work once per slot however often it is enqueued.
first = run_once(scheduler, "reports.daily", slot=1_800_000_000_000)
again = run_once(scheduler, "reports.daily", slot=1_800_000_000_000)
assert first.ctx.meta["task_id"] and again.ctx.meta["task_id"], first.ctx.meta
assert [run.slot for run in ReportRun.objects.all()] == [1_800_000_000_000]
assert ReportRun.objects.get().sent_at is not None
print("django blocks ok")
"""


def test_django(project: Project) -> None:
    """The blocks form a project that migrates, lists and checks its jobs, and runs them."""
    blocks = load("django.md")
    project.env["DJANGO_SETTINGS_MODULE"] = "myproject.settings"
    project.write("manage.py", MANAGE_PY)
    project.write("myproject/__init__.py", "")
    project.write("myproject/settings.py", SETTINGS_PROLOGUE)
    for app in ("orders", "reports"):
        project.write(f"{app}/__init__.py", "")
    project.write("orders/models.py", ORDERS_MODELS)
    project.write_blocks(blocks)
    if django.VERSION < (6, 0):  # the page's comment: the django_tasks backport on 5.2
        tasks = project.root / "reports" / "tasks.py"
        text = tasks.read_text()
        assert "from django.tasks import task" in text, text
        tasks.write_text(text.replace("from django.tasks import", "from django_tasks import"))
    project.write("myproject/settings.py", SETTINGS_EPILOGUE, append=True)
    project.python("manage.py", "makemigrations", "orders", "reports", what="makemigrations")

    project.run_blocks(blocks)  # migrate, anarchon jobs
    listing = next(out for command, out in project.outputs.items() if "anarchon jobs" in command)
    missing = {name for name in DJANGO_JOBS if name not in listing}
    assert not missing, f"manage.py anarchon jobs does not list {sorted(missing)}:\n{listing}"
    checked = project.python("manage.py", "check", what="manage.py check")
    assert "no issues" in checked, checked

    project.write("check_django.py", f"JOBS = set({sorted(DJANGO_JOBS)!r})\n")
    project.write("check_django.py", CHECK_DJANGO, append=True)
    assert "django blocks ok" in project.python("check_django.py", what="the Django jobs")


# -- FastAPI ------------------------------------------------------------------------------

TOKEN = "docs-example-token"

CHECK_FASTAPI = """\
import asyncio

import httpx
from asgi_lifespan import LifespanManager

TIMEOUT_S = 60


async def serve(app):
    manager = LifespanManager(app, startup_timeout=TIMEOUT_S, shutdown_timeout=TIMEOUT_S)
    return manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://testserver"
    )


async def registered(client, instance_id):
    # Poll the API until the instance is in the registry (start() spawns that write).
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while instance_id not in (await client.get("/anarchon/api/instances")).text:
        assert asyncio.get_running_loop().time() < deadline, "the instance never registered"
        await asyncio.sleep(0.1)


async def check_app():
    import app as module

    manager, client = await serve(module.app)
    async with manager, client:
        assert module.scheduler.running
        assert module.app.state.anarchon is module.scheduler
        health = await client.get("/anarchon/api/health")
        assert health.status_code == 200, health.text
        jobs = await client.get("/anarchon/api/jobs")
        assert "cache.refresh" in jobs.text, jobs.text
        await registered(client, module.scheduler.instance_id)  # trigger needs a live one
        anonymous = await client.post("/cache/refresh")
        assert anonymous.status_code == 401, anonymous.text  # an action needs a caller
        operator = {"Authorization": "Bearer " + TOKEN}
        triggered = await client.post("/cache/refresh", headers=operator)
        assert triggered.status_code == 200, triggered.text
        assert isinstance(triggered.json()["slot"], int), triggered.text
    assert not module.scheduler.running
    assert not hasattr(module.app.state, "anarchon")


async def check_composed():
    import composed

    manager, client = await serve(composed.app)
    async with manager, client:
        assert composed.scheduler.running
        http = composed.app.state.http
        assert not http.is_closed
    assert not composed.scheduler.running
    assert http.is_closed


async def check_router_lifespan():
    import router_lifespan

    manager, client = await serve(router_lifespan.app)
    async with manager, client:
        assert router_lifespan.scheduler.running
        assert not router_lifespan.app.state.http.is_closed
    assert not router_lifespan.scheduler.running


async def check_auth():
    import auth_app

    manager, client = await serve(auth_app.app)
    async with manager, client:
        anonymous = await client.get("/anarchon/api/jobs")
        assert anonymous.status_code == 401, anonymous.text
        wrong = await client.get("/anarchon/api/jobs", headers={"Authorization": "Bearer no"})
        assert wrong.status_code == 401, wrong.text
        bearer = {"Authorization": "Bearer " + TOKEN}
        jobs = await client.get("/anarchon/api/jobs", headers=bearer)
        assert jobs.status_code == 200, jobs.text
        pause = "/anarchon/api/jobs/cache.refresh/pause"
        paused = await client.post(pause, headers=bearer, json={})
        assert paused.status_code == 200, paused.text
    assert not auth_app.scheduler.running


async def main():
    await check_app()
    await check_composed()
    await check_router_lifespan()
    await check_auth()


asyncio.run(main())

import test_app  # the page's test, called as pytest would (it takes no fixtures)

test_app.test_app()
print("fastapi blocks ok")
"""


def test_fastapi(project: Project) -> None:
    """Each app of the page starts and stops its scheduler through its lifespan."""
    blocks = load("fastapi.md")
    project.env["ANARCHON_DASHBOARD_TOKEN"] = project.env["OPS_TOKEN"] = TOKEN
    project.write_blocks(blocks)
    project.run_blocks(blocks)
    project.write("check_fastapi.py", f"TOKEN = {TOKEN!r}\n{CHECK_FASTAPI}")
    assert "fastapi blocks ok" in project.python("check_fastapi.py", what="the FastAPI apps")


# -- Celery -------------------------------------------------------------------------------

CHECK_CELERY = """\
import uuid

import anarchon_celery
import proj

# beat's own constructor: reads beat_schedule and maps every entry to an anarchon job
# (a bad entry or setting raises here); no connection, no thread.
beat = anarchon_celery.Scheduler(app=proj.app)
try:
    assert {"sync", "nightly"} <= set(beat.schedule), sorted(beat.schedule)
    info = beat.info
    assert "redis://localhost:6379/2" in info and "namespace 'proj'" in info, info
    assert f"{len(beat.schedule)} entries" in info, info
finally:
    beat.close()

for entry in proj.app.conf.beat_schedule.values():  # every entry's task is defined
    assert entry["task"] in proj.app.tasks, entry
nightly = proj.app.conf.beat_schedule["nightly"]["schedule"]
assert anarchon_celery.cron_expression(nightly) == "0 3 * * *"
assert anarchon_celery.job_name("sync", "proj") == "sync"
assert anarchon_celery.job_name("every 10 seconds", "proj").startswith("every-10-seconds-")
task_id = anarchon_celery.task_id_for("proj:sync", 1_800_000_000_000)
assert task_id == anarchon_celery.task_id_for("proj:sync", 1_800_000_000_000)
uuid.UUID(task_id)
print("celery blocks ok")
"""


def test_celery(project: Project) -> None:
    """The configuration block maps onto anarchon jobs without starting beat."""
    blocks = load("celery.md")
    project.write_blocks(blocks)
    project.run_blocks(blocks)
    project.write("check_celery.py", CHECK_CELERY)
    assert "celery blocks ok" in project.python("check_celery.py", what="the Celery mapping")
