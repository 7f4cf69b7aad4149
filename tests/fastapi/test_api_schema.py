"""Schemathesis over the JSON API: the FastAPI router's OpenAPI schema, and the same paths
on the standalone ``anarchon dashboard``.

Both servers run in their own processes over one SQLite store, which the FastAPI worker
fills with runs that succeed and fail. Hypothesis draws requests from the schema, valid
ones and invalid ones, for every read and every action; each answer must not be a 5xx
and must match the schema: a documented status code, content type and body.

**CPython 3.11 and ``ast.parse``.** Before the fix of gh-106905, the AST constructor keeps
its recursion counter in state shared by every thread, so two threads that parse at once
(one collecting garbage whose finalizers let the other run) fail with ``SystemError: AST
constructor recursion depth mismatch``. Inside a Hypothesis run this thread parses:
pytest's assertion rewriter parses each schemathesis module imported lazily while cases
are drawn (``dictionaries.py``, ``examples.py``, …), and Hypothesis parses the source of
filter predicates. So the servers run in their own processes (their code never parses
in this one), every schemathesis module is imported before the run (:func:`warm_up`;
the test checks that the run imports none), and while the tests run every
``ast.parse`` of the process takes one lock (:func:`serialised_ast_parse`), so that a
thread left behind by another test cannot interleave with this one's.
"""

from __future__ import annotations

import ast
import gc
import importlib
import os
import pkgutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
from chrome import free_port, wait_for_http
from fastapi_servers import serve, slots_of
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.slow

TOKEN = "schema-test-token"
PREFIX = "/anarchon"
#: Requests per surface: with about 4 ms a request, each surface takes a few seconds.
MAX_EXAMPLES = 500
JOBS = [
    {"name": "tick", "every": "1s"},
    {"name": "shop.report", "every": "1s", "kind": "fail"},
    {"name": "long", "every": "2s", "sleep_s": 1.5},
]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, Any]]]:
    """``{surface: (base URL, OpenAPI schema)}`` of the two servers over one store."""
    tmp = tmp_path_factory.mktemp("schema")
    url = f"sqlite:///{tmp / 'store.sqlite3'}"
    with serve("uvicorn", tmp, backend=url, jobs=JOBS, workers=1, allow_actions=True) as app:
        app.wait_ready(1)
        app.wait_for(lambda ev: len(slots_of(ev, "shop.report")) >= 2, 15, "failed runs")
        schema = httpx.get(f"{app.base}/openapi.json", timeout=10).json()
        port = free_port()
        env = {**os.environ, "ANARCHON_DASHBOARD_TOKEN": TOKEN}
        command = [sys.executable, "-m", "anarchon_core", "dashboard", "--backend", url]
        with (tmp / "dashboard.log").open("wb") as log:
            standalone = subprocess.Popen(
                [*command, "--port", str(port), "--allow-actions"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                wait_for_http(standalone, port)
                # The router's paths (not the test app's own); the standalone server has
                # them without the prefix.
                ours = {p: v for p, v in schema["paths"].items() if p.startswith(PREFIX + "/")}
                local = {**schema, "paths": {p.removeprefix(PREFIX): v for p, v in ours.items()}}
                yield {
                    "fastapi": (app.base, {**schema, "paths": ours}),
                    "standalone": (f"http://127.0.0.1:{port}", local),
                }
            finally:
                standalone.terminate()
                standalone.wait(10)


@pytest.fixture
def serialised_ast_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``ast.parse`` of this process, in any thread, one at a time (gh-106905)."""
    original = ast.parse
    lock = threading.RLock()

    def parse(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return original(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", parse)


def warm_up() -> None:
    """Import every schemathesis module, and let Hypothesis collect the constants of the
    local modules, now rather than inside the run."""
    for module in pkgutil.walk_packages(schemathesis.__path__, "schemathesis."):
        with suppress(ImportError):  # optional integrations (allure, …)
            importlib.import_module(module.name)

    @settings(max_examples=1, database=None, phases=[Phase.generate], deadline=None)
    @given(st.integers())
    def nothing(value: int) -> None:
        pass

    nothing()


def schemathesis_modules() -> set[str]:
    return {name for name in sys.modules if name.split(".")[0] == "schemathesis"}


@pytest.mark.parametrize("surface", ["fastapi", "standalone"])
def test_every_answer_matches_the_schema(
    surface: str, surfaces: dict[str, tuple[str, Any]], serialised_ast_parse: None
) -> None:
    base, raw = surfaces[surface]
    schema = schemathesis.openapi.from_dict(raw)
    operations = sorted(op.ok().label for op in schema.get_all_operations())
    # 4 reads, 3 job actions, cancel; 2 reads and 3 changes of stored definitions
    assert len(operations) == 13, operations
    strategy = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE)
    )
    warm_up()
    imported = schemathesis_modules()
    session = requests.Session()
    sent: Counter[str] = Counter()
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def answers_match(case: Any) -> None:
        response = case.call(base_url=base, session=session, headers=auth(), timeout=10)
        sent[case.operation.label] += 1
        statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    started = time.monotonic()
    answers_match()
    print(
        f"\n{surface}: {sum(sent.values())} requests in {time.monotonic() - started:.1f} s; "
        f"per operation {dict(sorted(sent.items()))}; statuses {dict(sorted(statuses.items()))}"
    )
    assert schemathesis_modules() == imported  # nothing was imported (and parsed) in the run
    assert set(sent) == set(operations)
    assert statuses[200] and statuses[400]


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def test_ast_parse_is_serialised_across_threads(serialised_ast_parse: None) -> None:
    """The workaround holds: a thread that parses all the time, and garbage whose
    finalizers run Python code in the middle of this thread's parse, cause no
    ``SystemError`` (without the lock, CPython 3.11.7 raises it within a second)."""
    source = Path(ast.__file__).read_text()
    errors: list[BaseException] = []
    stop = threading.Event()

    def parse_all_the_time() -> None:
        while not stop.is_set():
            try:
                ast.parse("a.b(c)[d] + e")
            except SystemError as exc:
                errors.append(exc)

    class Cycle:
        peer: Any

        def __del__(self) -> None:
            sum(range(50))  # Python code: the interpreter may switch threads here

    thread = threading.Thread(target=parse_all_the_time, daemon=True)
    interval, threshold = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50)
    thread.start()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not errors:
            for _ in range(200):
                a, b = Cycle(), Cycle()
                a.peer, b.peer = b, a
            del a, b
            try:
                ast.parse(source)
            except SystemError as exc:
                errors.append(exc)
    finally:
        stop.set()
        thread.join(5)
        sys.setswitchinterval(interval)
        gc.set_threshold(*threshold)
    assert errors == []
