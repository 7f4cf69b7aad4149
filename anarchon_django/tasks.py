"""The ``django.tasks`` bridge: enqueue a task once per slot of a schedule.

``scheduler.cron("reports.daily", "0 7 * * *", task=send_report)`` defines a job whose
handler enqueues a task of ``django.tasks`` (Django ≥ 6.0; the ``django_tasks`` backport
on 5.2) once per slot, passing the slot as ``anarchon_slot`` (epoch ms: the task's
idempotency key, since after a takeover it may be enqueued twice), and ``anarchon_job``
/ ``anarchon_attempt`` if it names them. See ``docs/django.md``, "django.tasks".
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from anarchon_core.context import RunContext
from anarchon_core.errors import ConfigurationError
from anarchon_core.records import ms_to_datetime

__all__ = [
    "SLOT_ARGUMENT",
    "EnqueueableTask",
    "enqueue_handler",
    "slot_datetime",
    "task_classes",
    "tasks_module",
]

#: The keyword argument that carries the slot (epoch ms); every task must accept it.
SLOT_ARGUMENT = "anarchon_slot"
#: Passed only to tasks that name them (or take ``**kwargs``).
OPTIONAL_ARGUMENTS = ("anarchon_job", "anarchon_attempt")

_MODULES = ("django.tasks", "django_tasks")


@runtime_checkable
class EnqueueableTask(Protocol):
    """What the bridge needs of a task: ``django.tasks.Task`` / ``django_tasks`` ``Task``."""

    def enqueue(self, *args: Any, **kwargs: Any) -> Any: ...


def _installed(suffix: str = "") -> Iterator[ModuleType]:
    for name in _MODULES:
        try:
            module = importlib.import_module(name + suffix)
        except ImportError:
            continue
        yield module


@functools.cache
def tasks_module() -> ModuleType:
    """``django.tasks`` if importable (Django ≥ 6.0), else the ``django_tasks`` backport;
    :class:`ConfigurationError` if neither is installed."""
    for module in _installed():
        return module
    raise ConfigurationError(
        "task=: neither django.tasks (Django >= 6.0) nor django_tasks (the backport) is "
        "installed: upgrade Django to 6.0, or pip install django-tasks"
    )


@functools.cache
def task_classes() -> tuple[type, ...]:
    """The ``Task`` classes of every tasks module installed (the resolved one first)."""
    tasks_module()  # raises if neither is installed
    classes = (getattr(base, "Task", None) for base in _installed(".base"))
    return tuple(cls for cls in classes if isinstance(cls, type))


#: The aware UTC datetime of a slot (``anarchon_slot`` is epoch milliseconds).
slot_datetime = ms_to_datetime


def _describe(value: object) -> str:
    return str(getattr(value, "__qualname__", None) or repr(value))


def check_task(task: object, owner: str) -> None:
    """Raise :class:`ConfigurationError` unless ``task`` is a task of the tasks framework."""
    module = tasks_module().__name__
    if isinstance(task, task_classes()):
        return
    if callable(task) and not isinstance(task, EnqueueableTask):
        raise ConfigurationError(
            f"{owner}: task={_describe(task)} is a plain callable, not a task: decorate it "
            f"with @task (from {module} import task), or pass it as the handler instead"
        )
    raise ConfigurationError(
        f"{owner}: task={task!r} is not a task: give a function decorated with @task "
        f"(from {module} import task)"
    )


def _accepts(func: Callable[..., Any]) -> tuple[inspect.Signature | None, set[str], bool]:
    """The signature of ``func``, its keyword-passable parameter names, and ``**kwargs``."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None, set(), True
    names = {
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    var_kw = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return signature, names, var_kw


def enqueue_handler(
    task: Any,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    name: str = "?",
) -> Callable[[RunContext], str]:
    """A handler that enqueues ``task`` once per run: ``task.enqueue(*args, **kwargs,
    anarchon_slot=ctx.slot)`` (plus ``anarchon_job``/``anarchon_attempt`` if the task names
    them), recording the task's path and the result's id in ``ctx.meta`` and returning the
    id; nothing once the run is cancelled. Checked now: ``task`` is a task whose function
    accepts ``anarchon_slot`` and the arguments, which are JSON-serialisable.

    :raises ConfigurationError: any of the above does not hold.
    """
    owner = f"job {name!r}"
    check_task(task, owner)
    func = getattr(task, "func", None)
    label = _describe(func if func is not None else task)
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise ConfigurationError(
            f"{owner}: task_args={args!r} is not a list: give the positional arguments of "
            f"the task as a list or tuple, e.g. task_args=[{args!r}]"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(
            f"{owner}: task_kwargs={kwargs!r} is not a dict: give the keyword arguments of "
            f"the task as a dict"
        )
    args = tuple(args)
    kwargs = dict(kwargs or {})
    reserved = sorted(k for k in kwargs if k == SLOT_ARGUMENT or k in OPTIONAL_ARGUMENTS)
    if reserved:
        raise ConfigurationError(
            f"{owner}: task_kwargs may not set {', '.join(reserved)}: the scheduler passes "
            f"them for each slot"
        )
    try:
        json.dumps([args, kwargs])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{owner}: the arguments of task {label} are not JSON-serialisable ({exc}): "
            f"tasks take JSON values (str, int, float, bool, None, lists and dicts of them)"
        ) from None
    signature, names, var_kw = _accepts(func) if callable(func) else (None, set(), True)
    if not var_kw and SLOT_ARGUMENT not in names:
        raise ConfigurationError(
            f"{owner}: task {label} must accept the keyword argument {SLOT_ARGUMENT!r} (the "
            f"slot it is enqueued for, epoch ms; its idempotency key), e.g. "
            f"'def {getattr(func, '__name__', 'task')}(*, {SLOT_ARGUMENT}: int): ...'"
        )
    passed = [n for n in OPTIONAL_ARGUMENTS if var_kw or n in names]
    if signature is not None:
        leading = [None] if getattr(task, "takes_context", False) else []
        probe = {SLOT_ARGUMENT: 0, **dict.fromkeys(passed, 0)}
        try:
            signature.bind(*leading, *args, **kwargs, **probe)
        except TypeError as exc:
            raise ConfigurationError(
                f"{owner}: task {label} cannot be called with task_args={list(args)!r}, "
                f"task_kwargs={kwargs!r} and {SLOT_ARGUMENT}: {exc}"
            ) from None
    path = str(getattr(task, "module_path", None) or label)

    def enqueue(ctx: RunContext) -> str:
        ctx.raise_if_cancelled()  # a lost lease: the slot is another instance's now
        extra: dict[str, Any] = {SLOT_ARGUMENT: ctx.slot}
        if "anarchon_job" in passed:
            extra["anarchon_job"] = ctx.job
        if "anarchon_attempt" in passed:
            extra["anarchon_attempt"] = ctx.attempt
        result = task.enqueue(*args, **kwargs, **extra)
        result_id = str(result.id)
        ctx.meta["task"] = path
        ctx.meta["task_id"] = result_id
        ctx.logger.info("enqueued task %s for slot %d: %s", path, ctx.slot, result_id)
        return result_id

    enqueue.__name__ = enqueue.__qualname__ = f"enqueue_{getattr(func, '__name__', 'task')}"
    enqueue.__doc__ = f"Enqueue the task {path} once per slot."
    if func is not None and getattr(func, "__module__", None):
        enqueue.__module__ = func.__module__
    return enqueue
