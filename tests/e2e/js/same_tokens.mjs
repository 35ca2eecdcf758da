// same_tokens.mjs — runs one mix of 16 concurrent requests against two
// servers (A = `kvseal serve`, B = `kvseal router` with its workers) and
// requires identical answers: text, finish reason, token counts and, where
// asked for, the per-token logprobs (token for token). Greedy requests of
// varied prompt lengths and max_tokens, some seeded sampled ones (the
// sampler state crosses the wire in DONE), some streamed, some with stop
// strings (applied by the router), some ignoring EOS. Then the issue-12 mix:
// GBNF grammars and JSON schemas (the first token is sampled under the mask
// on the prefill worker, the rest on decode), logit_bias (force and ban),
// penalties (their history starts at the prefill worker's first token), n
// and best_of, and chat tool calls forced by tool_choice (needs the servers
// started with a chat template and --tool-call-format hermes; run when
// SAME_FEATURES is set).
// Env: URL_A, URL_B, SAME_MODEL, SAME_FEATURES. Exit 0 = identical, 1 = a difference.

const A = process.env.URL_A, B = process.env.URL_B;
const MODEL = process.env.SAME_MODEL || 'kjv-mini';
const TEXTS = [
  'In the beginning God created the heaven and the earth.',
  'And God said, Let there be light: and there was light.',
  'The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures:',
  'Blessed are the meek: for they shall inherit the earth.',
  'And it came to pass, when men began to multiply on the face of the earth,',
  'For God so loved the world,',
  'Jesus wept.',
  'Now these are the generations of the sons of Noah, Shem, Ham, and Japheth: and unto them were sons born after the flood. '.repeat(3),
];

function requests() {
  const out = [];
  for (let i = 0; i < 16; i++) {
    const body = { model: MODEL, prompt: TEXTS[i % TEXTS.length], max_tokens: 8 + 5 * (i % 7), temperature: 0 };
    if (i % 4 === 1) { body.logprobs = 3; }
    if (i % 5 === 2) { body.temperature = 0.9; body.seed = 1000 + i; body.top_k = 40; body.top_p = 0.95; }
    if (i % 6 === 3) body.stop = ['LORD', ','];
    if (i % 7 === 4) body.ignore_eos = true;
    out.push({ body, stream: i % 3 === 0 });
  }
  return out;
}

async function run(base, { body, stream }) {
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream, ...(stream ? { stream_options: { include_usage: true } } : {}) }),
  });
  const txt = await res.text();
  if (res.status !== 200) return { status: res.status, raw: txt };
  if (!stream) {
    const j = JSON.parse(txt);
    const c = j.choices[0];
    return { status: 200, text: c.text, finish: c.finish_reason, usage: j.usage.completion_tokens,
             logprobs: c.logprobs ? JSON.stringify(c.logprobs) : null };
  }
  let text = '', finish = null, usage = null;
  const lp = [];
  for (const ev of txt.split('\n\n')) {
    if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
    const j = JSON.parse(ev.slice(6));
    if (j.usage) usage = j.usage.completion_tokens;
    const c = j.choices && j.choices[0];
    if (!c) continue;
    text += c.text || '';
    if (c.finish_reason) finish = c.finish_reason;
    if (c.logprobs) lp.push(JSON.stringify(c.logprobs));
  }
  return { status: 200, text, finish, usage, logprobs: lp.length ? lp.join('|') : null };
}

const WORDS = 'root ::= [ ]? [A-Za-z]+ ([ ,] [A-Za-z]+){2,6} "."';
const PERSON = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer' },
  tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 3 } }, required: ['name', 'age', 'tags'] };
const TOOLS = [{ type: 'function', function: { name: 'get_verse', description: 'look a verse up',
  parameters: { type: 'object', properties: { book: { type: 'string', maxLength: 10 }, chapter: { type: 'integer' } },
    required: ['book', 'chapter'] } } },
{ type: 'function', function: { name: 'count', parameters: { type: 'object', properties: { n: { type: 'integer' } },
  required: ['n'] } } }];

// [path, body, stream]: every feature once greedy, and sampled where the
// sampler state matters
function features() {
  const c = (extra, stream = false) => ['/v1/completions', { model: MODEL, prompt: TEXTS[0], max_tokens: 24,
    temperature: 0, ...extra }, stream];
  const chat = (extra, stream = false) => ['/v1/chat/completions', { model: MODEL, max_tokens: 150, temperature: 0,
    messages: [{ role: 'user', content: 'Which verse says Jesus wept?' }], tools: TOOLS, ...extra }, stream];
  return [
    c({ grammar: WORDS }),
    c({ grammar: WORDS, temperature: 0.9, seed: 7 }, true),
    c({ grammar: 'root ::= ""' }),
    c({ response_format: { type: 'json_schema', json_schema: { name: 'p', schema: PERSON, strict: true } }, max_tokens: 60 }),
    c({ response_format: { type: 'json_schema', json_schema: { name: 'p', schema: PERSON } }, max_tokens: 60,
      temperature: 1, seed: 11 }, true),
    c({ response_format: { type: 'json_object' }, max_tokens: 16, temperature: 0.8, seed: 3 }),
    c({ logit_bias: { 500: 100 }, max_tokens: 6 }),
    c({ logit_bias: { 300: -100, 13: -100, 1576: 4 }, ignore_eos: true }),
    c({ logit_bias: { 450: 5, 278: -3 }, temperature: 1, seed: 5 }, true),
    c({ frequency_penalty: 1.5, presence_penalty: 0.5, ignore_eos: true, max_tokens: 40 }),
    c({ repeat_penalty: 1.5, repeat_last_n: 16, temperature: 0.7, seed: 21, ignore_eos: true, max_tokens: 40 }),
    c({ n: 3, temperature: 1, seed: 99, max_tokens: 12 }),
    c({ n: 2, temperature: 1, seed: 98, max_tokens: 12 }, true),
    c({ best_of: 3, temperature: 1, seed: 97, max_tokens: 10 }),
    chat({ tool_choice: 'required' }),
    chat({ tool_choice: { type: 'function', function: { name: 'count' } } }, true),
    chat({ tool_choice: 'required', temperature: 1, seed: 1234 }),
  ];
}

// every choice's text / message, tool calls without their (random) ids
async function runFeature(base, [path, body, stream]) {
  const res = await fetch(`${base}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream }),
  });
  const txt = await res.text();
  if (res.status !== 200) return { status: res.status, raw: txt };
  const ch = {};
  const get = (i) => (ch[i] ||= { text: '', tools: {}, finish: null });
  if (!stream) {
    for (const c of JSON.parse(txt).choices) {
      const o = get(c.index);
      o.text = c.text ?? c.message.content ?? '';
      for (const [k, t] of (c.message?.tool_calls || []).entries()) o.tools[k] = [t.function.name, t.function.arguments];
      o.finish = c.finish_reason;
    }
  } else {
    for (const ev of txt.split('\n\n')) {
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      for (const c of JSON.parse(ev.slice(6)).choices || []) {
        const o = get(c.index);
        o.text += c.text ?? c.delta?.content ?? '';
        for (const t of c.delta?.tool_calls || []) {
          const cur = (o.tools[t.index] ||= ['', '']);
          cur[0] += t.function?.name || '';
          cur[1] += t.function?.arguments || '';
        }
        if (c.finish_reason) o.finish = c.finish_reason;
      }
    }
  }
  return { status: 200, choices: Object.keys(ch).sort().map((k) => ch[k]) };
}

async function main() {
  const reqs = requests();
  const a = await Promise.all(reqs.map((r) => run(A, r)));
  const b = await Promise.all(reqs.map((r) => run(B, r)));
  let bad = 0;
  for (let i = 0; i < reqs.length; i++) {
    const sa = JSON.stringify(a[i]), sb = JSON.stringify(b[i]);
    if (a[i].status !== 200) { console.error(`request ${i}: serve answered ${sa}`); bad++; continue; }
    if (sa !== sb) {
      console.error(`request ${i} differs (${JSON.stringify(reqs[i].body)}):\n  serve:  ${sa}\n  router: ${sb}`);
      bad++;
    }
  }
  const toks = a.reduce((n, x) => n + (x.usage || 0), 0);
  console.log(`same tokens: ${reqs.length} requests, ${toks} generated tokens, ${bad} differences`);
  const fs = process.env.SAME_FEATURES ? features() : [];
  const fa = await Promise.all(fs.map((r) => runFeature(A, r)));
  const fb = await Promise.all(fs.map((r) => runFeature(B, r)));
  let fbad = 0;
  for (let i = 0; i < fs.length; i++) {
    const sa = JSON.stringify(fa[i]), sb = JSON.stringify(fb[i]);
    if (fa[i].status !== 200) { console.error(`feature ${i}: serve answered ${sa}`); fbad++; continue; }
    if (sa !== sb) {
      console.error(`feature ${i} differs (${fs[i][0]} ${JSON.stringify(fs[i][1]).slice(0, 300)}):\n  serve:  ${sa}\n  router: ${sb}`);
      fbad++;
    }
  }
  // the mix must exercise what it names: forced tool calls and parsed JSON
  const tc = fa.filter((x) => x.status === 200 && x.choices.some((c) => Object.keys(c.tools).length)).length;
  if (fs.length && tc < 3) { console.error(`only ${tc} answers carried tool calls`); fbad++; }
  for (const i of fs.length ? [3, 4] : []) {
    try { JSON.parse(fa[i].choices[0].text); } catch { console.error(`feature ${i}: not JSON: ${fa[i].choices?.[0]?.text}`); fbad++; }
  }
  console.log(`same features: ${fs.length} requests, ${fbad} differences`);
  bad += fbad;
  process.exit(bad ? 1 : 0);
}
main().catch((e) => { console.error(e.stack || e); process.exit(2); });
