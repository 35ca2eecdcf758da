// structured.mjs — structured output through `kvseal serve` on kjv-mini (a
// small model whose free output is never JSON): response_format with
// json_object and json_schema (the official client's
// beta.chat.completions.parse, plain create, streaming, /v1/completions) and
// llama.cpp's `grammar`. Every answer must parse and validate against its
// schema (the validator below covers the keywords kvseal compiles), at
// temperature 0 and at temperature 1 over several seeds.
import OpenAI from 'openai';
import { makeParseableResponseFormat } from 'openai/lib/parser';

const client = new OpenAI({ baseURL: `${process.env.KS_URL}/v1`, apiKey: process.env.KS_KEY, maxRetries: 0 });
const model = process.env.KS_MODEL_NAME;
let failures = 0, checks = 0;
const check = (cond, msg) => { checks++; if (!cond) { failures++; console.error('FAIL: ' + msg); } };

// ---------------------------------------------------------------------------
// A validator for the subset kvseal compiles (written here, independent of
// the grammar compiler)

const FORMATS = {
  date: /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$/,
  time: /^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$/,
  'date-time': /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$/,
  uuid: /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/,
};
const typeOf = (v) => v === null ? 'null' : Array.isArray(v) ? 'array'
  : Number.isInteger(v) ? 'integer' : typeof v;
const deepEq = (a, b) => JSON.stringify(a) === JSON.stringify(b);

function validate(v, s, root = s, path = '$') {
  if (s === true || Object.keys(s).length === 0) return null;
  if (s.$ref) {
    const name = s.$ref.replace(/^#\/(\$defs|definitions)\//, '');
    return validate(v, s.$ref === '#' ? root : (root.$defs || root.definitions)[name], root, path);
  }
  if ('const' in s) return deepEq(v, s.const) ? null : `${path}: not the const`;
  if (s.enum) return s.enum.some((e) => deepEq(e, v)) ? null : `${path}: ${JSON.stringify(v)} not in enum`;
  if (s.anyOf) return s.anyOf.some((x) => !validate(v, x, root, path)) ? null : `${path}: matches no anyOf branch`;
  if (s.oneOf) return s.oneOf.filter((x) => !validate(v, x, root, path)).length === 1 ? null : `${path}: not exactly one oneOf`;
  if (s.type) {
    const types = Array.isArray(s.type) ? s.type : [s.type];
    const t = typeOf(v);
    if (!types.some((x) => x === t || (x === 'number' && t === 'integer'))) return `${path}: type ${t}, want ${types}`;
  }
  const t = typeOf(v);
  if (t === 'object') {
    for (const r of s.required || []) if (!(r in v)) return `${path}: missing required ${r}`;
    for (const [k, x] of Object.entries(v)) {
      if (s.properties && k in s.properties) {
        const e = validate(x, s.properties[k], root, `${path}.${k}`);
        if (e) return e;
      } else if (s.additionalProperties === false) return `${path}: additional property ${k}`;
      else if (typeof s.additionalProperties === 'object') {
        const e = validate(x, s.additionalProperties, root, `${path}.${k}`);
        if (e) return e;
      }
    }
  }
  if (t === 'array') {
    if (s.minItems !== undefined && v.length < s.minItems) return `${path}: fewer than ${s.minItems} items`;
    if (s.maxItems !== undefined && v.length > s.maxItems) return `${path}: more than ${s.maxItems} items`;
    if (s.items) for (let i = 0; i < v.length; i++) {
      const e = validate(v[i], s.items, root, `${path}[${i}]`);
      if (e) return e;
    }
  }
  if (t === 'string') {
    const n = [...v].length;
    if (s.minLength !== undefined && n < s.minLength) return `${path}: shorter than ${s.minLength}`;
    if (s.maxLength !== undefined && n > s.maxLength) return `${path}: longer than ${s.maxLength}`;
    if (s.format && !FORMATS[s.format].test(v)) return `${path}: ${JSON.stringify(v)} is not a ${s.format}`;
  }
  return null;
}

// the validator itself can fail (so a pass means something)
check(validate({ a: 1 }, { type: 'object', properties: { a: { type: 'string' } } }) !== null, 'validator: wrong type');
check(validate({}, { type: 'object', required: ['a'] }) !== null, 'validator: required');
check(validate('2024-13-01', { type: 'string', format: 'date' }) !== null, 'validator: format');
check(validate([1, 2, 3], { type: 'array', maxItems: 2 }) !== null, 'validator: maxItems');

// ---------------------------------------------------------------------------
// Schemas covering objects, arrays, enums, anyOf, numbers, nested required
// fields and string formats

const SCHEMAS = {
  person: {
    type: 'object',
    properties: {
      name: { type: 'string', minLength: 1, maxLength: 24 },
      age: { type: 'integer' },
      nickname: { type: 'string', maxLength: 10 },
      member: { type: 'boolean' },
    },
    required: ['name', 'age', 'member'],
    additionalProperties: false,
  },
  colors: {
    type: 'object',
    properties: {
      colors: { type: 'array', items: { enum: ['red', 'green', 'blue'] }, minItems: 1, maxItems: 4 },
      mood: { type: 'string', enum: ['happy', 'sad'] },
    },
    required: ['colors', 'mood'],
    additionalProperties: false,
  },
  union: {
    type: 'object',
    properties: {
      v: { anyOf: [{ type: 'integer' }, { type: 'string', maxLength: 8 }, { type: 'null' }] },
      w: { oneOf: [{ type: 'boolean' }, { const: 'none' }] },
      x: { type: ['number', 'null'] },
    },
    required: ['v', 'w', 'x'],
    additionalProperties: false,
  },
  numbers: {
    type: 'object',
    properties: {
      x: { type: 'number' },
      n: { type: 'integer' },
      list: { type: 'array', items: { type: 'number' }, maxItems: 3 },
    },
    required: ['x', 'n', 'list'],
    additionalProperties: false,
  },
  nested: {
    type: 'object',
    properties: {
      user: {
        type: 'object',
        properties: {
          id: { type: 'string', format: 'uuid' },
          born: { type: 'string', format: 'date' },
          seen: { type: 'string', format: 'date-time' },
          at: { type: 'string', format: 'time' },
          address: {
            type: 'object',
            properties: { city: { type: 'string', maxLength: 12 }, zip: { type: 'string', minLength: 5, maxLength: 5 } },
            required: ['city', 'zip'],
            additionalProperties: false,
          },
        },
        required: ['id', 'born', 'seen', 'at', 'address'],
        additionalProperties: false,
      },
    },
    required: ['user'],
    additionalProperties: false,
  },
  // $defs / $ref (recursive refs are covered by the unit tests: a small
  // random model need not choose to stop recursing within max_tokens)
  refs: {
    $defs: {
      leaf: {
        type: 'object',
        properties: { label: { type: 'string', maxLength: 6 }, weight: { type: 'integer' } },
        required: ['label', 'weight'],
        additionalProperties: false,
      },
    },
    type: 'object',
    properties: {
      first: { $ref: '#/$defs/leaf' },
      rest: { type: 'array', items: { $ref: '#/$defs/leaf' }, maxItems: 2 },
    },
    required: ['first', 'rest'],
    additionalProperties: false,
  },
};

const messages = [{ role: 'user', content: 'In the beginning' }];
const MAX = 400;

function checkText(what, text, schema, finish) {
  check(finish === 'stop', `${what}: finish_reason ${finish} (text ${JSON.stringify(text)})`);
  let v;
  try { v = JSON.parse(text); } catch (e) { check(false, `${what}: not JSON: ${JSON.stringify(text)}`); return; }
  const err = schema ? validate(v, schema) : (typeOf(v) === 'object' ? null : 'not an object');
  check(err === null, `${what}: ${err}: ${text}`);
}

const rf = (name, schema) => ({ type: 'json_schema', json_schema: { name, schema, strict: true } });

// every schema: temperature 0, then temperature 1 with several seeds
for (const [name, schema] of Object.entries(SCHEMAS)) {
  const runs = [{ temperature: 0 }, ...[1, 2, 3, 4].map((seed) => ({ temperature: 1, seed }))];
  for (const r of runs) {
    const res = await client.chat.completions.create({ model, messages, max_tokens: MAX, response_format: rf(name, schema), ...r });
    checkText(`${name} ${JSON.stringify(r)}`, res.choices[0].message.content, schema, res.choices[0].finish_reason);
  }
}

// the client's parse helper, with a zod-free parseable response_format
{
  const schema = SCHEMAS.person;
  const format = makeParseableResponseFormat(rf('person', schema), (content) => JSON.parse(content));
  const res = await client.beta.chat.completions.parse({ model, messages, max_tokens: MAX, temperature: 0, response_format: format });
  const parsed = res.choices[0].message.parsed;
  check(parsed && typeof parsed === 'object', `parse: parsed ${JSON.stringify(parsed)}`);
  check(parsed && validate(parsed, schema) === null, `parse: ${validate(parsed, schema)}`);
}

// json_object: any JSON object
for (const r of [{ temperature: 0 }, { temperature: 1, seed: 7 }, { temperature: 1, seed: 8 }]) {
  const res = await client.chat.completions.create({ model, messages, max_tokens: MAX, response_format: { type: 'json_object' }, ...r });
  checkText(`json_object ${JSON.stringify(r)}`, res.choices[0].message.content, null, res.choices[0].finish_reason);
}

// streaming: the deltas concatenate to a valid document
for (const seed of [11, 12]) {
  let text = '', finish = null;
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: MAX, temperature: 1, seed, stream: true, response_format: rf('nested', SCHEMAS.nested),
  });
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  checkText(`stream seed ${seed}`, text, SCHEMAS.nested, finish);
}

// completions route
{
  const res = await client.completions.create({ model, prompt: 'In the beginning', max_tokens: MAX, temperature: 0, response_format: rf('colors', SCHEMAS.colors) });
  checkText('completions', res.choices[0].text, SCHEMAS.colors, res.choices[0].finish_reason);
}

// a GBNF grammar (llama.cpp's field)
for (const seed of [1, 2, 3]) {
  const res = await client.completions.create({
    model, prompt: 'In the beginning', max_tokens: 50, temperature: 1, seed,
    grammar: 'root ::= ("yes" | "no") ", " [a-z]{2,5} "."',
  });
  const t = res.choices[0].text;
  check(/^(yes|no), [a-z]{2,5}\.$/.test(t) && res.choices[0].finish_reason === 'stop', `grammar: ${JSON.stringify(t)} ${res.choices[0].finish_reason}`);
}
{
  const res = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0, grammar: 'root ::= [0-9]{3}' });
  check(/^[0-9]{3}$/.test(res.choices[0].message.content), `chat grammar: ${JSON.stringify(res.choices[0].message.content)}`);
}

// without a constraint, the model's output is not JSON (the constraint is what makes it so)
{
  const res = await client.chat.completions.create({ model, messages, max_tokens: 60, temperature: 0 });
  let ok = true;
  try { JSON.parse(res.choices[0].message.content); } catch { ok = false; }
  check(!ok, `unconstrained output parsed as JSON: ${res.choices[0].message.content}`);
}

// bad schemas and grammars: 400 with the parameter named
async function expect400(body, param, needle, what) {
  try {
    await client.chat.completions.create({ model, messages, max_tokens: 5, ...body });
    check(false, `${what}: no error`);
  } catch (e) {
    check(e.status === 400 && e.param === param && (!needle || e.message.includes(needle)),
      `${what}: got ${e.status} param ${e.param} ${e.message}`);
  }
}
await expect400({ response_format: rf('x', { type: 'string', pattern: '^a(?<=a)' }) }, 'response_format.json_schema.schema',
  'a lookbehind at offset 2', 'pattern outside the subset');
await expect400({ response_format: rf('x', { type: 'object', properties: { a: { type: 'number', multipleOf: 2 } } }) },
  'response_format.json_schema.schema', "'multipleOf'", 'multipleOf');
await expect400({ response_format: rf('x', { type: 'frob' }) }, 'response_format.json_schema.schema', 'frob', 'bad type');
await expect400({ response_format: rf('x', { $ref: '#/$defs/nope' }) }, 'response_format.json_schema.schema', 'does not resolve', 'bad ref');
await expect400({ response_format: { type: 'xml' } }, 'response_format.type', 'xml', 'bad type');
await expect400({ response_format: { type: 'json_schema' } }, 'response_format.json_schema', null, 'no json_schema');
await expect400({ grammar: 'root ::= "a' }, 'grammar', 'line 1, column', 'grammar syntax');
await expect400({ grammar: 'root ::= root "a" | "b"' }, 'grammar', 'left recursion', 'left recursion');
await expect400({ grammar: 'root ::= x' }, 'grammar', "undefined rule 'x'", 'undefined rule');
await expect400({ grammar: 'root ::= "a"{5000}' }, 'grammar', 'repetition', 'huge repetition');
await expect400({ grammar: 'root ::= "a"', response_format: { type: 'json_object' } }, 'grammar', null, 'both');

console.log(`structured: ${checks} checks, ${failures} failures`);
process.exit(failures ? 1 : 0);
