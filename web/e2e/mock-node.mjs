// A stand-in node for the browser test's fast pass: the checked-in dashboard build plus the
// read API and a streaming /v1/completions, with hostile peer strings in it. Test tooling
// only; the product's routes live in crates/api.

import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

const ASSETS = fileURLToPath(new URL('../../crates/api/dashboard/', import.meta.url));
const TYPES = { 'index.html': 'text/html; charset=utf-8', 'app.js': 'text/javascript', 'app.css': 'text/css' };
/** What a hostile peer might put in a string the page shows: must stay text. */
export const HOSTILE = '<img src=x onerror="window.__pwned=1">';

const hex = (i) => (i.toString(16).padStart(2, '0') + 'c0ffee').repeat(8).slice(0, 64);

function fixtures(start) {
  const t = Date.now();
  const elapsed = Math.floor((t - start) / 1000);
  const step = 40 + elapsed;
  const nodes = [0, 1, 2, 3].map((i) => ({
    node: hex(i),
    stage: i % 2,
    role: i === 3 ? HOSTILE : i < 2 ? 'driver' : 'replica',
    alive: i !== 2,
    last_seen_ms: t - (i === 2 ? 95_000 : 800 * i),
    self: i === 0,
  }));
  const train = Array.from({ length: step }, (_, s) => ({
    step: s + 1,
    loss: 6.2 * Math.exp(-s / 25) + 2.1 + 0.15 * Math.sin(s * 1.7),
    time_ms: t - (step - s) * 1000,
  }));
  const validation = train.filter((p) => p.step % 10 === 0).map((p) => ({ ...p, loss: p.loss + 0.12 }));
  const rounds = Array.from({ length: 7 }, (_, r) => ({
    stage: r % 2,
    round: Math.floor(r / 2) + 1,
    // The network grew after round 2: its later rounds trained version 1.
    version: r >= 4 ? 1 : 0,
    contributors: r === 5 ? 1 : 2,
    expected: 2,
    wall_ms: 180 + r * 37,
    sent_bytes: 52_000 + r * 1000,
    dense_bytes: 410_000,
    time_ms: t - (7 - r) * 4000,
  }));
  return {
    '/api/status': {
      node: hex(0),
      network: 'ab'.repeat(32),
      stage: 0,
      role: 'driver',
      stages: 2,
      step,
      sync_round: 4,
      time_ms: t,
      ledger: { state_hash: '5e'.repeat(32), proofs: 12, balance: 4_200_000_000_000 },
      nodes,
      model: { version: 1, layers: 8, d_model: 256, params: 6_710_016, stages: [[0, 2], [2, 4], [1, 2]] },
    },
    '/api/loss': { train, validation },
    '/api/rounds': { rounds },
    '/api/balances': {
      accounts: nodes.map((n, i) => ({ node: n.node, balance: (4200 - i * 700) * 1e9, stake: 1000e9 })),
    },
    '/api/proofs': {
      proofs: Array.from({ length: 10 }, (_, i) => ({
        node: hex(i % 4),
        kind: i === 1 ? HOSTILE : i % 2 ? 'forward-backward' : 'sync-round',
        reward: (100 + i) * 1e9,
        time_ms: t - i * 3000,
      })),
    },
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function completions(req, res) {
  let body = '';
  for await (const chunk of req) body += chunk;
  const v = JSON.parse(body);
  if (typeof v.prompt !== 'string' || v.prompt.length > 65536) {
    res.writeHead(400, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: `the prompt has ${v.prompt?.length} bytes; at most 65536`, type: 'invalid_request_error' } }));
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  const words = ['quick', ' brown', ' fox', ' <b>jumps</b>', ' over', ' the', ' lazy', ' dog'];
  for (const [i, w] of words.slice(0, v.max_tokens).entries()) {
    const finish = i === words.length - 1 ? 'length' : null;
    res.write(`data: ${JSON.stringify({ object: 'text_completion', choices: [{ text: w, index: 0, finish_reason: finish }] })}\n\n`);
    await sleep(60);
  }
  res.end('data: [DONE]\n\n');
}

/** Starts the stand-in on a free port of 127.0.0.1; resolves to its URL and a stop function. */
export async function startMock() {
  const start = Date.now();
  const server = createServer(async (req, res) => {
    const path = new URL(req.url, 'http://x').pathname;
    try {
      if (req.method === 'POST' && path === '/v1/completions') return await completions(req, res);
      const data = fixtures(start)[path];
      if (data) {
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end(JSON.stringify(data));
      }
      const file = path === '/' ? 'index.html' : path.slice(1);
      if (TYPES[file]) {
        res.writeHead(200, { 'content-type': TYPES[file] });
        return res.end(await readFile(ASSETS + file));
      }
      res.writeHead(404).end();
    } catch (e) {
      res.writeHead(500).end(String(e));
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address();
  return { url: `http://127.0.0.1:${port}/`, stop: () => new Promise((r) => server.close(r)) };
}
