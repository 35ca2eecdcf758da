// sampling.mjs — issue 12's sampling features through the official `openai`
// npm client against kvseal serve: n > 1 (each choice reproducible from
// its seed, equal to the n=1 request with seed + i; usage counts the
// prompt once and every choice's tokens; streamed deltas carry their
// index), echo with prompt logprobs (max_tokens 0, as lm-evaluation-harness
// sends it), logit_bias (ban and force), best_of (the n best by mean
// logprob; not streamable) and the 400s with `param` named.
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: `${process.env.KS_URL}/v1`, apiKey: process.env.KS_KEY, maxRetries: 0 });
const model = process.env.KS_MODEL_NAME;
let failures = 0;
const check = (cond, msg) => { if (!cond) { failures++; console.error('FAIL: ' + msg); } };
const J = JSON.stringify;
const prompt = 'And God said, Let there be light: and there was light. And God saw the light';

// n = 3, seeded: choice i equals the n=1 request with seed + i
const base = { model, prompt, max_tokens: 12, temperature: 1, seed: 4242, ignore_eos: true };
const c3 = await client.completions.create({ ...base, n: 3 });
check(c3.choices.length === 3, `n=3: ${c3.choices.length} choices`);
check(c3.choices.every((c, i) => c.index === i), `n=3 indices ${J(c3.choices.map((c) => c.index))}`);
const one = [];
for (let i = 0; i < 3; i++) one.push(await client.completions.create({ ...base, seed: 4242 + i }));
for (let i = 0; i < 3; i++)
  check(c3.choices[i].text === one[i].choices[0].text,
    `choice ${i} ${J(c3.choices[i].text)} != seed+${i} alone ${J(one[i].choices[0].text)}`);
check(new Set(c3.choices.map((c) => c.text)).size > 1, `n=3 choices all equal: ${J(c3.choices)}`);
const p1 = one[0].usage.prompt_tokens;
check(c3.usage.prompt_tokens === p1 && c3.usage.completion_tokens === 36 && c3.usage.total_tokens === p1 + 36,
  `n=3 usage ${J(c3.usage)} (prompt ${p1})`);
const again = await client.completions.create({ ...base, n: 3 });
check(J(again.choices.map((c) => c.text)) === J(c3.choices.map((c) => c.text)), 'n=3 not reproducible');

// chat, n = 2, streamed: deltas interleave with their index
const msgs = [{ role: 'user', content: 'In the beginning' }];
const texts = ['', ''], fins = [null, null];
let usage = null;
const st = await client.chat.completions.create({ model, messages: msgs, n: 2, max_tokens: 10, temperature: 1,
  seed: 9, stream: true, stream_options: { include_usage: true } });
for await (const chunk of st) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    check(c.index === 0 || c.index === 1, `stream index ${c.index}`);
    if (c.delta && c.delta.content) texts[c.index] += c.delta.content;
    if (c.finish_reason) fins[c.index] = c.finish_reason;
  }
}
const chat2 = await client.chat.completions.create({ model, messages: msgs, n: 2, max_tokens: 10, temperature: 1, seed: 9 });
check(texts[0] === chat2.choices[0].message.content && texts[1] === chat2.choices[1].message.content,
  `chat stream ${J(texts)} != ${J(chat2.choices.map((c) => c.message.content))}`);
check(fins.every((f) => f), `chat stream finish ${J(fins)}`);
check(usage && usage.completion_tokens === chat2.usage.completion_tokens, `chat stream usage ${J(usage)}`);

// echo + prompt logprobs, max_tokens 0 (lm-evaluation-harness loglikelihood)
const ec = await client.completions.create({ model, prompt, echo: true, logprobs: 5, max_tokens: 0, temperature: 0 });
const lp = ec.choices[0].logprobs;
check(ec.choices[0].text === prompt, `echo text ${J(ec.choices[0].text)}`);
check(lp && lp.tokens.length === p1 && lp.token_logprobs.length === p1 && lp.top_logprobs.length === p1 &&
  lp.text_offset.length === p1, `echo logprobs lengths ${J(lp && lp.tokens.length)} want ${p1}`);
check(lp.token_logprobs[0] === null && lp.top_logprobs[0] === null, `first prompt token: ${J(lp.token_logprobs[0])}`);
check(lp.token_logprobs.slice(1).every((x) => typeof x === 'number' && x <= 0), 'prompt logprobs not <= 0');
check(lp.top_logprobs.slice(1).every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 5), 'top_logprobs sizes');
check(lp.text_offset.every((x, i) => i === 0 || x >= lp.text_offset[i - 1]), 'text_offset not monotone');
check(ec.usage.completion_tokens === 0 && ec.usage.prompt_tokens === p1, `echo usage ${J(ec.usage)}`);
// the same prompt scored again: identical (deterministic), and with one
// generated token the prompt part is unchanged
const ec1 = await client.completions.create({ model, prompt, echo: true, logprobs: 1, max_tokens: 1, temperature: 0 });
const lp1 = ec1.choices[0].logprobs;
check(lp1.tokens.length === p1 + 1 && ec1.choices[0].text.startsWith(prompt), `echo max_tokens 1: ${J(lp1.tokens.length)}`);
check(lp1.token_logprobs.slice(1, p1).every((x, i) => Math.abs(x - lp.token_logprobs[i + 1]) < 1e-4),
  'echo prompt logprobs differ between max_tokens 0 and 1');

// logit_bias: ban the greedy first token (' of' after 'In the beginning');
// force another (' the') at temperature 1
const ids = process.env.KS_BIAS_IDS.split(',').map(Number); // [id of ' of', id of ' the']
const gp = { model, prompt: 'In the beginning', max_tokens: 1, temperature: 0 };
const g = await client.completions.create(gp);
check(g.choices[0].text === ' of', `greedy first token ${J(g.choices[0].text)}`);
const banned = await client.completions.create({ ...gp, logit_bias: { [ids[0]]: -100 } });
check(banned.choices[0].text !== ' of', `banned token still chosen: ${J(banned.choices[0].text)}`);
const forced = await client.completions.create({ ...gp, max_tokens: 3, temperature: 1, seed: 1,
  logit_bias: { [ids[1]]: 100 } });
check(forced.choices[0].text === ' the the the', `forced text ${J(forced.choices[0].text)}`);
const cforced = await client.chat.completions.create({ model, messages: msgs, max_tokens: 2, temperature: 1,
  logit_bias: { [ids[1]]: 100 } });
check(cforced.choices[0].message.content === ' the the', `chat forced ${J(cforced.choices[0].message.content)}`);

// best_of: n best of best_of candidates by mean logprob
const bo = await client.completions.create({ ...base, n: 2, best_of: 4, logprobs: 1 });
check(bo.choices.length === 2, `best_of choices ${bo.choices.length}`);
const mean = (c) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0) / c.logprobs.token_logprobs.length;
check(mean(bo.choices[0]) >= mean(bo.choices[1]) - 1e-9, `best_of order ${mean(bo.choices[0])} < ${mean(bo.choices[1])}`);
const cands = [];
for (let i = 0; i < 4; i++) cands.push(await client.completions.create({ ...base, seed: 4242 + i, logprobs: 1 }));
const best = cands.map((c) => c.choices[0]).sort((a, b) => mean(b) - mean(a));
check(bo.choices[0].text === best[0].text && bo.choices[1].text === best[1].text,
  `best_of picked ${J(bo.choices.map((c) => c.text))}, want ${J(best.slice(0, 2).map((c) => c.text))}`);
check(bo.usage.completion_tokens === 48, `best_of usage counts every candidate: ${J(bo.usage)}`);

async function expectError(fn, param, what) {
  try { await fn(); check(false, `${what}: no error`); } catch (e) {
    check(e.status === 400 && e.param === param, `${what}: got ${e.status} ${e.param} ${e.message}`);
  }
}
await expectError(() => client.completions.create({ ...base, n: 17 }), 'n', 'n=17');
await expectError(() => client.completions.create({ ...base, n: 0 }), 'n', 'n=0');
await expectError(() => client.completions.create({ ...base, n: 3, best_of: 2 }), 'best_of', 'best_of < n');
await expectError(() => client.completions.create({ ...base, best_of: 3, stream: true }), 'best_of', 'best_of stream');
await expectError(() => client.completions.create({ ...base, logit_bias: { 99999999: 1 } }), 'logit_bias', 'bias id');
await expectError(() => client.completions.create({ ...base, logit_bias: { 5: 101 } }), 'logit_bias', 'bias value');
await expectError(() => client.completions.create({ ...base, logit_bias: { abc: 1 } }), 'logit_bias', 'bias key');
await expectError(() => client.completions.create({ ...base, max_tokens: 0 }), 'max_tokens', 'max_tokens 0 without echo');
const many = {};
for (let i = 0; i < 1025; i++) many[i] = 1;
await expectError(() => client.completions.create({ ...base, logit_bias: many }), 'logit_bias', 'bias > 1024 entries');

if (failures) { console.error(`${failures} failure(s)`); process.exit(1); }
console.log('sampling ok');
