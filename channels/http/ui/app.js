'use strict';
// The control UI: hand-written, no framework. Data comes from /ui/api (the same admin
// handles as the CLI); the web chat's replies arrive over SSE (/ui/api/events).
const $ = (id) => document.getElementById(id);
let csrf = '';

function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function notice(text) {
  const n = $('notice');
  n.textContent = text || '';
  n.hidden = !text;
}

async function api(path, body) {
  const opt = body === undefined ? {} : {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrf },
    body: JSON.stringify(body),
  };
  const r = await fetch('/ui/api/' + path, opt);
  const v = await r.json().catch(() => ({}));
  if (r.status === 401) {
    notice('Not logged in: run `weft dashboard` on the gateway\'s host and open the link it prints.');
  }
  if (!r.ok) throw new Error(v.error || ('HTTP ' + r.status));
  return v;
}

// ---- chat ----
let streaming = null;
function chatName() { return $('chat-name').value.trim() || 'main'; }
function chatAgent() { return $('chat-agent').value; }
// The web chat's chat id: `CHAT@AGENT` when an agent is chosen (its own session).
function chatId() { return chatAgent() ? chatName() + '@' + chatAgent() : chatName(); }
function addLine(who, text, cls) {
  const li = el('li', text, { 'data-who': who });
  if (cls) li.className = cls;
  $('chat-log').append(li);
  li.scrollIntoView({ block: 'nearest' });
  return li;
}
// ---- canvas (live: the gateway pushes a `canvas` event at each change) ----
// The session whose canvas is shown: as the web chat names it, until an event says otherwise.
let canvasSession = '';
function guessCanvasSession() {
  const a = chatAgent();
  return (a && a !== 'main' ? '@' + a + ':' : '') + 'web:' + chatId();
}
function reloadCanvas() {
  $('canvas').src = '/ui/canvas/' + encodeURIComponent(canvasSession || guessCanvasSession());
}
function onCanvas(m) {
  if (m.channel !== 'web' || m.chat !== chatId()) return;
  canvasSession = m.session;
  $('canvas-state').textContent = m.visible ? 'Shown: ' + (m.title || '(untitled)') + ' (version ' + m.version + ')' : 'Hidden';
  reloadCanvas();
}
function chatChanged() { $('chat-log').textContent = ''; canvasSession = ''; $('canvas-state').textContent = ''; reloadCanvas(); }

function onMessage(m) {
  if (m.kind === 'canvas') { onCanvas(m); return; }
  if (m.chat !== chatId()) return;
  if (m.kind === 'delta') {
    if (!streaming) streaming = addLine('agent', '', 'agent streaming');
    if (m.restart) streaming.textContent = '';
    streaming.textContent += m.text;
  } else if (m.kind === 'reply' || m.kind === 'error') {
    const li = streaming || addLine('agent', '');
    streaming = null;
    li.textContent = m.text;
    li.className = m.kind === 'error' ? 'agent error' : 'agent';
    if (m.kind === 'error') li.dataset.who = 'error';
  } else if (m.kind === 'approval' && m.approval) {
    const li = addLine('approval', m.text, 'note');
    li.append(' ', answerButtons(m.approval.id));
  } else if (m.kind === 'progress' && m.progress) {
    addLine('tool', (m.progress.event || '').replace('_', ' ') + ' ' + (m.progress.tool || ''), 'note');
  }
}

function answerButtons(id) {
  const span = el('span');
  for (const [label, decision] of [['Approve', 'approve'], ['Always', 'always'], ['Deny', 'deny']]) {
    const b = el('button', label, { type: 'button', 'data-approval': id, 'data-decision': decision });
    b.addEventListener('click', async () => {
      try {
        await api('admin/approvals/answer', { id, decision });
        span.textContent = decision === 'deny' ? 'denied' : 'approved';
        loadApprovals();
      } catch (e) { notice(e.message); }
    });
    span.append(b, ' ');
  }
  return span;
}

// Text goes as JSON; with files, as a form (the gateway takes them like a platform's
// attachments: size-capped, typed by their bytes, saved in the agent's inbox).
async function send(text, files) {
  try {
    if (files && files.length) {
      const f = new FormData();
      f.append('chat', chatName());
      f.append('agent', chatAgent());
      f.append('content', text);
      for (const file of files) f.append('file', file, file.name);
      const r = await fetch('/ui/api/chat', { method: 'POST', headers: { 'X-CSRF-Token': csrf }, body: f });
      const v = await r.json().catch(() => ({}));
      if (!r.ok) throw new Error(v.error || ('HTTP ' + r.status));
    } else {
      await api('chat', { chat: chatName(), agent: chatAgent(), content: text });
    }
  } catch (e) { notice(e.message); }
}

$('chat-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = $('chat-input').value;
  const files = [...$('chat-files').files];
  if (!text.trim() && !files.length) return;
  addLine('you', text + files.map((f) => ' [' + f.name + ']').join(''), 'you');
  $('chat-input').value = '';
  $('chat-files').value = '';
  send(text, files);
});
$('chat-input').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) {
    ev.preventDefault();
    $('chat-form').requestSubmit();
  }
});
$('chat-stop').addEventListener('click', () => send('/stop'));
$('chat-name').addEventListener('change', chatChanged);
$('chat-agent').addEventListener('change', chatChanged);
function fillAgents(agents) {
  const sel = $('chat-agent');
  sel.replaceChildren(el('option', '(as bound)', { value: '' }), ...(agents || []).map((a) => el('option', a, { value: a })));
}
$('canvas-reload').addEventListener('click', reloadCanvas);

// ---- approvals ----
async function loadApprovals() {
  const v = await api('admin/approvals/list', {});
  const rows = (v.approvals || []).map((a) => {
    const tr = el('tr', null, { 'data-id': a.id });
    const answer = el('td');
    if (a.state === 'pending') answer.append(answerButtons(a.id)); else answer.textContent = '—';
    tr.append(el('td', a.id), el('td', a.session), el('td', a.command), el('td', a.state), answer);
    return tr;
  });
  $('approvals-rows').replaceChildren(...rows);
}

// ---- usage ----
async function loadUsage() {
  const v = await api('admin/usage', { by: $('usage-by').value, days: Number($('usage-days').value) || 30 });
  $('usage-json').textContent = JSON.stringify(v, null, 2);
  const rows = v.rows || [];
  const cols = rows.length ? Object.keys(rows[0]) : [];
  $('usage-table').tHead.replaceChildren(el('tr'));
  $('usage-table').tHead.rows[0].append(...cols.map((c) => el('th', c, { scope: 'col' })));
  $('usage-table').tBodies[0].replaceChildren(...rows.map((r) => {
    const tr = el('tr');
    tr.append(...cols.map((c) => el('td', typeof r[c] === 'object' ? JSON.stringify(r[c]) : r[c])));
    return tr;
  }));
}
$('usage-form').addEventListener('submit', (ev) => { ev.preventDefault(); loadUsage().catch((e) => notice(e.message)); });

// ---- sessions: search (server-side, paged), window, usage, compact, reset ----
let sessionsOffset = 0;
function num(n) { return (n || 0).toLocaleString(); }
async function loadSessions() {
  const v = await api('admin/sessions/search', {
    q: $('sessions-q').value, channel: $('sessions-channel').value, offset: sessionsOffset, limit: 25,
  });
  $('sessions-rows').replaceChildren(...(v.sessions || []).map((s) => {
    const tr = el('tr', null, { 'data-key': s.key });
    const a = el('a', s.key, { href: '#sessions' });
    a.addEventListener('click', (ev) => { ev.preventDefault(); showTranscript(s.key); });
    const td = el('td');
    td.append(a);
    if (s.snippet) td.append(el('br'), el('small', s.match + ': ' + s.snippet));
    const w = s.window || {};
    const u = s.usage || {};
    const act = el('td');
    const compact = el('button', 'Compact', { type: 'button', 'data-action': 'compact' });
    compact.addEventListener('click', () => {
      api('admin/sessions/compact', { session: s.key })
        .then(() => notice('Compacting ' + s.key + ': its chat gets the usual notice.'))
        .catch((e) => notice(e.message));
    });
    const reset = el('button', 'Reset', { type: 'button' });
    reset.addEventListener('click', () => {
      if (!confirm('Reset ' + s.key + '? Its transcript is cleared.')) return;
      api('sessions/' + encodeURIComponent(s.key) + '/clear', {}).then(loadSessions).catch((e) => notice(e.message));
    });
    act.append(compact, ' ', reset);
    tr.append(td, el('td', s.channel), el('td', (s.users || []).join(', ')),
      el('td', num(w.in_window) + ' / ' + num(w.stored), { 'data-col': 'window' }),
      el('td', '≈' + num(w.tokens_estimate), { 'data-col': 'tokens' }),
      el('td', num((u.input_tokens || 0) + (u.output_tokens || 0)) + ' tok, $' + (u.cost_usd || 0).toFixed(4), { 'data-col': 'usage' }),
      el('td', new Date(s.updated_ms).toLocaleString()), act);
    return tr;
  }));
  const from = v.offset + 1;
  const to = v.offset + (v.sessions || []).length;
  $('sessions-page').textContent = (to >= from ? from + '–' + to : 'none') + ' of ' + v.total_sessions + ' stored sessions'
    + (v.text_search_incomplete ? ' (the text search stopped early: narrow it by channel)' : '');
  $('sessions-prev').disabled = v.offset === 0;
  $('sessions-next').disabled = v.next_offset === null || v.next_offset === undefined;
}
$('sessions-form').addEventListener('submit', (ev) => { ev.preventDefault(); sessionsOffset = 0; loadSessions().catch((e) => notice(e.message)); });
$('sessions-prev').addEventListener('click', () => { sessionsOffset = Math.max(0, sessionsOffset - 25); loadSessions().catch((e) => notice(e.message)); });
$('sessions-next').addEventListener('click', () => { sessionsOffset += 25; loadSessions().catch((e) => notice(e.message)); });
async function showTranscript(key) {
  const v = await api('sessions/' + encodeURIComponent(key));
  const w = v.window || {};
  $('transcript-title').textContent = key + ': ' + (w.in_window ?? '?') + ' of ' + (w.stored ?? '?')
    + ' messages in the window, ≈' + (w.tokens_estimate ?? '?') + ' tokens, ' + (w.compactions || 0) + ' compactions';
  $('transcript').replaceChildren(...(v.messages || []).map((m) => {
    const text = typeof m.content === 'string' ? m.content : JSON.stringify(m.content ?? m);
    return el('li', (m.role || '') + ': ' + text);
  }));
}

// ---- automations, channels, MCP ----
function cell(v) {
  if (v === null || v === undefined) return '';
  return typeof v === 'object' ? JSON.stringify(v) : String(v);
}
// A table of `rows` (objects) with the columns `cols`, and per row the buttons `actions(row)`.
function fill(table, rows, cols, actions) {
  const head = el('tr');
  head.append(...cols.map((c) => el('th', c, { scope: 'col' })), el('th', 'Actions', { scope: 'col' }));
  table.tHead.replaceChildren(head);
  table.tBodies[0].replaceChildren(...rows.map((r) => {
    const tr = el('tr');
    tr.append(...cols.map((c) => el('td', cell(r[c]))));
    const td = el('td');
    for (const [label, fn] of actions(r)) {
      const b = el('button', label, { type: 'button' });
      b.addEventListener('click', () => fn().then(loadOps).catch((e) => notice(e.message)));
      td.append(b, ' ');
    }
    tr.append(td);
    return tr;
  }));
}
async function loadOps() {
  const [cron, pairing, mcp, nodes, status, config] = await Promise.all([
    api('admin/cron/list', {}), api('admin/pairing/list', {}), api('admin/mcp/list', {}),
    api('admin/nodes/list', {}).catch(() => ({ nodes: [] })), api('status').catch(() => ({})),
    api('admin/config/show', {}).catch(() => ({ rows: [] })),
  ]);
  const hb = (status.scheduler || {}).heartbeat || {};
  $('heartbeat').textContent = hb.enabled
    ? 'Heartbeat: every ' + hb.every_secs + ' s, to ' + cell(hb.target) : 'Heartbeat: off';
  // Who may talk to each channel without pairing (the allow_from settings, with their origin).
  $('allow-list').replaceChildren(...(config.rows || []).filter((r) => r.key.endsWith('allow_from'))
    .map((r) => el('li', r.key + ': ' + (r.value || '(nobody: pairing only)') + ' — ' + r.source)));
  if (!$('allow-list').children.length) $('allow-list').append(el('li', '(no chat platform configured)'));
  const chans = Object.entries(status.channels || {}).map(([channel, state]) => ({ channel, state }));
  fill($('channels-table'), chans, ['channel', 'state'], () => []);
  fill($('cron-table'), cron.jobs || [], ['id', 'name', 'enabled', 'schedule', 'next_run', 'last_run'], (j) => [
    ['Run now', () => api('admin/cron/run', { id: j.id })],
    ['History', () => api('admin/cron/runs', { id: j.id }).then((v) => {
      $('cron-runs').textContent = 'Runs of ' + j.id + ' (newest first):\n' + (v.runs || []).map(cell).join('\n');
    })],
    [j.enabled ? 'Pause' : 'Resume', () => api('admin/cron/update', { id: j.id, enabled: !j.enabled })],
    ['Remove', () => api('admin/cron/remove', { id: j.id })],
  ]);
  fill($('pairing-table'), pairing.pending || [], ['code', 'channel', 'user', 'chat'], (p) => [
    ['Approve', () => api('admin/pairing/approve', { code: p.code })],
  ]);
  $('paired-list').replaceChildren(...(pairing.paired || []).map((w) => {
    const li = el('li', cell(w) + ' ');
    const b = el('button', 'Revoke', { type: 'button' });
    b.addEventListener('click', () => api('admin/pairing/revoke', { who: cell(w) }).then(loadOps).catch((e) => notice(e.message)));
    li.append(b);
    return li;
  }));
  const servers = Array.isArray(mcp) ? mcp : [];
  fill($('mcp-table'), servers, ['name', 'transport', 'state', 'tools', 'last_error'], (m) => [
    ['Restart', () => api('admin/mcp/restart', { name: m.name })],
  ]);
  $('gateway-key').textContent = nodes.gateway_fingerprint
    ? 'This gateway\'s key (a node pins it at pairing): ' + nodes.gateway_fingerprint : '';
  fill($('nodes-table'), nodes.nodes || [], ['name', 'id', 'state', 'online', 'offers', 'fingerprint', 'addr'], (n) =>
    n.state === 'pending'
      ? [['Approve', () => api('admin/nodes/approve', { id: n.id })], ['Deny', () => api('admin/nodes/deny', { id: n.id })]]
      : [['Revoke', () => api('admin/nodes/revoke', { id: n.id })]]);
}

// ---- logs ----
let logNext = 0;
async function loadLogs(fresh) {
  if (fresh) { logNext = 0; $('log-lines').textContent = ''; }
  const v = await api('admin/logs/tail', { after: logNext, level: $('log-level').value });
  logNext = v.next || logNext;
  const pre = $('log-lines');
  const lines = (v.lines || []).map((l) => l.text).join('\n');
  if (lines) pre.textContent += (pre.textContent ? '\n' : '') + lines;
  // Keep the last 2,000 lines on the page.
  const all = pre.textContent.split('\n');
  if (all.length > 2000) pre.textContent = all.slice(-2000).join('\n');
}
$('log-level').addEventListener('change', () => loadLogs(true).catch((e) => notice(e.message)));

// ---- config: the configuration in force, where each value came from; validate, reload ----
async function loadConfig() {
  const v = await api('admin/config/show', {});
  $('config-path').textContent = 'Config file: ' + (v.path || 'none (defaults and the environment)');
  const f = $('config-filter').value.trim().toLowerCase();
  $('config-table').tBodies[0].replaceChildren(...(v.rows || [])
    .filter((r) => !f || (r.key + ' ' + r.value + ' ' + r.source).toLowerCase().includes(f))
    .map((r) => {
      const tr = el('tr', null, { 'data-key': r.key });
      tr.append(el('td', r.key), el('td', r.value), el('td', r.source, { class: 'source' }));
      return tr;
    }));
}
// A report: a title line and a list of items (errors marked as such, not only by colour).
function configReport(title, items, bad) {
  const box = $('config-report');
  box.replaceChildren(el('p', (bad ? 'Error: ' : '') + title));
  box.className = bad ? 'bad' : '';
  if (items.length) box.append(el('ul'));
  for (const i of items) box.lastChild.append(el('li', i));
}
$('config-validate').addEventListener('click', async () => {
  try {
    const v = await api('admin/config/validate', {});
    if (v.valid) configReport('The file is valid: a reload would apply it.', []);
    else configReport('The file is not valid' + (v.key ? ' (key ' + v.key + ')' : '') + '; a reload would be refused.', [v.error], true);
  } catch (e) { notice(e.message); }
});
$('config-reload').addEventListener('click', async () => {
  try {
    const v = await api('admin/config/reload', {});
    if (v.status === 'reloaded') configReport('Reloaded:', v.changes || []);
    else configReport('Reload refused; nothing was applied and the running configuration stays' + (v.key ? ' (key ' + v.key + ')' : '') + '.', [v.error], true);
    await loadConfig();
  } catch (e) { notice(e.message); }
});
$('config-filter').addEventListener('input', () => loadConfig().catch((e) => notice(e.message)));

// ---- agents, skills, memory ----
async function loadAgents() {
  const v = await api('admin/agents/list', {});
  const agents = v.agents || [];
  const sel = $('memory-agent');
  const was = sel.value;
  sel.replaceChildren(...agents.map((a) => el('option', a.name)));
  if (was) sel.value = was;
  $('agents-list').replaceChildren(...agents.map((a) => {
    const d = el('section', null, { 'data-agent': a.name });
    const tools = a.tools || {};
    d.append(el('h2', a.name + (a.default ? ' (default)' : '')));
    const dl = el('dl');
    for (const [k, val] of [
      ['Model', a.model], ['Providers', (a.providers || []).join(', ')], ['Workspace', a.workspace],
      ['Bindings', (a.bindings || []).join('; ') || 'none (the default agent answers what no binding routes)'],
      ['Tools offered', (tools.offered || []).join(', ')],
      ['Tools loaded on demand (tool_search)', (tools.deferred || []).join(', ')],
      ['Skills', (a.skills || []).map((s) => s.name + ' (' + s.source + '): ' + s.description).join('; ') || 'none'],
    ]) dl.append(el('dt', k), el('dd', val || '—'));
    d.append(dl);
    return d;
  }));
  await loadMemoryDocs();
}
async function loadMemoryDocs() {
  const v = await api('admin/memory/list', { agent: $('memory-agent').value });
  $('memory-docs').tBodies[0].replaceChildren(...(v.documents || []).map((d) => {
    const tr = el('tr');
    tr.append(el('td', d.path), el('td', d.bytes), el('td', new Date(d.modified_ms).toLocaleString()));
    return tr;
  }));
}
$('memory-agent').addEventListener('change', () => loadMemoryDocs().catch((e) => notice(e.message)));
$('memory-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  try {
    const v = await api('admin/memory/search', { agent: $('memory-agent').value, query: $('memory-query').value });
    const hits = (v.results || []).map((h) => {
      const li = el('li', h.path + ':' + h.start_line + '-' + h.end_line, { 'data-path': h.path });
      li.append(el('pre', h.snippet));
      return li;
    });
    $('memory-results').replaceChildren(...(hits.length ? hits : [el('li', 'No memory matches.')]));
  } catch (e) { notice(e.message); }
});

// ---- status ----
async function loadStatus() {
  $('status-json').textContent = JSON.stringify(await api('status'), null, 2);
}

// ---- navigation ----
const loaders = { approvals: loadApprovals, usage: loadUsage, sessions: loadSessions, ops: loadOps, logs: () => loadLogs(true), status: loadStatus };
function show() {
  const page = (location.hash || '#chat').slice(1);
  for (const s of document.querySelectorAll('main > section')) s.hidden = s.id !== 'page-' + page;
  for (const a of document.querySelectorAll('nav a')) {
    if (a.getAttribute('href') === '#' + page) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  notice('');
  if (loaders[page]) loaders[page]().catch((e) => notice(e.message));
}
Object.assign(loaders, { config: loadConfig, agents: loadAgents });
window.addEventListener('hashchange', show);

$('logout').addEventListener('click', async () => {
  await api('logout', {}).catch(() => {});
  location.replace('/ui/login');
});

(async () => {
  try {
    const me = await api('me');
    csrf = me.csrf || '';
    $('me').textContent = 'Logged in (' + me.role + ')';
    fillAgents(me.agents);
    document.body.dataset.role = me.role;
  } catch (e) { return; }
  const es = new EventSource('/ui/api/events');
  es.addEventListener('message', (ev) => {
    let m;
    try { m = JSON.parse(ev.data); } catch (e) { return; }
    onMessage(m);
    if (m.kind === 'approval' && !$('page-approvals').hidden) loadApprovals().catch(() => {});
  });
  es.addEventListener('open', () => { document.body.dataset.live = 'yes'; });
  setInterval(() => {
    if (!$('page-approvals').hidden) loadApprovals().catch(() => {});
    if (!$('page-ops').hidden) loadOps().catch(() => {});
  }, 5000);
  setInterval(() => { if (!$('page-logs').hidden) loadLogs(false).catch(() => {}); }, 2000);
  reloadCanvas();
  show();
})();
