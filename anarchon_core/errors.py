"""The exception tree of anarchon.

::

    AnarchonError
    ├── ConfigurationError (ValueError)   bad input at definition or start time
    │   └── CapabilityError               a feature the chosen backend cannot honour
    ├── SchedulerStateError (RuntimeError) start() on a running scheduler, and the like
    ├── ConflictError                     an edit named a definition version that is gone
    ├── MissingTargetError                a stored definition's target is held nowhere
    ├── RunCancelled                      raised by ctx.raise_if_cancelled() in a handler
    └── BackendError                      the store failed
        ├── BackendUnavailable            could not reach the store (retried with backoff)
        └── SchemaVersionError            the store holds a newer layout than this code knows

Driver exceptions never leave a backend: they are converted at the boundary with
``raise BackendUnavailable(...) from exc`` so that callers handle one tree.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "AnarchonError",
    "BackendError",
    "BackendUnavailable",
    "CapabilityError",
    "ConfigurationError",
    "ConflictError",
    "MissingTargetError",
    "RunCancelled",
    "SchedulerStateError",
    "SchemaVersionError",
    "refusing",
]


class AnarchonError(Exception):
    """Root of every error anarchon raises on purpose."""


class ConfigurationError(AnarchonError, ValueError):
    """A value given to anarchon is invalid; the message names it and the accepted form.

    ``subject`` says which part of a job definition was refused: ``"job name"``,
    ``"duration"`` (an interval or offset), ``"cron"``, ``"zone"`` or ``"option"``
    (``None`` elsewhere), so that an adapter can report it in its own terms (Django's
    system check ids) without validating anything twice.
    """

    subject: str | None = None


@contextmanager
def refusing(subject: str) -> Iterator[None]:
    """Give the :class:`ConfigurationError` raised inside the ``subject`` it lacks."""
    try:
        yield
    except ConfigurationError as exc:
        if exc.subject is None:
            exc.subject = subject
        raise


class CapabilityError(ConfigurationError):
    """A feature was asked of a backend that cannot provide it (e.g. a lease on a broker)."""


class SchedulerStateError(AnarchonError, RuntimeError):
    """An operation does not fit the scheduler's current state (e.g. starting it twice)."""


class ConflictError(AnarchonError):
    """An edit of a stored definition named a version the store no longer holds.

    Someone changed (or removed, or created) the definition since it was read: read it
    again and redo the edit. ``current`` is the version the store holds (0: none).
    """

    def __init__(self, message: str, *, current: int) -> None:
        super().__init__(message)
        self.current = current


class MissingTargetError(AnarchonError):
    """A stored definition's target is registered on no live instance: its run records
    this failure instead of passing in silence."""


class RunCancelled(AnarchonError):
    """The run lost its lease, timed out, was cancelled or the scheduler is stopping."""


class BackendError(AnarchonError):
    """The store failed to answer or answered something unusable."""


class BackendUnavailable(BackendError):
    """The store could not be reached; the engine retries with backoff."""


class SchemaVersionError(BackendError):
    """The store was written by a newer anarchon whose layout this version does not know."""
