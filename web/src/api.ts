// The node's read API (crates/api): the shapes the dashboard reads. Every string in them may
// come from a peer, so the page only ever puts them in text nodes and attributes.

export interface NodeRow {
  node: string;
  stage: number;
  role: string;
  alive: boolean;
  last_seen_ms: number;
  self: boolean;
}

export interface Status {
  node: string;
  network: string;
  stage: number;
  role: string;
  stages: number;
  step: number;
  sync_round: number;
  time_ms: number;
  ledger: { state_hash: string; proofs: number; balance: number };
  nodes: NodeRow[];
  /** The model trained; `version` is null for a network of one fixed model. Absent from
   *  nodes older than the field. */
  model?: ModelInfo;
}

export interface ModelInfo {
  version: number | null;
  layers: number;
  d_model: number;
  params: number;
  /** [stage id, blocks] in pipeline order, for a network that grows. */
  stages: [number, number][];
}

export interface LossPoint {
  step: number;
  loss: number;
  time_ms: number;
}

export interface Loss {
  train: LossPoint[];
  validation: LossPoint[];
}

export interface Round {
  stage: number;
  round: number;
  /** The architecture version the round trained (a growing network's); null otherwise. */
  version: number | null;
  contributors: number;
  expected: number;
  wall_ms: number;
  sent_bytes: number;
  dense_bytes: number;
  time_ms: number;
}

export interface Account {
  node: string;
  balance: number;
  stake: number;
}

export interface Proof {
  node: string;
  kind: string;
  reward: number;
  time_ms: number;
}

/** A polled endpoint that answered with something else than JSON of the expected shape. */
export class ApiError extends Error {}

/** GETs `path` as JSON, giving up after `timeoutMs` so that one stuck poll cannot stall the page. */
export async function getJson<T>(path: string, timeoutMs = 5000): Promise<T> {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  try {
    const resp = await fetch(path, { signal: ctl.signal, headers: { accept: 'application/json' } });
    if (!resp.ok) throw new ApiError(`${path}: HTTP ${resp.status}`);
    return (await resp.json()) as T;
  } catch (e) {
    if (e instanceof DOMException && e.name === 'AbortError') {
      throw new ApiError(`${path}: no answer in ${timeoutMs / 1000} s`);
    }
    throw e;
  } finally {
    clearTimeout(timer);
  }
}
