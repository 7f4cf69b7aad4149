"""The dashboard of the FastAPI router in headless Chromium, served by ``uvicorn --workers 3``.

The page and each of its polls may land on any worker; it must show the jobs and the
recent runs that the workers recorded in the shared store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chrome import chrome, wait_until
from fastapi_servers import serve, slots_of
from selenium.webdriver.common.by import By

pytestmark = pytest.mark.slow

JOBS = [{"name": "tick", "every": "1s"}, {"name": "report", "every": "2s"}]


def test_the_dashboard_shows_the_jobs_and_recent_runs(sqlite_url: str, tmp_path: Path) -> None:
    with serve("uvicorn", tmp_path, backend=sqlite_url, jobs=JOBS) as srv:
        srv.wait_ready(3)
        srv.wait_for(lambda ev: len(slots_of(ev, "report", "end")) >= 2, 10, "report runs")
        with chrome(tmp_path) as browser:
            browser.get(f"{srv.base}/anarchon")  # redirected to /anarchon/
            assert browser.current_url.endswith("/anarchon/")
            for job in ("tick", "report"):
                wait_until(
                    browser,
                    f"the row of {job}",
                    lambda b, job=job: b.find_elements(
                        By.CSS_SELECTOR, f'#jobs tr[data-job="{job}"]'
                    ),
                )
            wait_until(
                browser,
                "the store's health",
                lambda b: b.find_element(By.ID, "health").get_attribute("data-status") == "ok",
            )
            assert not browser.find_elements(By.CSS_SELECTOR, "button[data-action]")

            browser.find_element(By.CSS_SELECTOR, '#tabs button[data-view="runs"]').click()
            for job in ("tick", "report"):
                wait_until(
                    browser,
                    f"a successful run of {job}",
                    lambda b, job=job: b.find_elements(
                        By.CSS_SELECTOR, f'#runs tr[data-job="{job}"][data-status="success"]'
                    ),
                )
            shot = tmp_path / "fastapi-dashboard.png"
            browser.save_screenshot(str(shot))
            print(f"dashboard screenshot: {shot}")
            assert shot.stat().st_size > 10_000
            browser.find_element(By.CSS_SELECTOR, '#tabs button[data-view="instances"]').click()
            wait_until(
                browser,
                "the three workers",
                lambda b: (
                    len(b.find_elements(By.CSS_SELECTOR, "#instances tr[data-instance]")) == 3
                ),
            )
            browser.find_element(By.CSS_SELECTOR, '#tabs button[data-view="runs"]').click()
