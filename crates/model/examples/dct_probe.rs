//! Throwaway: energy of a DiLoCo pseudo-gradient captured by top-1% per 4096-chunk, raw vs DCT.
use neuroshard_model::{AdamWConfig, Batch, ModelConfig, Trainer};

fn dct_matrix(n: usize) -> Vec<f64> {
    let mut m = vec![0.0; n * n];
    for k in 0..n {
        let s = if k == 0 {
            (1.0 / n as f64).sqrt()
        } else {
            (2.0 / n as f64).sqrt()
        };
        for i in 0..n {
            m[k * n + i] =
                s * (std::f64::consts::PI / n as f64 * (i as f64 + 0.5) * k as f64).cos();
        }
    }
    m
}

fn topk_energy(v: &[f64], frac: f64, chunk: usize) -> f64 {
    let total: f64 = v.iter().map(|x| x * x).sum();
    let mut kept = 0.0;
    for c in v.chunks(chunk) {
        let mut e: Vec<f64> = c.iter().map(|x| x * x).collect();
        e.sort_by(|a, b| b.total_cmp(a));
        let k = ((c.len() as f64 * frac).ceil() as usize).max(1);
        kept += e[..k].iter().sum::<f64>();
    }
    kept / total
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bytes = std::fs::read("runs/diloco/genesis-synthetic/train-00000.bin")?;
    let toks: Vec<u32> = bytes[32..]
        .chunks(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
        .collect();
    let config = ModelConfig {
        layers: 2,
        d_model: 64,
        heads: 4,
        kv_heads: 4,
        ffn: 176,
        vocab: 745,
        max_seq: 64,
        ..ModelConfig::tiny(745)
    };
    let optim = AdamWConfig {
        lr: 2e-3,
        warmup_steps: 20,
        total_steps: 2000,
        ..Default::default()
    };
    let mut t = Trainer::new(config, optim, 0)?;
    let mut pos = 0usize;
    let mut batch = |pos: &mut usize| {
        let w: Vec<Vec<u32>> = (0..8)
            .map(|_| {
                let s = *pos;
                *pos += 65;
                toks[s..s + 65].to_vec()
            })
            .collect();
        Batch::from_windows(&w, 64).unwrap()
    };
    for phase in 0..4 {
        for _ in 0..[20, 80, 200, 400][phase] {
            t.step(&batch(&mut pos))?;
        }
        let theta0 = t.stage.params().flatten();
        for _ in 0..10 {
            t.step(&batch(&mut pos))?;
        }
        let theta = t.stage.params().flatten();
        let delta: Vec<f64> = theta0
            .iter()
            .zip(&theta)
            .map(|(a, b)| f64::from(a - b))
            .collect();
        let raw = topk_energy(&delta, 0.01, 4096);
        for n in [16usize, 64, 256] {
            let m = dct_matrix(n);
            let mut coef = vec![0.0; delta.len()];
            for (ci, c) in delta.chunks(n).enumerate() {
                if c.len() < n {
                    coef[ci * n..ci * n + c.len()].copy_from_slice(c);
                    continue;
                }
                for k in 0..n {
                    coef[ci * n + k] = (0..n).map(|i| m[k * n + i] * c[i]).sum();
                }
            }
            println!(
                "phase {phase} len {} raw top1% {:.4}  dct{n} top1% {:.4}",
                delta.len(),
                raw,
                topk_energy(&coef, 0.01, 4096)
            );
        }
    }
    Ok(())
}
