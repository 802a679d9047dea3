//! Norm bounds on the tensors peers send a stage: forward activations and output gradients.
//!
//! The codec already refuses non-finite values and values beyond its magnitude limit, but a
//! tensor scaled by 10⁴ passes both. Trained in, an output gradient that large inflates
//! AdamW's second moment, so the stage's steps shrink by that factor until the moment decays
//! (hundreds of steps at β₂ = 0.95), and the stage sends the scaled gradient on to every stage
//! before it. So each kind keeps, per sender, the norms of the last [`PER_SENDER`] tensors it
//! took from it; a tensor above its clip bound is scaled down to it (an honest spike still
//! trains, as gradient clipping would let it), and one above its refusal bound is refused
//! and its sender penalised.
//!
//! A tensor is scaled down above [`CLIP`] × the upper median of the *other* senders' medians,
//! each sender counted once (all senders', its own included, while the others hold fewer
//! than [`MIN_SAMPLES`] norms; no bound before that), and refused above [`REFUSE`] × the upper
//! median of every sender's median, its own included. Judged by its own tensors, a sender
//! would walk its clip bound up, each tensor just under it raising it for the next; with
//! every tensor counted, a sender whose share of the routing is most of a stage's traffic
//! decided everyone's reference, up or down (tiny tensors, after which honest ones were
//! refused); and refused by its co-senders' medians alone, an honest sender of a stage fed
//! by two replicas was refused and penalised once the other sent tiny tensors.

use std::collections::{BTreeMap, VecDeque};

use neuroshard_proof::NodeId;

/// Norms remembered per sender and kind.
pub const PER_SENDER: usize = 16;
/// Senders remembered per kind; the one heard from least recently makes room (only keys
/// registered for a neighbouring stage reach this, each with stake).
pub const MAX_SENDERS: usize = 64;
/// Tensors taken on trust before the bounds apply.
pub const MIN_SAMPLES: usize = 4;
/// Above this many times the median norm a tensor is scaled down to it.
pub const CLIP: f64 = 8.0;
/// Above this many times the median norm a tensor is refused.
pub const REFUSE: f64 = 64.0;

/// A tensor far above the norms of those before it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{kind} norm {norm:.3e} is over {REFUSE}× the median of its senders' recent ones ({median:.3e})"
)]
pub struct NormOutlier {
    pub kind: &'static str,
    pub norm: f64,
    pub median: f64,
}

/// What [`NormWindow::admit`] did to a tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admitted {
    Within,
    /// Scaled down from `norm` to `bound`.
    Clipped {
        norm: f64,
        bound: f64,
    },
}

/// The recent norms of one kind of tensor a stage takes, per sender.
#[derive(Debug)]
pub struct NormWindow {
    kind: &'static str,
    /// Each sender's last norms and when it was last heard (a counter).
    senders: BTreeMap<NodeId, (VecDeque<f64>, u64)>,
    heard: u64,
}

fn l2(data: &[f32]) -> f64 {
    data.iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt()
}

impl NormWindow {
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            senders: BTreeMap::new(),
            heard: 0,
        }
    }

    /// The upper median of every sender's median norm, once they hold [`MIN_SAMPLES`] norms.
    pub fn median(&self) -> Option<f64> {
        self.reference(|_| true)
    }

    /// The reference a tensor from `from` is judged by: the upper median of the other
    /// senders' medians once they hold enough norms, otherwise (a stage fed by one replica,
    /// or early) of all senders'.
    pub fn median_for(&self, from: NodeId) -> Option<f64> {
        self.reference(|s| *s != from).or_else(|| self.median())
    }

    fn reference(&self, counts: impl Fn(&NodeId) -> bool) -> Option<f64> {
        let mut held = 0usize;
        let medians: Vec<f64> = self
            .senders
            .iter()
            .filter(|(s, _)| counts(s))
            .filter_map(|(_, (norms, _))| {
                held += norms.len();
                upper_median(norms.iter().copied())
            })
            .collect();
        if held < MIN_SAMPLES {
            return None;
        }
        upper_median(medians.into_iter())
    }

    /// Judges a finite tensor from `from` against the window without changing it: refused
    /// above the refusal bound, otherwise the norm it will have once [`Judged::apply`]
    /// scaled it.
    pub fn judge(&self, from: NodeId, data: &[f32]) -> Result<Judged, NormOutlier> {
        let norm = l2(data);
        let Some(median) = self.median() else {
            return Ok(Judged {
                norm,
                bound: None,
                kept: norm,
            });
        };
        let others = self.reference(|s| *s != from).unwrap_or(median);
        // Refusal (and the sender's penalty) is judged by every sender's median, its own
        // included: judged by its one co-sender alone, an honest sender of a stage fed by two
        // replicas had its tensors refused once the other sent tiny ones, was penalised, and
        // its driver stalled (the real-process lazy-worker swarm did, one run in five). Its
        // own median never raises its clip bound while others sent enough.
        if norm > REFUSE * median {
            return Err(NormOutlier {
                kind: self.kind,
                norm,
                median,
            });
        }
        let bound = CLIP * others;
        Ok(Judged {
            norm,
            bound: (norm > bound).then_some(bound),
            // At most the bound of every sender's median, its own included: a co-sender's
            // small tensors, which set this tensor's clip bound, do not drag the sender's own
            // median down, and a sender judged by its own history (the only one, or early)
            // raises it no faster than the bound.
            kept: norm.min(CLIP * median),
        })
    }

    /// Remembers a judged tensor the stage took. Only taken tensors count: one refused for
    /// another reason, answered busy or repeated would otherwise let a sender pull the median
    /// down at no cost, and every honest tensor would then be refused.
    pub fn remember(&mut self, from: NodeId, judged: &Judged) {
        self.heard += 1;
        if !self.senders.contains_key(&from) && self.senders.len() >= MAX_SENDERS {
            let stalest = self.senders.iter().min_by_key(|(_, (_, at))| *at);
            if let Some(stalest) = stalest.map(|(s, _)| *s) {
                self.senders.remove(&stalest);
            }
        }
        let (norms, at) = self
            .senders
            .entry(from)
            .or_insert_with(|| (VecDeque::with_capacity(PER_SENDER), 0));
        if norms.len() == PER_SENDER {
            norms.pop_front();
        }
        norms.push_back(judged.kept);
        *at = self.heard;
    }

    /// Judges, scales and remembers a tensor from `from` taken whatever else holds; a
    /// refused tensor leaves the window as it was.
    pub fn admit(&mut self, from: NodeId, data: &mut [f32]) -> Result<Admitted, NormOutlier> {
        let judged = self.judge(from, data)?;
        let admitted = judged.apply(data);
        self.remember(from, &judged);
        Ok(admitted)
    }
}

/// The median of `values`, the upper middle one of an even count (None for none).
fn upper_median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut sorted: Vec<f64> = values.collect();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied()
}

/// A tensor's norm against the window, before the stage takes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    norm: f64,
    /// The bound it is scaled down to, when it is above it.
    bound: Option<f64>,
    /// The norm the window remembers for it.
    kept: f64,
}

impl Judged {
    /// Scales `data` (the tensor judged) down to the bound when it is above it.
    pub fn apply(&self, data: &mut [f32]) -> Admitted {
        let Some(bound) = self.bound else {
            return Admitted::Within;
        };
        let scale = (bound / self.norm) as f32;
        for x in data.iter_mut() {
            *x *= scale;
        }
        Admitted::Clipped {
            norm: self.norm,
            bound,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The one sender of the tests that need no other.
    const P: NodeId = NodeId([1; 32]);
    const LIAR: NodeId = NodeId([6; 32]);
    const HONEST: [NodeId; 2] = [NodeId([2; 32]), NodeId([3; 32])];

    /// A window that took four tensors of norm 1 from each of `senders`.
    fn warmed(senders: &[NodeId]) -> NormWindow {
        let mut w = NormWindow::new("gradient");
        for h in senders {
            for _ in 0..4 {
                w.admit(*h, &mut tensor(1.0)).unwrap();
            }
        }
        w
    }

    fn tensor(norm: f32) -> Vec<f32> {
        // Four equal values: L2 norm = 2 × value.
        vec![norm / 2.0; 4]
    }

    #[test]
    fn the_first_tensors_set_the_reference_then_outliers_are_clipped_or_refused() {
        let mut w = NormWindow::new("gradient");
        for n in [1.0, 1.2, 0.8, 1.1] {
            assert_eq!(w.admit(P, &mut tensor(n)).unwrap(), Admitted::Within);
        }
        assert_eq!(w.admit(P, &mut tensor(7.0)).unwrap(), Admitted::Within);
        let mut big = tensor(20.0);
        let Admitted::Clipped { bound, .. } = w.admit(P, &mut big).unwrap() else {
            panic!("not clipped");
        };
        assert!((l2(&big) - bound).abs() < 1e-4 * bound);
        let before = w.senders.clone();
        let err = w.admit(P, &mut tensor(1e4)).unwrap_err();
        assert_eq!(err.kind, "gradient");
        assert_eq!(w.senders, before, "a refused tensor is not remembered");
    }

    #[test]
    fn a_minority_of_huge_tensors_does_not_move_the_median() {
        let mut w = NormWindow::new("activations");
        for _ in 0..8 {
            w.admit(P, &mut tensor(1.0)).unwrap();
        }
        for (i, n) in [1e6, 20.0, 9.0].iter().cycle().take(300).enumerate() {
            let mut huge = tensor(*n);
            if w.admit(P, &mut huge).is_ok() {
                assert!(l2(&huge) <= CLIP * 1.0 + 1e-3, "{i}: {}", l2(&huge));
            }
            for _ in 0..4 {
                assert_eq!(w.admit(P, &mut tensor(1.0)).unwrap(), Admitted::Within);
            }
        }
        assert!((w.median().unwrap() - 1.0).abs() < 1e-6);
    }

    /// One sender with most of a stage's traffic sends each tensor just under the bound of
    /// the median it is judged by. Judged by all tensors, its own raised that median for the
    /// next: within a few hundred tensors it was sending norms of 10⁹ and more, taken whole.
    /// Judged by the other senders' tensors, nothing it sends counts for more than the bound
    /// of theirs, and anything far above is refused.
    #[test]
    fn a_sender_with_most_of_the_traffic_cannot_walk_its_reference_up() {
        let (liar, honest) = (LIAR, HONEST);
        let mut w = warmed(&honest);
        let mut largest_taken = 0.0f64;
        for i in 0..400 {
            let reference = w.median_for(liar).unwrap_or(1.0) as f32;
            let mut t = tensor(reference * 0.99 * CLIP as f32);
            if w.admit(liar, &mut t).is_ok() {
                largest_taken = largest_taken.max(l2(&t));
            }
            if i % 3 == 0 {
                w.admit(honest[i % 2], &mut tensor(1.0)).unwrap();
            }
        }
        assert!(
            largest_taken <= CLIP * 1.0 + 1e-3,
            "took a norm of {largest_taken}"
        );
        // Its own tensors never set the honest senders' bound either.
        assert!(w.median_for(honest[0]).unwrap() <= CLIP + 1e-3);
        for h in honest {
            assert_eq!(w.admit(h, &mut tensor(1.0)), Ok(Admitted::Within));
        }
    }

    /// A stage fed by one replica judges it by its own history, so each tensor just under the
    /// bound raises the bound for the next: it can only be kept to the rate of [`CLIP`] per
    /// half a window. Remembered as they came, tensors between the clip and the refusal
    /// bounds (40× here) raised the median 40× at once.
    #[test]
    fn a_lone_sender_raises_its_own_reference_no_faster_than_the_clip_bound() {
        let mut w = warmed(&[P]);
        for _ in 0..8 {
            w.admit(P, &mut tensor(40.0)).unwrap();
        }
        assert!(w.median().unwrap() <= CLIP, "{:?}", w.median());
    }

    /// The same sender pulls the other way: tiny tensors (taken: nothing bounds a norm from
    /// below) at three times the honest senders' rate. Counted per tensor, they made the
    /// honest senders' reference tiny, and every honest tensor was then refused and its
    /// sender penalised. Each sender counted once, the liar is one of two co-senders of each
    /// honest one, and the upper median of two is the honest one's.
    #[test]
    fn a_sender_with_most_of_the_traffic_cannot_pull_honest_references_down() {
        let (liar, honest) = (LIAR, HONEST);
        let mut w = warmed(&honest);
        for i in 0..400 {
            w.admit(liar, &mut tensor(1e-6)).unwrap();
            if i % 3 == 0 {
                let h = honest[i % 2];
                let mut t = tensor(1.0);
                assert_eq!(w.admit(h, &mut t), Ok(Admitted::Within), "tensor {i}");
            }
        }
    }

    /// A stage fed by two replicas, one of them sending tiny tensors: the honest one's clip
    /// bound is the liar's (its only co-sender), so its tensors are scaled down, but refusal
    /// counts its own median too and none is refused or penalised. Refused by its co-sender's
    /// median alone, the honest driver of the real-process lazy-worker swarm stalled.
    #[test]
    fn one_of_two_senders_cannot_get_the_other_refused() {
        let (liar, honest) = (LIAR, HONEST[0]);
        let mut w = warmed(&[honest]);
        for i in 0..200 {
            w.admit(liar, &mut tensor(1e-6)).unwrap();
            if i % 3 == 0 {
                assert!(w.admit(honest, &mut tensor(1.0)).is_ok(), "tensor {i}");
            }
        }
    }

    proptest! {
        /// Whatever arrives, what is admitted is within CLIP × the median it was judged by.
        #[test]
        fn admitted_tensors_are_within_the_bound(norms in proptest::collection::vec(1e-3f32..1e6, 1..100)) {
            let mut w = NormWindow::new("x");
            for n in norms {
                let median = w.median();
                let mut t = tensor(n);
                if w.admit(P, &mut t).is_ok() && let Some(m) = median {
                    prop_assert!(l2(&t) <= CLIP * m * (1.0 + 1e-5));
                }
            }
        }
    }
}
