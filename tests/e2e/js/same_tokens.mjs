// same_tokens.mjs — runs one mix of 16 concurrent requests against two
// servers (A = `kvseal serve`, B = `kvseal router` with its workers) and
// requires identical answers: text, finish reason, token counts and, where
// asked for, the per-token logprobs (token for token). Greedy requests of
// varied prompt lengths and max_tokens, some seeded sampled ones (the
// sampler state crosses the wire in DONE), some streamed, some with stop
// strings (applied by the router), some ignoring EOS.
// Env: URL_A, URL_B, SAME_MODEL. Exit 0 = identical, 1 = a difference.

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
  process.exit(bad ? 1 : 0);
}
main().catch((e) => { console.error(e.stack || e); process.exit(2); });
