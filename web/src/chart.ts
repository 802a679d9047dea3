// The loss curve as hand-drawn SVG: a few dozen lines instead of a chart dependency.

import type { LossPoint } from './api';
import { s } from './dom';

export interface Series {
  name: string;
  points: LossPoint[];
  cls: string;
}

const W = 640;
const H = 260;
const PAD = { left: 48, right: 16, top: 14, bottom: 34 };

/** About `count` round tick values covering [lo, hi]. */
function ticks(lo: number, hi: number, count: number): number[] {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((m) => m >= raw) ?? raw;
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Number(v.toPrecision(12)));
  }
  return out;
}

function label(v: number): string {
  return Math.abs(v) >= 1000 ? v.toLocaleString('en-US') : String(Number(v.toPrecision(4)));
}

/** The chart of `series` (the first ones drawn underneath), or a line saying why it is empty. */
export function lossChart(series: Series[], empty: string): SVGElement {
  const all = series.flatMap((x) => x.points).filter((p) => Number.isFinite(p.loss));
  const svg = s('svg', {
    viewBox: `0 0 ${W} ${H}`,
    class: 'chart',
    role: 'img',
    'aria-label': 'loss by step',
    'data-points': Math.max(0, ...series.map((x) => x.points.length)),
  });
  if (all.length === 0) {
    svg.append(s('text', { x: W / 2, y: H / 2, class: 'chart-empty', 'text-anchor': 'middle' }, empty));
    return svg;
  }
  let xMin = Math.min(...all.map((p) => p.step));
  let xMax = Math.max(...all.map((p) => p.step));
  if (xMax === xMin) xMax = xMin + 1;
  let yMin = Math.min(...all.map((p) => p.loss));
  let yMax = Math.max(...all.map((p) => p.loss));
  const margin = Math.max((yMax - yMin) * 0.08, 0.05);
  yMin = Math.max(0, yMin - margin);
  yMax += margin;
  const x = (v: number) => PAD.left + ((v - xMin) / (xMax - xMin)) * (W - PAD.left - PAD.right);
  const y = (v: number) => H - PAD.bottom - ((v - yMin) / (yMax - yMin)) * (H - PAD.top - PAD.bottom);

  const grid = s('g', { class: 'grid' });
  for (const t of ticks(yMin, yMax, 5)) {
    grid.append(s('line', { x1: PAD.left, x2: W - PAD.right, y1: y(t), y2: y(t) }));
    grid.append(s('text', { x: PAD.left - 8, y: y(t) + 4, 'text-anchor': 'end' }, label(t)));
  }
  for (const t of ticks(xMin, xMax, 6).filter((t) => Number.isInteger(t))) {
    grid.append(s('text', { x: x(t), y: H - PAD.bottom + 18, 'text-anchor': 'middle' }, label(t)));
  }
  grid.append(s('text', { x: W - PAD.right, y: H - 4, 'text-anchor': 'end', class: 'axis-name' }, 'step'));
  svg.append(grid);
  svg.append(
    s('line', {
      class: 'axis',
      x1: PAD.left,
      x2: W - PAD.right,
      y1: H - PAD.bottom,
      y2: H - PAD.bottom,
    }),
  );

  for (const line of series) {
    const pts = line.points.filter((p) => Number.isFinite(p.loss)).sort((a, b) => a.step - b.step);
    if (pts.length === 0) continue;
    const d = pts.map((p, i) => `${i ? 'L' : 'M'}${x(p.step).toFixed(1)},${y(p.loss).toFixed(1)}`).join('');
    const g = s('g', { class: `series ${line.cls}`, 'data-series': line.name });
    g.append(s('path', { d }));
    // Dots only where they stay legible: a validation curve has few points.
    if (pts.length <= 60) {
      for (const p of pts) {
        g.append(
          s('circle', { cx: x(p.step), cy: y(p.loss), r: 2.5 }, s('title', {}, `step ${p.step}: ${p.loss.toFixed(4)}`)),
        );
      }
    }
    svg.append(g);
  }
  return svg;
}
