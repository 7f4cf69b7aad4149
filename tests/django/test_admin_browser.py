"""The admin's dashboard in a real headless Chromium, against ``live_server``.

A superuser logs in through the admin's login form, opens the dashboard from the
history list, sees the jobs of a live instance and a run, and pauses a job with the
page's button (CSRF token from the cookie); the store must record the pause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chrome import chrome, wait_until
from selenium.webdriver.common.by import By
from test_admin import seed

from anarchon_django import _admin_dashboard
from anarchon_django.backend import DjangoBackend

pytestmark = pytest.mark.slow


@pytest.fixture
def dashboard(backend: DjangoBackend) -> Iterator[None]:
    _admin_dashboard.close_dashboard()
    yield
    _admin_dashboard.close_dashboard()


def drain_errors(browser: Any) -> None:
    """Read the console's errors so far: only the admin's own /favicon.ico is allowed.

    The admin's pages ask for /favicon.ico, which the test project lacks; the dashboard
    page never does (its icon link points at itself). Any other error fails the test.
    """
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert all("/favicon.ico" in e["message"] for e in errors), errors


def test_a_superuser_pauses_a_job_from_the_admin_dashboard(
    live_server: Any,
    django_user_model: Any,
    backend: DjangoBackend,
    runner: asyncio.Runner,
    dashboard: None,
    tmp_path: Path,
) -> None:
    runner.run(seed(backend))
    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pw")
    with chrome(tmp_path) as browser:
        browser.get(f"{live_server.url}/admin/anarchon_django/historyrecord/")
        assert "/admin/login/" in browser.current_url
        browser.find_element(By.ID, "id_username").send_keys("boss")
        browser.find_element(By.ID, "id_password").send_keys("s3cret-pw")
        browser.find_element(By.CSS_SELECTOR, 'input[type="submit"]').click()
        link = wait_until(
            browser,
            "the history list's dashboard link",
            lambda b: b.find_elements(By.ID, "anarchon-dashboard-link"),
        )
        assert "shop.report" in browser.find_element(By.ID, "result_list").text
        drain_errors(browser)
        link[0].click()
        assert browser.current_url.endswith("/admin/anarchon_django/historyrecord/dashboard/")

        for job in ("shop.sync", "shop.report"):
            wait_until(
                browser,
                f"the row of {job}",
                lambda b, job=job: b.find_elements(By.CSS_SELECTOR, f'#jobs tr[data-job="{job}"]'),
            )
        wait_until(
            browser,
            "the store's health",
            lambda b: b.find_element(By.ID, "health").get_attribute("data-status") == "ok",
        )
        # a run: the failed run of shop.report, in the runs view
        browser.find_element(By.CSS_SELECTOR, '#tabs button[data-view="runs"]').click()
        failed = wait_until(
            browser,
            "the failed run of shop.report",
            lambda b: b.find_elements(
                By.CSS_SELECTOR, '#runs tbody tr[data-job="shop.report"][data-status="failed"]'
            ),
        )
        assert failed[0].get_attribute("data-attempt") == "1"
        browser.find_element(By.CSS_SELECTOR, '#tabs button[data-view="jobs"]').click()

        assert runner.run(backend.paused_jobs()) == set()
        browser.find_element(
            By.CSS_SELECTOR, 'button[data-action="pause"][data-job="shop.sync"]'
        ).click()
        wait_until(
            browser,
            "the store to record the pause",
            lambda b: "shop.sync" in runner.run(backend.paused_jobs()),
        )
        wait_until(
            browser,
            "the paused badge of shop.sync",
            lambda b: b.find_elements(
                By.CSS_SELECTOR, '#jobs tr[data-job="shop.sync"] .badge-paused'
            ),
        )
        status = browser.find_element(By.ID, "action-status")
        assert status.get_attribute("data-state") == "ok", status.text
        drain_errors(browser)  # chrome() fails on any error logged after this
        shot = tmp_path / "admin-dashboard.png"
        browser.save_screenshot(str(shot))
        print(f"admin dashboard screenshot: {shot}")
        assert shot.stat().st_size > 10_000
    assert runner.run(backend.paused_jobs()) == {"shop.sync"}
