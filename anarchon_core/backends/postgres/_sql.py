"""The SQL of :mod:`anarchon_core.backends.postgres`: its layout, functions and statements.

The claim, the takeover and the lease statements live here; manual runs, cancel,
pause, the registry and retention in :mod:`._ops`. Every identifier
(schema, tables, indexes, functions) is composed with :class:`psycopg.sql.Identifier`,
even though the backend has already validated the schema and prefix; every value is a
``%s`` parameter. The only literals spliced in are constants of this module.
:class:`Statements` renders everything once per ``(schema, prefix)``, so the hot path
executes a constant string that psycopg prepares on the server after
``prepare_threshold`` uses.

Times are ``bigint`` epoch milliseconds read from ``clock_timestamp()`` inside each
statement: ``now()`` is frozen at the start of a transaction, so a statement that
waited for a lock would judge leases by a stale clock.

The claim, the batch of claims, the takeover, the trigger and the write of a job
definition are PL/pgSQL functions (one round trip: ``SELECT … FROM f(…)``) rather than
one CTE statement because they must see rows committed while they waited: the claim's
and the takeover's overlap check, runs committed while they waited for the job's lock;
the trigger, the request or run that made its insert do nothing; the definition's
write, the job's definition as the writer it queued behind committed it. Under READ
COMMITTED each statement of a function takes a fresh snapshot; the parts of one CTE
statement share the snapshot taken before the wait, so they would miss a row committed
meanwhile.
"""

from __future__ import annotations

import hashlib
import re

from psycopg import sql

from ...backend import EARLY_TOLERANCE_MS, NOT_STARTED, PENDING
from ...errors import ConfigurationError
from ...records import TERMINAL_STATUSES
from . import _ops as ops

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
# history index newest first). That index is history's order, (slot, job, attempt)
# descending, so a page is one index range from its cursor, with no sort. It replaced
# attempts_slot (slot DESC, job, attempt DESC) of a former order: a store holding that
# one (or lacking this one) is incomplete, and completing it drops the former.
# The partial index holds only open runs: the live-run check and the sweep read it, and
# finished runs leave it. The unique partial index on pending manual requests admits
# one per job and lets the sweep find them.
# ``requested_by`` (who asked for a manual run) is added to stores created before it,
# as are a job's stored definition and its version (see ``ops.WRITE_DEFINITION``): all
# nullable, without a default, so adding them rewrites nothing (catalog only).
# The registry's rows are rewritten at every refresh, hence its low fill factor.
_TABLES = """
CREATE TABLE IF NOT EXISTS {runs} (
    {surrogate}job           text COLLATE "C" NOT NULL,
    slot          bigint  NOT NULL,
    origin        text    NOT NULL,
    state         text    NOT NULL,
    attempt       integer NOT NULL,
    token         text,
    lease_expires bigint  NOT NULL DEFAULT 0,
    retry_at      bigint  NOT NULL DEFAULT 0,
    fingerprint   text    NOT NULL DEFAULT '',
    requested_by  text,
    {runs_key} (job, slot)
) WITH (fillfactor = {runs_fill});
ALTER TABLE {runs} ADD COLUMN IF NOT EXISTS requested_by text;
CREATE INDEX IF NOT EXISTS {runs_open} ON {runs} (job, slot)
    WHERE state IN ('running', 'waiting');
CREATE UNIQUE INDEX IF NOT EXISTS {runs_pending} ON {runs} (job) WHERE state = '{pending}';
CREATE TABLE IF NOT EXISTS {attempts} (
    {surrogate}job         text COLLATE "C" NOT NULL,
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
    {attempts_key} (job, slot, attempt)
) WITH (fillfactor = {attempts_fill});
CREATE INDEX IF NOT EXISTS {attempts_history} ON {attempts} (slot DESC, job DESC, attempt DESC);
DROP INDEX IF EXISTS {attempts_slot};
CREATE TABLE IF NOT EXISTS {jobs} (
    {surrogate}job    text COLLATE "C" NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    {jobs_key} (job)
);
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS version bigint;
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS definition text;
CREATE TABLE IF NOT EXISTS {instances} (
    {surrogate}instance_id text COLLATE "C" NOT NULL,
    info        jsonb  NOT NULL,
    last_seen   bigint NOT NULL,
    expires_at  bigint NOT NULL,
    {instances_key} (instance_id)
) WITH (fillfactor = {instances_fill})
"""
_META = """
CREATE TABLE IF NOT EXISTS {meta} (
    {surrogate}key   text NOT NULL,
    value text NOT NULL,
    {meta_key} (key)
)"""

#: A host's layout (``Statements(surrogate_key=True)``) begins every table with this
#: column: the Django admin cannot show a row of a composite key. As Django declares
#: it, so that tables its former migrations made are the same. No statement reads it.
SURROGATE_KEY = "id bigint NOT NULL GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
#: The tables whose fill factor the layout sets (a host's former tables get it too).
FILL_FACTORS = {"runs": 90, "attempts": 85, "instances": 50}

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

# The error of a skipped record, as ``backend.overlap_reason`` words it, of ``v_overlap``.
_OVERLAP_REASON = """'overlapped the run of ' || to_char(
                   (to_timestamp(v_overlap / 1000) + (v_overlap % 1000) * interval '1 ms')
                   AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') || ', still running'"""

_ATTEMPT_COLUMNS = """(job, slot, attempt, origin, status, instance_id, claimed_at, started_at,
             finished_at)"""
_ATTEMPT_COLUMNS_ERROR = _ATTEMPT_COLUMNS.replace("finished_at)", "finished_at, error)")

# Replaces a record left behind by a store edited by hand; never expected otherwise.
_ATTEMPT_CONFLICT = """
        ON CONFLICT (job, slot, attempt) DO UPDATE SET
            origin = EXCLUDED.origin, status = EXCLUDED.status,
            instance_id = EXCLUDED.instance_id, claimed_at = EXCLUDED.claimed_at,
            started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
            error = EXCLUDED.error, meta = EXCLUDED.meta"""

_CLAIM = (
    """
CREATE OR REPLACE FUNCTION {claim}(
    p_job text, p_slot bigint, p_origin text, p_token text, p_instance text,
    p_lease_ms bigint, p_horizon_ms bigint, p_skip_overlap boolean, p_fingerprint text,
    p_version bigint,
    OUT o_outcome text, OUT o_attempt integer, OUT o_store_now bigint
) LANGUAGE plpgsql AS $anarchon$
DECLARE
    v_mine boolean;
    v_live boolean;
    v_status text;
    v_overlap bigint;
BEGIN
    o_attempt := 0;
    o_store_now := {now};
    -- The lose path: the run is recorded. One primary-key probe; no lock, no write.
    SELECT r.token = p_token AND r.attempt = 1,
           r.state = 'running' AND r.lease_expires > o_store_now
    INTO v_mine, v_live
    FROM {runs} r WHERE r.job = p_job AND r.slot = p_slot;
    IF NOT FOUND THEN
        IF p_slot < o_store_now - p_horizon_ms THEN o_outcome := 'expired'; RETURN; END IF;
        IF p_slot > o_store_now + {early} THEN o_outcome := 'early'; RETURN; END IF;
        IF p_skip_overlap THEN"""
    + _LOCK_JOB
    + """
            -- The earliest live run of the job it overlaps (read after the lock).
            SELECT min(o.slot) INTO v_overlap FROM {runs} o
            WHERE o.job = p_job AND o.state = 'running' AND o.lease_expires > o_store_now
              AND o.slot <> p_slot;
        END IF;
        -- One statement decides and records, reading with a snapshot taken after the
        -- lock: the definition's version (a claim without one reads nothing for it),
        -- the paused flag, another live run, then the run and its first record. A stale
        -- claim writes nothing: its insert selects no row. Claims of this run that took
        -- no lock are decided by the primary key.
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
                    WHEN p_version IS NOT NULL AND NOT EXISTS (
                        SELECT 1 FROM {jobs} j WHERE j.job = p_job AND j.version = p_version
                          AND j.definition IS NOT NULL)
                        THEN 'stale'
                    WHEN EXISTS (SELECT 1 FROM {jobs} j WHERE j.job = p_job AND j.paused)
                        THEN 'paused'
                    WHEN v_overlap IS NOT NULL THEN 'skipped'
                    ELSE 'running' END AS state) s
            ) d
            WHERE d.state <> 'stale'
            ON CONFLICT (job, slot) DO NOTHING
            RETURNING r.state, r.attempt
        )
        INSERT INTO {attempts} AS a """
    + _ATTEMPT_COLUMNS_ERROR
    + """
        SELECT p_job, p_slot, run.attempt, p_origin, run.state, p_instance, o_store_now,
               CASE run.attempt WHEN 1 THEN o_store_now END,
               CASE run.attempt WHEN 0 THEN o_store_now END,
               CASE run.state WHEN 'skipped' THEN """
    + _OVERLAP_REASON
    + """ END
        FROM run"""
    + _ATTEMPT_CONFLICT
    + """
        RETURNING a.status, a.attempt INTO v_status, o_attempt;
        IF FOUND THEN
            o_outcome := CASE v_status WHEN 'running' THEN 'won' ELSE v_status END;
            RETURN;
        END IF;
        -- Another claim of this run committed first (the insert waited for it), or
        -- the claim was stale: then no run is there either (a run that is, committed
        -- by another claim meanwhile, makes the answer 'taken', which comes first).
        o_store_now := {now};
        SELECT r.token = p_token AND r.attempt = 1,
               r.state = 'running' AND r.lease_expires > o_store_now
        INTO v_mine, v_live
        FROM {runs} r WHERE r.job = p_job AND r.slot = p_slot;
        IF NOT FOUND AND p_version IS NOT NULL THEN
            o_outcome := 'stale'; o_attempt := 0;
            RETURN;
        END IF;
    END IF;
    o_attempt := 0;  -- INTO above cleared it
    IF v_mine IS NOT TRUE THEN
        o_outcome := 'taken';
    ELSIF v_live THEN  -- a repeat by the token that won (after an ambiguous failure)
        o_outcome := 'won'; o_attempt := 1;
    ELSE  -- ... whose lease has expired since: it must not start, and nothing is written
        o_outcome := 'lapsed';
    END IF;
END
$anarchon$
"""
)

# A batch of claims: each request decided by the claim function exactly as alone, all in
# one transaction (one commit). Its locks (the runs it inserts, the advisory locks of
# the jobs it checks for overlap) are held until that commit, so batches that overlap
# take them in one order, by job lock key then job, or two could wait for each other.
# A job's requests keep their order (a run won earlier makes a later slot skipped).
# Jobs whose lock keys are equal and have several requests here (two slots of one job,
# or a hash collision) take their key's lock first, before any of their runs: within one
# key, a batch then either holds the key's lock throughout or takes just one run.
_CLAIM_MANY = """
CREATE OR REPLACE FUNCTION {claim_many}(
    p_jobs text[], p_slots bigint[], p_origins text[], p_tokens text[], p_instances text[],
    p_lease_ms bigint[], p_horizon_ms bigint[], p_skip_overlap boolean[], p_fingerprints text[],
    p_versions bigint[],
    OUT o_ord bigint, OUT o_outcome text, OUT o_attempt integer, OUT o_store_now bigint
) RETURNS SETOF record LANGUAGE plpgsql AS $anarchon$
DECLARE
    v record;
    v_locked integer;
BEGIN
    FOR v IN
        SELECT q.*, count(*) OVER (PARTITION BY q.lock_key) AS sharing
        FROM (
            SELECT u.*, hashtext({lock_key} || u.job) AS lock_key
            FROM unnest(p_jobs, p_slots, p_origins, p_tokens, p_instances, p_lease_ms,
                        p_horizon_ms, p_skip_overlap, p_fingerprints, p_versions)
                WITH ORDINALITY AS u(job, slot, origin, token, instance, lease_ms, horizon_ms,
                                     skip_overlap, fingerprint, version, ord)
        ) q
        ORDER BY q.lock_key, q.job, q.ord
    LOOP
        IF v.sharing > 1 AND v.lock_key IS DISTINCT FROM v_locked THEN
            PERFORM pg_advisory_xact_lock({lock_class}, v.lock_key);
            v_locked := v.lock_key;
        END IF;
        SELECT c.o_outcome, c.o_attempt, c.o_store_now INTO o_outcome, o_attempt, o_store_now
        FROM {claim}(v.job, v.slot, v.origin, v.token, v.instance, v.lease_ms, v.horizon_ms,
                     v.skip_overlap, v.fingerprint, v.version) c;
        o_ord := v.ord;
        RETURN NEXT;
    END LOOP;
END
$anarchon$
"""

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
    v_requested_by text;
    v_live boolean;
BEGIN
    o_attempt := 0;
    o_store_now := {now};
    -- Compare-and-set on the attempt: only a run still at p_attempt whose lease
    -- expired, whose retry is due, or that is a pending manual request (attempt 0) is
    -- locked. Concurrent backups queue on the row and, once the winner commits,
    -- re-check it and find the attempt moved on.
    SELECT r.origin, r.state, r.requested_by INTO v_origin, v_state, v_requested_by
    FROM {runs} r
    WHERE r.job = p_job AND r.slot = p_slot AND r.attempt = p_attempt
      AND ((r.state = 'running' AND r.lease_expires <= o_store_now)
        OR (r.state = '{waiting}' AND r.retry_at <= o_store_now)
        OR r.state = '{pending}')
    FOR UPDATE;
    IF NOT FOUND THEN
        -- A repeat of a call this token won (after an ambiguous failure) wins again
        -- while the attempt it started holds a live lease; once that lease has expired
        -- it is 'lapsed' (nothing written). The lock above may have waited: now again.
        o_store_now := {now};
        SELECT r.state = 'running' AND r.lease_expires > o_store_now INTO v_live
        FROM {runs} r WHERE r.job = p_job AND r.slot = p_slot
          AND r.token = p_token AND r.attempt = p_attempt + 1;
        IF NOT FOUND THEN
            o_outcome := 'taken';
        ELSIF v_live THEN
            o_outcome := 'won'; o_attempt := p_attempt + 1;
        ELSE
            o_outcome := 'lapsed';
        END IF;
        RETURN;
    END IF;
    IF p_attempt >= p_max_attempts OR p_slot < o_store_now - p_horizon_ms THEN
        -- A dead runner's run ends interrupted; a due retry that may not run stays
        -- failed; a manual request nobody started in time ran nothing: attempt 0 says so.
        UPDATE {attempts} a SET status = 'interrupted', finished_at = o_store_now,
            error = 'lease expired'
        WHERE a.job = p_job AND a.slot = p_slot AND a.attempt = p_attempt
          AND a.status = 'running' AND v_state = 'running';
        IF v_state = '{pending}' THEN
            INSERT INTO {attempts} AS a """
    + _ATTEMPT_COLUMNS_ERROR
    + """
            VALUES (p_job, p_slot, 0, v_origin, 'interrupted', v_requested_by,
                    o_store_now, NULL, o_store_now, {not_started})"""
    + _ATTEMPT_CONFLICT
    + """;
        END IF;
        UPDATE {runs} r
        SET state = CASE v_state WHEN '{waiting}' THEN 'failed' ELSE 'interrupted' END,
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

# Several finishes in one statement, each fenced by its own token as alone. The runs are
# locked first in key order (as heartbeats lock them: the contract sends those sorted),
# so that a finish and a heartbeat of the same leases cannot wait for each other. Of
# requests for one run, the first in order whose token holds it finishes it; a later
# one is a repeat, answered from the status the first recorded. The answer columns are
# those of the single finish (``finish_verdict``), after the request's position.
_FINISH_MANY = """
WITH t AS (SELECT {now} AS now),
q AS (
    SELECT * FROM unnest(%(job)s::text[], %(slot)s::bigint[], %(attempt)s::integer[],
                         %(token)s::text[], %(state)s::text[], %(retry_in)s::bigint[],
                         %(status)s::text[], %(error)s::text[], %(meta)s::text[])
        WITH ORDINALITY AS q(job, slot, attempt, token, state, retry_in, status, error, meta,
                             ord)
),
held AS (
    SELECT r.job, r.slot, r.attempt, r.token FROM {runs} r
    WHERE r.state = 'running' AND EXISTS (
        SELECT 1 FROM q WHERE q.job = r.job AND q.slot = r.slot AND q.attempt = r.attempt
          AND q.token = r.token)
    ORDER BY r.job, r.slot
    FOR UPDATE OF r
),
first AS (
    SELECT DISTINCT ON (q.job, q.slot) q.*
    FROM q JOIN held h ON h.job = q.job AND h.slot = q.slot AND h.attempt = q.attempt
                      AND h.token = q.token
    ORDER BY q.job, q.slot, q.ord
),
run AS (
    UPDATE {runs} r
    SET state = f.state, lease_expires = 0, retry_at = coalesce(t.now + f.retry_in, r.retry_at)
    FROM first f, t
    WHERE r.job = f.job AND r.slot = f.slot AND r.attempt = f.attempt AND r.token = f.token
      AND r.state = 'running'
    RETURNING f.ord, f.job, f.slot, f.attempt, f.token, f.status, f.error, f.meta
),
rec AS (
    UPDATE {attempts} a
    SET status = d.status, finished_at = t.now, error = d.error, meta = d.meta::jsonb
    FROM run d, t
    WHERE a.job = d.job AND a.slot = d.slot AND a.attempt = d.attempt
    RETURNING 1
)
SELECT q.ord,
       coalesce(d.ord = q.ord, false),
       EXISTS (SELECT 1 FROM {runs} r WHERE r.job = q.job AND r.slot = q.slot
               AND r.attempt = q.attempt AND r.token = q.token),
       coalesce(d.status, (SELECT a.status FROM {attempts} a WHERE a.job = q.job
                           AND a.slot = q.slot AND a.attempt = q.attempt))
FROM q LEFT JOIN run d ON d.job = q.job AND d.slot = q.slot AND d.attempt = q.attempt
                      AND d.token = q.token
ORDER BY q.ord
"""

# Replacing the runner's token fences it; the lease expires now, so a backup's next
# sweep takes attempt + 1 at once. The new token is this call's own (see ``revoked``),
# held by nobody: a re-send of this very statement, after its connection died once it
# had committed, finds it and answers True; any other call (the same lease released
# again included) answers False. The last EXISTS reads the snapshot from before the
# UPDATE, so on the first send it sees the runner's token and adds nothing.
_RELEASE = """
WITH run AS (
    UPDATE {runs} r SET lease_expires = {now}, token = %(revoked)s
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
SELECT EXISTS (SELECT 1 FROM run)
    OR EXISTS (SELECT 1 FROM {runs} r WHERE r.job = %(job)s AND r.slot = %(slot)s
               AND r.attempt = %(attempt)s AND r.token = %(revoked)s)
"""

_LAST_SCHEDULED_SLOT = """
SELECT r.slot FROM {runs} r WHERE r.job = %s AND r.origin <> 'manual'
ORDER BY r.slot DESC LIMIT 1
"""

_HISTORY = """
SELECT job, slot, attempt, origin, status, instance_id,
       claimed_at, started_at, finished_at, error, meta
FROM {attempts}"""


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


# What exists of one store: its schema, its meta table, its current functions, its
# tables and indexes, and the columns added to its tables after they were first created
# (named ``table.column``).
_LAYOUT_STATE = """
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s),
       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = %(schema)s AND c.relname = %(meta)s),
       (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(schema)s AND p.proname = ANY(%(functions)s)),
       (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relname = ANY(%(relations)s)),
       (SELECT count(*) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relname || '.' || a.attname = ANY(%(columns)s)
          AND NOT a.attisdropped),
       (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relname = ANY(%(former)s))
"""


class Statements:
    """Every statement of one store, rendered for its ``schema`` and table ``prefix``."""

    def __init__(self, schema: str, prefix: str, *, surrogate_key: bool = False) -> None:
        self.schema = schema
        self.prefix = prefix
        #: The channel every definition write notifies (a digest: an identifier of at
        #: most 63 bytes whatever the schema and prefix).
        self.channel = (
            "anarchon_defs_" + hashlib.sha256(f"{schema}.{prefix}".encode()).hexdigest()[:16]
        )

        def table(name: str) -> sql.Identifier:
            return sql.Identifier(schema, prefix + name)

        names: dict[str, sql.Composable] = {
            "meta": table("meta"),
            "runs": table("runs"),
            "attempts": table("attempts"),
            "jobs": table("jobs"),
            "instances": table("instances"),
            # CREATE INDEX names its index inside the table's schema: unqualified.
            "runs_open": sql.Identifier(prefix + "runs_open"),
            "runs_pending": sql.Identifier(prefix + "runs_pending"),
            "attempts_history": sql.Identifier(prefix + "attempts_history"),
            "attempts_slot": table("attempts_slot"),  # the former history index
            "now": sql.SQL(NOW),
            "early": sql.Literal(EARLY_TOLERANCE_MS),
            "waiting": sql.SQL(WAITING),
            "pending": sql.SQL(PENDING),
            "not_started": sql.Literal(NOT_STARTED),
            "lock_class": sql.Literal(LOCK_CLASS),
            "lock_key": sql.Literal(f"{schema}.{prefix}:"),
            "version_key": sql.Literal(ops.VERSION_KEY),
            "channel": sql.Literal(self.channel),
            **{f"{name}_fill": sql.Literal(fill) for name, fill in FILL_FACTORS.items()},
        }

        def render(template: str, **extra: sql.Composable) -> str:
            return sql.SQL(template).format(**names, **extra).as_string(None)

        # Functions are named after a digest of their own text: a rolling deploy of
        # a changed body creates new functions beside the old ones, which the
        # instances still running the previous version keep using undisturbed.
        bodies = {
            "claim": _CLAIM,
            "claim_many": _CLAIM_MANY,
            "take_over": _TAKE_OVER,
            "trigger": ops.TRIGGER,
            "define": ops.WRITE_DEFINITION,
        }
        placeholders = {name: sql.SQL(name) for name in bodies}
        digest = hashlib.sha256(
            "".join(render(body, **placeholders) for body in bodies.values()).encode()
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
        #: The tables and indexes ``create_tables`` makes, and the columns it adds.
        tables = ("meta", "runs", "attempts", "jobs", "instances")
        indexes = ("runs_open", "runs_pending", "attempts_history")
        self.relations = [prefix + name for name in (*tables, *indexes)]
        #: What ``create_tables`` drops: made by an older anarchon (also during a rolling
        #: upgrade, by an older instance that restarted), so a store holding one is
        #: incomplete.
        self.former_relations = [prefix + "attempts_slot"]
        self.added_columns = [
            f"{prefix}{table}.{column}"
            for table, column in (
                ("runs", "requested_by"),
                ("jobs", "version"),
                ("jobs", "definition"),
            )
        ]
        # The key of each table: its primary key, or with ``surrogate_key`` (a host's
        # layout) the unique constraint ``<table>_key``, ``id`` being the primary key
        # (the core's statements need only that the key is unique: their ON CONFLICT
        # clauses name its columns).
        keys: dict[str, sql.Composable] = {"surrogate": sql.SQL("")}
        for name in tables:
            keys[name + "_key"] = sql.SQL("PRIMARY KEY")
            if surrogate_key:
                keys[name + "_key"] = sql.SQL("CONSTRAINT {} UNIQUE").format(
                    sql.Identifier(f"{prefix}{name}_key")
                )
        if surrogate_key:
            keys["surrogate"] = sql.SQL(SURROGATE_KEY + ",\n    ")
        self.create_schema = render("CREATE SCHEMA {schema}", schema=sql.Identifier(schema))
        self.create_meta = render(_META, **keys)
        self.get_version = render("SELECT value FROM {meta} WHERE key = 'schema_version'")
        self.set_version = render(
            "INSERT INTO {meta} (key, value) VALUES ('schema_version', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        )
        self.create_tables = render(_TABLES, **keys)
        self.create_functions = [render(body, **functions) for body in bodies.values()]

        def call(name: str, types: str) -> str:
            # Explicit casts: the plan does not depend on how psycopg dumps an int.
            args = ", ".join(f"%s::{t}" for t in types.split())
            query = sql.SQL("SELECT o_outcome, o_attempt, o_store_now FROM {}(" + args + ")")
            return query.format(functions[name]).as_string(None)

        claim_types = "text bigint text text text bigint bigint boolean text bigint"
        self.claim = call("claim", claim_types)
        # The batch takes the claim's arguments as arrays, one element per request.
        arrays = ", ".join(f"%s::{t}[]" for t in claim_types.split())
        self.claim_many = (
            sql.SQL("SELECT o_ord, o_outcome, o_attempt, o_store_now FROM {}(" + arrays + ")")
            .format(functions["claim_many"])
            .as_string(None)
        )
        self.take_over = call(
            "take_over", "text bigint integer text text bigint bigint integer boolean"
        )
        self.now_ms = f"SELECT {NOW}"
        self.trigger = render("SELECT {trigger}(%s::text, %s::text)", trigger=functions["trigger"])
        self.write_definition = render(
            "SELECT o_version, o_current FROM {write}(%s::text, %s::text, %s::bigint)",
            write=functions["define"],
        )
        self.definitions_since = render(ops.DEFINITIONS_SINCE)
        self.read_definition = render(ops.READ_DEFINITION)
        self.definitions_version = render(ops.DEFINITIONS_VERSION)
        self.heartbeat = render(_HEARTBEAT)
        self.finish = render(_FINISH)
        self.finish_many = render(_FINISH_MANY)
        self.release = render(_RELEASE)
        self.due_runs = render(ops.DUE_RUNS)
        self.cancel = render(ops.CANCEL)
        self.set_paused = render(ops.SET_PAUSED)
        self.paused_jobs = render(ops.PAUSED_JOBS)
        self.register = render(ops.REGISTER)
        self.unregister = render(ops.UNREGISTER)
        self.instances = render(ops.INSTANCES)
        self.prune_instances = render(ops.PRUNE_INSTANCES)
        self.last_scheduled_slot = render(_LAST_SCHEDULED_SLOT)
        self.history = render(_HISTORY)
        self.history_order = " ORDER BY slot DESC, job DESC, attempt DESC LIMIT %s"
        self.prune_keep = render(ops.PRUNE_KEEP)
        self.prune = render(ops.PRUNE_BATCH)
