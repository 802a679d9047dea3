// The dashboard in headless Chromium (Debian's, driven by playwright-core): the page loads,
// shows the swarm's nodes and a loss curve, a prompt streams text, an oversized prompt shows
// the API's error, and the page fetches nothing but its own node. Saves a screenshot.
//
//   node e2e/dashboard.mjs --url http://127.0.0.1:PORT/ --nodes 4 --screenshot out.png
//   node e2e/dashboard.mjs --mock --screenshot out.png   (stand-in node with hostile strings)

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';
import { HOSTILE, startMock } from './mock-node.mjs';

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string' },
    mock: { type: 'boolean', default: false },
    nodes: { type: 'string', default: '4' },
    screenshot: { type: 'string', default: 'dashboard.png' },
    chromium: { type: 'string', default: process.env.CHROMIUM ?? '/usr/bin/chromium' },
    // How long a live swarm may take to show its nodes and a loss curve.
    'timeout-s': { type: 'string', default: '90' },
  },
});
if (!opt.url === !opt.mock) throw new Error('give exactly one of --url URL and --mock');
const expectNodes = Number(opt.nodes);
const timeout = Number(opt['timeout-s']) * 1000;

const mock = opt.mock ? await startMock() : null;
const url = mock?.url ?? opt.url;
const origin = new URL(url).origin;
const profile = await mkdtemp(join(tmpdir(), 'neuroshard-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: opt.chromium,
  headless: true,
  chromiumSandbox: false,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
  viewport: { width: 1440, height: 1000 },
});

const step = (what) => console.log(`dashboard e2e: ${what}`);
const failures = [];
const check = (ok, what) => {
  console.log(`  ${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures.push(what);
};

try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(timeout);
  const pageErrors = [];
  const foreign = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  // A 4xx the page asked for (the oversized prompt) is logged by Chromium itself: not a script error.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) pageErrors.push(m.text());
  });
  page.on('request', (r) => {
    const u = r.url();
    if (!u.startsWith(origin) && !u.startsWith('data:')) foreign.push(u);
  });

  step(`loading ${url}`);
  const resp = await page.goto(url, { waitUntil: 'load', timeout: 30_000 });
  check(resp?.status() === 200, `GET / answers 200 (got ${resp?.status()})`);
  check((await page.title()).includes('NeuroShard'), 'the page is the NeuroShard dashboard');
  await page.waitForSelector('#conn[data-state="live"]', { timeout: 30_000 });
  check(true, 'the read API answers (header says live)');

  step(`waiting for ${expectNodes} nodes and a loss curve with 2 points`);
  await page.waitForFunction((n) => document.querySelectorAll('#swarm [data-node]').length === n, expectNodes);
  const nodes = await page.$$eval('#swarm [data-node]', (els) =>
    els.map((e) => ({ alive: e.getAttribute('data-alive') === 'true', self: e.classList.contains('self') })),
  );
  check(nodes.length === expectNodes, `${nodes.length} nodes in the stages × replicas grid`);
  check(nodes.filter((n) => n.self).length === 1, 'the serving node is marked');
  // The model the network trains: a shape from the live swarm, the growing mock's version.
  const model = await page.textContent('#f-model');
  check(/\d+ × \d+ · /.test(model ?? ''), `the model is shown: ${JSON.stringify(model)}`);
  if (mock) check(model?.startsWith('v1 · 8 × 256 · 6.7M') === true, 'with its architecture version');
  if (mock) {
    // Each round names the architecture version it trained: the newest first.
    await page.waitForFunction(() => document.querySelectorAll('#rounds tr').length >= 2);
    const versions = await page.$$eval('#rounds tr', (rows) => rows.map((r) => r.children[2]?.textContent));
    check(versions[0] === 'v1' && versions.at(-1) === 'v0', `rounds name their version: ${versions.join(' ')}`);
  }
  console.log(`       ${nodes.filter((n) => n.alive).length} of them alive`);
  await page.waitForFunction(() => Number(document.querySelector('svg.chart')?.getAttribute('data-points') ?? 0) >= 2);
  const points = await page.$eval('svg.chart', (el) => Number(el.getAttribute('data-points')));
  const title = await page.textContent('#loss-title');
  check(points >= 2, `the loss curve has ${points} points (${title})`);
  check((await page.$$('svg.chart .series path')).length >= 1, 'the curve is drawn');
  // The validation loss: held-out windows the driver scores through the pipeline each round.
  const valDots = 'svg.chart [data-series="validation"] circle';
  await page.waitForFunction((sel) => document.querySelectorAll(sel).length >= 2, valDots);
  const valPoints = (await page.$$(valDots)).length;
  check(valPoints >= 2, `the validation-loss curve has ${valPoints} points (${await page.textContent('#loss-title')})`);

  step('streaming a completion');
  await page.fill('#prompt', 'The ');
  await page.fill('#max-tokens', '24');
  // Counts the pieces as they land, to see that the text streams rather than arriving whole.
  // The button turns to Stop while the stream runs; a short completion can end before a
  // poll would see it, so an observer records it.
  await page.evaluate(() => {
    window.__pieces = 0;
    window.__sawStop = false;
    new MutationObserver((ms) => (window.__pieces += ms.length)).observe(document.getElementById('completion'), {
      childList: true,
    });
    const button = document.getElementById('generate');
    new MutationObserver(() => {
      if (button.textContent === 'Stop') window.__sawStop = true;
    }).observe(button, { childList: true, characterData: true, subtree: true });
  });
  await page.click('#generate');
  await page.waitForFunction(
    () => window.__sawStop && document.getElementById('generate')?.textContent === 'Generate',
    null,
    { timeout: 60_000 },
  );
  const text = await page.textContent('#completion');
  const pieces = await page.evaluate(() => window.__pieces);
  const promptError = await page.$eval('#prompt-error', (e) => (e.hidden ? '' : e.textContent));
  check(promptError === '', `no error from the completion${promptError ? `: ${promptError}` : ''}`);
  check(text.length > 0, `the completion streamed ${JSON.stringify(text)}`);
  check(pieces >= 2, `it arrived in ${pieces} pieces`);
  console.log(`       ${await page.textContent('#prompt-status')}`);

  if (mock) {
    step('hostile peer strings');
    const shown = await page.textContent('body');
    check(shown.includes(HOSTILE), 'a peer-chosen role and proof kind show as text');
    check(await page.evaluate(() => window.__pwned === undefined), 'and never run as markup');
    check(nodes.some((n) => !n.alive), 'a dead node is shown as dead');
  }

  // The screenshot shows the completion; the error check after it reuses the prompt box.
  const shot = resolve(opt.screenshot);
  await page.screenshot({ path: shot, fullPage: true });
  console.log(`screenshot: ${shot}`);

  step('an oversized prompt');
  await page.fill('#prompt', 'x'.repeat(70_000));
  await page.click('#generate');
  await page.waitForSelector('#prompt-error:not([hidden])', { timeout: 10_000 });
  const err = await page.textContent('#prompt-error');
  check(/at most 65536/.test(err), `the API's error is shown: ${JSON.stringify(err)}`);

  check(pageErrors.length === 0, `no script errors${pageErrors.length ? `: ${pageErrors.join('; ')}` : ''}`);
  check(foreign.length === 0, `no request leaves the node${foreign.length ? `: ${foreign.join(', ')}` : ''}`);
} catch (e) {
  failures.push(String(e));
  console.log(`  FAIL ${e}`);
} finally {
  await context.close();
  await rm(profile, { recursive: true, force: true });
  await mock?.stop();
}

console.log(`${failures.length ? 0 : 1} passed, ${failures.length ? 1 : 0} failed: dashboard e2e${opt.mock ? ' (stand-in node)' : ''}`);
process.exit(failures.length ? 1 : 0);
