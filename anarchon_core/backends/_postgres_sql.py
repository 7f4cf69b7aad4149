"""The SQL of :mod:`anarchon_core.backends.postgres`: its layout, functions and statements.

Every identifier (schema, tables, indexes, functions) is composed with
:class:`psycopg.sql.Identifier`, even though the backend has already validated the
schema and prefix; every value is a ``%s`` parameter. The only literals spliced in
are constants of this module. :class:`Statements` renders everything once per
``(schema, prefix)``, so the hot path executes a constant string that psycopg
prepares on the server after ``prepare_threshold`` uses.

Times are ``bigint`` epoch milliseconds read from ``clock_timestamp()`` inside each
statement: ``now()`` is frozen at the start of a transaction, so a statement that
waited for a lock would judge leases by a stale clock.

The claim and the takeover are PL/pgSQL functions (one round trip: ``SELECT … FROM
f(…)``) rather than one CTE statement because their overlap check must see runs
committed while the function waited for the job's lock. Under READ COMMITTED each
statement of a function takes a fresh snapshot; the parts of one CTE statement share
the snapshot taken before the wait, so they would miss a run committed meanwhile.
"""

from __future__ import annotations

import hashlib
import re

from psycopg import sql

from ..errors import ConfigurationError
from ..records import TERMINAL_STATUSES
from .memory import EARLY_TOLERANCE_MS

__all__ = ["TERMINAL", "WAITING", "Statements", "identifier"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The longest schema, and the longest prefix (it leaves room for the longest suffix).
SCHEMA_MAX, PREFIX_MAX = 63, 40

#: ``runs.state`` of a failed run whose retry is pending (not a history status).
WAITING = "waiting"
#: The terminal statuses, passed as an array parameter to the pruning statements.
TERMINAL = sorted(str(status) for status in TERMINAL_STATUSES)

#: The first key of every advisory lock this backend takes ("anar" in ASCII).
LOCK_CLASS = 0x616E6172

#: Epoch ms of the database's clock at the moment it is evaluated (not the transaction's).
NOW = "(floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint"

# Heartbeats change only runs.lease_expires and finish changes no indexed column of
# attempts, so both can be HOT updates (no index writes) given free room on the page:
# hence the fill factors, and no index on attempts.status (a status filter walks the
# slot index newest first). The partial index holds only open runs: the live-run
# check and the sweep read it, and finished runs leave it.
_TABLES = """
CREATE TABLE IF NOT EXISTS {runs} (
    job           text COLLATE "C" NOT NULL,
    slot          bigint  NOT NULL,
    origin        text    NOT NULL,
    state         text    NOT NULL,
    attempt       integer NOT NULL,
    token         text,
    lease_expires bigint  NOT NULL DEFAULT 0,
    retry_at      bigint  NOT NULL DEFAULT 0,
    fingerprint   text    NOT NULL DEFAULT '',
    PRIMARY KEY (job, slot)
) WITH (fillfactor = 90);
CREATE INDEX IF NOT EXISTS {runs_open} ON {runs} (job, slot)
    WHERE state IN ('running', 'waiting');
CREATE TABLE IF NOT EXISTS {attempts} (
    job         text COLLATE "C" NOT NULL,
    slot        bigint  NOT NULL,
    attempt     integer NOT NULL,
    origin      text    NOT NULL,
    status      text    NOT NULL,
    instance_id text,
    claimed_at  bigint,
    started_at  bigint,
    finished_at bigint,
    error       text,
    meta        jsonb   NOT NULL DEFAULT '{{}}',
    PRIMARY KEY (job, slot, attempt)
) WITH (fillfactor = 85);
CREATE INDEX IF NOT EXISTS {attempts_slot} ON {attempts} (slot DESC, job, attempt DESC);
CREATE TABLE IF NOT EXISTS {jobs} (
    job    text COLLATE "C" PRIMARY KEY,
    paused boolean NOT NULL DEFAULT false
)
"""

# Claims and takeovers that check "another live run of this job" decide one after
# the other: each holds a transaction-scoped advisory lock on the job (in a two-key
# space of its own) until commit. A lock, not a row: nothing is written for it.
_LOCK_JOB = """
            PERFORM pg_advisory_xact_lock({lock_class}, hashtext({lock_key} || p_job));
            o_store_now := {now};"""

_LIVE_ELSEWHERE = """EXISTS (
                SELECT 1 FROM {runs} o
                WHERE o.job = p_job AND o.state = 'running' AND o.lease_expires > o_store_now
                  AND o.slot <> p_slot)"""

_ATTEMPT_COLUMNS = """(job, slot, attempt, origin, status, instance_id, claimed_at, started_at,
             finished_at)"""

# Replaces a record left behind by a store edited by hand; never expected otherwise.
_ATTEMPT_CONFLICT = """
        ON CONFLICT (job, slot, attempt) DO UPDATE SET
            origin = EXCLUDED.origin, status = EXCLUDED.status,
            instance_id = EXCLUDED.instance_id, claimed_at = EXCLUDED.claimed_at,
            started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
            error = NULL, meta = '{{}}'"""

_CLAIM = (
    """
CREATE OR REPLACE FUNCTION {claim}(
    p_job text, p_slot bigint, p_origin text, p_token text, p_instance text,
    p_lease_ms bigint, p_horizon_ms bigint, p_skip_overlap boolean, p_fingerprint text,
    OUT o_outcome text, OUT o_attempt integer, OUT o_store_now bigint
) LANGUAGE plpgsql AS $anarchon$
DECLARE
    v_mine boolean;
    v_status text;
BEGIN
    o_attempt := 0;
    o_store_now := {now};
    -- The lose path: the run is recorded. One primary-key probe; no lock, no write.
    SELECT r.token = p_token AND r.attempt = 1 INTO v_mine
    FROM {runs} r WHERE r.job = p_job AND r.slot = p_slot;
    IF NOT FOUND THEN
        IF p_slot < o_store_now - p_horizon_ms THEN o_outcome := 'expired'; RETURN; END IF;
        IF p_slot > o_store_now + {early} THEN o_outcome := 'early'; RETURN; END IF;
        IF p_skip_overlap THEN"""
    + _LOCK_JOB
    + """
        END IF;
        -- One statement decides and records, reading with a snapshot taken after the
        -- lock: the paused flag, another live run, then the run and its first record.
        -- Claims of this run that took no lock are decided by the primary key.
        WITH run AS (
            INSERT INTO {runs} AS r
                (job, slot, origin, state, attempt, token, lease_expires, retry_at,
                 fingerprint)
            SELECT p_job, p_slot, p_origin, d.state, d.attempt,
                   CASE d.attempt WHEN 1 THEN p_token END,
                   CASE d.attempt WHEN 1 THEN o_store_now + p_lease_ms ELSE 0 END,
                   0, p_fingerprint
            FROM (
                SELECT s.state, CASE s.state WHEN 'running' THEN 1 ELSE 0 END AS attempt
                FROM (SELECT CASE
                    WHEN EXISTS (SELECT 1 FROM {jobs} j WHERE j.job = p_job AND j.paused)
                        THEN 'paused'
                    WHEN p_skip_overlap AND """
    + _LIVE_ELSEWHERE
    + """
                        THEN 'skipped'
                    ELSE 'running' END AS state) s
            ) d
            ON CONFLICT (job, slot) DO NOTHING
            RETURNING r.state, r.attempt
        )
        INSERT INTO {attempts} AS a """
    + _ATTEMPT_COLUMNS
    + """
        SELECT p_job, p_slot, run.attempt, p_origin, run.state, p_instance, o_store_now,
               CASE run.attempt WHEN 1 THEN o_store_now END,
               CASE run.attempt WHEN 0 THEN o_store_now END
        FROM run"""
    + _ATTEMPT_CONFLICT
    + """
        RETURNING a.status, a.attempt INTO v_status, o_attempt;
        IF FOUND THEN
            o_outcome := CASE v_status WHEN 'running' THEN 'won' ELSE v_status END;
            RETURN;
        END IF;
        -- Another claim of this run committed first.
        SELECT r.token = p_token AND r.attempt = 1 INTO v_mine
        FROM {runs} r WHERE r.job = p_job AND r.slot = p_slot;
    END IF;
    IF v_mine THEN  -- a repeat by the token that won (after an ambiguous failure)
        o_outcome := 'won'; o_attempt := 1;
    ELSE
        o_outcome := 'taken'; o_attempt := 0;  -- INTO above cleared it
    END IF;
END
$anarchon$
"""
)

_TAKE_OVER = (
    """
CREATE OR REPLACE FUNCTION {take_over}(
    p_job text, p_slot bigint, p_attempt integer, p_token text, p_instance text,
    p_lease_ms bigint, p_horizon_ms bigint, p_max_attempts integer, p_skip_overlap boolean,
    OUT o_outcome text, OUT o_attempt integer, OUT o_store_now bigint
) LANGUAGE plpgsql AS $anarchon$
DECLARE
    v_origin text;
    v_state text;
BEGIN
    o_attempt := 0;
    o_store_now := {now};
    -- Compare-and-set on the attempt: only a run still at p_attempt whose lease
    -- expired (or whose retry is due) is locked. Concurrent backups queue on the row
    -- and, once the winner commits, re-check it and find the attempt moved on.
    SELECT r.origin, r.state INTO v_origin, v_state FROM {runs} r
    WHERE r.job = p_job AND r.slot = p_slot AND r.attempt = p_attempt
      AND ((r.state = 'running' AND r.lease_expires <= o_store_now)
        OR (r.state = '{waiting}' AND r.retry_at <= o_store_now))
    FOR UPDATE;
    IF NOT FOUND THEN
        -- A repeat of a call this token won (after an ambiguous failure) wins again.
        IF EXISTS (SELECT 1 FROM {runs} r WHERE r.job = p_job AND r.slot = p_slot
                   AND r.token = p_token AND r.attempt = p_attempt + 1) THEN
            o_outcome := 'won'; o_attempt := p_attempt + 1;
        ELSE
            o_outcome := 'taken';
        END IF;
        RETURN;
    END IF;
    IF p_attempt >= p_max_attempts OR p_slot < o_store_now - p_horizon_ms THEN
        -- A dead runner's run ends interrupted; a due retry that may not run stays failed.
        UPDATE {attempts} a SET status = 'interrupted', finished_at = o_store_now,
            error = 'lease expired'
        WHERE a.job = p_job AND a.slot = p_slot AND a.attempt = p_attempt
          AND a.status = 'running' AND v_state = 'running';
        UPDATE {runs} r
        SET state = CASE v_state WHEN 'running' THEN 'interrupted' ELSE 'failed' END,
            token = NULL
        WHERE r.job = p_job AND r.slot = p_slot;
        o_outcome := CASE WHEN p_attempt >= p_max_attempts THEN 'exhausted' ELSE 'expired' END;
        RETURN;
    END IF;
    IF p_skip_overlap THEN"""
    + _LOCK_JOB
    + """
        IF """
    + _LIVE_ELSEWHERE
    + """ THEN
            o_outcome := 'blocked';
            RETURN;
        END IF;
    END IF;
    UPDATE {attempts} a SET status = 'interrupted', finished_at = o_store_now,
        error = 'lease expired'
    WHERE a.job = p_job AND a.slot = p_slot AND a.attempt = p_attempt
      AND a.status = 'running';
    o_attempt := p_attempt + 1;
    UPDATE {runs} r SET state = 'running', attempt = o_attempt, token = p_token,
        lease_expires = o_store_now + p_lease_ms
    WHERE r.job = p_job AND r.slot = p_slot;
    INSERT INTO {attempts} AS a """
    + _ATTEMPT_COLUMNS
    + """
    VALUES (p_job, p_slot, o_attempt, v_origin, 'running', p_instance,
            o_store_now, o_store_now, NULL)"""
    + _ATTEMPT_CONFLICT
    + """;
    o_outcome := 'won';
END
$anarchon$
"""
)

_HEARTBEAT = """
UPDATE {runs} r SET lease_expires = {now} + %s
FROM unnest(%s::text[], %s::bigint[], %s::integer[], %s::text[]) AS l(job, slot, attempt, token)
WHERE r.job = l.job AND r.slot = l.slot AND r.attempt = l.attempt AND r.token = l.token
  AND r.state = 'running'
RETURNING r.job, r.slot, r.attempt, r.token
"""

# One statement: the run and its attempt change together, or neither does. The last
# two columns answer a repeat: the run is still held by this token and the attempt's
# status (both as they were before this statement).
_FINISH = """
WITH t AS (SELECT {now} AS now),
run AS (
    UPDATE {runs} r
    SET state = %(state)s, lease_expires = 0,
        retry_at = coalesce((SELECT t.now FROM t) + %(retry_in)s::bigint, r.retry_at)
    WHERE r.job = %(job)s AND r.slot = %(slot)s AND r.attempt = %(attempt)s
      AND r.token = %(token)s AND r.state = 'running'
    RETURNING 1
),
rec AS (
    UPDATE {attempts} a
    SET status = %(status)s, finished_at = (SELECT t.now FROM t), error = %(error)s,
        meta = %(meta)s::jsonb
    WHERE a.job = %(job)s AND a.slot = %(slot)s AND a.attempt = %(attempt)s
      AND EXISTS (SELECT 1 FROM run)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM run),
       EXISTS (SELECT 1 FROM {runs} r WHERE r.job = %(job)s AND r.slot = %(slot)s
               AND r.attempt = %(attempt)s AND r.token = %(token)s),
       (SELECT a.status FROM {attempts} a WHERE a.job = %(job)s AND a.slot = %(slot)s
        AND a.attempt = %(attempt)s)
"""

# Forgetting the token fences the runner; the lease expires now, so a backup's next
# sweep takes attempt + 1 at once.
_RELEASE = """
WITH run AS (
    UPDATE {runs} r SET lease_expires = {now}, token = NULL
    WHERE r.job = %(job)s AND r.slot = %(slot)s AND r.attempt = %(attempt)s
      AND r.token = %(token)s AND r.state = 'running'
    RETURNING r.lease_expires AS now
),
rec AS (
    UPDATE {attempts} a SET status = 'interrupted', finished_at = run.now,
        error = 'handed over'
    FROM run
    WHERE a.job = %(job)s AND a.slot = %(slot)s AND a.attempt = %(attempt)s
    RETURNING 1
)
SELECT count(*) FROM run
"""

_DUE_RUNS = """
SELECT r.job, r.slot, r.attempt, r.origin, r.state
FROM {runs} r, (SELECT {now} AS now) t
WHERE r.job = ANY(%s::text[]) AND r.state IN ('running', '{waiting}')
  AND ((r.state = 'running' AND r.lease_expires <= t.now)
    OR (r.state = '{waiting}' AND r.retry_at <= t.now))
ORDER BY r.slot, r.job
"""

_LAST_SCHEDULED_SLOT = """
SELECT r.slot FROM {runs} r WHERE r.job = %s AND r.origin <> 'manual'
ORDER BY r.slot DESC LIMIT 1
"""

_HISTORY = """
SELECT job, slot, attempt, origin, status, instance_id,
       claimed_at, started_at, finished_at, error, meta
FROM {attempts}"""

# Per job, the slot of its latest record and of its latest scheduled run (catch-up's
# anchor): a skip scan over the primary keys, so its cost grows with jobs, not rows.
_PRUNE_KEEP = """
WITH RECURSIVE
aj AS (
    (SELECT a.job FROM {attempts} a ORDER BY a.job LIMIT 1)
    UNION ALL
    SELECT (SELECT a.job FROM {attempts} a WHERE a.job > aj.job ORDER BY a.job LIMIT 1)
    FROM aj WHERE aj.job IS NOT NULL
),
rj AS (
    (SELECT r.job FROM {runs} r ORDER BY r.job LIMIT 1)
    UNION ALL
    SELECT (SELECT r.job FROM {runs} r WHERE r.job > rj.job ORDER BY r.job LIMIT 1)
    FROM rj WHERE rj.job IS NOT NULL
),
j AS (
    SELECT aj.job FROM aj WHERE aj.job IS NOT NULL
    UNION SELECT rj.job FROM rj WHERE rj.job IS NOT NULL
)
SELECT j.job,
       (SELECT max(a.slot) FROM {attempts} a WHERE a.job = j.job),
       (SELECT max(r.slot) FROM {runs} r WHERE r.job = j.job AND r.origin <> 'manual')
FROM j
"""

# One bounded batch, its own short transaction: the newest ``batch`` prunable history
# records below ``below``, and the runs they belong to when those are terminal too.
# Claims never touch such rows. The caller moves ``below`` down to the batch's lowest
# slot, so no batch walks again over the index entries the previous ones deleted.
_PRUNE_BATCH = """
WITH doomed AS (
    SELECT t.ctid FROM {attempts} t
    WHERE t.slot < %(below)s AND t.status = ANY(%(terminal)s::text[])
      AND NOT EXISTS (
          SELECT 1 FROM unnest(%(keep_jobs)s::text[], %(keep_slots)s::bigint[]) AS k(job, slot)
          WHERE k.job = t.job AND k.slot = t.slot)
    ORDER BY t.slot DESC
    LIMIT %(batch)s
),
gone AS (
    DELETE FROM {attempts} a WHERE a.ctid = ANY(ARRAY(SELECT d.ctid FROM doomed d))
    RETURNING a.job, a.slot
),
runs_gone AS (
    DELETE FROM {runs} r USING (SELECT DISTINCT g.job, g.slot FROM gone g) AS g
    WHERE r.job = g.job AND r.slot = g.slot AND r.state = ANY(%(terminal)s::text[])
)
SELECT count(*), min(gone.slot) FROM gone
"""


def identifier(what: str, value: object, max_length: int) -> str:
    """A schema or prefix must be a conservative SQL identifier (and is quoted anyway)."""
    if not isinstance(value, str) or len(value) > max_length or not _IDENTIFIER.fullmatch(value):
        raise ConfigurationError(
            f"{what} {value!r} is not valid: use 1-{max_length} characters, letters, "
            f"digits and _, not starting with a digit"
        )
    if what == "schema" and value.lower().startswith("pg_"):
        raise ConfigurationError(
            f"schema {value!r} is not valid: names starting with 'pg_' are reserved by "
            f"PostgreSQL; use letters, digits and _"
        )
    return value


# What exists of one store: its schema, its meta table, its current functions.
_LAYOUT_STATE = """
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s),
       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = %(schema)s AND c.relname = %(meta)s),
       (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(schema)s AND p.proname = ANY(%(functions)s))
"""


class Statements:
    """Every statement of one store, rendered for its ``schema`` and table ``prefix``."""

    def __init__(self, schema: str, prefix: str) -> None:
        self.schema = schema
        self.prefix = prefix

        def table(name: str) -> sql.Identifier:
            return sql.Identifier(schema, prefix + name)

        names: dict[str, sql.Composable] = {
            "meta": table("meta"),
            "runs": table("runs"),
            "attempts": table("attempts"),
            "jobs": table("jobs"),
            # CREATE INDEX names its index inside the table's schema: unqualified.
            "runs_open": sql.Identifier(prefix + "runs_open"),
            "attempts_slot": sql.Identifier(prefix + "attempts_slot"),
            "now": sql.SQL(NOW),
            "early": sql.Literal(EARLY_TOLERANCE_MS),
            "waiting": sql.SQL(WAITING),
            "lock_class": sql.Literal(LOCK_CLASS),
            "lock_key": sql.Literal(f"{schema}.{prefix}:"),
        }

        def render(template: str, **extra: sql.Composable) -> str:
            return sql.SQL(template).format(**names, **extra).as_string(None)

        # Functions are named after a digest of their own text: a rolling deploy of
        # a changed body creates new functions beside the old ones, which the
        # instances still running the previous version keep using undisturbed.
        bodies = {"claim": _CLAIM, "take_over": _TAKE_OVER}
        digest = hashlib.sha256(
            "".join(
                render(body, claim=sql.SQL("c"), take_over=sql.SQL("t")) for body in bodies.values()
            ).encode()
        ).hexdigest()[:10]
        self.function_names = [f"{prefix}{name}_{digest}" for name in bodies]
        functions = {
            name: sql.Identifier(schema, fname)
            for name, fname in zip(bodies, self.function_names, strict=True)
        }
        # Opens serialise per schema: concurrent CREATE SCHEMA / CREATE OR REPLACE
        # FUNCTION would otherwise fail with unique violations or "tuple concurrently
        # updated". The lock ends with the layout's transaction.
        self.lock_layout = render(
            "SELECT pg_advisory_xact_lock({lock_class}, hashtext({key}))",
            key=sql.Literal(f"layout:{schema}"),
        )
        self.layout_state = _LAYOUT_STATE
        self.create_schema = render("CREATE SCHEMA {schema}", schema=sql.Identifier(schema))
        self.create_meta = render(
            "CREATE TABLE IF NOT EXISTS {meta} (key text PRIMARY KEY, value text NOT NULL)"
        )
        self.get_version = render("SELECT value FROM {meta} WHERE key = 'schema_version'")
        self.set_version = render(
            "INSERT INTO {meta} (key, value) VALUES ('schema_version', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        )
        self.create_tables = render(_TABLES)
        self.create_functions = [render(body, **functions) for body in bodies.values()]

        def call(name: str, types: str) -> str:
            # Explicit casts: the plan does not depend on how psycopg dumps an int.
            args = ", ".join(f"%s::{t}" for t in types.split())
            query = sql.SQL("SELECT o_outcome, o_attempt, o_store_now FROM {}(" + args + ")")
            return query.format(functions[name]).as_string(None)

        self.claim = call("claim", "text bigint text text text bigint bigint boolean text")
        self.take_over = call(
            "take_over", "text bigint integer text text bigint bigint integer boolean"
        )
        self.now_ms = f"SELECT {NOW}"
        self.set_paused = render(
            "INSERT INTO {jobs} AS j (job, paused) VALUES (%s, %s) "
            "ON CONFLICT (job) DO UPDATE SET paused = EXCLUDED.paused"
        )
        self.heartbeat = render(_HEARTBEAT)
        self.finish = render(_FINISH)
        self.release = render(_RELEASE)
        self.due_runs = render(_DUE_RUNS)
        self.last_scheduled_slot = render(_LAST_SCHEDULED_SLOT)
        self.history = render(_HISTORY)
        self.history_order = " ORDER BY slot DESC, job ASC, attempt DESC LIMIT %s"
        self.prune_keep = render(_PRUNE_KEEP)
        self.prune = render(_PRUNE_BATCH)
