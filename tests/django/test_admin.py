"""The admin: the read-only run history and the dashboard served inside it.

History records are written by the ORM backend itself (claims and finishes, on its own
thread and connection), so these tests use ``transactional_db`` through the
``backend`` fixture. The dashboard's own store lives on its loop thread: the
``dashboard`` fixture closes it before the test database goes away.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import secrets
import zoneinfo
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from anarchon_core import Scheduler
from anarchon_core.backend import ClaimRequest, InstanceInfo, Lease, Outcome
from anarchon_core.backends import MemoryBackend
from anarchon_core.records import Origin, Status
from anarchon_core.schedules import Every
from anarchon_django import _admin_dashboard
from anarchon_django.admin import BoundedCountPaginator
from anarchon_django.backend import DjangoBackend
from anarchon_django.models import HistoryRecord

MINUTE = 60_000
DAY = 24 * 60 * MINUTE
INSTANCE = "web-1:4242:abc123"
CHANGELIST = "admin:anarchon_django_historyrecord_changelist"
DASHBOARD = "admin:anarchon_django_historyrecord_dashboard"


def api_url(path: str) -> str:
    return reverse("admin:anarchon_django_historyrecord_dashboard_api", args=[path])


async def record(
    backend: DjangoBackend,
    job: str,
    slot: int,
    status: Status = Status.SUCCESS,
    *,
    error: str | None = None,
    instance: str = INSTANCE,
) -> None:
    """One attempt of ``(job, slot)``, claimed and finished through the store."""
    token = secrets.token_hex(8)
    claim = await backend.claim(
        ClaimRequest(
            job=job,
            slot=slot,
            origin=Origin.SCHEDULE,
            token=token,
            instance_id=instance,
            lease_ms=60_000,
            horizon_ms=30 * DAY,
            skip_overlap=True,
        )
    )
    assert claim.outcome == Outcome.WON, claim
    if status != Status.RUNNING:
        await backend.finish(Lease(job, slot, 1, token), status, error=error)


async def seed(backend: DjangoBackend) -> dict[str, int]:
    """A live instance with two jobs; recent runs of both and one of 10 days ago."""
    now = await backend.now_ms()
    recent = now - now % MINUTE - MINUTE
    old = recent - 10 * DAY
    scheduler = Scheduler(MemoryBackend())
    jobs = {
        name: scheduler.add_job(name, Every("1m"), lambda ctx: None).fingerprint
        for name in ("shop.sync", "shop.report")
    }
    await backend.register(
        InstanceInfo(
            instance_id=INSTANCE,
            host="web-1",
            pid=4242,
            version="0.1.0",
            started_at=now,
            last_seen=now,
            jobs=jobs,
        ),
        ttl_ms=10 * MINUTE,
    )
    await record(backend, "shop.sync", recent)
    await record(
        backend,
        "shop.report",
        recent,
        Status.FAILED,
        error=(  # a real traceback: the summary is its last line
            "Traceback (most recent call last):\n"
            '  File "shop/jobs.py", line 12, in report\n'
            '    raise ValueError("the report had no rows")\n'
            "ValueError: the report had no rows"
        ),
        instance="web-2:7:def456",
    )
    await record(backend, "shop.sync", old)
    return {"recent": recent, "old": old}


@pytest.fixture
def dashboard(backend: DjangoBackend) -> Iterator[None]:
    """Close the dashboard's own store (its loop thread) before the database goes."""
    _admin_dashboard.close_dashboard()
    yield
    _admin_dashboard.close_dashboard()


@pytest.fixture
def seeded(backend: DjangoBackend, runner: asyncio.Runner) -> dict[str, int]:
    return runner.run(seed(backend))


def rows(html: str) -> list[str]:
    """The changelist's rows, as text."""
    body = html.split('id="result_list"', 1)[1].split("</table>", 1)[0]
    return [
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", tr)).strip()
        for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body.split("<tbody>", 1)[1], re.S)
    ]


# -- the history -------------------------------------------------------------------------
def test_the_changelist_lists_every_attempt_newest_first(
    admin_client: Client, seeded: dict[str, int]
) -> None:
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    html = response.content.decode()
    listed = rows(html)
    assert len(listed) == 3
    # -slot, -job: the recent sync, the recent report, the old sync
    assert listed[0].startswith("shop.sync") and "success" in listed[0]
    assert INSTANCE in listed[0]
    assert listed[1].startswith("shop.report") and "failed" in listed[1]
    assert "ValueError: the report had no rows" in listed[1]
    assert "Traceback" not in listed[1]  # the summary: the exception alone
    assert "web-2:7:def456" in listed[1]
    assert listed[2].startswith("shop.sync")
    assert "3 history records" in html
    assert reverse(DASHBOARD) in html  # the link to the dashboard
    for column in ("scheduled", "status", "attempt", "instance", "duration", "lateness", "error"):
        assert f"column-{column}" in html or f">{column}<" in html.lower()


def test_scheduled_times_are_shown_in_the_current_time_zone(
    admin_client: Client, seeded: dict[str, int], settings: Any
) -> None:
    settings.TIME_ZONE = "Asia/Tokyo"
    slot = dt.datetime.fromtimestamp(seeded["recent"] / 1000, tz=dt.UTC)
    tokyo = slot.astimezone(zoneinfo.ZoneInfo("Asia/Tokyo"))
    expected = tokyo.strftime("%Y-%m-%d %H:%M:%S JST")  # to the second
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert expected in html


def test_the_history_is_read_only(admin_client: Client, seeded: dict[str, int]) -> None:
    pk = HistoryRecord.objects.filter(job="shop.sync").values_list("pk", flat=True)[0]
    assert admin_client.get(reverse("admin:anarchon_django_historyrecord_add")).status_code == 403
    detail = admin_client.get(reverse("admin:anarchon_django_historyrecord_change", args=[pk]))
    assert detail.status_code == 200  # the view permission shows it, read-only
    assert 'name="_save"' not in detail.content.decode()
    changed = admin_client.post(
        reverse("admin:anarchon_django_historyrecord_change", args=[pk]), {"status": "failed"}
    )
    assert changed.status_code == 403
    delete = reverse("admin:anarchon_django_historyrecord_delete", args=[pk])
    assert admin_client.get(delete).status_code == 403
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    bulk = admin_client.post(
        reverse(CHANGELIST), {"action": "delete_selected", "_selected_action": [pk]}
    )
    assert bulk.status_code in (200, 302)
    assert HistoryRecord.objects.count() == 3
    assert HistoryRecord.objects.get(pk=pk).status == "success"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status": "failed"}, ["shop.report"]),
        ({"job": "shop.sync"}, ["shop.sync", "shop.sync"]),
        ({"instance": "web-2:7:def456"}, ["shop.report"]),
        ({"scheduled": "24h"}, ["shop.sync", "shop.report"]),
        ({"scheduled": "older"}, ["shop.sync"]),
        ({"scheduled": "7d", "job": "shop.sync"}, ["shop.sync"]),
    ],
)
def test_the_filters(
    admin_client: Client, seeded: dict[str, int], query: dict[str, str], expected: list[str]
) -> None:
    response = admin_client.get(reverse(CHANGELIST), query)
    assert response.status_code == 200
    assert [row.split()[0] for row in rows(response.content.decode())] == expected


def test_the_filters_offer_the_jobs_and_instances(
    admin_client: Client, seeded: dict[str, int]
) -> None:
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    for choice in (
        "?job=shop.sync",
        "?job=shop.report",
        "?instance=web-1%3A4242%3Aabc123",
        "?instance=web-2%3A7%3Adef456",
        "?scheduled=today",
        "?status__exact=failed",
    ):
        assert choice in html, choice


@pytest.mark.parametrize("query", [{}, {"status": "success"}, {"p": "1"}])
def test_the_changelist_never_counts_the_whole_table(
    admin_client: Client, seeded: dict[str, int], query: dict[str, str]
) -> None:
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(reverse(CHANGELIST), query).status_code == 200
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts, "the paginator counts (a bounded count)"
    for sql in counts:
        assert "anarchon_attempts" in sql
        assert "LIMIT" in sql.upper(), f"an unbounded count: {sql}"
    q = connection.ops.quote_name  # "name", or `name` on MySQL
    pages = [  # the page of rows (every column selected)
        query["sql"]
        for query in queries.captured_queries
        if f"{q('anarchon_attempts')}.{q('error')}" in query["sql"]
        and "COUNT(" not in query["sql"].upper()
    ]
    assert len(pages) == 1, pages
    order = rf"ORDER BY .*{q('slot')} DESC, .*{q('job')} DESC, .*{q('attempt')} DESC"
    for sql in pages:  # the history index's order, nothing appended (no "id")
        assert re.search(order, sql), sql
        assert f"{q('id')} DESC" not in sql, sql
    scans = [
        q["sql"]
        for q in queries.captured_queries
        if "anarchon_attempts" in q["sql"] and "DISTINCT" in q["sql"].upper()
    ]
    assert not scans, scans  # no SELECT DISTINCT over the table for the filters


def test_the_count_is_bounded_and_says_so(
    admin_client: Client, seeded: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BoundedCountPaginator, "limit", 2)
    html = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "more than 2 history records" in html
    assert len(rows(html)) == 3  # one page: every row is still listed
    paginator = BoundedCountPaginator(HistoryRecord.objects.all(), 1)
    assert paginator.count == 3 and paginator.capped and paginator.num_pages == 3


# -- the dashboard -----------------------------------------------------------------------
def test_the_dashboard_needs_a_staff_login(
    client: Client, django_user_model: Any, seeded: dict[str, int], dashboard: None
) -> None:
    for url in (reverse(DASHBOARD), api_url("jobs")):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    user = django_user_model.objects.create_user("visitor", password="pw")
    client.force_login(user)
    for url in (reverse(DASHBOARD), api_url("jobs")):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    user.is_staff = True
    user.save()
    # staff, but without the view permission on history records
    assert client.get(reverse(DASHBOARD)).status_code == 403
    assert client.get(api_url("jobs")).status_code == 403


def test_the_dashboard_page_and_its_files(admin_client: Client, dashboard: None) -> None:
    page = admin_client.get(reverse(DASHBOARD))
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")
    assert b'src="dashboard.js"' in page.content
    assert "csrftoken" in page.cookies  # sent back by the page as X-CSRFToken
    assert "default-src 'self'" in page["Content-Security-Policy"]
    base = reverse(DASHBOARD)
    js = admin_client.get(base + "dashboard.js")
    assert js.status_code == 200 and js["Content-Type"].startswith("text/javascript")
    assert admin_client.get(base + "dashboard.css").status_code == 200
    assert admin_client.get(base + "secrets.py").status_code == 404


def test_the_api_answers_through_the_admin(
    admin_client: Client, seeded: dict[str, int], dashboard: None
) -> None:
    jobs = admin_client.get(api_url("jobs"))
    assert jobs.status_code == 200, jobs.content
    assert jobs["Cache-Control"].startswith("no-store") or "no-store" in jobs["Cache-Control"]
    body = jobs.json()
    assert {job["job"] for job in body["jobs"]} >= {"shop.sync", "shop.report"}
    assert body["actions"] is True  # a superuser holds every permission
    runs = admin_client.get(api_url("runs"), {"job": "shop.report"}).json()
    assert [(r["job"], r["status"]) for r in runs["runs"]] == [("shop.report", "failed")]
    instances = admin_client.get(api_url("instances")).json()
    assert [i["instance_id"] for i in instances["instances"]] == [INSTANCE]
    health = admin_client.get(api_url("health")).json()
    assert health["status"] == "ok" and health["backend"].startswith("django://default")
    assert admin_client.get(api_url("nothing")).status_code == 404
    assert admin_client.get(api_url("runs"), {"limit": "x"}).status_code == 400


def paused(backend: DjangoBackend, runner: asyncio.Runner) -> set[str]:
    return runner.run(backend.paused_jobs())


def post_json(client: Client, path: str, body: Any = None, **headers: Any) -> Any:
    """An action as the page sends it: a JSON body (``{}`` unless given)."""
    return client.post(
        api_url(path), json.dumps({} if body is None else body), "application/json", **headers
    )


def csrf_client(user: Any) -> tuple[Client, str]:
    """A client that checks CSRF as a browser's requests are checked, and its token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get(reverse(DASHBOARD))
    assert page.status_code == 200
    return client, client.cookies["csrftoken"].value


def test_actions_need_the_csrf_token(
    admin_user: Any,
    seeded: dict[str, int],
    dashboard: None,
    backend: DjangoBackend,
    runner: asyncio.Runner,
) -> None:
    client, token = csrf_client(admin_user)
    pause = "jobs/shop.sync/pause"
    assert post_json(client, pause).status_code == 403
    assert post_json(client, pause, HTTP_X_CSRFTOKEN="forged" * 6).status_code == 403
    assert paused(backend, runner) == set()
    response = post_json(client, pause, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200, response.content
    assert response.json() == {"job": "shop.sync", "paused": True}
    assert paused(backend, runner) == {"shop.sync"}
    resume = post_json(client, "jobs/shop.sync/resume", HTTP_X_CSRFTOKEN=token)
    assert resume.status_code == 200 and paused(backend, runner) == set()


def test_actions_need_the_model_permission(
    django_user_model: Any,
    seeded: dict[str, int],
    dashboard: None,
    backend: DjangoBackend,
    runner: asyncio.Runner,
) -> None:
    staff = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_historyrecord"))
    client, token = csrf_client(staff)
    assert client.get(api_url("jobs")).json()["actions"] is False
    for path, body in (
        ("jobs/shop.sync/pause", None),
        ("jobs/shop.sync/trigger", None),
        ("runs/cancel", {"job": "shop.sync", "slot": seeded["recent"]}),
    ):
        response = post_json(client, path, body, HTTP_X_CSRFTOKEN=token)
        assert response.status_code == 403, (path, response.content)
        assert "permission" in response.json()["error"]
    assert paused(backend, runner) == set()

    staff.user_permissions.add(Permission.objects.get(codename="pause_job"))
    client.force_login(django_user_model.objects.get(pk=staff.pk))  # fresh permission cache
    assert client.get(api_url("jobs")).json()["actions"] is True
    response = post_json(client, "jobs/shop.sync/pause", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200, response.content
    assert paused(backend, runner) == {"shop.sync"}
    # pausing does not grant triggering
    trigger = post_json(client, "jobs/shop.sync/trigger", HTTP_X_CSRFTOKEN=token)
    assert trigger.status_code == 403


def test_definitions_are_changed_with_the_jobs_model_permissions(
    django_user_model: Any, dashboard: None, backend: DjangoBackend, runner: asyncio.Runner
) -> None:
    """The dashboard the admin mounts edits stored definitions with Django's own model
    permissions of the jobs table: add, change and delete each need theirs."""
    staff = django_user_model.objects.create_user("editor", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_historyrecord"))
    client, token = csrf_client(staff)
    body = {"name": "report", "schedule": {"every": "1h"}, "target": "reports.send"}
    refused = post_json(client, "definitions", body, HTTP_X_CSRFTOKEN=token)
    assert refused.status_code == 403 and "anarchon_django.add_job" in refused.json()["error"]
    staff.user_permissions.add(Permission.objects.get(codename="add_job"))
    client.force_login(django_user_model.objects.get(pk=staff.pk))
    added = post_json(client, "definitions", body, HTTP_X_CSRFTOKEN=token)
    assert added.status_code == 200, added.content
    assert added.json()["version"] == 1
    change = {**body, "schedule": {"every": "2h"}, "version": 1}
    refused = post_json(client, "definitions/report", change, HTTP_X_CSRFTOKEN=token)
    assert refused.status_code == 403 and "change_job" in refused.json()["error"]
    staff.user_permissions.add(Permission.objects.get(codename="change_job"))
    client.force_login(django_user_model.objects.get(pk=staff.pk))
    changed = post_json(client, "definitions/report", change, HTTP_X_CSRFTOKEN=token)
    assert changed.status_code == 200, changed.content
    stale = post_json(client, "definitions/report", change, HTTP_X_CSRFTOKEN=token)
    assert stale.status_code == 409 and stale.json()["current"] == changed.json()["version"]
    remove = {"version": changed.json()["version"]}
    refused = post_json(client, "definitions/report/remove", remove, HTTP_X_CSRFTOKEN=token)
    assert refused.status_code == 403 and "delete_job" in refused.json()["error"]
    stored = runner.run(backend.definitions_since(0))
    assert [(d.job, d.version) for d in stored] == [("report", changed.json()["version"])]


def test_a_trigger_names_the_operator_in_the_store(
    admin_user: Any, seeded: dict[str, int], dashboard: None
) -> None:
    client, token = csrf_client(admin_user)
    response = post_json(client, "jobs/shop.sync/trigger", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200, response.content
    from anarchon_django.models import Run

    run = Run.objects.get(job="shop.sync", state="pending")
    # PostgreSQL's statements keep it in requested_by (a column of its layout alone, not
    # mapped); the SQLite store's in fingerprint (its pending rows have no fingerprint yet)
    asked = run.fingerprint
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT requested_by FROM anarchon_runs WHERE id = %s", [run.pk])
            asked = cursor.fetchone()[0]
    assert asked.startswith("django-admin:admin@")


def test_a_cancel_goes_through_the_store(
    admin_user: Any,
    seeded: dict[str, int],
    dashboard: None,
    backend: DjangoBackend,
    runner: asyncio.Runner,
) -> None:
    slot = seeded["recent"] + MINUTE
    runner.run(record(backend, "shop.report", slot, Status.RUNNING))
    client, token = csrf_client(admin_user)
    response = post_json(
        client, "runs/cancel", {"job": "shop.report", "slot": slot}, HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"job": "shop.report", "slot": slot, "cancelled": True}
    assert HistoryRecord.objects.get(job="shop.report", slot=slot).status == "cancelled"


# -- hostile requests --------------------------------------------------------------------
def test_actions_refuse_cross_site_and_non_json_requests(
    admin_user: Any,
    seeded: dict[str, int],
    dashboard: None,
    backend: DjangoBackend,
    runner: asyncio.Runner,
) -> None:
    """Beyond Django's CSRF check: even with a valid token, a superuser's action must be
    a same-origin JSON request."""
    client, token = csrf_client(admin_user)
    cancel = json.dumps({"job": "shop.sync", "slot": seeded["recent"]})
    for content_type, headers, status in (
        ("text/plain", {}, 415),
        ("application/x-www-form-urlencoded", {}, 415),
        ("multipart/form-data; boundary=x", {}, 415),
        ("application/json", {"HTTP_SEC_FETCH_SITE": "cross-site"}, 403),
        ("application/json", {"HTTP_SEC_FETCH_SITE": "same-site"}, 403),
        ("text/plain", {"HTTP_ORIGIN": "https://evil.example"}, 403),  # Django's CSRF too
        ("application/json", {"HTTP_ORIGIN": "http://evil.example"}, 403),
    ):
        for path in ("jobs/shop.sync/pause", "jobs/shop.sync/trigger", "runs/cancel"):
            response = client.post(
                api_url(path), cancel, content_type, HTTP_X_CSRFTOKEN=token, **headers
            )
            assert response.status_code == status, (path, content_type, headers)
    assert paused(backend, runner) == set()
    from anarchon_django.models import Run

    assert not Run.objects.filter(job="shop.sync", state="pending").exists()
    same = {"HTTP_ORIGIN": "http://testserver", "HTTP_SEC_FETCH_SITE": "same-origin"}
    response = post_json(client, "jobs/shop.sync/pause", HTTP_X_CSRFTOKEN=token, **same)
    assert response.status_code == 200, response.content


def test_hostile_action_requests_never_act(
    django_user_model: Any,
    admin_user: Any,
    seeded: dict[str, int],
    dashboard: None,
    backend: DjangoBackend,
    runner: asyncio.Runner,
) -> None:
    """Fuzz: any content type, origin, fetch site and user; only a permitted same-origin
    JSON request may act, and nothing here is one."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    staff = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_historyrecord"))
    clients = {"viewer": csrf_client(staff), "admin": csrf_client(admin_user)}
    statuses: set[int] = set()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        who=st.sampled_from(sorted(clients)),
        path=st.sampled_from(["jobs/shop.sync/pause", "jobs/shop.sync/trigger", "runs/cancel"]),
        content_type=st.sampled_from(
            ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""]
        )
        | st.text(max_size=30),
        origin=st.none() | st.sampled_from(["https://evil.example", "null", "http://testserver"]),
        fetch_site=st.none() | st.sampled_from(["cross-site", "same-site", "same-origin"]),
        body=st.binary(max_size=64),
    )
    def hostile(
        who: str,
        path: str,
        content_type: str,
        origin: str | None,
        fetch_site: str | None,
        body: bytes,
    ) -> None:
        if "json" in content_type.lower():
            content_type = "text/plain"  # only the JSON ones may act
        client, token = clients[who]
        headers = {"HTTP_X_CSRFTOKEN": token}
        if origin is not None:
            headers["HTTP_ORIGIN"] = origin
        if fetch_site is not None:
            headers["HTTP_SEC_FETCH_SITE"] = fetch_site
        response = client.generic("POST", api_url(path), body, content_type, **headers)
        assert response.status_code in (400, 403, 415), (response.status_code, response.content)
        statuses.add(response.status_code)

    hostile()
    assert paused(backend, runner) == set()
    assert {403, 415} <= statuses
