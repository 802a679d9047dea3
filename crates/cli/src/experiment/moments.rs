//! What `experiment diloco`'s replicas do with their AdamW moments when a round ends
//! (`--moments`): nodes keep their own; the other choices measure what sharing them would win.

use anyhow::Result;
use clap::ValueEnum;
use neuroshard_model::{AdamW, Trainer};
use neuroshard_node::replica::Diloco;
use serde::Serialize;

/// What the replicas do with their AdamW moments when a round ends.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Moments {
    /// Each keeps its own (what nodes do).
    Keep,
    /// Each takes the replicas' mean of both moments (three times a dense offer's bytes).
    Average,
    /// Each takes the replicas' mean first moment and keeps its own second.
    AverageFirst,
    /// Each takes the replicas' mean second moment and keeps its own first.
    AverageSecond,
    /// As `average-second`, but each matrix's second moment travels as Adafactor's factors
    /// (its row and column sums, rows + cols values instead of rows × cols): each replica
    /// takes the outer product of the replicas' mean factors over their mean total.
    AverageSecondFactored,
    /// Each zeroes its first moment, so its next steps do not carry on along its own last
    /// round's batches; free of traffic.
    ZeroFirst,
}

/// Applies `how` to the honest replicas' AdamW moments at the end of a round.
pub(super) fn share_moments(replicas: &mut [(Trainer, Diloco)], how: Moments) -> Result<()> {
    let (first, second) = match how {
        Moments::Keep => return Ok(()),
        Moments::Average => (
            Some(mean_moment(replicas, 0)?),
            Some(mean_moment(replicas, 1)?),
        ),
        Moments::AverageFirst => (Some(mean_moment(replicas, 0)?), None),
        Moments::AverageSecond => (None, Some(mean_moment(replicas, 1)?)),
        Moments::AverageSecondFactored => (None, Some(mean_factored_second(replicas)?)),
        Moments::ZeroFirst => {
            let (m, _) = replicas[0].0.optimizer.moments();
            (Some(m.iter().map(|x| vec![0.0; x.len()]).collect()), None)
        }
    };
    for (t, _) in replicas.iter_mut() {
        let (m, v) = t.optimizer.moments();
        let m = first.clone().unwrap_or_else(|| m.to_vec());
        let v = second.clone().unwrap_or_else(|| v.to_vec());
        let (config, step) = (t.optimizer.config.clone(), t.optimizer.step_count());
        t.optimizer = AdamW::from_state(config, t.stage.params(), step, m, v)?;
    }
    Ok(())
}

/// Tensor `k` of every replica's first (`which` 0) or second (1) AdamW moment.
fn moment_tensors(replicas: &[(Trainer, Diloco)], which: usize, k: usize) -> Vec<&[f32]> {
    replicas
        .iter()
        .map(|(t, _)| {
            let (m, v) = t.optimizer.moments();
            if which == 0 { &m[k][..] } else { &v[k][..] }
        })
        .collect()
}

/// The replicas' mean of their first (`which` 0) or second (1) AdamW moment.
fn mean_moment(replicas: &[(Trainer, Diloco)], which: usize) -> Result<Vec<Vec<f32>>> {
    let tensors = replicas[0].0.optimizer.moments().0.len();
    (0..tensors)
        .map(|k| {
            Ok(neuroshard_aggregate::mean(&moment_tensors(
                replicas, which, k,
            ))?)
        })
        .collect()
}

/// The replicas' second moments, each matrix through the mean of its row and column sums
/// (Adafactor's rank-one estimate); vectors as their plain mean.
fn mean_factored_second(replicas: &[(Trainer, Diloco)]) -> Result<Vec<Vec<f32>>> {
    let specs = replicas[0].0.stage.params().specs();
    specs
        .iter()
        .enumerate()
        .map(|(k, spec)| {
            let vs = moment_tensors(replicas, 1, k);
            Ok(match spec.shape[..] {
                [_, cols] => rank_one_mean(cols, &vs),
                _ => neuroshard_aggregate::mean(&vs)?,
            })
        })
        .collect()
}

/// V ≈ r·cᵀ / Σr from the mean row sums r and column sums c of row-major matrices `vs` of
/// `cols` columns: exact when every V is the same rank-one matrix.
fn rank_one_mean(cols: usize, vs: &[&[f32]]) -> Vec<f32> {
    let rows = vs.first().map_or(0, |v| v.len() / cols.max(1));
    let n = vs.len() as f64;
    let (mut r, mut c) = (vec![0f64; rows], vec![0f64; cols]);
    for v in vs {
        for (row, ri) in v.chunks(cols).zip(r.iter_mut()) {
            for (&x, cj) in row.iter().zip(c.iter_mut()) {
                *ri += f64::from(x) / n;
                *cj += f64::from(x) / n;
            }
        }
    }
    let total = r.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    r.iter()
        .flat_map(|ri| c.iter().map(move |cj| (ri * cj / total) as f32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::rank_one_mean;

    #[test]
    fn a_shared_rank_one_second_moment_survives_its_factors() {
        // V = r·cᵀ with r = (1, 2, 3), c = (4, 5): the same on both replicas.
        let v: Vec<f32> = [1.0f32, 2.0, 3.0]
            .iter()
            .flat_map(|r| [4.0f32, 5.0].map(|c| r * c))
            .collect();
        let got = rank_one_mean(2, &[&v, &v]);
        for (g, w) in got.iter().zip(&v) {
            assert!((g - w).abs() < 1e-5, "{got:?} against {v:?}");
        }
    }

    #[test]
    fn factors_average_the_replicas_and_keep_the_total() {
        let a = [1.0f32, 0.0, 0.0, 1.0];
        let b = [3.0f32, 0.0, 0.0, 3.0];
        let got = rank_one_mean(2, &[&a, &b]);
        // Mean row and column sums (2, 2), total 4 (the mean matrix's): every entry 1.
        assert_eq!(got, vec![1.0; 4]);
    }
}
