"""The admin's definition pages in a real headless Chromium, with two real schedulers.

Two ``manage.py anarchon run`` processes hold the target ``shop.report`` on the ORM
store (the test database, which ``live_server`` serves too). A superuser creates a
definition in the admin's form and both processes run its slots, each once; a change of
schedule in the form shows new next slots and the processes follow it without a
restart; a page opened before someone else's save is refused when submitted; a user
who may only view sees no form to save.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from chrome import chrome, wait_until
from django.contrib.auth.models import Permission
from processes import starts
from procs import cluster
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from test_admin_browser import drain_errors

from anarchon_core import stored_jobs
from anarchon_core.definitions import Definition
from anarchon_django import _admin_dashboard
from anarchon_django.backend import DjangoBackend

pytestmark = pytest.mark.slow

JOBS = "/admin/anarchon_django/job/"


def log_in(browser: Any, base: str, user: str, password: str) -> None:
    browser.delete_all_cookies()
    browser.get(f"{base}/admin/login/?next={JOBS}")
    browser.find_element(By.ID, "id_username").send_keys(user)
    browser.find_element(By.ID, "id_password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, 'input[type="submit"]').click()
    # The login page's own URL ends with ?next=…/job/ too: wait for the list's path.
    wait_until(browser, "the definitions list", lambda b: urlsplit(b.current_url).path == JOBS)


def fill(browser: Any, field: str, text: str) -> None:
    box = browser.find_element(By.ID, f"id_{field}")
    box.clear()
    box.send_keys(text)


def save(browser: Any) -> None:
    browser.find_element(By.CSS_SELECTOR, 'input[name="_save"]').click()


def next_slots(browser: Any) -> list[str]:
    """The UTC column of the page's next slots."""
    rows = browser.find_elements(By.CSS_SELECTOR, "#anarchon-next-slots tr.anarchon-slot")
    return [row.find_elements(By.TAG_NAME, "td")[1].text for row in rows]


def listed(runner: asyncio.Runner, backend: DjangoBackend) -> list[str | None]:
    """The fingerprints of ``report`` that the live processes list, one per process (a
    poll: a process between two registry refreshes is simply not listed yet)."""
    live = runner.run(backend.instances())
    return sorted((info.jobs.get("report") for info in live), key=str)


def test_definitions_edited_in_the_admin_are_run_by_two_processes(
    live_server: Any,
    django_user_model: Any,
    backend: DjangoBackend,
    runner: asyncio.Runner,
    tmp_path: Path,
) -> None:
    _admin_dashboard.close_dashboard()
    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pw")
    viewer = django_user_model.objects.create_user("viewer", password="v1ew-only", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    base = live_server.url
    try:
        with (
            cluster(tmp_path, "django://default", [{"name": "tick", "every": "1h"}]) as c,
            chrome(tmp_path) as browser,
        ):
            c.start_all(2)
            log_in(browser, base, "boss", "s3cret-pw")
            browser.get(f"{base}{JOBS}add/")
            fill(browser, "name", "report")
            fill(browser, "every", "1s")
            # the target's choices: what the live processes hold
            Select(browser.find_element(By.ID, "id_target")).select_by_value("shop.report")
            fill(browser, "args", "[1]")
            save(browser)
            wait_until(
                browser,
                "the saved message",
                lambda b: b.find_elements(By.CSS_SELECTOR, ".messagelist .success"),
            )
            c.wait_for(lambda ev: len(starts(ev, "report")) >= 4, 15, "runs every second")

            browser.find_element(By.LINK_TEXT, "report").click()
            before = next_slots(browser)
            assert len(before) == 5 and all(s.endswith(".000Z") for s in before), before
            fill(browser, "every", "2s")
            fill(browser, "offset", "500ms")
            fill(browser, "args", "[2]")
            save(browser)
            changed = time.time()
            browser.find_element(By.LINK_TEXT, "report").click()
            after = next_slots(browser)
            assert len(after) == 5 and all(s.endswith(".500Z") for s in after), after
            c.wait_for(
                lambda ev: len([e for e in starts(ev, "report") if e["t"] > changed + 1]) >= 2,
                15,
                "runs every 2 s",
            )

            # A stale page: someone saves between this page's opening and its submission.
            current = runner.run(stored_jobs.get_definition(backend, "report", None))
            assert current is not None
            # both processes follow the change: each lists the job as now defined
            wait_until(
                browser,
                "both processes to list the changed definition",
                lambda b: listed(runner, backend) == [current.fingerprint()] * 2,
            )
            fill(browser, "description", "my edit")
            theirs = Definition.from_json({**current.to_json(), "description": "theirs"})
            runner.run(stored_jobs.update_definition(backend, theirs, None))
            save(browser)
            error = wait_until(
                browser,
                "the refusal",
                lambda b: b.find_elements(By.CSS_SELECTOR, ".errornote, .errorlist"),
            )
            assert "Someone changed this definition since you opened it" in browser.page_source, (
                error
            )
            kept = runner.run(stored_jobs.get_definition(backend, "report", None))
            assert kept is not None and kept.description == "theirs"

            # A user who may only view: the values, no form to save.
            log_in(browser, base, "viewer", "v1ew-only")
            browser.find_element(By.LINK_TEXT, "report").click()
            assert not browser.find_elements(By.CSS_SELECTOR, 'input[name="_save"]')
            assert "every 2s offset 500ms" in browser.page_source
            drain_errors(browser)  # the admin's own /favicon.ico only
            c.stop_all()
            events, logs = c.events(), c.logs()
    finally:
        _admin_dashboard.close_dashboard()
    assert "Traceback" not in logs
    runs = starts(events, "report")
    ran = Counter(e["slot"] for e in runs)
    assert not {s: n for s, n in ran.items() if n > 1}, "a slot ran twice"
    later = [e for e in runs if e["t"] > changed + 1]
    assert later and all(e["slot"] % 2000 == 500 and e["args"] == [2] for e in later), later
