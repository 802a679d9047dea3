//! Paid inference through a simulated 2-stage network: the caller's signed payment is checked
//! by the entry node, the stage replicas that served sign receipts, and the entry node's
//! settlement is applied by every node's ledger. The payment cannot be replayed, used at
//! another entry node, or over-spent.

use std::time::Duration;

use neuroshard_ledger::{AccountOp, Action, INFERENCE_BURN_BPS};

use neuroshard_node::core::PaymentRefused;
use neuroshard_node::serve::{Completion, OpenError, SampleSpec, ServeEvent};
use neuroshard_sim::{Sim, UNIX_START_MS, real_network, serving_model, settings};

const STAGES: usize = 2;
const REQUEST: [u8; 32] = [5; 32];

fn sim() -> Sim {
    let mut s = settings(serving_model(2), STAGES, 2);
    s.seq = 8;
    // Rounds often, so the nodes earn the balance the payer spends.
    s.sync.every = 4;
    let mut sim = real_network(9, s, 2);
    // No offline founders: finality runs and settles the rounds the nodes are paid for.
    sim.set_spare_keys(0);
    sim
}

fn request(payment: Option<Vec<u8>>) -> Completion {
    Completion {
        prompt: vec![3, 17, 9],
        max_tokens: 6,
        sample: SampleSpec {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 1,
            draws: 0,
        },
        stop_token: None,
        payment,
    }
}

/// The payer's signed `PayInference` op, at its next nonce as node 0's ledger sees it.
fn payment(sim: &Sim, payer: usize, entry: usize, per_stage: u64) -> Vec<u8> {
    let ledger = sim.core(0).unwrap().economy().ledger();
    AccountOp {
        network: ledger.rules().network,
        account: sim.node_id(payer),
        nonce: ledger.account(&sim.node_id(payer)).next_nonce,
        timestamp_ms: UNIX_START_MS + sim.elapsed().as_millis() as u64,
        action: Action::PayInference {
            entry: sim.node_id(entry),
            request: REQUEST,
            per_stage,
            stages: STAGES as u16,
        },
    }
    .sign(sim.identity(payer))
    .to_bytes()
}

fn refused(r: Result<u64, OpenError>) -> PaymentRefused {
    match r {
        Err(OpenError::Payment(m)) => m,
        other => panic!("expected a payment refusal, got {other:?}"),
    }
}

#[test]
fn a_paid_request_is_settled_on_every_ledger_and_its_payment_cannot_be_reused() {
    let mut sim = sim();
    let (payer, entry) = (3, 0);
    let mut t = Duration::from_secs(5);
    let balance = loop {
        sim.run_until(t);
        let b = sim.core(0).unwrap().economy().balance(&sim.node_id(payer));
        if b > 0 {
            break b;
        }
        assert!(
            t < Duration::from_secs(120),
            "the payer never earned anything"
        );
        t += Duration::from_secs(5);
    };
    let per_stage = balance / 10;
    // More than the payer holds.
    let greedy = payment(&sim, payer, entry, balance);
    assert!(matches!(
        refused(sim.open_stream(entry, request(Some(greedy)))),
        PaymentRefused::Balance { .. }
    ));
    // A payment naming node 0 is no good at node 1, even with the same fee.
    let paid = payment(&sim, payer, entry, per_stage);
    assert!(matches!(
        refused(sim.open_stream(1, request(Some(paid.clone())))),
        PaymentRefused::OtherEntry(_)
    ));
    // Garbage.
    assert!(matches!(
        refused(sim.open_stream(entry, request(Some(vec![1, 2, 3])))),
        PaymentRefused::Envelope(_)
    ));

    let burned_before: Vec<u64> = (0..sim.len())
        .map(|i| sim.core(i).unwrap().economy().ledger().burned())
        .collect();
    let nonce = sim
        .core(0)
        .unwrap()
        .economy()
        .ledger()
        .account(&sim.node_id(payer))
        .next_nonce;
    let stream = sim
        .open_stream(entry, request(Some(paid.clone())))
        .expect("a good payment opens the stream");
    // The same payment for a second stream while the first is served.
    assert!(matches!(
        refused(sim.open_stream(entry, request(Some(paid.clone())))),
        PaymentRefused::InProgress
    ));
    sim.run_until(sim.elapsed() + Duration::from_secs(15));
    let tokens = sim
        .served(entry)
        .iter()
        .filter(|e| matches!(e, ServeEvent::Token { stream: s, .. } if *s == stream))
        .count();
    assert_eq!(tokens, 6, "{:?}", sim.served(entry));
    // Both stages signed receipts: every ledger charged the payer and burned a tenth of
    // each stage's fee.
    let burn = neuroshard_ledger::amount::bps_of(per_stage, INFERENCE_BURN_BPS);
    for (i, before) in burned_before.iter().enumerate() {
        let ledger = sim.core(i).unwrap().economy().ledger();
        assert_eq!(
            ledger.account(&sim.node_id(payer)).next_nonce,
            nonce + 1,
            "node {i} did not apply the settlement"
        );
        assert_eq!(ledger.burned(), before + 2 * burn, "node {i}");
    }
    // Settled: the payment is spent and opens nothing again.
    assert!(matches!(
        refused(sim.open_stream(entry, request(Some(paid)))),
        PaymentRefused::Nonce { .. }
    ));
}

#[test]
fn a_paid_only_node_refuses_free_requests() {
    let mut sim = sim();
    sim.run_until(Duration::from_secs(2));
    let core = sim.core_mut(0).unwrap();
    core.set_serve_limits(neuroshard_node::serve::ServeLimits {
        paid_only: true,
        ..Default::default()
    });
    assert!(matches!(
        refused(sim.open_stream(0, request(None))),
        PaymentRefused::PaidOnly
    ));
    // Another node, left free, serves it.
    assert!(sim.open_stream(1, request(None)).is_ok());
}
