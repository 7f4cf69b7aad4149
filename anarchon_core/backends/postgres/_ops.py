"""The SQL of :mod:`anarchon_core.backends.postgres` beyond claims and leases.

Manual runs, cancel, pause, job definitions, the instance registry and retention:
templates rendered by
:class:`._sql.Statements` with the same names (``{runs}``, ``{now}`` …), so
every identifier is a :class:`psycopg.sql.Identifier` and every value a parameter.

A manual request is a run in state ``pending`` (origin ``manual``, attempt 0, no
token) until an instance starts it with the takeover function. The unique partial
index on ``(job) WHERE state = 'pending'`` is what keeps it to one per job: two
triggers at once cannot both insert, whatever their snapshots.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "CANCEL",
    "DEFINITIONS_SINCE",
    "DEFINITIONS_VERSION",
    "DUE_REASONS",
    "DUE_RUNS",
    "INSTANCES",
    "PAUSED_JOBS",
    "PRUNE_BATCH",
    "PRUNE_INSTANCES",
    "PRUNE_KEEP",
    "READ_DEFINITION",
    "REGISTER",
    "SET_PAUSED",
    "TRIGGER",
    "UNREGISTER",
    "VERSION_KEY",
    "WRITE_DEFINITION",
]

#: The row of ``meta`` that holds the newest definition version issued (the counter).
VERSION_KEY = "definitions_version"

# A function, so that it can look again: the insert does nothing when a concurrent
# trigger recorded the job's pending request first (the unique index) or a claim took
# the chosen millisecond (the primary key); each statement of a PL/pgSQL function
# takes a fresh snapshot under READ COMMITTED, so the next turn sees what won.
TRIGGER = """
CREATE OR REPLACE FUNCTION {trigger}(p_job text, p_requested_by text, OUT o_slot bigint)
LANGUAGE plpgsql AS $anarchon$
DECLARE
    v_now bigint;
BEGIN
    LOOP
        SELECT r.slot INTO o_slot FROM {runs} r
        WHERE r.job = p_job AND r.state = '{pending}';
        IF FOUND THEN RETURN; END IF;  -- asked already: the same request
        v_now := {now};
        -- The store's now, or the first free millisecond after it.
        INSERT INTO {runs} AS r
            (job, slot, origin, state, attempt, token, lease_expires, retry_at, fingerprint,
             requested_by)
        SELECT p_job, min(c.slot), 'manual', '{pending}', 0, NULL, 0, 0, '', p_requested_by
        FROM (SELECT v_now AS slot
              UNION ALL
              SELECT o.slot + 1 FROM {runs} o WHERE o.job = p_job AND o.slot >= v_now) c
        WHERE NOT EXISTS (SELECT 1 FROM {runs} x WHERE x.job = p_job AND x.slot = c.slot)
        ON CONFLICT DO NOTHING
        RETURNING r.slot INTO o_slot;
        IF FOUND THEN RETURN; END IF;
    END LOOP;
END
$anarchon$
"""

# Expired leases and due retries from the partial index of open runs, pending manual
# requests from their own index.
DUE_RUNS = """
SELECT r.job, r.slot, r.attempt, r.origin, r.state
FROM {runs} r, (SELECT {now} AS now) t
WHERE r.job = ANY(%(jobs)s::text[]) AND r.state IN ('running', '{waiting}')
  AND ((r.state = 'running' AND r.lease_expires <= t.now)
    OR (r.state = '{waiting}' AND r.retry_at <= t.now))
UNION ALL
SELECT p.job, p.slot, p.attempt, p.origin, p.state
FROM {runs} p
WHERE p.job = ANY(%(jobs)s::text[]) AND p.state = '{pending}'
ORDER BY slot, job
"""

#: Why a run listed by DUE_RUNS is due, by its state (``WAITING``, ``PENDING``).
DUE_REASONS: dict[str, Literal["expired", "retry", "manual"]] = {
    "running": "expired",
    "waiting": "retry",
    "pending": "manual",
}

# One statement. Replacing the token fences the runner (heartbeat, finish and release
# match it); the state keeps the sweep and takeovers away. The new token is this call's
# own (``revoked``, held by nobody): a re-send of this very statement, after its
# connection died once it had committed, finds it and answers True; another cancel of
# the ended run answers False. The record: a pending request gets an attempt-0
# ``cancelled`` one (who asked for it as its instance); the attempt in flight ends
# ``cancelled``; an attempt that already ended (a failure waiting for its retry, a
# released run) keeps its status. An upsert rather than an UPDATE: when this statement
# waited for a takeover that committed meanwhile, the new attempt's record is not in its
# snapshot, but ON CONFLICT still finds and updates it.
CANCEL = """
WITH t AS (SELECT {now} AS now),
run AS (
    UPDATE {runs} r SET state = 'cancelled', token = %(revoked)s, lease_expires = 0
    WHERE r.job = %(job)s AND r.slot = %(slot)s::bigint
      AND r.state IN ('{pending}', 'running', '{waiting}')
    RETURNING r.attempt, r.origin, r.requested_by
),
rec AS (
    INSERT INTO {attempts} AS a
        (job, slot, attempt, origin, status, instance_id, claimed_at, started_at, finished_at)
    SELECT %(job)s, %(slot)s::bigint, run.attempt, run.origin, 'cancelled', run.requested_by,
           t.now, NULL, t.now
    FROM run, t
    ON CONFLICT (job, slot, attempt) DO UPDATE
        SET status = 'cancelled', finished_at = EXCLUDED.finished_at
        WHERE a.status = 'running'
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM run)
    OR EXISTS (SELECT 1 FROM {runs} r WHERE r.job = %(job)s AND r.slot = %(slot)s::bigint
               AND r.state = 'cancelled' AND r.token = %(revoked)s)
"""

SET_PAUSED = """
INSERT INTO {jobs} AS j (job, paused) VALUES (%s, %s)
ON CONFLICT (job) DO UPDATE SET paused = EXCLUDED.paused
"""

PAUSED_JOBS = "SELECT j.job FROM {jobs} j WHERE j.paused ORDER BY j.job"

# A job's definition lives in its ``jobs`` row: ``version`` (NULL: never defined) and
# ``definition`` (NULL: none, or removed: a tombstone that keeps its version). The
# counter is ``meta``'s row ``definitions_version``, which every write locks until its commit:
# writers queue on it, each reads the version the previous one committed, so versions
# are issued in commit order (a sequence's numbers could commit out of order, and a
# reader that had seen a higher one would miss a lower one committed after). A function
# for the reason the claim is one: after waiting for that lock, the job's row must be
# read with a fresh snapshot, which a later statement of a function takes under READ
# COMMITTED. The row is created by the first write (the host's migrations may not have
# made it); a conflict or a removal of nothing leaves everything as it was. On a
# conflict ``o_version`` is NULL and ``o_current`` the version the store holds.
WRITE_DEFINITION = """
CREATE OR REPLACE FUNCTION {define}(
    p_job text, p_body text, p_expected bigint, OUT o_version bigint, OUT o_current bigint
) LANGUAGE plpgsql AS $anarchon$
DECLARE
    v_issued bigint;
BEGIN
    INSERT INTO {meta} AS m (key, value) VALUES ({version_key}, '0')
    ON CONFLICT (key) DO NOTHING;
    SELECT m.value::bigint INTO v_issued FROM {meta} m WHERE m.key = {version_key} FOR UPDATE;
    SELECT CASE WHEN j.definition IS NOT NULL THEN j.version ELSE 0 END INTO o_current
    FROM {jobs} j WHERE j.job = p_job;
    o_current := coalesce(o_current, 0);
    IF p_expected IS NOT NULL AND p_expected <> o_current THEN
        RETURN;
    END IF;
    IF p_body IS NULL AND o_current = 0 THEN  -- nothing to remove: nothing written
        o_version := 0;
        RETURN;
    END IF;
    o_version := v_issued + 1;
    UPDATE {meta} m SET value = o_version::text WHERE m.key = {version_key};
    INSERT INTO {jobs} AS j (job, version, definition) VALUES (p_job, o_version, p_body)
    ON CONFLICT (job) DO UPDATE SET version = EXCLUDED.version, definition = EXCLUDED.definition;
    PERFORM pg_notify({channel}, o_version::text);  -- delivered at commit, to listeners
END
$anarchon$
"""

# One statement, one snapshot: every change committed before it, by version.
DEFINITIONS_SINCE = """
SELECT j.job, j.version, j.definition FROM {jobs} j
WHERE j.version > %s::bigint ORDER BY j.version
"""

READ_DEFINITION = """
SELECT j.version, j.definition FROM {jobs} j WHERE j.job = %s AND j.definition IS NOT NULL
"""

DEFINITIONS_VERSION = """
SELECT coalesce((SELECT m.value::bigint FROM {meta} m WHERE m.key = {version_key}), 0)
"""

# An unchanged spec keeps the stored value (``i.info`` itself): a large, out-of-line
# ``info`` is then not written again at every refresh.
REGISTER = """
INSERT INTO {instances} AS i (instance_id, info, last_seen, expires_at)
SELECT %(id)s, %(info)s::jsonb, t.now, t.now + %(ttl)s::bigint FROM (SELECT {now} AS now) t
ON CONFLICT (instance_id) DO UPDATE SET
    info = CASE WHEN i.info = EXCLUDED.info THEN i.info ELSE EXCLUDED.info END,
    last_seen = EXCLUDED.last_seen, expires_at = EXCLUDED.expires_at
"""

UNREGISTER = "DELETE FROM {instances} i WHERE i.instance_id = %s"

INSTANCES = """
SELECT i.info, i.last_seen FROM {instances} i, (SELECT {now} AS now) t
WHERE i.expires_at > t.now ORDER BY i.instance_id
"""

# Per job in scope, the slot of its latest record and of its latest scheduled run
# (catch-up's anchor): a skip scan over the primary keys, so its cost grows with jobs,
# not rows. The scope is the given store names (``jobs``) or those starting with a
# namespace's ``prefix``; both NULL is every job.
PRUNE_KEEP = """
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
WHERE (%(jobs)s::text[] IS NULL OR j.job = ANY(%(jobs)s::text[]))
  AND (%(prefix)s::text IS NULL OR left(j.job, char_length(%(prefix)s::text)) = %(prefix)s::text)
"""

# One bounded batch, its own short transaction: the newest ``batch`` prunable history
# records in scope below ``below``, and the runs they belong to when those are terminal.
# Claims never touch such rows. The caller moves ``below`` down to the batch's lowest
# slot, so no batch walks again over the index entries the previous ones deleted.
PRUNE_BATCH = """
WITH doomed AS (
    SELECT t.ctid FROM {attempts} t
    WHERE t.slot < %(below)s AND t.status = ANY(%(terminal)s::text[])
      AND (%(jobs)s::text[] IS NULL OR t.job = ANY(%(jobs)s::text[]))
      AND (%(prefix)s::text IS NULL
           OR left(t.job, char_length(%(prefix)s::text)) = %(prefix)s::text)
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

# Instances that stopped without unregistering (crashed, killed) leave a row behind;
# pruning deletes the expired ones.
PRUNE_INSTANCES = "DELETE FROM {instances} i WHERE i.expires_at <= {now}"
