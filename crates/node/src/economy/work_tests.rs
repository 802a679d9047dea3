//! A worker keeps the tallies of the jobs other stages took from it and its proof carries
//! them; a tally that is not the taker's, not for us, or not a tally is refused.

use neuroshard_audit::{DeterminismClass, IsaLevel, JobCommitment, JobKind, MicroBatchRef};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::fixtures::work_tally;
use neuroshard_proof::{Receipt, ReceiptKind, tally_jobs};

use super::tests::{NET, T, decode, economy, grad, registered, work};
use super::*;

/// `worker`'s forward job `index` committed in `jobs_round`.
pub(super) fn job(worker: NodeId, jobs_round: u64, index: u32) -> JobCommitment {
    JobCommitment {
        network: NET,
        worker,
        stage: 0,
        round: jobs_round,
        step: 0,
        micro_batch: MicroBatchRef {
            origin: worker,
            step: jobs_round,
            index,
        },
        kind: JobKind::Forward,
        class: DeterminismClass {
            build: [0; 32],
            isa: IsaLevel::X86V3,
            cache_bytes: [1, 2, 3],
            micro_batches: 4,
        },
        weights_hash: [0; 32],
        input_hash: [0; 32],
        upstream_hash: [0; 32],
        output_hash: [0; 32],
        grads_hash: [0; 32],
        epoch: 0,
    }
}

/// `a` (stage 0) proves round 1, receipted by co-replica `b`; `taker` (stage 1) took three of
/// its jobs committed in round 0, and its latest tally rides in the proof; the co-replica's
/// tally of jobs it never took (it is no receiver of ours) does not.
#[test]
fn a_proof_carries_the_latest_tally_of_each_taker_of_another_stage() {
    let (mut a, mut b, mut taker) = (economy(70), economy(71), economy(72));
    registered(&mut [&mut a, &mut b]);
    let op = match taker.register(1, T - 1_000) {
        Some(Ok(wire)) => wire,
        other => panic!("registration: {other:?}"),
    };
    for e in [&mut a, &mut b] {
        e.on_op(&op, T);
    }
    let me = a.node_id();
    for index in 0..3 {
        let tally = taker
            .tally_job(&job(me, 0, index))
            .expect("a provable round");
        a.on_work_tally(taker.node_id(), 0, tally)
            .expect("the taker's tally");
    }
    // A resent job counts once.
    let again = taker.tally_job(&job(me, 0, 2)).expect("a provable round");
    assert_eq!(tally_jobs(&again.hash), Some(3));
    let sybil = b.tally_job(&job(me, 0, 9)).expect("a provable round");
    a.on_work_tally(b.node_id(), 0, sybil).expect("well formed");

    a.record_round(work(&a, 1));
    let receipt = b.receipt_for(me, 1, grad(&a, 1));
    assert!(matches!(a.on_receipt(1, receipt), Ok(true)));
    let proof = match a.poll_proof(T) {
        Some(Ok(wire)) => decode(&wire),
        other => panic!("expected a proof, got {other:?}"),
    };
    let tallies: Vec<_> = proof
        .receipts
        .iter()
        .filter(|r| r.kind == ReceiptKind::Activations)
        .collect();
    assert_eq!(tallies.len(), 1, "{tallies:?}");
    assert_eq!(tallies[0].signer, taker.public_key());
    assert_eq!(tally_jobs(&tallies[0].hash), Some(3));
}

/// What a worker refuses: a tally signed by another key than the node that answered, one for
/// another prover or round, and a receipt that is no tally.
#[test]
fn forged_or_misdirected_tallies_are_refused() {
    let (mut a, taker) = (economy(73), economy(74));
    let me = a.node_id();
    let sign = |prover: NodeId, round: u64, hash| {
        Receipt::sign(
            &test_identity(74),
            NET,
            prover,
            round,
            ReceiptKind::Activations,
            hash,
        )
    };
    let good = sign(me, 1, work_tally(2));
    assert!(matches!(
        a.on_work_tally(test_identity(75).node_id(), 0, good),
        Err(ReceiptRefused::NotTheReceiver)
    ));
    let other_round = sign(me, 5, work_tally(2));
    assert!(matches!(
        a.on_work_tally(taker.node_id(), 0, other_round),
        Err(ReceiptRefused::Signature(_))
    ));
    let other_prover = sign(taker.node_id(), 1, work_tally(2));
    assert!(matches!(
        a.on_work_tally(taker.node_id(), 0, other_prover),
        Err(ReceiptRefused::Signature(_))
    ));
    let no_tally = sign(me, 1, [7; 32]);
    assert!(matches!(
        a.on_work_tally(taker.node_id(), 0, no_tally),
        Err(ReceiptRefused::NotATally)
    ));
    let gradient = Receipt {
        kind: ReceiptKind::Gradients,
        ..good
    };
    assert!(matches!(
        a.on_work_tally(taker.node_id(), 0, gradient),
        Err(ReceiptRefused::WrongKind(_))
    ));
    assert!(matches!(
        a.on_work_tally(taker.node_id(), u64::MAX, good),
        Err(ReceiptRefused::NotATally)
    ));
    assert!(a.on_work_tally(taker.node_id(), 0, good).is_ok());
}
