"""An MkDocs hook for the API reference: reStructuredText markup in docstrings as HTML.

The docstrings use Sphinx roles (``:class:`Scheduler```) and literal-block markers
(``::``, ``.. code-block:: python``), which mkdocstrings renders as Markdown, so they
would show as ``:class:Scheduler``. This hook turns every role into an optional
cross-reference (a link where the object is documented, plain code otherwise) and drops
the block markers. Only pages under ``reference/`` are touched. (This file is excluded
from the built site by ``exclude_docs`` in ``mkdocs.yml``.)
"""

from __future__ import annotations

import html
import re
from typing import Any

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):<code>([^<]+)</code>")
_CODE_BLOCK = re.compile(r"<p>\.\. code-block::[^<]*</p>")
_BARE_MARKER = re.compile(r"<p>::</p>")
_TRAILING_MARKER = re.compile(r"::</p>")
# Relative targets (``Scheduler``, ``Backend.claim``) are tried under these packages.
_FALLBACK_PACKAGE = "anarchon_core"


def _reference(match: re.Match[str]) -> str:
    target = html.unescape(match.group(1)).strip()
    short = target.startswith("~")
    target = target.lstrip("~.")
    shown = target.rsplit(".", 1)[-1] if short else target
    identifier = html.escape(target, quote=True)
    fallback = ""
    if not target.startswith(("anarchon_", "asyncio.", "logging.", "typing.")):
        fallback = f' slug="{html.escape(f"{_FALLBACK_PACKAGE}.{target}", quote=True)}"'
    return (
        f'<autoref identifier="{identifier}"{fallback} optional>'
        f"<code>{html.escape(shown)}</code></autoref>"
    )


def on_page_content(html_text: str, page: Any, **kwargs: Any) -> str:
    """Rewrite the roles and markers of one reference page's HTML."""
    if not page.file.src_uri.startswith("reference/"):
        return html_text
    html_text = _ROLE.sub(_reference, html_text)
    html_text = _CODE_BLOCK.sub("", html_text)
    html_text = _BARE_MARKER.sub("", html_text)
    return _TRAILING_MARKER.sub(":</p>", html_text)
