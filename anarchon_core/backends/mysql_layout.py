"""The layout of the MySQL/MariaDB store: its tables, which a host's migrations create.

MySQL has no store of its own: :mod:`anarchon_core.backends.mysql` runs the core SQLite
store's statements on a connection a host supplies, so these are SQLite's tables
(:mod:`anarchon_core.backends.sqlite._sql`) in MySQL's types, with the host's
surrogate ``id`` key (the Django admin cannot show composite keys). No driver is
needed to read them (Django's migrations import this module on every database).

- **Keys compare byte for byte.** MySQL's default collations compare strings
  case-insensitively and ignore trailing spaces, which would make jobs ``Report`` and
  ``report`` one run. The key text columns (job names, the run's state and token,
  instance ids, the meta key) are ``VARCHAR(255)`` (InnoDB indexes no whole ``TEXT``)
  in the server's binary NO PAD utf8mb4 collation (:func:`exact_collation`), whatever
  the database's default. Names and instance ids have at most 200 characters; 255
  utf8mb4 characters are 1,020 bytes, so the widest key, ``(state, job)``, stays
  within InnoDB's 3,072.
- **A definition is kept as written**: ``LONGTEXT`` in the same utf8mb4 collation,
  whatever the table's default character set. It is never compared or indexed.
- The other text columns are ``LONGTEXT`` in the database's default, the JSON ones
  ``JSON`` (MariaDB: ``LONGTEXT`` checked by ``JSON_VALID``), the times ``BIGINT``
  epoch milliseconds. Text defaults are expressions (``DEFAULT ('')``): MySQL 8 takes
  no literal default on a ``TEXT`` or ``JSON`` column.
- MySQL has no partial indexes: "one pending manual run per job" is the store's rule,
  decided under its store-wide lock, as on SQLite.

These are, column for column and key for key, the tables that ``anarchon_django``'s
former migrations made on MySQL/MariaDB, so a database migrated by them is this layout.
"""

from __future__ import annotations

__all__ = ["KEY_LENGTH", "TABLES", "exact_collation", "layout"]

#: Characters of a key column's ``VARCHAR``.
KEY_LENGTH = 255

#: The surrogate key every table begins with (the host's, for its admin).
_ID = "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY"

#: Each table: its columns (``{key}``: a key column's type; ``{exact}``: the binary
#: collation) and its keys and indexes.
TABLES: dict[str, str] = {
    "anarchon_meta": """
    `key`  {key} NOT NULL,
    value  LONGTEXT NOT NULL,
    CONSTRAINT anarchon_meta_key UNIQUE (`key`)""",
    # The run of (job, slot): the row every instance contends for (see the SQLite store).
    "anarchon_runs": """
    job           {key} NOT NULL,
    slot          BIGINT NOT NULL,
    origin        LONGTEXT NOT NULL,
    state         {key} NOT NULL,
    attempt       INT NOT NULL,
    token         {key} NULL,
    lease_expires BIGINT NOT NULL DEFAULT 0,
    retry_at      BIGINT NOT NULL DEFAULT 0,
    fingerprint   LONGTEXT NOT NULL DEFAULT (''),
    CONSTRAINT anarchon_runs_key UNIQUE (job, slot),
    INDEX anarchon_runs_open (state, job)""",
    # History's order, (slot, job, attempt) descending: a page is one index range.
    "anarchon_attempts": """
    job         {key} NOT NULL,
    slot        BIGINT NOT NULL,
    attempt     INT NOT NULL,
    origin      LONGTEXT NOT NULL,
    status      LONGTEXT NOT NULL,
    instance_id LONGTEXT NULL,
    claimed_at  BIGINT NULL,
    started_at  BIGINT NULL,
    finished_at BIGINT NULL,
    error       LONGTEXT NULL,
    meta        JSON NOT NULL DEFAULT ('{{}}'),
    CONSTRAINT anarchon_attempts_key UNIQUE (job, slot, attempt),
    INDEX anarchon_attempts_history (slot DESC, job DESC, attempt DESC)""",
    "anarchon_jobs": """
    job        {key} NOT NULL,
    paused     BOOL NOT NULL DEFAULT 0,
    version    BIGINT NULL,
    definition LONGTEXT CHARACTER SET utf8mb4 COLLATE {exact} NULL,
    CONSTRAINT anarchon_jobs_key UNIQUE (job)""",
    "anarchon_instances": """
    instance_id {key} NOT NULL,
    info        JSON NOT NULL,
    last_seen   BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    CONSTRAINT anarchon_instances_key UNIQUE (instance_id)""",
}


def exact_collation(*, mariadb: bool) -> str:
    """The binary NO PAD utf8mb4 collation of a MariaDB (or else MySQL) server."""
    return "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"


def layout(*, mariadb: bool) -> list[str]:
    """The layout's statements, idempotent (``CREATE TABLE IF NOT EXISTS``), for a
    MariaDB server or else a MySQL one (they name their binary collations apart)."""
    exact = exact_collation(mariadb=mariadb)
    key = f"VARCHAR({KEY_LENGTH}) CHARACTER SET utf8mb4 COLLATE {exact}"
    return [
        f"CREATE TABLE IF NOT EXISTS {name} (\n    {_ID},"
        + columns.format(key=key, exact=exact)
        + "\n)"
        for name, columns in TABLES.items()
    ]
