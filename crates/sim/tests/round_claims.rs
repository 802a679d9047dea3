//! Two staked replicas of one stage receipting each other's claims of rounds the stage never
//! ran. Before the round lead every ledger paid them for every such round the founding's time
//! bound allowed (four a second); now no ledger, live or finalized, pays a round more than
//! the lead past what the stage's other replicas reached. And two keys that join a stage late
//! claiming the rounds it ran before them: the finalized state pays none.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use neuroshard_ledger::{LedgerState, round_key_of};
use neuroshard_node::core::Transmit;
use neuroshard_node::records::Topic;
use neuroshard_proof::{Canonical, LayerRange, Proof, Receipt, ReceiptKind, SignedProof};
use neuroshard_sim::{EngineKind, Sim, network, settings, tiny_model};

/// Stage 0 of 2 × 5 holds nodes 0, 2, 4, 6 and 8: the Sybils are 2 and 4.
const SYBIL: usize = 2;
const ACCOMPLICE: usize = 4;

/// Claims of `rounds` by node `sybil`, each receipted by node `accomplice`, modelled on the
/// Sybil's latest genuine proof.
fn forged_claims(
    sim: &Sim,
    genuine: &[u8],
    (sybil, accomplice): (usize, usize),
    rounds: impl Iterator<Item = u64>,
) -> Vec<(u64, Vec<u8>)> {
    let signed = SignedProof::from_bytes(genuine).expect("the Sybil's own proof");
    let template = Proof::from_canonical_bytes(signed.payload_bytes()).expect("decodes");
    rounds
        .enumerate()
        .map(|(k, round)| {
            let k = k as u64;
            let mut p = template.clone();
            p.round = round;
            p.nonce = template.nonce + 1 + k;
            // A minute on (within the clock skew nodes allow), so that the founding's time
            // bound, four rounds a second, allows every claim.
            p.timestamp_ms = template.timestamp_ms + 60_000;
            p.pseudo_gradient_hash = *blake3::hash(&round.to_le_bytes()).as_bytes();
            p.receipts = vec![Receipt::sign(
                sim.identity(accomplice),
                p.network,
                p.node_id,
                round,
                ReceiptKind::Gradients,
                p.pseudo_gradient_hash,
            )];
            (round, p.sign(sim.identity(sybil)).to_bytes())
        })
        .collect()
}

/// Keeps the latest proof node `i` publishes.
fn keep_latest_proof(sim: &mut Sim, i: usize) -> Arc<Mutex<Option<Vec<u8>>>> {
    let latest: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
    let slot = Arc::clone(&latest);
    sim.set_tamper(
        i,
        Box::new(move |t| {
            if let Transmit::Publish {
                topic: Topic::Proof(_),
                data,
            } = &t
            {
                *slot.lock().unwrap() = Some(data.clone());
            }
            Some(t)
        }),
    );
    latest
}

/// 2 stages × 5 replicas on the stand-in under `round_lead`, drivers stopping after `steps`
/// (0: never), with `spares` keys staked for joiners (each one not running counts against
/// finality's quorum).
fn stage_of_five(round_lead: u64, steps: u64, spares: usize) -> Sim {
    let mut s = settings(tiny_model(), 2, 5);
    s.steps = steps;
    let mut sim = network(17, s, 5, EngineKind::StandIn);
    sim.set_round_lead(round_lead);
    sim.set_spare_keys(spares);
    sim
}

/// The rounds of `claims` by node `who` that a ledger holds (recorded as claimed), and those
/// it paid (a share of a settled round).
#[derive(Debug)]
struct Held {
    claimed: BTreeSet<u64>,
    paid: BTreeSet<u64>,
}

/// What node `i`'s live ledger and finalized state hold of `claims` by node `who`.
fn paid_to(
    sim: &Sim,
    i: usize,
    who: usize,
    claims: &[(u64, Vec<u8>)],
    layers: LayerRange,
) -> (Held, Held) {
    let who = sim.node_id(who);
    let held = |state: &LedgerState| -> Held {
        let key = |r: u64| round_key_of(&who, layers, r);
        let rounds = || claims.iter().map(|(r, _)| *r);
        Held {
            claimed: rounds().filter(|r| state.round_claimed(&key(*r))).collect(),
            paid: rounds()
                .filter(|r| state.round_paid(&key(*r)).is_some_and(|p| p > 0))
                .collect(),
        }
    };
    let core = sim.core(i).expect("every node runs");
    let state = core.finalized_state().expect("finality runs");
    assert!(state.proof_count() > 50, "node {i}: finality stalled");
    (held(core.economy().ledger()), held(state))
}

/// 2 × 5 under `round_lead` run for 30 s, and the Sybil's latest genuine proof by then (no
/// offline founders: the ten nodes are the whole finality committee).
fn sybil_with_a_genuine_proof(round_lead: u64) -> (Sim, Vec<u8>) {
    let mut sim = stage_of_five(round_lead, 60, 0);
    let latest = keep_latest_proof(&mut sim, SYBIL);
    sim.run_until(Duration::from_secs(30));
    let genuine = latest
        .lock()
        .unwrap()
        .clone()
        .expect("the Sybil proved a round");
    (sim, genuine)
}

/// Runs the attack under `round_lead`: what each node's live ledger and finalized state hold
/// of the claims, and every node's live state hash.
fn attack(round_lead: u64) -> (Vec<Held>, Vec<Held>, BTreeSet<String>) {
    let (mut sim, genuine) = sybil_with_a_genuine_proof(round_lead);
    let template = Proof::from_canonical_bytes(
        SignedProof::from_bytes(&genuine)
            .expect("signed")
            .payload_bytes(),
    )
    .expect("decodes");
    let first = template.round + 20;
    let claims = forged_claims(
        &sim,
        &genuine,
        (SYBIL, ACCOMPLICE),
        (0..20).map(|k| first + 10 * k),
    );
    for (_, wire) in &claims {
        for j in (0..sim.len()).filter(|j| *j != SYBIL) {
            sim.gossip_to(SYBIL, j, &Topic::Proof(0), wire.clone());
        }
    }
    sim.run_until(Duration::from_secs(100));
    let (live, fin) = (0..sim.len())
        .map(|i| paid_to(&sim, i, SYBIL, &claims, template.layers))
        .unzip();
    let hashes = (0..sim.len())
        .map(|i| hex::encode(sim.core(i).expect("runs").economy().state_hash()))
        .collect();
    (live, fin, hashes)
}

/// With the round lead no ledger even records the claims. Without it every ledger records
/// them, and none pays them all the same: a round settles only once the stage reached it,
/// which two keys of five cannot make it do.
#[test]
fn two_staked_replicas_are_not_paid_for_rounds_their_stage_never_ran() {
    let (live, fin, hashes) = attack(neuroshard_ledger::rules::DEFAULT_ROUND_LEAD);
    for (i, (l, f)) in live.iter().zip(&fin).enumerate() {
        assert!(l.claimed.is_empty(), "node {i}'s live ledger holds {l:?}");
        assert!(
            f.claimed.is_empty(),
            "node {i}'s finalized state holds {f:?}"
        );
    }
    assert_eq!(hashes.len(), 1, "live ledgers differ: {hashes:?}");

    let (live, fin, _) = attack(0);
    for (i, (l, f)) in live.iter().zip(&fin).enumerate() {
        assert_eq!(
            l.claimed.len(),
            20,
            "node {i}: without the lead, holds {l:?}"
        );
        assert_eq!(
            f.claimed.len(),
            20,
            "node {i}: without the lead, finalized {f:?}"
        );
        assert!(
            l.paid.is_empty() && f.paid.is_empty(),
            "node {i}: {l:?} {f:?}"
        );
    }
}

/// Two keys join stage 0 once it ran well past the lead and claim its rounds from round 1,
/// receipting each other: what every live ledger and finalized state holds of those claims.
fn late_claims(round_lead: u64) -> Vec<(Held, Held)> {
    // Two spare keys, for the joiners.
    let mut sim = stage_of_five(round_lead, 0, 2);
    sim.run_until(Duration::from_secs(90));
    let (a, b) = (
        sim.add_node(0, Duration::from_secs(90)),
        sim.add_node(0, Duration::from_secs(90)),
    );
    let latest = keep_latest_proof(&mut sim, a);
    let mut at = Duration::from_secs(100);
    let genuine = loop {
        sim.run_until(at);
        if let Some(g) = latest.lock().unwrap().clone() {
            break g;
        }
        at += Duration::from_secs(5);
        assert!(
            at < Duration::from_secs(200),
            "the joiner never proved a round"
        );
    };
    let template = Proof::from_canonical_bytes(
        SignedProof::from_bytes(&genuine)
            .expect("signed")
            .payload_bytes(),
    )
    .expect("decodes");
    assert!(
        template.round > 12,
        "the stage is at round {}",
        template.round
    );
    // The joiner's first proof is the one kept: its rounds from the lead before it on are
    // its to claim; these are all older.
    let claims = forged_claims(&sim, &genuine, (a, b), 1..template.round - 12);
    for (_, wire) in &claims {
        for j in (0..sim.len()).filter(|j| *j != a) {
            sim.gossip_to(a, j, &Topic::Proof(0), wire.clone());
        }
    }
    sim.run_until(at + Duration::from_secs(60));
    (0..10)
        .map(|i| paid_to(&sim, i, a, &claims, template.layers))
        .collect()
}

/// With the round lead no ledger records the claims. Without it they are recorded and paid
/// nothing all the same, now because their stage settled those rounds (a round closes three
/// epochs after its first proof was final): the test runs both. Each defence alone has its
/// own tests: the floor in the ledger's
/// `progress::tests::a_newcomer_cannot_claim_the_rounds_its_stage_ran_before_it_came` and the
/// economy's `ahead_tests::a_live_ledger_pays_a_newcomer_only_from_the_lead_before_its_first_final_claim`,
/// the closure in `pots::tests::a_claim_of_a_settled_round_is_never_paid`.
#[test]
fn keys_that_join_late_are_not_paid_for_the_rounds_their_stage_ran_before_them() {
    for (i, (l, f)) in late_claims(neuroshard_ledger::rules::DEFAULT_ROUND_LEAD)
        .iter()
        .enumerate()
    {
        assert!(l.claimed.is_empty(), "node {i}'s live ledger holds {l:?}");
        assert!(
            f.claimed.is_empty(),
            "node {i}'s finalized state holds {f:?}"
        );
    }
    for (i, (l, f)) in late_claims(0).iter().enumerate() {
        assert!(
            l.claimed.len() > 1,
            "node {i}: without the lead, holds only {l:?}"
        );
        assert!(
            l.paid.is_empty() && f.paid.is_empty(),
            "node {i}: {l:?} {f:?}"
        );
    }
}

/// Every round of both stages mints one round's reward at most, however many of the five
/// replicas claimed it: it is split among them when finality settles the round, and every
/// live ledger pays exactly the shares the finalized state settled. Honest replicas vouch
/// for each other (each share needs receipts from two of the round's other contributors),
/// and the other stage's replicas tally the jobs they took from them, which every paid share
/// carries.
#[test]
fn each_settled_round_mints_one_reward_split_among_its_contributors() {
    let mut sim = stage_of_five(neuroshard_ledger::rules::DEFAULT_ROUND_LEAD, 60, 0);
    sim.run_until(Duration::from_secs(120));
    let core = sim.core(0).expect("runs");
    let fin = core.finalized_state().expect("finality runs");
    let reward = fin.rules().round_reward;
    // At most the embedding's and the head's bonuses on top.
    let most = reward + reward / 2;
    let settled: Vec<_> = fin.settlements().collect();
    assert!(settled.len() >= 4, "{} rounds settled", settled.len());
    let mut shared = 0;
    let contributions: usize = settled
        .iter()
        .map(|s| s.shares.len() + s.unvouched.len() + s.idle.len())
        .sum();
    let unvouched: usize = settled.iter().map(|s| s.unvouched.len()).sum();
    let idle: usize = settled.iter().map(|s| s.idle.len()).sum();
    let tallied = settled
        .iter()
        .flat_map(|s| &s.shares)
        .filter(|x| !x.contribution.work.is_empty())
        .count();
    // How big tallies are, and how much their sketches take off the counts' sum (resends).
    let tallies: Vec<Vec<neuroshard_proof::WorkTally>> = settled
        .iter()
        .flat_map(|s| &s.shares)
        .map(|x| x.contribution.work.iter().map(|(_, t)| *t).collect())
        .collect();
    let largest = tallies.iter().flatten().map(|t| t.jobs).max().unwrap_or(0);
    let summed: u64 = tallies.iter().flatten().map(|t| u64::from(t.jobs)).sum();
    let distinct: u64 = tallies
        .iter()
        .map(|t| neuroshard_proof::distinct_jobs(t))
        .sum();
    eprintln!(
        "{} rounds settled, {contributions} contributions, {unvouched} not vouched for, \
         {idle} with no delivered job, {tallied} paid shares with work tallies; largest \
         tally {largest} jobs, {distinct} distinct of {summed} tallied",
        settled.len()
    );
    // Honest replicas receipt each other's pseudo-gradients: vouching pays them; and the
    // other stage's replicas tally the jobs they took from them, which the split follows.
    assert!(
        (unvouched + idle) * 20 <= contributions,
        "{unvouched} unvouched and {idle} idle of {contributions}"
    );
    assert!(
        settled
            .iter()
            .flat_map(|s| &s.shares)
            .all(|x| !x.contribution.work.is_empty()),
        "every paid share of a two-stage network carries work tallies"
    );
    for s in &settled {
        let total: u64 = s.shares.iter().map(|x| x.amount).sum();
        assert!(total <= most, "round {} minted {total}", s.round);
        assert!(total > 0);
        if s.shares.len() > 1 {
            shared += 1;
        }
    }
    assert!(
        shared * 2 > settled.len(),
        "most rounds have several contributors"
    );
    for i in 0..sim.len() {
        let live = sim.core(i).expect("runs").economy().ledger();
        for j in 0..sim.len() {
            let id = sim.node_id(j);
            assert_eq!(
                live.account(&id).balance,
                fin.account(&id).balance,
                "node {i}'s live ledger pays node {j} otherwise than finality"
            );
        }
        assert!(
            live.account(&sim.node_id(i)).balance > 0,
            "node {i} earned nothing"
        );
    }
}

/// The free rider: a staked last-stage replica that trains on what reaches it and offers every
/// round (so its co-replicas aggregate and vouch for its offers), but never sends a job's
/// output on: no driver gets its gradients. Before shares followed delivered work it was paid
/// like its honest co-replicas; now no one took a job of it and it is paid nothing, while
/// each honest replica of its stage is.
#[test]
fn a_replica_whose_jobs_never_reach_the_next_stage_is_not_paid_for_its_rounds() {
    const RIDER: usize = 9;
    let mut sim = stage_of_five(neuroshard_ledger::rules::DEFAULT_ROUND_LEAD, 60, 0);
    sim.set_tamper(
        RIDER,
        Box::new(|t| match &t {
            Transmit::Request { data, .. }
                if neuroshard_node::wire::PipeRequest::from_canonical_bytes(data).is_ok() =>
            {
                None
            }
            _ => Some(t),
        }),
    );
    sim.run_until(Duration::from_secs(120));
    let core = sim.core(0).expect("runs");
    let fin = core.finalized_state().expect("finality runs");
    let rider = sim.node_id(RIDER);
    let settled: Vec<_> = fin.settlements().collect();
    // Rounds where its co-replicas vouched for the rider: paid or not.
    let vouched_rounds = settled
        .iter()
        .filter(|s| s.idle.contains(&rider) || s.shares.iter().any(|x| x.node == rider))
        .count();
    eprintln!(
        "{} rounds settled; the rider was vouched for in {vouched_rounds}",
        settled.len()
    );
    assert!(
        vouched_rounds >= 2,
        "the rider offered and was vouched for in {vouched_rounds} settled rounds"
    );
    assert!(
        settled
            .iter()
            .flat_map(|s| &s.shares)
            .all(|x| x.node != rider),
        "the rider was paid a share"
    );
    assert_eq!(fin.account(&rider).balance, 0);
    let paid = [1, 3, 5, 7]
        .into_iter()
        .filter(|i| fin.account(&sim.node_id(*i)).balance > 0)
        .count();
    assert!(paid >= 3, "{paid} honest last-stage replicas earned");
}

/// Variants of a staked replica's genuine proof that claim what it did not do, each signed
/// by its own key (its co-replica Sybil receipting where a receipt is needed): the same
/// round under a fresh nonce, back-dated before the founding, each proof kind the network
/// does not produce, the whole model in a network of two stages, and another network's id.
fn variants(sim: &Sim, genuine: &[u8]) -> Vec<(&'static str, Vec<u8>, neuroshard_proof::Hash32)> {
    let signed = SignedProof::from_bytes(genuine).expect("the Sybil's own proof");
    let template = Proof::from_canonical_bytes(signed.payload_bytes()).expect("decodes");
    let sybil = sim.identity(SYBIL);
    let resign = |mut p: Proof, nonce: u64| {
        p.nonce = template.nonce + nonce;
        p.receipts = p
            .receipts
            .iter()
            .map(|r| {
                Receipt::sign(
                    sim.identity(ACCOMPLICE),
                    p.network,
                    p.node_id,
                    p.round,
                    r.kind,
                    r.hash,
                )
            })
            .collect();
        let s = p.sign(sybil);
        (s.to_bytes(), s.payload_hash())
    };
    let mut out = Vec::new();
    let (wire, hash) = resign(template.clone(), 1);
    out.push(("the same round under a fresh nonce", wire, hash));
    let back_dated = Proof {
        timestamp_ms: 1,
        ..template.clone()
    };
    let (wire, hash) = resign(back_dated, 2);
    out.push(("back-dated before the founding", wire, hash));
    for (n, kind) in [
        neuroshard_proof::ProofKind::Uptime,
        neuroshard_proof::ProofKind::Inference,
        neuroshard_proof::ProofKind::Verification,
    ]
    .into_iter()
    .enumerate()
    {
        let (wire, hash) = resign(
            Proof {
                kind,
                round: template.round + 1,
                ..template.clone()
            },
            3 + n as u64,
        );
        out.push(("a proof kind the network does not produce", wire, hash));
    }
    let whole = Proof {
        roles: neuroshard_proof::Roles::EMBEDDING.with(neuroshard_proof::Roles::LM_HEAD),
        round: template.round + 2,
        ..template.clone()
    };
    let (wire, hash) = resign(whole, 6);
    out.push(("the whole model in a two-stage network", wire, hash));
    let foreign = Proof {
        network: [0xf0; 32],
        round: template.round + 3,
        ..template.clone()
    };
    let (wire, hash) = resign(foreign, 7);
    out.push(("another network's proof", wire, hash));
    out
}

/// Issue 14's minting attacks in one network run: a staked replica gossips the variants of
/// its genuine proof above to every node. No node's live ledger or finalized state holds any
/// of them (so none mints), and the ledgers still agree. Each refusal is one rule with its
/// own unit test (`economy::tests::sybil_receipts_resigned_back_dated_and_future_rounds_mint_nothing`,
/// `economy::tests::unproduced_proof_kinds_and_claims_beyond_a_stage_mint_nothing`, which
/// also holds the other network's claim).
#[test]
fn forged_variants_of_a_genuine_proof_mint_nothing_on_any_ledger() {
    let (mut sim, genuine) =
        sybil_with_a_genuine_proof(neuroshard_ledger::rules::DEFAULT_ROUND_LEAD);
    let forged = variants(&sim, &genuine);
    let genuine_hash = SignedProof::from_bytes(&genuine)
        .expect("signed")
        .payload_hash();
    for (_, wire, _) in &forged {
        for j in (0..sim.len()).filter(|j| *j != SYBIL) {
            sim.gossip_to(SYBIL, j, &Topic::Proof(0), wire.clone());
        }
    }
    sim.run_until(Duration::from_secs(90));
    let mut hashes = BTreeSet::new();
    for i in 0..sim.len() {
        let core = sim.core(i).expect("every node runs");
        let fin = core.finalized_state().expect("finality runs");
        assert!(fin.proof_count() > 20, "node {i}: finality stalled");
        // The genuine proof the variants were made from is held: gossip reached every node.
        assert!(core.economy().ledger().has_proof(&genuine_hash), "node {i}");
        for (what, _, hash) in &forged {
            assert!(
                !core.economy().ledger().has_proof(hash),
                "node {i}'s live ledger holds {what}"
            );
            assert!(
                !fin.has_proof(hash),
                "node {i}'s finalized state holds {what}"
            );
        }
        hashes.insert(hex::encode(core.economy().state_hash()));
    }
    assert_eq!(hashes.len(), 1, "live ledgers differ: {hashes:?}");
}
