// netns_load.mjs — canary traffic for the fault tests on real network stacks
// (tests/e2e/test_netns_*.sh). Every tenant sends prompts that start with
// its own canary and carry a long text (so each request's KV takes a while
// to cross the link), greedy, plain and streamed.
//
//   NS_MODE=ref   each prompt alone, one after the other; writes the answers
//                 to NS_REF (JSON) — run before the fault, and again after
//                 it with NS_REF_CHECK set: the cluster serves again and
//                 answers exactly as before
//   NS_MODE=load  all prompts at once (NS_COPIES times each); passes only if
//                 every request was answered whole (200, the reference's
//                 text, a finish reason; a stream ended by [DONE]) or refused
//                 clearly (an error status with a message, or a stream that
//                 ends with an error event and no [DONE]), and no answer
//                 holds any tenant's canary. Prints one summary line
//                 "load: N whole, M refused (statuses ...)".
// Env: KS_URL, NS_TENANTS (JSON [{name, key}]), NS_PROMPTS (per tenant, 2),
// NS_REPEAT (long-text repeats, 20), NS_MAX_TOKENS (8), NS_COPIES (1),
// NS_MODEL (kjv-mini), NS_REF, NS_REF_CHECK, NS_STARTED (a file written when
// every request of the load was sent).
// A fleet (test_fleet.sh): NS_MODELS (a comma list: every prompt to each
// model, ids TENANT/MODEL/K) and NS_URLS (a comma list of routers: every
// request through each; in ref mode they must all answer alike). With
// NS_DROP_URL (a router killed during the load) that router's requests may
// also end with the connection dropped and nothing that looks finished (no
// status, or a stream cut before [DONE], finish_reason or an error event),
// counted as "dropped"; never a short 200. With NS_WHOLE_ONLY=1 every other
// request must be answered whole (a refusal is a violation).
import { readFileSync, writeFileSync } from 'node:fs';

const URL_ = process.env.KS_URL;
const TENANTS = JSON.parse(process.env.NS_TENANTS);
const N = Number(process.env.NS_PROMPTS || 2);
const REPEAT = Number(process.env.NS_REPEAT || 20);
const MAX_TOKENS = Number(process.env.NS_MAX_TOKENS || 8);
const COPIES = Number(process.env.NS_COPIES || 1);
const MODEL = process.env.NS_MODEL || 'kjv-mini';
const MODELS = process.env.NS_MODELS ? process.env.NS_MODELS.split(',') : null;
const URLS = process.env.NS_URLS ? process.env.NS_URLS.split(',') : [URL_];
const DROP_URL = process.env.NS_DROP_URL || '';
const WHOLE_ONLY = process.env.NS_WHOLE_ONLY === '1';
const MODE = process.env.NS_MODE || 'load';

const TEXTS = [
  'And the LORD spake unto Moses, saying, Speak unto the children of Israel, ',
  'Blessed are the poor in spirit: for theirs is the kingdom of heaven. ',
  'In the beginning God created the heaven and the earth. ',
  'Now the serpent was more subtil than any beast of the field ',
  'And it came to pass in those days, that there went out a decree ',
  'The LORD is my shepherd; I shall not want. ',
];
const canary = (i) => `zq${(0x5a17 * (i + 7)).toString(36)}x${i}`;
const jobs = [];
TENANTS.forEach((t, i) => {
  for (const model of MODELS || [MODEL]) {
    for (let k = 0; k < N; k++) {
      const id = MODELS ? `${t.name}/${model}/${k}` : `${t.name}/${k}`;
      jobs.push({ id, key: t.key, model, prompt: `${canary(i)} ${TEXTS[(i + k) % TEXTS.length].repeat(REPEAT)}` });
    }
  }
});
const violations = [];
const violate = (m) => { violations.push(m); console.error('NETNS LOAD VIOLATION: ' + m); };
const checkCanaries = (where, text) => {
  TENANTS.forEach((_, i) => { if (text.includes(canary(i))) violate(`${where}: the answer holds canary ${canary(i)}`); });
};

async function complete(job, stream, url = URL_) {
  let res;
  try {
    res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${job.key}` },
      body: JSON.stringify({ model: job.model, prompt: job.prompt, max_tokens: MAX_TOKENS, temperature: 0, stream }),
    });
  } catch (e) {
    return { transport: String(e && e.cause ? e.cause.code || e.cause : e) };
  }
  if (!stream || res.status !== 200) {
    let raw;
    try { raw = await res.text(); } catch (e) { return { status: res.status, json: null, raw: '', cut: String(e) }; }
    let json = null;
    try { json = JSON.parse(raw); } catch { /* not JSON */ }
    return { status: res.status, json, raw };
  }
  let buf = '', text = '', done = false, error = null, finish = null;
  const dec = new TextDecoder();
  try {
    for await (const chunk of res.body) {
      buf += dec.decode(chunk, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k); buf = buf.slice(k + 2);
        for (const line of ev.split('\n')) {
          if (!line.startsWith('data: ')) continue;
          const data = line.slice(6);
          if (data === '[DONE]') { done = true; continue; }
          const j = JSON.parse(data);
          if (j.error) error = j.error;
          const c = j.choices && j.choices[0];
          if (c && typeof c.text === 'string') text += c.text;
          if (c && c.finish_reason) finish = c.finish_reason;
        }
      }
    }
  } catch (e) {
    return { status: 200, stream: true, text, done, error, finish, cut: String(e) };
  }
  return { status: 200, stream: true, text, done, error, finish };
}

// Judges one answer; returns 'whole' or 'refused' (or records a violation).
function judge(job, kind, r, ref, url) {
  const where = `${job.id} (${kind}${URLS.length > 1 ? ' via ' + url : ''})`;
  const droppable = DROP_URL !== '' && url === DROP_URL;
  if (r.transport) {
    if (droppable) return 'dropped';
    violate(`${where}: no HTTP answer (${r.transport})`); return 'bad';
  }
  if (r.stream) {
    checkCanaries(where, r.text);
    if (droppable && r.cut && !r.done && !r.error && !r.finish) return 'dropped';
    if (r.error) {
      if (r.done) violate(`${where}: a stream with an error event also ended with [DONE]`);
      if (!r.error.message) violate(`${where}: an error event without a message`);
      return 'refused';
    }
    if (!r.done) { violate(`${where}: the stream ended without [DONE] or an error event (${r.cut || 'closed'}), text [${r.text}]`); return 'bad'; }
    if (ref !== undefined && r.text !== ref) violate(`${where}: streamed [${r.text}], reference [${ref}]`);
    if (!r.finish) violate(`${where}: the stream had no finish_reason`);
    return 'whole';
  }
  checkCanaries(where, r.raw);
  if (r.status !== 200) {
    const msg = r.json && r.json.error && r.json.error.message;
    if (!msg) violate(`${where}: status ${r.status} without an error message: ${r.raw.slice(0, 200)}`);
    return 'refused';
  }
  if (r.cut) {
    if (droppable) return 'dropped';
    violate(`${where}: a 200 whose body was cut (${r.cut})`); return 'bad';
  }
  const c = r.json && r.json.choices && r.json.choices[0];
  if (!c || typeof c.text !== 'string' || !c.finish_reason) { violate(`${where}: a 200 without a whole choice: ${r.raw.slice(0, 200)}`); return 'bad'; }
  if (ref !== undefined && c.text !== ref) violate(`${where}: answered [${c.text}], reference [${ref}]`);
  return 'whole';
}

async function main() {
  if (MODE === 'ref') {
    const refs = {};
    for (const url of URLS) {
      for (const j of jobs) {
        const r = await complete(j, false, url);
        if (r.status !== 200 || !r.json || !r.json.choices) { violate(`reference ${j.id} via ${url}: status ${r.status} ${r.raw || r.transport}`); continue; }
        const text = r.json.choices[0].text;
        checkCanaries(`reference ${j.id}`, text);
        if (j.id in refs && refs[j.id] !== text) violate(`reference ${j.id}: [${text}] via ${url}, [${refs[j.id]}] via ${URLS[0]}`);
        else refs[j.id] = text;
      }
    }
    if (process.env.NS_REF_CHECK) {
      const old = JSON.parse(readFileSync(process.env.NS_REF_CHECK, 'utf8'));
      for (const j of jobs) if (refs[j.id] !== old[j.id]) violate(`after the fault ${j.id} answered [${refs[j.id]}], before [${old[j.id]}]`);
    }
    if (process.env.NS_REF) writeFileSync(process.env.NS_REF, JSON.stringify(refs));
    console.log(`ref: ${Object.keys(refs).length} answers`);
  } else {
    const refs = process.env.NS_REF ? JSON.parse(readFileSync(process.env.NS_REF, 'utf8')) : {};
    const tasks = [];
    for (let c = 0; c < COPIES; c++) {
      URLS.forEach((url, u) => {
        for (const j of jobs) {
          const stream = (c + u + jobs.indexOf(j)) % 2 === 1;
          tasks.push(complete(j, stream, url).then((r) => ({ j, r, url, kind: stream ? 'stream' : 'plain' })));
        }
      });
    }
    if (process.env.NS_STARTED) writeFileSync(process.env.NS_STARTED, `${tasks.length}\n`);
    const out = await Promise.all(tasks);
    let whole = 0, refused = 0, dropped = 0;
    const statuses = {};
    for (const { j, r, url, kind } of out) {
      const v = judge(j, kind, r, refs[j.id], url);
      if (v === 'whole') whole++;
      if (v === 'dropped') dropped++;
      if (v === 'refused' && WHOLE_ONLY && url !== DROP_URL) {
        violate(`${j.id} (${kind} via ${url}): refused (${r.stream ? r.error.message : r.raw.slice(0, 200)}) where every request must be answered whole`);
      } else if (v === 'refused') {
        refused++;
        const s = r.stream ? `stream:${r.error.type || r.error.code || 'error'}` : String(r.status);
        statuses[s] = (statuses[s] || 0) + 1;
        const m = r.stream ? r.error.message : r.json && r.json.error && r.json.error.message;
        console.log(`refused ${j.id} (${kind}): ${s}: ${m}`);
      }
    }
    console.log(`load: ${whole} whole, ${refused} refused${DROP_URL ? `, ${dropped} dropped` : ''} (statuses ${JSON.stringify(statuses)})`);
  }
  if (violations.length) { console.error(`netns load: ${violations.length} violation(s)`); process.exit(1); }
}
main().catch((e) => { console.error(e); process.exit(1); });
