//! Attack models: what f Byzantine peers send, given the honest vectors (omniscient attacker).

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use thiserror::Error;

use crate::{CHUNK, coord};

#[derive(Debug, Clone, PartialEq, Error)]
pub enum AttackParseError {
    #[error(
        "unknown attack {0:?} (expected none, sign-flip, scale:K, gaussian[:SIGMA], alie, ipm[:EPS] or zeros)"
    )]
    Unknown(String),
    #[error("attack parameter {0:?} is not a finite number")]
    BadValue(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attack {
    None,
    /// −mean(honest).
    SignFlip,
    /// −k · mean(honest).
    Scale(f64),
    /// Independent N(0, σ²) per coordinate, a fresh draw for each Byzantine peer.
    Gaussian(f64),
    /// "A little is enough" (Baruch et al., 2019): mean − z·std per coordinate, z from n and f.
    Alie,
    /// Inner-product manipulation (Xie et al., 2020): −ε · mean(honest).
    Ipm(f64),
    Zeros,
}

/// Φ⁻¹(p) by Acklam's rational approximation (relative error below 1.2e-9).
pub fn inverse_normal_cdf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -39.696_830_286_653_76,
        220.946_098_424_520_5,
        -275.928_510_446_968_7,
        138.357_751_867_269,
        -30.664_798_066_147_16,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -54.476_098_798_224_06,
        161.585_836_858_040_9,
        -155.698_979_859_886_6,
        66.801_311_887_719_72,
        -13.280_681_552_885_72,
    ];
    const C: [f64; 6] = [
        -0.007_784_894_002_430_293,
        -0.322_396_458_041_136_4,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        0.007_784_695_709_041_462,
        0.322_467_129_070_039_8,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// ALIE's z for n peers of which f are Byzantine: s = ⌊n/2 + 1⌋ − f peers must be "won over",
/// z = Φ⁻¹((n − s) / n).
pub fn alie_z(n: usize, f: usize) -> f64 {
    let s = (n / 2 + 1).saturating_sub(f).max(1);
    inverse_normal_cdf(n.saturating_sub(s) as f64 / n.max(1) as f64)
}

fn scaled_mean<V: AsRef<[f32]> + Sync>(honest: &[V], k: f64) -> Vec<f32> {
    match coord::mean(honest) {
        Ok(m) => m.into_iter().map(|x| (f64::from(x) * k) as f32).collect(),
        // No honest vectors (or unusable ones): the attacker has nothing to mimic.
        Err(_) => Vec::new(),
    }
}

impl Attack {
    /// The f vectors the Byzantine peers send. Empty when f = 0 or there are no honest vectors.
    pub fn forge<V: AsRef<[f32]> + Sync, R: Rng>(
        &self,
        honest: &[V],
        f: usize,
        rng: &mut R,
    ) -> Vec<Vec<f32>> {
        let Some(len) = honest.first().map(|h| h.as_ref().len()) else {
            return Vec::new();
        };
        if f == 0 {
            return Vec::new();
        }
        let one = match *self {
            Self::None => return Vec::new(),
            Self::SignFlip => scaled_mean(honest, -1.0),
            Self::Scale(k) => scaled_mean(honest, -k),
            Self::Ipm(eps) => scaled_mean(honest, -eps),
            Self::Zeros => vec![0.0; len],
            Self::Alie => alie(honest, alie_z(honest.len() + f, f)),
            Self::Gaussian(sigma) => {
                let Ok(normal) = Normal::new(0.0f32, sigma as f32) else {
                    return Vec::new();
                };
                return (0..f)
                    .map(|_| (0..len).map(|_| normal.sample(rng)).collect())
                    .collect();
            }
        };
        vec![one; f]
    }
}

/// mean − z·std per coordinate (sample std over the honest vectors).
fn alie<V: AsRef<[f32]> + Sync>(honest: &[V], z: f64) -> Vec<f32> {
    let len = honest[0].as_ref().len();
    let h = honest.len() as f64;
    let mut out = vec![0.0f32; len];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let start = c * CHUNK;
        for (j, o) in out.iter_mut().enumerate() {
            let values = honest.iter().map(|v| f64::from(v.as_ref()[start + j]));
            let mean = values.clone().sum::<f64>() / h;
            let var = if h > 1.0 {
                values.map(|x| (x - mean).powi(2)).sum::<f64>() / (h - 1.0)
            } else {
                0.0
            };
            *o = (mean - z * var.sqrt()) as f32;
        }
    });
    out
}

impl FromStr for Attack {
    type Err = AttackParseError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let (name, param) = spec
            .split_once(':')
            .map_or((spec, None), |(n, p)| (n, Some(p)));
        let num = |default: f64| -> Result<f64, AttackParseError> {
            match param {
                None => Ok(default),
                Some(p) => p
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| AttackParseError::BadValue(p.to_string())),
            }
        };
        Ok(match name.trim() {
            "none" => Self::None,
            "sign-flip" => Self::SignFlip,
            "scale" => Self::Scale(num(10.0)?),
            "gaussian" => Self::Gaussian(num(1.0)?),
            "alie" => Self::Alie,
            "ipm" => Self::Ipm(num(0.1)?),
            "zeros" => Self::Zeros,
            other => return Err(AttackParseError::Unknown(other.to_string())),
        })
    }
}

impl fmt::Display for Attack {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => write!(out, "none"),
            Self::SignFlip => write!(out, "sign-flip"),
            Self::Scale(k) => write!(out, "scale:{k}"),
            Self::Gaussian(s) => write!(out, "gaussian:{s}"),
            Self::Alie => write!(out, "alie"),
            Self::Ipm(e) => write!(out, "ipm:{e}"),
            Self::Zeros => write!(out, "zeros"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn inverse_cdf_known_values() {
        assert!(inverse_normal_cdf(0.5).abs() < 1e-9);
        assert!((inverse_normal_cdf(0.975) - 1.959_963_985).abs() < 1e-6);
        assert!((inverse_normal_cdf(0.01) + 2.326_347_874).abs() < 1e-6);
        // n = 8, f = 2: s = 5 - 2 = 3, z = Φ⁻¹(5/8) ≈ 0.318639.
        assert!((alie_z(8, 2) - 0.318_639_364).abs() < 1e-6);
    }

    #[test]
    fn forged_vectors() {
        let honest = vec![vec![1.0f32, 2.0], vec![3.0, 2.0]];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        assert_eq!(
            Attack::SignFlip.forge(&honest, 2, &mut rng),
            vec![vec![-2.0, -2.0]; 2]
        );
        assert_eq!(
            Attack::Scale(4.0).forge(&honest, 1, &mut rng),
            vec![vec![-8.0, -8.0]]
        );
        assert_eq!(
            Attack::Ipm(0.5).forge(&honest, 1, &mut rng),
            vec![vec![-1.0, -1.0]]
        );
        assert_eq!(
            Attack::Zeros.forge(&honest, 1, &mut rng),
            vec![vec![0.0, 0.0]]
        );
        assert!(Attack::None.forge(&honest, 3, &mut rng).is_empty());
        // std of {1, 3} is √2, z = alie_z(3, 1) = Φ⁻¹(1/3).
        let z = alie_z(3, 1);
        let alie = Attack::Alie.forge(&honest, 1, &mut rng);
        assert!((f64::from(alie[0][0]) - (2.0 - z * 2f64.sqrt())).abs() < 1e-5);
        assert_eq!(alie[0][1], 2.0);
        let g = Attack::Gaussian(1.0).forge(&honest, 2, &mut rng);
        assert_eq!(g.len(), 2);
        assert_ne!(g[0], g[1]);
        let again = Attack::Gaussian(1.0).forge(&honest, 2, &mut ChaCha8Rng::seed_from_u64(1));
        assert_eq!(
            again,
            Attack::Gaussian(1.0).forge(&honest, 2, &mut ChaCha8Rng::seed_from_u64(1))
        );
    }

    #[test]
    fn parse_round_trip() {
        for s in [
            "none",
            "sign-flip",
            "scale:4",
            "gaussian:0.5",
            "alie",
            "ipm:0.1",
            "zeros",
        ] {
            let a: Attack = s.parse().unwrap();
            assert_eq!(a.to_string().parse::<Attack>().unwrap(), a);
        }
        assert!("ipm:x".parse::<Attack>().is_err());
        assert!("flip".parse::<Attack>().is_err());
    }
}
