// embed_client.mjs — the official `openai` npm client's embeddings.create and
// models.retrieve against kvseal (serve or the cluster router): vectors are
// normalized, base64 (the client's default) and float agree bit for bit, an
// input alone equals it batched with others and equals its token ids, usage
// counts tokens, and the errors come back with OpenAI's status and code.
// Writes the vectors to $KS_OUT (JSON) so serve and the cluster can be compared.
import OpenAI from 'openai';
import { writeFileSync } from 'node:fs';

const url = process.env.KS_URL, key = process.env.KS_KEY, model = process.env.KS_MODEL_NAME;
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0 });
let failures = 0;
const check = (cond, msg) => { if (!cond) { failures++; console.error('FAIL: ' + msg); } };
const A = 'In the beginning God created the heaven and the earth.';
const B = 'And the earth was without form, and void; and darkness was upon the face of the deep.';
const C = 'And God said, Let there be light: and there was light.';
const same = (x, y) => x.length === y.length && x.every((v, i) => Math.fround(v) === Math.fround(y[i]));
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

// models.retrieve: a known name, an unknown one
const m = await client.models.retrieve(model);
check(m.id === model && m.object === 'model', `models.retrieve: ${JSON.stringify(m)}`);
try {
  await client.models.retrieve('no-such-model');
  check(false, 'models.retrieve of an unknown model succeeded');
} catch (e) {
  check(e.status === 404 && e.code === 'model_not_found', `models.retrieve unknown: ${e.status} ${e.code}`);
}

// one input, the client's default (base64, decoded by the client) and float
const e1 = await client.embeddings.create({ model, input: A });
const va = Array.from(e1.data[0].embedding);
const E = va.length;
check(E > 0 && Math.abs(norm(va) - 1) < 1e-5, `norm ${norm(va)} of ${E} values`);
check(e1.object === 'list' && e1.data[0].object === 'embedding' && e1.data[0].index === 0, 'answer shape');
check(e1.model === model, `model echoed: ${e1.model}`);
const ntok = e1.usage.prompt_tokens;
check(ntok > 5 && e1.usage.total_tokens === ntok, `usage: ${JSON.stringify(e1.usage)}`);
const f1 = await client.embeddings.create({ model, input: A, encoding_format: 'float' });
check(same(f1.data[0].embedding, va), 'float and base64 differ');
const b64 = await client.embeddings.create({ model, input: A, encoding_format: 'base64' });
check(typeof b64.data[0].embedding === 'string' && Buffer.from(b64.data[0].embedding, 'base64').length === 4 * E,
  'base64 is a string of 4 * n_embd bytes');

// batched: order kept, A's vector bit-identical to A alone; B differs
const eb = await client.embeddings.create({ model, input: [B, A, C], encoding_format: 'float' });
check(eb.data.length === 3 && eb.data.every((d, i) => d.index === i), 'batch indexes');
check(same(eb.data[1].embedding, va), 'A batched with B and C differs from A alone');
check(!same(eb.data[0].embedding, va), 'B equals A');
const vb = eb.data[0].embedding;
check(eb.usage.prompt_tokens > 3 * 5, `batch usage ${JSON.stringify(eb.usage)}`);

// token ids: A's ids (what /tokenize gives with BOS) equal the text
const tk = await (await fetch(`${url}/tokenize`, {
  method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
  body: JSON.stringify({ content: A, add_special: true }),
})).json();
check(tk.tokens.length === ntok, `tokenize gives ${tk.tokens.length} ids, usage said ${ntok}`);
const ei = await client.embeddings.create({ model, input: tk.tokens, encoding_format: 'float' });
check(same(ei.data[0].embedding, va), 'ids input differs from text input');
const eii = await client.embeddings.create({ model, input: [tk.tokens, tk.tokens.slice(0, 3)], encoding_format: 'float' });
check(eii.data.length === 2 && same(eii.data[0].embedding, va), 'array of id arrays');
check(eii.usage.prompt_tokens === ntok + 3, `ids usage ${JSON.stringify(eii.usage)}`);

// dimensions: n_embd is fine, anything else a 400 naming it
const ed = await client.embeddings.create({ model, input: A, dimensions: E, encoding_format: 'float' });
check(same(ed.data[0].embedding, va), 'dimensions = n_embd');
const fails = async (what, body, status, code, param) => {
  try {
    await client.embeddings.create({ model, encoding_format: 'float', ...body });
    check(false, `${what}: succeeded`);
  } catch (e) {
    check(e.status === status && (!code || e.code === code) && (!param || e.param === param),
      `${what}: ${e.status} ${e.code} ${e.param} ${e.message}`);
  }
};
await fails('dimensions', { input: A, dimensions: E + 1 }, 400, 'unsupported_parameter', 'dimensions');
await fails('empty string', { input: '' }, 400, null, 'input');
await fails('empty array', { input: [] }, 400, null, 'input');
await fails('bad id', { input: [[1, 2, 99999999]] }, 400, null, 'input');
await fails('too long', { input: 'the '.repeat(400) }, 400, 'context_length_exceeded', 'input');
await fails('unknown model', { input: A, model: 'gpt-nope' }, 404, 'model_not_found', 'model');
const bad = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-wrong', maxRetries: 0 });
try {
  await bad.embeddings.create({ model, input: A });
  check(false, 'a wrong key was accepted');
} catch (e) {
  check(e.status === 401, `wrong key: ${e.status}`);
}

if (process.env.KS_OUT) writeFileSync(process.env.KS_OUT, JSON.stringify({ E, ntok, a: va, b: Array.from(vb) }));
if (failures) process.exit(1);
console.log(`embed client ok (${E} dimensions, ${ntok} tokens)`);
