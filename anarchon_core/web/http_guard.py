"""Checks every HTTP surface of anarchon applies before it acts, with no web framework.

The standalone dashboard (:func:`anarchon_core.web.create_app`), the FastAPI router and the Django
admin can pause, trigger and cancel production jobs. Each host calls these functions
with its request's headers (any case-insensitive mapping: Starlette's and Django's
``request.headers`` both are) and answers the :class:`~anarchon_core.web.endpoints.Reply`
they return, if any:

- :func:`action_refusal` before an action: the body must be ``application/json``
  (``415`` otherwise), which a cross-site HTML form or a "simple" ``fetch`` cannot send
  without a CORS preflight that the API never grants; and a browser's ``Origin`` and
  ``Sec-Fetch-Site`` must name the serving host (``403`` for a cross-site request).
- :func:`host_refusal` before anything: the ``Host`` header must be one the server was
  told it is reachable as, so a hostile page cannot reach a loopback-only dashboard
  through a DNS name rebound to ``127.0.0.1`` (``400``).
- :func:`token_matches` compares a presented secret with the configured one as UTF-8
  bytes in constant time; it never raises, whatever a client sends.

:data:`SECURITY_HEADERS` are the headers every page and API answer carries;
:func:`json_answer` and :func:`file_answer` build those answers with them, so that a
host only maps an :class:`HttpAnswer` onto its framework's response class (for
Starlette and FastAPI, :func:`anarchon_core.web.starlette_response`).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from .endpoints import Reply, dashboard_file

__all__ = [
    "DEFAULT_ALLOWED_HOSTS",
    "SECURITY_HEADERS",
    "HttpAnswer",
    "action_refusal",
    "allowed_hosts",
    "bearer_token",
    "check_token",
    "file_answer",
    "host_allowed",
    "host_refusal",
    "json_answer",
    "token_matches",
    "trusted_origins",
]

#: Headers of every dashboard page, file and API answer: no framing, no sniffing, no
#: referrer. (The Django admin sends ``Referrer-Policy: same-origin`` instead, which its
#: CSRF check over HTTPS needs.)
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """What a surface sends: status, every header (the content type too) and the body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


def json_answer(reply: Reply, *, headers: Mapping[str, str] = SECURITY_HEADERS) -> HttpAnswer:
    """An API answer: JSON, never cached (it reads live store state)."""
    fixed = {**headers, "Cache-Control": "no-store", "Content-Type": _JSON}
    return HttpAnswer(reply.status, fixed, reply.json_bytes())


def file_answer(name: str, *, headers: Mapping[str, str] = SECURITY_HEADERS) -> HttpAnswer:
    """A dashboard file (``index.html``, ``dashboard.css``, ``dashboard.js``), else 404."""
    found = dashboard_file(name)
    if found is None:
        return json_answer(
            Reply(404, {"error": f"no dashboard file {name[:80]!r}"}), headers=headers
        )
    content, content_type = found
    return HttpAnswer(200, {**headers, "Content-Type": content_type}, content)


#: The names a loopback server is reached as, besides its bind address.
DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "[::1]")

_JSON = "application/json"
_SAME_ORIGIN_FETCH = ("same-origin", "none")  # "none": typed in the address bar
_DEFAULT_PORTS = ("", "80", "443")


def action_refusal(
    headers: Mapping[str, str], *, host: str | None, trusted_origins: Iterable[str] = ()
) -> Reply | None:
    """Why an action request must be refused (``403`` cross-site, ``415`` not JSON), or
    ``None`` to let it through.

    ``host`` is the serving host as the framework determined it (the ``Host`` header,
    ``host[:port]``). A request is cross-site when ``Sec-Fetch-Site`` says so (anything
    but ``same-origin`` or ``none``), when ``Origin`` is ``null``, or when ``Origin``
    names another host and port than ``host`` and is not one of ``trusted_origins``
    (full origins, ``https://ops.example.com``: for a proxy that rewrites ``Host``).
    Host and port are compared (a missing port matching 80 and 443), not the scheme,
    which a TLS-terminating proxy changes.
    Requests without these headers (command-line clients) are not cross-site: browsers
    send ``Origin`` on every cross-origin ``POST``.
    """
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site.strip().lower() not in _SAME_ORIGIN_FETCH:
        return _cross_site(f"Sec-Fetch-Site: {fetch_site[:40]}")
    origin = headers.get("origin")
    if origin is not None and not _same_origin(origin, host, trusted_origins):
        return _cross_site(f"Origin: {origin[:100]}")
    content_type = headers.get("content-type")
    media_type = (content_type or "").partition(";")[0].strip().lower()
    if media_type != _JSON:
        got = "no Content-Type" if content_type is None else f"Content-Type {content_type[:80]!r}"
        return Reply(
            415,
            {"error": f"actions take a JSON body (Content-Type: {_JSON}); got {got}"},
        )
    return None


def trusted_origins(origins: Iterable[str]) -> tuple[str, ...]:
    """``origins`` checked and normalised (lower case, no trailing ``/``), for
    :func:`action_refusal`'s ``trusted_origins``.

    :raises ConfigurationError: an entry that is not ``http(s)://host[:port]``.
    """
    result: list[str] = []
    for origin in origins:
        text = origin.strip().rstrip("/").lower()
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            parts = None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or "@" in parts.netloc
            or parts.path
            or parts.query
            or parts.fragment
        ):
            raise ConfigurationError(
                f"trusted origin {origin!r} is not valid: give scheme://host[:port], "
                "e.g. https://ops.example.com"
            )
        result.append(text)
    return tuple(result)


def _cross_site(what: str) -> Reply:
    return Reply(
        403,
        {"error": f"cross-site action refused ({what}): actions are taken from the page itself"},
    )


def _same_origin(origin: str, host: str | None, trusted: Iterable[str]) -> bool:
    origin = origin.strip()
    if origin.lower() in {t.strip().rstrip("/").lower() for t in trusted}:
        return True
    if host is None or origin.lower() == "null":
        return False
    try:
        parts = urlsplit(origin)
        origin_host, origin_port = parts.hostname, parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or origin_host is None:
        return False
    if "@" in parts.netloc or parts.path or parts.query or parts.fragment:
        return False  # a browser's Origin is scheme://host[:port] and nothing else
    served = _split_host(host)
    if served is None:
        return False
    served_host, served_port = served
    port = "" if origin_port is None else str(origin_port)
    if origin_host.rstrip(".") != served_host:
        return False
    return port == served_port or (port in _DEFAULT_PORTS and served_port in _DEFAULT_PORTS)


def _split_host(value: str) -> tuple[str, str] | None:
    """``(host, port)`` of a ``Host`` header value, the host lower-cased and without
    IPv6 brackets, the port ``""`` when absent; ``None`` when malformed."""
    value = value.strip().lower()
    if not value:
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    elif value.count(":") > 1:  # a bare IPv6 address (an allow-list entry, not a header)
        name, port = value, ""
    else:
        name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    if not name or any(c.isspace() or c in "/?#@\\" for c in name):
        return None
    return name.rstrip("."), port


def _host_name(value: str) -> str:
    split = _split_host(value)
    if split is not None and ":" in split[0]:
        return f"[{split[0]}]"  # IPv6, written as in a Host header
    if split is None:
        raise ConfigurationError(
            f"host {value!r} is not valid: give a host name or address "
            "(localhost, ops.example.com, 10.0.0.5, [::1]), '.example.com' for its "
            "subdomains, or '*' for any"
        )
    return split[0]


def allowed_hosts(bind: str | None, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The ``Host`` names a server bound to ``bind`` answers to: the bind address,
    :data:`DEFAULT_ALLOWED_HOSTS` and ``extra`` (``--allow-host``).

    :raises ConfigurationError: an entry that is not a host name or address.
    """
    names = [*([bind] if bind else []), *DEFAULT_ALLOWED_HOSTS, *extra]
    result: list[str] = []
    for name in names:
        entry = name.strip()
        if entry != "*" and not entry.startswith("."):
            entry = _host_name(entry)
        elif entry.startswith("."):
            entry = "." + _host_name(entry[1:])
        entry = entry.lower()
        if entry not in result:
            result.append(entry)
    return tuple(result)


def host_allowed(host: str | None, allowed: Iterable[str]) -> bool:
    """Whether the ``Host`` header ``host`` names one of ``allowed``.

    Entries are host names or addresses without a port (``localhost``, ``[::1]`` or
    ``::1``), ``.example.com`` for that domain and its subdomains, or ``*`` for any.
    A missing or malformed header is never allowed.
    """
    split = _split_host(host) if host else None
    if split is None:
        return False
    name = split[0]
    for entry in allowed:
        entry = entry.strip().lower()
        if entry == "*":
            return True
        if entry.startswith("."):
            if name == entry[1:] or name.endswith(entry):
                return True
            continue
        if entry.startswith("[") and entry.endswith("]"):
            entry = entry[1:-1]
        if name == entry.rstrip(".") or _same_address(name, entry):
            return True
    return False


def _same_address(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def host_refusal(host: str | None, allowed: Iterable[str]) -> Reply | None:
    """``400`` naming the refused ``Host`` (and how to allow it), or ``None``."""
    if host_allowed(host, allowed):
        return None
    shown = "no Host header" if not host else f"Host {host[:100]!r}"
    return Reply(
        400,
        {
            "error": f"{shown} is not one this dashboard answers to; if it is the name "
            "you reach it by, start it with --allow-host NAME"
        },
    )


def bearer_token(authorization: str | bytes | None) -> bytes | None:
    """The credentials of an ``Authorization: Bearer <token>`` header value, as bytes
    (``None`` for no header or another scheme)."""
    if authorization is None:
        return None
    raw = (
        authorization
        if isinstance(authorization, bytes)
        else authorization.encode("utf-8", "surrogatepass")
    )
    scheme, _, credentials = raw.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return credentials.strip()


def token_matches(given: str | bytes | None, expected: str | bytes) -> bool:
    """Whether ``given`` equals ``expected``, compared as UTF-8 bytes in constant time.

    Never raises: any ``str`` (non-ASCII, lone surrogates) is encoded first, so a
    hostile header cannot turn a refusal into a server error. An empty ``expected``
    matches nothing.
    """
    if given is None:
        return False
    want = _bytes(expected)
    return bool(want) and hmac.compare_digest(_bytes(given), want)


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")


def check_token(token: str) -> str:
    """``token`` if it can be a dashboard token: non-empty printable ASCII without
    spaces, which every browser can send in a header.

    :raises ConfigurationError: naming what is wrong, never echoing the token.
    """
    if not token:
        raise ConfigurationError("the dashboard token is empty: give a random string")
    if not all("!" <= c <= "~" for c in token):
        raise ConfigurationError(
            "the dashboard token must be printable ASCII without spaces (browsers send "
            "it in a header): make one with python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'"
        )
    return token
