"""``anarchon_django``'s migrations as they were before one schema (``0001_initial`` to
``0004``, with ``0001_initial_key_columns``): ``tests/django/test_schema_source`` makes a
database with them, then migrates it with the current ones, as an upgrade does."""
