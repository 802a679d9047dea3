"""Cross-check NeuroShard's aggregators and attacks against PyPI byzfl on identical inputs.

Agreement is reported as max|ours - byzfl| / max|byzfl|; timing compares byzfl (torch CPU
backend, same thread count) with our release binary's in-process compute time (file I/O excluded
on both sides).
"""
import argparse, json, os, subprocess, sys, tempfile, time

import numpy as np
import torch
from byzfl import Average, Median, TrMean, Krum, MultiKrum, GeometricMedian, CenteredClipping
from byzfl import SignFlipping, InnerProductManipulation, ALittleIsEnough


def rel(ours, ref):
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30))


def ours(binary, mode, spec, f, path, n, repeats=1):
    out = path + ".out"
    cmd = [binary, mode, spec, str(f), str(n), path, out] + ([str(repeats)] if mode == "aggregate" else [])
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    vec = np.fromfile(out, dtype="<f4")
    os.remove(out)
    info = json.loads(res.stdout) if mode == "aggregate" else {}
    return vec, info


def timed(fn, repeats):
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--len", type=int, default=10_000_000)
    p.add_argument("--f", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--gm-iters", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(os.cpu_count())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.n, a.len), dtype=np.float32)
    x[: a.f] *= 50.0  # f loud peers, so the robust rules have something to reject
    x[: a.f] += 3.0
    xt = torch.from_numpy(x)
    tmp = tempfile.mkdtemp(prefix="byzfl_check_")
    path = os.path.join(tmp, "inputs.f32")
    x.tofile(path)
    print(f"inputs: n={a.n} len={a.len} f={a.f} ({x.nbytes / 1e6:.0f} MB), torch threads={torch.get_num_threads()}")

    tau = 1000.0
    cases = [
        ("mean", Average(), "mean", None),
        ("trimmed-mean f", TrMean(f=a.f), "trimmed-mean", None),
        ("median", Median(), "median", "byzfl torch backend is torch.quantile, which fails above 16M elements (numpy used then)"),
        ("krum", Krum(f=a.f), "krum", "byzfl scores by the mean of n-f-1 nearest; ours sums n-f-2 (paper)"),
        ("multi-krum m=n-f", MultiKrum(f=a.f), "multi-krum", "same scoring difference as krum"),
        ("geometric-median", GeometricMedian(nu=0.1, T=a.gm_iters), f"geometric-median:nu=0.1,iters={a.gm_iters},tol=0",
         "byzfl starts Weiszfeld at 0, ours at the mean: equal only at convergence (see the converged check)"),
        ("centered-clipping", CenteredClipping(tau=tau, L=1), f"centered-clipping:tau={tau},iters=1",
         "byzfl's float32 torch.linalg.norm drifts at 10M coordinates; see the norm check below"),
    ]
    rows = []
    for name, byz, spec, note in cases:
        def call(v, byz=byz):
            if isinstance(byz, CenteredClipping):
                byz.m = None  # byzfl keeps its last result as the next centre; start each call at 0
            return byz(v)

        try:
            ref, t_byz = timed(lambda: call(xt), a.repeats)
            backend = "torch"
        except RuntimeError as e:
            ref, t_byz = timed(lambda: call(x), a.repeats)
            backend = f"numpy ({str(e).splitlines()[0][:60]})"
        ref = ref.numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
        mine, info = ours(a.bin, "aggregate", spec, a.f, path, a.n, a.repeats)
        t_ours = min(info["seconds"])
        r = rel(mine, ref)
        rows.append((name, r, t_byz, t_ours, backend, note))
        print(f"{name:20s} rel.err {r:9.2e}  byzfl {t_byz:8.3f}s [{backend}]  ours {t_ours:7.3f}s  "
              f"speedup {t_byz / t_ours:6.1f}x" + (f"  note: {note}" if note else ""), flush=True)

    # Centered clipping scales each input by tau/‖x - v‖: byzfl takes that norm in float32 torch,
    # ours accumulates in f64. Measure torch's norm error and what it alone does to the result.
    n32 = torch.linalg.norm(xt, dim=1).numpy().astype(np.float64)
    n64 = np.sqrt((x.astype(np.float64) ** 2).sum(1))
    clip = lambda norms: (x.astype(np.float64) * np.minimum(1.0, tau / norms)[:, None]).mean(0)
    exact = clip(n64)
    print(f"centered-clipping norms: torch f32 rel.err {np.max(np.abs(n32 - n64) / n64):.2e}; "
          f"that alone moves the result by {rel(clip(n32), exact):.2e}; ours vs f64 exact: "
          f"{rel(ours(a.bin, 'aggregate', f'centered-clipping:tau={tau},iters=1', a.f, path, a.n)[0], exact):.2e}")

    # Krum definitions: recompute the paper score (n-f-2 nearest, sum) from exact distances.
    xd = x.astype(np.float64)
    sq = (xd * xd).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (xd @ xd.T), 0.0)
    srt = np.sort(d2, axis=1)
    paper = srt[:, 1 : a.n - a.f - 1].sum(1)
    byz_score = srt[:, 1 : a.n - a.f].mean(1)
    print(f"krum choice: paper score picks peer {int(np.argmin(paper))}, byzfl score picks peer {int(np.argmin(byz_score))}")

    # Converged geometric median on a smaller slice, where start points no longer matter.
    m = 200_000
    small = np.ascontiguousarray(x[:, :m])
    small_path = os.path.join(tmp, "small.f32")
    small.tofile(small_path)
    ref = GeometricMedian(nu=0.1, T=200)(torch.from_numpy(small)).numpy()
    mine, _ = ours(a.bin, "aggregate", "geometric-median:nu=0.1,iters=200,tol=0", a.f, small_path, a.n)
    print(f"geometric-median converged (T=200, len={m}): rel.err {rel(mine, ref):.2e}")

    honest = np.ascontiguousarray(x[a.f :])
    honest_path = os.path.join(tmp, "honest.f32")
    honest.tofile(honest_path)
    h = torch.from_numpy(honest)
    for name, byz, spec in [
        ("attack sign-flip", SignFlipping(), "sign-flip"),
        ("attack ipm eps=0.1", InnerProductManipulation(tau=0.1), "ipm:0.1"),
    ]:
        ref = byz(h).numpy()
        mine, _ = ours(a.bin, "attack", spec, a.f, honest_path, a.n - a.f)
        print(f"{name:20s} rel.err {rel(mine, ref):9.2e}")
    # ALIE: byzfl uses mean + tau*std with a fixed tau; ours mean - z*std with z from (n, f).
    from statistics import NormalDist
    s = a.n // 2 + 1 - a.f
    z = NormalDist().inv_cdf((a.n - s) / a.n)
    ref = ALittleIsEnough(tau=-z)(h).numpy()
    mine, _ = ours(a.bin, "attack", "alie", a.f, honest_path, a.n - a.f)
    print(f"{'attack alie z=%.4f' % z:20s} rel.err {rel(mine, ref):9.2e}  (byzfl tau=-z)")
    for fn in os.listdir(tmp):
        os.remove(os.path.join(tmp, fn))
    os.rmdir(tmp)


if __name__ == "__main__":
    sys.exit(main())
