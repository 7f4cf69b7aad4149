"""How the command reports a failure: one line on stderr and an exit code, with no
traceback unless ``--debug`` asks for one."""

from __future__ import annotations

from ..backends import mask_url
from ..errors import AnarchonError, ConfigurationError

__all__ = ["CliError", "exit_code", "one_line", "store_failure"]


class CliError(Exception):
    """A failure reported as one line on stderr with an exit code (no traceback)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def exit_code(exc: CliError | AnarchonError) -> int:
    """The exit code of an error reported in one line: a :class:`CliError`'s own, 2 for
    a :class:`ConfigurationError` (bad usage or configuration), else 1."""
    if isinstance(exc, CliError):
        return exc.code
    return 2 if isinstance(exc, ConfigurationError) else 1


def store_failure(url: str, exc: BaseException) -> str:
    """One line naming the store (masked) once: backend errors usually name it already."""
    text = str(exc) if isinstance(exc, AnarchonError) else one_line(exc)
    where = mask_url(url)
    return text if where in text else f"{where}: {text}"


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its type, then its message with line breaks folded."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
