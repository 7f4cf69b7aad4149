"""Job names and namespaces: the identity of a job in the store, so they are validated strictly.

A conservative character set keeps every key, subject, queue name or SQL value
derived from a name safe on every store (backends still encode them for their store).

A namespace may not contain ``:``, the separator of ``"{namespace}:{name}"``: otherwise
namespace ``a`` with job ``b:c`` and namespace ``a:b`` with job ``c`` would share the
store name ``a:b:c``, and two services would run each other's slots. With the rule, the
namespace of a store name is everything before its first ``:``.
"""

from __future__ import annotations

import re

from .errors import ConfigurationError
from .redact import brief

__all__ = [
    "JOB_NAME_FORM",
    "MAX_NAME_LENGTH",
    "NAMESPACE_FORM",
    "namespace_prefix",
    "validate_job_name",
    "validate_namespace",
]

#: The longest job name, namespace, or store name (``namespace:name``), in characters.
MAX_NAME_LENGTH = 200
JOB_NAME_FORM = "1-200 characters from A-Z a-z 0-9 _ . : -, starting with a letter or digit"
NAMESPACE_FORM = "1-200 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit (no ':')"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}", re.ASCII)
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}", re.ASCII)


def validate_job_name(name: object, *, what: str = "job name") -> str:
    """Return ``name`` if valid, else raise a :class:`ConfigurationError` naming it."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ConfigurationError(f"{what} {brief(name)} is not valid: {_why(name)}{JOB_NAME_FORM}")
    return name


def _why(name: object) -> str:
    if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        return f"it has {len(name)} characters; use "
    return "use "


def validate_namespace(namespace: object) -> str | None:
    """A namespace prefixes every job name in the store (``"{namespace}:{name}"``).

    :raises ConfigurationError: not a job name, or it contains ``:``, which would make
        the join ambiguous (see the module docstring).
    """
    if namespace is None:
        return None
    if isinstance(namespace, str) and ":" in namespace and _NAME.fullmatch(namespace):
        raise ConfigurationError(
            f"namespace {brief(namespace)} is not valid: it may not contain ':', which "
            f"separates the namespace from the job name in the store; use {NAMESPACE_FORM}"
        )
    if not isinstance(namespace, str) or _NAMESPACE.fullmatch(namespace) is None:
        raise ConfigurationError(
            f"namespace {brief(namespace)} is not valid: {_why(namespace)}{NAMESPACE_FORM}"
        )
    return namespace


def store_name(namespace: str | None, name: str) -> str:
    """The name a job has in the store; validated again because the prefix adds length."""
    if namespace is None:
        return name
    return validate_job_name(f"{namespace}:{name}", what="namespaced job name")


def namespace_prefix(namespace: str) -> str:
    """The prefix every store name of ``namespace`` starts with: ``"{namespace}:"``."""
    return f"{validate_namespace(namespace)}:"
