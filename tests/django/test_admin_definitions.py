"""The admin's pages of stored definitions (``/admin/anarchon_django/job/``).

Every write goes through the ORM store (on the dashboard's loop thread), so these tests
use ``transactional_db`` through the ``backend`` fixture and read what the store holds
back with the store's own calls, never the ORM alone.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from test_admin import record, rows

from anarchon_core import stored_jobs
from anarchon_core.backend import InstanceInfo
from anarchon_core.definitions import Definition
from anarchon_core.errors import ConflictError
from anarchon_core.records import Origin, Status
from anarchon_django import _admin_dashboard, _scheduler
from anarchon_django._scheduler import DjangoScheduler
from anarchon_django.backend import DjangoBackend
from anarchon_django.models import Job, Run

CHANGELIST = "admin:anarchon_django_job_changelist"
ADD = "admin:anarchon_django_job_add"
MINUTE = 60_000


@pytest.fixture(autouse=True)
def dashboard(backend: DjangoBackend) -> Iterator[None]:
    """Close the admin's own store (its loop thread) before the database goes."""
    _admin_dashboard.close_dashboard()
    yield
    _admin_dashboard.close_dashboard()


def store(runner: asyncio.Runner, backend: DjangoBackend, definition: Definition) -> Definition:
    return runner.run(stored_jobs.add_definition(backend, definition, None))


def held(runner: asyncio.Runner, backend: DjangoBackend, *targets: str, jobs: Any = None) -> None:
    """A live instance that holds ``targets`` (and lists ``jobs``)."""

    async def register() -> None:
        now = await backend.now_ms()
        info = InstanceInfo(
            "web-1:1:a", "web-1", 1, "0.1.0", now, now, jobs=jobs or {}, targets=targets
        )
        await backend.register(info, ttl_ms=10 * MINUTE)

    runner.run(register())


def read(runner: asyncio.Runner, backend: DjangoBackend, name: str) -> Definition | None:
    return runner.run(stored_jobs.get_definition(backend, name, None))


def change_url(name: str) -> str:
    return reverse("admin:anarchon_django_job_change", args=[Job.objects.get(job=name).pk])


def errors(html: str) -> str:
    """The text of the page's error lists and error note (not the values echoed back)."""
    found = re.findall(
        r'<(?:ul class="errorlist[^"]*"|p class="errornote")[^>]*>(.*?)</(?:ul|p)>', html, re.S
    )
    return " ".join(re.sub(r"<[^>]+>", " ", part) for part in found)


def form(definition: Definition | None = None, **changes: Any) -> dict[str, Any]:
    """The POST data of the form: ``definition``'s values, then ``changes``."""
    data: dict[str, Any] = {
        "name": "reports.daily",
        "kind": "every",
        "every": "10s",
        "offset": "",
        "cron": "",
        "tz": "UTC",
        "day_or": "on",
        "at": "",
        "target": "reports.send",
        "args": "[]",
        "kwargs": "{}",
        "options": "{}",
        "target_options": "{}",
        "enabled": "on",
        "reason": "",
        "start_at": "",
        "end_at": "",
        "description": "",
        "version": "",
    }
    if definition is not None:
        data.update(name=definition.name, target=definition.target, version=definition.version)
    data.update(changes)
    return {k: v for k, v in data.items() if v is not False}


def test_a_definition_is_added_through_the_store(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    held(runner, backend, "reports.send")
    page = admin_client.get(reverse(ADD)).content.decode()
    assert '<option value="reports.send">reports.send</option>' in page
    response = admin_client.post(
        reverse(ADD),
        form(
            kind="cron",
            cron="0 7 * * 1-5",
            tz="Europe/Athens",
            kwargs='{"kind": "sales"}',
            target_options='{"queue": "reports"}',
            description="the sales report",
        ),
    )
    assert response.status_code == 302, response.content.decode()
    stored = read(runner, backend, "reports.daily")
    assert stored is not None and stored.version > 0
    assert stored.to_json()["schedule"] == {"cron": "0 7 * * 1-5", "tz": "Europe/Athens"}
    assert stored.kwargs == {"kind": "sales"} and stored.target_options == {"queue": "reports"}
    assert stored.owner == "store" and stored.description == "the sales report"
    again = admin_client.post(reverse(ADD), form())
    assert again.status_code == 200
    assert "a definition named &#x27;reports.daily&#x27; exists already" in again.content.decode()


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"every": "10 parsecs"}, "10 parsecs"),
        ({"kind": "cron", "cron": "61 * * * *"}, "61 * * * *"),
        ({"kind": "at", "at": "tomorrow"}, "tomorrow"),
        ({"kwargs": "[1, 2]"}, "kwargs"),
        ({"args": "{not json"}, "Enter a valid JSON"),
        ({"name": "has:colon"}, "may not contain &#x27;:&#x27;"),
        ({"options": '{"timeout_ms": "forever"}'}, "forever"),
        ({"start_at": "2026-12-02T00:00:00Z", "end_at": "2026-12-01T00:00:00Z"}, "before"),
        ({"target": "not.held"}, "Select a valid choice"),
        ({"tz": "Mars/Olympus"}, "Select a valid choice"),
    ],
)
def test_the_form_refuses_a_bad_value_naming_it(
    admin_client: Client,
    runner: asyncio.Runner,
    backend: DjangoBackend,
    changes: dict[str, str],
    error: str,
) -> None:
    held(runner, backend, "reports.send")
    response = admin_client.post(reverse(ADD), form(**changes))
    assert response.status_code == 200
    assert error in errors(response.content.decode())
    assert read(runner, backend, "reports.daily") is None


def test_a_change_names_the_version_read_and_a_stale_one_is_refused(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    held(runner, backend, "reports.send")
    first = store(
        runner, backend, Definition.create("reports.daily", {"every": "10s"}, "reports.send")
    )
    url = change_url("reports.daily")
    page = admin_client.get(url).content.decode()
    assert f'name="version" value="{first.version}"' in page
    assert admin_client.post(url, form(first, every="20s")).status_code == 302
    second = read(runner, backend, "reports.daily")
    assert second is not None and second.version > first.version
    assert second.to_json()["schedule"] == {"every": "20s"}
    # Someone else saved meanwhile: the page of version `first` is refused, nothing written.
    stale = admin_client.post(url, form(first, every="30s"))
    assert stale.status_code == 200
    text = errors(stale.content.decode())
    assert "Someone changed this definition since you opened it" in text
    assert f"you edited version {first.version}" in text
    assert read(runner, backend, "reports.daily") == second
    # Saved unchanged: no new version (every replica would plan the job again).
    assert admin_client.post(url, form(second, every="20s")).status_code == 302
    assert read(runner, backend, "reports.daily") == second


def test_the_page_shows_the_next_slots_in_the_zone_with_dst_marked_and_the_runs(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    quarterly = Definition.create(
        "reports.quarterly", {"cron": "0 3 1 1,4,7,10 *", "tz": "Europe/Athens"}, "reports.send"
    )
    store(runner, backend, quarterly)
    held(runner, backend, "reports.send")
    page = admin_client.get(change_url("reports.quarterly")).content.decode()
    slots = page.split('id="anarchon-next-slots"', 1)[1].split("</fieldset>", 1)[0]
    assert slots.count('class="anarchon-slot"') == 5
    assert "03:00:00 EET (+0200)" in slots and "03:00:00 EEST (+0300)" in slots
    assert "the offset changes before this slot" in slots  # a DST change within 5 quarters
    assert "no run yet" in page


def test_the_list_shows_each_definitions_newest_run(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    for name in ("ran", "never"):
        store(runner, backend, Definition.create(name, {"every": "1m"}, "reports.send"))
    now = runner.run(backend.now_ms())
    older, newer = now - now % MINUTE - 2 * MINUTE, now - now % MINUTE - MINUTE
    runner.run(record(backend, "ran", older))
    runner.run(record(backend, "ran", newer, Status.FAILED, error="ValueError: no rows"))
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    listed = {row.split()[0]: row for row in rows(page)}
    assert "failed" in listed["ran"] and "success" not in listed["ran"]
    assert "–" in listed["never"]


def test_a_target_no_live_instance_holds_is_flagged(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    store(runner, backend, Definition.create("orphan", {"every": "1m"}, "gone.task"))
    held(runner, backend, "reports.send")
    listed = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "gone.task (no live instance holds it)" in listed
    page = admin_client.get(change_url("orphan")).content.decode()
    assert "No live instance holds this definition's target" in page
    assert "gone.task (no live instance holds it)</option>" in page


def test_the_list_pages_searches_and_filters_without_counting_everything(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    for n in range(60):
        store(
            runner,
            backend,
            Definition.create(
                f"job-{n:02d}", {"every": f"{n + 1}m"}, "reports.send", enabled=n % 10 != 0
            ),
        )
    first = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert first.count('<th class="field-job"') == 50
    assert "job-00" in first and "job-50" not in first
    second = admin_client.get(reverse(CHANGELIST) + "?p=2").content.decode()
    assert "job-50" in second and "job-59" in second
    found = admin_client.get(reverse(CHANGELIST) + "?q=job-4").content.decode()
    assert "job-41" in found and "job-39" not in found
    disabled = admin_client.get(reverse(CHANGELIST) + "?enabled=no").content.decode()
    assert all(f"job-{n:02d}" in disabled for n in range(0, 60, 10))
    assert "job-01" not in disabled


def test_a_code_jobs_copy_is_read_only_with_its_source(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    code = Definition.create(
        "shop.sync",
        {"every": "1m"},
        "shop.sync",
        owner="code",
        description="code job shop.jobs:12 (sync)",
    )
    runner.run(backend.write_definition("shop.sync", code.body(), expected=0))
    url = change_url("shop.sync")
    page = admin_client.get(url).content.decode()
    assert 'name="_save"' not in page
    assert "code job shop.jobs:12 (sync) (read-only: change it in the code)" in page
    assert admin_client.post(url, form(code, every="2m")).status_code == 403
    delete = reverse("admin:anarchon_django_job_delete", args=[Job.objects.get(job="shop.sync").pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert read(runner, backend, "shop.sync") is not None


def test_changes_need_the_jobs_model_permissions(
    client: Client, django_user_model: Any, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    held(runner, backend, "reports.send")
    first = store(
        runner, backend, Definition.create("reports.daily", {"every": "10s"}, "reports.send")
    )
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(viewer)
    url = change_url("reports.daily")
    page = client.get(url).content.decode()
    assert 'name="_save"' not in page and "10s" in page
    assert client.post(url, form(first, every="20s")).status_code == 403
    assert client.post(reverse(ADD), form(name="other")).status_code == 403
    assert read(runner, backend, "reports.daily") == first
    outsider = django_user_model.objects.create_user("outsider", password="pw", is_staff=True)
    client.force_login(outsider)
    assert client.get(reverse(CHANGELIST)).status_code == 403


def test_disable_enable_and_delete_go_through_the_store(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    for name in ("a", "b"):
        store(runner, backend, Definition.create(name, {"every": "1m"}, "reports.send"))
    pks = list(Job.objects.filter(job__in=["a", "b"]).values_list("pk", flat=True))
    admin_client.post(reverse(CHANGELIST), {"action": "disable_selected", "_selected_action": pks})
    a = read(runner, backend, "a")
    assert a is not None and not a.enabled and a.reason == "disabled in the admin by admin"
    admin_client.post(reverse(CHANGELIST), {"action": "enable_selected", "_selected_action": pks})
    a = read(runner, backend, "a")
    assert a is not None and a.enabled and a.reason is None
    delete = reverse("admin:anarchon_django_job_delete", args=[Job.objects.get(job="a").pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert read(runner, backend, "a") is None
    b_pk = Job.objects.get(job="b").pk
    admin_client.post(
        reverse(CHANGELIST),
        {"action": "delete_selected", "_selected_action": [b_pk], "post": "yes"},
    )
    assert read(runner, backend, "b") is None
    assert not rows_of(admin_client.get(reverse(CHANGELIST)).content.decode())


def test_run_now_requests_a_manual_run(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    daily = store(
        runner, backend, Definition.create("reports.daily", {"cron": "0 7 * * *"}, "reports.send")
    )
    held(runner, backend, "reports.send", jobs={"reports.daily": daily.fingerprint()})
    pk = Job.objects.get(job="reports.daily").pk
    page = admin_client.get(change_url("reports.daily")).content.decode()
    assert 'id="anarchon-run-now"' in page
    run_now = reverse("admin:anarchon_django_job_run", args=[pk])
    assert admin_client.get(run_now).status_code == 405
    response = admin_client.post(run_now, follow=True)
    assert "a manual run is requested" in response.content.decode()
    runs = Run.objects.filter(job="reports.daily")
    assert [(run.origin, run.state) for run in runs] == [(Origin.MANUAL.value, "pending")]
    # The next slots are the schedule's, as before: a manual run does not move them.
    after = admin_client.get(change_url("reports.daily")).content.decode()
    assert next_slots(after) == next_slots(page)
    assert all(slot.endswith("T07:00:00.000Z") for slot in next_slots(after))
    assert read(runner, backend, "reports.daily") == daily
    assert json.loads(Job.objects.get(job="reports.daily").definition or "{}")["enabled"]


def next_slots(html: str) -> list[str]:
    """The UTC column of a definition page's next slots."""
    table = html.split('id="anarchon-next-slots"', 1)[1].split("</fieldset>", 1)[0]
    return re.findall(r"<td>(\d{4}-\d\d-\d\dT[^<]*Z)</td>", table)


def rows_of(html: str) -> list[str]:
    return rows(html) if 'id="result_list"' in html else []


def test_run_now_needs_the_trigger_permission(
    client: Client, django_user_model: Any, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    daily = store(
        runner, backend, Definition.create("reports.daily", {"cron": "0 7 * * *"}, "reports.send")
    )
    held(runner, backend, "reports.send", jobs={"reports.daily": daily.fingerprint()})
    editor = django_user_model.objects.create_user("editor", password="pw", is_staff=True)
    editor.user_permissions.add(*Permission.objects.filter(codename__in=["view_job", "change_job"]))
    client.force_login(editor)
    assert 'id="anarchon-run-now"' not in client.get(change_url("reports.daily")).content.decode()
    pk = Job.objects.get(job="reports.daily").pk
    assert client.post(reverse("admin:anarchon_django_job_run", args=[pk])).status_code == 403
    assert not Run.objects.filter(job="reports.daily").exists()
    missing = reverse("admin:anarchon_django_job_run", args=[pk + 1000])
    editor.user_permissions.add(Permission.objects.get(codename="trigger_job"))
    assert client.post(missing).status_code == 404


def test_filters_read_the_top_level_of_a_definition(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    tricky = Definition.create(
        "tricky", {"every": "1m"}, "reports.send", kwargs={"enabled": False, "owner": "code"}
    )
    store(runner, backend, tricky)
    store(runner, backend, Definition.create("off", {"every": "1m"}, "reports.send", enabled=False))

    def listed(query: str) -> set[str]:
        html = admin_client.get(reverse(CHANGELIST) + query).content.decode()
        return {row.split()[0] for row in rows_of(html)}

    assert listed("?enabled=no") == {"off"}
    assert listed("?enabled=yes") == {"tricky"}
    assert listed("?owner=code") == set()
    assert listed("?owner=store") == {"tricky", "off"}


def test_a_definition_this_version_cannot_read_is_read_only_and_can_be_deleted(
    admin_client: Client, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    runner.run(backend.write_definition("future", '{"schedule": {"solar": "dawn"}}', expected=0))
    url = change_url("future")
    page = admin_client.get(url).content.decode()
    assert 'name="_save"' not in page
    assert "a definition this version cannot read" in page and "solar" in page
    assert admin_client.post(url, form(name="future")).status_code == 403
    delete = reverse("admin:anarchon_django_job_delete", args=[Job.objects.get(job="future").pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert runner.run(backend.read_definition("future")) is None


def test_another_store_is_not_read_and_says_so(
    admin_client: Client, tmp_path: Any, runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    store(runner, backend, Definition.create("in.orm", {"every": "1m"}, "reports.send"))
    old = _scheduler.reset_scheduler(DjangoScheduler(f"sqlite:///{tmp_path / 'other.db'}"))
    try:
        page = admin_client.get(reverse(CHANGELIST), follow=True).content.decode()
        assert "these pages cannot read its definitions" in page
        assert not rows_of(page)
        assert admin_client.get(reverse(ADD)).status_code == 403
    finally:
        _scheduler.reset_scheduler(old)


def test_a_bulk_delete_says_which_removals_the_store_refused(
    admin_client: Client,
    runner: asyncio.Runner,
    backend: DjangoBackend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("a", "b"):
        store(runner, backend, Definition.create(name, {"every": "1m"}, "reports.send"))
    write_at = stored_jobs.write_at

    async def racing(backend: Any, key: str, body: str | None, version: int) -> int:
        if key == "b":  # someone changed b between the confirmation's read and the removal
            raise ConflictError("changed", current=version + 1)
        return await write_at(backend, key, body, version)

    monkeypatch.setattr(stored_jobs, "write_at", racing)
    pks = list(Job.objects.filter(job__in=["a", "b"]).values_list("pk", flat=True))
    response = admin_client.post(
        reverse(CHANGELIST),
        {"action": "delete_selected", "_selected_action": pks, "post": "yes"},
        follow=True,
    )
    text = response.content.decode()
    assert "Definition &#x27;b&#x27;: Someone changed this definition since you opened it" in text
    assert "1 of the selected definitions were not deleted" in text
    assert "Successfully deleted" not in text
    assert read(runner, backend, "a") is None and read(runner, backend, "b") is not None
