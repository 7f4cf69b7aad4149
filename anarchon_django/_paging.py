"""The admin's paginator that never counts a whole table."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

__all__ = ["COUNT_LIMIT", "BoundedCountPaginator"]

#: The most rows the changelist counts; past it the count reads "more than …".
COUNT_LIMIT = 10_000


class BoundedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator whose ``count`` reads at most ``limit + 1`` rows (``capped`` then says
    so); pages are still fetched with ``LIMIT/OFFSET`` in the index's order."""

    limit = COUNT_LIMIT

    @cached_property
    def count(self) -> int:
        object_list: Any = self.object_list
        if isinstance(object_list, QuerySet):
            return int(object_list[: self.limit + 1].count())
        return len(object_list)

    @property
    def capped(self) -> bool:
        """Whether there are more matching rows than were counted."""
        return self.count > self.limit
