#!/usr/bin/env python3
"""Validation loss against training FLOPs for the runs of bench/grow_experiment.sh, as SVG.

usage: bench/grow_plot.py OUTDIR > curves.svg   (standard library only)
"""
import json
import sys
from pathlib import Path

GROW_COLOURS = ["#d62728", "#ff7f0e", "#9467bd"]


def runs(out):
    """fixed2, every growth run (grow2to4 or grow2to4-F, F the compute fraction), fixed4."""
    grows = sorted(p.stem for p in out.glob("grow2to4*.jsonl"))
    found = [("fixed2", "#1f77b4", "fixed 2 layers")]
    for i, name in enumerate(grows):
        frac = name.partition("-")[2]
        label = "2 → 4 layers" + (f" after {frac} of the compute" if frac else "")
        found.append((name, GROW_COLOURS[i % len(GROW_COLOURS)], label))
    found.append(("fixed4", "#2ca02c", "fixed 4 layers"))
    return found
W, H, L, R, T, B = 640, 400, 60, 20, 20, 50


def curve(path):
    points, grow, flops = [], None, 0.0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "grow" in row:
            grow = flops
            continue
        flops = row["train_flops"]
        if row.get("val_loss") is not None and (not points or points[-1][1] != row["val_loss"]):
            points.append((row["train_flops"], row["val_loss"]))
    return points, grow


def main():
    out = Path(sys.argv[1])
    RUNS = runs(out)
    curves = {name: curve(out / f"{name}.jsonl") for name, _, _ in RUNS}
    xs = [x for pts, _ in curves.values() for x, _ in pts]
    ys = [y for pts, _ in curves.values() for _, y in pts]
    x1, y0, y1 = max(xs), min(ys) - 0.05, min(max(ys), min(ys) + 1.2)
    sx = lambda x: L + (W - L - R) * x / x1
    sy = lambda y: T + (H - T - B) * (y1 - min(y, y1)) / (y1 - y0)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>',
           f'<text x="{(W+L)/2}" y="{H-12}" text-anchor="middle">training FLOPs (6·N per token)'
           f', max {x1:.2e}</text>',
           f'<text x="14" y="{(H-B+T)/2}" transform="rotate(-90 14 {(H-B+T)/2})" '
           'text-anchor="middle">validation loss (nats/token)</text>']
    k = 0.0
    while k <= y1:
        if k >= y0:
            svg.append(f'<text x="{L-6}" y="{sy(k)+4}" text-anchor="end">{k:.2f}</text>')
            svg.append(f'<line x1="{L}" y1="{sy(k)}" x2="{W-R}" y2="{sy(k)}" stroke="#ddd"/>')
        k += 0.25
    for i, (name, colour, label) in enumerate(RUNS):
        pts, grow = curves[name]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        svg.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        if grow is not None:
            gx = sx(grow)
            svg.append(f'<line x1="{gx}" y1="{T}" x2="{gx}" y2="{H-B}" stroke="{colour}" '
                       'stroke-dasharray="4 3"/>')
        svg.append(f'<text x="{W-R-330}" y="{T+16+16*i}" fill="{colour}">{label}: '
                   f'{pts[-1][1]:.3f}</text>')
    svg.append("</svg>")
    print("\n".join(svg))


if __name__ == "__main__":
    main()
