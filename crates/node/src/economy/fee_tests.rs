//! Which validator fees an epoch may hold: only the auditor a job's beacon assigned, for a
//! challenged job of a round the ledger paid its worker for (each check fails an attack that
//! would otherwise mint).

use neuroshard_audit::{
    AuditFeeClaim, AuditRate, BEACON_LAG, ChallengeSeed, JobCommitment, JobKey, Served,
    auditor_for, is_challenged,
};
use neuroshard_ledger::VerifiedAuditFee;
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Hash32, Identity, NodeId, Signed};

use super::tests::{NET, T, economy, prove, registered};
use super::{Economy, FeeRefused};

const EPOCH: u64 = 3;

/// A forward job of stage 0, round 1, by `worker`, naming epoch `EPOCH`.
fn job(worker: &Identity, index: u32) -> JobCommitment {
    let mut c = crate::core::fraud_tests::forward_job(NET, worker, index);
    c.round = 1;
    c.epoch = EPOCH;
    c
}

fn claim(worker: &Identity, c: &JobCommitment, to: NodeId) -> VerifiedAuditFee {
    let served = Served {
        network: c.network,
        job: c.key(),
        worker: c.worker,
        to,
        input_hash: c.input_hash,
        timestamp_ms: T,
    };
    let claim = AuditFeeClaim {
        job: c.sign(worker),
        served: Signed::sign(worker, &served),
    };
    VerifiedAuditFee::from_claim(&claim).expect("the worker signed both")
}

/// Worker `a` paid for round 1 of stage 0 (b's receipt); a, b, c registered for stage 0;
/// `judge` holds them all, and the beacon of the job's epoch.
struct World {
    judge: Economy,
    worker: Identity,
    others: [NodeId; 2],
    beacon: Hash32,
}

fn world() -> World {
    let (mut a, mut b, mut c, mut judge) = (economy(31), economy(32), economy(33), economy(34));
    registered(&mut [&mut a, &mut b, &mut c, &mut judge]);
    let wire = prove(&mut a, &b, 1, T);
    assert!(matches!(
        judge.on_proof(&wire, T),
        super::ProofOutcome::Applied { .. }
    ));
    let beacon = [5; 32];
    judge.note_beacon(EPOCH + BEACON_LAG, beacon);
    World {
        judge,
        worker: test_identity(31),
        others: [b.node_id(), c.node_id()],
        beacon,
    }
}

/// A job of the worker's round 1 the beacon challenges, and the auditor it assigns.
fn challenged(w: &World) -> (JobCommitment, NodeId) {
    let seed = ChallengeSeed::from_beacon(NET, 0, 1, w.beacon);
    let validators: Vec<NodeId> = w.judge.ledger().ever_registered(0).collect();
    (0..10_000)
        .map(|i| job(&w.worker, i))
        .find_map(|c| {
            let key: JobKey = c.key();
            is_challenged(&seed, &key, AuditRate::default())
                .then(|| auditor_for(&seed, &key, c.worker, &validators))
                .flatten()
                .map(|a| (c, a))
        })
        .expect("a challenged job")
}

fn judge(w: &World, fee: &VerifiedAuditFee) -> Result<(), FeeRefused> {
    w.judge.judge_fee(w.judge.ledger(), fee)
}

#[test]
fn the_assigned_auditor_of_a_challenged_job_of_a_paid_round_is_admitted() {
    let w = world();
    let (c, auditor) = challenged(&w);
    assert_eq!(judge(&w, &claim(&w.worker, &c, auditor)), Ok(()));
}

/// A worker hands a co-replica of its choosing (a Sybil) its served statement: the beacon
/// assigned the job to someone else, so no fee.
#[test]
fn a_fee_for_an_auditor_the_beacon_did_not_assign_is_refused() {
    let w = world();
    let (c, auditor) = challenged(&w);
    let other = *w.others.iter().find(|n| **n != auditor).unwrap();
    assert_eq!(
        judge(&w, &claim(&w.worker, &c, other)),
        Err(FeeRefused::OtherAuditor)
    );
}

/// Made-up jobs: one the beacon does not challenge, and challenged ones of a round the
/// ledger never paid the worker for (a worker signs as many of those as it likes).
#[test]
fn fees_for_unchallenged_jobs_or_unpaid_rounds_are_refused() {
    let w = world();
    let seed = ChallengeSeed::from_beacon(NET, 0, 1, w.beacon);
    let unpicked = (0..100)
        .map(|i| job(&w.worker, i))
        .find(|c| !is_challenged(&seed, &c.key(), AuditRate::default()))
        .unwrap();
    assert_eq!(
        judge(&w, &claim(&w.worker, &unpicked, w.others[0])),
        Err(FeeRefused::NotChallenged)
    );
    let seed = ChallengeSeed::from_beacon(NET, 0, 9, w.beacon);
    let validators: Vec<NodeId> = w.judge.ledger().ever_registered(0).collect();
    let (c, auditor) = (0..10_000)
        .map(|i| JobCommitment {
            round: 9,
            ..job(&w.worker, i)
        })
        .find_map(|c| {
            is_challenged(&seed, &c.key(), AuditRate::default())
                .then(|| auditor_for(&seed, &c.key(), c.worker, &validators))
                .flatten()
                .map(|a| (c, a))
        })
        .unwrap();
    let refused = judge(&w, &claim(&w.worker, &c, auditor));
    assert_eq!(refused, Err(FeeRefused::RoundNotPaid));
    assert!(
        refused.unwrap_err().may_change(),
        "its proof may still come"
    );
}

/// A beacon not final yet waits; one no longer held (or never) is refused for good; a fee
/// of another network is refused.
#[test]
fn fees_wait_for_their_beacon_and_name_this_network() {
    let mut w = world();
    let (mut c, auditor) = challenged(&w);
    c.epoch = EPOCH + 10;
    let later = judge(&w, &claim(&w.worker, &c, auditor));
    assert_eq!(
        later,
        Err(FeeRefused::BeaconNotFinal(EPOCH + 10 + BEACON_LAG))
    );
    assert!(later.unwrap_err().may_change());
    w.judge.note_beacon(EPOCH + 20 + BEACON_LAG, [6; 32]);
    let gone = judge(&w, &claim(&w.worker, &c, auditor));
    assert_eq!(gone, Err(FeeRefused::BeaconGone(EPOCH + 10 + BEACON_LAG)));
    assert!(!gone.unwrap_err().may_change());
    let (c, auditor) = challenged(&w);
    let mut other = claim(&w.worker, &c, auditor);
    other.network = [8; 32];
    assert_eq!(judge(&w, &other), Err(FeeRefused::OtherNetwork));
}
