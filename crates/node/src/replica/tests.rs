use super::*;
use neuroshard_model::{ModelConfig, StageSpec};
use neuroshard_train::decode;

/// A one-layer model small enough for exact checks.
pub(crate) fn tiny_config() -> ModelConfig {
    ModelConfig {
        layers: 1,
        d_model: 8,
        heads: 2,
        kv_heads: 2,
        ffn: 16,
        vocab: 32,
        max_seq: 8,
        tie_embeddings: false,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
    }
}

pub(crate) fn params(seed: u64) -> ParamSet {
    let config = tiny_config();
    let spec = StageSpec::full(&config);
    ParamSet::init(spec.param_specs(&config), seed)
}

pub(crate) fn cfg(me: u8, compression: &str) -> DilocoConfig {
    DilocoConfig {
        me: NodeId([me; 32]),
        aggregator: "mean".into(),
        byzantine: 0,
        compression: compression.parse().unwrap(),
        outer_lr: 0.7,
        outer_momentum: 0.9,
        seed: 5,
        attack: Attack::None,
        norm_bound: 0.0,
    }
}

/// Moves every parameter by `by` (stands in for inner steps).
fn train(p: &mut ParamSet, by: f32) {
    let flat: Vec<f32> = p.flatten().iter().map(|x| x + by).collect();
    p.set_flat(&flat).unwrap();
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn replicas_that_aggregate_the_same_offers_hold_the_same_outer_state() {
    let start = params(1);
    let mut p = [start.clone(), start.clone()];
    let mut d = [
        Diloco::new(cfg(1, "randk:0.25:int8"), &start).unwrap(),
        Diloco::new(cfg(2, "randk:0.25:int8"), &start).unwrap(),
    ];
    assert_eq!(d[0].hash(), d[1].hash());
    train(&mut p[0], -0.01);
    train(&mut p[1], -0.03);
    let offers: Vec<(NodeId, Vec<u8>)> = (0..2)
        .map(|i| {
            let o = d[i].prepare(1, &p[i]).unwrap();
            assert!(o.blob.len() * 10 < o.dense_bytes as usize, "compressed");
            (NodeId([i as u8 + 1; 32]), o.blob.to_vec())
        })
        .collect();
    let a = d[0].apply(1, offers.clone(), &mut p[0]).unwrap();
    let b = d[1].apply(1, offers, &mut p[1]).unwrap();
    assert_eq!(a.theta, b.theta);
    assert_eq!(a.contributors.len(), 2);
    assert!(a.rejected.is_empty());
    assert_ne!(a.theta, Diloco::new(cfg(1, "fp32"), &start).unwrap().hash());
    // Each replica restarts from θ₀ minus its own unsent residual, so they differ a little,
    // but both sit next to the new θ₀.
    assert!(max_diff(&p[0].flatten(), d[0].theta()) < 0.05);
    assert!(max_diff(&p[1].flatten(), d[1].theta()) < 0.05);
    // The outer state travels and restores bit for bit.
    let bytes = d[0].outer_bytes();
    let restored = Diloco::restore(cfg(3, "fp32"), &bytes, start.numel()).unwrap();
    assert_eq!(restored.hash(), a.theta);
}

#[test]
fn dense_round_without_drift_restarts_exactly_at_the_new_theta() {
    let start = params(2);
    let (mut p1, mut p2) = (start.clone(), start.clone());
    let mut d1 = Diloco::new(cfg(1, "fp32"), &start).unwrap();
    let mut d2 = Diloco::new(cfg(2, "fp32"), &start).unwrap();
    train(&mut p1, 0.02);
    train(&mut p2, 0.02);
    d1.prepare(1, &p1).unwrap();
    let o2 = d2.prepare(1, &p2).unwrap();
    d1.apply(1, vec![(NodeId([2; 32]), o2.blob.to_vec())], &mut p1)
        .unwrap();
    assert!(max_diff(&p1.flatten(), d1.theta()) < 1e-6);
    // θ₀ moved by lr·(Δ + μ·v) = 0.7·(1 + 0.9)·0.02 along the training direction.
    let moved = d1.theta()[0] - start.flatten()[0];
    assert!((moved - 0.7 * 1.9 * 0.02).abs() < 1e-5, "{moved}");
}

#[test]
fn adopting_keeps_inner_progress_made_during_the_round() {
    let start = params(3);
    let (mut p1, mut p2) = (start.clone(), start.clone());
    let mut d1 = Diloco::new(cfg(1, "fp32"), &start).unwrap();
    let mut d2 = Diloco::new(cfg(2, "fp32"), &start).unwrap();
    train(&mut p1, 0.01);
    train(&mut p2, 0.01);
    let o1 = d1.prepare(1, &p1).unwrap();
    let o2 = d2.prepare(1, &p2).unwrap();
    let both = vec![
        (NodeId([1; 32]), o1.blob.to_vec()),
        (NodeId([2; 32]), o2.blob.to_vec()),
    ];
    // Replica 1 aggregated both; replica 2 only itself (a fetch failed), then trained on.
    let a1 = d1.apply(1, both, &mut p1).unwrap();
    d2.apply(1, Vec::new(), &mut p2).unwrap();
    train(&mut p2, 0.005);
    d2.adopt(1, &a1.outer, true, &mut p2).unwrap();
    assert_eq!(d2.hash(), a1.theta);
    let expect: Vec<f32> = d1.theta().iter().map(|t| t + 0.005).collect();
    assert!(max_diff(&p2.flatten(), &expect) < 1e-5);
}

#[test]
fn malformed_pseudo_gradients_are_left_out_with_a_reason() {
    let start = params(4);
    let mut p = start.clone();
    let mut d = Diloco::new(cfg(1, "fp32"), &start).unwrap();
    train(&mut p, 0.01);
    d.prepare(1, &p).unwrap();
    let short = {
        let small = params(4);
        let mut c = Compressor::new("fp32".parse().unwrap(), small.numel() / 2);
        c.compress(&vec![0.1; small.numel() / 2]).unwrap()
    };
    let messages = vec![
        (NodeId([2; 32]), short),
        (NodeId([3; 32]), b"garbage".to_vec()),
    ];
    let a = d.apply(1, messages, &mut p).unwrap();
    assert_eq!(a.contributors, vec![NodeId([1; 32])]);
    assert_eq!(a.rejected.len(), 2);
    // A round that does not follow ours is refused and changes nothing.
    let before = d.hash();
    assert!(d.apply(5, Vec::new(), &mut p).is_err());
    assert_eq!(d.hash(), before);
}

#[test]
fn bad_state_blobs_are_refused_with_the_reason() {
    let start = params(5);
    let d = Diloco::new(cfg(1, "fp32"), &start).unwrap();
    let bytes = d.outer_bytes();
    let n = start.numel();
    let err = |b: &[u8], len| {
        Diloco::restore(cfg(1, "fp32"), b, len)
            .err()
            .unwrap()
            .to_string()
    };
    assert!(err(&bytes[..bytes.len() - 3], n).contains("truncated"));
    assert!(err(&bytes, n + 1).contains("values"));
    let mut nan = bytes.clone();
    nan[29..33].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(err(&nan, n).contains("non-finite"));
    assert!(err(b"NSADAMW1aaaaaaaa", n).contains("not a NeuroShard"));
    let opt = AdamW::new(AdamWConfig::default(), &start);
    let blob = encode_adamw(&opt);
    let back = decode_adamw(&blob, AdamWConfig::default(), &start).unwrap();
    assert_eq!(back.step_count(), 0);
    assert!(decode_adamw(&blob[..blob.len() - 1], AdamWConfig::default(), &start).is_err());
}

#[test]
fn a_sign_flip_attacker_sends_the_negated_message_but_keeps_honest_books() {
    let start = params(6);
    let mut p = start.clone();
    let mut evil = cfg(1, "fp32");
    evil.attack = Attack::SignFlip;
    let mut d = Diloco::new(evil, &start).unwrap();
    train(&mut p, -0.01);
    let o = d.prepare(1, &p).unwrap();
    let sent = decode(&o.blob, start.numel()).unwrap();
    assert!(
        sent.iter().all(|x| (x + 0.01).abs() < 1e-6),
        "{:?}",
        &sent[..4]
    );
    // Its own books stay honest: after a round that used its (forged) message it restarts
    // at the new θ₀, as an honest replica would, so it keeps serving sensible activations.
    d.apply(1, Vec::new(), &mut p).unwrap();
    assert!(max_diff(&p.flatten(), d.theta()) < 1e-6);
}

/// With low-rank offers the recomputation must decode on the basis the round started from,
/// not the one its own first aggregate led to.
#[test]
fn recomputing_over_a_larger_set_reaches_the_same_state_as_the_replica_that_used_it() {
    for spec in ["randk:0.5:int8", "lowrank:2:int8"] {
        let start = params(7);
        let mut p: Vec<ParamSet> = (0..3).map(|_| start.clone()).collect();
        let mut d: Vec<Diloco> = (1..=3)
            .map(|i| Diloco::new(cfg(i, spec), &start).unwrap())
            .collect();
        let mut offers = Vec::new();
        for (i, by) in [-0.01f32, -0.02, 0.015].into_iter().enumerate() {
            train(&mut p[i], by);
            let o = d[i].prepare(1, &p[i]).unwrap();
            offers.push((NodeId([i as u8 + 1; 32]), o.blob.to_vec()));
        }
        // Replica 1 missed replica 3's offer; replica 2 used all three.
        let a = d[0].apply(1, offers[..2].to_vec(), &mut p[0]).unwrap();
        let b = d[1].apply(1, offers.clone(), &mut p[1]).unwrap();
        assert_ne!(a.theta, b.theta);
        let set: Vec<NodeId> = offers.iter().map(|(n, _)| *n).collect();
        let again = d[0]
            .reapply(1, vec![offers[2].clone()], &set, &mut p[0])
            .unwrap();
        assert_eq!(again.theta, b.theta);
        assert_eq!(again.contributors, set);
        // Its weights sit at the new θ₀ minus its own residual, as if it had used all three.
        assert!(max_diff(&p[0].flatten(), d[0].theta()) < 0.05);
        // A set with an offer it cannot rebuild is refused and changes nothing.
        let before = d[0].hash();
        let unknown = vec![NodeId([9; 32])];
        assert!(d[0].reapply(1, Vec::new(), &unknown, &mut p[0]).is_err());
        assert_eq!(d[0].hash(), before);
    }
}

#[test]
fn a_lone_replica_moves_theta_to_exactly_where_it_trained() {
    let start = params(4);
    let mut p = start.clone();
    let mut d = Diloco::new(cfg(1, "fp32"), &start).unwrap();
    for round in 1..=3 {
        train(&mut p, 0.02);
        let trained = p.flatten();
        d.prepare(round, &p).unwrap();
        d.apply(round, Vec::new(), &mut p).unwrap();
        // Up to the rounding of θ₀ − (θ₀ − θ): a stage with one replica trains as if it had
        // no sync at all (the outer step, lr 0.7 with momentum 0.9, would overshoot it).
        assert!(max_diff(d.theta(), &trained) < 1e-6, "round {round}");
        assert!(max_diff(&p.flatten(), &trained) < 1e-6, "round {round}");
    }
    // No velocity built up while alone: a second replica's first round is a plain outer step.
    let mut q = p.clone();
    let mut e = Diloco::restore(cfg(2, "fp32"), &d.outer_bytes(), start.numel()).unwrap();
    let before = d.theta()[0];
    train(&mut p, 0.01);
    train(&mut q, 0.01);
    d.prepare(4, &p).unwrap();
    let o = e.prepare(4, &q).unwrap();
    d.apply(4, vec![(NodeId([2; 32]), o.blob.to_vec())], &mut p)
        .unwrap();
    let moved = d.theta()[0] - before;
    assert!((moved - 0.7 * 1.9 * 0.01).abs() < 1e-5, "{moved}");
}

#[test]
fn an_offer_re_encodes_from_its_outer_state_and_weights_bit_for_bit() {
    for spec in ["int2", "randk:0.25:int8", "lowrank:2:int8"] {
        let start = params(1);
        let mut p = start.clone();
        let mut d = Diloco::new(cfg(1, spec), &start).unwrap();
        for round in 1..=3u64 {
            train(&mut p, -0.01 * round as f32);
            let outer = d.outer_bytes();
            assert_eq!(*blake3::hash(&outer).as_bytes(), d.hash());
            let offer = d.prepare(round, &p).unwrap();
            let again = recompute_offer(d.config(), &outer, &p.flatten(), &p, round).unwrap();
            assert_eq!(again, *offer.blob, "{spec} round {round}");
            // Last round's pseudo-gradient, sent again, is not this round's offer.
            if round > 1 {
                let mut stale = p.clone();
                train(&mut stale, 0.01);
                let other = recompute_offer(d.config(), &outer, &stale.flatten(), &p, round);
                assert_ne!(other.unwrap(), *offer.blob, "{spec} round {round}");
            }
            d.apply(round, Vec::new(), &mut p).unwrap();
        }
        // Another outer state's bytes, or weights of another length, are refused.
        let outer = d.outer_bytes();
        assert!(recompute_offer(d.config(), &outer[1..], &p.flatten(), &p, 4).is_err());
        assert!(recompute_offer(d.config(), &outer, &p.flatten()[1..], &p, 4).is_err());
    }
}
