"""The Lua scripts of the Redis backend: every decision of the contract is one script.

A script runs atomically on the server, so each one is a critical section exactly
like a method of the in-memory reference backend, and it mirrors that method step
for step. Time is ``redis.call('TIME')`` (the store's clock); a lease is a key with a
server-side TTL, so "is the lease live?" is ``EXISTS``.

A job's keys share the ``{job}`` hash tag, so they live in one hash slot. Most scripts
touch the keys of one job only (the registry's, its one hash). The batch scripts (a
batch of claims or finishes, the sweep) take the keys of several jobs, declared in
``KEYS``, and decide each job's part exactly as the one-job script would; on Redis
Cluster the backend gives each call only jobs of one hash slot (``_groups`` in
:mod:`._base`), so every script stays valid there. The scripts that look at
other runs of the same job (the overlap check, the sweep, the history and prune scans)
and the claim's definition check build those keys from ``base`` (``prefix:{job}:``),
which is in the same slot as their declared keys. The two scripts of job definitions
are the exception: they join a job's definition to the store's version counter and
change log, in other slots (see ``WRITE_DEFINITION``); they run on one server only.

Numbers written by a script go through ``fmt`` (``%d``): Lua numbers are doubles and
``tostring`` would switch to exponent notation for large values.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from ...backend import EARLY_TOLERANCE_MS, NOT_STARTED
from ...records import TERMINAL_STATUSES

__all__ = [
    "CANCEL",
    "CLAIM_LEASE",
    "CLAIM_SCRIPT",
    "DEFINITIONS_SINCE",
    "DUE_RUNS",
    "FINISH",
    "HEARTBEAT",
    "HISTORY",
    "IDMP_SETUP",
    "INSTANCES",
    "LUA_SCRIPTS",
    "PRUNE",
    "REGISTER",
    "RELEASE",
    "TAKE_OVER",
    "TRIGGER",
    "WRITE_DEFINITION",
    "LuaScript",
]


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A script and its SHA1: sent with ``EVALSHA``, loaded again after ``NOSCRIPT``."""

    name: str
    source: str
    #: Redis names scripts by SHA1; hashed once here, not on every call (a hot path).
    sha: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


_TERMINAL = ", ".join(f"[{status.value!r}] = true" for status in sorted(TERMINAL_STATUSES))

_HELPERS = f"""
local EARLY = {EARLY_TOLERANCE_MS}
local NOT_STARTED = {json.dumps(NOT_STARTED)}
local TERMINAL = {{{_TERMINAL}}}
local RECORD_FIELDS = {{'status', 'instance', 'claimed', 'started', 'finished', 'error', 'meta'}}

local function fmt(n) return string.format('%d', n) end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The earliest other run of the job whose lease is live (the overlap check), or nil.
local function live_other(base, open_key, slot)
  local earliest = nil
  for _, s in ipairs(redis.call('SMEMBERS', open_key)) do
    if s ~= slot and redis.call('HGET', base .. 'run:' .. s, 'state') == 'running'
        and redis.call('EXISTS', base .. 'lease:' .. s) == 1 then
      local n = tonumber(s)
      if earliest == nil or n < earliest then earliest = n end
    end
  end
  return earliest
end

-- The error of a skipped record, as ``backend.overlap_reason`` words it: the slot in
-- UTC to the ms (days to a civil date: H. Hinnant's algorithm, proleptic Gregorian).
local function overlap_reason(ms)
  local secs = math.floor(ms / 1000)
  local days = math.floor(secs / 86400)
  local tod = secs - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400 + (month <= 2 and 1 or 0)
  return string.format('overlapped the run of %04d-%02d-%02dT%02d:%02d:%02d.%03dZ, still running',
    year, month, day, math.floor(tod / 3600), math.floor(tod % 3600 / 60), tod % 60,
    ms - secs * 1000)
end

-- Index a recorded run: its slot for history and prune, and catch-up's anchor (``last``:
-- the job hash's field, read by the caller with the pause flag).
local function remember(job_key, slots_key, slot, origin, last)
  redis.call('ZADD', slots_key, slot, slot)
  if origin ~= 'manual' then
    last = tonumber(last or '')
    if last == nil or tonumber(slot) > last then
      redis.call('HSET', job_key, 'last', slot)
    end
  end
end

-- End an attempt's record as interrupted unless it already has an outcome.
local function interrupt(run, n, now, why)
  if redis.call('HGET', run, n .. ':status') == 'running' then
    redis.call('HSET', run, n .. ':status', 'interrupted', n .. ':finished', fmt(now),
      n .. ':error', why)
  end
end

-- A repeat by the token that won attempt n (after an ambiguous failure): 'won' again
-- only while that attempt's lease is live (the lease key exists and holds the token),
-- else 'lapsed': it must not start, and nothing is written.
local function repeat_of(state, lease, token, n, now)
  if state == 'running' and redis.call('GET', lease) == token then return {{'won', n, now}} end
  return {{'lapsed', 0, now}}
end

-- A slot that ran nothing (paused, skipped): recorded once, attempt 0.
-- ``overlapped``: the slot of the live run a skipped slot overlapped (its error).
local function nothing_ran(run, status, origin, instance, fp, now, overlapped)
  redis.call('HSET', run, 'origin', origin, 'state', status, 'attempt', '0', 'token', '',
    'fp', fp, '0:status', status, '0:instance', instance, '0:claimed', fmt(now),
    '0:finished', fmt(now))
  if overlapped then redis.call('HSET', run, '0:error', overlap_reason(overlapped)) end
end
"""


def _script(name: str, body: str) -> LuaScript:
    return LuaScript(name, _HELPERS + body)


_LEASE_CLAIM = """
-- Whether any of ``keys`` exists, leaving out those in ``except`` (one EXISTS per 500).
local function any_exists(keys, except)
  local some = {}
  for _, k in ipairs(keys) do
    if not except[k] then
      some[#some + 1] = k
      if #some == 500 then
        if redis.call('EXISTS', unpack(some)) > 0 then return true end
        some = {}
      end
    end
  end
  return #some > 0 and redis.call('EXISTS', unpack(some)) > 0
end

-- The overlap check of a batch of claims on the open sets ``open_keys`` (those of its
-- claims that skip overlaps). An empty set does not exist, so one EXISTS over them, at
-- the first check, tells at once that none of their jobs has a live run; the per-job
-- check then runs only for the open sets the batch itself has written since
-- (``mark``). A lone open set gets the per-job check directly.
local function overlap_checker(open_keys)
  local opened, quiet = {}, nil
  local function live(base, open, slot)
    if #open_keys > 1 and not opened[open] then
      if quiet == nil then quiet = not any_exists(open_keys, opened) end
      if quiet then return nil end
    end
    return live_other(base, open, slot)
  end
  local function mark(open) opened[open] = true end
  return live, mark
end

-- Whether the job holds exactly ``version`` of its definition with a body (a removal
-- leaves the version without a body). ``base .. 'definition'`` shares the job's hash
-- slot with the claim's declared keys.
local function holds(base, version)
  local key = base .. 'definition'
  return redis.call('HGET', key, 'version') == version
    and redis.call('HEXISTS', key, 'body') == 1
end

-- One lease claim at the script's ``now``, as the contract decides it alone; returns
-- the outcome and the attempt. ``live(base, open, slot)`` is the overlap check.
-- ``version``: the stored definition's version the claim names ('' for none: a code
-- job, not checked, so that such a claim reads nothing more).
local function claim_lease(run, lease, job, open, slots, slot, token, instance, lease_ms,
    horizon_ms, skip, origin, fp, base, version, now, live)
  local held = redis.call('HMGET', run, 'token', 'attempt', 'state')
  if held[2] then
    if held[1] == token and held[2] == '1' then
      local r = repeat_of(held[3], lease, token, 1, now)
      return r[1], r[2]
    end
    return 'taken', 0
  end
  local s = tonumber(slot)
  if s < now - tonumber(horizon_ms) then return 'expired', 0 end
  if s > now + EARLY then return 'early', 0 end
  if version ~= '' and not holds(base, version) then return 'stale', 0 end
  local j = redis.call('HMGET', job, 'paused', 'last')
  local nothing, overlapped = nil, nil
  if j[1] == '1' then
    nothing = 'paused'
  elseif skip == '1' then
    overlapped = live(base, open, slot)
    if overlapped then nothing = 'skipped' end
  end
  remember(job, slots, slot, origin, j[2])
  if nothing then
    nothing_ran(run, nothing, origin, instance, fp, now, overlapped)
    return nothing, 0
  end
  redis.call('HSET', run, 'origin', origin, 'state', 'running', 'attempt', '1', 'token', token,
    'fp', fp, '1:status', 'running', '1:instance', instance, '1:claimed', fmt(now),
    '1:started', fmt(now))
  redis.call('SET', lease, token, 'PX', lease_ms)
  redis.call('SADD', open, slot)
  return 'won', 1
end
"""

# A batch of claims (one or more), decided one by one in order at one ``TIME``: each as
# alone, and a claim sees the writes of those before it (a run won earlier in the batch
# makes a later slot of its job ``skipped``).
# KEYS: per claim: run, lease, job, open, slots
# ARGV: per claim: slot, token, instance, lease_ms, horizon_ms, skip_overlap, origin,
#       fingerprint, base, definition version ('' for none)
# Returns {now, outcome, attempt, outcome, attempt, ...}: one pair per claim, in order.
CLAIM_LEASE = _script(
    "claim",
    _LEASE_CLAIM
    + """
local now = now_ms()
local open_keys, listed = {}, {}
for k = 4, #KEYS, 5 do
  local open = KEYS[k]
  if ARGV[(k - 4) / 5 * 10 + 6] == '1' and not listed[open] then
    listed[open] = true
    open_keys[#open_keys + 1] = open
  end
end
local live, mark = overlap_checker(open_keys)
local out = {now}
for i = 0, #KEYS / 5 - 1 do
  local k, a = 5 * i, 10 * i
  local outcome, attempt = claim_lease(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
    KEYS[k + 5], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
    ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9], ARGV[a + 10], now, live)
  if outcome == 'won' then mark(KEYS[k + 4]) end
  out[#out + 1] = outcome
  out[#out + 1] = attempt
end
return out
""",
)

# The claim-only "script" strategy's batch of claims (one or more), in order.
# KEYS: per claim: run, job, slots
# ARGV: per claim: slot, token, instance, horizon_ms, origin, fingerprint
# Returns {now, outcome, attempt, outcome, attempt, ...}: one pair per claim, in order.
CLAIM_SCRIPT = _script(
    "claim-only",
    """
-- One claim of the claim-only "script" strategy: the same run record, no lease, no
-- overlap check.
local function claim_only(run, job, slots, slot, token, instance, horizon_ms, origin, fp, now)
  local held = redis.call('HMGET', run, 'token', 'attempt')
  if held[2] then
    if held[1] == token and held[2] == '1' then return 'won', 1 end
    return 'taken', 0
  end
  local s = tonumber(slot)
  if s < now - tonumber(horizon_ms) then return 'expired', 0 end
  if s > now + EARLY then return 'early', 0 end
  local j = redis.call('HMGET', job, 'paused', 'last')
  remember(job, slots, slot, origin, j[2])
  if j[1] == '1' then
    nothing_ran(run, 'paused', origin, instance, fp, now)
    return 'paused', 0
  end
  redis.call('HSET', run, 'origin', origin, 'state', 'claimed', 'attempt', '1', 'token', token,
    'fp', fp, '1:status', 'claimed', '1:instance', instance, '1:claimed', fmt(now),
    '1:started', fmt(now))
  return 'won', 1
end

local now = now_ms()
local out = {now}
for i = 0, #KEYS / 3 - 1 do
  local k, a = 3 * i, 6 * i
  local outcome, attempt = claim_only(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 1],
    ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], now)
  out[#out + 1] = outcome
  out[#out + 1] = attempt
end
return out
""",
)

# KEYS: run, lease
# ARGV: attempt, token, lease_ms
HEARTBEAT = _script(
    "heartbeat",
    """
local r = redis.call('HMGET', KEYS[1], 'token', 'attempt', 'state')
if r[1] ~= ARGV[2] or r[2] ~= ARGV[1] or r[3] ~= 'running' then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
""",
)

# A batch of finishes (one or more), each fenced by its own token, in order.
# KEYS: per finish: run, lease, open
# ARGV: per finish: attempt, token, status, has_error, error, meta, retry_in_ms ('' for
#       none), slot, the state an unfinished attempt is in ('running', or 'claimed' for
#       claim-only)
# Returns 1 (recorded, or repeated with the same status) or 0 (fenced) per finish.
FINISH = _script(
    "finish",
    """
local now = nil
local out = {}
for i = 0, #KEYS / 3 - 1 do
  local run, lease, open = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local a = 9 * i
  local n, token, status = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local r = redis.call('HMGET', run, 'token', 'attempt', 'state', n .. ':status')
  if r[1] ~= token or r[2] ~= n then
    out[#out + 1] = 0
  elseif r[3] ~= ARGV[a + 9] then  -- finished already: a repeat of the same outcome is fine
    out[#out + 1] = (r[4] == status) and 1 or 0
  else
    now = now or now_ms()
    local fields = {n .. ':status', status, n .. ':finished', fmt(now)}
    if ARGV[a + 7] ~= '' and status == 'failed' then
      fields[#fields + 1] = 'state'
      fields[#fields + 1] = 'waiting'
      fields[#fields + 1] = 'retry_at'
      fields[#fields + 1] = fmt(now + tonumber(ARGV[a + 7]))
    else
      fields[#fields + 1] = 'state'
      fields[#fields + 1] = status
      redis.call('SREM', open, ARGV[a + 8])
    end
    if ARGV[a + 4] == '1' then
      fields[#fields + 1] = n .. ':error'
      fields[#fields + 1] = ARGV[a + 5]
    end
    if ARGV[a + 6] ~= '' then
      fields[#fields + 1] = n .. ':meta'
      fields[#fields + 1] = ARGV[a + 6]
    end
    redis.call('HSET', run, unpack(fields))
    redis.call('DEL', lease)
    out[#out + 1] = 1
  end
end
return out
""",
)

# KEYS: run, lease
# ARGV: attempt, token
RELEASE = _script(
    "release",
    """
local run, n = KEYS[1], ARGV[1]
local r = redis.call('HMGET', run, 'token', 'attempt', 'state')
if r[1] ~= ARGV[2] or r[2] ~= n or r[3] ~= 'running' then return 0 end
local now = now_ms()
redis.call('DEL', KEYS[2])
redis.call('HSET', run, 'token', '', n .. ':status', 'interrupted', n .. ':finished', fmt(now),
  n .. ':error', 'handed over')
return 1
""",
)

# Also starts a pending manual request (attempt 0) as attempt 1.
# KEYS: run, lease, open, slots
# ARGV: slot, attempt, token, instance, lease_ms, horizon_ms, max_attempts, skip_overlap, base
TAKE_OVER = _script(
    "take_over",
    """
local run, lease, open, slots = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local slot, token = ARGV[1], ARGV[3]
local now = now_ms()
local r = redis.call('HMGET', run, 'token', 'attempt', 'state', 'retry_at', 'requested_by')
if not r[2] then return {'taken', 0, now} end
local attempt, req = tonumber(r[2]), tonumber(ARGV[2])
if r[1] == token and attempt == req + 1 then return repeat_of(r[3], lease, token, attempt, now) end
if attempt ~= req then return {'taken', 0, now} end
local expired = r[3] == 'running' and redis.call('EXISTS', lease) == 0
local retry_due = r[3] == 'waiting' and (tonumber(r[4]) or 0) <= now
local pending = r[3] == 'pending'
if not (expired or retry_due or pending) then return {'taken', 0, now} end
local exhausted = req >= tonumber(ARGV[7])
if exhausted or tonumber(slot) < now - tonumber(ARGV[6]) then
  if expired then
    interrupt(run, ARGV[2], now, 'lease expired')
    redis.call('HSET', run, 'state', 'interrupted', 'token', '')
  elseif pending then  -- a manual request nobody started in time: it ran nothing
    redis.call('HSET', run, 'state', 'interrupted', 'token', '', '0:status', 'interrupted',
      '0:instance', r[5] or '', '0:claimed', fmt(now), '0:finished', fmt(now),
      '0:error', NOT_STARTED)
    redis.call('ZADD', slots, slot, slot)
  else  -- a due retry that may not run: its failure stands
    redis.call('HSET', run, 'state', 'failed', 'token', '')
  end
  redis.call('SREM', open, slot)
  if exhausted then return {'exhausted', 0, now} end
  return {'expired', 0, now}
end
if ARGV[8] == '1' and live_other(ARGV[9], open, slot) then return {'blocked', 0, now} end
interrupt(run, ARGV[2], now, 'lease expired')
if pending then redis.call('ZADD', slots, slot, slot) end
local n = fmt(req + 1)
redis.call('HSET', run, 'state', 'running', 'attempt', n, 'token', token,
  n .. ':status', 'running', n .. ':instance', ARGV[4], n .. ':claimed', fmt(now),
  n .. ':started', fmt(now))
redis.call('SET', lease, token, 'PX', ARGV[5])
return {'won', req + 1, now}
""",
)

# The sweep of many jobs. An empty set does not exist, so one EXISTS per 32 jobs finds
# those that hold open runs; only their sets are read (and TIME only if one is).
# KEYS: the open set of each job
# ARGV: the base of each job, in the same order
# Returns a flat list: the job's position (from 1), slot, attempt, origin, reason, ...
DUE_RUNS = _script(
    "due_runs",
    """
local now = nil
local out = {}
local function sweep(i)
  local base = ARGV[i]
  for _, s in ipairs(redis.call('SMEMBERS', KEYS[i])) do
    now = now or now_ms()
    local r = redis.call('HMGET', base .. 'run:' .. s, 'state', 'attempt', 'origin', 'retry_at')
    local reason = nil
    if r[1] == 'running' and redis.call('EXISTS', base .. 'lease:' .. s) == 0 then
      reason = 'expired'
    elseif r[1] == 'waiting' and (tonumber(r[4]) or 0) <= now then
      reason = 'retry'
    elseif r[1] == 'pending' then
      reason = 'manual'
    end
    if reason then
      out[#out + 1] = i
      out[#out + 1] = s
      out[#out + 1] = r[2]
      out[#out + 1] = r[3]
      out[#out + 1] = reason
    end
  end
end
if #KEYS == 1 then
  sweep(1)
else
  for first = 1, #KEYS, 32 do
    local last = math.min(first + 31, #KEYS)
    if redis.call('EXISTS', unpack(KEYS, first, last)) > 0 then
      for i = first, last do sweep(i) end
    end
  end
end
return out
""",
)

# A manual run: a pending run (attempt 0, origin manual) at the store's now, or the next
# free millisecond; at most one pending request per job (a second press returns it).
# KEYS: open
# ARGV: base, requested_by
TRIGGER = _script(
    "trigger",
    """
local base = ARGV[1]
for _, s in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('HGET', base .. 'run:' .. s, 'state') == 'pending' then return tonumber(s) end
end
local slot = now_ms()
while redis.call('EXISTS', base .. 'run:' .. fmt(slot)) == 1 do slot = slot + 1 end
local s = fmt(slot)
redis.call('HSET', base .. 'run:' .. s, 'origin', 'manual', 'state', 'pending', 'attempt', '0',
  'token', '', 'fp', '', 'requested_by', ARGV[2])
redis.call('SADD', KEYS[1], s)
return slot
""",
)

# End a pending, running or waiting run as cancelled; revoking the token fences its runner.
# KEYS: run, lease, open, slots
# ARGV: slot
CANCEL = _script(
    "cancel",
    """
local run, slot = KEYS[1], ARGV[1]
local r = redis.call('HMGET', run, 'state', 'attempt', 'requested_by')
if r[1] ~= 'pending' and r[1] ~= 'running' and r[1] ~= 'waiting' then return 0 end
local now = now_ms()
if r[1] == 'pending' then  -- nothing ran: one attempt-0 record, as for a paused slot
  redis.call('HSET', run, '0:status', 'cancelled', '0:instance', r[3] or '',
    '0:claimed', fmt(now), '0:finished', fmt(now))
  redis.call('ZADD', KEYS[4], slot, slot)
elseif redis.call('HGET', run, r[2] .. ':status') == 'running' then
  redis.call('HSET', run, r[2] .. ':status', 'cancelled', r[2] .. ':finished', fmt(now))
end
redis.call('HSET', run, 'state', 'cancelled', 'token', '')
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], slot)
return 1
""",
)

# The instance registry: one hash, instance id -> '<last_seen> <expires> <json>' (store ms).
# KEYS: instances
# ARGV: instance id, ttl_ms, json
REGISTER = _script(
    "register",
    """
local now = now_ms()
redis.call('HSET', KEYS[1], ARGV[1],
  fmt(now) .. ' ' .. fmt(now + tonumber(ARGV[2])) .. ' ' .. ARGV[3])
return now
""",
)

# KEYS: instances
# Returns a flat list: last_seen, json, ... of the live instances; drops expired ones.
INSTANCES = _script(
    "instances",
    """
local now = now_ms()
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local seen, expires, info = string.match(all[i + 1], '^(%d+) (%d+) (.*)$')
  if expires == nil or tonumber(expires) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = seen
    out[#out + 1] = info
  end
end
return out
""",
)

# A job's definition stored (``body``) or removed (a tombstone: the version kept, the
# body deleted), if the version it holds is ``expected``; the store's counter issues the
# new version and the change log records it, in this one script: versions are issued in
# commit order and a reader of the log never sees a change half made.
# Its keys lie in several hash slots (the job's definition in the job's, the counter
# and the log each in its own), as do those of DEFINITIONS_SINCE: fine on one server,
# refused by Redis Cluster (CROSSSLOT), which the backend does not support yet;
# definitions will need another layout there.
# KEYS: definition, counter, log
# ARGV: job, expected version ('' for whatever it is, 0 for none), has body ('1'/'0'), body,
# the channel that hears of every change (its message: the new version)
# Returns {'conflict', the version held (0: none or removed)} or {'written', the new
# version (0: a removal of nothing, nothing written)}.
WRITE_DEFINITION = _script(
    "write_definition",
    """
local def = KEYS[1]
local current = 0
if redis.call('HEXISTS', def, 'body') == 1 then
  current = tonumber(redis.call('HGET', def, 'version'))
end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= current then return {'conflict', current} end
if ARGV[3] == '0' and current == 0 then return {'written', 0} end
local n = redis.call('INCR', KEYS[2])
local v = fmt(n)
if ARGV[3] == '1' then
  redis.call('HSET', def, 'version', v, 'body', ARGV[4])
else
  redis.call('HSET', def, 'version', v)
  redis.call('HDEL', def, 'body')
end
redis.call('ZADD', KEYS[3], v, ARGV[1])
redis.call('PUBLISH', ARGV[5], v)
return {'written', n}
""",
)

# Every definition changed after a version, read in one script so that no write falls
# between the log and the definitions (a later change of a job read here would carry a
# version above changes of other jobs not read). The definitions' keys are built from
# the log's members (each job's own hash slot): like the write, one server only.
# KEYS: log
# ARGV: version (exclusive), the definition key before the job, the key after the job
# Returns a flat list: job, version, body (nil for a tombstone), ... by version.
DEFINITIONS_SINCE = _script(
    "definitions_since",
    """
local out = {}
for _, job in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf')) do
  local d = redis.call('HMGET', ARGV[2] .. job .. ARGV[3], 'version', 'body')
  out[#out + 1] = job
  out[#out + 1] = d[1]
  out[#out + 1] = d[2]
end
return out
""",
)

# KEYS: slots
# ARGV: base, max score ('+inf', '(until', or the cursor's slot), min score ('-inf' or
#       since), status ('' for any), limit, cursor slot and attempt ('' '' for none: the
#       records of that slot from that attempt up are after the page, not counted)
# Returns a flat list: slot, HGETALL of its run, ... for the newest runs holding at least
# ``limit`` matching records in all (the caller filters, orders and cuts).
HISTORY = _script(
    "history",
    """
local limit = tonumber(ARGV[5])
local cut_slot, cut_attempt = tonumber(ARGV[6]), tonumber(ARGV[7])
local out, found, offset = {}, 0, 0
while found < limit do
  local chunk = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[2], ARGV[3], 'LIMIT', offset, 100)
  if #chunk == 0 then break end
  offset = offset + #chunk
  for _, s in ipairs(chunk) do
    local h = redis.call('HGETALL', ARGV[1] .. 'run:' .. s)
    local cut = tonumber(s) == cut_slot
    local matched = 0
    for i = 1, #h, 2 do
      if string.sub(h[i], -7) == ':status' and (ARGV[4] == '' or h[i + 1] == ARGV[4])
          and not (cut and tonumber(string.sub(h[i], 1, -8)) >= cut_attempt) then
        matched = matched + 1
      end
    end
    if matched > 0 then
      out[#out + 1] = s
      out[#out + 1] = h
      found = found + matched
    end
  end
end
return out
""",
)

# KEYS: slots, open, job
# ARGV: base, older_than, min score (cursor: '-inf' or '(slot'), batch size
# Returns {records deleted, last slot looked at (or false), runs looked at}.
PRUNE = _script(
    "prune",
    """
local slots, open, job, base = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local latest = redis.call('ZREVRANGE', slots, 0, 0)[1]
local anchor = redis.call('HGET', job, 'last')
local chunk = redis.call('ZRANGEBYSCORE', slots, ARGV[3], '(' .. ARGV[2], 'LIMIT', 0,
  tonumber(ARGV[4]))
local deleted = 0
for _, s in ipairs(chunk) do
  if s ~= latest and s ~= anchor then
    local run = base .. 'run:' .. s
    local h = redis.call('HGETALL', run)
    local state, records, doomed = nil, 0, {}
    for i = 1, #h, 2 do
      if h[i] == 'state' then
        state = h[i + 1]
      elseif string.sub(h[i], -7) == ':status' then
        records = records + 1
        if TERMINAL[h[i + 1]] then doomed[#doomed + 1] = string.sub(h[i], 1, -8) end
      end
    end
    deleted = deleted + #doomed
    if state and TERMINAL[state] and #doomed == records then
      redis.call('DEL', run, base .. 'lease:' .. s)
      redis.call('ZREM', slots, s)
      redis.call('SREM', open, s)
    else
      for _, n in ipairs(doomed) do
        for _, f in ipairs(RECORD_FIELDS) do redis.call('HDEL', run, n .. ':' .. f) end
      end
    end
  end
end
return {deleted, chunk[#chunk] or false, #chunk}
""",
)

# The idmp strategy's one-time set-up of a job's stream (Redis >= 8.6): create it empty
# and set how long and how many idempotent ids it remembers. XCFGSET clears those maps,
# so it runs only when the script itself creates the stream.
# KEYS: stream
# ARGV: idmp duration (s), idmp max size
IDMP_SETUP = _script(
    "idmp_setup",
    """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('XADD', KEYS[1], '0-1', 'created', '1')
redis.call('XDEL', KEYS[1], '0-1')
redis.call('XCFGSET', KEYS[1], 'IDMP-DURATION', ARGV[1], 'IDMP-MAXSIZE', ARGV[2])
return 1
""",
)

LUA_SCRIPTS = (
    CLAIM_LEASE,
    CLAIM_SCRIPT,
    HEARTBEAT,
    FINISH,
    RELEASE,
    TAKE_OVER,
    DUE_RUNS,
    TRIGGER,
    CANCEL,
    REGISTER,
    INSTANCES,
    WRITE_DEFINITION,
    DEFINITIONS_SINCE,
    HISTORY,
    PRUNE,
    IDMP_SETUP,
)
