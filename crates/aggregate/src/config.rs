//! Aggregator selection from a spec string such as `trimmed-mean:beta=0.1` or
//! `centered-clipping:tau=auto,iters=3`.

use std::fmt;

use thiserror::Error;

use crate::{AggregateError, CenteredClipping, GeometricMedian, coord, krum, weiszfeld};

#[derive(Debug, Clone, PartialEq, Error)]
pub enum ParseError {
    #[error(
        "unknown aggregator {0:?} (expected mean, trimmed-mean, clipped-mean, median, krum, multi-krum, geometric-median or centered-clipping)"
    )]
    Unknown(String),
    #[error("aggregator {aggregator} has no parameter {key:?}")]
    UnknownParameter {
        aggregator: &'static str,
        key: String,
    },
    #[error("parameter {key} has invalid value {value:?}")]
    BadValue { key: String, value: String },
    #[error("parameter {0:?} is not of the form key=value")]
    NotKeyValue(String),
}

/// A configured aggregation rule. `f` is the declared number of Byzantine inputs.
#[derive(Debug, Clone, PartialEq)]
pub enum Aggregator {
    Mean,
    TrimmedMean {
        beta: f64,
        f: usize,
    },
    /// Every value clamped to its coordinate's median ± c·s (s: the spread of the ranks the f
    /// extremes cannot reach), then all averaged.
    ClippedMean {
        c: f64,
        f: usize,
    },
    Median,
    Krum {
        f: usize,
    },
    /// `m = None` selects n − f inputs.
    MultiKrum {
        f: usize,
        m: Option<usize>,
    },
    GeometricMedian(GeometricMedian),
    CenteredClipping(CenteredClipping),
}

/// The clipped mean's band in units of r's spread (`coord::clipped_mean`): at 3 one sign-
/// flipping liar among four replicas cost the bench's tiny model +5.0%, at 2 +2.6% (the
/// trimmed mean +1.1%); on real text 2 won back 0.47 and 0.22 points (two seeds) of the
/// trimmed mean's loss at four replicas, 3 won 0.72 (one seed).
pub const DEFAULT_CLIP_WIDTH: f64 = 2.0;

fn value<T: std::str::FromStr>(key: &str, raw: &str) -> Result<T, ParseError> {
    raw.parse().map_err(|_| ParseError::BadValue {
        key: key.to_string(),
        value: raw.to_string(),
    })
}

impl Aggregator {
    /// Parses `name[:key=value,...]`; `f` is the declared Byzantine count unless the spec sets it.
    pub fn parse(spec: &str, f: usize) -> Result<Self, ParseError> {
        let (name, params) = spec.split_once(':').unwrap_or((spec, ""));
        let mut agg = match name.trim() {
            "mean" => Self::Mean,
            "trimmed-mean" => Self::TrimmedMean { beta: 0.0, f },
            "clipped-mean" => Self::ClippedMean {
                c: DEFAULT_CLIP_WIDTH,
                f,
            },
            "median" => Self::Median,
            "krum" => Self::Krum { f },
            "multi-krum" => Self::MultiKrum { f, m: None },
            "geometric-median" => Self::GeometricMedian(GeometricMedian::default()),
            "centered-clipping" => Self::CenteredClipping(CenteredClipping::default()),
            other => return Err(ParseError::Unknown(other.to_string())),
        };
        for pair in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, raw) = pair
                .split_once('=')
                .ok_or_else(|| ParseError::NotKeyValue(pair.to_string()))?;
            agg.set(key.trim(), raw.trim())?;
        }
        Ok(agg)
    }

    fn set(&mut self, key: &str, raw: &str) -> Result<(), ParseError> {
        let aggregator = self.name();
        if key == "f"
            && let Some(f) = self.byzantine_mut()
        {
            *f = value(key, raw)?;
            return Ok(());
        }
        match (self, key) {
            (Self::TrimmedMean { beta, .. }, "beta") => *beta = value(key, raw)?,
            (Self::ClippedMean { c, .. }, "c") => {
                // Checked here too, so a network whose spec would fail every round never starts.
                let width: f64 = value(key, raw)?;
                if !(width.is_finite() && width > 0.0) {
                    return Err(ParseError::BadValue {
                        key: key.to_string(),
                        value: raw.to_string(),
                    });
                }
                *c = width;
            }
            (Self::MultiKrum { m, .. }, "m") => *m = Some(value(key, raw)?),
            (Self::GeometricMedian(g), "nu") => g.nu = value(key, raw)?,
            (Self::GeometricMedian(g), "iters") => g.max_iter = value(key, raw)?,
            (Self::GeometricMedian(g), "tol") => g.tol = value(key, raw)?,
            (Self::CenteredClipping(c), "tau") => {
                c.tau = if raw == "auto" {
                    None
                } else {
                    Some(value(key, raw)?)
                }
            }
            (Self::CenteredClipping(c), "iters") => c.iters = value(key, raw)?,
            _ => {
                return Err(ParseError::UnknownParameter {
                    aggregator,
                    key: key.to_string(),
                });
            }
        }
        Ok(())
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::TrimmedMean { .. } => "trimmed-mean",
            Self::ClippedMean { .. } => "clipped-mean",
            Self::Median => "median",
            Self::Krum { .. } => "krum",
            Self::MultiKrum { .. } => "multi-krum",
            Self::GeometricMedian(_) => "geometric-median",
            Self::CenteredClipping(_) => "centered-clipping",
        }
    }

    /// Aggregates the inputs. `reference` is the centre for centered clipping (e.g. the previous
    /// aggregate); the other rules ignore it.
    pub fn aggregate<V: AsRef<[f32]> + Sync>(
        &self,
        inputs: &[V],
        reference: Option<&[f32]>,
    ) -> Result<Vec<f32>, AggregateError> {
        match self {
            Self::Mean => coord::mean(inputs),
            Self::TrimmedMean { beta, f } => coord::trimmed_mean(inputs, *beta, *f),
            Self::ClippedMean { c, f } => coord::clipped_mean(inputs, *c, *f),
            Self::Median => coord::median(inputs),
            Self::Krum { f } => krum::krum(inputs, *f),
            Self::MultiKrum { f, m } => {
                krum::multi_krum(inputs, *f, m.unwrap_or(inputs.len().saturating_sub(*f)))
            }
            Self::GeometricMedian(g) => weiszfeld::geometric_median(inputs, g),
            Self::CenteredClipping(c) => weiszfeld::centered_clipping(inputs, reference, c),
        }
    }
}

impl fmt::Display for Aggregator {
    /// Writes a spec that [`Aggregator::parse`] reads back to the same value.
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(out, "{}", self.name())?;
        match self {
            Self::Mean | Self::Median => Ok(()),
            Self::TrimmedMean { beta, f } => write!(out, ":beta={beta},f={f}"),
            Self::ClippedMean { c, f } => write!(out, ":c={c},f={f}"),
            Self::Krum { f } => write!(out, ":f={f}"),
            Self::MultiKrum { f, m: None } => write!(out, ":f={f}"),
            Self::MultiKrum { f, m: Some(m) } => write!(out, ":f={f},m={m}"),
            Self::GeometricMedian(g) => {
                write!(out, ":nu={},iters={},tol={}", g.nu, g.max_iter, g.tol)
            }
            Self::CenteredClipping(c) => match c.tau {
                Some(tau) => write!(out, ":tau={tau},iters={}", c.iters),
                None => write!(out, ":tau=auto,iters={}", c.iters),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_name_and_round_trips() {
        for spec in [
            "mean",
            "trimmed-mean:beta=0.2",
            "clipped-mean:c=1.5",
            "median",
            "krum",
            "multi-krum:m=5",
            "geometric-median:nu=0.1,iters=3",
            "centered-clipping:tau=2.5,iters=1",
            "centered-clipping",
        ] {
            let agg = Aggregator::parse(spec, 2).unwrap();
            assert_eq!(
                Aggregator::parse(&agg.to_string(), 0).unwrap(),
                agg,
                "{spec}"
            );
        }
        assert_eq!(
            Aggregator::parse("krum", 3).unwrap(),
            Aggregator::Krum { f: 3 }
        );
        assert_eq!(
            Aggregator::parse("trimmed-mean:f=1", 3).unwrap(),
            Aggregator::TrimmedMean { beta: 0.0, f: 1 }
        );
    }

    #[test]
    fn rejects_bad_specs() {
        assert!(matches!(
            Aggregator::parse("average", 0),
            Err(ParseError::Unknown(_))
        ));
        assert!(matches!(
            Aggregator::parse("median:f=1", 0),
            Err(ParseError::UnknownParameter { .. })
        ));
        assert!(matches!(
            Aggregator::parse("krum:f=x", 0),
            Err(ParseError::BadValue { .. })
        ));
        assert!(matches!(
            Aggregator::parse("krum:f", 0),
            Err(ParseError::NotKeyValue(_))
        ));
        for width in ["0", "-1", "inf", "NaN"] {
            assert!(matches!(
                Aggregator::parse(&format!("clipped-mean:c={width}"), 0),
                Err(ParseError::BadValue { .. })
            ));
        }
    }

    #[test]
    fn aggregate_dispatches() {
        let v: Vec<Vec<f32>> = (0..7).map(|i| vec![i as f32]).collect();
        let agg = |s: &str| {
            Aggregator::parse(s, 2)
                .unwrap()
                .aggregate(&v, None)
                .unwrap()
        };
        assert_eq!(agg("mean"), vec![3.0]);
        assert_eq!(agg("median"), vec![3.0]);
        assert_eq!(agg("trimmed-mean"), vec![3.0]);
        assert_eq!(agg("clipped-mean:c=100"), vec![3.0]);
        // Krum (3 neighbours): peers 1..=5 tie at score 1 + 1 + 4 = 6; the lowest index wins.
        assert_eq!(agg("krum"), vec![1.0]);
        assert_eq!(agg("multi-krum:m=3"), vec![2.0]);
        assert_eq!(agg("multi-krum"), vec![3.0]);
    }
}
