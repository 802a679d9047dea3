//! A round's share needs delivered work in a network of several stages: work tallies signed
//! by nodes of other stages that took the contributor's pipeline outputs.

use super::tests::{REWARD, balance, claim_by, epoch, settle};
use super::*;
use crate::ops::{Action, verify_op};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::fixtures::work_tally;
use neuroshard_proof::{Hash32, Identity, Receipt, ReceiptKind, VerifiedProof, WorkTally};

/// `id`'s claim of `round`, vouched for by `witnesses`, with a work tally of `jobs` from each
/// of `takers`.
fn worked_claim(
    id: &Identity,
    witnesses: &[&Identity],
    takers: &[(&Identity, u32)],
    round: u64,
) -> VerifiedProof {
    let tallies: Vec<(&Identity, Hash32)> = takers
        .iter()
        .map(|(t, jobs)| (*t, work_tally(*jobs)))
        .collect();
    tallied_claim(id, witnesses, &tallies, round)
}

/// `id`'s claim of `round`, vouched for by `witnesses`, with each taker's tally hash.
fn tallied_claim(
    id: &Identity,
    witnesses: &[&Identity],
    takers: &[(&Identity, Hash32)],
    round: u64,
) -> VerifiedProof {
    let bare = claim_by(id, witnesses, round);
    let mut p = bare.proof().clone();
    for (taker, tally) in takers {
        p.receipts.push(Receipt::sign(
            taker,
            p.network,
            p.node_id,
            round,
            ReceiptKind::Activations,
            *tally,
        ));
    }
    let mut v = neuroshard_proof::ProofVerifier::new();
    for k in witnesses
        .iter()
        .copied()
        .chain(takers.iter().map(|(t, _)| *t))
    {
        v.add_known_node(k.public_key());
    }
    v.verify(&p.sign(id), p.timestamp_ms)
        .expect("fixture proof verifies")
}

/// A ledger whose genesis stakes the minimum for each of the keys 400–402, 410–411 and 420.
fn fresh() -> LedgerState {
    let rules = crate::Rules::default();
    let stakes = [400, 401, 402, 410, 411, 420]
        .into_iter()
        .map(|i| (test_identity(i).public_key(), rules.min_stake))
        .collect();
    let genesis = crate::LedgerGenesis::new(rules, stakes).expect("genesis");
    LedgerState::from_genesis(&genesis).expect("state").0
}

/// Registers each (staked) key for `stage`.
fn register(state: &mut LedgerState, keys: &[&Identity], stage: u16) {
    for k in keys {
        let nonce = state.account(&k.node_id()).next_nonce;
        let op = crate::AccountOp {
            network: neuroshard_proof::fixtures::TEST_NETWORK,
            account: k.node_id(),
            nonce,
            timestamp_ms: 1_000,
            action: Action::Register { stage },
        };
        let verified = verify_op(&op.sign(k)).expect("signed op");
        state.apply_op(verified).expect("registered");
    }
}

/// Three replicas of stage 1 and two of stage 2 (the takers of stage 1's outputs).
struct World {
    replicas: Vec<Identity>,
    takers: Vec<Identity>,
}

fn world(state: &mut LedgerState) -> World {
    let replicas: Vec<Identity> = (0..3).map(|i| test_identity(400 + i)).collect();
    let takers: Vec<Identity> = (0..2).map(|i| test_identity(410 + i)).collect();
    register(state, &replicas.iter().collect::<Vec<_>>(), 1);
    register(state, &takers.iter().collect::<Vec<_>>(), 2);
    World { replicas, takers }
}

/// The attack: a staked replica that offers a pseudo-gradient of its choosing without serving
/// the pipeline. Its co-replicas aggregate its offer, so it is vouched for; before work
/// counted it took a third of every round. Now it has no jobs anyone took and is not paid.
#[test]
fn a_vouched_replica_that_served_no_pipeline_jobs_is_not_paid() {
    let mut state = fresh();
    let w = world(&mut state);
    let [a, b, rider] = [&w.replicas[0], &w.replicas[1], &w.replicas[2]];
    let (t0, t1) = (&w.takers[0], &w.takers[1]);
    epoch(
        &mut state,
        &[
            worked_claim(a, &[b, rider], &[(t0, 20), (t1, 22)], 1),
            worked_claim(b, &[a, rider], &[(t0, 21), (t1, 19)], 1),
            worked_claim(rider, &[a, b], &[], 1),
        ],
    );
    let before = state.minted();
    let settled = settle(&mut state);
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].idle, vec![rider.node_id()]);
    assert!(
        settled[0].unvouched.is_empty(),
        "its co-replicas vouch for it"
    );
    assert_eq!(balance(&state, rider), 0);
    assert_eq!(balance(&state, a), REWARD / 2);
    assert_eq!(balance(&state, b), REWARD / 2);
    assert_eq!(state.minted() - before, REWARD);
    state.check_invariants().expect("supply");
}

/// Tallies the rider signs with keys of its own count for nothing: a co-replica Sybil's
/// (registered only for the rider's stage), an unregistered key's, a contributor's of the
/// round, and its own.
#[test]
fn tallies_from_co_replicas_strangers_or_contributors_count_for_nothing() {
    let mut state = fresh();
    let w = world(&mut state);
    let [a, b, rider] = [&w.replicas[0], &w.replicas[1], &w.replicas[2]];
    let sybil = test_identity(420);
    register(&mut state, &[&sybil], 1);
    let stranger = test_identity(421);
    let t0 = &w.takers[0];
    epoch(
        &mut state,
        &[
            worked_claim(a, &[b, rider], &[(t0, 20)], 1),
            worked_claim(b, &[a, rider], &[(t0, 20)], 1),
            worked_claim(
                rider,
                &[a],
                &[(&sybil, 1_000), (&stranger, 1_000), (b, 1_000)],
                1,
            ),
        ],
    );
    let settled = settle(&mut state);
    assert_eq!(settled[0].idle, vec![rider.node_id()]);
    assert_eq!(balance(&state, rider), 0);

    // The same tallies from a taker of the next stage count.
    let mut control = fresh();
    let w = world(&mut control);
    let [a, b, rider] = [&w.replicas[0], &w.replicas[1], &w.replicas[2]];
    let t0 = &w.takers[0];
    epoch(
        &mut control,
        &[
            worked_claim(a, &[b, rider], &[(t0, 20)], 1),
            worked_claim(b, &[a, rider], &[(t0, 20)], 1),
            worked_claim(rider, &[a, b], &[(&w.takers[1], 20)], 1),
        ],
    );
    let settled = settle(&mut control);
    assert!(settled[0].idle.is_empty());
    assert_eq!(balance(&control, rider), REWARD / 3);
}

/// Routing shares jobs unevenly: shares follow the delivered jobs, each capped at the
/// round's median (a colluding receiver's inflated tally earns an equal share, no more); and
/// where no contributor has a tally (a network of one stage, where no job leaves the stage)
/// every vouched contributor is paid alike.
#[test]
fn shares_follow_delivered_jobs_capped_at_the_median_and_a_stage_without_tallies_pays_alike() {
    let mut state = fresh();
    let w = world(&mut state);
    let [a, b, c] = [&w.replicas[0], &w.replicas[1], &w.replicas[2]];
    let t0 = &w.takers[0];
    epoch(
        &mut state,
        &[
            worked_claim(a, &[b, c], &[(t0, 40)], 1),
            worked_claim(b, &[a, c], &[(t0, 10_000)], 1),
            worked_claim(c, &[a, b], &[(t0, 20)], 1),
        ],
    );
    let settled = settle(&mut state);
    assert_eq!(settled.len(), 1);
    assert!(settled[0].idle.is_empty());
    // Weights 40, 40 (capped at the median) and 20 of 100.
    assert_eq!(balance(&state, a), REWARD * 2 / 5);
    assert_eq!(balance(&state, b), REWARD * 2 / 5);
    assert_eq!(balance(&state, c), REWARD / 5);

    let mut single = fresh();
    let w = world(&mut single);
    let [a, b, c] = [&w.replicas[0], &w.replicas[1], &w.replicas[2]];
    epoch(
        &mut single,
        &[
            worked_claim(a, &[b, c], &[], 1),
            worked_claim(b, &[a, c], &[], 1),
            worked_claim(c, &[a, b], &[], 1),
        ],
    );
    let settled = settle(&mut single);
    assert_eq!(settled[0].shares.len(), 3);
    assert_eq!(balance(&single, c), REWARD / 3);
}

/// A contribution keeps its tallies as the proof had them: one per signer, never the
/// prover's, and none that is not a tally.
#[test]
fn a_contribution_holds_its_proofs_tallies() {
    let a = test_identity(430);
    let b = test_identity(431);
    let t = test_identity(432);
    let p = worked_claim(&a, &[&b], &[(&t, 7)], 3);
    let c = Contribution::of(p.proof(), p.hash());
    let tally = WorkTally::from_hash(&work_tally(7)).expect("a tally");
    assert_eq!(c.work, vec![(t.node_id(), tally)]);
    assert_eq!(c.vouchers, vec![b.node_id()]);
}

/// The tally of jobs `from..to` of a worker (made-up job keys).
fn jobs_in(from: u64, to: u64) -> Hash32 {
    neuroshard_proof::fixtures::tally_of(from..to).to_hash()
}

/// The attack: a replica serves half the jobs of its co-replicas and sends each output to
/// both next-stage replicas (as a failover resend would). Each receiver honestly tallies
/// every job it took, so the two counts add up to the others' work. The tallies' sketches
/// show the same jobs twice, and it is paid for its half.
#[test]
fn one_output_sent_to_several_receivers_counts_once() {
    let mut state = fresh();
    let w = world(&mut state);
    let [a, b, rider] = [&w.replicas[0], &w.replicas[1], &w.replicas[2]];
    let [t0, t1] = [&w.takers[0], &w.takers[1]];
    epoch(
        &mut state,
        &[
            tallied_claim(
                a,
                &[b, rider],
                &[(t0, jobs_in(0, 30)), (t1, jobs_in(30, 60))],
                1,
            ),
            tallied_claim(
                b,
                &[a, rider],
                &[(t0, jobs_in(100, 130)), (t1, jobs_in(130, 160))],
                1,
            ),
            tallied_claim(
                rider,
                &[a, b],
                &[(t0, jobs_in(200, 230)), (t1, jobs_in(200, 230))],
                1,
            ),
        ],
    );
    let settled = settle(&mut state);
    assert_eq!(settled[0].shares.len(), 3);
    let [pa, pb, pr] = [a, b, rider].map(|k| balance(&state, k));
    // Weights about 60, 60 and 30: the rider is paid about a fifth, not a third.
    assert!(pr < REWARD / 4, "the rider was paid {pr} of {REWARD}");
    assert!(pa > REWARD * 3 / 10 && pb > REWARD * 3 / 10, "{pa} {pb}");
}
