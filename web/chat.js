// kvseal's chat page: streams /v1/chat/completions with the tenant's key,
// which stays in this browser (localStorage) and goes only to this origin.
// Text goes into the page as text (textContent), never as markup.
'use strict';
const $ = (id) => document.getElementById(id);
const KEY = 'kvseal.key';
let history = [];
let controller = null;

function status(text) { $('status').textContent = text; }
function headers() {
  const h = { 'content-type': 'application/json' };
  const k = $('key').value.trim();
  if (k) h.authorization = 'Bearer ' + k;
  return h;
}
async function errorText(res) {
  try {
    const j = await res.json();
    return (j.error && (j.error.message || j.error)) || res.statusText;
  } catch (e) { return res.status + ' ' + res.statusText; }
}

async function loadModels() {
  const sel = $('model');
  try {
    const res = await fetch('/v1/models', { headers: headers() });
    if (!res.ok) { status('models: ' + await errorText(res)); return; }
    const j = await res.json();
    const keep = sel.value;
    sel.textContent = '';
    for (const m of j.data) {
      const o = document.createElement('option');
      o.value = o.textContent = m.id;
      sel.appendChild(o);
    }
    if (keep) sel.value = keep;
    status(j.data.length + ' model' + (j.data.length === 1 ? '' : 's'));
  } catch (e) { status('models: ' + e.message); }
}

function addMessage(role, text) {
  const d = document.createElement('div');
  d.className = 'msg ' + role;
  d.textContent = text;
  $('log').appendChild(d);
  $('log').scrollTop = $('log').scrollHeight;
  return d;
}

// Reads an SSE body, calling onData with each event's parsed JSON until [DONE].
async function readEvents(res, onData) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of ev.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  const messages = [];
  const sys = $('system').value.trim();
  if (sys) messages.push({ role: 'system', content: sys });
  history.push({ role: 'user', content: text });
  messages.push(...history);
  addMessage('user', text);
  const box = document.createElement('div');
  box.className = 'msg assistant';
  const reasoning = document.createElement('details');
  reasoning.className = 'reasoning';
  const summary = document.createElement('summary');
  summary.textContent = 'Reasoning';
  const rtext = document.createElement('span');
  reasoning.append(summary, rtext);
  reasoning.hidden = true;
  const content = document.createElement('span');
  content.className = 'content';
  box.append(reasoning, content);
  $('log').appendChild(box);
  controller = new AbortController();
  $('send').disabled = true;
  $('stop').disabled = false;
  status('generating');
  let answer = '';
  try {
    const body = {
      model: $('model').value, messages, stream: true,
      temperature: Number($('temperature').value), top_p: Number($('top_p').value),
      max_tokens: Number($('max_tokens').value),
    };
    const res = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    let finish = null;
    await readEvents(res, (j) => {
      if (j.error) throw new Error(j.error.message || 'error');
      const c = j.choices && j.choices[0];
      if (!c) return;
      const d = c.delta || {};
      if (d.reasoning_content) { reasoning.hidden = false; rtext.textContent += d.reasoning_content; }
      if (d.content) { answer += d.content; content.textContent = answer; }
      if (c.finish_reason) finish = c.finish_reason;
      $('log').scrollTop = $('log').scrollHeight;
    });
    status(finish ? 'done (' + finish + ')' : 'done');
  } catch (e) {
    if (e.name === 'AbortError') status('stopped');
    else { addMessage('error', e.message); status('error'); }
  } finally {
    history.push({ role: 'assistant', content: answer });
    box.dataset.done = '1';
    controller = null;
    $('send').disabled = false;
    $('stop').disabled = true;
  }
}

$('key').value = localStorage.getItem(KEY) || '';
$('key').addEventListener('change', () => { localStorage.setItem(KEY, $('key').value.trim()); loadModels(); });
$('form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = $('input').value.trim();
  if (!text || controller) return;
  $('input').value = '';
  send(text);
});
$('input').addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('form').requestSubmit(); }
});
$('stop').addEventListener('click', () => { if (controller) controller.abort(); });
$('clear').addEventListener('click', () => { history = []; $('log').textContent = ''; });
loadModels();
