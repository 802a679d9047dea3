//! Work tallies: a round's share needs pipeline work that nodes of other stages took.
//!
//! The receiver of a job's output (the next stage for activations, the one before for input
//! gradients) counts the distinct jobs of each (worker, round) it countersigned and answers
//! every accepted job with a signed tally of them ([`neuroshard_proof::WorkTally`]: the
//! count and a sketch of the job keys, so tallies of one output sent to several receivers
//! count it once).
//! The worker keeps each receiver's latest tally of a round and puts the largest ones in its
//! proof; the ledger splits a round among its contributors by their tallied jobs, each capped
//! at the round's median (`neuroshard_ledger`'s pots). So a key that offers without serving
//! the pipeline is not paid, whatever its co-replicas vouch for.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use neuroshard_audit::{JobCommitment, JobKind, MicroBatchRef};
use neuroshard_proof::proof::MAX_WORK_RECEIPTS;
use neuroshard_proof::{JobSketch, NodeId, Receipt, ReceiptKind, WorkTally, tally_jobs};

use super::{Economy, ROUND_MEMORY, ReceiptRefused};

/// Rounds of one worker a receiver counts at once (its lowest is dropped beyond).
const ROUNDS_PER_WORKER: usize = 8;
/// (worker, round) pairs a receiver counts at once (the oldest is dropped beyond).
const MAX_COUNTED: usize = 1024;
/// Distinct jobs counted per (worker, round): far more than a round of any sensible schedule.
const MAX_JOBS_COUNTED: usize = 1 << 16;
/// Tallies a worker keeps per round (the lowest count makes room).
const TALLIES_PER_ROUND: usize = 32;

/// The round whose proof claims the jobs committed in `jobs_round`: a job trains from that
/// round's θ₀, and the replica's offer (and proof) of the next round carries its work.
pub fn proved_round(jobs_round: u64) -> Option<u64> {
    jobs_round.checked_add(1)
}

/// A job as its receiver knows it whatever round its worker names: its stage, micro-batch
/// and kind (the worker is the map's key).
type TakenJob = (u16, MicroBatchRef, JobKind);

/// The receiver's side: distinct jobs taken per (worker, round).
#[derive(Debug, Default)]
pub struct TakenJobs {
    jobs: BTreeMap<(NodeId, u64), (BTreeSet<TakenJob>, JobSketch)>,
    order: VecDeque<(NodeId, u64)>,
}

impl TakenJobs {
    /// Counts the job `c` (once, however often it is sent, and in the first round its worker
    /// named for it: the same micro-batch sent again naming another round counts in none);
    /// the worker's tally for its round.
    pub fn count(&mut self, c: &JobCommitment) -> WorkTally {
        let job: TakenJob = (c.stage, c.micro_batch, c.kind);
        let elsewhere = self
            .jobs
            .range((c.worker, 0)..=(c.worker, u64::MAX))
            .any(|((_, r), (set, _))| *r != c.round && set.contains(&job));
        let key = (c.worker, c.round);
        if !self.jobs.contains_key(&key) {
            let rounds: Vec<u64> = self
                .jobs
                .range((c.worker, 0)..=(c.worker, u64::MAX))
                .map(|((_, r), _)| *r)
                .collect();
            if let (true, Some(&lowest)) = (rounds.len() >= ROUNDS_PER_WORKER, rounds.first()) {
                self.forget((c.worker, lowest));
            }
            while self.jobs.len() >= MAX_COUNTED {
                match self.order.front().copied() {
                    Some(old) => self.forget(old),
                    None => break,
                }
            }
            self.order.push_back(key);
        }
        let (set, sketch) = self.jobs.entry(key).or_default();
        if set.len() < MAX_JOBS_COUNTED && !elsewhere && set.insert(job) {
            sketch.insert(&c.key().0);
        }
        WorkTally {
            jobs: u32::try_from(set.len()).unwrap_or(u32::MAX),
            sketch: *sketch,
        }
    }

    fn forget(&mut self, key: (NodeId, u64)) {
        self.jobs.remove(&key);
        self.order.retain(|k| *k != key);
    }
}

/// The worker's side: the latest tally of each receiver, per round of ours.
#[derive(Debug, Default)]
pub struct Tallies {
    rounds: BTreeMap<u64, Vec<Receipt>>,
}

impl Tallies {
    /// Keeps `receipt` (a checked tally) unless its signer's kept one counts more; drops rounds
    /// beyond [`ROUND_MEMORY`] past the newest, and the lowest tally of a full round.
    fn keep(&mut self, round: u64, receipt: Receipt, jobs: u32) {
        let list = self.rounds.entry(round).or_default();
        let count = |r: &Receipt| tally_jobs(&r.hash).unwrap_or(0);
        if let Some(kept) = list.iter_mut().find(|r| r.signer == receipt.signer) {
            if count(kept) < jobs {
                *kept = receipt;
            }
        } else if list.len() < TALLIES_PER_ROUND {
            list.push(receipt);
        } else if let Some(lowest) = list
            .iter_mut()
            .min_by_key(|r| count(r))
            .filter(|r| count(r) < jobs)
        {
            *lowest = receipt;
        }
        while self.rounds.len() > ROUND_MEMORY {
            self.rounds.pop_first();
        }
    }

    /// The tallies of `round` that `counts` accepts, largest first, at most
    /// [`MAX_WORK_RECEIPTS`]; the round is forgotten.
    pub(super) fn take(&mut self, round: u64, counts: impl Fn(&Receipt) -> bool) -> Vec<Receipt> {
        let mut list: Vec<Receipt> = self
            .rounds
            .remove(&round)
            .unwrap_or_default()
            .into_iter()
            .filter(counts)
            .collect();
        list.sort_by_key(|r| std::cmp::Reverse(tally_jobs(&r.hash).unwrap_or(0)));
        list.truncate(MAX_WORK_RECEIPTS);
        list
    }
}

impl Economy {
    /// As the receiver of `c`'s output: our signed tally of the jobs of its worker's round we
    /// took, this one included, for the proof that claims them ([`proved_round`]); `None`
    /// for a job of no provable round, or where that round counts none.
    pub fn tally_job(&mut self, c: &JobCommitment) -> Option<Receipt> {
        let round = proved_round(c.round)?;
        let tally = self.taken.count(c);
        if tally.jobs == 0 {
            // Only a job already counted under another round: nothing of this one to sign.
            return None;
        }
        Some(Receipt::sign(
            &self.identity,
            self.cfg.network,
            c.worker,
            round,
            ReceiptKind::Activations,
            tally.to_hash(),
        ))
    }

    /// As a worker: `from`'s tally of our jobs committed in `jobs_round` it took, kept for the
    /// proof of the round that claims them when it is `from`'s, for us and that round, and a
    /// tally.
    pub fn on_work_tally(
        &mut self,
        from: NodeId,
        jobs_round: u64,
        receipt: Receipt,
    ) -> Result<(), ReceiptRefused> {
        let round = proved_round(jobs_round).ok_or(ReceiptRefused::NotATally)?;
        if receipt.kind != ReceiptKind::Activations {
            return Err(ReceiptRefused::WrongKind(receipt.kind));
        }
        if receipt.signer.node_id() != from {
            return Err(ReceiptRefused::NotTheReceiver);
        }
        let jobs = tally_jobs(&receipt.hash).ok_or(ReceiptRefused::NotATally)?;
        self.check_signed_for_me(round, &receipt)?;
        self.tallies.keep(round, receipt, jobs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::work_tests::job;
    use super::*;
    use neuroshard_proof::fixtures::test_identity;

    /// A job sent again (a retry, a repeated answer) counts once, so a worker cannot inflate
    /// its tally by resending.
    #[test]
    fn a_job_counts_once_however_often_it_is_sent() {
        let w = test_identity(1).node_id();
        let mut taken = TakenJobs::default();
        let first = taken.count(&job(w, 3, 0));
        assert_eq!(first.jobs, 1);
        assert_eq!(taken.count(&job(w, 3, 0)), first);
        let second = taken.count(&job(w, 3, 1));
        assert_eq!(second.jobs, 2);
        let both = [job(w, 3, 0).key().0, job(w, 3, 1).key().0];
        assert_eq!(
            second,
            WorkTally::of_keys(&both),
            "the sketch holds both jobs"
        );
        assert_eq!(
            taken.count(&job(w, 4, 0)).jobs,
            1,
            "another round counts apart"
        );
    }

    /// The attack: a worker sends one micro-batch's output again naming the next round, so
    /// that two proofs claim it. It counts in the round first named, and in no other.
    #[test]
    fn a_job_sent_again_under_another_round_counts_in_none_but_the_first() {
        let w = test_identity(1).node_id();
        let mut taken = TakenJobs::default();
        let first = taken.count(&job(w, 3, 0));
        assert_eq!(first.jobs, 1);
        let relabelled = JobCommitment {
            round: 4,
            ..job(w, 3, 0)
        };
        assert_eq!(taken.count(&relabelled).jobs, 0, "counted again in round 4");
        assert_eq!(taken.count(&job(w, 3, 0)), first);
        assert_eq!(
            taken.count(&job(w, 4, 1)).jobs,
            1,
            "a new job of round 4 counts"
        );
    }

    /// A worker naming ever new rounds keeps at most a few of its own counted, and many
    /// workers at most [`MAX_COUNTED`] in all.
    #[test]
    fn counting_is_bounded_per_worker_and_in_all() {
        let mut taken = TakenJobs::default();
        let w = test_identity(1).node_id();
        for round in 0..100 {
            taken.count(&job(w, round, 0));
        }
        assert_eq!(taken.jobs.len(), ROUNDS_PER_WORKER);
        assert_eq!(
            taken.count(&job(w, 99, 1)).jobs,
            2,
            "the latest rounds stay"
        );
        for i in 0..(MAX_COUNTED as u64 + 10) {
            taken.count(&job(NodeId([(i % 251) as u8; 32]), i, 0));
        }
        assert!(taken.jobs.len() <= MAX_COUNTED);
        assert_eq!(taken.order.len(), taken.jobs.len());
    }
}
