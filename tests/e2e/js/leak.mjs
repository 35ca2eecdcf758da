// leak.mjs — the isolation leak suite (docs/design.md I1-I4, I7, I9), run against
// a live `kvseal serve` (or router) as a client would.
//
// Many tenants at once, each prompt carrying the tenant's own canary; over-
// long requests mixed in (400 context_length_exceeded, no tokens); clients
// that disconnect mid-stream; a KV pool small enough that requests must
// wait; the prefix cache on. Passes only if every completed output equals
// its reference produced alone, no output holds a canary, the isolation
// violation counter is 0 (or exactly 1 with LEAK_EXPECT_VIOLATION=1, when a
// fault injector corrupted one block table; that run leaves out the clients
// that disconnect, so the corrupted request is always one whose whole output
// is checked), cross-tenant prefix reuse never
// happens while same-tenant reuse does, and afterwards every KV page is FREE
// and scrubbed. Exit 0 = pass, 1 = a leak or a wrong answer was found.
//
// Env: KS_URL (http://127.0.0.1:PORT), KS_ADMIN_KEY, LEAK_TENANTS (JSON
// [{name, key}]), LEAK_EXPECT_VIOLATION (0/1), LEAK_MODEL (model name).
// Disaggregated mode (a `kvseal router` at KS_URL): LEAK_REF_URL, a
// `kvseal serve` of the same model and tenants, produces the references
// (so every cluster output must equal the monolithic server's);
// LEAK_NO_PREFIX_CACHE=1 drops the same-tenant reuse requirement (the
// cross-tenant one stays); LEAK_EXPECT_FAILED=1 (fault injection) requires
// at least one request to fail, cleanly (an error answer, never wrong or
// foreign tokens), and skips the prefix probe.
//
// LoRA adapters (LEAK_ADAPTERS: JSON [path, path], two adapter files of the
// model): the admin uploads the first as tenant 0's "ft" and the second as
// tenant 1's "ft" (one name, two owners). Each tenant's "ft" requests must
// equal their references alone and run its own file; tenant 2 naming "ft"
// must get 404 adapter_not_found (never tokens computed with another's
// adapter); a prompt cached without an adapter must not be reused under
// one; the adapter requests join the concurrent mix; the adapters are
// removed before the pool check.

const URL_ = process.env.KS_URL;
const ADMIN = process.env.KS_ADMIN_KEY;
const TENANTS = JSON.parse(process.env.LEAK_TENANTS);
const EXPECT_VIOLATION = process.env.LEAK_EXPECT_VIOLATION === '1';
const MODEL = process.env.LEAK_MODEL || 'kjv-mini';
const REF_URL = process.env.LEAK_REF_URL || URL_;
const NO_PREFIX = process.env.LEAK_NO_PREFIX_CACHE === '1';
const EXPECT_FAILED = process.env.LEAK_EXPECT_FAILED === '1';
const ADAPTERS = process.env.LEAK_ADAPTERS ? JSON.parse(process.env.LEAK_ADAPTERS) : [];

const failures = [];
const fail = (msg) => { failures.push(msg); console.error('LEAK SUITE FAILURE: ' + msg); };

const TEXTS = [
  'And the LORD spake unto Moses, saying, Speak unto the children of Israel,',
  'Blessed are the poor in spirit: for theirs is the kingdom of heaven.',
  'In the beginning God created the heaven and the earth.',
  'Now the serpent was more subtil than any beast of the field',
  'And it came to pass in those days, that there went out a decree',
  'The LORD is my shepherd; I shall not want.',
];
// A public document every tenant may send: prefix-cache probe (I7).
const SHARED_DOC = 'Hear, O Israel: The LORD our God is one LORD: And thou shalt love the LORD thy God ' +
  'with all thine heart, and with all thy soul, and with all thy might. And these words, which I command ' +
  'thee this day, shall be in thine heart:';

function canary(i) { return `zq${(0x5a17 * (i + 7)).toString(36)}x${i}`; }

async function complete(key, body, { stream = false, abortAfterChunks = 0, base = URL_ } = {}) {
  const ctl = new AbortController();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST', signal: ctl.signal,
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: MODEL, temperature: 0, ...body, stream }),
  });
  if (!stream || res.status !== 200) {
    const txt = await res.text();
    let json = null;
    try { json = JSON.parse(txt); } catch { /* not JSON */ }
    return { status: res.status, json, raw: txt };
  }
  // SSE: concatenate text deltas until [DONE]
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '', text = '', chunks = 0, done = false, error = null, usage = null;
  try {
    while (!done) {
      const { value, done: eof } = await reader.read();
      if (eof) break;
      buf += dec.decode(value, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k); buf = buf.slice(k + 2);
        for (const line of ev.split('\n')) {
          if (!line.startsWith('data: ')) continue;
          const data = line.slice(6);
          if (data === '[DONE]') { done = true; break; }
          const j = JSON.parse(data);
          if (j.error) error = j.error;
          if (j.usage) usage = j.usage;
          if (j.choices && j.choices[0] && typeof j.choices[0].text === 'string') text += j.choices[0].text;
          chunks++;
          if (abortAfterChunks && chunks >= abortAfterChunks) { ctl.abort(); return { status: 200, aborted: true, text }; }
        }
      }
    }
  } catch (e) {
    if (e.name === 'AbortError') return { status: 200, aborted: true, text };
    throw e;
  }
  return { status: 200, text, done, error, usage };
}

async function metric(name) {
  const res = await fetch(`${URL_}/metrics`, { headers: { authorization: `Bearer ${ADMIN}` } });
  const txt = await res.text();
  const m = txt.match(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\d+(?:\\.\\d+)?)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

async function admin(method, path, body) {
  const res = await fetch(`${URL_}${path}`, {
    method, headers: { authorization: `Bearer ${ADMIN}` }, body,
  });
  return { status: res.status, raw: await res.text() };
}

// LoRA: uploads tenant 0's and tenant 1's "ft", makes their references, and
// checks the guess and the prefix probe; returns the adapter jobs for the mix.
async function adapterPhase() {
  if (!ADAPTERS.length) return [];
  const fs = await import('node:fs');
  for (let i = 0; i < 2; i++) {
    const r = await admin('POST', `/admin/adapters?tenant=${TENANTS[i].name}&name=ft`, fs.readFileSync(ADAPTERS[i]));
    if (r.status !== 201) { fail(`adapter upload for ${TENANTS[i].name}: ${r.status} ${r.raw}`); return []; }
  }
  const jobs = [];
  for (let i = 0; i < 2; i++) {
    const prompt = `${canary(i)} ${TEXTS[(i + 3) % TEXTS.length]}`;
    const j = { tenant: TENANTS[i], ti: i, prompt, max_tokens: 24, adapter: 'ft' };
    const r = await complete(j.tenant.key, { prompt, max_tokens: j.max_tokens, adapter: 'ft' }, { base: REF_URL });
    if (r.status !== 200) { fail(`adapter reference ${j.tenant.name}: ${r.status} ${r.raw}`); continue; }
    j.ref = r.json.choices[0].text;
    const plain = await complete(j.tenant.key, { prompt, max_tokens: j.max_tokens }, { base: REF_URL });
    if (plain.status === 200 && plain.json.choices[0].text === j.ref)
      fail(`adapter ${j.tenant.name}: the adapter did not change the output (not applied?)`);
    checkNoCanary(`adapter reference ${j.tenant.name}`, j.ref);
    jobs.push(j);
  }
  if (jobs.length === 2) { // one name, two owners: each ran its own file
    const cross = await complete(TENANTS[1].key, { prompt: jobs[0].prompt, max_tokens: 24, adapter: 'ft' });
    if (cross.status === 200 && cross.json.choices[0].text === jobs[0].ref)
      fail(`adapter: ${TENANTS[1].name}'s "ft" computed ${TENANTS[0].name}'s output`);
  }
  // a guess of another tenant's name: not found, no tokens
  for (const who of [2, 3]) {
    const g = await complete(TENANTS[who].key, { prompt: `${canary(who)} ${TEXTS[0]}`, max_tokens: 8, adapter: 'ft' });
    const code = g.json && g.json.error && g.json.error.code;
    if (g.status !== 404 || code !== 'adapter_not_found' || (g.json && g.json.choices))
      fail(`adapter guess: ${TENANTS[who].name} naming another tenant's "ft" got ${g.status} ${g.raw.slice(0, 200)}`);
  }
  // the prefix cache keyed by (tenant, adapter): tenant 0's document cached
  // without an adapter is not reused with one, and the answer is the cold one
  const doc = `${canary(0)} ${SHARED_DOC}`;
  if (!EXPECT_FAILED) {
    await complete(TENANTS[0].key, { prompt: doc, max_tokens: 4 });
    const warm = await complete(TENANTS[0].key, { prompt: doc, max_tokens: 4 });
    const ad = await complete(TENANTS[0].key, { prompt: doc, max_tokens: 8, adapter: 'ft' });
    const ct = (r) => (r.json && r.json.usage && r.json.usage.prompt_tokens_details &&
      r.json.usage.prompt_tokens_details.cached_tokens) || 0;
    if (ad.status !== 200) fail(`adapter prefix probe: ${ad.status} ${ad.raw}`);
    else if (warm.status === 200 && ct(ad) !== 0)
      fail(`adapter prefix probe: a request with an adapter reused ${ct(ad)} tokens cached without it`);
  }
  return jobs;
}

function allCanaries() { return TENANTS.map((_, i) => canary(i)); }

function checkNoCanary(where, text) {
  for (const c of allCanaries()) if (text.includes(c)) fail(`${where}: output contains canary ${c}`);
}

async function main() {
  // 1. references, each request alone
  const jobs = [];
  TENANTS.forEach((t, i) => {
    for (let k = 0; k < 2; k++) {
      const prompt = `${canary(i)} ${TEXTS[(i + k) % TEXTS.length]}`;
      jobs.push({ tenant: t, ti: i, prompt, max_tokens: 12 + 7 * ((i + k) % 5) });
    }
  });
  for (const j of jobs) {
    const r = await complete(j.tenant.key, { prompt: j.prompt, max_tokens: j.max_tokens }, { base: REF_URL });
    if (r.status !== 200) { fail(`reference ${j.tenant.name}: status ${r.status} ${r.raw}`); continue; }
    j.ref = r.json.choices[0].text;
    checkNoCanary(`reference ${j.tenant.name}`, j.ref);
  }
  // 2. prefix cache probe, alone: tenant 0 twice, then tenant 1 once
  const doc = (i, n) => complete(TENANTS[i].key, { prompt: SHARED_DOC, max_tokens: n });
  const p0 = EXPECT_FAILED ? null : await doc(0, 8), p0b = EXPECT_FAILED ? null : await doc(0, 8);
  const p1 = EXPECT_FAILED ? null : await doc(1, 8);
  const cached = (r) => (r.json && r.json.usage && r.json.usage.prompt_tokens_details &&
    r.json.usage.prompt_tokens_details.cached_tokens) || 0;
  if (EXPECT_FAILED) { /* faults may hit the probe: skipped */ }
  else if (p0.status !== 200 || p0b.status !== 200 || p1.status !== 200) fail('prefix probe: non-200');
  else {
    if (cached(p0b) <= 0 && !NO_PREFIX) fail('prefix cache: the same tenant did not reuse its own prefix (cache off?)');
    if (cached(p1) !== 0) fail(`prefix cache: tenant ${TENANTS[1].name} reused ${cached(p1)} tokens of another tenant's prompt`);
    if (p0.json.choices[0].text !== p1.json.choices[0].text || p0.json.choices[0].text !== p0b.json.choices[0].text)
      fail('prefix cache: cached and uncached outputs differ');
  }

  // 2b. LoRA adapters: uploads, references, the guess, the prefix probe
  const adJobs = await adapterPhase();
  // 3. everything at once
  const longPrompt = 'And the LORD said unto Moses, '.repeat(120);
  const tasks = [];
  for (const j of adJobs) {
    tasks.push(complete(j.tenant.key, { prompt: j.prompt, max_tokens: j.max_tokens, adapter: 'ft' })
      .then((r) => ({ j, r, kind: 'adapter' })));
    tasks.push(complete(j.tenant.key, { prompt: j.prompt, max_tokens: j.max_tokens, adapter: 'ft' }, { stream: true })
      .then((r) => ({ j, r, kind: 'adapter-stream' })));
  }
  for (const j of jobs) {
    tasks.push(complete(j.tenant.key, { prompt: j.prompt, max_tokens: j.max_tokens })
      .then((r) => ({ j, r, kind: 'plain' })));
    tasks.push(complete(j.tenant.key, { prompt: j.prompt, max_tokens: j.max_tokens }, { stream: true })
      .then((r) => ({ j, r, kind: 'stream' })));
    // With a swapped block table the victim must be a request whose whole
    // output is checked: a client that hangs up would hide both the clean
    // failure (tag check on) and the foreign tokens (tag check off).
    if (!EXPECT_VIOLATION)
      tasks.push(complete(j.tenant.key, { prompt: j.prompt, max_tokens: 200 }, { stream: true, abortAfterChunks: 2 })
        .then((r) => ({ j, r, kind: 'disconnect' })));
  }
  TENANTS.forEach((t, i) => {
    tasks.push(complete(t.key, { prompt: `${canary(i)} ${longPrompt}`, max_tokens: 64 })
      .then((r) => ({ j: { tenant: t }, r, kind: 'overlong' })));
  });
  const results = await Promise.all(tasks);
  let serverErrors = 0;
  for (const { j, r, kind } of results) {
    const who = `${kind} ${j.tenant.name}`;
    if (kind === 'overlong') {
      const code = r.json && r.json.error && r.json.error.code;
      if (r.status !== 400 || code !== 'context_length_exceeded')
        fail(`${who}: expected 400 context_length_exceeded, got ${r.status} ${r.raw ? r.raw.slice(0, 200) : ''}`);
      if (r.json && r.json.choices) fail(`${who}: a rejected request returned tokens`);
      continue;
    }
    if (kind === 'disconnect') { checkNoCanary(who, r.text || ''); continue; }
    let text = null;
    const streamed = kind === 'stream' || kind === 'adapter-stream';
    if (r.status === 200 && !streamed) text = r.json.choices[0].text;
    if (r.status === 200 && streamed && r.done && !r.error) text = r.text;
    if (text === null) {
      serverErrors++;
      const clean = (r.status >= 400 && r.json && r.json.error && !r.json.choices) ||
        (r.status === 200 && streamed && r.error);
      if (EXPECT_FAILED && clean) {
        checkNoCanary(who, r.text || '');
        // what streamed before the error must be the start of the right answer
        if (r.text && !j.ref.startsWith(r.text)) fail(`${who}: partial output before the error is wrong: ${JSON.stringify(r.text)}`);
        continue;
      }
      if (!EXPECT_VIOLATION) fail(`${who}: failed (status ${r.status}, ${JSON.stringify(r.error || r.raw || '').slice(0, 200)})`);
      continue;
    }
    checkNoCanary(who, text);
    if (text !== j.ref) fail(`${who}: output differs from its isolated reference\n  got:  ${JSON.stringify(text)}\n  want: ${JSON.stringify(j.ref)}`);
  }
  const v = await metric('kvseal_isolation_violations_total');
  if (EXPECT_VIOLATION) {
    if (v !== 1) fail(`fault injected: isolation violations = ${v}, expected exactly 1`);
    if (serverErrors !== 1) fail(`fault injected: ${serverErrors} requests failed, expected exactly 1`);
  } else if (v !== 0) fail(`isolation violations = ${v}`);
  // a fault that closes a data link before the first token makes the router
  // start the request over on another prefill worker (it then succeeds):
  // that counts as the fault taking effect, as a clean failure does
  const replaced = EXPECT_FAILED ? (await metric('kvseal_model_replaced_total')) || 0 : 0;
  if (EXPECT_FAILED && serverErrors === 0 && replaced === 0)
    fail('fault injected, but no request failed or started over (the fault never fired?)');
  if (EXPECT_FAILED) console.log(`fault run: ${serverErrors} requests failed cleanly, ${replaced} started over`);

  // the adapters go (scrubbed once no request holds them), then
  // 4. afterwards: every page FREE and scrubbed
  for (let i = 0; i < adJobs.length; i++) {
    const r = await admin('DELETE', `/admin/adapters/${TENANTS[i].name}/ft`);
    if (r.status !== 200) fail(`adapter removal: ${r.status} ${r.raw}`);
  }
  const chk = await fetch(`${URL_}/admin/kv/check?timeout_ms=${1000 * Number(process.env.KS_WAIT_S || 60)}`, { headers: { authorization: `Bearer ${ADMIN}` } });
  const cj = await chk.json().catch(() => ({}));
  if (chk.status !== 200 || cj.clean !== true) fail(`kv pool after the run: ${chk.status} ${JSON.stringify(cj)}`);

  const n = results.length + jobs.length + 3;
  console.log(`leak suite: ${n} requests, ${failures.length} failures`);
  process.exit(failures.length ? 1 : 0);
}

main().catch((e) => { console.error('LEAK SUITE ERROR: ' + (e.stack || e)); process.exit(2); });
