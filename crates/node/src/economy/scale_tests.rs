//! Agreement at scale: more proofs than anti-entropy once carried (131,072), equivocations
//! among them, applied in two orders and fetched whole by a late joiner, end on one state.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Proof, Receipt, ReceiptKind};

use super::antientropy_tests::sync_with;
use super::tests::{T, decode, economy, grad, register, work};
use super::*;

/// Staked keys proving (the test genesis stakes seeds 1 to 89).
const KEYS: u64 = 80;
/// Rounds each key proves: 80 × 1,650 = 132,000 proofs.
const ROUNDS: u64 = 1_650;

fn drain(e: &mut Economy) {
    while e.poll_write().is_some() {}
}

/// Each key's proofs of rounds 1 to [`ROUNDS`], receipted by the next key: the key's own
/// economy makes its proof of round 1, and the later ones are that proof with the round's
/// fields, receipt and signature (two signatures a proof, where the economy's own path also
/// verifies and applies each: half the time of a test that is mostly signing).
fn proofs(provers: &mut [Economy]) -> Vec<Vec<u8>> {
    let n = provers.len();
    let templates: Vec<Proof> = (0..n)
        .map(|k| {
            let receipt =
                provers[(k + 1) % n].receipt_for(provers[k].node_id(), 1, grad(&provers[k], 1));
            let p = &mut provers[k];
            p.record_round(work(p, 1));
            assert!(matches!(p.on_receipt(1, receipt), Ok(true)));
            match p.poll_proof(T) {
                Some(Ok(wire)) => decode(&wire),
                other => panic!("expected a proof, got {other:?}"),
            }
        })
        .collect();
    let per_key = |k: usize| -> Vec<Vec<u8>> {
        let (id, witness) = (
            test_identity(k as u64 + 1),
            test_identity(((k + 1) % n) as u64 + 1),
        );
        let t = &templates[k];
        (1..=ROUNDS)
            .map(|round| {
                let mut p = t.clone();
                p.round = round;
                p.nonce = t.nonce + round - 1;
                p.pseudo_gradient_hash = grad(&provers[k], round);
                p.shards = work(&provers[k], round).shards;
                p.receipts = vec![Receipt::sign(
                    &witness,
                    p.network,
                    p.node_id,
                    round,
                    ReceiptKind::Gradients,
                    p.pseudo_gradient_hash,
                )];
                p.sign(&id).to_bytes()
            })
            .collect()
    };
    let per_key = &per_key;
    // Half the keys on another thread, half on this one.
    let mut by_key: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        let first = s.spawn(move || (0..n / 2).map(per_key).collect::<Vec<_>>());
        let second: Vec<_> = (n / 2..n).map(per_key).collect();
        let mut all = first.join().expect("no panic");
        all.extend(second);
        all
    });
    // In the order a network makes them: round by round.
    let mut wires = Vec::with_capacity(n * ROUNDS as usize);
    for r in 0..ROUNDS as usize {
        for list in &mut by_key {
            wires.push(std::mem::take(&mut list[r]));
        }
    }
    wires
}

/// 80 registered keys prove 1,650 rounds each, every proof receipted by the next key, and ten
/// of them equivocate once (a second proof of a round claiming four times the work). Node `a`
/// takes them in the order made, `b` shuffled; a late joiner gets everything from `b` through
/// anti-entropy sessions. All three end on one state hash holding every proof. The joiner used
/// to stop short for good (105,418 of 132,010): a session's 64 round trips cover ~120,000 ids,
/// reconciled in hash order, so the registrations sorted past them never came, and every
/// later session re-fetched the low proofs that waited for them. Ops now reconcile first.
#[test]
fn more_than_131072_proofs_with_equivocations_and_a_late_joiner_end_on_one_state() {
    let mut provers: Vec<Economy> = (1..=KEYS).map(economy).collect();
    let ops: Vec<Vec<u8>> = provers.iter_mut().map(register).collect();
    for p in &mut provers {
        for op in &ops {
            p.on_op(op, T);
        }
    }
    let mut wires = proofs(&mut provers);
    let made = wires.len();
    for k in (0..KEYS).step_by(8) {
        let (round, id) = (100 + k * 13, test_identity(k + 1));
        // Round by round, key by key.
        let honest = decode(&wires[((round - 1) * KEYS + k) as usize]);
        assert_eq!((honest.round, honest.node_id), (round, id.node_id()));
        let mut again = honest;
        again.nonce += 1_000_000;
        again.tokens *= 4;
        again.batches *= 4;
        again.timestamp_ms += 60_000;
        wires.push(again.sign(&id).to_bytes());
    }
    assert_eq!(made, 132_000);

    let (mut a, mut b, mut joiner) = (economy(81), economy(82), economy(83));
    let mut shuffled = wires.clone();
    shuffled.shuffle(&mut ChaCha8Rng::seed_from_u64(5));
    std::thread::scope(|s| {
        for (node, order) in [(&mut a, &wires), (&mut b, &shuffled)] {
            let ops = &ops;
            s.spawn(move || {
                for op in ops {
                    node.on_op(op, T);
                }
                for w in order {
                    node.on_proof(w, T + 120_000);
                }
                drain(node);
            });
        }
    });
    assert_eq!(a.proof_count(), wires.len());
    assert_eq!(a.state_hash(), b.state_hash());
    // Equivocation was settled alike whichever proof of a pair came first.
    for k in (0..KEYS).step_by(8) {
        let id = test_identity(k + 1).node_id();
        assert!(a.ledger().account(&id).stake < b.ledger().account(&provers[1].node_id()).stake);
    }

    let mut sessions = 0;
    loop {
        let (summary, _) = sync_with(&mut joiner, &mut b, T + 180_000, 8 << 20);
        drain(&mut joiner);
        sessions += 1;
        if summary.applied == 0 || sessions == 10 {
            break;
        }
    }
    assert_eq!(
        joiner.proof_count(),
        b.proof_count(),
        "after {sessions} sessions"
    );
    assert_eq!(joiner.state_hash(), b.state_hash());
    assert!(sessions <= 4, "{sessions} sessions");
}
