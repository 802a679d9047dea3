// The node dashboard: polls the node's read API every two seconds and renders each part on
// its own, so one failing endpoint leaves the others live; the prompt box streams completions.

import { getJson, type Account, type Loss, type Proof, type Round, type Status } from './api';
import { lossChart } from './chart';
import { byId, fill, h, setText } from './dom';
import { ago, bytes, duration, int, neuro, params, short } from './format';
import { streamCompletion } from './stream';

const POLL_MS = 2000;
const ROUNDS_SHOWN = 10;
const PROOFS_SHOWN = 8;

/** The node's clock at the last status, to say how old peer-stamped times are. */
let nodeNow: number | null = null;
const now = () => nodeNow ?? Date.now();

function showError(id: string, err: unknown, prefix = 'Could not load: '): void {
  const el = byId(id);
  el.hidden = err === null;
  el.textContent = err === null ? '' : `${prefix}${err instanceof Error ? err.message : String(err)}`;
}

function idCell(hex: string, self: boolean): HTMLElement {
  return h('span', { class: 'id mono', title: hex }, short(hex), self ? h('span', { class: 'badge you' }, 'this node') : null);
}

/** The model as "v2 · 12 × 256 · 6.7M" for a growing network, "12 × 256 · 6.7M" else. */
function modelText(st: Status): string {
  const m = st.model;
  if (m === undefined) return '—';
  const shape = `${int(m.layers)} × ${int(m.d_model)} · ${params(m.params)}`;
  return m.version === null ? shape : `v${int(m.version)} · ${shape}`;
}

function renderStatus(st: Status): void {
  nodeNow = st.time_ms;
  const idLink = (hex: string) => h('span', { title: hex }, short(hex, 12));
  fill('f-node', idLink(st.node));
  fill('f-network', idLink(st.network));
  setText('f-stage', `${st.stage} · ${st.role}`);
  setText('f-step', int(st.step));
  setText('f-round', int(st.sync_round));
  setText('f-model', modelText(st));
  setText('f-proofs', int(st.ledger.proofs));
  setText('f-balance', `${neuro(st.ledger.balance)} NEURO`);
  fill('f-state', idLink(st.ledger.state_hash));

  // Stages are rows, their replicas columns (in node id order, so a cell stays put).
  const stages = Math.max(st.stages, ...st.nodes.map((n) => n.stage + 1));
  const byStage = Array.from({ length: stages }, (_, i) =>
    st.nodes.filter((n) => n.stage === i).sort((a, b) => a.node.localeCompare(b.node)),
  );
  const replicas = Math.max(1, ...byStage.map((r) => r.length));
  const alive = st.nodes.filter((n) => n.alive).length;
  setText('swarm-summary', `${st.nodes.length} nodes · ${alive} alive · ${stages} stages`);
  const grid = h('div', { class: 'swarm-grid', role: 'table' });
  grid.style.gridTemplateColumns = `5.5rem repeat(${replicas}, minmax(9rem, 1fr))`;
  grid.append(h('div', { class: 'corner', role: 'columnheader' }));
  for (let r = 0; r < replicas; r++) grid.append(h('div', { class: 'col-head', role: 'columnheader' }, `replica ${r}`));
  byStage.forEach((row, stage) => {
    grid.append(h('div', { class: 'row-head', role: 'rowheader' }, `stage ${stage}`));
    for (let r = 0; r < replicas; r++) {
      const n = row[r];
      if (!n) {
        grid.append(h('div', { class: 'cell vacant', role: 'cell' }, 'no replica'));
        continue;
      }
      // Nodes of stages this node does not hear come from the ledger's registrations and
      // were never seen here: unknown, not dead.
      const unheard = !n.alive && !n.self && n.last_seen_ms === 0;
      const state = n.alive ? 'alive' : unheard ? 'unheard' : 'dead';
      grid.append(
        h(
          'div',
          {
            class: `cell node ${state}${n.self ? ' self' : ''}`,
            role: 'cell',
            'data-node': n.node,
            'data-alive': n.alive ? 'true' : 'false',
          },
          h('div', { class: 'cell-top' }, h('span', { class: 'dot', 'aria-hidden': 'true' }), idCell(n.node, n.self)),
          h('div', { class: 'cell-sub' }, n.role, ' · ', n.alive ? 'alive' : unheard ? 'registered' : 'unreachable'),
          h(
            'div',
            { class: 'cell-sub faint' },
            n.self ? 'serving this page' : unheard ? 'not heard by this node' : `seen ${ago(st.time_ms, n.last_seen_ms)}`,
          ),
        ),
      );
    }
  });
  fill('swarm', grid);
}

function renderLoss(loss: Loss): void {
  const hasVal = loss.validation.length > 0;
  // Without validation points yet, the training loss is the curve, and the title says so.
  setText('loss-title', hasVal ? 'Validation loss' : 'Training loss');
  const series = hasVal
    ? [
        { name: 'training', points: loss.train, cls: 'train' },
        { name: 'validation', points: loss.validation, cls: 'val' },
      ]
    : [{ name: 'training', points: loss.train, cls: 'val' }];
  fill('loss', lossChart(series, 'No training step reported yet.'));
  const last = (pts: { step: number; loss: number }[]) => pts[pts.length - 1];
  const main = hasVal ? loss.validation : loss.train;
  const first = main[0];
  const latest = last(main);
  setText(
    'loss-summary',
    latest && first
      ? `${latest.loss.toFixed(3)} at step ${int(latest.step)}${main.length > 1 ? ` (from ${first.loss.toFixed(3)})` : ''}`
      : '',
  );
  fill(
    'loss-legend',
    ...series.map((x) =>
      h('span', { class: `key ${x.cls}` }, h('i', { 'aria-hidden': 'true' }), `${x.name} (${x.points.length} points)`),
    ),
  );
}

function renderRounds(rounds: Round[]): void {
  byId('rounds-empty').hidden = rounds.length > 0;
  const sent = rounds.reduce((a, r) => a + r.sent_bytes, 0);
  const dense = rounds.reduce((a, r) => a + r.dense_bytes, 0);
  setText(
    'rounds-summary',
    rounds.length ? `${rounds.length} rounds · ${bytes(sent)} sent of ${bytes(dense)} dense` : '',
  );
  const rows = rounds
    .slice(-ROUNDS_SHOWN)
    .reverse()
    .map((r) => {
      const ratio = r.sent_bytes > 0 ? r.dense_bytes / r.sent_bytes : 0;
      const share = r.dense_bytes > 0 ? Math.min(1, r.sent_bytes / r.dense_bytes) : 0;
      const bar = h('span', { class: 'bar' }, h('span', { class: 'fill' }));
      (bar.firstChild as HTMLElement).style.width = `${(share * 100).toFixed(1)}%`;
      const partial = r.contributors < r.expected;
      return h(
        'tr',
        {},
        h('td', {}, r.stage),
        h('td', { class: 'num' }, int(r.round)),
        h('td', { class: 'num' }, r.version === null ? '—' : `v${int(r.version)}`),
        h('td', {}, h('span', { class: partial ? 'warn' : '' }, `${r.contributors} / ${r.expected}`)),
        h('td', { class: 'r num' }, duration(r.wall_ms)),
        h('td', { class: 'r num' }, bytes(r.sent_bytes)),
        h('td', { class: 'r num faint' }, bytes(r.dense_bytes)),
        h('td', {}, h('span', { class: 'ratio' }, bar, ratio ? `${ratio.toFixed(1)}×` : '—')),
      );
    });
  fill('rounds', ...rows);
}

function renderBalances(accounts: Account[], self: string | null): void {
  const total = accounts.reduce((a, x) => a + x.balance, 0);
  setText('ledger-summary', `${accounts.length} accounts · ${neuro(total)} NEURO`);
  const rows = [...accounts]
    .sort((a, b) => b.balance - a.balance || a.node.localeCompare(b.node))
    .map((a) =>
      h(
        'tr',
        { class: a.node === self ? 'self' : undefined },
        h('td', {}, idCell(a.node, a.node === self)),
        h('td', { class: 'r num' }, neuro(a.balance)),
        h('td', { class: 'r num faint' }, neuro(a.stake)),
      ),
    );
  fill('balances', ...(rows.length ? rows : [h('tr', {}, h('td', { colspan: 3, class: 'empty' }, 'No account yet.'))]));
}

function renderProofs(proofs: Proof[]): void {
  const items = proofs.slice(0, PROOFS_SHOWN).map((p) =>
    h(
      'li',
      {},
      h('span', { class: 'kind' }, p.kind),
      h('span', { class: 'id mono', title: p.node }, short(p.node)),
      h('span', { class: 'reward num' }, `+${neuro(p.reward)}`),
      h('span', { class: 'when faint' }, ago(now(), p.time_ms)),
    ),
  );
  fill('proofs', ...(items.length ? items : [h('li', { class: 'empty' }, 'No proof accepted yet.')]));
}

function setConn(state: 'live' | 'down', text: string): void {
  byId('conn').dataset.state = state;
  setText('conn-text', text);
}

let selfId: string | null = null;

async function poll(): Promise<void> {
  const [status, loss, rounds, balances, proofs] = await Promise.allSettled([
    getJson<Status>('/api/status'),
    getJson<Loss>('/api/loss'),
    getJson<{ rounds: Round[] }>('/api/rounds'),
    getJson<{ accounts: Account[] }>('/api/balances'),
    getJson<{ proofs: Proof[] }>('/api/proofs'),
  ]);
  // Each part renders or shows its own error; a render error is reported like a fetch error.
  const part = <T>(r: PromiseSettledResult<T>, errId: string, render: (v: T) => void) => {
    try {
      if (r.status === 'rejected') throw r.reason;
      render(r.value);
      showError(errId, null);
    } catch (e) {
      showError(errId, e);
    }
  };
  part(status, 'swarm-error', (st) => {
    selfId = st.node;
    renderStatus(st);
  });
  part(loss, 'loss-error', renderLoss);
  part(rounds, 'rounds-error', (r) => renderRounds(r.rounds));
  part(balances, 'balances-error', (b) => renderBalances(b.accounts, selfId));
  part(proofs, 'proofs-error', (p) => renderProofs(p.proofs));
  if (status.status === 'fulfilled') {
    setConn('live', `live · updated ${new Date().toLocaleTimeString('en-GB')}`);
  } else {
    setConn('down', 'node unreachable — retrying');
  }
}

async function loop(): Promise<void> {
  // The next poll waits for this one, so a slow node never gets overlapping polls.
  try {
    await poll();
  } finally {
    setTimeout(loop, POLL_MS);
  }
}

function setupPrompt(): void {
  const form = byId<HTMLFormElement>('prompt-form');
  const button = byId<HTMLButtonElement>('generate');
  const prompt = byId<HTMLTextAreaElement>('prompt');
  let running: AbortController | null = null;

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    if (running) {
      running.abort();
      return;
    }
    const temperature = Number(byId<HTMLInputElement>('temperature').value);
    const maxTokens = Math.trunc(Number(byId<HTMLInputElement>('max-tokens').value));
    const out = byId('completion');
    const output = byId('output');
    showError('prompt-error', null);
    setText('prompt-echo', prompt.value);
    out.textContent = '';
    output.classList.add('streaming');
    running = new AbortController();
    button.textContent = 'Stop';
    button.classList.remove('primary');
    const started = performance.now();
    setText('prompt-status', 'Waiting for the first token…');
    try {
      const end = await streamCompletion(
        { prompt: prompt.value, temperature, max_tokens: maxTokens },
        (text) => {
          out.append(document.createTextNode(text));
          setText('prompt-status', `Streaming… ${out.textContent?.length ?? 0} characters`);
        },
        running.signal,
      );
      const took = duration(performance.now() - started);
      setText('prompt-status', `${end.pieces} pieces in ${took} · finish: ${end.finish ?? 'unknown'}`);
    } catch (e) {
      if (e instanceof DOMException && e.name === 'AbortError') {
        setText('prompt-status', 'Stopped.');
      } else {
        setText('prompt-status', '');
        showError('prompt-error', e, '');
      }
    } finally {
      running = null;
      output.classList.remove('streaming');
      button.textContent = 'Generate';
      button.classList.add('primary');
    }
  });
}

setupPrompt();
void loop();
