"""``MODULE:ATTR``: the scheduler a command runs or inspects, imported with the current
directory first on ``sys.path``."""

from __future__ import annotations

import importlib
import os
import re
import sys

from ..background import BackgroundScheduler
from ..scheduler import Scheduler
from ._errors import CliError, one_line

__all__ = ["TARGET_FORM", "load_scheduler"]

TARGET_FORM = "MODULE:ATTR, e.g. 'myapp.jobs:scheduler' (a module importable from here)"

_TARGET = re.compile(
    r"(?P<module>[^\W\d]\w*(?:\.[^\W\d]\w*)*):(?P<attr>[^\W\d]\w*(?:\.[^\W\d]\w*)*)"
)


def load_scheduler(target: str) -> Scheduler:
    """Import ``MODULE:ATTR`` (the current directory first on ``sys.path``) to a Scheduler.

    A :class:`BackgroundScheduler` is accepted too (its wrapped scheduler is used), so the
    object a Django or WSGI app already exposes can be run or listed as it is.
    """
    match = _TARGET.fullmatch(target)
    if match is None:
        raise CliError(f"{target!r} is not a valid target: give {TARGET_FORM}")
    module_name, attr = match.group("module"), match.group("attr")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # console scripts start with their own bin/ there instead
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CliError(
                f"cannot import module {module_name!r} (from {target!r}): {exc}; run from "
                f"the directory that contains it, or set PYTHONPATH"
            ) from exc
        raise CliError(f"importing {module_name!r} failed: {one_line(exc)}") from exc
    except Exception as exc:  # anything the user's module raises while importing
        raise CliError(f"importing {module_name!r} failed: {one_line(exc)}") from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(
                f"{target!r}: module {module_name!r} has no attribute {attr!r}; "
                f"expected {TARGET_FORM}"
            ) from None
    if isinstance(obj, BackgroundScheduler):
        obj = obj.scheduler
    if not isinstance(obj, Scheduler):
        raise CliError(
            f"{target!r} is an object of type {type(obj).__name__}, not an anarchon "
            f"Scheduler: give MODULE:ATTR naming a Scheduler (or BackgroundScheduler), "
            f"e.g. 'myapp.jobs:scheduler'"
        )
    return obj
