"""The public conformance suite, run against the Django ORM backend.

The test functions are those of ``anarchon_core.conformance`` (imported, as a
third-party store imports them), with this directory's ``backend`` fixture: an open
``DjangoBackend`` on the test database, SQLite, PostgreSQL or MySQL/MariaDB as
``ANARCHON_TEST_DJANGO_DB`` says. The tests about other stores stay in
``tests/backends``: the suite holds only tests of the contract.
"""

from __future__ import annotations

from anarchon_core.conformance.contract import *  # noqa: F403
from anarchon_core.conformance.definitions import *  # noqa: F403
from anarchon_core.conformance.operations import *  # noqa: F403
