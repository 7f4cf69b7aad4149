"""Headless Debian Chromium for the browser tests, driven by Selenium.

Chromium and its version-matched driver come from Debian (``apt-get install chromium
chromium-driver``; ``.ci/run`` installs them when missing); nothing is downloaded.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait
from services import service_unreachable

T = TypeVar("T")


@contextmanager
def chrome(log_dir: Path, *, expect_statuses: Collection[int] = ()) -> Iterator[webdriver.Chrome]:
    """A headless Chromium; its console errors fail the test at the end.

    Chromium logs every HTTP error answer as an error ("Failed to load resource: the
    server responded with a status of 409"); ``expect_statuses`` names the statuses a
    test provokes on purpose, whose such entries are not failures.
    """
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        service_unreachable(
            "Chromium",
            "chromium or chromedriver is not installed (apt-get install -y "
            "--no-install-recommends chromium chromium-driver)",
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-extensions",
        "--no-first-run",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(driver, log_output=str(log_dir / "chromedriver.log"))
    browser = webdriver.Chrome(service=service, options=options)
    try:
        yield browser
        expected = tuple(f"the server responded with a status of {n} " for n in expect_statuses)
        errors = [
            e
            for e in browser.get_log("browser")
            if e["level"] == "SEVERE"
            and not (e.get("source") == "network" and any(x in e["message"] for x in expected))
        ]
        assert not errors, f"the page logged errors: {errors}"
    finally:
        browser.quit()


def wait_until(
    browser: webdriver.Chrome, what: str, check: Callable[[Any], T], timeout: float = 15
) -> T:
    """Poll ``check(browser)`` until it is truthy; fail naming ``what``. An element that a
    re-render replaced meanwhile (stale) counts as not yet, like a missing one."""
    return WebDriverWait(
        browser, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(check, f"waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_http(process: subprocess.Popen[bytes], port: int, timeout: float = 20) -> None:
    """Wait until ``process`` listens on ``port`` (or fail with its exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listened on port {port} within {timeout}s")
