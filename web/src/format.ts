// Numbers and ids as a person reads them.

/** The first characters of a hex id: enough to tell the swarm's nodes apart. */
export function short(hex: string, n = 8): string {
  return hex.length > n ? hex.slice(0, n) : hex;
}

export function int(n: number): string {
  return Math.round(n).toLocaleString('en-US');
}

export function bytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u += 1;
  }
  return `${u === 0 ? v : v.toFixed(v < 10 ? 2 : 1)} ${units[u]}`;
}

/** How long ago `thenMs` was at `nowMs` (both Unix milliseconds of the node's clock). */
export function ago(nowMs: number, thenMs: number): string {
  const s = Math.max(0, Math.round((nowMs - thenMs) / 1000));
  if (s < 60) return `${s} s ago`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ago`;
  const h = Math.floor(m / 60);
  return `${h} h ${m % 60} min ago`;
}

export function duration(ms: number): string {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

/** NEURO from the ledger's units (10⁹ per NEURO), as the CLI prints them. */
export function neuro(units: number): string {
  const v = units / 1e9;
  return v.toLocaleString('en-US', { maximumFractionDigits: v !== 0 && Math.abs(v) < 1 ? 6 : 3 });
}

/** A parameter count as 6.7M or 1.2B. */
export function params(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}k`;
  return String(n);
}
