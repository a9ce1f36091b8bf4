// The tollgate dashboard: polls /v1/stats every second, and with an admin token the top
// list and the bans. Everything from the server is written with textContent, never as HTML:
// identity values are whatever clients sent.
'use strict';

const POLL_MS = 1000;
// A colour per reason, by meaning (admitted green, refused red, ...), so that it reads the
// same whatever series there are; a second policy with the same reason takes a lighter shade.
const REASON_COLORS = {
  ok: '#1b6e35',
  bypassed: '#00666b',
  rate_limited: '#a4161a',
  concurrency_limited: '#8a4b00',
  blocked: '#6b3fa0',
  cost_exceeds_limit: '#b0106b',
  store_unavailable: '#3d3d3d',
};

function seriesColor(reason, shade) {
  const base = REASON_COLORS[reason] || '#0b5cad';
  const mix = [0, 0.35, 0.55, 0.7][Math.min(shade, 3)];
  const channel = (i) => Math.round(parseInt(base.slice(i, i + 2), 16) * (1 - mix) + 255 * mix);
  return 'rgb(' + channel(1) + ',' + channel(3) + ',' + channel(5) + ')';
}
const SVG = 'http://www.w3.org/2000/svg';
const $ = (id) => document.getElementById(id);

let token = sessionStorage.getItem('tollgate.token') || '';
// A token may come in the address's fragment (never sent to the server): #token=...
if (location.hash.startsWith('#token=')) {
  token = decodeURIComponent(location.hash.slice('#token='.length));
  sessionStorage.setItem('tollgate.token', token);
  history.replaceState(null, '', location.pathname + location.search);
}
// What the admin endpoints said to the token: 'none' (no token), 'ok', or the refusal.
let admin = token ? 'ok' : 'none';
let adminEnabled = true;
let bans = [];

function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function notice(text, ok) {
  const n = $('notice');
  n.hidden = !text;
  n.textContent = text || '';
  n.className = ok ? 'ok' : '';
}

async function api(path, options) {
  const headers = Object.assign({}, (options && options.headers) || {});
  if (token) headers.Authorization = 'Bearer ' + token;
  const response = await fetch(path, Object.assign({}, options, { headers, cache: 'no-store' }));
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON */ }
  return { status: response.status, ok: response.ok, body };
}

function seriesLabel(s) {
  let label = s.policy + ' · ' + s.reason;
  if (s.reason === 'store_unavailable') label += s.allowed ? ' (allowed)' : ' (denied)';
  return label;
}

function formatDuration(ms) {
  let s = Math.max(0, Math.ceil(ms / 1000));
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  return (d ? d + 'd ' : '') + (d || h ? h + 'h ' : '') + (d || h || m ? m + 'm ' : '') + s + 's';
}

function niceMax(v) {
  if (v <= 5) return 5;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const f of [1, 2, 5, 10]) if (v <= f * p) return f * p;
  return 10 * p;
}

function drawChart(decisions) {
  const svg = $('chart');
  const desc = svg.querySelector('desc');
  while (svg.lastChild !== desc) svg.removeChild(svg.lastChild);
  const W = 900, H = 240, L = 44, B = 20, T = 8;
  const n = decisions.seconds.length;
  const series = decisions.series;
  let max = 0;
  for (const s of series) for (const c of s.counts) if (c > max) max = c;
  const top = niceMax(max);
  const x = (i) => L + (W - L - 4) * (n <= 1 ? 1 : i / (n - 1));
  const y = (v) => T + (H - T - B) * (1 - v / top);
  for (const f of [0, 0.5, 1]) {
    const gy = y(top * f);
    const line = svg.appendChild(document.createElementNS(SVG, 'line'));
    for (const [k, v] of [['x1', L], ['x2', W - 4], ['y1', gy], ['y2', gy], ['stroke', '#c9ccd1']]) line.setAttribute(k, v);
    const t = document.createElementNS(SVG, 'text');
    t.setAttribute('x', L - 6); t.setAttribute('y', gy + 4); t.setAttribute('text-anchor', 'end');
    t.textContent = f === 1 ? top + '/s' : String(top * f);
    svg.appendChild(t);
  }
  [['−15 min', 0, 'start'], ['−10', n / 3, 'middle'], ['−5', 2 * n / 3, 'middle'], ['now', n - 1, 'end']].forEach(([label, i, anchor]) => {
    const t = document.createElementNS(SVG, 'text');
    t.setAttribute('x', x(i)); t.setAttribute('y', H - 5); t.setAttribute('text-anchor', anchor);
    t.textContent = label;
    svg.appendChild(t);
  });
  const legend = $('legend');
  legend.replaceChildren();
  const shades = {};
  series.forEach((s) => {
    const shade = shades[s.reason] = (shades[s.reason] ?? -1) + 1;
    const color = seriesColor(s.reason, shade);
    const path = document.createElementNS(SVG, 'polyline');
    path.setAttribute('points', s.counts.map((c, i) => x(i).toFixed(1) + ',' + y(c).toFixed(1)).join(' '));
    path.setAttribute('fill', 'none');
    path.setAttribute('stroke', color);
    path.setAttribute('stroke-width', '2');
    if (!s.allowed) path.setAttribute('stroke-dasharray', '6 3');
    svg.appendChild(path);
    const item = el('li');
    const sw = el('span', null, { class: 'swatch', 'aria-hidden': 'true' });
    sw.style.background = color;
    item.append(sw, seriesLabel(s) + (s.allowed ? '' : ' (dashed: denied)'));
    legend.appendChild(item);
  });
  desc.textContent = series.length
    ? series.map((s) => seriesLabel(s) + ': ' + s.total + ' in 15 minutes').join('; ')
    : 'No decisions in the last 15 minutes.';
  const body = $('totals').tBodies[0];
  body.replaceChildren();
  for (const s of series) {
    const tr = el('tr');
    tr.append(el('td', s.policy), el('td', s.reason), el('td', s.allowed ? 'yes' : 'no'),
      el('td', s.total, { class: 'n' }), el('td', s.counts.length ? s.counts[s.counts.length - 1] : 0, { class: 'n' }));
    body.appendChild(tr);
  }
}

function drawStore(store) {
  const dl = $('store');
  dl.replaceChildren();
  const row = (k, v) => { if (v !== null && v !== undefined) dl.append(el('dt', k), el('dd', v)); };
  const r = store.recent;
  row('store', store.kind + ' (' + store.url + ')');
  row('on_error', store.on_error + ', timeout ' + store.timeout_ms + ' ms');
  if (r) {
    row('latency, last ' + r.seconds + ' s', r.p50_ms === null ? 'no calls' : 'p50 ' + r.p50_ms + ' ms · p99 ' + r.p99_ms + ' ms');
    row('checks / errors, last ' + r.seconds + ' s', r.checks + ' / ' + r.errors);
  }
  row('checks / errors, total', store.checks_total + ' / ' + store.errors_total);
  const u = store.store_unavailable_decisions;
  row('on_error decisions, 15 min', u.allowed + ' allowed · ' + u.denied + ' denied');
  row('local cache answers, total', store.local_cache_answers_total);
  row('memory store evictions, total', store.memory_evictions_total);
  const l = store.leases;
  if (l && l.calls_total) {
    row('quota leases: calls / local admissions, total', l.calls_total + ' / ' + l.local_admissions_total);
    row('leased identities / units in hand / given back', l.leased_keys + ' / ' + l.outstanding_units + ' / ' + l.returned_units_total);
  }
  const p = store.persistence;
  if (p) {
    const files = (p.aof ? 'append-only file' : 'no append-only file') + ' · ' +
      (p.rdb === null ? 'RDB unknown' : p.rdb ? 'RDB snapshots' : 'no RDB snapshots');
    row('persistence', files);
    if (p.long_windows_at_risk.length) {
      const what = p.survives_restart === false ? 'start again if the store restarts: ' : 'need the store to persist: ';
      row('windows of a day or more', what + p.long_windows_at_risk.join(', '));
    }
  }
}

function drawPolicies(stats) {
  const box = $('policies');
  box.replaceChildren();
  for (const p of stats.policies) {
    const div = el('div', null, { class: 'policy' });
    div.appendChild(el('strong', p.name));
    div.append(' — on_error ' + p.on_error + (p.bypass ? ', bypass' : '') + (p.duplicate ? ', duplicate guard ' + p.duplicate : '') + (p.lease ? ', ' + p.lease : ''));
    const ul = el('ul');
    for (const l of p.limiters) {
      const rules = l.rules.map((r) => r.rule + ' ' + r.algorithm).join(', ');
      ul.appendChild(el('li', l.name + ' by ' + l.by + ': ' + rules + (l.blocklist ? '; ban ' + l.blocklist : '') + (l.overrides ? '; takes overrides' : '')));
    }
    div.appendChild(ul);
    box.appendChild(div);
  }
  const envoy = $('envoy');
  envoy.hidden = !stats.envoy;
  envoy.textContent = stats.envoy || '';
  const r = stats.reload;
  let text = 'Loaded from ' + (r.path || '(memory)') + ' at ' + new Date(r.loaded_at * 1000).toLocaleTimeString() + '.';
  if (r.last) {
    text += ' Last reload at ' + new Date(r.last.at * 1000).toLocaleTimeString() + ': ' + (r.last.ok ? 'ok' : 'rejected, the previous configuration stays: ' + r.last.error);
  }
  text += ' Reloads: ' + r.ok + ' ok, ' + r.failed + ' rejected.';
  $('reload').textContent = text;
}

function adminRefused(result) {
  admin = result.status === 429 ? 'throttled' : 'refused';
  const message = (result.body && result.body.error) || ('HTTP ' + result.status);
  notice(message + '. Enter the admin token to see identities, ban and unban.');
}

function fillBanForm(kind, value) {
  $('ban-kind').value = kind;
  $('ban-value').value = value;
  $('ban-duration').focus();
}

let topDrawn = null;

async function pollTop() {
  const result = await api('/v1/stats/top?limit=10');
  if (!result.ok) return adminRefused(result);
  const leased = $('leased');
  leased.replaceChildren();
  for (const k of result.body.leased) {
    leased.appendChild(el('li', k.keys.join(' + ') + ': ' + k.units + ' units in hand, for ' + formatDuration(k.ends_in_ms)));
  }
  $('leased-hint').hidden = !result.body.leased.length;
  $('top-hint').textContent = result.body.top.length
    ? 'By denials over the last ' + result.body.window_seconds[0] / 60 + ' to ' + result.body.window_seconds[1] / 60 + ' minutes.'
    : 'Nobody was rate limited in the last minutes.';
  const body = $('top').tBodies[0];
  const signature = JSON.stringify(result.body.top);
  if (signature === topDrawn) return;
  topDrawn = signature;
  body.replaceChildren();
  for (const t of result.body.top) {
    const tr = el('tr');
    const who = t.by === 'global' ? '(everyone)' : t.by + ' ' + t.value;
    const action = el('td');
    if ((t.by === 'ip' || t.by === 'user_id') && t.value) {
      const value = t.by === 'ip' ? t.value.replace(/\/\d+$/, '') : t.value;
      const b = el('button', 'Ban…', { type: 'button', class: 'secondary', 'aria-label': 'Ban ' + who });
      b.addEventListener('click', () => fillBanForm(t.by, value));
      action.appendChild(b);
    }
    tr.append(el('td', who), el('td', t.policy + ' / ' + t.limiter), el('td', t.rule),
      el('td', t.denials, { class: 'n', title: 'at least ' + t.at_least }), action);
    body.appendChild(tr);
  }
}

async function pollBans() {
  const result = await api('/v1/blocklist?limit=100');
  if (!result.ok) return adminRefused(result);
  const now = Date.now();
  bans = result.body.bans.map((b) => Object.assign({ until: now + b.expires_in_ms }, b));
  drawBans();
  $('bans-hint').textContent = bans.length ? '' : 'No live bans.';
}

async function pollOverrides() {
  const result = await api('/v1/overrides');
  if (!result.ok) return adminRefused(result);
  const body = $('overrides').tBodies[0];
  body.replaceChildren();
  for (const o of result.body.overrides) {
    const rules = o.rules ? o.rules.join(', ') : 'not applied: made for rules the configuration no longer has';
    const ends = o.expires_at_ms === null ? 'never' : formatDuration(o.expires_at_ms - Date.now());
    const tr = el('tr');
    tr.append(el('td', o.policy + ' / ' + o.limiter), el('td', o.value), el('td', rules), el('td', ends, { class: 'n' }));
    body.appendChild(tr);
  }
  $('overrides-hint').textContent = result.body.overrides.length
    ? 'Set with PUT /v1/overrides, removed with DELETE /v1/overrides.'
    : 'No overrides: every identity counts by the configured limits.';
}

// Rows are rebuilt only when the bans change; the countdown ticks update the times in place,
// so a button keeps its focus (and its identity) between polls.
let bansDrawn = null;

function drawBans() {
  const body = $('bans').tBodies[0];
  const signature = JSON.stringify(bans.map((b) => [b.kind, b.value, b.strikes]));
  if (signature === bansDrawn) {
    bans.forEach((b, i) => { body.rows[i].cells[1].textContent = formatDuration(b.until - Date.now()); });
    return;
  }
  bansDrawn = signature;
  const focused = document.activeElement && document.activeElement.dataset.ban;
  body.replaceChildren();
  for (const b of bans) {
    const tr = el('tr');
    const key = b.kind + ' ' + b.value;
    const unban = el('button', 'Unban', { type: 'button', 'aria-label': 'Unban ' + key, 'data-ban': key });
    unban.addEventListener('click', async () => {
      unban.disabled = true;
      const r = await api('/v1/blocklist/' + encodeURIComponent(b.kind) + '/' + encodeURIComponent(b.value), { method: 'DELETE' });
      if (r.ok) notice('Unbanned ' + key + '.', true);
      else notice('Unban ' + key + ': ' + ((r.body && r.body.error) || 'HTTP ' + r.status));
      await pollBans();
    });
    const td = el('td');
    td.appendChild(unban);
    tr.append(el('td', key), el('td', formatDuration(b.until - Date.now()), { class: 'n' }), el('td', b.strikes, { class: 'n' }), td);
    body.appendChild(tr);
    if (focused === key) unban.focus();
  }
}

function setAdminViews() {
  const on = admin === 'ok' && adminEnabled;
  // Who uses this page with an admin token sees it said, always.
  $('admin-badge').hidden = !on;
  for (const id of ['top', 'bans', 'overrides']) $(id).hidden = !on;
  for (const e of $('ban-form').elements) e.disabled = !on;
  if (!adminEnabled) {
    $('top-hint').textContent = $('bans-hint').textContent =
      'Admin endpoints are off: start the server with an admin token to see identities, ban and unban.';
  } else if (!on) {
    $('top-hint').textContent = 'Enter the admin token to see who is limited.';
    $('bans-hint').textContent = 'Enter the admin token to see, add and remove bans.';
  }
}

async function poll() {
  try {
    const result = await api('/v1/stats');
    if (!result.ok) throw new Error((result.body && result.body.error) || 'HTTP ' + result.status);
    const stats = result.body;
    adminEnabled = stats.admin.enabled;
    drawChart(stats.decisions);
    drawStore(stats.store);
    drawPolicies(stats);
    setAdminViews();
    if (admin === 'ok' && adminEnabled) {
      await Promise.all([pollTop(), pollBans(), pollOverrides()]);
      setAdminViews();
    } else if (!adminEnabled && stats.admin.token_env) {
      $('top-hint').textContent = $('bans-hint').textContent =
        'Admin endpoints are off: set ' + stats.admin.token_env + ' in the server\'s environment and restart it to see identities, ban and unban.';
    }
    $('live').textContent = 'live · updated ' + new Date().toLocaleTimeString();
  } catch (e) {
    $('live').textContent = 'cannot reach the server: ' + e.message;
  }
  setTimeout(poll, POLL_MS);
}

$('token-form').addEventListener('submit', (event) => {
  event.preventDefault();
  token = $('token').value.trim();
  $('token').value = '';
  if (token) sessionStorage.setItem('tollgate.token', token); else sessionStorage.removeItem('tollgate.token');
  admin = token ? 'ok' : 'none';
  notice('');
  setAdminViews();
});

$('forget').addEventListener('click', () => {
  token = '';
  sessionStorage.removeItem('tollgate.token');
  admin = 'none';
  notice('');
  setAdminViews();
});

$('ban-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const kind = $('ban-kind').value, value = $('ban-value').value.trim(), duration = $('ban-duration').value.trim();
  const r = await api('/v1/blocklist', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ kind, value, duration }),
  });
  if (r.ok) {
    notice('Banned ' + kind + ' ' + value + ' for ' + duration + '.', true);
    $('ban-value').value = '';
  } else {
    notice('Ban ' + kind + ' ' + value + ': ' + ((r.body && r.body.error) || 'HTTP ' + r.status));
  }
  await pollBans();
});

setInterval(drawBans, 1000);
setAdminViews();
poll();
