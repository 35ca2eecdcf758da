// chaos.mjs — kills a worker process in the middle of traffic and checks
// that only the requests it was serving fail, cleanly. Runs N requests
// alone first (references), then N at once (streamed) and SIGKILLs KILL_PID
// after KILL_AFTER_MS; every answer must either equal its reference or be a
// clean error (an error status with OpenAI's error JSON, or an SSE error
// event after a correct prefix); at least one must fail (the kill landed)
// and at least one must succeed; afterwards N fresh requests must all
// succeed with their reference answers. The signal goes when the wave's
// first token arrives (KILL_WHEN=log: when KILL_LOG has more lines
// containing KILL_LOG_TEXT than it had before the wave, i.e. when the
// victim logged that it holds a transfer of this wave). Env: KS_URL, KS_MODEL_NAME (kjv-mini),
// KILL_PID, KILL_WHEN, KILL_LOG, KILL_LOG_TEXT, CHAOS_N. With KILL_SIGNAL=SIGTERM (a graceful drain,
// KILL_PID may list several pids) a second wave of N requests starts right
// after the signal, and every request of both waves must succeed with its
// reference answer. With CHAOS_EXPECT=all (a prefill worker killed while
// another is left: its requests are placed on the other one) every request
// of the wave must succeed with its reference answer. Exit 0 = pass, 1 = fail.
import { readFileSync } from 'node:fs';

const URL_ = process.env.KS_URL;
const MODEL = process.env.KS_MODEL_NAME || 'kjv-mini';
const N = Number(process.env.CHAOS_N || 8);
const fails = [];
const fail = (m) => { fails.push(m); console.error('CHAOS FAILURE: ' + m); };
const BASE = 'And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, ';

function body(i, stream) {
  return { model: MODEL, prompt: `${i}: ` + BASE.repeat(2 + (i % 4)), max_tokens: 96, temperature: 0, ignore_eos: true, stream };
}

// Resolved when the first token of the concurrent wave arrives: the moment to
// strike, when every request of the wave is in flight somewhere.
let firstToken;
const firstTokenSeen = new Promise((res) => { firstToken = res; });

async function once(i, stream) {
  const res = await fetch(`${URL_}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body(i, stream)),
  });
  if (!stream || res.status !== 200) {
    const txt = await res.text();
    let json = null;
    try { json = JSON.parse(txt); } catch { /* */ }
    return { status: res.status, json, raw: txt };
  }
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '', text = '', error = null, done = false;
  for (;;) {
    const { value, done: eof } = await reader.read();
    if (eof) break;
    buf += dec.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ')) continue;
      if (ev === 'data: [DONE]') { done = true; continue; }
      const j = JSON.parse(ev.slice(6));
      if (j.error) error = j.error;
      if (j.choices && j.choices[0]) { text += j.choices[0].text || ''; firstToken(); }
    }
  }
  return { status: 200, text, error, done };
}

async function main() {
  const ref = [];
  for (let i = 0; i < N; i++) {
    const r = await once(i, false);
    if (r.status !== 200) { fail(`reference ${i}: ${r.status} ${r.raw}`); ref.push(null); continue; }
    ref.push(r.json.choices[0].text);
  }
  const logLines = () => readFileSync(process.env.KILL_LOG, 'utf8').split('\n')
    .filter((l) => l.includes(process.env.KILL_LOG_TEXT)).length;
  const byLog = process.env.KILL_WHEN === 'log';
  const before = byLog ? logLines() : 0;
  const all = [];
  for (let i = 0; i < N; i++) all.push(once(i, true).catch((e) => ({ status: 0, error: String(e), text: '' })));
  // KILL_WHEN=first-token (default): once the wave's first token arrives,
  // every request is decoding somewhere. KILL_WHEN=log: once the victim
  // logged a transfer of this wave (for a prefill worker whose DONEs are
  // held back: it is then mid-transfer).
  const deadline = Date.now() + 1000 * Number(process.env.KS_WAIT_S || 60);
  if (byLog) {
    while (logLines() <= before) {
      if (Date.now() > deadline) { console.error('CHAOS FAILURE: the victim never logged a transfer of the wave'); process.exit(1); }
      await new Promise((res) => setTimeout(res, 10));
    }
  }
  else await firstTokenSeen;
  const drain = process.env.KILL_SIGNAL === 'SIGTERM';
  for (const pid of String(process.env.KILL_PID).split(',')) process.kill(Number(pid), drain ? 'SIGTERM' : 'SIGKILL');
  if (drain) for (let i = 0; i < N; i++) all.push(once(i, true).catch((e) => ({ status: 0, error: String(e), text: '' })));
  const rs = await Promise.all(all);
  if (drain) {
    rs.forEach((r, k) => {
      const i = k % N;
      if (!(r.status === 200 && !r.error && r.done)) fail(`drain: request ${k} failed: ${JSON.stringify(r).slice(0, 300)}`);
      else if (r.text !== ref[i]) fail(`drain: request ${k}: output differs`);
    });
    console.log(`drain: ${rs.length} requests, ${fails.length} problems`);
    process.exit(fails.length ? 1 : 0);
  }
  const expectAll = process.env.CHAOS_EXPECT === 'all';
  let ok = 0, failed = 0;
  rs.forEach((r, i) => {
    if (expectAll && !(r.status === 200 && !r.error && r.done))
      fail(`request ${i} failed although another worker was left to take it: ${JSON.stringify(r).slice(0, 300)}`);
    if (r.status === 200 && !r.error && r.done) {
      ok++;
      if (r.text !== ref[i]) fail(`request ${i}: survived but its output differs: ${JSON.stringify(r.text)} vs ${JSON.stringify(ref[i])}`);
      return;
    }
    failed++;
    const clean = (r.status >= 400 && r.json && r.json.error) || (r.status === 200 && r.error);
    if (!clean) fail(`request ${i}: not a clean failure: ${JSON.stringify(r).slice(0, 300)}`);
    if (r.text && ref[i] && !ref[i].startsWith(r.text)) fail(`request ${i}: wrong partial output ${JSON.stringify(r.text)}`);
  });
  if (failed === 0 && !expectAll) fail('the killed worker served none of the requests in flight (kill too late?)');
  if (ok === 0) fail('no request survived: the kill took down requests of other workers too');
  for (let i = 0; i < N; i++) {
    const r = await once(i, false);
    if (r.status !== 200) fail(`after the kill, request ${i}: ${r.status} ${r.raw.slice(0, 200)}`);
    else if (r.json.choices[0].text !== ref[i]) fail(`after the kill, request ${i}: output differs`);
  }
  console.log(`chaos: ${ok} survived, ${failed} failed cleanly, ${fails.length} problems`);
  process.exit(fails.length ? 1 : 0);
}
main().catch((e) => { console.error(e.stack || e); process.exit(2); });
