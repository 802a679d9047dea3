//! The challenge sampler: which jobs of a finished round are replayed, and by whom.
//!
//! Every input is public and fixed before the seed exists: the seed is the hash of a
//! finalized ledger epoch (the beacon) that came after the commitment it picks among was
//! signed, which no single node chooses and every node holds. So every node computes the same
//! picks, a worker cannot know in advance which of its jobs will be checked, and nobody
//! chooses its own auditor or target.

use std::collections::BTreeSet;

use neuroshard_proof::{Hash32, NodeId};

use crate::commit::JobKey;

/// Fraction of jobs replayed, in parts per million.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditRate {
    pub per_million: u32,
}

impl Default for AuditRate {
    /// 5%: an audited job costs one replay of the same cost as the job, so replay work is
    /// about 5% of training compute, half the 10% budget (the rest covers fetching inputs and
    /// weights and the occasional escalation). A worker that cheats on k jobs of a round
    /// escapes with probability 0.95^k: 0.36 for k = 20, under 10⁻⁴ for k = 200.
    fn default() -> Self {
        Self {
            per_million: 50_000,
        }
    }
}

impl AuditRate {
    /// Replay work as a fraction of training compute, for a replay that costs what the job did.
    pub fn replay_share(&self) -> f64 {
        self.per_million.min(1_000_000) as f64 / 1e6
    }

    /// Probability that at least one of `cheated` independent jobs is picked.
    pub fn detection_probability(&self, cheated: u32) -> f64 {
        1.0 - (1.0 - self.replay_share()).powi(cheated.min(i32::MAX as u32) as i32)
    }
}

/// The seed of one stage's audits of one round's jobs that name one beacon epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChallengeSeed(pub Hash32);

impl ChallengeSeed {
    /// From the beacon (the hash of the finalized epoch the jobs' commitments name), bound to
    /// the network, stage and round so one beacon never seeds two stages' picks alike.
    pub fn from_beacon(network: Hash32, stage: u16, round: u64, beacon: Hash32) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"neuroshard/audit/seed");
        h.update(&network);
        h.update(&stage.to_le_bytes());
        h.update(&round.to_le_bytes());
        h.update(&beacon);
        Self(*h.finalize().as_bytes())
    }

    fn draw(&self, purpose: &[u8], job: &JobKey) -> u64 {
        let mut h = blake3::Hasher::new();
        h.update(purpose);
        h.update(&self.0);
        h.update(&job.0);
        let b = h.finalize();
        u64::from_le_bytes(b.as_bytes()[..8].try_into().unwrap_or([0; 8]))
    }
}

/// Whether `job` is audited: an independent draw per job, so a checker needs only the one job.
pub fn is_challenged(seed: &ChallengeSeed, job: &JobKey, rate: AuditRate) -> bool {
    let draw = seed.draw(b"neuroshard/audit/pick", job);
    // draw / 2^64 < rate / 10^6, in integers.
    (draw as u128) * 1_000_000 < (rate.per_million.min(1_000_000) as u128) << 64
}

/// The auditor of `job`: one of the stage's registered validators, never the worker. The
/// list is taken as a set (order and repeats do not matter, so a Sybil gains nothing by
/// appearing twice); None when no one but the worker is registered.
pub fn auditor_for(
    seed: &ChallengeSeed,
    job: &JobKey,
    worker: NodeId,
    validators: &[NodeId],
) -> Option<NodeId> {
    let eligible: Vec<NodeId> = validators
        .iter()
        .copied()
        .filter(|v| *v != worker)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if eligible.is_empty() {
        return None;
    }
    // Multiply-shift: uniform up to 2^-64 bias, no modulo.
    let draw = seed.draw(b"neuroshard/audit/auditor", job) as u128;
    let index = (draw * eligible.len() as u128) >> 64;
    eligible.get(index as usize).copied()
}

/// One audit: replay `job` of `worker`, done by `auditor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Challenge {
    pub job: JobKey,
    pub worker: NodeId,
    pub auditor: NodeId,
}

/// Every audit of a round: the jobs (key and worker, in any order) the stage committed, and
/// the validators registered for the stage. Sorted by job key, so every node lists them alike.
pub fn sample(
    seed: &ChallengeSeed,
    jobs: &[(JobKey, NodeId)],
    validators: &[NodeId],
    rate: AuditRate,
) -> Vec<Challenge> {
    let jobs: BTreeSet<(JobKey, NodeId)> = jobs.iter().copied().collect();
    jobs.into_iter()
        .filter(|(job, _)| is_challenged(seed, job, rate))
        .filter_map(|(job, worker)| {
            auditor_for(seed, &job, worker, validators).map(|auditor| Challenge {
                job,
                worker,
                auditor,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> JobKey {
        JobKey(*blake3::hash(&i.to_le_bytes()).as_bytes())
    }

    fn node(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    fn seed(i: u64) -> ChallengeSeed {
        ChallengeSeed::from_beacon([0; 32], 1, i, [7; 32])
    }

    #[test]
    fn the_default_rate_keeps_replay_within_a_tenth_of_training() {
        let rate = AuditRate::default();
        assert!(rate.replay_share() <= 0.10);
        let n = 20_000u64;
        let picked = (0..n)
            .filter(|i| is_challenged(&seed(1), &key(*i), rate))
            .count() as f64;
        // 5% of 20,000 is 1,000 with a standard deviation of ~31.
        assert!((850.0..1150.0).contains(&picked), "{picked} picked");
        assert!(rate.detection_probability(200) > 0.9999);
    }

    #[test]
    fn everyone_computes_the_same_picks_whatever_the_order() {
        let jobs: Vec<(JobKey, NodeId)> = (0..400).map(|i| (key(i), node((i % 3) as u8))).collect();
        let validators: Vec<NodeId> = (0..5).map(node).collect();
        let a = sample(&seed(2), &jobs, &validators, AuditRate::default());
        let mut rev_jobs = jobs.clone();
        rev_jobs.reverse();
        let mut rev_val = validators.clone();
        rev_val.reverse();
        rev_val.push(node(4));
        let b = sample(&seed(2), &rev_jobs, &rev_val, AuditRate::default());
        assert_eq!(a, b);
        assert!(!a.is_empty());
        // Another round's hash picks other jobs.
        assert_ne!(
            a,
            sample(&seed(3), &jobs, &validators, AuditRate::default())
        );
    }

    #[test]
    fn a_worker_never_audits_itself_even_as_the_only_other_name() {
        let everyone: Vec<NodeId> = (0..4).map(node).collect();
        for i in 0..500 {
            let worker = node((i % 4) as u8);
            let a = auditor_for(&seed(1), &key(i), worker, &everyone).unwrap();
            assert_ne!(a, worker);
        }
        // A worker listed many times, alone: nobody can audit it.
        assert_eq!(
            auditor_for(&seed(1), &key(0), node(1), &[node(1), node(1)]),
            None
        );
    }

    #[test]
    fn auditors_are_spread_over_the_validators_and_sybil_repeats_add_no_weight() {
        let validators: Vec<NodeId> = (1..=4).map(node).collect();
        let mut stuffed = validators.clone();
        stuffed.extend(std::iter::repeat_n(node(4), 50));
        let mut counts = [0usize; 5];
        for i in 0..4000 {
            let a = auditor_for(&seed(1), &key(i), node(0), &validators).unwrap();
            let b = auditor_for(&seed(1), &key(i), node(0), &stuffed).unwrap();
            assert_eq!(a, b);
            counts[a.0[0] as usize] += 1;
        }
        for c in &counts[1..] {
            assert!((800..1200).contains(c), "{counts:?}");
        }
    }

    #[test]
    fn rates_at_the_extremes() {
        let all = AuditRate {
            per_million: 1_000_000,
        };
        let none = AuditRate { per_million: 0 };
        let over = AuditRate {
            per_million: u32::MAX,
        };
        for i in 0..200 {
            assert!(is_challenged(&seed(1), &key(i), all));
            assert!(is_challenged(&seed(1), &key(i), over));
            assert!(!is_challenged(&seed(1), &key(i), none));
        }
        assert_eq!(over.replay_share(), 1.0);
    }
}
