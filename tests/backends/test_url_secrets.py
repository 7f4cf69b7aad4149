"""No secret of a store URL reaches a message, log, metric, description, registry or page.

Every generated secret is the fixed prefix ``Zq9`` plus a generated tail of at least six
characters holding at least one special character (``# / @ : %`` …): distinctive, so it
cannot occur by chance in code, in a traceback's source lines or in a driver's message
(a short generated password once matched a function name in a traceback). The checks
look for the secret as written in the URL, percent-decoded, and as ``repr`` escapes it.

The stores are real (no mocks): built from the URL, and opened against 127.0.0.1:1,
where nothing listens, or with a wrong password against the local servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import string
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote, unquote_plus

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from anarchon_core import Every, Scheduler
from anarchon_core.backend import Backend
from anarchon_core.backends import backend_from_url, mask_url
from anarchon_core.errors import ConfigurationError
from anarchon_core.redact import brief, brief_url, redact_text, redact_url, url_secrets
from anarchon_core.web.endpoints import DashboardAPI
from anarchon_django._admin_dashboard import unavailable_reply
from anarchon_django._scheduler import DjangoScheduler
from anarchon_django.conf import read_settings

PREFIX = "Zq9"
#: Characters a secret's tail may hold besides letters and digits (no quote, no space).
SPECIALS = "#/@:%?!$&'()*+,;=[]~-._\\^{}|<>"
#: In a query value ``&`` would end the value, as for every URL parser.
QUERY_SPECIALS = SPECIALS.replace("&", "")
SECRET_KEYS = ("password", "PassWord", "pass", "passwd", "token", "secret", "auth_token")
SECRET_KEYS += ("sslpassword", "key", "api_key", "ssl_password")
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
UNREACHABLE = "127.0.0.1:1"


def secrets(specials: str = SPECIALS) -> st.SearchStrategy[str]:
    """``Zq9`` + 6-20 characters, at least one of them special."""
    alphabet = string.ascii_letters + string.digits + specials
    return st.builds(
        lambda head, special, tail: f"{PREFIX}{head}{special}{tail}",
        st.text(alphabet, min_size=3, max_size=10),
        st.sampled_from(specials),
        st.text(alphabet, min_size=2, max_size=9),
    )


def forms(secret: str, written: str) -> set[str]:
    """Every spelling of a secret that must not be shown (all distinctive)."""
    found = {secret, written, unquote(written), unquote_plus(written), unquote_plus(secret)}
    found |= {repr(text)[1:-1] for text in found}
    return {text for text in found if len(text) >= len(PREFIX) + 6}


def leaks(texts: Iterable[str], secret_forms: set[str]) -> list[tuple[str, str]]:
    return [(form, text) for text in texts for form in secret_forms if form in text]


class _Records(logging.Handler):
    """Every log record's message, exception and stack, as text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            self.texts.append("".join(traceback.format_exception(record.exc_info[1])))
        if record.stack_info:
            self.texts.append(record.stack_info)


@contextlib.contextmanager
def all_logs() -> Iterator[list[str]]:
    """Collect every record of every logger (drivers included) at DEBUG."""
    handler, root = _Records(), logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    try:
        yield handler.texts
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def error_texts(exc: BaseException) -> list[str]:
    """The message and the whole formatted chain (causes and their source lines)."""
    return [str(exc), repr(exc), "".join(traceback.format_exception(exc))]


# -- generated store URLs -------------------------------------------------------------
@st.composite
def store_urls(draw: st.DrawFn) -> tuple[str, set[str]]:
    """A URL of any scheme with one secret in its userinfo, a query value or fragment."""
    scheme = draw(
        st.sampled_from(
            [
                "sqlite",
                "memory",
                "postgres",
                "postgresql",
                "redis",
                "rediss",
                "valkey",
                "amqp",
                "amqps",
                "nats",
                "tls",
                "django",
            ]
        )
    )
    place = draw(st.sampled_from(["password", "token", "query", "fragment"]))
    if place == "token" and scheme not in ("nats", "tls"):
        place = "password"  # elsewhere a bare userinfo is a user name, not a secret
    encode = draw(st.booleans())
    specials = {"query": QUERY_SPECIALS, "token": SPECIALS.replace(":", "")}.get(place, SPECIALS)
    secret = draw(secrets(specials if not encode else SPECIALS))  # a raw ':' ends a user name
    written = quote(secret, safe="") if encode else secret
    host = draw(st.sampled_from([UNREACHABLE, "db.internal:6000", "[::1]:7"]))
    path, query = {
        "sqlite": ("/tmp/anarchon-secrets.db", ""),
        "memory": ("", ""),
        "postgres": ("/test", "connect_timeout=1"),
        "postgresql": ("/test", "connect_timeout=1&schema=s1"),
        "redis": ("/0", "strategy=lease&socket_connect_timeout=1"),
        "rediss": ("/1", "strategy=script"),
        "valkey": ("/0", "strategy=stream-id"),
        "amqp": ("/", "timeout=1s"),
        "amqps": ("/vh", "heartbeat=5"),
        "nats": ("", "timeout=1s&bucket=b1"),
        "tls": ("", "bucket=b2"),
        "django": ("", ""),
    }[scheme]
    if scheme == "django":
        host = "default"
    userinfo = ""
    if place == "password":
        userinfo = f"{draw(st.sampled_from(['app', '', 'guest']))}:{written}@"
    elif place == "token":
        userinfo = f"{written}@"
    elif place == "query":
        key = draw(st.sampled_from(SECRET_KEYS))
        query = f"{query}&{key}={written}" if query else f"{key}={written}"
    if scheme == "sqlite" and place in ("password", "token"):
        url = f"sqlite://{userinfo}{path}"
    else:
        url = f"{scheme}://{userinfo}{host}{path}{'?' + query if query else ''}"
    if place == "fragment":
        url += f"#{written}"
    return url, forms(secret, written)


@settings(
    max_examples=400,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(store_urls())
def test_no_secret_in_any_message_description_log_or_page(case: tuple[str, set[str]]) -> None:
    url, secret_forms = case
    texts = [redact_url(url), mask_url(url), brief_url(url), brief_url([url])]
    texts.append(redact_text(f"driver: cannot use {url} (password={url})", url))
    with all_logs() as logged:
        backend: Backend | None = None
        try:
            backend = backend_from_url(url)
        except ConfigurationError as exc:
            texts += error_texts(exc)
            texts.append(json.dumps(unavailable_reply(url, exc).body))
        if backend is not None:
            texts.append(backend.describe())
        conf = read_settings({"BACKEND": url}, DATABASES)
        texts += [f"{p.msg} {p.hint}" for p in conf.problems]
        stand_in = DjangoScheduler(url).backend  # a bad URL: a store that refuses to open
        texts.append(stand_in.describe())
        if stand_in.name == "misconfigured":
            with pytest.raises(ConfigurationError) as refused:
                asyncio.run(stand_in.open())
            texts += error_texts(refused.value)
    texts += logged
    assert not leaks(texts, secret_forms)


# -- real stores, unreachable -----------------------------------------------------------
@st.composite
def reachable_form_urls(draw: st.DrawFn) -> tuple[str, set[str]]:
    """A valid URL of a server store at 127.0.0.1:1 with a percent-encoded secret."""
    scheme = draw(st.sampled_from(["postgresql", "postgres", "redis", "amqp", "nats"]))
    secret = draw(secrets())
    written = quote(secret, safe="")
    in_query = scheme.startswith("postgres") and draw(st.booleans())
    rest = {
        "postgresql": "/test?connect_timeout=1",
        "postgres": "/test?connect_timeout=1",
        "redis": "/0?socket_connect_timeout=1",
        "amqp": "/?timeout=1s",
        "nats": "/?timeout=1s",
    }[scheme]
    if in_query:
        url = f"{scheme}://app@{UNREACHABLE}{rest}&password={written}"
    elif scheme == "nats" and draw(st.booleans()):
        url = f"nats://{written}@{UNREACHABLE}{rest}"  # a token
    else:
        url = f"{scheme}://app:{written}@{UNREACHABLE}{rest}"
    return url, forms(secret, written)


async def _everything_shown_by(backend: Backend) -> list[str]:
    """Open the store, ask the dashboard, run a scheduler on it: every text they show."""
    texts = [backend.describe()]
    try:
        await backend.open()
    except Exception as exc:
        texts += error_texts(exc)
    else:  # pragma: no cover - nothing listens on port 1
        await backend.close()
    api = DashboardAPI(backend)
    for path in ("api/health", "api/jobs", "api/runs"):
        reply = await api.handle("GET", path, {})
        texts.append(json.dumps(reply.body))
    await api.close()
    registry = CollectorRegistry()
    scheduler = Scheduler(backend, metrics_registry=registry, heartbeat_ms=100, jitter_ms=0)
    scheduler.add_job("secrets-check", Every("1s"), lambda ctx: None)
    await scheduler.start()
    try:
        await asyncio.sleep(0.15)  # the engine retries the store: errors, logs, metrics
        engine = scheduler._engine
        assert engine is not None
        texts.append(json.dumps(engine.instance_info().to_json()))  # the registry entry
    finally:
        await scheduler.stop(grace_ms=0)
    texts.append(generate_latest(registry).decode())  # every metric and label
    texts.append(repr(scheduler))
    return texts


@settings(
    max_examples=30,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(reachable_form_urls())
def test_no_secret_when_a_real_store_is_unreachable(case: tuple[str, set[str]]) -> None:
    url, secret_forms = case
    with all_logs() as logged:
        backend = backend_from_url(url)
        texts = asyncio.run(_everything_shown_by(backend))
    assert not leaks([*texts, *logged], secret_forms)


@settings(
    max_examples=6,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.sampled_from(["redis", "amqp"]), secrets())
def test_no_secret_when_a_real_server_refuses_the_password(scheme: str, secret: str) -> None:
    from services import REDIS_URL, require_tcp

    require_tcp("Redis", "127.0.0.1", 6379)
    require_tcp("RabbitMQ", "127.0.0.1", 5672)
    written = quote(secret, safe="")
    if scheme == "redis":
        url = REDIS_URL.replace("redis://", f"redis://nobody:{written}@", 1)
    else:
        url = f"amqp://guest:{written}@127.0.0.1:5672/?timeout=2s"
    with all_logs() as logged:
        backend = backend_from_url(url)
        texts = [backend.describe()]
        try:
            asyncio.run(backend.open())
        except Exception as exc:
            texts += error_texts(exc)
        else:  # pragma: no cover - the password is wrong
            asyncio.run(backend.close())
            pytest.fail(f"{backend.describe()} accepted a wrong password")
    assert not leaks([*texts, *logged], forms(secret, written))


# -- the findings, one by one ------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "secret", "shown"),
    [
        ("redis://127.0.0.1:6379/0?password=Xv7-query-pw", "Xv7-query-pw", "password=***"),
        ("redis://:Xv7pa#ss-word@127.0.0.1:6379/0", "Xv7pa#ss-word", "redis://***"),
        ("postgresql://u:Xv7p/ss-word@127.0.0.1/db", "Xv7p/ss-word", "postgresql://***@"),
        ("amqp://u:Xv7p?ss-word@127.0.0.1/", "Xv7p?ss-word", "amqp://***@127.0.0.1/"),
        ("nats://Xv7tok/en-value@127.0.0.1:4222", "Xv7tok/en-value", "nats://***@"),
        ("postgresql://u:Xv7pa@ss-word@127.0.0.1/db", "Xv7pa@ss-word", "postgresql://u:***@"),
    ],
)
def test_regression_secret_hidden_in_url_and_configuration_error(
    url: str, secret: str, shown: str
) -> None:
    """Query passwords and raw ``# / ? @`` in a password were shown by ``mask_url``."""
    assert secret not in mask_url(url) and shown in mask_url(url)
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url(url)
    assert secret not in str(caught.value)
    assert all(piece not in str(caught.value) for piece in ("ss-word", "en-value", "query-pw"))


def test_regression_dashboard_503_shows_no_secret() -> None:
    url = "redis://:Xv7pa#ss-word@127.0.0.1:6379/0"
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url(url)
    body = json.dumps(unavailable_reply(url, caught.value).body)
    assert "ss-word" not in body and "Xv7pa" not in body and "redis://***" in body


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("amqp://guest:guest@127.0.0.1:1/?heartbeat=abc", "heartbeat='abc'"),
        ("amqp://guest:guest@127.0.0.1:1/?heartbeat=-1", "heartbeat='-1'"),
        ("amqp://guest:guest@127.0.0.1:1/?heartbeat=99999", "heartbeat='99999'"),
        ("amqps://guest:guest@127.0.0.1:1/?no_verify_ssl=false", "no_verify_ssl='false'"),
        ("amqp://guest:guest@127.0.0.1:1/?cafile=/ca.pem", "use amqps://"),
        ("amqp://guest:guest@127.0.0.1:1/?timeout=2d", "at most 1h"),
    ],
)
def test_regression_rabbitmq_options_are_checked_at_construction(url: str, names: str) -> None:
    """aiormq read ``heartbeat=abc`` as 0 (heartbeats off), ``no_verify_ssl=false`` as 1."""
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url(url)
    assert names in str(caught.value)


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("redis://127.0.0.1:6379/abc", "database 'abc'"),
        ("redis://127.0.0.1:6379/0?socket_timeout=soon", "socket_timeout='soon'"),
        ("redis://127.0.0.1:6379/0?socket_keepalive=maybe", "socket_keepalive='maybe'"),
        ("redis://127.0.0.1:6379/0?max_connections=0", "max_connections='0'"),
        ("redis://127.0.0.1:6379/0?ssl_certfile=/c.pem", "use rediss://"),
        ("redis://127.0.0.1:0/0", "port must be a number from 1 to 65535"),
        ("nats://127.0.0.1:4222/?replicas=two", "replicas 'two'"),
        ("nats://127.0.0.1:4222/?timeout=5h", "at most 1h"),
        ("postgresql://u@127.0.0.1/db?connect_timeout=0", "connect_timeout='0'"),
        ("postgresql://u@127.0.0.1/db?keepalives=yes", "keepalives='yes'"),
        ("postgresql://u@127.0.0.1:70000/db", "port '70000'"),
        ("postgresql://u@127.0.0.1/db?prepare_threshold=²", "prepare_threshold '²'"),
    ],
)
def test_other_store_options_name_the_bad_value_and_the_form(url: str, names: str) -> None:
    with pytest.raises(ConfigurationError, match=r"give|use|from|at most") as caught:
        backend_from_url(url)
    assert names in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:guest@127.0.0.1:1/?heartbeat=" + "9" * 10_000,
        "amqp://guest:guest@127.0.0.1:1/?name=" + "n" * 10_000,
        "nats://127.0.0.1:4222/?replicas=" + "9" * 10_000,
        "redis://127.0.0.1:6379/0?client_name=" + "c" * 10_000,
        "postgresql://u@127.0.0.1/db?prepare_threshold=" + "9" * 10_000,
        "postgresql://u@127.0.0.1/db?connect_timeout=" + "9" * 10_000,
    ],
)
def test_regression_a_10kb_bad_value_is_quoted_briefly(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        backend_from_url(url)
    message = str(caught.value)
    assert len(message) < 1500, len(message)
    assert "(10000 characters)" in message


# -- the redactor's rule -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pa@ss@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://u:p:w@h", "redis://u:***@h"),
        ("redis://h/0?client_name=a@b", "redis://***@b"),
        ("redis://h/0?password=ab@cd", "redis://***"),
        ("redis://h/0?Pass%77ord=x&y=1", "redis://h/0?Pass%77ord=***&y=1"),
        ("redis://h/0?password=se&cret&y=1", "redis://h/0?password=***&***&y=1"),
        ("rediss://h/0#frag", "rediss://h/0#***"),
        ("sqlite:///dir/a@b.db", "sqlite:///dir/a@b.db"),
        ("tls://s3cr3t@h:4222", "tls://***@h:4222"),
        ("nats://u:p@h1:4222,h2:4222", "nats://u:***@h1:4222,h2:4222"),
        ("postgresql:///db?host=/run&sslpassword=k", "postgresql:///db?host=/run&sslpassword=***"),
        (
            "host=db password='a b' sslpassword=c user=u",
            "host=db password=*** sslpassword=*** user=u",
        ),
        ("u:pw@host/db", "***@host/db"),
        ("valkey://:pw@h", "valkey://:***@h"),
    ],
)
def test_redact_url_rule(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_text_scrubs_a_drivers_echo_and_pieces() -> None:
    url = "postgresql://u:Xv7piece/tail-part@h/db"
    echo = 'invalid integer value "Xv7piece" for connection option "port"; tail-part'
    shown = redact_text(echo, url)
    assert "Xv7piece" not in shown and "tail-part" not in shown
    assert redact_text("see redis://:pw@h and password=x, {'token': 'y'}") == (
        "see redis://:***@h and password=*** {'token': ***}"
    )
    assert url_secrets("redis://h/0") == []


def test_brief_cuts_long_values_and_brief_url_redacts_first() -> None:
    assert brief("x" * 10_000).endswith("… (10000 characters)")
    assert len(brief("x" * 10_000)) < 120
    assert brief(10**5000).startswith("<an int of about")
    long_url = "redis://:Xv7pw@h/0?" + "a" * 1000
    assert "Xv7pw" not in brief_url(long_url) and len(brief_url(long_url)) < 250
    assert "Xv7pw" not in brief_url({"url": "redis://:Xv7pw@h"})


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_redaction_never_raises_and_is_stable(text: str) -> None:
    shown = redact_url(text)
    assert redact_url(shown) == shown
    assert isinstance(redact_text(text, text), str) and isinstance(brief_url(text), str)


def test_mask_url_is_redact_url() -> None:
    assert mask_url is redact_url


def test_sqlite_paths_are_not_userinfo(tmp_path: Path) -> None:
    path = tmp_path / "a@b.db"
    assert backend_from_url(f"sqlite:///{path}").describe() == f"sqlite:///{path}"
