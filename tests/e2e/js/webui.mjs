// Drives kvseal's web pages in a real browser (Debian's chromium through
// puppeteer-core): the chat page streams an answer equal to the API's,
// stops a long one (the server frees it), keeps the key in the browser and
// refuses a wrong one; the admin page maps the pool with a running
// tenant's pages under its name, and its button runs the idle pool check.
// Usage: node webui.mjs chat|admin|check URL TENANT_KEY ADMIN_KEY CHROMIUM
// (admin: a request of TENANT_KEY's tenant, alpha, is held running meanwhile;
// check: nothing runs)
import puppeteer from 'puppeteer-core';

const [mode, url, key, adminKey, chromium] = process.argv.slice(2);
const fail = (m) => { console.error('FAIL: ' + m); process.exit(1); };
const T = Number(process.env.KS_WAIT_S || 60) * 1000;
const api = async (path, k, body) => {
  const res = await fetch(url + path, {
    method: body ? 'POST' : 'GET',
    headers: { authorization: 'Bearer ' + k, 'content-type': 'application/json' },
    body: body && JSON.stringify(body),
  });
  return { status: res.status, json: await res.json() };
};
// The engine's running count, from the admin route the page uses too.
const running = async () => (await api('/admin/pool', adminKey)).json.engine.running;
const until = async (what, fn) => {
  const end = Date.now() + T;
  while (Date.now() < end) { if (await fn()) return; await new Promise((r) => setTimeout(r, 50)); }
  fail('timed out waiting for ' + what);
};

let browser;
try {
  browser = await puppeteer.launch({
    executablePath: chromium, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
} catch (e) {
  console.error('SKIP: chromium cannot start: ' + e.message);
  process.exit(77);
}
const errors = [];
// Opens /admin, shows a tenant's key refused, then polls with the admin key.
async function openAdmin() {
  const adm = await browser.newPage();
  adm.on('pageerror', (e) => errors.push(e.message));
  await adm.goto(url + '/admin', { waitUntil: 'load' });
  const setAdm = (sel, v) => adm.$eval(sel, (el, v) => {
    el.value = v; el.dispatchEvent(new Event('change'));
  }, v);
  await setAdm('#key', key); // a tenant's key is not the admin's
  await adm.waitForFunction(() => /invalid admin key/i.test(document.getElementById('status').textContent),
    { timeout: T });
  await setAdm('#key', adminKey);
  await adm.waitForFunction(() => Number(document.body.dataset.polls || 0) >= 1, { timeout: T });
  const summary = await adm.$eval('#summary', (el) => el.textContent);
  if (!/^\d+ pages: \d+ free/.test(summary)) fail('admin summary [' + summary + ']');
  return adm;
}

try {
  const page = await browser.newPage();
  page.on('pageerror', (e) => errors.push(e.message));

  if (mode === 'chat') {
  // ---- the chat page
  const res = await page.goto(url + '/', { waitUntil: 'load' });
  if (res.status() !== 200) fail('GET / answered ' + res.status());
  const csp = res.headers()['content-security-policy'] || '';
  if (!csp.includes("script-src 'self'")) fail('no CSP on the chat page: ' + csp);
  const setField = (sel, v) => page.$eval(sel, (el, v) => {
    el.value = v; el.dispatchEvent(new Event('change'));
  }, v);
  // a wrong key: the model list is refused, and the page says why
  await setField('#key', 'sk-wrong-0000000000000000');
  await page.waitForFunction(() => /invalid API key|incorrect API key/i.test(document.getElementById('status').textContent),
    { timeout: T });
  await setField('#key', key);
  await page.waitForFunction(() => document.querySelectorAll('#model option').length > 0, { timeout: T });
  const model = await page.$eval('#model', (el) => el.value);
  const stored = await page.evaluate(() => localStorage.getItem('kvseal.key'));
  if (stored !== key) fail('the key was not kept in localStorage');
  const html = await page.content();
  if (html.includes(key) && !html.includes('value="' + key)) fail('the key is in the page markup');

  // a greedy answer, streamed into the page, equals the API's
  await setField('#temperature', '0');
  await setField('#max_tokens', '40');
  const prompt = 'In the beginning';
  await page.type('#input', prompt);
  await page.click('#send');
  await page.waitForSelector('.msg.assistant[data-done="1"]', { timeout: T });
  const shown = await page.$eval('.msg.assistant .content', (el) => el.textContent);
  const ref = await api('/v1/chat/completions', key, {
    model, messages: [{ role: 'user', content: prompt }], temperature: 0, top_p: 1, max_tokens: 40,
  });
  if (ref.status !== 200) fail('reference chat: ' + JSON.stringify(ref.json));
  const want = ref.json.choices[0].message.content;
  if (shown !== want) fail('the page shows [' + shown + '], the API answers [' + want + ']');
  if (!shown.length) fail('empty answer');

  // stop: a long answer is cut, and the server frees the request (the page's
  // download throttled to 4 KB/s, so the click comes before the answer's end;
  // tried again if it did not)
  await page.emulateNetworkConditions({ offline: false, download: 4096, upload: 1 << 20, latency: 0 });
  await setField('#max_tokens', '400');
  await setField('#temperature', '0.8');
  let st = '';
  for (let tries = 0; tries < 3 && st !== 'stopped'; tries++) {
    await page.click('#clear');
    await page.type('#input', 'Tell me everything');
    await page.click('#send');
    await page.waitForFunction(() => {
      const c = document.querySelector('.msg.assistant .content');
      return c && c.textContent.length > 20;
    }, { timeout: T });
    await page.click('#stop');
    await page.waitForSelector('.msg.assistant[data-done="1"]', { timeout: T });
    st = await page.$eval('#status', (el) => el.textContent);
    if (st !== 'stopped' && !st.startsWith('done')) fail('after Stop the status is [' + st + ']');
    if (st !== 'stopped') console.error('webui: the answer ended before Stop (' + st + ', ' +
      (await page.$eval('.msg.assistant .content', (el) => el.textContent.length)) + ' chars)');
  }
  if (st !== 'stopped') fail('three answers ended before Stop reached them');
  await page.emulateNetworkConditions(null);
  await until('the stopped request to be freed', async () => (await running()) === 0);
  console.log('webui chat: streamed ' + shown.length + ' chars equal to the API; Stop freed its request');
  } else if (mode === 'admin') {
  const adm = await openAdmin();
  // the held request's pages appear under its tenant's name
  await adm.waitForFunction(() => [...document.querySelectorAll('#legend li')]
    .some((li) => /^alpha: [1-9]\d* pages, [1-9]\d* running$/.test(li.textContent)), { timeout: T });
  const rows = await adm.$$eval('#tenants tbody tr', (trs) => trs.map((tr) => tr.textContent));
  if (!rows.some((r) => r.startsWith('alpha'))) fail('no alpha row in the tenants table: ' + rows);
  console.log('webui admin: the map names alpha beside its pages');
  } else {
  const adm = await openAdmin();
  await adm.click('#check');
  await adm.waitForFunction(() => /^(clean|NOT clean)/.test(document.getElementById('check-result').textContent),
    { timeout: T });
  const check = await adm.$eval('#check-result', (el) => el.textContent);
  if (!check.startsWith('clean: ')) fail('the idle pool check says [' + check + ']');
  console.log('webui check: ' + check);
  }
  if (errors.length) fail('page errors: ' + errors.join('; '));
} finally {
  await browser.close();
}
