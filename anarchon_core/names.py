"""Job names: the identity of a job in the store, so they are validated strictly.

A conservative character set keeps every key, subject, queue name or SQL value
derived from a name safe on every store (backends still encode them for their store).
"""

from __future__ import annotations

import re

from .errors import ConfigurationError

__all__ = ["JOB_NAME_FORM", "validate_job_name", "validate_namespace"]

JOB_NAME_FORM = "1-200 characters from A-Z a-z 0-9 _ . : -, starting with a letter or digit"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")


def validate_job_name(name: object, *, what: str = "job name") -> str:
    """Return ``name`` if valid, else raise a :class:`ConfigurationError` naming it."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ConfigurationError(f"{what} {name!r} is not valid: use {JOB_NAME_FORM}")
    return name


def validate_namespace(namespace: object) -> str | None:
    """A namespace prefixes every job name in the store (``"{namespace}:{name}"``)."""
    if namespace is None:
        return None
    return validate_job_name(namespace, what="namespace")


def store_name(namespace: str | None, name: str) -> str:
    """The name a job has in the store; validated again because the prefix adds length."""
    if namespace is None:
        return name
    return validate_job_name(f"{namespace}:{name}", what="namespaced job name")
