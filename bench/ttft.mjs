// ttft.mjs URL_A URL_B TOKENS... — time to first token of one streamed
// completion at a time, alternating A and B (A/B/A/B... so the machine's
// drift hits both), REPEAT (env, 5) times per prompt length. Prints one JSON
// line per length: {tokens, prompt_tokens, a_ms, b_ms} with medians.
// SHARED=1: prefix reuse on B instead (see below).
const [A, B, ...lens] = process.argv.slice(2);
const REPEAT = Number(process.env.REPEAT || 5);
const WORDS = 'In the beginning God created the heaven and the earth And the earth was without form and void'.split(' ');

function prompt(n, salt) {  // ~n tokens of KJV-like words (about one token per word for kjv-mini)
  const w = [String(salt)];
  const words = Math.round(n * 0.78);  // kjv-mini: about 1.28 tokens per word of this text
  for (let i = 0; w.length < words; i++) w.push(WORDS[(i * 7 + salt) % WORDS.length]);
  return w.join(' ');
}

async function ttft(base, text) {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: process.env.KS_MODEL_NAME || 'kjv-mini', prompt: text, max_tokens: 2, temperature: 0, stream: true,
                           stream_options: { include_usage: true } }),
  });
  if (res.status !== 200) throw new Error(`${base}: ${res.status} ${await res.text()}`);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '', first = 0, usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (!first && j.choices && j.choices.length) first = performance.now() - t0;
      if (j.usage) usage = j.usage;
    }
  }
  return { ms: first, prompt_tokens: usage ? usage.prompt_tokens : 0 };
}

const median = (xs) => { const s = [...xs].sort((x, y) => x - y); return s[s.length >> 1]; };
if (process.env.SHARED === '1') {
  // a tenant's repeated document with a new question each time, on B only:
  // the first request computes the whole prompt, later ones find its full
  // pages in the prefill worker's prefix cache. {tokens, cold_ms, warm_ms}
  for (const n of lens.map(Number)) {
    const doc = prompt(n, 0), warm = [];
    const cold = await ttft(B, `${doc} question 0`);
    for (let r = 1; r <= REPEAT; r++) warm.push((await ttft(B, `${doc} question ${r}`)).ms);
    console.log(JSON.stringify({ tokens: n, prompt_tokens: cold.prompt_tokens, cold_ms: cold.ms, warm_ms: median(warm) }));
  }
  process.exit(0);
}
for (const n of lens.map(Number)) {
  const a = [], b = [];
  let pt = 0;
  for (let r = 0; r < REPEAT; r++) {
    const text = prompt(n, r + 1);  // distinct prompts: no prefix-cache help on either side
    const ra = await ttft(A, text), rb = await ttft(B, text);
    a.push(ra.ms); b.push(rb.ms); pt = ra.prompt_tokens;
  }
  console.log(JSON.stringify({ tokens: n, prompt_tokens: pt, a_ms: median(a), b_ms: median(b) }));
}
