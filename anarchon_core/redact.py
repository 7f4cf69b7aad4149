"""One redactor for every store URL, and short quotes of bad values for error messages.

Every log line, banner, page and error message that shows a store URL shows
:func:`redact_url`'s result (metrics and registry entries never hold one); text that
may quote a URL or a driver's echo of one (a driver exception) goes through
:func:`redact_text`; a bad value is quoted through :func:`brief`, so a 10 kB value is
never repeated whole.

What counts as secret:

- the password of the userinfo (``user:PASSWORD@host``), or the whole userinfo where
  it is a token (``nats://TOKEN@host``; schemes ``nats``, ``tls``, ``ws``, ``wss``);
- the value of a query parameter whose name (case-insensitive, percent-decoded) is
  one of :data:`SECRET_KEYS` or ends with ``password``, ``passwd``, ``secret``,
  ``token`` or ``apikey`` (``?password=``, ``?sslpassword=``, ``?auth_token=``), and
  a value-less item right after one (a raw ``&`` inside the secret);
- the fragment (``#…``): it never reaches a store, so it has no business in a URL;
- in a libpq keyword string (``host=db password=… sslpassword=…``) the values of the
  same keys, quoted or not.

The userinfo rule, for passwords holding a raw ``#``, ``/``, ``?``, ``@`` or ``:``: the
userinfo is everything between ``scheme://`` and the **last** ``@`` of the URL (an
empty authority, as in ``sqlite:///path``, has none). A URL read this way and a URL read
by :func:`urllib.parse.urlsplit` (authority up to the first ``/``, ``?`` or ``#``)
differ exactly when an ``@`` follows a ``/``, ``?`` or ``#``; such a URL is ambiguous,
and everything that *either* reading counts as secret is hidden: the whole userinfo of
the last-``@`` reading (the user name too), every secret value and fragment of both.
So ``redis://:pa/ss@h/0`` shows as ``redis://***@h/0``, and ``?name=a@b`` (a raw
``@`` in a query value) as ``scheme://***@b``: over-redacted, never leaked. The stores
refuse such URLs (:func:`userinfo_problem`) and ask for ``%2F %3F %23 %40``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, unquote_plus

__all__ = [
    "MASK",
    "SECRET_KEYS",
    "brief",
    "brief_url",
    "is_secret_key",
    "redact_text",
    "redact_url",
    "url_secrets",
    "userinfo_problem",
]

#: What a secret is replaced with.
MASK = "***"
#: Query parameters and libpq keywords whose values are secret (besides the suffixes).
SECRET_KEYS = frozenset(
    {
        "password",
        "pass",
        "passwd",
        "pwd",
        "sslpassword",
        "token",
        "auth_token",
        "access_token",
        "secret",
        "client_secret",
        "key",
        "api_key",
        "apikey",
        "auth",
        "credentials",
    }
)
_SECRET_SUFFIXES = ("password", "passwd", "secret", "token", "apikey", "api_key")
#: Schemes whose bare userinfo (no ``:``) is a token, not a user name.
_TOKEN_SCHEMES = frozenset({"nats", "tls", "ws", "wss"})
_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.-]*)://")
#: A URL inside free text: up to whitespace or a quote.
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
#: ``key=value`` / ``key: value`` in free text or a libpq keyword string.
_KEYWORD = re.compile(
    r"(?i)(?<![A-Za-z0-9_])([A-Za-z0-9_]*(?:password|passwd|secret|token|apikey|api_key)"
    r"|pwd|pass|credentials)"
    r"(['\"]?\s*[=:]\s*)('(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s'\"]+)"
)
#: Parts of a secret this long or longer are scrubbed from text on their own too.
_MIN_PIECE = 4
#: Shorter secrets are not scrubbed from free text (they are still redacted in URLs).
_MIN_SECRET = 3


def is_secret_key(name: str) -> bool:
    """Whether a query parameter or keyword ``name`` holds a secret (see the module doc)."""
    key = unquote_plus(name).strip().lower()
    return key in SECRET_KEYS or key.endswith(_SECRET_SUFFIXES)


def redact_url(url: str) -> str:
    """``url`` with every secret replaced by ``***``, for logs, banners, pages and errors.

    Takes any store URL (``postgresql://``, ``redis://``, ``amqp://``, ``nats://``,
    ``sqlite:///``, ``django://``, …) or a libpq keyword string; never raises, and
    changes nothing but the secrets (see the module doc for the rule).
    """
    if not isinstance(url, str):
        return brief(url)
    spans = _secret_spans(url)
    out, last = [], 0
    for start, end in spans:
        out.append(url[last:start])
        out.append(MASK)
        last = end
    out.append(url[last:])
    return "".join(out)


def url_secrets(url: str) -> list[str]:
    """The secrets of ``url`` as they may appear in a driver's message, longest first.

    Each hidden part of :func:`redact_url` raw and percent-decoded, and its pieces of
    4+ characters between ``/ ? # @ : & =`` (a driver that misreads a raw ``/`` in a
    password quotes only a piece of it, e.g. as a port).
    """
    if not isinstance(url, str):
        return []
    found: set[str] = set()
    for start, end in _secret_spans(url):
        raw = url[start:end]
        for text in (raw, unquote(raw), unquote_plus(raw)):
            found.add(text)
            found.update(p for p in re.split(r"[/?#@:&=]", text) if len(p) >= _MIN_PIECE)
    found.discard("")
    found.discard(MASK)
    return sorted(found, key=lambda s: (-len(s), s))


def redact_text(text: str, *urls: str) -> str:
    """``text`` (a driver's message, a repr) without the secrets of ``urls`` or its own.

    Scrubs every secret of each URL or conninfo in ``urls`` (raw, decoded and as
    ``repr`` escapes it), then any URL the text itself quotes and any
    ``password=…``-style pair in it. Secrets shorter than 3 characters are left in free
    text: replacing every ``a`` of a message would hide the message, not a secret.
    """
    secrets: set[str] = set()
    for url in urls:
        for secret in url_secrets(url):
            secrets.add(secret)
            secrets.add(repr(secret)[1:-1])
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= _MIN_SECRET:
            text = text.replace(secret, MASK)
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    return _KEYWORD.sub(_mask_keyword, text)


def userinfo_problem(url: str, *, raw_at: bool = True) -> str | None:
    """Why the userinfo of ``url`` cannot be read safely, or ``None`` when it can.

    A raw ``/``, ``?`` or ``#`` before the last ``@`` makes drivers read part of a
    password as a host, port or path (and quote it in their errors); libpq also reads
    the *first* ``@`` as the end of the password, so the PostgreSQL store passes
    ``raw_at=False``. The answer names the fix and no part of the URL.
    """
    match = _SCHEME.match(url)
    if match is None:
        return None
    start = match.end()
    at = url.rfind("@", start)
    if at < 0 or url.startswith("/", start):
        return None
    userinfo = url[start:at]
    raw = sorted({c for c in userinfo if c in "/?#"})
    if raw:
        shown = ", ".join(repr(c) for c in raw)
        return (
            f"an '@' follows a raw {shown} after the scheme: a user name or password holding "
            f"{shown}, or an '@' in the path or a query value; percent-encode them in the URL "
            f"('/' as %2F, '?' as %3F, '#' as %23, '@' as %40)"
        )
    if not raw_at and "@" in userinfo:
        return (
            "the user name or password holds a raw '@', and libpq ends the password at the "
            "first '@'; percent-encode it as %40"
        )
    return None


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for error messages.

    A hostile or careless value (a 10 kB option, a 5000-digit integer) must not be
    repeated whole in every log line; the original length tells what was cut.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        return f"<an int of about {value.bit_length() * 3 // 10} digits>"  # str() may refuse it
    if isinstance(value, str):
        text, size = repr(value[: limit + 1]), len(value)
    else:
        try:
            text = repr(value)
        except Exception:  # a broken __repr__ must not hide the real error
            text = f"<{type(value).__name__}>"
        size = len(text)
    if len(text) <= limit and size <= limit:
        return text
    return f"{text[:limit]}… ({size} characters)"


def brief_url(url: object, limit: int = 200) -> str:
    """A URL (or any value given as one) for an error message: redacted, then cut.

    Redaction comes first, so that a cut never leaves a secret without the ``@`` or
    ``=`` that marks it.
    """
    if isinstance(url, str):
        return brief(redact_url(url), limit)
    try:
        text = repr(url)
    except Exception:
        text = f"<{type(url).__name__}>"
    shown = redact_text(text, *_strings(url))
    return shown if len(shown) <= limit else f"{shown[:limit]}… ({len(shown)} characters)"


# -- the spans ----------------------------------------------------------------------
def _secret_spans(url: str) -> list[tuple[int, int]]:
    """Sorted, merged ``(start, end)`` ranges of ``url`` that hold secrets."""
    match = _SCHEME.match(url)
    if match is None:
        spans = _keyword_spans(url)
        if not spans and "=" not in url and "@" in url:  # "user:pw@host" without a scheme
            spans = [(0, url.rfind("@"))]
        return _merge(spans)
    scheme, start = match.group(1).lower(), match.end()
    spans = []
    host_start = start
    at = url.rfind("@", start)
    if at >= 0 and not url.startswith("/", start):
        userinfo = url[start:at]
        host_start = at + 1
        if any(c in userinfo for c in "/?#") or (scheme in _TOKEN_SCHEMES and ":" not in userinfo):
            spans.append((start, at))
        elif ":" in userinfo:
            spans.append((start + userinfo.index(":") + 1, at))
    spans += _tail_spans(url, start)  # the urlsplit reading
    if host_start != start:
        spans += _tail_spans(url, host_start)  # the last-@ reading
    return _merge(spans)


def _tail_spans(url: str, origin: int) -> list[tuple[int, int]]:
    """Secret query values and the fragment, reading the authority from ``origin``."""
    spans = []
    end = len(url)
    fragment = url.find("#", origin)
    if fragment >= 0:
        spans.append((fragment + 1, end))
        end = fragment
    query = url.find("?", origin, end)
    if query < 0:
        return spans
    position = query + 1
    after_secret = False
    for item in url[query + 1 : end].split("&"):
        key, eq, _ = item.partition("=")
        if eq and is_secret_key(key):
            spans.append((position + len(key) + 1, position + len(item)))
            after_secret = True
        elif not eq and after_secret and item:
            spans.append((position, position + len(item)))
        else:
            after_secret = False
        position += len(item) + 1
    return spans


def _keyword_spans(text: str) -> list[tuple[int, int]]:
    """Values of secret keys in a libpq keyword string (``password='a b'``)."""
    return [(m.start(3), m.end(3)) for m in _KEYWORD.finditer(text)]


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _strings(value: object, depth: int = 3) -> list[str]:
    """The strings inside a container (a list or dict given where a URL belongs)."""
    if isinstance(value, str):
        return [value]
    if depth == 0:
        return []
    items: Iterable[object] = ()
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple | set | frozenset):
        items = value
    return [text for item in list(items)[:100] for text in _strings(item, depth - 1)]


def _mask_keyword(match: re.Match[str]) -> str:
    if match.group(3) == MASK:
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}{MASK}"
