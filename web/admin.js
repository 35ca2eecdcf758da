// kvseal's operator page: polls GET /admin/pool with the admin key (kept in
// this browser only) and draws the KV pool page by page, by state and by
// the tenant whose running request holds each page.
'use strict';
const $ = (id) => document.getElementById(id);
const KEY = 'kvseal.admin_key';
const STATE = ['free', 'allocated', 'ready', 'quarantined'];
const FREE = '#e6e6e6', ALLOC = '#f2c14e', CACHED = '#9aa5b1', QUAR = '#d62828';
let timer = null;

function status(text) { $('status').textContent = text; }
function auth() { return { authorization: 'Bearer ' + $('key').value.trim() }; }
function ownerColor(i) { return 'hsl(' + ((i * 137) % 360) + ', 60%, 45%)'; }
function row(table, cells, head) {
  const tr = document.createElement('tr');
  for (const c of cells) {
    const td = document.createElement(head ? 'th' : 'td');
    td.textContent = String(c);
    tr.appendChild(td);
  }
  table.appendChild(tr);
}
function pairs(table, obj) {
  table.textContent = '';
  for (const [k, v] of Object.entries(obj)) row(table, [k.replace(/_/g, ' '), v]);
}

function drawMap(map) {
  const cv = $('map');
  const ctx = cv.getContext('2d');
  const legend = $('legend');
  legend.textContent = '';
  const item = (color, text) => {
    const li = document.createElement('li');
    const sw = document.createElement('span');
    sw.style.background = color;
    li.append(sw, document.createTextNode(text));
    legend.appendChild(li);
  };
  ctx.clearRect(0, 0, cv.width, cv.height);
  if (!map) { item(FREE, 'no map here (a router: see its workers)'); return; }
  const n = map.pages;
  const cell = Math.max(2, Math.floor(Math.sqrt((cv.width * cv.height) / Math.max(n, 1))));
  const cols = Math.floor(cv.width / cell);
  cv.height = Math.max(cell, Math.ceil(n / cols) * cell);
  let p = 0;
  for (const [state, owner, count] of map.runs) {
    const color = state === 0 ? FREE : state === 3 ? QUAR : owner >= 0 ? ownerColor(owner)
      : state === 1 ? ALLOC : CACHED;
    ctx.fillStyle = color;
    for (let i = 0; i < count; i++, p++)
      ctx.fillRect((p % cols) * cell, Math.floor(p / cols) * cell, cell - (cell > 3), cell - (cell > 3));
  }
  item(FREE, 'free');
  item(CACHED, 'prefix cache / not a running request');
  item(QUAR, 'quarantined');
  map.owners.forEach((o, i) => item(ownerColor(i), o.name + ': ' + o.pages + ' pages, ' +
    o.running + ' running'));
}

async function poll() {
  if (!$('key').value.trim()) { status('enter the admin key'); return; }
  try {
    const res = await fetch('/admin/pool', { headers: auth() });
    const j = await res.json();
    if (!res.ok) { status((j.error && j.error.message) || res.statusText); return; }
    const pool = j.pool;
    const total = pool.free + pool.allocated + pool.ready + pool.quarantined;
    $('summary').textContent = total + ' pages: ' + pool.free + ' free, ' + pool.allocated +
      ' allocated, ' + pool.ready + ' ready, ' + pool.quarantined + ' quarantined; ' +
      pool.prefix_cached_pages + ' held by the prefix cache';
    drawMap(j.map);
    pairs($('engine'), { queued: j.engine.queued, running: j.engine.running, paused: j.engine.paused,
      finished: j.engine.finished, aborted: j.engine.aborted, rejected: j.engine.rejected,
      prompt_tokens: j.engine.tokens_in, generated_tokens: j.engine.tokens_out });
    pairs($('isolation'), { 'sequences stopped by a page check': j.engine.violations,
      'failed page checks': pool.violations, 'page allocations': pool.allocations });
    const tb = $('tenants').querySelector('tbody');
    tb.textContent = '';
    const held = new Map(((j.map && j.map.owners) || []).map((o) => [o.name, o]));
    for (const t of j.tenants) {
      const h = held.get(t.name) || { running: 0, pages: 0 };
      row(tb, [t.name, t.requests, t.rate_limited, t.prompt_tokens, t.generation_tokens,
        h.running, h.pages]);
    }
    status('updated ' + new Date().toLocaleTimeString());
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (e) { status('error: ' + e.message); }
}

async function check() {
  $('check-result').textContent = 'waiting for the engine to go idle...';
  try {
    const res = await fetch('/admin/kv/check?timeout_ms=10000', { headers: auth() });
    const j = await res.json();
    $('check-result').textContent = j.error ? j.error.message
      : (j.clean ? 'clean: ' : 'NOT clean: ') + j.message;
  } catch (e) { $('check-result').textContent = 'error: ' + e.message; }
}

$('key').value = localStorage.getItem(KEY) || '';
$('key').addEventListener('change', () => { localStorage.setItem(KEY, $('key').value.trim()); poll(); });
$('check').addEventListener('click', check);
poll();
timer = setInterval(poll, 1000);
