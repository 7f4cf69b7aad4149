/*
 * anarchon dashboard: a static page that reads the JSON API (docs/api.md) relative to
 * itself ({prefix}/api/...) and polls it every 5 s. No build step, no framework, nothing
 * fetched from anywhere but the serving side. Text from the API is only ever inserted
 * with textContent / createElement, never as HTML.
 *
 * Stable DOM hooks (for browser tests; keep them when restyling):
 *   #health                 store health; data-status = "ok" | "unavailable" | "unknown"
 *   #last-refresh           local time of the last refresh in which every fetch succeeded
 *   #error-banner           visible (no [hidden]) while a fetch fails; the last data stays
 *   #action-status          result of the last action; data-state = "pending" | "ok" | "error"
 *   #window                 select of the api/jobs window (1h, 24h, 7d)
 *   #tabs button[data-view="jobs"|"runs"|"instances"]; panels #view-jobs, #view-runs, #view-instances
 *   #jobs tbody tr[data-job="NAME"]     one row per job; data-paused="1" when paused
 *     .badge-paused                     in paused rows only
 *     .fp-mismatch                      when the job's fingerprints.length > 1
 *     button.job-link                   opens the job's timeline
 *   .status.status-<word>               status badge anywhere; its text is exactly the status
 *   #timeline[data-job="NAME"]          the open timeline; #timeline-strip holds one cell per slot:
 *     .cell[data-slot][data-status][data-attempt][data-instance][data-origin]
 *       data-status is the slot's final status; data-attempt its last attempt (0: ran nothing)
 *       data-takeover="1"               some attempt >= 2 did not follow a failed attempt
 *       data-retry="1"                  some attempt >= 2 followed a failed attempt
 *   #slot-detail                        the attempts of the clicked cell
 *   button[data-action="pause"|"resume"|"trigger"][data-job="NAME"]
 *   button[data-action="cancel"][data-job="NAME"][data-slot="MS"]   on running runs only
 *     (no action button exists unless api/jobs answers actions: true)
 *   #runs-job (text + datalist), #runs-status (select of the 8 statuses), #runs-clear
 *   #runs tbody tr[data-status][data-job][data-slot][data-attempt]; details.error expands
 *   #runs-older                         "Older" button; hidden when next_cursor is null
 *   #instances tbody tr[data-instance="ID"]
 *   #mismatches li[data-job="NAME"]     fingerprint-mismatch warning; hidden when none
 *   #instances-note                     no registry (501, claim-only store) or no live instance
 *   #definitions tbody tr[data-job="STORE NAME"][data-owner="store"|"code"][data-version="N"]
 *       [data-enabled="1"|"0"][data-target-held="0" when no live instance holds the target]
 *     .def-schedule (title: the schedule's JSON), .target-unheld, .def-reason, .next time
 *     button[data-def-action="edit"|"disable"|"enable"|"remove"][data-job]   store-owned rows,
 *       with actions only (disable asks for a reason with prompt(), remove confirm()s)
 *   #definitions-note                   the 501 of a store that keeps no definitions (no banner)
 *   #definition-new                     "New definition" (actions only); #definition-editor holds
 *   #definition-form[data-mode="create"|"edit"][data-job][data-version]: inputs #def-namespace,
 *     #def-name, #def-kind (every|cron|at), #def-every, #def-offset, #def-cron, #def-tz, #def-day-or,
 *     #def-at, #def-target, #def-args, #def-kwargs, #def-options, #def-target-options (JSON text),
 *     #def-enabled, #def-reason, #def-start-at, #def-end-at, #def-description; #definition-save,
 *     #definition-cancel; #definition-error[data-status="409"|"400"|…|"form"] keeps the form open
 *   URL fragment: #view=runs|instances|definitions and #job=NAME open a view / a timeline (kept in sync)
 *   "Run now" is rendered but disabled for a job with instances: 0 (the API would answer 409).
 *
 * Auth: a token in the page URL fragment (#token=...) is read once, kept in sessionStorage
 * and removed from the visible URL; every request sends it as a Bearer token, and after a
 * 401 the page prompt()s for one (once for polls, every time for a clicked action).
 * A `csrftoken` cookie (Django) is sent back as X-CSRFToken.
 */
(() => {
  'use strict';

  const POLL_MS = 5000;
  const FETCH_TIMEOUT_MS = 15000;
  const RUNS_PAGE = 50;
  const TIMELINE_LIMIT = 60;
  const TOKEN_KEY = `anarchon-token:${location.pathname}`;

  const state = {
    view: 'jobs',
    window: '24h',
    actions: false,
    jobs: null,            // last api/jobs answer
    job: null,             // job whose timeline is open
    slot: null,            // selected timeline slot
    timeline: null,        // records of the open job (null: loading)
    runs: { list: [], cursor: null, gen: 0, loading: false },
    openErrors: new Set(), // run keys whose error <details> the user opened
    errors: new Map(),     // endpoint -> message, shown in #error-banner
    lastOk: null,
    sigs: {},              // last rendered data per view, to skip identical re-renders
    noRegistry: false,     // api/instances answered 501 (claim-only store): not asked again
    defs: null,            // last api/definitions answer
    noDefinitions: null,   // api/definitions answered 501: its message; not asked again
    editor: null,          // the open definition form: { mode: 'create'|'edit', job, version }
  };

  // ---------------------------------------------------------------- small helpers
  const $ = (sel) => document.querySelector(sel);

  /** Create an element; attrs: class, on<event>, others as attributes (null/false skipped). */
  function h(tag, attrs = {}, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === 'class') node.className = v;
      else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid != null && kid !== false) node.append(kid);
    }
    return node;
  }

  const td = (label, ...kids) => h('td', { 'data-label': label }, ...kids);
  const muted = (text) => h('span', { class: 'muted' }, text);
  const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

  const badge = (status, title) => h('span', { class: `status status-${status}`, title }, status);

  /**
   * Local time: time only for today, with the date otherwise, with the year if not this
   * year; seconds unless on a whole minute (as most slots are).
   */
  function fmtTime(ms) {
    const d = new Date(ms);
    const today = new Date();
    const opts = { hour: '2-digit', minute: '2-digit' };
    if (ms % 60000 !== 0) opts.second = '2-digit';
    if (d.toDateString() !== today.toDateString()) Object.assign(opts, { month: 'short', day: 'numeric' });
    if (d.getFullYear() !== today.getFullYear()) opts.year = 'numeric';
    return d.toLocaleString(undefined, opts);
  }

  /** A <time> in the viewer's zone with the API's UTC ISO string as its tooltip. */
  function timeEl(iso, ms = Date.parse(iso)) {
    if (iso == null) return muted('—');
    return h('time', { datetime: iso, title: iso }, fmtTime(ms));
  }

  function fmtDur(ms) {
    if (ms == null) return '—';
    const a = Math.abs(ms);
    let s;
    if (a < 1000) s = `${Math.round(a)} ms`;
    else if (a < 60e3) s = `${(a / 1000).toFixed(a < 10e3 ? 2 : 1)} s`;
    else if (a < 3600e3) s = `${Math.floor(a / 60e3)}m ${String(Math.floor(a / 1000) % 60).padStart(2, '0')}s`;
    else s = `${Math.floor(a / 3600e3)}h ${String(Math.floor(a / 60e3) % 60).padStart(2, '0')}m`;
    return ms < 0 ? `−${s}` : s;
  }

  const fmtLate = (ms) => (ms == null ? '—' : ms < 0 ? fmtDur(ms) : `+${fmtDur(ms)}`);

  const fmtAgo = (ms) => (ms < 1500 ? 'just now' : `${fmtDur(ms).replace(/\.\d+ s$/, ' s')} ago`);

  function csrfCookie() {
    const m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]*)/);
    return m ? decodeURIComponent(m[1]) : null;
  }

  const runKey = (r) => `${r.job}\u0000${r.slot}\u0000${r.attempt}`;

  // ---------------------------------------------------------------- token and requests
  let token = sessionStorage.getItem(TOKEN_KEY);
  let promptDeclined = false;

  /** Read #token=... once, keep it for this tab, and take it out of the visible URL. */
  function takeTokenFromUrl() {
    const params = new URLSearchParams(location.hash.slice(1));
    const t = params.get('token');
    if (t) {
      token = t;
      sessionStorage.setItem(TOKEN_KEY, t);
    }
    params.delete('token');
    return params;
  }

  /** After a 401: ask once (polls) or every time (user actions). True to retry. */
  function askToken(usedToken, interactive) {
    if (token && token !== usedToken) return true; // another request already got a new one
    if (promptDeclined && !interactive) return false;
    const t = window.prompt('This dashboard needs its token. Token:');
    if (!t || !t.trim()) {
      promptDeclined = true;
      return false;
    }
    token = t.trim();
    sessionStorage.setItem(TOKEN_KEY, token);
    return true;
  }

  /** An Error with the HTTP status (0: no answer) and the answer's JSON, if any. */
  const apiError = (status, message, data = null) => Object.assign(new Error(message), { status, data });

  /** fetch a relative API path; JSON in and out; throws apiError with the API's error text. */
  async function api(path, { method = 'GET', body, interactive = false } = {}) {
    for (let attempt = 0; ; attempt++) {
      const headers = { Accept: 'application/json' };
      const usedToken = token;
      if (usedToken) headers.Authorization = `Bearer ${usedToken}`;
      const csrf = csrfCookie();
      if (csrf) headers['X-CSRFToken'] = csrf;
      if (body !== undefined) headers['Content-Type'] = 'application/json';
      const ctl = new AbortController();
      const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
      let resp;
      try {
        resp = await fetch(path, {
          method, headers, signal: ctl.signal, cache: 'no-store', credentials: 'same-origin',
          body: body === undefined ? undefined : JSON.stringify(body),
        });
      } catch (err) {
        throw apiError(0, ctl.signal.aborted ? 'no answer (timed out)' : `network error (${err.message})`);
      } finally {
        clearTimeout(timer);
      }
      let data = null;
      try { data = await resp.json(); } catch { /* not JSON: keep the HTTP status text */ }
      if (resp.status === 401 && attempt === 0 && askToken(usedToken, interactive)) continue;
      if (!resp.ok) {
        const msg = (data && typeof data.error === 'string' && data.error) || resp.statusText || 'request failed';
        throw apiError(resp.status, `HTTP ${resp.status}: ${msg}`, data);
      }
      return data;
    }
  }

  /** Run one loader; record its failure for the banner instead of throwing. */
  async function guarded(name, fn) {
    try {
      await fn();
      state.errors.delete(name);
    } catch (err) {
      state.errors.set(name, `${name}: ${err.message}`);
    }
  }

  // ---------------------------------------------------------------- header
  function renderHealth(data) {
    const el = $('#health');
    const status = data && data.status === 'ok' ? 'ok' : data ? 'unavailable' : 'unknown';
    el.dataset.status = status;
    let text = `store ${status}`;
    if (data && data.backend) text += ` · ${data.backend}`;
    if (data && status === 'ok' && data.instances != null) text += ` · ${plural(data.instances, 'live instance')}`;
    el.querySelector('.health-text').textContent = text;
    el.title = data && data.error ? `Store unavailable: ${data.error}` : 'Store health (api/health)';
  }

  function renderBanner() {
    const banner = $('#error-banner');
    banner.hidden = state.errors.size === 0;
    const since = state.lastOk ? `; showing the data from ${fmtTime(state.lastOk)}` : '';
    banner.replaceChildren(...(banner.hidden ? [] : [h('strong', {}, `Could not refresh${since}.`),
      h('ul', {}, [...state.errors.values()].map((msg) => h('li', {}, msg)))]));
  }

  let statusTimer = null;
  function showActionStatus(kind, text) {
    const el = $('#action-status');
    el.dataset.state = kind;
    el.className = `banner banner-${kind === 'error' ? 'error' : kind === 'ok' ? 'ok' : 'info'}`;
    el.querySelector('.banner-text').textContent = text;
    el.hidden = false;
    clearTimeout(statusTimer);
    if (kind === 'ok') statusTimer = setTimeout(() => { el.hidden = true; }, 12000);
  }

  // ---------------------------------------------------------------- jobs view
  function actionButton(action, job, label, extra = {}) {
    const attrs = { type: 'button', class: `btn btn-small btn-${action}`, 'data-action': action, 'data-job': job };
    return h('button', { ...attrs, ...extra }, label);
  }

  function jobActions(job) {
    return h('div', { class: 'btn-row' },
      job.paused ? actionButton('resume', job.job, 'Resume') : actionButton('pause', job.job, 'Pause'),
      actionButton('trigger', job.job, 'Run now', job.instances === 0
        ? { disabled: true, title: 'No live instance has this job, so none could run it' }
        : { title: 'Start a manual run now (one live instance runs it)' }));
  }

  function statChips(st) {
    // runs count slots; failed, interrupted and cancelled count attempts (a run retried
    // twice is one run and up to three attempts); skipped and paused count slots.
    const chips = [h('span', { class: 'stat-runs' }, plural(st.runs || 0, 'run'))];
    const add = (n, text, cls) => { if (n) chips.push(h('span', { class: `chip ${cls}` }, text)); };
    add(st.failures, plural(st.failures, 'failed attempt'), 'chip-failed');
    add(st.takeovers, plural(st.takeovers, 'takeover'), 'chip-takeover');
    add(st.retries, `${st.retries} ${st.retries === 1 ? 'retry' : 'retries'}`, 'chip-retry');
    add(st.interrupted, plural(st.interrupted, 'interrupted attempt'), 'chip-interrupted');
    add(st.cancelled, plural(st.cancelled, 'cancelled attempt'), 'chip-cancelled');
    add(st.skips, plural(st.skips, 'skipped slot'), 'chip-skipped');
    add(st.paused, plural(st.paused, 'paused slot'), 'chip-paused');
    if (st.truncated) {
      chips.push(h('span', { class: 'chip', title: `Counted from the newest ${st.records} records only` }, 'partial'));
    }
    return chips;
  }

  function jobRow(job) {
    const st = job.stats || {};
    const last = job.last_run;
    const fps = job.fingerprints || [];
    const next = job.next_slots || [];
    const nameCell = td('Job',
      h('button', { type: 'button', class: 'job-link', title: 'Show the recent runs of this job' }, job.job),
      job.paused && h('span', { class: 'badge badge-paused', title: 'Paused: its slots record "paused" and run nothing' }, 'paused'),
      fps.length > 1 && h('span', {
        class: 'fp-mismatch', role: 'img', 'aria-label': 'schedule fingerprint mismatch',
        title: `Live instances disagree on this job's schedule (fingerprints ${fps.join(', ')}): see Instances`,
      }, '⚠ mismatch'));
    const schedCell = td('Schedule',
      job.schedule ? h('code', {}, job.schedule)
        : job.instances ? h('span', {
          class: 'muted', title: 'The store keeps no definition of this job (a custom schedule, or a store without a job table)',
        }, 'not stored') : muted('no live instance'),
      job.instances ? h('div', { class: 'muted small' }, plural(job.instances, 'instance')) : null);
    const nextCell = td('Next slots', next.length
      ? h('div', { class: 'next' }, timeEl(next[0].at, next[0].slot),
        next.slice(1, 5).map((n) => h('span', { class: 'muted small' }, ' · ', timeEl(n.at, n.slot))))
      : muted('—'));
    const lastCell = td('Last run', last
      ? h('div', { class: 'last' },
        badge(last.status, [last.instance_id, last.error_summary || last.error].filter(Boolean).join(' — ') || null),
        ' ', timeEl(last.scheduled_at, last.slot),
        last.attempt > 1 ? h('span', { class: 'muted small' }, ` attempt ${last.attempt}`) : null)
      : muted('never'));
    const dur = st.duration_ms;
    const late = st.lateness_ms;
    const durCell = td('Duration', dur ? `${fmtDur(dur.mean)} / ${fmtDur(dur.p95)}` : muted('—'));
    if (late) durCell.title = `Lateness mean ${fmtLate(late.mean)}, p95 ${fmtLate(late.p95)}`;
    return h('tr', {
      'data-job': job.job, 'data-paused': job.paused ? '1' : null,
      class: [job.paused && 'is-paused', job.job === state.job && 'selected'].filter(Boolean).join(' ') || null,
    }, nameCell, schedCell, nextCell, lastCell,
    td('In window', h('div', { class: 'chips' }, statChips(st))),
    durCell,
    state.actions ? h('td', { class: 'actions-col', 'data-label': 'Actions' }, jobActions(job)) : null);
  }

  function renderJobs() {
    const data = state.jobs;
    const sig = JSON.stringify([data.actions, data.jobs, state.job]);
    if (sig === state.sigs.jobs) return;
    state.sigs.jobs = sig;
    document.body.classList.toggle('actions-on', state.actions);
    $('#jobs tbody').replaceChildren(...data.jobs.map(jobRow));
    $('#jobs-empty').hidden = data.jobs.length > 0;
    $('#jobs-count').textContent = String(data.jobs.length);
    $('#job-names').replaceChildren(...data.jobs.map((j) => h('option', { value: j.job })));
  }

  async function loadJobs() {
    const data = await api(`api/jobs?window=${encodeURIComponent(state.window)}`);
    state.jobs = data;
    state.actions = data.actions === true;
    renderJobs();
    if (state.job) renderTimelineHead();
    if (state.defs) renderDefinitions();
  }

  // ---------------------------------------------------------------- timeline
  /** Group a job's records by slot (oldest first) and derive each slot's final state. */
  function buildSlots(records) {
    const bySlot = new Map();
    for (const r of records) {
      if (!bySlot.has(r.slot)) bySlot.set(r.slot, []);
      bySlot.get(r.slot).push(r);
    }
    return [...bySlot.entries()].sort((a, b) => a[0] - b[0]).map(([slot, atts]) => {
      atts.sort((a, b) => a.attempt - b.attempt);
      const byAttempt = new Map(atts.map((r) => [r.attempt, r]));
      let takeover = false;
      let retry = false;
      for (const r of atts) {
        const prev = r.attempt >= 2 ? byAttempt.get(r.attempt - 1) : null;
        if (!prev) continue; // the previous attempt fell outside the page: unknown
        if (prev.status === 'failed') retry = true; else takeover = true;
      }
      return { slot, atts, final: atts[atts.length - 1], takeover, retry };
    });
  }

  /** Short labels A, B, … Z, AA, … for the instances, in order of first appearance. */
  function letter(i) {
    let s = '';
    for (i += 1; i > 0; i = Math.floor((i - 1) / 26)) s = String.fromCharCode(65 + ((i - 1) % 26)) + s;
    return s;
  }

  function describeAttempt(r) {
    const bits = [`#${r.attempt}`, r.origin, r.status];
    if (r.instance_id) bits.push(`by ${r.instance_id}`);
    if (r.duration_ms != null) bits.push(fmtDur(r.duration_ms));
    return bits.join(' ') + (r.error ? ` — ${r.error}` : '');
  }

  function renderTimelineHead() {
    const job = state.jobs && state.jobs.jobs.find((j) => j.job === state.job);
    const sig = JSON.stringify([state.job, state.actions, job && job.paused, job && job.instances]);
    if (sig === state.sigs.head) return;
    state.sigs.head = sig;
    const box = $('#timeline-actions');
    box.replaceChildren();
    if (job && state.actions) box.append(jobActions(job));
    if (job && job.paused) box.prepend(h('span', { class: 'badge badge-paused' }, 'paused'));
  }

  function renderTimeline() {
    const sig = JSON.stringify([state.job, state.slot, state.actions, state.timeline]);
    if (sig === state.sigs.timeline) return;
    state.sigs.timeline = sig;
    const slots = buildSlots(state.timeline || []);
    const letters = new Map();
    for (const s of slots) {
      for (const r of s.atts) if (r.instance_id && !letters.has(r.instance_id)) letters.set(r.instance_id, letter(letters.size));
    }
    const cells = slots.map((s) => {
      const f = s.final;
      const label = f.attempt === 0 ? (f.status === 'paused' ? '‖' : '–') : (letters.get(f.instance_id) || '?');
      const title = [`${fmtTime(s.slot)} (${f.scheduled_at})`, ...s.atts.map(describeAttempt)];
      if (s.takeover) title.push('⇄ taken over by a backup');
      if (s.retry) title.push('↻ retried after a failure');
      return h('button', {
        type: 'button', role: 'listitem',
        class: `cell status-${f.status}${s.slot === state.slot ? ' selected' : ''}`,
        'data-slot': s.slot, 'data-status': f.status, 'data-attempt': f.attempt,
        'data-instance': f.instance_id, 'data-origin': f.origin,
        'data-takeover': s.takeover ? '1' : null, 'data-retry': s.retry ? '1' : null,
        title: title.join('\n'), 'aria-label': `${f.status} at ${fmtTime(s.slot)}`,
      }, label);
    });
    $('#timeline-strip').replaceChildren(...cells);
    $('#timeline-empty').hidden = slots.length > 0;
    $('#timeline-empty').textContent = state.timeline ? 'No runs recorded for this job.' : 'Loading…';
    $('#timeline-from').textContent = slots.length ? fmtTime(slots[0].slot) : '';
    $('#timeline-to').textContent = slots.length > 1 ? fmtTime(slots[slots.length - 1].slot) : '';

    const legend = $('#timeline-legend');
    legend.replaceChildren(
      h('div', { class: 'legend-row' },
        ['success', 'failed', 'running', 'interrupted', 'cancelled', 'skipped', 'paused', 'claimed']
          .map((s) => h('span', { class: 'legend-item' }, h('span', { class: `swatch cell status-${s}` }), s)),
        h('span', { class: 'legend-item' }, h('span', { class: 'swatch cell status-success', 'data-takeover': '1' }), 'takeover'),
        h('span', { class: 'legend-item' }, h('span', { class: 'swatch cell status-success', 'data-retry': '1' }), 'retried'),
        h('span', { class: 'legend-item' }, h('span', { class: 'swatch cell status-success', 'data-origin': 'manual' }), 'manual')),
      letters.size ? h('div', { class: 'legend-row' }, muted('Ran by:'),
        [...letters].map(([id, l]) => h('span', { class: 'legend-item' }, h('b', {}, l), ' ', h('code', {}, id)))) : null);
    renderSlotDetail(slots.find((s) => s.slot === state.slot));
  }

  function renderSlotDetail(s) {
    const box = $('#slot-detail');
    box.hidden = !s;
    if (!s) return;
    const cancellable = state.actions && s.atts.some((r) => r.status === 'running');
    const rows = s.atts.map((r) => h('tr', { 'data-status': r.status, 'data-attempt': r.attempt },
      td('Attempt', r.attempt), td('Origin', r.origin), td('Status', badge(r.status)),
      td('Instance', r.instance_id || '—'), td('Started', timeEl(r.started_at)),
      td('Duration', fmtDur(r.duration_ms)), td('Error', r.error ? h('span', { class: 'error-text' }, r.error) : '—'),
      cancellable ? td('Actions', r.status === 'running' ? cancelButton(r) : null) : null));
    const head = h('tr', {}, ['Attempt', 'Origin', 'Status', 'Instance', 'Started', 'Duration', 'Error']
      .map((t) => h('th', {}, t)), cancellable ? h('th', {}, 'Actions') : null);
    box.replaceChildren(
      h('h3', {}, 'Slot ', timeEl(s.final.scheduled_at, s.slot),
        s.takeover ? h('span', { class: 'chip chip-takeover' }, 'takeover') : null,
        s.retry ? h('span', { class: 'chip chip-retry' }, 'retried') : null),
      h('table', { class: 'grid compact' }, h('thead', {}, head), h('tbody', {}, rows)));
  }

  async function loadTimeline() {
    const job = state.job;
    const q = new URLSearchParams({ job, limit: String(TIMELINE_LIMIT) });
    const data = await api(`api/runs?${q}`);
    if (job !== state.job) return; // another job was opened meanwhile
    state.timeline = data.runs;
    renderTimeline();
  }

  function openJob(name, switchView = false) {
    if (state.job !== name) Object.assign(state, { job: name, slot: null, timeline: null });
    $('#timeline').hidden = false;
    $('#timeline').dataset.job = name;
    $('#timeline-job').textContent = name;
    if (switchView) setView('jobs');
    if (state.jobs) { renderJobs(); renderTimelineHead(); }
    renderTimeline();
    saveHash();
    guarded('api/runs (timeline)', loadTimeline).then(renderBanner);
    $('#timeline').scrollIntoView({ block: 'nearest', behavior: 'smooth' });
  }

  function closeJob() {
    state.job = state.slot = null;
    $('#timeline').hidden = true;
    delete $('#timeline').dataset.job;
    if (state.jobs) renderJobs();
    saveHash();
  }

  // ---------------------------------------------------------------- runs view
  function cancelButton(r) {
    return actionButton('cancel', r.job, 'Cancel', { 'data-slot': r.slot, class: 'btn btn-small btn-cancel btn-danger' });
  }

  function errorCell(r) {
    const meta = r.meta && Object.keys(r.meta).length ? JSON.stringify(r.meta) : null;
    if (!r.error && !meta) return muted('—');
    const key = runKey(r);
    const first = r.error_summary || `meta ${meta}`;
    const summary = first.length > 70 ? `${first.slice(0, 68)}…` : first;
    const lines = [r.error, `claimed  ${r.claimed_at || '—'}`, `started  ${r.started_at || '—'}`,
      `finished ${r.finished_at || '—'}`, meta && `meta     ${meta}`].filter(Boolean);
    const det = h('details', { class: `error${r.error ? '' : ' meta-only'}`, open: state.openErrors.has(key) },
      h('summary', {}, summary), h('pre', {}, lines.join('\n')));
    det.addEventListener('toggle', () => (det.open ? state.openErrors.add(key) : state.openErrors.delete(key)));
    return det;
  }

  function runRow(r) {
    return h('tr', { 'data-status': r.status, 'data-job': r.job, 'data-slot': r.slot, 'data-attempt': r.attempt },
      td('Slot', timeEl(r.scheduled_at, r.slot)),
      td('Job', h('button', { type: 'button', class: 'job-link', 'data-goto-job': r.job, title: 'Show the timeline' }, r.job)),
      td('Attempt', String(r.attempt)),
      td('Origin', r.origin),
      td('Status', badge(r.status)),
      td('Instance', r.instance_id ? h('code', {}, r.instance_id) : muted('—')),
      td('Duration', fmtDur(r.duration_ms)),
      td('Lateness', fmtLate(r.lateness_ms)),
      td('Error', errorCell(r)),
      state.actions
        ? h('td', { class: 'actions-col', 'data-label': 'Actions' }, r.status === 'running' ? cancelButton(r) : null)
        : null);
  }

  function renderRuns() {
    const runs = state.runs;
    const sig = JSON.stringify([state.actions, runs.list, runs.cursor]);
    if (sig === state.sigs.runs) return;
    state.sigs.runs = sig;
    $('#runs tbody').replaceChildren(...runs.list.map(runRow));
    $('#runs-empty').hidden = runs.list.length > 0;
    $('#runs-older').hidden = !runs.cursor;
    $('#runs-shown').textContent = runs.list.length ? `${plural(runs.list.length, 'record')}, newest first` : '';
  }

  /**
   * Load the runs list. A refresh re-reads from the top as many records as are shown (so
   * new runs appear and older pages stay, without gaps); `more` follows next_cursor.
   */
  async function loadRuns(more = false) {
    const runs = state.runs;
    if (runs.loading && !more) return;
    if (more) runs.gen += 1; // a refresh still in flight must not drop the older page
    const gen = runs.gen;
    const q = new URLSearchParams();
    const job = $('#runs-job').value.trim();
    const status = $('#runs-status').value;
    if (job) q.set('job', job);
    if (status) q.set('status', status);
    if (more) q.set('cursor', runs.cursor);
    q.set('limit', String(more ? RUNS_PAGE : Math.min(1000, Math.max(RUNS_PAGE, runs.list.length))));
    runs.loading = true;
    try {
      const data = await api(`api/runs?${q}`);
      if (gen !== runs.gen) return; // the filters changed meanwhile
      runs.list = more ? runs.list.concat(data.runs) : data.runs;
      runs.cursor = data.next_cursor;
      renderRuns();
    } finally {
      runs.loading = false;
    }
  }

  function resetRuns() {
    Object.assign(state.runs, { gen: state.runs.gen + 1, list: [], cursor: null, loading: false });
    renderRuns();
    guarded('api/runs', () => loadRuns(false)).then(renderBanner);
  }

  // ---------------------------------------------------------------- instances view
  function renderInstances(data) {
    const now = data.now;
    const rows = data.instances.map((i) => {
      const jobs = Object.keys(i.jobs || {});
      const seen = Date.parse(i.last_seen_at);
      const skew = i.skew_ms;
      return h('tr', { 'data-instance': i.instance_id },
        td('Instance', h('code', {}, i.instance_id)),
        td('Host', i.host || '—'), td('PID', i.pid == null ? '—' : String(i.pid)), td('Version', i.version || '—'),
        td('Started', timeEl(i.started_at)),
        td('Last seen', h('time', { datetime: i.last_seen_at, title: i.last_seen_at }, fmtAgo(now - seen))),
        td('Clock skew', h('span', {
          class: skew != null && Math.abs(skew) >= 1000 ? 'warn-text' : null, title: 'store clock − local clock',
        },
          skew == null ? '—' : `${skew > 0 ? '+' : ''}${skew} ms`)),
        td('Jobs', h('span', { title: jobs.join('\n') || null }, String(jobs.length))));
    });
    $('#instances tbody').replaceChildren(...rows);
    $('#instances-count').textContent = String(data.instances.length);
    const note = $('#instances-note');
    note.hidden = rows.length > 0;
    note.textContent = 'No live instance: none has sent a heartbeat recently.';

    const mism = Object.entries(data.mismatches || {});
    const box = $('#mismatches');
    box.hidden = $('#mismatch-flag').hidden = mism.length === 0;
    box.replaceChildren(...(box.hidden ? [] : [h('strong', {}, '⚠ Schedule fingerprint mismatch'),
      h('p', {}, 'Live instances compute different slots for these jobs '
        + '(a rolling deploy in progress, or replicas running different code):'),
      h('ul', {}, mism.map(([job, fps]) => h('li', { 'data-job': job }, h('b', {}, job),
        h('ul', {}, Object.entries(fps).map(([fp, ids]) => h('li', { 'data-fingerprint': fp },
          h('code', {}, fp), ' → ', ids.map((id, n) => [n ? ', ' : '', h('code', {}, id)])))))))]));
  }

  async function loadInstances() {
    const note = $('#instances-note');
    if (state.noRegistry) return;
    try {
      renderInstances(await api('api/instances'));
    } catch (err) {
      if (err.status !== 501) throw err;
      // Claim-only backends keep no registry: say so here instead of as a failure, once.
      state.noRegistry = true;
      note.textContent = `No instance registry on this store (${err.message}).`;
      note.hidden = false;
      $('#instances tbody').replaceChildren();
    }
  }

  // ---------------------------------------------------------------- definitions view
  const DEF_STALE = 'changed since you opened it: reload and redo';
  const DEF_VERBS = { disable: 'Disable', enable: 'Enable', remove: 'Remove' };
  const clip = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);

  /** The schedule's JSON form, readably: every/offset, cron + zone, at; its JSON on hover. */
  function defScheduleCell(d) {
    const s = d.schedule || {};
    let main;
    if (s.every != null) {
      main = [h('code', {}, `every ${s.every}`), s.offset ? muted(` offset ${s.offset}`) : null];
    } else if (s.cron != null) {
      main = [h('code', {}, `cron ${s.cron}`), ' ', muted(s.tz || 'UTC'),
        s.day_or === false ? muted(' · day of month and day of week') : null];
    } else if (s.at != null) {
      main = ['once at ', timeEl(s.at)];
    } else {
      main = h('code', {}, JSON.stringify(s));
    }
    const bounds = d.start_at || d.end_at
      ? h('div', { class: 'muted small' }, d.start_at ? ['from ', timeEl(d.start_at), ' '] : null,
        d.end_at ? ['until ', timeEl(d.end_at)] : null)
      : null;
    return td('Schedule', h('span', { class: 'def-schedule', title: JSON.stringify(s) }, main), bounds);
  }

  function defTargetCell(d) {
    const args = d.args && d.args.length ? JSON.stringify(d.args) : '';
    const kwargs = d.kwargs && Object.keys(d.kwargs).length ? JSON.stringify(d.kwargs) : '';
    const call = [args && `args ${args}`, kwargs && `kwargs ${kwargs}`].filter(Boolean).join(' ');
    return td('Target', h('code', {}, d.target),
      d.target_held === false
        ? h('div', { class: 'target-unheld warn-text small', title: 'Its slots run nowhere until an instance registers this target' },
          '⚠ no live instance holds this target')
        : null,
      call ? h('div', { class: 'muted small def-args', title: call }, clip(call, 80)) : null);
  }

  function defActions(d) {
    if (d.owner !== 'store') return muted('read-only: change it in the code');
    const btn = (act, label, cls = '') => h('button', {
      type: 'button', class: `btn btn-small ${cls}`.trim(), 'data-def-action': act, 'data-job': d.job,
    }, label);
    return h('div', { class: 'btn-row' }, btn('edit', 'Edit'),
      d.enabled ? btn('disable', 'Disable', 'btn-pause') : btn('enable', 'Enable', 'btn-resume'),
      btn('remove', 'Remove', 'btn-danger'));
  }

  function definitionRow(d) {
    const next = d.next_slots || [];
    const owner = d.owner === 'code' ? 'code' : 'store';
    return h('tr', {
      'data-job': d.job, 'data-owner': owner, 'data-version': d.version, 'data-enabled': d.enabled ? '1' : '0',
      'data-target-held': d.target_held === false ? '0' : null,
      class: [!d.enabled && 'is-disabled', state.editor && state.editor.job === d.job && 'selected']
        .filter(Boolean).join(' ') || null,
    },
    td('Definition', h('b', { class: 'def-name' }, d.job),
      d.description ? h('div', { class: 'muted small def-description' }, d.description) : null),
    td('Source', h('span', {
      class: `chip chip-${owner}`,
      title: owner === 'code' ? 'A code job synced to the store: read-only here' : 'Kept in the store: edited here or by the API and CLI',
    }, owner)),
    td('Version', h('span', { class: 'def-version' }, String(d.version))),
    defScheduleCell(d),
    defTargetCell(d),
    td('Enabled', d.enabled
      ? h('span', { class: 'def-enabled' }, 'enabled')
      : [h('span', { class: 'badge badge-disabled' }, 'disabled'),
        d.reason ? h('div', { class: 'small def-reason' }, d.reason) : null]),
    td('Next slots', next.length
      ? h('div', { class: 'next' }, timeEl(next[0].at, next[0].slot),
        next.slice(1, 5).map((n) => h('span', { class: 'muted small' }, ' · ', timeEl(n.at, n.slot))))
      : muted(d.enabled ? 'none' : 'none (disabled)')),
    state.actions ? h('td', { class: 'actions-col', 'data-label': 'Actions' }, defActions(d)) : null);
  }

  function renderDefinitions() {
    $('#definition-new').hidden = !state.actions || state.noDefinitions != null;
    const data = state.defs;
    if (!data) return;
    const sig = JSON.stringify([state.actions, data.definitions, state.editor && state.editor.job]);
    if (sig === state.sigs.definitions) return;
    state.sigs.definitions = sig;
    $('#definitions tbody').replaceChildren(...data.definitions.map(definitionRow));
    $('#definitions-empty').hidden = data.definitions.length > 0;
    $('#definitions-count').textContent = String(data.definitions.length);
  }

  async function loadDefinitions() {
    if (state.noDefinitions != null) return;
    try {
      state.defs = await api('api/definitions');
    } catch (err) {
      if (err.status !== 501) throw err;
      // A store that keeps no definitions (claim-only): say so in the tab, once, not as a failure.
      state.noDefinitions = err.message;
      state.defs = null;
      const note = $('#definitions-note');
      note.textContent = (err.data && err.data.error) || err.message; // names the stores that keep them
      note.hidden = false;
      $('#definitions-bar').hidden = $('#definitions-panel').hidden = true;
      closeEditor();
      renderDefinitions();
      return;
    }
    renderDefinitions();
  }

  // -- the form: a whole definition, sent with the version it was read at
  function formError(text, status = 'form', extra = null) {
    const box = $('#definition-error');
    box.dataset.status = status;
    box.replaceChildren(h('span', { class: 'banner-text' }, text), ...(extra ? [extra] : []));
    box.hidden = false;
    box.scrollIntoView({ block: 'nearest' });
  }

  function clearFormError() {
    const box = $('#definition-error');
    box.hidden = true;
    delete box.dataset.status;
    box.replaceChildren();
  }

  function showKind() {
    const kind = $('#def-kind').value;
    for (const el of document.querySelectorAll('#definition-form [data-kind]')) el.hidden = el.dataset.kind !== kind;
  }

  function fillForm(d) {
    const s = (d && d.schedule) || {};
    const set = (id, value) => { $(id).value = value == null ? '' : String(value); };
    const json = (value, empty) => JSON.stringify(value == null ? empty : value);
    set('#def-namespace', d && d.namespace);
    set('#def-name', d && d.name);
    $('#def-kind').value = s.cron != null ? 'cron' : s.at != null ? 'at' : 'every';
    set('#def-every', s.every);
    set('#def-offset', s.offset);
    set('#def-cron', s.cron);
    set('#def-tz', s.tz);
    $('#def-day-or').checked = s.day_or !== false;
    set('#def-at', s.at);
    set('#def-target', d && d.target);
    set('#def-args', json(d && d.args, []));
    set('#def-kwargs', json(d && d.kwargs, {}));
    set('#def-options', json(d && d.options, {}));
    set('#def-target-options', json(d && d.target_options, {}));
    $('#def-enabled').checked = d ? d.enabled !== false : true;
    set('#def-reason', d && d.reason);
    set('#def-start-at', d && d.start_at);
    set('#def-end-at', d && d.end_at);
    set('#def-description', d && d.description);
    showKind();
  }

  /** The form as the API's definition body; a JSON field that does not parse throws. */
  function readForm() {
    const text = (id) => $(id).value.trim();
    const json = (id, label, example) => {
      const value = text(id);
      if (!value) return example;
      try {
        return JSON.parse(value);
      } catch (err) {
        throw new Error(`${label} ${clip(value, 60)} is not valid JSON (${err.message}): give e.g. ${JSON.stringify(example)}`);
      }
    };
    const kind = $('#def-kind').value;
    let schedule;
    if (kind === 'cron') {
      schedule = { cron: text('#def-cron') };
      if (text('#def-tz')) schedule.tz = text('#def-tz');
      if (!$('#def-day-or').checked) schedule.day_or = false;
    } else if (kind === 'at') {
      schedule = { at: text('#def-at') };
    } else {
      schedule = { every: text('#def-every') };
      if (text('#def-offset')) schedule.offset = text('#def-offset');
    }
    const body = {
      name: text('#def-name'),
      schedule,
      target: text('#def-target'),
      args: json('#def-args', 'args', []),
      kwargs: json('#def-kwargs', 'kwargs', {}),
      options: json('#def-options', 'options', {}),
      target_options: json('#def-target-options', 'target options', {}),
      enabled: $('#def-enabled').checked,
      reason: text('#def-reason') || null,
      start_at: text('#def-start-at') || null,
      end_at: text('#def-end-at') || null,
      description: $('#def-description').value,
      owner: 'store',
    };
    if (text('#def-namespace')) body.namespace = text('#def-namespace');
    return body;
  }

  function openEditor(mode, d = null) {
    state.editor = { mode, job: d ? d.job : null, version: d ? d.version : 0 };
    const form = $('#definition-form');
    form.dataset.mode = mode;
    if (d) Object.assign(form.dataset, { job: d.job, version: String(d.version) });
    else { delete form.dataset.job; delete form.dataset.version; }
    fillForm(d);
    $('#def-name').readOnly = $('#def-namespace').readOnly = mode === 'edit';
    $('#definition-title').textContent = mode === 'edit' ? `Edit ${d.job}` : 'New definition';
    $('#definition-read').textContent = mode === 'edit'
      ? `read at version ${d.version}: saving sends that version, and the store refuses the save if the definition changed since`
      : 'every instance follows a saved definition within one heartbeat';
    clearFormError();
    $('#definition-editor').hidden = false;
    renderDefinitions();
    $('#definition-editor').scrollIntoView({ block: 'nearest' });
    $(mode === 'edit' ? '#def-kind' : '#def-name').focus();
  }

  function closeEditor() {
    state.editor = null;
    $('#definition-editor').hidden = true;
    clearFormError();
    renderDefinitions();
  }

  /** Read a definition afresh (GET api/definitions/{job}) and open it in the form. */
  async function openEdit(job) {
    try {
      openEditor('edit', await api(`api/definitions/${encodeURIComponent(job)}`, { interactive: true }));
    } catch (err) {
      showActionStatus('error', `Could not read ${job}: ${err.message}`);
    }
  }

  async function saveDefinition(ev) {
    ev.preventDefault();
    const ed = state.editor;
    if (!ed) return;
    let body;
    try {
      body = readForm();
    } catch (err) {
      formError(err.message);
      return;
    }
    let path = 'api/definitions';
    if (ed.mode === 'edit') {
      path = `api/definitions/${encodeURIComponent(ed.job)}`;
      body.version = ed.version;
    }
    const save = $('#definition-save');
    save.disabled = true;
    clearFormError();
    try {
      const res = await api(path, { method: 'POST', body, interactive: true });
      if (state.editor === ed) closeEditor();
      showActionStatus('ok', `${ed.mode === 'edit' ? 'Saved' : 'Created'} ${res.job}: version ${res.version}; `
        + 'every instance follows within one heartbeat.');
    } catch (err) {
      if (state.editor !== ed) return; // the form was closed or reopened meanwhile
      const error = (err.data && err.data.error) || err.message;
      if (err.status === 409 && ed.mode === 'edit') {
        const held = err.data && err.data.current ? `version ${err.data.current}` : 'no definition (it was removed)';
        formError(`${ed.job} ${DEF_STALE}. You opened version ${ed.version}; the store holds ${held}. `
          + 'Your changes are still in the form.', '409',
        h('button', { type: 'button', class: 'btn btn-small', id: 'definition-reload', title: 'Drops the changes in the form' },
          'Reload'));
      } else if (err.status === 400) {
        formError(`Refused: ${error}`, '400');
      } else {
        formError(`Not saved: ${err.message}`, String(err.status));
      }
    } finally {
      save.disabled = false;
      refresh();
    }
  }

  /** The body that stores a listed definition again (its fields, namespace and version). */
  function definitionBody(d) {
    const { job, target_held: held, next_slots: next, namespace, ...fields } = d;
    return namespace == null ? fields : { ...fields, namespace };
  }

  async function definitionAction(btn) {
    const { defAction: act, job } = btn.dataset;
    if (act === 'edit') { openEdit(job); return; }
    const d = state.defs && state.defs.definitions.find((x) => x.job === job);
    if (!d) return;
    let path = `api/definitions/${encodeURIComponent(job)}`;
    let body;
    if (act === 'remove') {
      if (!window.confirm(`Remove the definition ${job} (version ${d.version})? Its slots stop at once on every instance.`)) return;
      path += '/remove';
      body = { version: d.version };
    } else {
      let reason = null;
      if (act === 'disable') {
        reason = window.prompt(`Disable ${job}: it runs nowhere until enabled again. Why? (shown beside it; optional)`, '');
        if (reason === null) return;
        reason = reason.trim() || null;
      }
      body = { ...definitionBody(d), enabled: act === 'enable', reason };
    }
    btn.disabled = true;
    showActionStatus('pending', `${DEF_VERBS[act]} ${job}…`);
    try {
      const res = await api(path, { method: 'POST', body, interactive: true });
      showActionStatus('ok', act === 'remove'
        ? `Removed ${job}: its slots stop at once on every instance.`
        : `${act === 'enable' ? 'Enabled' : 'Disabled'} ${job}: version ${res.version}.`);
    } catch (err) {
      const held = err.data && err.data.current ? `version ${err.data.current}` : 'no definition';
      showActionStatus('error', err.status === 409
        ? `${DEF_VERBS[act]} ${job} refused: it changed since the page read version ${d.version} (the store holds ${held}); `
          + 'the list is reloaded: redo it.'
        : `${DEF_VERBS[act]} ${job} failed: ${err.message}`);
    } finally {
      btn.disabled = false;
      refresh();
    }
  }

  async function loadHealth() {
    try {
      renderHealth(await api('api/health'));
    } catch (err) {
      renderHealth(err.data && err.data.status ? err.data : null);
      throw err;
    }
  }

  // ---------------------------------------------------------------- actions
  const VERBS = { pause: 'Pause', resume: 'Resume', trigger: 'Run now', cancel: 'Cancel' };

  function describeResult(action, job, res) {
    if (action === 'pause') return `Paused ${res.job || job}: its next slots record "paused" until resumed.`;
    if (action === 'resume') return `Resumed ${res.job || job}.`;
    if (action === 'trigger') {
      return `Requested a manual run of ${res.job || job} (slot ${res.scheduled_at || res.slot}); `
        + 'a live instance picks it up within a heartbeat.';
    }
    return res.cancelled
      ? `Cancelled the run of ${job} at ${fmtTime(res.slot)}.`
      : `Nothing cancelled: the run of ${job} at ${fmtTime(res.slot)} had already ended (or does not exist).`;
  }

  async function runAction(btn) {
    const { action, job } = btn.dataset;
    let path = `api/jobs/${encodeURIComponent(job)}/${action}`;
    let body = {}; // every action is a JSON POST: servers refuse any other content type
    if (action === 'cancel') {
      const slot = Number(btn.dataset.slot);
      if (!window.confirm(`Cancel the running run of ${job} (slot ${fmtTime(slot)})?`)) return;
      path = 'api/runs/cancel';
      body = { job, slot };
    }
    btn.disabled = true;
    showActionStatus('pending', `${VERBS[action]} ${job}…`);
    try {
      const res = await api(path, { method: 'POST', body, interactive: true });
      showActionStatus('ok', describeResult(action, job, res || {}));
    } catch (err) {
      showActionStatus('error', `${VERBS[action]} ${job} failed: ${err.message}`);
    } finally {
      btn.disabled = false;
      refresh();
    }
  }

  // ---------------------------------------------------------------- views, URL state, polling
  function setView(view) {
    state.view = view;
    for (const tab of document.querySelectorAll('#tabs [data-view]')) {
      tab.setAttribute('aria-selected', String(tab.dataset.view === view));
    }
    for (const v of ['jobs', 'runs', 'instances', 'definitions']) $(`#view-${v}`).hidden = v !== view;
    saveHash();
    if (view === 'runs') guarded('api/runs', () => loadRuns(false)).then(renderBanner);
    if (view === 'definitions') guarded('api/definitions', loadDefinitions).then(renderBanner);
  }

  /** The fragment keeps the view and the open job (never the token) for reloads and links. */
  function saveHash() {
    const p = new URLSearchParams();
    if (state.view !== 'jobs') p.set('view', state.view);
    if (state.job) p.set('job', state.job);
    const hash = p.toString();
    history.replaceState(null, '', `${location.pathname}${location.search}${hash ? `#${hash}` : ''}`);
  }

  let timer = null;
  let refreshing = false;
  let again = false;

  async function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    clearTimeout(timer);
    try {
      const tasks = [guarded('api/health', loadHealth), guarded('api/jobs', loadJobs), guarded('api/instances', loadInstances)];
      // Errors of what is no longer polled would otherwise stay in the banner.
      if (state.job) tasks.push(guarded('api/runs (timeline)', loadTimeline));
      else state.errors.delete('api/runs (timeline)');
      if (state.view === 'runs') tasks.push(guarded('api/runs', () => loadRuns(false)));
      else state.errors.delete('api/runs');
      // Definitions: polled while their tab is open, and read once at start for its count.
      if (state.view === 'definitions' || (state.defs === null && state.noDefinitions == null)) {
        tasks.push(guarded('api/definitions', loadDefinitions));
      } else state.errors.delete('api/definitions');
      await Promise.all(tasks);
      if (!state.errors.size) {
        state.lastOk = Date.now();
        $('#last-refresh').textContent = `updated ${fmtTime(state.lastOk)}`;
      }
      renderBanner();
    } finally {
      refreshing = false;
      if (again) { again = false; refresh(); } else timer = setTimeout(poll, POLL_MS);
    }
  }

  function poll() {
    if (document.hidden) timer = setTimeout(poll, POLL_MS); // no polling in a background tab
    else refresh();
  }

  function init() {
    const params = takeTokenFromUrl();
    $('#tz').textContent = Intl.DateTimeFormat().resolvedOptions().timeZone || 'your local zone';
    const win = sessionStorage.getItem('anarchon-window');
    if (win && [...$('#window').options].some((o) => o.value === win)) $('#window').value = win;
    state.window = $('#window').value;

    document.addEventListener('click', (ev) => {
      const t = ev.target instanceof Element ? ev.target : null;
      if (!t) return;
      const act = t.closest('button[data-action]');
      if (act) { runAction(act); return; }
      const dact = t.closest('button[data-def-action]');
      if (dact) { definitionAction(dact); return; }
      if (t.closest('#definition-reload')) { if (state.editor) openEdit(state.editor.job); return; }
      const tab = t.closest('#tabs [data-view]');
      if (tab) { setView(tab.dataset.view); return; }
      const cell = t.closest('#timeline-strip .cell');
      if (cell) {
        const slot = Number(cell.dataset.slot);
        state.slot = state.slot === slot ? null : slot;
        renderTimeline();
        return;
      }
      const go = t.closest('[data-goto-job]');
      if (go) { openJob(go.dataset.gotoJob, true); return; }
      if (t.closest('.fp-mismatch')) { setView('instances'); return; }
      const row = t.closest('#jobs tbody tr[data-job]');
      if (row && !t.closest('a, details')) openJob(row.dataset.job);
    });
    $('#timeline-close').addEventListener('click', closeJob);
    $('#timeline-runs').addEventListener('click', () => {
      $('#runs-job').value = state.job || '';
      $('#runs-status').value = '';
      resetRuns(); // starts the load; setView's own load then sees it in flight
      setView('runs');
    });
    $('#refresh').addEventListener('click', refresh);
    $('#definition-new').addEventListener('click', () => openEditor('create'));
    $('#definition-cancel').addEventListener('click', closeEditor);
    $('#definition-form').addEventListener('submit', saveDefinition);
    $('#def-kind').addEventListener('change', showKind);
    $('#window').addEventListener('change', () => {
      state.window = $('#window').value;
      sessionStorage.setItem('anarchon-window', state.window);
      refresh();
    });
    $('#action-status .banner-close').addEventListener('click', () => { $('#action-status').hidden = true; });
    let debounce = null;
    $('#runs-job').addEventListener('input', () => { clearTimeout(debounce); debounce = setTimeout(resetRuns, 350); });
    $('#runs-status').addEventListener('change', resetRuns);
    $('#runs-filter').addEventListener('submit', (ev) => { ev.preventDefault(); resetRuns(); });
    $('#runs-clear').addEventListener('click', () => { $('#runs-job').value = ''; $('#runs-status').value = ''; resetRuns(); });
    $('#runs-older').addEventListener('click', async (ev) => {
      ev.target.disabled = true;
      await guarded('api/runs', () => loadRuns(true));
      ev.target.disabled = false;
      renderBanner();
    });
    document.addEventListener('visibilitychange', () => { if (!document.hidden) refresh(); });

    const view = params.get('view');
    if (view === 'runs' || view === 'instances' || view === 'definitions') setView(view);
    if (params.get('job')) openJob(params.get('job'));
    saveHash(); // drops the token from the visible URL
    refresh();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})();
