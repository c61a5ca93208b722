'use strict';
// The control UI: hand-written, no framework, no build step. Data comes from /ui/api (the same
// admin handles as the CLI); the web chat's replies arrive over SSE (/ui/api/events).
// Model and user text is only ever put in the page as text (textContent): never as HTML.
const $ = (id) => document.getElementById(id);
let csrf = '';

function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
// An element holding `kids` (nodes or text).
function box(tag, attrs, ...kids) {
  const e = el(tag, null, attrs);
  e.append(...kids.filter((k) => k !== null && k !== undefined && k !== ''));
  return e;
}

function notice(text) {
  const n = $('notice');
  n.textContent = text || '';
  n.hidden = !text;
}

let signedOut = false;
async function api(path, body) {
  const opt = body === undefined ? {} : {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrf },
    body: JSON.stringify(body),
  };
  const r = await fetch('/ui/api/' + path, opt);
  const v = await r.json().catch(() => ({}));
  if (r.status === 401) signedOut = true;
  if (!r.ok) throw new Error(v.error || ('HTTP ' + r.status));
  return v;
}
const fail = (e) => notice(e.message);

// ---- words for numbers and times ----
function num(n) { return (n || 0).toLocaleString('en'); }
function money(usd) {
  const v = Number(usd) || 0;
  if (v === 0) return '$0';
  if (v < 0.01) return '<$0.01';
  return '$' + v.toLocaleString('en', { minimumFractionDigits: 2, maximumFractionDigits: 2 });
}
function kilo(n) {
  const v = Number(n) || 0;
  if (v < 1000) return String(v);
  if (v < 1e6) return (v / 1000).toLocaleString('en', { maximumFractionDigits: v < 1e4 ? 1 : 0 }) + 'k';
  return (v / 1e6).toLocaleString('en', { maximumFractionDigits: 1 }) + 'M';
}
function bytes(n) {
  const v = Number(n) || 0;
  if (v < 1024) return v + ' B';
  if (v < 1048576) return (v / 1024).toFixed(1) + ' KB';
  return (v / 1048576).toFixed(1) + ' MB';
}
function ms(t) { return typeof t === 'string' ? Date.parse(t) : Number(t); }
// "in 5 min", "3 h ago".
function rel(t) {
  const d = ms(t) - Date.now();
  if (!Number.isFinite(d)) return '';
  const a = Math.abs(d);
  const s = a < 60e3 ? Math.round(a / 1e3) + ' s' : a < 3600e3 ? Math.round(a / 60e3) + ' min'
    : a < 172800e3 ? Math.round(a / 3600e3) + ' h' : Math.round(a / 86400e3) + ' days';
  return d >= 0 ? 'in ' + s : s + ' ago';
}
function local(t) {
  const d = new Date(ms(t));
  return Number.isFinite(d.getTime()) ? d.toLocaleString('en-GB', { dateStyle: 'medium', timeStyle: 'short' }) : '';
}
// A time as a <time>: relative in words, the local date on hover.
function when(t) {
  if (t === null || t === undefined || t === '' || !ms(t)) return el('span', '—');
  return el('time', rel(t), { datetime: new Date(ms(t)).toISOString(), title: local(t) });
}
function duration(secs) {
  const s = Number(secs) || 0;
  if (s % 86400 === 0) return (s / 86400) + (s === 86400 ? ' day' : ' days');
  if (s % 3600 === 0) return (s / 3600) + (s === 3600 ? ' hour' : ' hours');
  if (s % 60 === 0) return (s / 60) + (s === 60 ? ' minute' : ' minutes');
  return s + ' seconds';
}
const DAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];
const two = (n) => String(n).padStart(2, '0');
// A cron expression in words when it is one of the usual shapes; the expression itself otherwise.
function cronWords(expr) {
  const f = expr.trim().split(/\s+/);
  if (f.length === 6) f.shift();
  if (f.length !== 5) return 'cron ' + expr;
  const [mi, h, dom, mon, dow] = f;
  const isN = (x) => /^\d+$/.test(x);
  const step = /^\*\/(\d+)$/;
  if (step.test(mi) && h === '*' && dom === '*' && mon === '*' && dow === '*') return 'every ' + mi.match(step)[1] + ' minutes';
  if (isN(mi) && h === '*' && dom === '*' && mon === '*' && dow === '*') return 'every hour at :' + two(mi);
  if (isN(mi) && step.test(h) && dom === '*' && mon === '*' && dow === '*') return 'every ' + h.match(step)[1] + ' hours at :' + two(mi);
  if (isN(mi) && isN(h) && mon === '*') {
    const at = two(h) + ':' + two(mi);
    if (dom === '*' && dow === '*') return 'every day at ' + at;
    if (dom === '*' && (dow === '1-5' || /^mon-fri$/i.test(dow))) return 'weekdays at ' + at;
    if (dom === '*' && isN(dow)) return 'every ' + DAYS[Number(dow) % 7] + ' at ' + at;
    if (isN(dom) && dow === '*') return 'on day ' + dom + ' of every month at ' + at;
  }
  return 'cron ' + expr;
}
function scheduleWords(s) {
  if (!s || typeof s !== 'object') return String(s || '');
  if (s.kind === 'every') return 'every ' + duration(s.seconds);
  if (s.kind === 'at') return 'once, ' + local(s.at);
  if (s.kind === 'cron') return cronWords(s.expr || '') + ' ' + (s.tz || 'UTC');
  return s.kind || '';
}
function chips(list) {
  const span = el('span');
  for (const x of list || []) span.append(el('span', typeof x === 'string' ? x : (x.name || x.id || String(x)), { class: 'chip' }));
  return span;
}
// A coloured state dot with words (never colour alone).
function stateItem(level, label, words, extra) {
  const li = el('li', null, { class: 'dot s-' + level });
  li.append(el('strong', label), ' ', el('span', words, { class: 'word' }));
  if (extra) li.append(' ', extra);
  return li;
}
// The level of a channel's state line: connected/listening is ok, failures bad, the rest waits.
function channelLevel(state) {
  const s = String(state).toLowerCase();
  if (/fail|refused|error|invalid|unauthori|not answering|stopped|gave up/.test(s)) return 'bad';
  if (/reconnect|connecting|starting|retry|waiting/.test(s)) return 'warn';
  if (/connected|listening|running|ready|open|serving/.test(s)) return 'ok';
  return 'idle';
}

// ---- tables ----
// Fill `table` with `rows`: `cols` are [header, (row) => text or node, class?]; `actions(row)`
// gives [label, fn, done-text?] buttons; an empty list shows `empty` across the table.
function fill(table, rows, cols, actions, empty) {
  const head = el('tr');
  head.append(...cols.map(([h, , cls]) => el('th', h, { scope: 'col', class: cls || '' })));
  if (actions) head.append(el('th', 'Actions', { scope: 'col' }));
  table.tHead.replaceChildren(head);
  if (!rows.length) {
    const tr = el('tr');
    tr.append(el('td', empty || 'Nothing yet.', { colspan: String(cols.length + (actions ? 1 : 0)), class: 'empty' }));
    table.tBodies[0].replaceChildren(tr);
    return;
  }
  table.tBodies[0].replaceChildren(...rows.map((r) => {
    const tr = el('tr');
    for (const [h, f, cls] of cols) {
      const v = f(r);
      const td = el('td', null, { 'data-label': h, class: cls || '' });
      if (v instanceof Node) td.append(v); else td.textContent = v === null || v === undefined ? '' : String(v);
      tr.append(td);
    }
    if (actions) {
      const td = el('td', null, { class: 'actions', 'data-label': 'Actions' });
      for (const [label, fn, done] of actions(r)) {
        const b = el('button', label, { type: 'button', 'data-operator': '' });
        b.addEventListener('click', () => {
          b.disabled = true;
          fn().then((v) => { if (done) notice(typeof done === 'function' ? done(v) : done); return loadOps(); })
            .catch(fail).finally(() => { b.disabled = false; });
        });
        td.append(b, ' ');
      }
      tr.append(td);
    }
    return tr;
  }));
}
function trunc(text) { return el('span', text, { class: 'trunc', title: text }); }

// ---- Markdown (a safe subset: paragraphs, headings, lists, code, emphasis, links) ----
function inline(text) {
  const frag = document.createDocumentFragment();
  const re = /(`[^`]+`)|(\*\*[^*]+\*\*)|(\*[^*\s][^*]*\*|_[^_\s][^_]*_)|(\[[^\]]+\]\((https?:\/\/[^)\s]+)\))/g;
  let last = 0;
  let m;
  while ((m = re.exec(text))) {
    if (m.index > last) frag.append(text.slice(last, m.index));
    if (m[1]) frag.append(el('code', m[1].slice(1, -1)));
    else if (m[2]) frag.append(el('strong', m[2].slice(2, -2)));
    else if (m[3]) frag.append(el('em', m[3].slice(1, -1)));
    else if (m[4]) frag.append(el('a', m[4].slice(1, m[4].indexOf('](')), { href: m[5], rel: 'noopener noreferrer', target: '_blank' }));
    last = re.lastIndex;
  }
  if (last < text.length) frag.append(text.slice(last));
  return frag;
}
function markdown(src) {
  const out = document.createDocumentFragment();
  const lines = String(src || '').split('\n');
  let i = 0;
  while (i < lines.length) {
    const l = lines[i];
    if (/^```/.test(l)) {
      const body = [];
      i++;
      while (i < lines.length && !/^```/.test(lines[i])) body.push(lines[i++]);
      i++;
      out.append(el('pre', body.join('\n')));
    } else if (/^#{1,6}\s/.test(l)) {
      const h = el('p');
      h.append(box('strong', {}, inline(l.replace(/^#+\s*/, ''))));
      out.append(h);
      i++;
    } else if (/^\s*([-*+]|\d+[.)])\s+/.test(l)) {
      const ordered = /^\s*\d/.test(l);
      const list = el(ordered ? 'ol' : 'ul');
      while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
        list.append(box('li', {}, inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ''))));
        i++;
      }
      out.append(list);
    } else if (!l.trim()) {
      i++;
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() && !/^(```|#{1,6}\s|\s*([-*+]|\d+[.)])\s)/.test(lines[i])) para.push(lines[i++]);
      const p = el('p');
      para.forEach((t, k) => { if (k) p.append(el('br')); p.append(inline(t)); });
      out.append(p);
    }
  }
  return out;
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
// ---- canvas (live: the gateway pushes a `canvas` event at each change; shown only when the
// session has one) ----
let canvasSession = '';
function guessCanvasSession() {
  const a = chatAgent();
  return (a && a !== 'main' ? '@' + a + ':' : '') + 'web:' + chatId();
}
function reloadCanvas() {
  $('canvas').src = '/ui/canvas/' + encodeURIComponent(canvasSession || guessCanvasSession());
}
function showCanvas(c) {
  $('canvas-panel').hidden = !c.visible;
  $('canvas-state').textContent = c.visible ? 'Shown: ' + (c.title || '(untitled)') + ' (version ' + c.version + ')' : 'Hidden';
}
async function checkCanvas() {
  const c = await api('admin/canvas/get', { session: canvasSession || guessCanvasSession() }).catch(() => ({}));
  showCanvas(c || {});
  if (c && c.visible) reloadCanvas();
}
function onCanvas(m) {
  if (m.channel !== 'web' || m.chat !== chatId()) return;
  canvasSession = m.session;
  showCanvas(m);
  reloadCanvas();
}
function chatChanged() { $('chat-log').textContent = ''; canvasSession = ''; $('canvas-state').textContent = ''; $('canvas-panel').hidden = true; checkCanvas(); }

// Tool calls of the current turn, by call id: a collapsible card each, with the arguments
// when the call starts and the result when it ends (as the transcript keeps them: credentials
// masked, secrets scrubbed; long ones cut by the gateway, the whole text is in the transcript).
const toolCards = new Map();
function callPart(label, text, part) {
  const pre = el('pre', shown(text), { class: 'capped', tabindex: '0' });
  return box('div', { 'data-part': part }, el('p', label), pre);
}
function toolCard(p) {
  let card = toolCards.get(p.call_id);
  if (!card) {
    const li = el('li', null, { 'data-who': 'tool', class: 'note' });
    card = el('details', null, { class: 'tool' });
    card.append(el('summary'));
    li.append(card);
    $('chat-log').append(li);
    toolCards.set(p.call_id, card);
  }
  const state = p.event === 'tool_started' ? 'running…' : p.error_code ? 'failed (' + p.error_code + ')' : 'done';
  card.firstChild.textContent = (p.tool || 'tool') + ' — ' + state;
  if (typeof p.arguments === 'string' && !card.querySelector('[data-part=arguments]')) card.append(callPart('Arguments:', p.arguments, 'arguments'));
  if (typeof p.result === 'string' && !card.querySelector('[data-part=result]')) card.append(callPart(p.error_code ? 'Error:' : 'Result:', p.result, 'result'));
  const cut = / more characters\)$/.test((p.arguments || '') + '') || / more characters\)$/.test((p.result || '') + '');
  if (cut && !card.querySelector('[data-part=more]')) {
    const more = el('p', 'Cut here: the whole call is in the transcript on ', { class: 'muted', 'data-part': 'more' });
    more.append(el('a', 'Sessions', { href: '#sessions' }), '.');
    card.append(more);
  }
  return card;
}
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
    li.replaceChildren(m.kind === 'error' ? document.createTextNode(m.text) : markdown(m.text));
    li.className = m.kind === 'error' ? 'agent error' : 'agent';
    if (m.kind === 'error') li.dataset.who = 'error';
    toolCards.clear();
  } else if (m.kind === 'approval' && m.approval) {
    const li = addLine('approval', null, 'note');
    const at = new Date();
    const until = new Date(at.getTime() + approvalTimeoutSecs * 1000);
    const hm = (d) => d.toLocaleTimeString('en-GB', { hour: '2-digit', minute: '2-digit' });
    const asked = el('p', 'Asked at ' + hm(at) + (approvalTimeoutSecs ? ', it expires unanswered at ' + hm(until) + ' (then the command does not run)' : '')
      + '. An operator answers here, on the Approvals page, or in the chat with /approve ' + m.approval.id + '.', { class: 'muted' });
    li.append(el('p', 'The agent asks to run:'), el('pre', m.approval.command || m.text), asked, answerButtons(m.approval.id));
  } else if (m.kind === 'progress' && m.progress) {
    toolCard(m.progress);
  }
}

function answerButtons(id) {
  const span = el('span');
  for (const [label, decision] of [['Approve', 'approve'], ['Always', 'always'], ['Deny', 'deny']]) {
    const b = el('button', label, { type: 'button', 'data-approval': id, 'data-decision': decision, 'data-operator': '' });
    b.addEventListener('click', async () => {
      try {
        await api('admin/approvals/answer', { id, decision });
        span.textContent = decision === 'deny' ? 'Denied.' : 'Approved.';
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
// Who may answer a pending approval, in words (tools.exec.approvers and approver_ids, judged
// by the gateway when the answer arrives; see the security guide's "Who may approve").
function mayAnswer(a) {
  const m = a.may_answer;
  if (a.state !== 'pending' || !m) return '—';
  const ids = m.approver_ids || [];
  const listed = ids.length ? ids.join(', ') + ' (from any chat)' : '';
  const span = el('span');
  if (m.approvers === 'operator') {
    span.append(el('strong', 'Operator only'), ': here, weft approvals' + (listed ? ', or ' + listed : '') + '.');
  } else {
    span.append(el('strong', 'The chat'), ': anyone in ' + a.session + ', or an operator' + (listed ? ', or ' + listed : '') + '.');
  }
  span.append(el('br'), el('small', (m.on_node ? 'A command on a node. ' : '') + 'Anyone in the chat may deny.'));
  return span;
}
let approvalTimeoutSecs = 0;
async function loadApprovals() {
  const v = await api('admin/approvals/list', {});
  const list = v.approvals || [];
  if (!list.length) {
    $('approvals-rows').replaceChildren(box('tr', {}, el('td', 'No approvals. When an agent asks to run a command (tools.exec.mode = "ask"), it appears here and in its chat.', { colspan: '6', class: 'empty' })));
    return;
  }
  $('approvals-rows').replaceChildren(...list.map((a) => {
    const tr = el('tr', null, { 'data-id': a.id });
    const answer = el('td', null, { 'data-label': 'Answer', class: 'actions' });
    if (a.state === 'pending') answer.append(answerButtons(a.id)); else answer.textContent = '—';
    const asked = el('td', null, { 'data-label': 'Asked' });
    if (a.asked_ms) {
      asked.append(when(a.asked_ms));
      if (a.state === 'pending' && approvalTimeoutSecs) asked.append(el('br'), el('small', 'expires ' + rel(a.asked_ms + approvalTimeoutSecs * 1000)));
    } else asked.textContent = 'before the last restart';
    tr.append(box('td', { 'data-label': 'Asked in' }, a.session + (a.node ? ' (on ' + a.node + ')' : '')),
      box('td', { 'data-label': 'Command' }, el('code', a.command)), asked,
      el('td', a.state, { 'data-label': 'State' }), box('td', { 'data-label': 'Who may answer', 'data-col': 'who' }, mayAnswer(a)), answer);
    return tr;
  }));
}

// ---- usage: a stacked bar chart per day (hand-drawn SVG) and a table ----
const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function lastDays(n) {
  const out = [];
  const now = Date.now();
  for (let i = n - 1; i >= 0; i--) out.push(new Date(now - i * 86400e3).toISOString().slice(0, 10));
  return out;
}
function measureOf(r, m) { return m === 'cost' ? (r.cost_usd || 0) : (r.input_tokens || 0) + (r.output_tokens || 0); }
function drawChart(stacked, days, measure) {
  const rows = new Map((stacked.rows || []).map((r) => [r.key, r]));
  const keys = [...new Set((stacked.rows || []).flatMap((r) => (r.parts || []).map((p) => p.key)))].sort();
  const fmt = (v) => (measure === 'cost' ? money(v) : kilo(v) + ' tokens');
  const chart = $('usage-chart');
  // Drawn at the width it is shown (1 unit = 1 CSS pixel: the labels keep their size).
  const W = Math.max(300, Math.round(chart.clientWidth || 720));
  const H = W < 600 ? 180 : 240;
  const L = 52;
  const B = 22;
  const top = Math.max(...[...rows.values()].map((r) => measureOf(r, measure)), 0);
  if (!top) {
    chart.replaceChildren(el('p', 'No ' + (measure === 'cost' ? 'spend' : 'tokens') + ' in the last ' + days.length + ' days. Usage appears here once an agent has answered (each model call is counted).', { class: 'muted' }));
    $('usage-legend').textContent = '';
    return;
  }
  const s = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': 'Usage per day, stacked by ' + stacked.stack });
  const bw = (W - L) / days.length;
  const y = (v) => (H - B) - (v / top) * (H - B - 8);
  s.append(svg('line', { x1: L, x2: W, y1: H - B, y2: H - B, class: 'axis' }), svg('line', { x1: L, x2: W, y1: y(top), y2: y(top), class: 'axis' }));
  s.append(svg('text', { x: L - 4, y: y(top) + 4, 'text-anchor': 'end' }, measure === 'cost' ? money(top) : kilo(top)), svg('text', { x: L - 4, y: H - B + 4, 'text-anchor': 'end' }, measure === 'cost' ? '$0' : '0'));
  days.forEach((d, i) => {
    const r = rows.get(d);
    const x = L + i * bw + bw * 0.15;
    let acc = 0;
    const g = svg('g', { 'data-day': d, 'data-value': r ? measureOf(r, measure) : 0 });
    for (const p of (r && r.parts) || []) {
      const v = measureOf(p, measure);
      if (!v) continue;
      const rect = svg('rect', { x: x.toFixed(1), width: (bw * 0.7).toFixed(1), y: y(acc + v).toFixed(1), height: Math.max(0.5, y(acc) - y(acc + v)).toFixed(1), class: 'c' + (keys.indexOf(p.key) % 8), 'data-key': p.key, 'data-value': v });
      rect.append(svg('title', {}, d + ' · ' + (p.key || '(none)') + ': ' + fmt(v)));
      g.append(rect);
      acc += v;
    }
    if (r) g.append(svg('title', {}, d + ': ' + fmt(measureOf(r, measure))));
    s.append(g);
    const every = Math.max(1, Math.ceil(days.length / Math.floor((W - L) / 48)));
    if (i === days.length - 1 || (i % every === 0 && days.length - 1 - i >= every)) {
      const anchor = i === days.length - 1 ? 'end' : i === 0 ? 'start' : 'middle';
      const tx = anchor === 'end' ? W - 2 : anchor === 'start' ? L : x + bw * 0.35;
      s.append(svg('text', { x: tx.toFixed(1), y: H - 6, 'text-anchor': anchor }, d.slice(5)));
    }
  });
  chart.replaceChildren(s);
  const legend = $('usage-legend');
  legend.replaceChildren('By ' + stacked.stack + ':');
  keys.forEach((k, i) => legend.append(el('span', null, { class: 'swatch c' + (i % 8) }), k || '(none)'));
}
async function loadUsage() {
  const days = Math.min(366, Math.max(1, Number($('usage-days').value) || 30));
  const by = $('usage-by').value;
  const [v, stacked] = await Promise.all([
    api('admin/usage', { by, days }),
    api('admin/usage', { by: 'day', days, stack: $('usage-stack').value }),
  ]);
  stacked.stack = $('usage-stack').value;
  $('usage-json').textContent = JSON.stringify(v, null, 2);
  const t = v.total || {};
  $('usage-summary').textContent = 'Last ' + days + ' days (since ' + v.since + '): ' + money(t.cost_usd) + ', '
    + kilo((t.input_tokens || 0) + (t.output_tokens || 0)) + ' tokens in ' + num(t.calls) + ' model calls.';
  drawChart(stacked, lastDays(days), $('usage-measure').value);
  const label = { day: 'Day', session: 'Session', model: 'Model', user: 'User', agent: 'Agent' }[by];
  fill($('usage-table'), v.rows || [], [
    [label, (r) => r.key || '(none)'],
    ['Spend', (r) => money(r.cost_usd), 'num'],
    ['Input tokens', (r) => kilo(r.input_tokens), 'num'],
    ['of them cached', (r) => kilo(r.cached_tokens), 'num'],
    ['Output tokens', (r) => kilo(r.output_tokens), 'num'],
    ['Model calls', (r) => num(r.calls) + (r.estimated_calls ? ' (' + num(r.estimated_calls) + ' estimated)' : ''), 'num'],
  ], null, 'No usage in this period: each model call an agent makes is counted here, with its tokens and cost (prices from the prices table).');
}
$('usage-form').addEventListener('submit', (ev) => { ev.preventDefault(); loadUsage().catch(fail); });
for (const id of ['usage-measure', 'usage-stack', 'usage-by']) $(id).addEventListener('change', () => loadUsage().catch(fail));

// ---- sessions: search (server-side, paged), window, usage, compact, reset ----
let sessionsOffset = 0;
async function loadSessions() {
  const v = await api('admin/sessions/search', {
    q: $('sessions-q').value, channel: $('sessions-channel').value, offset: sessionsOffset, limit: 25,
  });
  const list = v.sessions || [];
  if (!list.length) {
    $('sessions-rows').replaceChildren(box('tr', {}, el('td', $('sessions-q').value || $('sessions-channel').value
      ? 'No session matches this search.' : 'No sessions yet: each chat with an agent (any channel, or the Chat page) is a session.', { colspan: '7', class: 'empty' })));
  } else {
    $('sessions-rows').replaceChildren(...list.map((s) => {
      const tr = el('tr', null, { 'data-key': s.key });
      const a = el('a', s.key, { href: '#sessions' });
      a.addEventListener('click', (ev) => { ev.preventDefault(); showTranscript(s.key).catch(fail); });
      const td = el('td', null, { 'data-label': 'Session' });
      td.append(a);
      const names = s.names || {};
      if (s.snippet) td.append(el('br'), el('small', s.match + ': ' + (s.match === 'user' && names[s.snippet] ? authorTitle(s.snippet, names[s.snippet]) : s.snippet)));
      const w = s.window || {};
      const u = s.usage || {};
      const act = el('td', null, { class: 'actions', 'data-label': 'Actions' });
      const compact = el('button', 'Compact', { type: 'button', 'data-action': 'compact', 'data-operator': '' });
      compact.addEventListener('click', () => {
        api('admin/sessions/compact', { session: s.key })
          .then(() => notice('Compacting ' + s.key + ': its chat gets the usual notice.'))
          .catch(fail);
      });
      const reset = el('button', 'Reset', { type: 'button', 'data-operator': '' });
      reset.addEventListener('click', () => {
        if (!confirm('Reset ' + s.key + '? Its transcript is cleared.')) return;
        api('sessions/' + encodeURIComponent(s.key) + '/clear', {}).then(loadSessions).catch(fail);
      });
      act.append(compact, ' ', reset);
      tr.append(td, box('td', { 'data-label': 'Users' }, userChips(s.users, s.names)),
        el('td', num(w.in_window) + ' / ' + num(w.stored), { 'data-col': 'window', 'data-label': 'Window / stored', class: 'num' }),
        el('td', '≈' + kilo(w.tokens_estimate), { 'data-col': 'tokens', 'data-label': 'Tokens (est.)', class: 'num' }),
        el('td', kilo((u.input_tokens || 0) + (u.output_tokens || 0)) + ' tok, ' + money(u.cost_usd), { 'data-col': 'usage', 'data-label': 'Usage', class: 'num' }),
        box('td', { 'data-label': 'Updated' }, when(s.updated_ms)), act);
      return tr;
    }));
  }
  const from = v.offset + 1;
  const to = v.offset + list.length;
  $('sessions-page').textContent = (to >= from ? from + '–' + to : 'none') + ' of ' + v.total_sessions + ' stored sessions'
    + (v.text_search_incomplete ? ' (the text search stopped early: narrow it by channel)' : '');
  $('sessions-prev').disabled = v.offset === 0;
  $('sessions-next').disabled = v.next_offset === null || v.next_offset === undefined;
}
$('sessions-form').addEventListener('submit', (ev) => { ev.preventDefault(); sessionsOffset = 0; loadSessions().catch(fail); });
$('sessions-prev').addEventListener('click', () => { sessionsOffset = Math.max(0, sessionsOffset - 25); loadSessions().catch(fail); });
$('sessions-next').addEventListener('click', () => { sessionsOffset += 25; loadSessions().catch(fail); });
// The text of a message's content: a string, or the text parts of a list.
function textOf(c) {
  if (typeof c === 'string') return c;
  if (Array.isArray(c)) return c.map((p) => (typeof p === 'string' ? p : p.text || (p.type ? '[' + p.type + ']' : ''))).join('\n');
  return '';
}
// Who wrote a user message: the name the platform gave (never trusted for anything: only
// shown), else the id (`telegram:111`); messages stored before authors were kept: "user".
function authorName(from) { return from ? from.name || from.id : 'user'; }
function authorTitle(id, name) { return name ? name + ' (' + id + ')' : id; }
// A session's users as chips: the name when known, the id on hover.
function userChips(ids, names) {
  const span = el('span');
  for (const id of ids || []) {
    const name = (names || {})[id];
    span.append(el('span', name || id, { class: 'chip', title: authorTitle(id, name), 'data-user': id }));
  }
  return span;
}
function pretty(s) {
  try { return JSON.stringify(JSON.parse(s), null, 2); } catch (e) { return String(s); }
}
// A tool's arguments or result as a person reads it: a JSON string as its text, other JSON
// indented, anything else (a cut text) as it is.
function shown(s) {
  try {
    const v = JSON.parse(s);
    return typeof v === 'string' ? v : JSON.stringify(v, null, 2);
  } catch (e) { return String(s); }
}
async function showTranscript(key) {
  const v = await api('sessions/' + encodeURIComponent(key));
  const w = v.window || {};
  $('transcript-title').textContent = key + ': ' + (w.in_window ?? '?') + ' of ' + (w.stored ?? '?')
    + ' messages in the window, ≈' + kilo(w.tokens_estimate) + ' tokens, ' + (w.compactions || 0) + ' compactions';
  const cards = new Map();
  const items = [];
  for (const m of v.messages || []) {
    if (m.role === 'tool') {
      const card = cards.get(m.tool_call_id);
      const result = box('div', {}, el('p', 'Result:'), el('pre', shown(textOf(m.content))));
      if (card) card.append(result); else items.push(box('li', { 'data-who': 'tool result', class: 'note' }, result));
      continue;
    }
    const li = el('li', null, { 'data-who': m.role === 'user' ? authorName(m.from) : m.role || '', class: m.role || '' });
    if (m.role === 'user' && m.from) li.title = authorTitle(m.from.id, m.from.name);
    const text = textOf(m.content);
    if (m.role === 'assistant') li.append(markdown(text)); else if (text) li.append(text);
    for (const c of m.tool_calls || []) {
      const f = c.function || c;
      const card = box('details', { class: 'tool' }, el('summary', 'tool ' + (f.name || '')), el('p', 'Arguments:'), el('pre', pretty(f.arguments || '')));
      cards.set(c.id, card);
      li.append(card);
    }
    items.push(li);
  }
  $('transcript').replaceChildren(...(items.length ? items : [el('li', 'This session has no stored messages.')]));
}

// ---- automations, channels, MCP ----
function lastRunWords(r) {
  if (!r) return el('span', 'never ran');
  const span = el('span', (r.outcome || '') + ' ');
  span.append(when(r.finished));
  if (r.late) span.append(' (late)');
  if (r.detail) span.append(el('br'), trunc(r.detail));
  return span;
}
async function showRuns(j) {
  const v = await api('admin/cron/runs', { id: j.id });
  const runs = v.runs || [];
  const out = $('cron-runs');
  out.replaceChildren(el('h3', 'History of ' + (j.name || j.id)));
  if (!runs.length) {
    out.append(el('p', 'No runs yet: it first runs ' + (j.next_run ? rel(j.next_run) + ' (' + local(j.next_run) + ')' : 'when resumed') + ', or use Run now.', { class: 'muted' }));
    return;
  }
  const t = box('table', { class: 'cards-narrow' }, el('thead'), el('tbody'));
  out.append(t);
  fill(t, runs, [
    ['Outcome', (r) => r.outcome || ''],
    ['Scheduled', (r) => when(r.scheduled)],
    ['Finished', (r) => when(r.finished)],
    ['Detail', (r) => trunc((r.late ? 'late. ' : '') + (r.detail || ''))],
  ], null, '');
}
function heartbeatTarget(t) {
  if (!t) return 'the default chat';
  if (typeof t === 'string') return t;
  return [t.channel, t.chat || t.chat_id || t.to].filter(Boolean).join(' ') || Object.values(t).join(' ');
}
async function loadOps() {
  const [cron, pairing, mcp, nodes, status, config] = await Promise.all([
    api('admin/cron/list', {}), api('admin/pairing/list', {}), api('admin/mcp/list', {}),
    api('admin/nodes/list', {}).catch(() => ({ nodes: [] })), api('status').catch(() => ({})),
    api('admin/config/show', {}).catch(() => ({ rows: [] })),
  ]);
  const hb = (status.scheduler || {}).heartbeat || {};
  $('heartbeat').textContent = hb.enabled
    ? 'Heartbeat: every ' + duration(hb.every_secs) + ', to ' + heartbeatTarget(hb.target) : 'Heartbeat: off';
  // Who may talk to each channel without pairing (the allow_from settings, with their origin).
  $('allow-list').replaceChildren(...(config.rows || []).filter((r) => r.key.endsWith('allow_from'))
    .map((r) => el('li', r.key + ': ' + (r.value || '(nobody: pairing only)') + ' — ' + r.source)));
  if (!$('allow-list').children.length) $('allow-list').append(el('li', '(no chat platform configured)'));
  const chans = Object.entries(status.channel_states || {}).map(([channel, state]) => ({ channel, state }));
  fill($('channels-table'), chans, [
    ['Channel', (c) => c.channel],
    ['State', (c) => box('span', { class: 'dot s-' + channelLevel(c.state) }, c.state)],
  ], null, 'No channel is running: configure one under channels (weft onboard, or docs/channels.md).');
  fill($('cron-table'), cron.jobs || [], [
    ['Job', (j) => box('span', {}, el('strong', j.name || j.id), el('br'), el('small', j.id, { class: 'muted' }))],
    ['Schedule', (j) => scheduleWords(j.schedule)],
    ['Next run', (j) => (j.enabled ? box('span', {}, when(j.next_run), el('br'), el('small', local(j.next_run), { class: 'muted' })) : 'paused' + (j.paused_reason ? ' (' + j.paused_reason + ')' : ''))],
    ['Last run', (j) => lastRunWords(j.last_run)],
    ['Message', (j) => trunc(j.message || '')],
  ], (j) => [
    ['Run now', () => api('admin/cron/run', { id: j.id }), 'Started ' + (j.name || j.id) + ': see History for its outcome.'],
    ['History', () => showRuns(j)],
    [j.enabled ? 'Pause' : 'Resume', () => api('admin/cron/update', { id: j.id, enabled: !j.enabled }), (j.enabled ? 'Paused ' : 'Resumed ') + (j.name || j.id) + '.'],
    ['Remove', () => api('admin/cron/remove', { id: j.id }), 'Removed ' + (j.name || j.id) + '.'],
  ], 'No scheduled jobs. Ask an agent ("remind me every day at 7") or run weft cron add.');
  fill($('pairing-table'), pairing.pending || [], [
    ['Code', (p) => el('code', p.code)], ['Channel', (p) => p.channel], ['User', (p) => p.user], ['Chat', (p) => p.chat],
  ], (p) => [
    ['Approve', () => api('admin/pairing/approve', { code: p.code }), 'Approved ' + p.user + '.'],
  ], 'No pairing requests. An unknown sender on a channel with pairing gets a code; it shows here to approve.');
  const paired = pairing.paired || [];
  $('paired-list').replaceChildren(...paired.map((w) => {
    const who = typeof w === 'string' ? w : [w.channel, w.user].filter(Boolean).join(':') || String(w);
    const li = el('li', who + ' ');
    const b = el('button', 'Revoke', { type: 'button', 'data-operator': '' });
    b.addEventListener('click', () => api('admin/pairing/revoke', { who }).then(loadOps).catch(fail));
    li.append(b);
    return li;
  }));
  if (!paired.length) $('paired-list').append(el('li', 'Nobody paired yet.', { class: 'muted' }));
  const servers = Array.isArray(mcp) ? mcp : [];
  fill($('mcp-table'), servers, [
    ['Server', (m) => m.name], ['Transport', (m) => m.transport],
    ['State', (m) => box('span', { class: 'dot s-' + channelLevel(m.state) }, String(m.state))],
    ['Tools', (m) => chips(Array.isArray(m.tools) ? m.tools : [])], ['Last error', (m) => trunc(m.last_error || '—')],
  ], (m) => [['Restart', () => api('admin/mcp/restart', { name: m.name }), 'Restarting ' + m.name + '.']],
  'No MCP servers: add one under [mcp.servers] in the config to give agents its tools.');
  $('gateway-key').textContent = nodes.gateway_fingerprint
    ? 'This gateway\'s key (a node pins it at pairing): ' + nodes.gateway_fingerprint : '';
  fill($('nodes-table'), nodes.nodes || [], [
    ['Node', (n) => box('span', {}, el('strong', n.name), el('br'), el('small', n.id, { class: 'muted' }))],
    ['State', (n) => n.state],
    ['Online', (n) => box('span', { class: 'dot s-' + (n.online ? 'ok' : 'idle') }, n.online ? 'online' : 'offline')],
    ['Offers', (n) => chips(n.offers)],
    ['Key', (n) => el('span', n.fingerprint, { class: 'mono' })],
    ['Address', (n) => n.addr || '—'],
  ], (n) =>
    n.state === 'pending'
      ? [['Approve', () => api('admin/nodes/approve', { id: n.id }), 'Approved ' + n.name + '.'], ['Deny', () => api('admin/nodes/deny', { id: n.id }), 'Denied ' + n.name + '.']]
      : [['Revoke', () => api('admin/nodes/revoke', { id: n.id }), 'Revoked ' + n.name + '.']],
  'No nodes. Run weft node on another machine with this gateway\'s address; its pairing request shows here.');
}

// ---- overview: what matters now ----
function configValue(rows, key) {
  const r = (rows || []).find((x) => x.key === key);
  if (!r || r.value === '' || r.value === null || r.value === undefined || r.value === 'none') return null;
  const n = Number(r.value);
  return Number.isFinite(n) ? n : null;
}
function spendLine(label, spent, limit, unit) {
  const f = unit === 'usd' ? money : (v) => kilo(v) + ' tokens';
  const div = el('div');
  div.append(el('span', label + ': '), el('strong', f(spent)), el('span', limit ? ' of ' + f(limit) + ' budget' : ' (no budget set)'));
  if (limit) {
    const pct = Math.min(100, (spent / limit) * 100);
    const m = el('div', null, { class: 'meter' + (spent >= limit ? ' over' : ''), role: 'meter', 'aria-valuemin': '0', 'aria-valuemax': String(limit), 'aria-valuenow': String(spent), 'aria-label': label + ' against its budget' });
    m.append(el('span'));
    m.firstChild.style.width = pct.toFixed(1) + '%';
    div.append(m);
  }
  return div;
}
// The cluster part of the status: this node's link to NATS, the nodes of the registry (alive
// or not, since when, the partitions each holds) and the connection leases (which node holds
// each platform connection). Hidden in single-node mode.
function showCluster(c) {
  $('ov-cluster-card').hidden = !c;
  if (!c) return;
  const p = $('ov-cluster');
  p.replaceChildren(c.ok ? 'Connected to NATS' : 'NATS unreachable' + (c.reason ? ': ' + c.reason : ''));
  if (c.since_ms) p.append(' since ', el('time', local(c.since_ms), { datetime: new Date(ms(c.since_ms)).toISOString(), title: rel(c.since_ms) }));
  p.append('; this node is ', el('strong', c.node_id || '?'), '.');
  if (c.view_error) p.append(el('br'), el('small', 'Members not readable now: ' + c.view_error));
  const owners = (c.partitions || {}).owners || {};
  const conns = c.connections || [];
  $('ov-cluster-nodes').replaceChildren(...(c.nodes || []).map((n) => {
    const held = conns.filter((l) => l.holder === n.node).map((l) => l.key.replace(/^conn\./, ''));
    const words = el('span', (n.alive ? 'alive' : 'silent for ' + rel(Date.now() - n.seen_ms_ago).replace(' ago', '')) + ', started ');
    words.append(when(n.since_ms), ', ' + num(owners[n.node] || 0) + ' partitions' + (held.length ? ', holds ' + held.join(', ') : ''));
    const li = stateItem(n.alive ? 'ok' : 'bad', n.node + (n.node === c.node_id ? ' (this node)' : ''), '');
    li.querySelector('.word').replaceWith(words);
    li.dataset.node = n.node;
    return li;
  }));
  const parts = c.partitions;
  $('ov-cluster-parts').textContent = parts ? 'Partitions: ' + num(parts.held) + ' of ' + num(parts.count) + ' held'
    + (parts.held < parts.count ? ' (sessions of the others wait for a node)' : '') + '; ' + conns.length + ' connection lease' + (conns.length === 1 ? '' : 's') + '.' : '';
}
async function loadOverview() {
  const dayOfMonth = new Date().getUTCDate();
  const [status, today, month, approvals, pairing, nodes, config, logs] = await Promise.all([
    api('status'), api('admin/usage', { by: 'agent', days: 1 }), api('admin/usage', { by: 'day', days: dayOfMonth }),
    api('admin/approvals/list', {}).catch(() => ({})), api('admin/pairing/list', {}).catch(() => ({})),
    api('admin/nodes/list', {}).catch(() => ({})), api('admin/config/show', {}).catch(() => ({})),
    api('admin/logs/tail', { after: 0, level: 'error' }).catch(() => ({})),
  ]);
  // Channels: live state.
  const chans = Object.entries(status.channel_states || {});
  $('ov-channels').replaceChildren(...chans.map(([id, st]) => {
    const li = stateItem(channelLevel(st), id, st);
    li.dataset.channel = id;
    return li;
  }));
  if (!chans.length) $('ov-channels').append(el('li', 'No channel is running.', { class: 'muted' }));
  // Providers: health.
  const provs = status.providers || [];
  $('ov-providers').replaceChildren(...provs.map((p) => {
    const level = p.state === 'ok' ? 'ok' : p.state === 'failing' ? 'bad' : 'idle';
    const words = p.state === 'ok' ? 'answering' : p.state === 'failing' ? 'failing' : 'not called yet';
    const extra = el('small');
    if (p.state === 'failing' && p.last_error) {
      extra.append(p.last_error.kind + ' since ', when(p.failing_since_ms || p.last_error.at_ms), ': ' + (p.last_error.message || ''));
    } else if (p.last_success_ms) {
      extra.append('last answer ', when(p.last_success_ms));
    }
    const li = stateItem(level, p.name + (p.model ? ' · ' + p.model : ''), words, extra);
    li.dataset.provider = p.name;
    return li;
  }));
  if (!provs.length) $('ov-providers').append(el('li', 'No provider configured: run weft onboard.', { class: 'muted' }));
  // Spend against the budgets.
  const rows = config.rows || [];
  const tt = today.total || {};
  const mt = month.total || {};
  const spend = $('ov-spend');
  spend.replaceChildren(
    spendLine('Today', tt.cost_usd || 0, configValue(rows, 'budgets.daily_usd'), 'usd'),
    spendLine('This month', mt.cost_usd || 0, configValue(rows, 'budgets.monthly_usd'), 'usd'),
  );
  const dt = configValue(rows, 'budgets.daily_tokens');
  if (dt) spend.append(spendLine('Tokens today', (tt.input_tokens || 0) + (tt.output_tokens || 0), dt, 'tokens'));
  const agentsToday = (today.rows || []).filter((r) => r.cost_usd || r.calls);
  if (agentsToday.length) {
    const p = el('p', 'Today by agent: ', { class: 'muted' });
    p.append(...agentsToday.map((r) => el('span', r.key + ' ' + money(r.cost_usd), { class: 'chip' })));
    spend.append(p);
  }
  spend.dataset.today = String(tt.cost_usd || 0);
  // What waits for the operator.
  const waiting = [];
  const timeout = configValue(rows, 'tools.exec.approval_timeout_secs');
  for (const a of (approvals.approvals || []).filter((x) => x.state === 'pending')) {
    const li = el('li', null, { class: 'dot s-warn' });
    li.append(el('a', 'Approval', { href: '#approvals' }), ': ', el('code', a.command), ' in ' + a.session);
    if (a.asked_ms && timeout) li.append(' — expires ' + rel(a.asked_ms + timeout * 1000));
    waiting.push(li);
  }
  for (const p of pairing.pending || []) {
    const li = el('li', null, { class: 'dot s-warn' });
    li.append(el('a', 'Pairing request', { href: '#ops' }), ': ' + p.user + ' on ' + p.channel + ' (code ', el('code', p.code), ')');
    waiting.push(li);
  }
  for (const n of (nodes.nodes || []).filter((x) => x.state === 'pending')) {
    const li = el('li', null, { class: 'dot s-warn' });
    li.append(el('a', 'Node', { href: '#ops' }), ': ' + n.name + ' asks to pair');
    waiting.push(li);
  }
  $('ov-waiting').replaceChildren(...(waiting.length ? waiting : [el('li', 'Nothing waits for you.', { class: 'dot s-ok' })]));
  // Sessions and cluster.
  const ss = status.sessions || {};
  $('ov-sessions').textContent = num(ss.live) + ' active now, ' + num(ss.stored) + ' stored.';
  showCluster(status.cluster);
  // Last errors.
  const errs = (logs.lines || []).slice(-5).reverse();
  $('ov-errors').replaceChildren(...(errs.length ? errs.map((l) => el('li', l.text)) : [el('li', 'No errors logged since the gateway started.', { class: 'muted' })]));
  // The verdict: can the family be answered right now?
  const chanBad = chans.filter(([, st]) => channelLevel(st) === 'bad').map(([id]) => id);
  const provOk = provs.some((p) => p.state !== 'failing');
  const v = $('ov-verdict');
  if (!provOk && provs.length) {
    v.textContent = 'Nobody can be answered now: no provider is answering (see Providers).';
    v.className = 'verdict bad';
  } else if (chanBad.length) {
    v.textContent = 'Answering, except on ' + chanBad.join(', ') + ' (see Channels). Today: ' + money(tt.cost_usd) + '.';
    v.className = 'verdict bad';
  } else {
    v.textContent = 'All good: every channel is up and the provider answers. Today: ' + money(tt.cost_usd) + '.';
    v.className = 'verdict ok';
  }
  if (waiting.length) v.textContent += ' ' + waiting.length + ' waiting for you.';
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
$('log-level').addEventListener('change', () => loadLogs(true).catch(fail));

// ---- config: the configuration in force, where each value came from; validate, reload ----
async function loadConfig() {
  const v = await api('admin/config/show', {});
  $('config-path').textContent = 'Config file: ' + (v.path || 'none (defaults and the environment)');
  const f = $('config-filter').value.trim().toLowerCase();
  $('config-table').tBodies[0].replaceChildren(...(v.rows || [])
    .filter((r) => !f || (r.key + ' ' + r.value + ' ' + r.source).toLowerCase().includes(f))
    .map((r) => {
      const tr = el('tr', null, { 'data-key': r.key });
      const val = r.value === '{}' || r.value === '[]' ? '(none)' : r.value;
      tr.append(el('td', r.key, { 'data-label': 'Key', class: 'mono' }), el('td', val, { 'data-label': 'Value' }), el('td', r.source, { class: 'source', 'data-label': 'Set by' }));
      return tr;
    }));
}
// A report: a title line and a list of items (errors marked as such, not only by colour).
function configReport(title, items, bad) {
  const b = $('config-report');
  b.replaceChildren(el('p', (bad ? 'Error: ' : '') + title));
  b.className = bad ? 'bad' : '';
  if (items.length) b.append(el('ul'));
  for (const i of items) b.lastChild.append(el('li', i));
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
$('config-filter').addEventListener('input', () => loadConfig().catch(fail));

// ---- agents, skills, memory ----
async function loadAgents() {
  const v = await api('admin/agents/list', {});
  const agents = v.agents || [];
  const sel = $('memory-agent');
  const was = sel.value;
  sel.replaceChildren(...agents.map((a) => el('option', a.name)));
  if (was) sel.value = was;
  $('agents-list').replaceChildren(...agents.map((a) => {
    const d = el('section', null, { 'data-agent': a.name, class: 'card' });
    const tools = a.tools || {};
    d.append(el('h2', a.name + (a.default ? ' (default)' : '')));
    const dl = el('dl');
    for (const [k, val] of [
      ['Model', a.model], ['Providers', chips(a.providers)], ['Workspace', a.workspace],
      ['Bindings', (a.bindings || []).join('; ') || 'none (the default agent answers what no binding routes)'],
      ['Tools offered', chips(tools.offered)],
      ['Tools loaded on demand (tool_search)', chips(tools.deferred)],
      ['Skills', (a.skills || []).map((s) => s.name + ' (' + s.source + '): ' + s.description).join('; ') || 'none'],
    ]) {
      const dd = el('dd');
      if (val instanceof Node) dd.append(val.childNodes.length ? val : '—'); else dd.textContent = val || '—';
      dl.append(el('dt', k), dd);
    }
    d.append(dl);
    return d;
  }));
  await loadMemoryDocs();
}
async function loadMemoryDocs() {
  const v = await api('admin/memory/list', { agent: $('memory-agent').value });
  const docs = v.documents || [];
  $('memory-docs').tBodies[0].replaceChildren(...(docs.length ? docs.map((d) => {
    const tr = el('tr');
    tr.append(el('td', d.path), el('td', bytes(d.bytes)), box('td', {}, when(d.modified_ms)));
    return tr;
  }) : [box('tr', {}, el('td', 'No memory documents: the agent writes MEMORY.md and memory/*.md in its workspace when it remembers something.', { colspan: '3', class: 'empty' }))]));
}
$('memory-agent').addEventListener('change', () => loadMemoryDocs().catch(fail));
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

// ---- navigation ----
const loaders = {
  overview: loadOverview, approvals: loadApprovals, usage: loadUsage, sessions: loadSessions, ops: loadOps,
  logs: () => loadLogs(true), config: loadConfig, agents: loadAgents, chat: checkCanvas,
};
function page() {
  const p = (location.hash || '#overview').slice(1);
  return p === 'status' || !$('page-' + p) ? 'overview' : p;
}
function show() {
  const p = signedOut ? 'signed-out' : page();
  for (const s of document.querySelectorAll('main > section')) s.hidden = s.id !== 'page-' + p;
  for (const a of document.querySelectorAll('nav a')) {
    if (a.getAttribute('href') === '#' + p) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  notice('');
  if (!signedOut && loaders[p]) loaders[p]().catch(fail);
}
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
    $('logout').hidden = false;
    fillAgents(me.agents);
    document.body.dataset.role = me.role;
  } catch (e) {
    signedOut = true;
    document.querySelector('nav').hidden = true;
    show();
    return;
  }
  api('admin/config/show', {}).then((c) => {
    approvalTimeoutSecs = configValue(c.rows, 'tools.exec.approval_timeout_secs') || 0;
  }).catch(() => {});
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
    if (!$('page-overview').hidden) loadOverview().catch(() => {});
  }, 5000);
  setInterval(() => { if (!$('page-logs').hidden) loadLogs(false).catch(() => {}); }, 2000);
  reloadCanvas();
  show();
})();
