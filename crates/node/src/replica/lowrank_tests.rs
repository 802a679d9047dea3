//! DiLoCo rounds with compressed offers: low-rank bases from each replica's outer state, and the
//! network's offer format, which a replica may not choose for itself.

use super::tests::{cfg, params};
use super::*;

/// Moves every parameter by a seeded pseudo-random amount (inner steps that differ per replica).
fn train_noisy(p: &mut ParamSet, seed: u64) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let flat: Vec<f32> = p
        .flatten()
        .iter()
        .map(|x| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            x + ((s % 2001) as f32 / 1000.0 - 1.0) * 0.01
        })
        .collect();
    p.set_flat(&flat).unwrap();
}

fn offers(d: &mut [Diloco], p: &[ParamSet], round: u64) -> Vec<(NodeId, Vec<u8>)> {
    d.iter_mut()
        .zip(p)
        .map(|(d, p)| {
            let o = d.prepare(round, p).unwrap();
            assert!(o.blob.len() * 2 < o.dense_bytes as usize, "compressed");
            (d.cfg.me, o.blob.to_vec())
        })
        .collect()
}

/// Three replicas (node ids 1–3) from one seeded start, offering in `spec`.
fn three(seed: u64, spec: &str) -> (Vec<ParamSet>, Vec<Diloco>) {
    let start = params(seed);
    let d = (1..=3)
        .map(|i| Diloco::new(cfg(i, spec), &start).unwrap())
        .collect();
    (vec![start; 3], d)
}

/// Round 1 with replica 3 aggregating its own offer alone and the others all three (so it
/// holds another previous aggregate, hence another basis), then everyone's round 2 offers.
fn split_round_one_then_offer(
    d: &mut [Diloco],
    p: &mut [ParamSet],
    seed: u64,
) -> Vec<(NodeId, Vec<u8>)> {
    for (i, p) in p.iter_mut().enumerate() {
        train_noisy(p, seed + i as u64);
    }
    let sent = offers(d, p, 1);
    for (i, (d, p)) in d.iter_mut().zip(p.iter_mut()).enumerate() {
        let input = if i == 2 {
            vec![sent[2].clone()]
        } else {
            sent.clone()
        };
        d.apply(1, input, p).unwrap();
    }
    for (i, p) in p.iter_mut().enumerate() {
        train_noisy(p, seed + 7 + i as u64);
    }
    offers(d, p, 2)
}

#[test]
fn low_rank_replicas_agree_round_after_round_and_the_basis_moves() {
    let (mut p, mut d) = three(1, "lowrank:2:int8");
    let mut blobs = Vec::new();
    for round in 1..=3 {
        for (i, p) in p.iter_mut().enumerate() {
            train_noisy(p, round * 10 + i as u64);
        }
        let sent = offers(&mut d, &p, round);
        blobs.push(sent[0].1.clone());
        let mut thetas = Vec::new();
        for (d, p) in d.iter_mut().zip(p.iter_mut()) {
            let a = d.apply(round, sent.clone(), p).unwrap();
            assert!(a.rejected.is_empty(), "{:?}", a.rejected);
            assert_eq!(a.contributors.len(), 3);
            thetas.push(a.theta);
        }
        assert!(thetas.iter().all(|t| *t == thetas[0]), "round {round}");
    }
    // Each round's basis is another one (its id is in bytes 3..11).
    assert_ne!(blobs[0][3..11], blobs[1][3..11]);
    assert_ne!(blobs[1][3..11], blobs[2][3..11]);
}

#[test]
fn an_offer_built_on_another_theta_history_is_refused_not_misread() {
    let (mut p, mut d) = three(2, "lowrank:2:fp32");
    // Replica 3's round 1 differs, so its round 2 offer is on another basis.
    let sent = split_round_one_then_offer(&mut d, &mut p, 0);
    let a = d[0].apply(2, sent.clone(), &mut p[0]).unwrap();
    let b = d[1].apply(2, sent, &mut p[1]).unwrap();
    assert_eq!(a.theta, b.theta);
    assert_eq!(a.contributors.len(), 2);
    assert_eq!(a.rejected.len(), 1);
    assert_eq!(a.rejected[0].0, NodeId([3; 32]));
    assert!(
        a.rejected[0].1.contains("another basis"),
        "{:?}",
        a.rejected
    );
}

/// Round 1 of three replicas offering in `spec`, except those `liars` replaces with their own
/// configurations, as replica 1 aggregates it.
fn round_one_at_replica_one(spec: &str, liars: Vec<(usize, DilocoConfig)>, seed: u64) -> Applied {
    let (mut p, mut d) = three(seed, spec);
    let start = p[0].clone();
    for (i, config) in liars {
        d[i] = Diloco::new(config, &start).unwrap();
    }
    for (i, p) in p.iter_mut().enumerate() {
        train_noisy(p, 10 * seed + i as u64);
    }
    let sent = offers(&mut d, &p, 1);
    d[0].apply(1, sent, &mut p[0]).unwrap()
}

/// A replica may not pick its own precision: a well-formed offer on the round's basis in
/// another coding than the network's is refused (an auditor would re-encode it differently).
#[test]
fn a_low_rank_offer_in_another_coding_is_refused() {
    let a = round_one_at_replica_one("lowrank:2:int8", vec![(2, cfg(3, "lowrank:2:sign"))], 3);
    assert_eq!(a.contributors.len(), 2);
    assert_eq!(a.rejected.len(), 1, "{:?}", a.rejected);
    assert_eq!(a.rejected[0].0, NodeId([3; 32]));
    assert!(
        a.rejected[0].1.contains("not this network's"),
        "{:?}",
        a.rejected
    );
}

/// The same for sparse offers: a replica that draws its own random mask (another seed) or
/// sends a larger fraction puts values where no honest replica does, and is refused.
#[test]
fn a_sparse_offer_with_its_own_mask_or_fraction_is_refused() {
    let mut own_mask = cfg(2, "randk:0.25:int2");
    own_mask.seed += 1;
    let larger = cfg(3, "randk:0.5:int2");
    let a = round_one_at_replica_one("randk:0.25:int2", vec![(1, own_mask), (2, larger)], 4);
    assert_eq!(a.contributors, vec![NodeId([1; 32])]);
    let reasons: Vec<&str> = a.rejected.iter().map(|(_, why)| why.as_str()).collect();
    assert_eq!(a.rejected.len(), 2, "{reasons:?}");
    assert!(
        reasons[0].contains("mask is not this network's"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("count is not this network's"),
        "{reasons:?}"
    );
}

#[test]
fn a_forged_low_rank_offer_lands_in_the_rounds_subspace_and_is_clipped() {
    let start = params(3);
    let mut p = [start.clone(), start.clone(), start.clone()];
    let mut honest: Vec<Diloco> = (1..=3)
        .map(|i| {
            let mut c = cfg(i, "lowrank:2:int8");
            c.norm_bound = 3.0;
            Diloco::new(c, &start).unwrap()
        })
        .collect();
    for (i, p) in p.iter_mut().enumerate() {
        train_noisy(p, 30 + i as u64);
    }
    let mut sent = offers(&mut honest, &p, 1);
    // The attacker scales its Δ a thousandfold, in the network's encoding.
    let delta: Vec<f32> = honest[2]
        .outer
        .pseudo_gradient(&p[2].flatten())
        .unwrap()
        .iter()
        .map(|x| x * 1000.0)
        .collect();
    let forged = honest[2].encode_offer(&delta, &p[2]).unwrap();
    let decoded = honest[0].decode_offer(&forged, &p[0]).unwrap();
    sent[2] = (NodeId([3; 32]), forged);
    let a = honest[0].apply(1, sent, &mut p[0]).unwrap();
    assert_eq!(a.clipped.len(), 1, "the norm bound shortens it");
    assert!(decoded.iter().all(|x| x.is_finite()));
    // θ₀ moves by about an honest offer's size (the outer step's 1.33× at the first round,
    // inputs clipped to 3× the median), not by a third of the forged one.
    let honest_size = d_norm(decoded) / 1000.0;
    let moved = d_norm(d_theta(&honest[0], &start));
    assert!(moved < 6.0 * honest_size, "{moved} vs {honest_size}");
}

fn d_theta(d: &Diloco, start: &ParamSet) -> Vec<f32> {
    d.theta()
        .iter()
        .zip(start.flatten())
        .map(|(a, b)| a - b)
        .collect()
}

fn d_norm(v: Vec<f32>) -> f64 {
    v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
}

/// A replica that offered a round and then adopted another state for the round before decodes
/// the round on the adopted state's basis, not on the one its own offer was built on.
#[test]
fn a_replica_that_adopts_another_state_after_offering_decodes_on_the_adopted_basis() {
    let (mut p, mut d) = three(4, "lowrank:2:int8");
    let sent = split_round_one_then_offer(&mut d, &mut p, 40);
    // Then it takes the others' state of round 1 (as the majority rule would have it).
    let majority = d[0].outer_bytes();
    d[2].adopt(1, &majority, true, &mut p[2]).unwrap();
    assert_eq!(d[2].hash(), d[0].hash());
    let a = d[0].apply(2, sent.clone(), &mut p[0]).unwrap();
    let c = d[2].apply(2, sent, &mut p[2]).unwrap();
    let honest = [NodeId([1; 32]), NodeId([2; 32])];
    assert_eq!(a.contributors, honest);
    assert_eq!(c.contributors, honest, "{:?}", c.rejected);
    assert_eq!(a.theta, c.theta);
}
