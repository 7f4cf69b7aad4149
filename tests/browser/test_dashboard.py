"""The dashboard in a real headless Chromium, over a store that real processes ran jobs on.

Three worker processes run jobs on one SQLite file; one runner is SIGKILLed so that a
backup takes its run over, and one job is paused. ``anarchon dashboard`` then serves
the store in its own process, and the browser must show all of it and pause a job
through the page, which the store must then record.

The Definitions tab, over a store of its own, creates, edits (a stale edit refused),
disables and removes a stored definition through its form and buttons; over a
claim-only Redis store it says that the store keeps none, without an error banner.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from chrome import chrome, free_port, wait_for_http, wait_until
from multiprocess.cluster import cluster, starts
from redis_servers import delete_prefix, fresh_prefix, shared_redis_url, with_params
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from anarchon_core import backend_from_url, operations, stored_jobs
from anarchon_core.backend import Backend
from anarchon_core.definitions import Definition
from anarchon_core.records import Status

pytestmark = pytest.mark.slow

TOKEN = "browser-test-token"
JOBS = [
    {"name": "long", "every": "3s", "sleep_s": 1.5},
    {"name": "tick", "every": "1s"},
    {"name": "report", "every": "1s"},
]


T = TypeVar("T")


def on_store(url: str, act: Callable[[Backend], Awaitable[T]]) -> T:
    """``act(backend)`` on the store at ``url``, opened for it alone."""

    async def run() -> T:
        backend = backend_from_url(url)
        await backend.open()
        try:
            return await act(backend)
        finally:
            await backend.close()

    return asyncio.run(run())


def paused_jobs(url: str) -> set[str]:
    return on_store(url, lambda backend: backend.paused_jobs())


def pause(url: str, job: str) -> None:
    on_store(url, lambda backend: operations.pause(backend, job))


@contextmanager
def dashboard(url: str, tmp_path: Path) -> Iterator[int]:
    """``anarchon dashboard --allow-actions`` over ``url`` in its own process: its port."""
    port = free_port()
    with (tmp_path / "dashboard.log").open("wb") as log:
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
            yield port
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(10)


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

        with dashboard(url, tmp_path) as port, chrome(tmp_path) as browser:
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
    assert paused_jobs(url) == {"report", "tick"}


# -- the Definitions tab --------------------------------------------------------------------
_ROW = """
const tr = document.querySelector(`#definitions tr[data-job="${arguments[0]}"]`);
if (!tr) return null;
const text = (sel) => { const e = tr.querySelector(sel); return e ? e.textContent : null; };
return {
  owner: tr.dataset.owner, version: tr.dataset.version, enabled: tr.dataset.enabled,
  held: tr.dataset.targetHeld || null, text: tr.textContent, schedule: text('.def-schedule'),
  reason: text('.def-reason'),
  slots: [...tr.querySelectorAll('td[data-label="Next slots"] time')].map((t) => t.dateTime),
  buttons: [...tr.querySelectorAll('button[data-def-action]')].map((b) => b.dataset.defAction),
};
"""


def shown(browser: WebDriver, job: str) -> dict[str, Any] | None:
    """The row of ``job`` as one snapshot (a poll may re-render the table at any time)."""
    found: dict[str, Any] | None = browser.execute_script(_ROW, job)
    return found


def stored(url: str, job: str) -> Definition | None:
    namespace, _, name = job.rpartition(":")
    return on_store(url, lambda b: stored_jobs.get_definition(b, name, namespace or None))


def press(browser: WebDriver, action: str, job: str) -> None:
    """Click a row's button (``data-def-action``)."""
    wait_until(
        browser,
        f"{action} of {job}",
        lambda b: (
            b.find_element(
                By.CSS_SELECTOR, f'button[data-def-action="{action}"][data-job="{job}"]'
            ).click()
            is None
        ),
    )


def fill(browser: WebDriver, **fields: str) -> None:
    """Type into the definition form's fields, by their ids without ``def-``."""
    for key, value in fields.items():
        box = browser.find_element(By.ID, "def-" + key.replace("_", "-"))
        box.clear()
        box.send_keys(value)


def save(browser: WebDriver) -> None:
    browser.find_element(By.ID, "definition-save").click()


def form_error(browser: WebDriver, status: str) -> str:
    """The form's error box once it shows an answer of ``status``: its text."""
    box = wait_until(
        browser,
        f"the form's {status} message",
        lambda b: [
            e
            for e in b.find_elements(By.ID, "definition-error")
            if e.is_displayed() and e.get_attribute("data-status") == status
        ],
    )[0]
    return str(box.text)


def dialog(browser: WebDriver, answer: str | None = None) -> str:
    """Accept the page's prompt() or confirm(), typing ``answer`` into a prompt: its text."""
    alert: Any = WebDriverWait(browser, 5).until(expected_conditions.alert_is_present())
    text = str(alert.text)
    if answer is not None:
        alert.send_keys(answer)
    alert.accept()
    return text


def test_the_definitions_tab_creates_edits_disables_and_removes_a_definition(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    job = "billing:report"
    with (
        dashboard(url, tmp_path) as port,
        chrome(tmp_path, expect_statuses=(400, 409)) as browser,
    ):
        browser.get(f"http://127.0.0.1:{port}/#token={TOKEN}&view=definitions")
        wait_until(
            browser,
            "the empty list",
            lambda b: b.find_element(By.ID, "definitions-count").text == "0",
        )
        new = browser.find_element(By.ID, "definition-new")
        wait_until(browser, "New definition (actions allowed)", lambda b: new.is_displayed())

        # create: a bad value first (the server's 400 names it; the form stays), then fixed
        new.click()
        form = browser.find_element(By.ID, "definition-form")
        assert form.get_attribute("data-mode") == "create"
        fill(browser, namespace="billing", name="report", every="soon", target="reports.send")
        fill(browser, args="[42]", kwargs='{"fmt": "pdf"}', options='{"timeout_ms": 60000}')
        save(browser)
        assert "'soon'" in form_error(browser, "400")
        assert form.is_displayed() and stored(url, job) is None
        fill(browser, every="10m")
        save(browser)
        created = wait_until(browser, "the new definition's row", lambda b: shown(b, job))
        assert not browser.find_element(By.ID, "definition-editor").is_displayed()
        assert created["owner"] == "store" and created["version"] == "1"
        assert "every 10m" in created["schedule"]
        assert created["held"] == "0"  # no live instance holds reports.send: flagged
        assert "no live instance holds this target" in created["text"]
        assert created["buttons"] == ["edit", "disable", "remove"]
        assert len(created["slots"]) == 5
        made = stored(url, job)
        assert made is not None and made.version == 1 and made.args == (42,)
        assert dict(made.kwargs) == {"fmt": "pdf"} and dict(made.options) == {"timeout_ms": 60000}

        # a code job synced to the store: listed read-only, with its module and line
        code = Definition.create(
            "sync", {"every": "1m"}, "sync", owner="code", description="code job app.jobs:12 (sync)"
        )
        on_store(url, lambda b: b.write_definition("sync", code.body(), expected=0))
        synced = wait_until(browser, "the code job's row", lambda b: shown(b, "sync"))
        assert synced["owner"] == "code" and "app.jobs:12" in synced["text"]
        assert synced["buttons"] == [] and synced["held"] is None

        # edit the schedule: a new version and other next slots
        press(browser, "edit", job)
        wait_until(browser, "the edit form", lambda b: form.get_attribute("data-mode") == "edit")
        assert form.get_attribute("data-version") == "1"
        assert browser.find_element(By.ID, "def-name").get_attribute("readonly") is not None
        Select(browser.find_element(By.ID, "def-kind")).select_by_value("cron")
        fill(browser, cron="0 3 * * *", tz="Europe/Athens")
        save(browser)
        edited_row = wait_until(
            browser,
            "the edited version",  # 2 is the code job's
            lambda b: (r := shown(b, job)) is not None and r["version"] == "3" and r,
        )
        assert (
            "cron 0 3 * * *" in edited_row["schedule"] and "Europe/Athens" in edited_row["schedule"]
        )
        assert len(edited_row["slots"]) == 5 and edited_row["slots"] != created["slots"]
        edited = stored(url, job)
        assert edited is not None and edited.version == 3
        assert edited.schedule.canonical() != made.schedule.canonical()
        assert dict(edited.kwargs) == {"fmt": "pdf"}  # the fields not edited are kept

        # a stale edit: the definition changes in the store while the form is open
        press(browser, "edit", job)
        wait_until(browser, "the form at 3", lambda b: form.get_attribute("data-version") == "3")
        elsewhere = Definition.from_json({**edited.to_json(), "description": "changed elsewhere"})
        on_store(url, lambda b: stored_jobs.update_definition(b, elsewhere, "billing"))
        fill(browser, description="changed in the page")
        save(browser)
        message = form_error(browser, "409")
        assert "changed since you opened it: reload and redo" in message
        assert "version 3" in message and "version 4" in message
        assert form.is_displayed()  # the form keeps what was typed
        description = browser.find_element(By.ID, "def-description")
        assert description.get_attribute("value") == "changed in the page"
        after = stored(url, job)
        assert after is not None and after.version == 4 and after.description == "changed elsewhere"
        browser.find_element(By.ID, "definition-reload").click()  # reads version 4 afresh
        wait_until(browser, "the form at 4", lambda b: form.get_attribute("data-version") == "4")
        assert description.get_attribute("value") == "changed elsewhere"
        browser.find_element(By.ID, "definition-cancel").click()
        assert not browser.find_element(By.ID, "definition-editor").is_displayed()

        # disable, with a reason: no next slots
        wait_until(browser, "the list at 4", lambda b: (shown(b, job) or {})["version"] == "4")
        press(browser, "disable", job)
        assert job in dialog(browser, "maintenance window")
        disabled = wait_until(
            browser,
            "the disabled row",
            lambda b: (r := shown(b, job)) is not None and r["enabled"] == "0" and r,
        )
        assert disabled["reason"] == "maintenance window" and disabled["slots"] == []
        assert "none (disabled)" in disabled["text"] and "enable" in disabled["buttons"]
        off = stored(url, job)
        assert off is not None and not off.enabled and off.reason == "maintenance window"
        assert off.description == "changed elsewhere" and off.version == 5
        shot = tmp_path / "definitions.png"
        browser.save_screenshot(str(shot))
        print(f"definitions screenshot: {shot}")

        # remove
        press(browser, "remove", job)
        assert job in dialog(browser)
        wait_until(browser, "the row to go", lambda b: shown(b, job) is None)
        assert stored(url, job) is None
        status = browser.find_element(By.ID, "action-status")
        assert status.get_attribute("data-state") == "ok", status.text
        assert browser.find_element(By.ID, "error-banner").get_attribute("hidden") is not None


@contextmanager
def claim_only_redis() -> Iterator[str]:
    """A Redis store of the claim-only ``stream-id`` strategy, under a fresh prefix."""
    server = shared_redis_url()
    prefix = fresh_prefix()
    try:
        yield with_params(server, strategy="stream-id", prefix=prefix)
    finally:
        delete_prefix(server, prefix)


def test_a_store_without_definitions_says_so_in_the_tab_without_an_error(tmp_path: Path) -> None:
    with (
        claim_only_redis() as url,
        dashboard(url, tmp_path) as port,
        chrome(tmp_path, expect_statuses=(501,)) as browser,  # instances and definitions
    ):
        browser.get(f"http://127.0.0.1:{port}/#token={TOKEN}&view=definitions")
        note = wait_until(
            browser,
            "the tab's note",
            lambda b: [e for e in b.find_elements(By.ID, "definitions-note") if e.is_displayed()],
        )[0]
        assert "keeps no job definitions" in note.text and "stream-id" in note.text
        assert not browser.find_element(By.ID, "definitions").is_displayed()
        assert not browser.find_element(By.ID, "definition-new").is_displayed()
        # "updated" is shown only after a refresh in which every read succeeded
        wait_until(
            browser,
            "a refresh without errors",
            lambda b: "updated" in b.find_element(By.ID, "last-refresh").text,
        )
        assert browser.find_element(By.ID, "health").get_attribute("data-status") == "ok"
        assert browser.find_element(By.ID, "error-banner").get_attribute("hidden") is not None
        assert note.is_displayed()
