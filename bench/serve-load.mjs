// serve-load.mjs URL MODEL CONCURRENCY REQUESTS SEED — one load level against
// an OpenAI-compatible server: CONCURRENCY clients send REQUESTS streamed
// completions in all (each client its next one as soon as its last ends),
// prompt and answer lengths drawn from log-normal spreads (seeded, so both
// engines of a round get the same requests): prompts median PMED (env, 300)
// words-ish tokens clipped to [PMIN 50, PMAX 2000], answers median AMED
// (100) clipped to [AMIN 16, AMAX 512], answers forced to their length
// (ignore_eos). Each prompt starts with a unique salt, so no prefix is
// shared. Prints one JSON line: output tokens/s over the level's wall time,
// time to first token and time per output token (after the first) p50/p99
// in ms, prompt tokens, requests done and failed; and the time to first
// token per 100 prompt tokens asked for (ttft_n_p50/p99, ms), the same
// requests' prompt lengths p50/p99 (plen_p50/p99): a log-normal spread of
// prompts spreads the time to first token as much, so this is the figure
// that shows whether a request waited for others (starvation) or only for
// its own prompt. Env KEY: a bearer key to send; ADAPTERS: a comma list of
// LoRA adapter names, request i naming the (i mod n)-th (bench/lora-serve.sh).
const [URL_, MODEL, C_, N_, SEED_] = process.argv.slice(2);
const C = Number(C_), N = Number(N_);
let seed = BigInt(SEED_ || 1) * 0x9e3779b97f4a7c15n & 0xffffffffffffffffn;
const env = (k, d) => Number(process.env[k] || d);
const [PMED, PMIN, PMAX] = [env('PMED', 300), env('PMIN', 50), env('PMAX', 2000)];
const [AMED, AMIN, AMAX] = [env('AMED', 100), env('AMIN', 16), env('AMAX', 512)];

function rnd() {  // xorshift64*, uniform (0, 1)
  seed ^= seed >> 12n; seed ^= (seed << 25n) & 0xffffffffffffffffn; seed ^= seed >> 27n;
  const v = (seed * 0x2545f4914f6cdd1dn) & 0xffffffffffffffffn;
  return (Number(v >> 11n) + 0.5) / 9007199254740992;
}
function lognormal(median, sigma, lo, hi) {  // Box-Muller, clipped
  const z = Math.sqrt(-2 * Math.log(rnd())) * Math.cos(2 * Math.PI * rnd());
  return Math.max(lo, Math.min(hi, Math.round(median * Math.exp(sigma * z))));
}
const WORDS = ('In the beginning God created the heaven and the earth And the earth was without ' +
  'form and void and darkness was upon the face of the deep').split(' ');
function prompt(tokens, salt) {  // about `tokens` tokens: ~1.3 tokens a word of this text
  const w = [`${salt}:`];
  for (let i = 0; w.length < Math.max(2, Math.round(tokens / 1.3)); i++)
    w.push(WORDS[(i * 7 + salt) % WORDS.length]);
  return w.join(' ');
}
const reqs = [];
for (let i = 0; i < N; i++) {
  const n = lognormal(PMED, 1.0, PMIN, PMAX);
  reqs.push({ p: prompt(n, Number(SEED_) * 100003 + i), n, a: lognormal(AMED, 0.8, AMIN, AMAX) });
}

const ADAPTERS = process.env.ADAPTERS ? process.env.ADAPTERS.split(',') : [];
reqs.forEach((r, i) => { if (ADAPTERS.length) r.adapter = ADAPTERS[i % ADAPTERS.length]; });

async function one(r) {
  const t0 = performance.now();
  const headers = { 'content-type': 'application/json' };
  if (process.env.KEY) headers.authorization = `Bearer ${process.env.KEY}`;
  const res = await fetch(`${URL_}/v1/completions`, {
    method: 'POST', headers,
    body: JSON.stringify({ model: MODEL, prompt: r.p, max_tokens: r.a, temperature: 0,
                           ignore_eos: true, stream: true,
                           stream_options: { include_usage: true },
                           ...(r.adapter ? { adapter: r.adapter } : {}) }),
  });
  if (res.status !== 200) throw new Error(`${res.status} ${await res.text()}`);
  const reader = res.body.getReader(), dec = new TextDecoder();
  let buf = '', first = 0, last = 0, chunks = 0, usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k); buf = buf.slice(k + 2);
      const d = ev.replace(/^data: ?/, '');
      if (!d || d === '[DONE]') continue;
      const j = JSON.parse(d);
      if (j.usage) usage = j.usage;
      if (j.choices && j.choices.length && j.choices[0].text) {
        const now = performance.now();
        if (!first) first = now;
        last = now; chunks++;
      }
    }
  }
  // without a usage chunk (llama-server left it off one stream in a run),
  // the answer's forced length: ignore_eos runs it to max_tokens
  const out = usage ? usage.completion_tokens : chunks ? r.a : 0;
  return { ttft: first - t0, tpot: out > 1 ? (last - first) / (out - 1) : NaN, out,
           pin: usage ? usage.prompt_tokens : 0, ttft_n: (first - t0) * 100 / r.n, n: r.n };
}

const pct = (a, q) => { const s = a.filter(Number.isFinite).sort((x, y) => x - y);
                        return s.length ? s[Math.min(s.length - 1, Math.floor(q * s.length))] : NaN; };
const done = [];
let next = 0, failed = 0, err = '';
const t0 = performance.now();
await Promise.all(Array.from({ length: C }, async () => {
  while (next < N) {
    const r = reqs[next++];
    try { done.push(await one(r)); } catch (e) { failed++; err = String(e).slice(0, 200); }
  }
}));
const wall = (performance.now() - t0) / 1000;
const outTok = done.reduce((s, d) => s + d.out, 0);
const r2 = (x) => Math.round(x * 100) / 100;
console.log(JSON.stringify({
  c: C, n: done.length, failed, out_tok_s: r2(outTok / wall), wall_s: r2(wall),
  ttft_p50: r2(pct(done.map((d) => d.ttft), 0.5)), ttft_p99: r2(pct(done.map((d) => d.ttft), 0.99)),
  tpot_p50: r2(pct(done.map((d) => d.tpot), 0.5)), tpot_p99: r2(pct(done.map((d) => d.tpot), 0.99)),
  ttft_n_p50: r2(pct(done.map((d) => d.ttft_n), 0.5)),
  ttft_n_p99: r2(pct(done.map((d) => d.ttft_n), 0.99)),
  plen_p50: pct(done.map((d) => d.n), 0.5), plen_p99: pct(done.map((d) => d.n), 0.99),
  prompt_tokens: done.reduce((s, d) => s + d.pin, 0), out_tokens: outTok, ...(err ? { err } : {}),
}));
