"""The store a command acts on (``--backend``, else ``$ANARCHON_BACKEND``, else the
embedded default), opened for one operation and closed again."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..backend import Backend
from ..backends import DEFAULT_URL, backend_from_url
from ..errors import ConfigurationError
from ._errors import CliError, store_failure

__all__ = ["backend_url", "open_and", "store_call"]

T = TypeVar("T")


def backend_url(args: argparse.Namespace) -> str:
    """The store URL of a parsed command line: ``--backend``, the environment, the default."""
    url: str | None = args.backend
    return url or os.environ.get("ANARCHON_BACKEND") or DEFAULT_URL


async def open_and(url: str, use: Callable[[Backend], Awaitable[T]]) -> T:
    """Build the store of ``url``, open it, run ``use`` on it and close it again."""
    backend = backend_from_url(url)
    try:
        await backend.open()
        return await use(backend)
    finally:
        await backend.close()  # idempotent, and frees what a failed open() left behind


def store_call(args: argparse.Namespace, use: Callable[[Backend], Awaitable[T]]) -> T:
    """Run one store operation; a store failure is exit 1 with the masked URL."""
    url = backend_url(args)
    try:
        return asyncio.run(open_and(url, use))
    except ConfigurationError:
        raise
    except Exception as exc:
        raise CliError(store_failure(url, exc), code=1) from exc
