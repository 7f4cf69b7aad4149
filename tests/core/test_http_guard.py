"""The checks every HTTP surface applies (:mod:`anarchon_core.web.http_guard`), without a server."""

from __future__ import annotations

import hmac
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anarchon_core.errors import ConfigurationError
from anarchon_core.web.endpoints import Reply
from anarchon_core.web.http_guard import (
    SECURITY_HEADERS,
    action_refusal,
    allowed_hosts,
    bearer_token,
    check_token,
    file_answer,
    host_allowed,
    host_refusal,
    json_answer,
    token_matches,
    trusted_origins,
)

JSON = {"content-type": "application/json"}


def status(headers: dict[str, str], host: str | None = "ops.example.com:8765", **kw: object) -> int:
    refusal = action_refusal(headers, host=host, **kw)  # type: ignore[arg-type]
    return 0 if refusal is None else refusal.status


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (JSON, 0),  # a command-line client: no Origin, no Sec-Fetch-Site
        ({"content-type": "application/json; charset=utf-8"}, 0),
        ({"content-type": " Application/JSON "}, 0),
        ({**JSON, "origin": "http://ops.example.com:8765"}, 0),
        ({**JSON, "origin": "https://OPS.example.com:8765"}, 0),  # TLS ends at a proxy
        ({**JSON, "sec-fetch-site": "same-origin"}, 0),
        ({**JSON, "sec-fetch-site": "none"}, 0),
        ({**JSON, "origin": "https://evil.example"}, 403),
        ({**JSON, "origin": "http://ops.example.com"}, 403),  # another port
        ({**JSON, "origin": "http://ops.example.com:8766"}, 403),
        ({**JSON, "origin": "http://ops.example.com.evil.example:8765"}, 403),
        ({**JSON, "origin": "http://evil.example@ops.example.com:8765"}, 403),
        ({**JSON, "origin": "null"}, 403),
        ({**JSON, "origin": "file://"}, 403),
        ({**JSON, "origin": "not a url"}, 403),
        ({**JSON, "sec-fetch-site": "cross-site"}, 403),
        ({**JSON, "sec-fetch-site": "same-site"}, 403),
        ({"content-type": "text/plain", "origin": "https://evil.example"}, 403),
        ({"content-type": "text/plain"}, 415),
        ({"content-type": "application/x-www-form-urlencoded"}, 415),
        ({"content-type": "multipart/form-data; boundary=x"}, 415),
        ({"content-type": "application/jsonx"}, 415),
        ({"content-type": "text/json"}, 415),
        ({}, 415),
    ],
)
def test_action_refusal(headers: dict[str, str], expected: int) -> None:
    assert status(headers) == expected


def test_default_ports_and_trusted_origins() -> None:
    assert status({**JSON, "origin": "https://ops.example.com"}, host="ops.example.com") == 0
    assert status({**JSON, "origin": "http://ops.example.com"}, host="ops.example.com:80") == 0
    assert status({**JSON, "origin": "http://[::1]:8765"}, host="[::1]:8765") == 0
    assert status({**JSON, "origin": "https://ops.example.com"}, host="127.0.0.1:8000") == 403
    trusted = ["https://ops.example.com/"]
    origin = {**JSON, "origin": "https://ops.example.com"}
    assert status(origin, host="127.0.0.1:8000", trusted_origins=trusted) == 0
    assert status({**JSON, "origin": "https://x"}, host=None) == 403


def test_trusted_origins_are_checked() -> None:
    assert trusted_origins(["HTTPS://Ops.Example.com/", "http://[::1]:8765"]) == (
        "https://ops.example.com",
        "http://[::1]:8765",
    )
    for bad in ("ops.example.com", "https://ops.example.com/app", "ftp://x", "https://x:y"):
        with pytest.raises(ConfigurationError, match="scheme://host"):
            trusted_origins([bad])


def test_messages_name_what_was_refused() -> None:
    refusal = action_refusal({"content-type": "text/plain"}, host="h")
    assert refusal is not None and "application/json" in refusal.body["error"]
    assert "text/plain" in refusal.body["error"]
    refusal = action_refusal({**JSON, "origin": "https://evil.example"}, host="h")
    assert refusal is not None and "https://evil.example" in refusal.body["error"]


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("localhost", True),
        ("localhost:8765", True),
        ("LOCALHOST.:8765", True),
        ("127.0.0.1:8765", True),
        ("[::1]:8765", True),
        ("[0:0:0:0:0:0:0:1]", True),
        ("0.0.0.0:8765", True),  # the bind address
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("evil.example:8765@localhost", False),
        ("localhost:80:80", False),
        ("localhost/x", False),
        ("[::1", False),
        ("", False),
        (None, False),
    ],
)
def test_host_allowed(host: str | None, allowed: bool) -> None:
    assert host_allowed(host, allowed_hosts("0.0.0.0")) is allowed
    refusal = host_refusal(host, allowed_hosts("0.0.0.0"))
    assert (refusal is None) is allowed
    if refusal is not None:
        assert refusal.status == 400 and "--allow-host" in refusal.body["error"]


def test_allowed_hosts_extra_names_domains_and_any() -> None:
    hosts = allowed_hosts("10.0.0.5", ["Ops.Example.com", ".corp.example", "::1"])
    assert hosts == (
        "10.0.0.5",
        "localhost",
        "127.0.0.1",
        "[::1]",
        "ops.example.com",
        ".corp.example",
    )
    assert host_allowed("ops.example.com:443", hosts)
    assert host_allowed("a.b.corp.example", hosts) and host_allowed("corp.example", hosts)
    assert not host_allowed("evilcorp.example", hosts)
    assert host_allowed("anything.example", allowed_hosts(None, ["*"]))
    for bad in ("bad/name", "a b", "x:y", "[::1"):
        with pytest.raises(ConfigurationError, match="is not valid"):
            allowed_hosts(None, [bad])


def test_tokens_compare_as_bytes() -> None:
    assert token_matches("s3cret", "s3cret") and token_matches(b"s3cret", "s3cret")
    assert token_matches("tökén", "tökén") and token_matches("tökén".encode(), "tökén")
    assert not token_matches("tökén".encode("latin-1"), "tökén")
    assert not token_matches("s3cre", "s3cret") and not token_matches(None, "s3cret")
    assert not token_matches("", "") and not token_matches(b"", "")
    assert not token_matches("\ud800", "s3cret")  # a lone surrogate: no exception
    with pytest.raises(TypeError):  # what the standard library does with such text
        hmac.compare_digest("tökén", "s3cret")


def test_bearer_token() -> None:
    assert bearer_token("Bearer abc") == b"abc"
    assert bearer_token(b"bearer  abc ") == b"abc"
    assert bearer_token("Bearer tökén") == "tökén".encode()
    assert bearer_token("Basic abc") is None and bearer_token(None) is None
    assert bearer_token("Bearer") == b""


def test_configured_tokens_are_printable_ascii() -> None:
    assert check_token("abc-DEF_123~+/=") == "abc-DEF_123~+/="
    for bad in ("", "tökén", "with space", "tab\t", "nl\n"):
        with pytest.raises(ConfigurationError, match="token"):
            check_token(bad)


def test_every_answer_carries_the_security_headers() -> None:
    assert SECURITY_HEADERS["X-Content-Type-Options"] == "nosniff"
    assert "frame-ancestors 'none'" in SECURITY_HEADERS["Content-Security-Policy"]
    api = json_answer(Reply(409, {"error": "x"}))
    page, missing = file_answer("index.html"), file_answer("../settings.py")
    assert (api.status, page.status, missing.status) == (409, 200, 404)
    for answer in (api, page, missing):
        assert SECURITY_HEADERS.items() <= answer.headers.items()
    assert api.headers["Cache-Control"] == "no-store"
    assert api.headers["Content-Type"] == missing.headers["Content-Type"] == "application/json"
    assert page.headers["Content-Type"].startswith("text/html")
    assert json.loads(missing.body) == {"error": "no dashboard file '../settings.py'"}


text_or_bytes = st.text() | st.binary()


@settings(max_examples=300, deadline=None)
@given(given_=st.none() | text_or_bytes, expected=text_or_bytes, header=st.none() | text_or_bytes)
def test_token_checks_never_raise(
    given_: str | bytes | None, expected: str | bytes, header: str | bytes | None
) -> None:
    assert isinstance(token_matches(given_, expected), bool)
    assert token_matches(bearer_token(header), expected) in (True, False)


@settings(max_examples=300, deadline=None)
@given(
    headers=st.dictionaries(
        st.sampled_from(["content-type", "origin", "sec-fetch-site", "host"]), st.text()
    ),
    host=st.none() | st.text(),
    trusted=st.lists(st.text(), max_size=2),
)
def test_request_checks_never_raise(
    headers: dict[str, str], host: str | None, trusted: list[str]
) -> None:
    refusal = action_refusal(headers, host=host, trusted_origins=trusted)
    assert refusal is None or refusal.status in (403, 415)
    assert isinstance(host_allowed(host, ("localhost", ".example.com", "[::1]")), bool)
