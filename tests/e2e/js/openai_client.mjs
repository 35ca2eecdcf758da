// openai_client.mjs — the official `openai` npm client against kvseal:
// chat and text completions, streaming and not, checking content against
// the kjv-mini reference continuation, usage, logprobs, and errors as the
// client surfaces them (APIError with status and code).
// KS_OPENAI_PKG picks the client's major: 'openai' (4.x, the default) or
// 'openai6' (6.x, npm alias in package.json); 6.x percent-encodes the path
// parameter of models.retrieve, so a model id with a slash arrives as %2F.
const pkg = process.env.KS_OPENAI_PKG || 'openai';
const { default: OpenAI } = await import(pkg);

const REF = ' of the Lord, and in the Lord Jesus Christ. And I will send my voice, and will not hear the ' +
  'word of God, but that the Lord Jesus Christ is in the Lord Jesus. And I say unto you, that ye may be ' +
  'the Lord Jesus Christ, and the Lord Jesus Christ,';
const client = new OpenAI({ baseURL: `${process.env.KS_URL}/v1`, apiKey: process.env.KS_KEY, maxRetries: 0 });
const model = process.env.KS_MODEL_NAME;
let failures = 0;
const check = (cond, msg) => { if (!cond) { failures++; console.error('FAIL: ' + msg); } };

const models = await client.models.list();
check(models.data.some((m) => m.id === model), `models.list lacks ${model}: ${JSON.stringify(models.data)}`);
const one = await client.models.retrieve(model);
check(one.id === model && one.object === 'model', `models.retrieve(${model}): ${JSON.stringify(one)}`);
await expectError(() => client.models.retrieve('org/nope'), 404, 'model_not_found', 'retrieve unknown');

const c1 = await client.completions.create({ model, prompt: 'In the beginning', max_tokens: 60, temperature: 0 });
check(c1.choices[0].text === REF, `completions text: ${JSON.stringify(c1.choices[0].text)}`);
check(c1.usage.prompt_tokens === 5 && c1.usage.completion_tokens === 60 && c1.usage.total_tokens === 65,
  `completions usage: ${JSON.stringify(c1.usage)}`);
check(c1.choices[0].finish_reason === 'length', `finish_reason ${c1.choices[0].finish_reason}`);

const ch = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'In the beginning' }], max_tokens: 60, temperature: 0,
  logprobs: true, top_logprobs: 2,
});
check(ch.choices[0].message.role === 'assistant', 'chat role');
check(ch.choices[0].message.content === REF, `chat content: ${JSON.stringify(ch.choices[0].message.content)}`);
const lp = ch.choices[0].logprobs && ch.choices[0].logprobs.content;
check(Array.isArray(lp) && lp.length === 60 && lp[0].top_logprobs.length === 2 && lp[0].logprob <= 0,
  `chat logprobs: ${JSON.stringify(lp && lp[0])}`);

let text = '', sawRole = false, finish = null, usage = null;
const stream = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'In the beginning' }], max_tokens: 60, temperature: 0,
  stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  const c = chunk.choices[0];
  if (!c) continue;
  if (c.delta.role) sawRole = true;
  if (c.delta.content) text += c.delta.content;
  if (c.finish_reason) finish = c.finish_reason;
}
check(sawRole && text === REF && finish === 'length', `chat stream: role ${sawRole} finish ${finish} text ${JSON.stringify(text)}`);
check(usage && usage.completion_tokens === 60, `stream usage ${JSON.stringify(usage)}`);

let ctext = '';
for await (const chunk of await client.completions.create({ model, prompt: 'In the beginning', max_tokens: 60, temperature: 0, stream: true }))
  ctext += chunk.choices[0] ? chunk.choices[0].text : '';
check(ctext === REF, `completions stream text ${JSON.stringify(ctext)}`);

async function expectError(fn, status, code, what) { // (hoisted: used above too)
  try { await fn(); check(false, `${what}: no error`); } catch (e) {
    check(e.status === status && (!code || e.code === code), `${what}: got ${e.status} ${e.code} ${e.message}`);
  }
}
await expectError(() => client.completions.create({ model: 'nope', prompt: 'x', max_tokens: 5 }), 404, 'model_not_found', 'unknown model');
await expectError(() => client.completions.create({ model, prompt: 'In the beginning '.repeat(200), max_tokens: 10 }), 400, 'context_length_exceeded', 'over-long');
await expectError(() => new OpenAI({ baseURL: `${process.env.KS_URL}/v1`, apiKey: 'sk-wrong', maxRetries: 0 })
  .completions.create({ model, prompt: 'x', max_tokens: 5 }), 401, null, 'wrong key');

console.log(`openai client (${pkg}): ${failures} failures`);
process.exit(failures ? 1 : 0);
