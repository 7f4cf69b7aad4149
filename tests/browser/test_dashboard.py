"""The dashboard in a real headless Chromium, over a store that real processes ran jobs on.

Three worker processes run jobs on one SQLite file; one runner is SIGKILLed so that a
backup takes its run over, and one job is paused. ``anarchon dashboard`` then serves
the store in its own process, and the browser must show all of it and pause a job
through the page, which the store must then record.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from chrome import chrome, free_port, wait_for_http, wait_until
from multiprocess.cluster import cluster, starts
from selenium.webdriver.common.by import By

from anarchon_core import backend_from_url, operations
from anarchon_core.records import Status

pytestmark = pytest.mark.slow

TOKEN = "browser-test-token"
JOBS = [
    {"name": "long", "every": "3s", "sleep_s": 1.5},
    {"name": "tick", "every": "1s"},
    {"name": "report", "every": "1s"},
]


def paused_jobs(url: str) -> set[str]:
    async def read() -> set[str]:
        backend = backend_from_url(url)
        await backend.open()
        try:
            return await backend.paused_jobs()
        finally:
            await backend.close()

    return asyncio.run(read())


def pause(url: str, job: str) -> None:
    async def act() -> None:
        backend = backend_from_url(url)
        await backend.open()
        try:
            await operations.pause(backend, job)
        finally:
            await backend.close()

    asyncio.run(act())


def test_the_dashboard_shows_the_cluster_and_pauses_a_job(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    with cluster(url, tmp_path, jobs=JOBS, heartbeat_ms=100, lease_ms=300, jitter_ms=0) as c:
        c.start_all(3)
        first = c.wait_for(lambda ev: starts(ev, "long"), 8, "a run of long")[0]
        c.signal(c.instance_of(first["pid"]), signal.SIGKILL)
        c.wait_for(
            lambda ev: [
                e for e in ev if e["e"] == "end" and e["job"] == "long" and e["attempt"] == 2
            ],
            8,
            "the takeover of long",
        )
        pause(url, "report")
        c.wait_for(
            lambda ev: [r for r in c.history("report") if r.status == Status.PAUSED],
            5,
            "a paused slot of report",
        )

        port = free_port()
        log = (tmp_path / "dashboard.log").open("wb")
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "anarchon_core",
                "dashboard",
                "--backend",
                url,
                "--port",
                str(port),
                "--allow-actions",
            ],
            env={**os.environ, "ANARCHON_DASHBOARD_TOKEN": TOKEN},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_http(server, port)
            with chrome(tmp_path) as browser:
                browser.get(f"http://127.0.0.1:{port}/#token={TOKEN}")
                for job in ("long", "tick", "report"):
                    wait_until(
                        browser,
                        f"the row of {job}",
                        lambda b, job=job: b.find_elements(
                            By.CSS_SELECTOR, f'#jobs tr[data-job="{job}"]'
                        ),
                    )
                report = browser.find_element(By.CSS_SELECTOR, '#jobs tr[data-job="report"]')
                assert report.find_elements(By.CSS_SELECTOR, ".badge-paused")
                tick = browser.find_element(By.CSS_SELECTOR, '#jobs tr[data-job="tick"]')
                assert not tick.find_elements(By.CSS_SELECTOR, ".badge-paused")

                browser.find_element(By.CSS_SELECTOR, '#jobs tr[data-job="long"]').click()
                takeover = wait_until(
                    browser,
                    "the takeover in the timeline of long",
                    lambda b: b.find_elements(
                        By.CSS_SELECTOR, f'[data-slot="{first["slot"]}"][data-takeover="1"]'
                    ),
                )
                assert takeover[0].get_attribute("data-status") == "success"

                browser.find_element(
                    By.CSS_SELECTOR, 'button[data-action="pause"][data-job="tick"]'
                ).click()
                wait_until(
                    browser, "the store to record the pause", lambda b: "tick" in paused_jobs(url)
                )
                wait_until(
                    browser,
                    "the paused badge of tick",
                    lambda b: b.find_elements(
                        By.CSS_SELECTOR, '#jobs tr[data-job="tick"] .badge-paused'
                    ),
                )
                shot = tmp_path / "dashboard.png"
                browser.save_screenshot(str(shot))
                print(f"dashboard screenshot: {shot}")
                assert shot.stat().st_size > 10_000
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(10)
            log.close()
    assert paused_jobs(url) == {"report", "tick"}
