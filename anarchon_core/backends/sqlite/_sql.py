"""The SQL of :mod:`anarchon_core.backends.sqlite`: its layout and its statements.

Kept apart so that the backend module reads as the decisions it takes. Every value
is bound as a parameter; the only text spliced into statements is made of the
constant statuses below and the constant names of :data:`ADDED_COLUMNS`.
"""

from __future__ import annotations

from ...records import TERMINAL_STATUSES

#: ``runs.state`` of a failed run whose retry is pending (not a history status).
WAITING = "waiting"
#: ``runs.state`` of a manual request no instance has started yet (not a history status).
PENDING = "pending"

_TERMINAL = ", ".join(f"'{status}'" for status in sorted(TERMINAL_STATUSES))

#: A host's layout (:func:`layout` with ``surrogate_key``) begins every table with this
#: column: the Django admin cannot show a row of a composite key. As Django declares it,
#: so that tables its former migrations made are the same. No statement reads it.
SURROGATE_KEY = "id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT"


def _table(name: str, columns: str, key: str, *, surrogate_key: bool) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of one table of the layout: ``columns``, keyed by
    ``key``, its primary key; with ``surrogate_key``, ``id`` is the primary key and
    ``key`` the unique constraint ``<name>_key`` (the core's statements need only that
    the key is unique: their ``ON CONFLICT`` clauses name its columns).
    """
    if surrogate_key:
        head, tail = f"{SURROGATE_KEY},\n        ", f"CONSTRAINT {name}_key UNIQUE ({key})"
    else:
        head, tail = "", f"PRIMARY KEY ({key})"
    return f"""
    CREATE TABLE IF NOT EXISTS {name} (
        {head}{columns},
        {tail}
    )
    """


# Facts about the store: its schema_version, and the counter of definition changes.
_META = """key   TEXT NOT NULL,
        value TEXT NOT NULL"""

# The run of (job, slot): the row every instance contends for. ``state`` is
# 'pending' (a manual request), 'running', 'waiting' or the terminal status the run
# ended with. A manual run has no schedule, so its ``fingerprint`` holds who asked.
_RUNS = """job           TEXT    NOT NULL,
        slot          INTEGER NOT NULL,
        origin        TEXT    NOT NULL,
        state         TEXT    NOT NULL,
        attempt       INTEGER NOT NULL,
        token         TEXT,
        lease_expires INTEGER NOT NULL DEFAULT 0,
        retry_at      INTEGER NOT NULL DEFAULT 0,
        fingerprint   TEXT    NOT NULL DEFAULT ''"""

_ATTEMPTS = """job         TEXT    NOT NULL,
        slot        INTEGER NOT NULL,
        attempt     INTEGER NOT NULL,
        origin      TEXT    NOT NULL,
        status      TEXT    NOT NULL,
        instance_id TEXT,
        claimed_at  INTEGER,
        started_at  INTEGER,
        finished_at INTEGER,
        error       TEXT,
        meta        TEXT    NOT NULL DEFAULT '{}'"""

# A job's state shared by every instance: its pause flag and its stored definition.
# ``version`` is the store's definitions counter when the definition last changed
# (NULL: never defined here); ``definition`` its JSON text (NULL with a version: a
# removal, kept so that definitions_since reports it).
_JOBS = """job        TEXT    NOT NULL,
        paused     INTEGER NOT NULL DEFAULT 0,
        version    INTEGER,
        definition TEXT"""

# The instance registry: ``info`` is InstanceInfo as JSON; a row whose expiry has
# passed is a dead instance (read as absent, deleted by the next register).
_INSTANCES = """instance_id TEXT    NOT NULL,
        info        TEXT    NOT NULL,
        last_seen   INTEGER NOT NULL,
        expires_at  INTEGER NOT NULL"""


def layout(*, surrogate_key: bool = False) -> tuple[str, ...]:
    """The layout's statements, idempotent: the meta table first, then the others.

    The store runs them on its own file at open (:data:`META_TABLE`, :data:`SCHEMA`);
    a host's migrations run them with ``surrogate_key`` (``anarchon_django``: the one
    schema of both, see :func:`anarchon_core.backends.supply.layout`).
    """

    def table(name: str, columns: str, key: str) -> str:
        return _table(name, columns, key, surrogate_key=surrogate_key)

    return (
        table("anarchon_meta", _META, "key"),
        table("anarchon_runs", _RUNS, "job, slot"),
        # The live-run check (state 'running', job, lease_expires > now) is a range scan
        # of this index, and due_runs reads the open runs of every job through its
        # leading state column without naming the jobs.
        """
    CREATE INDEX IF NOT EXISTS anarchon_runs_open
        ON anarchon_runs (state, job, lease_expires)
    """,
        # Its predecessor (job, state, lease_expires) in files written before: it serves
        # nothing the index above does not, and every index costs each claim a write.
        "DROP INDEX IF EXISTS anarchon_runs_state",
        table("anarchon_attempts", _ATTEMPTS, "job, slot, attempt"),
        # History across jobs in its order, (slot, job, attempt) descending: a page is
        # one index range from its cursor, with no sort. Per job the key, read
        # backwards, serves the order.
        """
    CREATE INDEX IF NOT EXISTS anarchon_attempts_history
        ON anarchon_attempts (slot DESC, job DESC, attempt DESC)
    """,
        """
    CREATE INDEX IF NOT EXISTS anarchon_attempts_status_history
        ON anarchon_attempts (status, slot DESC, job DESC, attempt DESC)
    """,
        # Their predecessors, of a former order (job ascending), in files written before.
        "DROP INDEX IF EXISTS anarchon_attempts_slot",
        "DROP INDEX IF EXISTS anarchon_attempts_status",
        table("anarchon_jobs", _JOBS, "job"),
        table("anarchon_instances", _INSTANCES, "instance_id"),
    )


#: The store's own layout: its meta table (created first, to read the version), then
#: the rest. Files of an earlier layout keep their tables (``IF NOT EXISTS``) and get
#: the columns of :data:`ADDED_COLUMNS`.
META_TABLE, *_REST = layout()
SCHEMA = tuple(_REST)

#: Columns added to a table of the layout after its first release, as (table, column,
#: declaration): a file of an earlier layout gets those it lacks when it is opened
#: (SQLite has no ``ADD COLUMN IF NOT EXISTS``; ``PRAGMA table_info`` says which exist).
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("anarchon_jobs", "version", "INTEGER"),
    ("anarchon_jobs", "definition", "TEXT"),
)

GET_VERSION = "SELECT value FROM anarchon_meta WHERE key = 'schema_version'"
SET_VERSION = "INSERT INTO anarchon_meta (key, value) VALUES ('schema_version', ?)"

GET_RUN = """
SELECT origin, state, attempt, token, lease_expires, retry_at, fingerprint
FROM anarchon_runs WHERE job = ? AND slot = ?
"""
# Read without the write lock by a claim about to lose (see sqlite._claim_precheck).
RUN_TOKEN = "SELECT token FROM anarchon_runs WHERE job = ? AND slot = ?"
INSERT_RUN = """
INSERT INTO anarchon_runs
    (job, slot, origin, state, attempt, token, lease_expires, retry_at, fingerprint)
VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)
"""
LIVE_RUN = """
SELECT min(slot) FROM anarchon_runs
WHERE job = ? AND state = 'running' AND lease_expires > ? AND slot != ?
"""
IS_PAUSED = "SELECT 1 FROM anarchon_jobs WHERE job = ? AND paused != 0"
SET_PAUSED = """
INSERT INTO anarchon_jobs (job, paused) VALUES (?, ?)
ON CONFLICT (job) DO UPDATE SET paused = excluded.paused
"""
PAUSED_JOBS = "SELECT job FROM anarchon_jobs WHERE paused != 0 ORDER BY job"
# A claim that names a definition version reads this instead of IS_PAUSED: the same one
# read of the job's row answers whether it is paused and whether the store holds exactly
# that version with a body (no row, another version or a removal: 0 or NULL).
CLAIM_JOB = """
SELECT paused != 0, version = ? AND definition IS NOT NULL FROM anarchon_jobs WHERE job = ?
"""

# Job definitions. The store's counter of definition changes is the meta row
# 'definitions_version' (absent until the first change), read and advanced under the
# write lock by each change, so versions are issued in commit order. A definition's
# current version is that of a row with a body; a removal's row keeps its version.
DEFINITIONS_VERSION = "SELECT value FROM anarchon_meta WHERE key = 'definitions_version'"
SET_DEFINITIONS_VERSION = """
INSERT INTO anarchon_meta (key, value) VALUES ('definitions_version', ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value
"""
# Where the counter row is missing (a store whose meta rows were deleted): the highest
# version the rows hold, so that versions never go back.
HIGHEST_DEFINITION = "SELECT max(version) FROM anarchon_jobs"
DEFINITION_VERSION = "SELECT version FROM anarchon_jobs WHERE job = ? AND definition IS NOT NULL"
READ_DEFINITION = (
    "SELECT version, definition FROM anarchon_jobs WHERE job = ? AND definition IS NOT NULL"
)
WRITE_DEFINITION = """
INSERT INTO anarchon_jobs (job, paused, version, definition) VALUES (?, 0, ?, ?)
ON CONFLICT (job) DO UPDATE SET version = excluded.version, definition = excluded.definition
"""
# A scan of the jobs table (one row per job; no index on version): replicas read it
# only when the counter they poll has moved, which edits of definitions alone do.
DEFINITIONS_SINCE = """
SELECT job, version, definition FROM anarchon_jobs WHERE version > ? ORDER BY version
"""

# Manual requests: at most one pending per job (a range of the index of open runs).
PENDING_SLOT = f"SELECT slot FROM anarchon_runs WHERE state = '{PENDING}' AND job = ? LIMIT 1"
RUN_EXISTS = "SELECT 1 FROM anarchon_runs WHERE job = ? AND slot = ?"
INSERT_PENDING = f"""
INSERT INTO anarchon_runs
    (job, slot, origin, state, attempt, token, lease_expires, retry_at, fingerprint)
VALUES (?, ?, 'manual', '{PENDING}', 0, NULL, 0, 0, ?)
"""
# Cancel: the token is forgotten (fencing) and the lease zeroed (no longer live).
CANCEL_RUN = """
UPDATE anarchon_runs SET state = 'cancelled', token = NULL, lease_expires = 0
WHERE job = ? AND slot = ?
"""
CANCEL_ATTEMPT = """
UPDATE anarchon_attempts SET status = 'cancelled', finished_at = ?
WHERE job = ? AND slot = ? AND attempt = ? AND status = 'running'
"""

# Every lease operation matches the run by its current attempt *and* token: fencing.
HELD_STATE = """
SELECT state FROM anarchon_runs WHERE job = ? AND slot = ? AND attempt = ? AND token = ?
"""
HEARTBEAT = """
UPDATE anarchon_runs SET lease_expires = ?
WHERE job = ? AND slot = ? AND attempt = ? AND token = ? AND state = 'running'
"""
FINISH_RUN = """
UPDATE anarchon_runs SET state = ?, lease_expires = 0, retry_at = coalesce(?, retry_at)
WHERE job = ? AND slot = ?
"""
RELEASE_RUN = """
UPDATE anarchon_runs SET lease_expires = ?, token = NULL WHERE job = ? AND slot = ?
"""
TAKE_OVER_RUN = """
UPDATE anarchon_runs SET state = 'running', attempt = ?, token = ?, lease_expires = ?
WHERE job = ? AND slot = ?
"""
END_RUN = "UPDATE anarchon_runs SET state = ?, token = NULL WHERE job = ? AND slot = ?"

INSERT_ATTEMPT = """
INSERT OR REPLACE INTO anarchon_attempts
    (job, slot, attempt, origin, status, instance_id, claimed_at, started_at, finished_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
# A record of a slot that ran nothing (attempt 0), with the reason as its error.
INSERT_NOTHING_RAN = """
INSERT OR REPLACE INTO anarchon_attempts
    (job, slot, attempt, origin, status, instance_id, claimed_at, started_at, finished_at,
     error)
VALUES (?, ?, 0, ?, ?, ?, ?, NULL, ?, ?)
"""
ATTEMPT_STATUS = "SELECT status FROM anarchon_attempts WHERE job = ? AND slot = ? AND attempt = ?"
FINISH_ATTEMPT = """
UPDATE anarchon_attempts SET status = ?, finished_at = ?, error = ?, meta = ?
WHERE job = ? AND slot = ? AND attempt = ?
"""
# Ends an attempt as interrupted; ``only_running`` keeps a finished outcome intact.
INTERRUPT_ATTEMPT = """
UPDATE anarchon_attempts SET status = 'interrupted', finished_at = ?, error = ?
WHERE job = ? AND slot = ? AND attempt = ? AND (? = 0 OR status = 'running')
"""

LAST_SCHEDULED_SLOT = """
SELECT slot FROM anarchon_runs WHERE job = ? AND origin != 'manual'
ORDER BY slot DESC LIMIT 1
"""

HISTORY_COLUMNS = """
SELECT job, slot, attempt, origin, status, instance_id,
       claimed_at, started_at, finished_at, error, meta
FROM anarchon_attempts
"""
HISTORY_ORDER = " ORDER BY slot DESC, job DESC, attempt DESC LIMIT ?"

# The two kept slots (latest record, latest scheduled run) may be NULL: hence IS NOT.
PRUNE_JOBS = "SELECT job FROM anarchon_attempts UNION SELECT job FROM anarchon_runs"
LATEST_SLOT = "SELECT max(slot) FROM anarchon_attempts WHERE job = ?"
PRUNE_ATTEMPTS = f"""
DELETE FROM anarchon_attempts
WHERE job = ? AND slot < ? AND slot IS NOT ? AND slot IS NOT ? AND status IN ({_TERMINAL})
"""
PRUNE_RUNS = f"""
DELETE FROM anarchon_runs
WHERE job = ? AND slot < ? AND slot IS NOT ? AND slot IS NOT ? AND state IN ({_TERMINAL})
"""

# Every open run that is due at ``?`` (the store's now, twice), of all jobs: they are
# few, so the caller filters them by job name instead of sending thousands of names.
# A pending manual request is due at once.
DUE_RUNS = f"""
SELECT job, slot, attempt, origin, state FROM anarchon_runs
WHERE state IN ('running', '{WAITING}', '{PENDING}')
  AND CASE state
      WHEN 'running' THEN lease_expires <= ?
      WHEN '{WAITING}' THEN retry_at <= ?
      ELSE 1 END
"""

# The instance registry; ``?`` of each read is the store's now.
REGISTER = """
INSERT INTO anarchon_instances (instance_id, info, last_seen, expires_at) VALUES (?, ?, ?, ?)
ON CONFLICT (instance_id) DO UPDATE SET
    info = excluded.info, last_seen = excluded.last_seen, expires_at = excluded.expires_at
"""
FORGET_DEAD = "DELETE FROM anarchon_instances WHERE expires_at <= ?"
UNREGISTER = "DELETE FROM anarchon_instances WHERE instance_id = ?"
INSTANCES = """
SELECT info, last_seen FROM anarchon_instances WHERE expires_at > ? ORDER BY instance_id
"""
