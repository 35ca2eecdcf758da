// fuzz.mjs — bad and random input against a live server: malformed and
// random-byte bodies, wrong types, random Unicode prompts (which make the
// model emit partial UTF-8 byte tokens), on every generation route. Every
// answer must be a well-formed HTTP reply with a JSON body of the right
// shape, and the server must still produce the reference completion at the
// end. Deterministic (seeded); bounded in count. Exit 0 = pass.
const URL_ = process.env.KS_URL;
const MODEL = process.env.KS_MODEL_NAME || 'kjv-mini';
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed % n; };
let failures = 0;
const fail = (m) => { failures++; console.error('FUZZ FAILURE: ' + m); };

async function post(path, body) {
  const res = await fetch(URL_ + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* checked below */ }
  if (!json) fail(`${path}: status ${res.status} with a non-JSON body: ${text.slice(0, 100)}`);
  if (res.status >= 400 && json && !(json.error || json.errors)) fail(`${path}: ${res.status} without an error object`);
  if (res.status >= 500 && res.status !== 503) fail(`${path}: server error ${res.status}: ${text.slice(0, 200)}`);
  return { status: res.status, json };
}

const routes = ['/v1/completions', '/v1/chat/completions', '/accounts/a/ai/run/kjv-mini'];
const fixed = ['', '{', '[]', 'null', '{"prompt":1}', '{"prompt":"x","max_tokens":-1}',
  '{"prompt":"x","max_tokens":1e30}', '{"prompt":"x","max_tokens":"5"}', '{"messages":[{"role":"user"}]}',
  '{"messages":"hi"}', '{"prompt":"x","stop":["a","b","c","d","e"]}', '{"prompt":"x","temperature":-1}',
  '{"prompt":"x","top_k":1e10}', '['.repeat(3000) + ']'.repeat(3000), '{"prompt":"x","n":2}',
  '{"prompt":"\\u0000abc","max_tokens":3}', '{"prompt":"\\ud800","max_tokens":3}', '{"prompt":"x","seed":-5}'];
for (const b of fixed) for (const r of routes) await post(r, b);
for (let i = 0; i < 150; i++) {
  const bytes = Buffer.from(Array.from({ length: rnd(120) }, () => rnd(256)));
  await post(routes[i % 3], bytes);
  let p = '';
  for (let k = rnd(40); k > 0; k--) p += String.fromCodePoint(32 + rnd(0x2fff));
  const body = { max_tokens: rnd(12) - 2, temperature: [0, 0.7, 1.5, -1, 'x', null][rnd(6)], seed: rnd(1000) };
  // each route's own fields (others are refused by name), so the prompt reaches generation
  const own = [{ model: MODEL, prompt: p }, { model: MODEL, messages: [{ role: 'user', content: p }] }, { prompt: p }];
  await post(routes[i % 3], JSON.stringify({ ...body, ...own[i % 3] }));
}
// near-flat sampling draws lone byte tokens (<0xE2> ...): pieces that are
// not yet valid UTF-8 must be held back, never sent or crashed on
for (let i = 0; i < 24; i++) {
  const body = { model: MODEL, max_tokens: 16, temperature: 2, top_k: 0, top_p: 1, min_p: 0, seed: i,
    stream: i % 2 === 1 };
  const own = i % 2 ? { messages: [{ role: 'user', content: 'In the beginning' }] } : { prompt: 'In the beginning' };
  const res = await fetch(URL_ + routes[i % 2], { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, ...own }) });
  const text = await res.text();
  if (res.status !== 200) fail(`flat sampling: status ${res.status}: ${text.slice(0, 200)}`);
}
const r = await post('/v1/completions', JSON.stringify({ model: MODEL, prompt: 'In the beginning', max_tokens: 8, temperature: 0 }));
if (r.status !== 200 || r.json.choices[0].text !== ' of the Lord, and in the Lord')
  fail(`server no longer answers correctly: ${r.status} ${JSON.stringify(r.json)}`);
console.log(`fuzz: ${failures} failures`);
process.exit(failures ? 1 : 0);
