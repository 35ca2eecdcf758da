// responses_client.mjs — the official `openai` client's Responses API
// (client.responses.create / .stream / .retrieve / .del) against kvseal's
// /v1/responses (tests/e2e/test_responses.sh). Every answer's text is
// checked against what /v1/chat/completions answers for the same
// conversation (the same template, greedy decoding), so a translation that
// dropped or reordered anything shows as different tokens.
// KS_MODE=serve: create and stream (text, usage, the events' order and
// sequence numbers), store / retrieve / del, store false, a tool round trip
// (a forced function_call, its function_call_output sent back through
// previous_response_id and again as explicit items: the same answer), and
// errors the SDK raises with the field named.
// KS_MODE=cluster: create, stream and a continued conversation through the
// cluster router, equal to KS_REF (serve's answer).
import OpenAI from 'openai';

const url = process.env.KS_URL, key = process.env.KS_KEY || 'none';
const model = process.env.KS_MODEL_NAME, mode = process.env.KS_MODE || 'serve';
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0 });
let failures = 0;
const check = (cond, msg) => { if (!cond) { failures++; console.error('FAIL: ' + msg); } };
const J = JSON.stringify;
const PROMPT = 'In the beginning';
const base = { model, input: PROMPT, max_output_tokens: 24, temperature: 0 };

/* The chat route's greedy answer to the same conversation. */
async function chatRef(messages, extra = {}) {
  const c = await client.chat.completions.create({ model, messages, max_tokens: 24,
    temperature: 0, ...extra });
  return c;
}

/* The text of a response's message items, as the SDK's output_text. */
const textOf = (r) => r.output.filter((o) => o.type === 'message')
  .flatMap((o) => o.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');

/* A streamed response: the final response and the events in order. */
async function streamed(body) {
  const events = [];
  const s = client.responses.stream(body);
  s.on('event', (e) => events.push(e));
  const resp = await s.finalResponse();
  return { resp, events };
}

/* The events are well-formed: created, in_progress first, the end last,
 * sequence numbers 0, 1, 2, ..., every item added before its deltas and
 * done after them, and the deltas adding up to the text. */
function checkEvents(events, text, what) {
  const types = events.map((e) => e.type);
  check(types[0] === 'response.created' && types[1] === 'response.in_progress',
    `${what}: starts ${J(types.slice(0, 2))}`);
  check(['response.completed', 'response.incomplete'].includes(types.at(-1)),
    `${what}: ends ${types.at(-1)}`);
  check(events.every((e, i) => e.sequence_number === i), `${what}: sequence numbers`);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  check(deltas.map((e) => e.delta).join('') === text, `${what}: deltas add up to the text`);
  const added = types.indexOf('response.output_item.added');
  const part = types.indexOf('response.content_part.added');
  const done = types.lastIndexOf('response.output_item.done');
  check(added >= 0 && added < part && part < types.indexOf('response.output_text.delta') &&
    types.lastIndexOf('response.output_text.delta') < types.indexOf('response.output_text.done') &&
    types.indexOf('response.content_part.done') < done, `${what}: item order ${J(types)}`);
  return events.at(-1).response;
}

/* An API call that must fail with status and param. */
async function refused(what, status, param, fn) {
  try {
    await fn();
    check(false, `${what}: no error`);
  } catch (e) {
    check(e.status === status, `${what}: status ${e.status}, want ${status} (${e.message})`);
    if (param !== undefined) check(e.param === param, `${what}: param ${e.param}, want ${param}`);
  }
}

const tools = [{ type: 'function', name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 } },
    required: ['city'], additionalProperties: false }, strict: true }];

async function serve() {
  // ---- create: the chat route's text and usage
  const ref = await chatRef([{ role: 'user', content: PROMPT }]);
  const refText = ref.choices[0].message.content;
  const r = await client.responses.create(base);
  check(r.object === 'response' && /^resp_[0-9a-f]{24}$/.test(r.id), `create: id ${r.id}`);
  check(r.output_text === refText, `create: text ${J(r.output_text)} != chat ${J(refText)}`);
  const want = ref.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed';
  check(r.status === want, `create: status ${r.status}, want ${want}`);
  if (want === 'incomplete')
    check(r.incomplete_details?.reason === 'max_output_tokens', `create: ${J(r.incomplete_details)}`);
  check(r.usage.input_tokens === ref.usage.prompt_tokens &&
    r.usage.output_tokens === ref.usage.completion_tokens &&
    r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens &&
    r.usage.input_tokens_details.cached_tokens >= 0 &&
    r.usage.output_tokens_details.reasoning_tokens === 0, `create: usage ${J(r.usage)}`);
  check(r.model === model && r.max_output_tokens === 24 && r.temperature === 0 && r.store === true &&
    r.tool_choice === 'auto' && Array.isArray(r.tools) && r.text.format.type === 'text' &&
    r.previous_response_id === null && r.error === null, `create: echoed fields ${J(r)}`);
  check(r.output.length === 1 && r.output[0].type === 'message' && r.output[0].role === 'assistant' &&
    r.output[0].status === 'completed' && /^msg_/.test(r.output[0].id), `create: output ${J(r.output)}`);
  console.log('REF=' + J(refText));

  // ---- stream: the same text, well-formed events, the same usage
  const { resp: sr, events } = await streamed(base);
  // the stream helper's final response has no output_text (4.104 adds it on create only)
  check(textOf(sr) === refText, `stream: text ${J(textOf(sr))} != ${J(refText)}`);
  const last = checkEvents(events, refText, 'stream');
  check(last.status === want && J(last.usage) === J(r.usage) && textOf(last) === refText,
    `stream: final response ${J(last)}`);

  // ---- store, retrieve, del; store false
  const got = await client.responses.retrieve(r.id);
  check(got.id === r.id && textOf(got) === refText && J(got.usage) === J(r.usage),
    `retrieve: ${J(got)}`);
  const streamedId = last.id;
  check(textOf(await client.responses.retrieve(streamedId)) === refText, 'retrieve a streamed one');
  await client.responses.del(r.id);
  await refused('retrieve after del', 404, undefined, () => client.responses.retrieve(r.id));
  await refused('del twice', 404, undefined, () => client.responses.del(r.id));
  const ns = await client.responses.create({ ...base, store: false });
  check(ns.store === false && ns.output_text === refText, `store false: ${J(ns)}`);
  await refused('retrieve store false', 404, undefined, () => client.responses.retrieve(ns.id));
  await refused('continue store false', 400, 'previous_response_id',
    () => client.responses.create({ ...base, previous_response_id: ns.id }));

  // ---- a continued conversation: the chat route's answer to the same turns
  const turn2 = 'And the earth';
  const c2 = await client.responses.create({ ...base, input: turn2, previous_response_id: streamedId });
  const ref2 = await chatRef([{ role: 'user', content: PROMPT },
    { role: 'assistant', content: refText }, { role: 'user', content: turn2 }]);
  check(c2.output_text === ref2.choices[0].message.content && c2.previous_response_id === streamedId,
    `continued: ${J(c2.output_text)} != chat ${J(ref2.choices[0].message.content)}`);
  check(c2.usage.input_tokens === ref2.usage.prompt_tokens, `continued: usage ${J(c2.usage)}`);

  // ---- instructions: a system message first
  const ci = await client.responses.create({ ...base, instructions: 'Be brief.' });
  const refI = await chatRef([{ role: 'system', content: 'Be brief.' }, { role: 'user', content: PROMPT }]);
  check(ci.output_text === refI.choices[0].message.content && ci.instructions === 'Be brief.',
    `instructions: ${J(ci.output_text)} != chat ${J(refI.choices[0].message.content)}`);

  // ---- tools: a forced call, its output sent back, the answer
  const t1 = await client.responses.create({ ...base, input: 'Weather in Paris?', tools,
    tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 120 });
  const call = t1.output.find((o) => o.type === 'function_call');
  check(call && call.name === 'get_weather' && /^call_/.test(call.call_id) && /^fc_/.test(call.id) &&
    typeof JSON.parse(call.arguments) === 'object', `tool call: ${J(t1.output)}`);
  const chatCall = await chatRef([{ role: 'user', content: 'Weather in Paris?' }], {
    tools: [{ type: 'function', function: { name: 'get_weather', description: tools[0].description,
      parameters: tools[0].parameters, strict: true } }],
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 120 });
  check(call && chatCall.choices[0].message.tool_calls?.[0]?.function.arguments === call.arguments,
    `tool call: arguments ${call?.arguments} != chat's`);
  const out = { type: 'function_call_output', call_id: call.call_id, output: 'sunny in Paris' };
  const t2 = await client.responses.create({ ...base, tools, previous_response_id: t1.id,
    input: [out] });
  const t2b = await client.responses.create({ ...base, tools, store: false,
    input: [{ role: 'user', content: 'Weather in Paris?' }, ...t1.output, out] });
  check(t2.output_text.length > 0 && t2.output_text === t2b.output_text,
    `tool answer: previous_response_id ${J(t2.output_text)} != explicit items ${J(t2b.output_text)}`);
  const ts = await streamed({ ...base, input: 'Weather in Paris?', tools, tool_choice: 'required',
    max_output_tokens: 120 });
  const sc = ts.resp.output.find((o) => o.type === 'function_call');
  const argDeltas = ts.events.filter((e) => e.type === 'response.function_call_arguments.delta')
    .map((e) => e.delta).join('');
  check(sc && sc.arguments === argDeltas && ts.events.some((e) =>
    e.type === 'response.function_call_arguments.done' && e.arguments === sc.arguments),
  `streamed tool call: ${J(ts.resp.output)}`);

  // ---- structured output: text.format json_schema
  const js = await client.responses.create({ ...base, max_output_tokens: 40,
    text: { format: { type: 'json_schema', name: 'v', strict: true, schema: { type: 'object',
      properties: { verse: { type: 'string', maxLength: 12 } }, required: ['verse'],
      additionalProperties: false } } } });
  let parsed = null;
  try { parsed = JSON.parse(js.output_text); } catch { /* checked below */ }
  check(parsed && typeof parsed.verse === 'string', `json_schema: ${J(js.output_text)}`);

  // ---- errors the SDK raises, the field named
  await refused('no input', 400, 'input', () => client.responses.create({ model }));
  await refused('bad role', 400, 'input[0].role',
    () => client.responses.create({ ...base, input: [{ role: 'robot', content: 'x' }] }));
  await refused('image', 400, 'input[0].content[0]',
    () => client.responses.create({ ...base, input: [{ role: 'user', content: [
      { type: 'input_image', image_url: 'http://x/y.png' }] }] }));
  await refused('hosted tool', 400, 'tools[0].type',
    () => client.responses.create({ ...base, tools: [{ type: 'web_search_preview' }] }));
  await refused('unknown field', 400, 'background',
    () => client.responses.create({ ...base, background: true }));
  await refused('max_output_tokens', 400, 'max_output_tokens',
    () => client.responses.create({ ...base, max_output_tokens: 0 }));
  await refused('unknown previous', 400, 'previous_response_id',
    () => client.responses.create({ ...base, previous_response_id: 'resp_nope' }));
  await refused('unknown model', 404, 'model',
    () => client.responses.create({ ...base, model: 'no-such-model' }));
}

async function cluster() {
  const ref = JSON.parse(process.env.KS_REF);
  const r = await client.responses.create(base);
  check(r.output_text === ref, `cluster create: ${J(r.output_text)} != ${J(ref)}`);
  const { resp, events } = await streamed(base);
  check(textOf(resp) === ref, `cluster stream: ${J(textOf(resp))}`);
  checkEvents(events, ref, 'cluster stream');
  const got = await client.responses.retrieve(r.id);
  check(textOf(got) === ref, 'cluster retrieve');
  const c2 = await client.responses.create({ ...base, input: 'And the earth', previous_response_id: r.id });
  const ref2 = await chatRef([{ role: 'user', content: PROMPT }, { role: 'assistant', content: ref },
    { role: 'user', content: 'And the earth' }]);
  check(c2.output_text === ref2.choices[0].message.content, `cluster continued: ${J(c2.output_text)}`);
}

try {
  await (mode === 'cluster' ? cluster() : serve());
} catch (e) {
  failures++;
  console.error('FAIL: ' + (e.stack || e));
}
if (failures) {
  console.error(`${failures} check(s) failed`);
  process.exit(1);
}
console.log('ok');
