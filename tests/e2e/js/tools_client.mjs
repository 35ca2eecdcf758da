// tools_client.mjs — the official `openai` npm client against kvseal's chat
// tool fields and reasoning split (tests/e2e/test_serve_tools.sh).
// KS_MODE=tools: a server with --tool-call-format hermes; kjv-mini never
// writes a call, so a request with tools answers its plain continuation
// (content, no tool_calls, the engine's finish_reason) streamed or not, and
// the tool_choice values that need constrained decoding are refused (400).
// KS_MODE=reasoning: a server with --reasoning-format deepseek; a prompt that
// ends inside a think block (the rendered chat is the lone user message)
// answers everything as reasoning_content, the same text the completions
// route gives for that prompt; a prompt that does not stays content.
import OpenAI from 'openai';

let REF = ' of the Lord, and in the Lord Jesus Christ. And I will send my voice, and will not hear the ' +
  'word of God, but that the Lord Jesus Christ is in the Lord Jesus. And I say unto you, that ye may be ' +
  'the Lord Jesus Christ, and the Lord Jesus Christ,';
const client = new OpenAI({ baseURL: `${process.env.KS_URL}/v1`, apiKey: 'none', maxRetries: 0 });
const model = process.env.KS_MODEL_NAME;
let failures = 0;
const check = (cond, msg) => { if (!cond) { failures++; console.error('FAIL: ' + msg); } };
const user = (content) => [{ role: 'user', content }];
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 } }, required: ['city'] },
  },
}];

/* A streamed chat: the deltas joined, per field. */
async function streamed(body) {
  const out = { content: '', reasoning: '', calls: 0, finish: null };
  const stream = await client.chat.completions.create({ ...body, stream: true });
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.content) out.content += c.delta.content;
    if (c.delta.reasoning_content) out.reasoning += c.delta.reasoning_content;
    if (c.delta.tool_calls) out.calls += c.delta.tool_calls.length;
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

/* A streamed chat of n choices: each choice's deltas joined, by its index. */
async function streamedN(body) {
  const outs = [];
  const stream = await client.chat.completions.create({ ...body, stream: true });
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      const o = outs[c.index] ??= { content: '', reasoning: '', calls: [], finish: null };
      if (c.delta.content) o.content += c.delta.content;
      if (c.delta.reasoning_content) o.reasoning += c.delta.reasoning_content;
      for (const tc of c.delta.tool_calls ?? []) {
        const call = o.calls[tc.index] ??= { name: '', arguments: '' };
        if (tc.function?.name) call.name += tc.function.name;
        if (tc.function?.arguments) call.arguments += tc.function.arguments;
      }
      if (c.finish_reason) o.finish = c.finish_reason;
    }
  }
  return outs;
}

async function refused(body, status, code, param, needle) {
  try {
    await client.chat.completions.create(body);
    check(false, `accepted: ${JSON.stringify(body.tool_choice)}`);
  } catch (e) {
    check(e.status === status && e.code === code && e.param === param && String(e.message).includes(needle),
      `refusal of ${JSON.stringify(body.tool_choice)}: ${e.status} ${e.code} ${e.param} ${e.message}`);
  }
}

const base = { model, messages: user('In the beginning'), max_tokens: 60, temperature: 0 };
if (process.env.KS_MODE === 'tools') {
  // the server renders its own chat template (tools need one): REF is its
  // answer without tools, which every request with tools must give too
  const plain = await client.chat.completions.create(base);
  REF = plain.choices[0].message.content;
  check(typeof REF === 'string' && REF.length > 20 && plain.choices[0].finish_reason === 'length',
    `plain content ${JSON.stringify(plain.choices[0].message)}`);
  for (const extra of [{ tools }, { tools, tool_choice: 'auto' }, { tools, tool_choice: 'none' },
    { tools, parallel_tool_calls: false }]) {
    const r = await client.chat.completions.create({ ...base, ...extra });
    const m = r.choices[0].message;
    check(m.content === REF && m.tool_calls === undefined && m.reasoning_content === undefined &&
      r.choices[0].finish_reason === 'length', `with ${JSON.stringify(Object.keys(extra))}: ${JSON.stringify(r.choices[0])}`);
    const s = await streamed({ ...base, ...extra });
    check(s.content === REF && s.calls === 0 && s.reasoning === '' && s.finish === 'length',
      `streamed with ${JSON.stringify(Object.keys(extra))}: ${JSON.stringify(s)}`);
  }
  // tool_choice "required" / named: decoding is constrained to one call in
  // the server's format, its arguments to the tool's parameters schema
  // (city required, nothing else), which the parser reads back into tool_calls
  const named = { type: 'function', function: { name: 'get_weather' } };
  for (const tool_choice of ['required', named]) {
    const body = { ...base, max_tokens: 120, tools, tool_choice };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0], call = c.message.tool_calls?.[0];
    let args = null;
    try { args = JSON.parse(call.function.arguments); } catch { /* checked below */ }
    check(c.finish_reason === 'tool_calls' && c.message.content === null && c.message.tool_calls.length === 1 &&
      call.type === 'function' && call.function.name === 'get_weather' && /^call_/.test(call.id) &&
      args !== null && typeof args.city === 'string' && Object.keys(args).join() === 'city',
      `forced call (${JSON.stringify(tool_choice)}): ${JSON.stringify(c)}`);
    const s = await streamed(body);
    check(s.calls >= 1 && s.finish === 'tool_calls' && s.content === '',
      `forced call streamed (${JSON.stringify(tool_choice)}): ${JSON.stringify(s)}`);
  }
  // n > 1: every choice's answer goes through its own parser; choice i is
  // the n = 1 answer seeded seed + i, streamed or not
  {
    const body = { ...base, max_tokens: 120, tools, tool_choice: 'required', n: 3, temperature: 1, seed: 41 };
    const r = await client.chat.completions.create(body);
    check(r.choices.length === 3, `n=3 forced calls: ${r.choices.length} choices`);
    const st = await streamedN(body);
    for (let i = 0; i < 3; i++) {
      const c = r.choices[i], call = c?.message.tool_calls?.[0];
      const one = (await client.chat.completions.create({ ...body, n: 1, seed: 41 + i })).choices[0];
      check(c?.index === i && c.finish_reason === 'tool_calls' && call?.function.name === 'get_weather' &&
        JSON.stringify(c.message.tool_calls.map((t) => t.function)) ===
          JSON.stringify(one.message.tool_calls?.map((t) => t.function)),
        `n=3 choice ${i}: ${JSON.stringify(c)} want the calls of ${JSON.stringify(one)}`);
      const s = st[i];
      check(s?.finish === 'tool_calls' && s.content === '' && s.calls.length === 1 &&
        s.calls[0].name === 'get_weather' && s.calls[0].arguments === call?.function.arguments,
        `n=3 streamed choice ${i}: ${JSON.stringify(s)} want ${JSON.stringify(call)}`);
    }
  }
  // the npm client's tool loop: it runs the function the model called with
  // the arguments the server parsed, sends the result back as a tool
  // message, and (a single named function) ends after that call
  const seen = [];
  const runner = client.beta.chat.completions.runTools({
    ...base, max_tokens: 120, tool_choice: named,
    tools: [{ type: 'function', function: { ...tools[0].function, parse: JSON.parse,
      function: async (a) => { seen.push(a); return 'sunny'; } } }],
  });
  const done = await runner.finalChatCompletion();
  const msgs = runner.messages;
  check(seen.length === 1 && typeof seen[0]?.city === 'string' && done.choices[0].finish_reason === 'tool_calls' &&
    msgs.some((m) => m.role === 'tool' && m.content === 'sunny'),
    `runTools: called ${JSON.stringify(seen)}, messages ${JSON.stringify(msgs)}`);
  await refused({ ...base, tools, tool_choice: 'required', response_format: { type: 'json_object' } }, 400,
    'invalid_parameter', 'tool_choice', 'cannot be combined');
  await refused({ ...base, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 400,
    'invalid_parameter', 'tool_choice', "not in 'tools'");
} else if (process.env.KS_MODE === 'reasoning') {
  const think = { model, messages: user('<think>\n'), max_tokens: 24, temperature: 0 };
  const wc = (await client.completions.create({ model, prompt: '<think>\n', max_tokens: 24, temperature: 0 }))
    .choices[0];
  const want = wc.text;
  check(want.length > 0 && !want.includes('</think>'), `completions text ${JSON.stringify(want)}`);
  const r = await client.chat.completions.create(think);
  const m = r.choices[0].message;
  check(m.reasoning_content === want && m.content === '', `reasoning: ${JSON.stringify(m)} want ${JSON.stringify(want)}`);
  const s = await streamed(think);
  check(r.choices[0].finish_reason === wc.finish_reason, `finish ${r.choices[0].finish_reason} want ${wc.finish_reason}`);
  check(s.reasoning === want && s.content === '' && s.finish === wc.finish_reason,
    `streamed reasoning: ${JSON.stringify(s)}`);
  // n > 1: each choice split by its own parser
  const r2 = await client.chat.completions.create({ ...think, n: 2 });
  const s2 = await streamedN({ ...think, n: 2 });
  for (let i = 0; i < 2; i++) {
    check(r2.choices[i]?.message.reasoning_content === want && r2.choices[i].message.content === '',
      `n=2 reasoning choice ${i}: ${JSON.stringify(r2.choices[i])}`);
    check(s2[i]?.reasoning === want && s2[i].content === '' && s2[i].finish === wc.finish_reason,
      `n=2 streamed reasoning choice ${i}: ${JSON.stringify(s2[i])}`);
  }
  const p = await client.chat.completions.create(base);
  check(p.choices[0].message.content === REF && p.choices[0].message.reasoning_content === undefined,
    `no think block: ${JSON.stringify(p.choices[0].message)}`);
  const ps = await streamed(base);
  check(ps.content === REF && ps.reasoning === '', `no think block, streamed: ${JSON.stringify(ps)}`);
} else {
  check(false, `KS_MODE must be tools or reasoning, got ${process.env.KS_MODE}`);
}
if (failures) process.exit(1);
console.log(`tools client ok (${process.env.KS_MODE})`);
