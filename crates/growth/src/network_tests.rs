use super::*;

const GIB: u64 = 1 << 30;

fn shape(layers: u64) -> Shape {
    Shape::ladder(256, layers, 4096)
}

fn claims(n: u8, gib: u64) -> Vec<Claim> {
    (0..n)
        .map(|i| Claim {
            node: [i; 32],
            memory_bytes: gib * GIB,
            flops_per_s: 1_000_000_000_000,
        })
        .collect()
}

/// K = 10, horizon one day: 10 nodes of 2 GiB each deepen a 4-layer model (as
/// `neuroshard scale --every 10 --memory-gib 2 --tflops 1 --horizon-days 1` shows).
fn growth(stage_layers: &[u64]) -> NetworkGrowth {
    let mut policy = GrowthPolicy::depth(64);
    policy.rule.every_joins = 10;
    policy.scaler.horizon_s = 86_400;
    let layers = stage_layers.iter().sum();
    NetworkGrowth::new(
        policy,
        Architecture::genesis(shape(layers), stage_layers).unwrap(),
    )
    .unwrap()
}

#[test]
fn a_genesis_layout_must_hold_the_shapes_layers_once_each() {
    assert!(Architecture::genesis(shape(4), &[2, 2]).is_ok());
    assert!(Architecture::genesis(shape(4), &[2, 1]).is_err());
    assert!(Architecture::genesis(shape(4), &[4, 0]).is_err());
    assert!(Architecture::genesis(shape(4), &[]).is_err());
    let mut dup = Architecture::genesis(shape(4), &[2, 2]).unwrap();
    dup.stages[1].id = 0;
    assert!(dup.validate().is_err());
    let mut ladder = GrowthPolicy::depth(64);
    ladder.scaler.candidates = Candidates::Ladder;
    assert!(ladder.validate().is_err(), "width growth is not exact");
}

#[test]
fn new_layers_become_middle_stages_with_new_ids_and_old_stages_keep_theirs() {
    let arch = Architecture::genesis(shape(4), &[2, 2]).unwrap();
    let target = |layers: u64, stages: u64| Target {
        shape: shape(layers),
        params: shape(layers).params().unwrap(),
        stages,
        stage_bytes: 0,
    };
    let one = arch.grown(&target(6, 3)).unwrap();
    assert_eq!(one.version, 1);
    assert_eq!(
        one.stages,
        vec![
            StageLayout { id: 0, layers: 2 },
            StageLayout { id: 2, layers: 2 },
            StageLayout { id: 1, layers: 2 },
        ]
    );
    // 4 → 10 layers where a stage may hold ⌈10/3⌉ = 4: two new stages of 3.
    let two = arch.grown(&target(10, 3)).unwrap();
    let layout: Vec<(u16, u64)> = two.stages.iter().map(|s| (s.id, s.layers)).collect();
    assert_eq!(layout, vec![(0, 2), (2, 3), (3, 3), (1, 2)]);
    // Growing again takes the next free ids.
    let three = one.grown(&target(8, 4)).unwrap();
    assert_eq!(three.version, 2);
    let ids: Vec<u16> = three.stages.iter().map(|s| s.id).collect();
    assert_eq!(ids, vec![0, 2, 3, 1]);
    // One stage grows in place, but cannot split.
    let single = Architecture::genesis(shape(4), &[4]).unwrap();
    assert_eq!(single.grown(&target(6, 1)).unwrap().stages[0].layers, 6);
    assert!(single.grown(&target(6, 2)).is_err());
    // Only deeper, same width.
    assert!(arch.grown(&target(4, 2)).is_err());
    let wider = Target {
        shape: Shape::ladder(384, 6, 4096),
        ..target(6, 2)
    };
    assert!(arch.grown(&wider).is_err());
}

#[test]
fn each_multiple_of_the_join_count_is_evaluated_once() {
    let mut g = growth(&[2, 2]);
    let few = claims(9, 2);
    assert_eq!(g.end_epoch(9, || few.clone()), Evaluated::NotDue);
    let ten = claims(10, 2);
    // Reached in this epoch; the rule runs at the end of the next.
    assert_eq!(
        g.end_epoch(10, || ten.clone()),
        Evaluated::Pending { joins: 10 }
    );
    let Evaluated::Upgraded(up) = g.end_epoch(10, || ten.clone()) else {
        panic!("10 nodes of 2 GiB deepen a 4-layer model");
    };
    assert_eq!(up.epoch, 3);
    assert_eq!(up.joins, 10);
    assert_eq!(up.counted, 10);
    assert!(up.architecture.shape.layers > 4);
    assert_eq!(g.architecture, up.architecture);
    let v = g.architecture.version;
    // The same count at later epochs evaluates nothing.
    assert_eq!(g.end_epoch(10, || ten.clone()), Evaluated::NotDue);
    assert_eq!(g.end_epoch(19, || ten.clone()), Evaluated::NotDue);
    // An epoch that brings 25 joins at once evaluates once, at 30.
    let many = claims(35, 2);
    assert_eq!(
        g.end_epoch(35, || many.clone()),
        Evaluated::Pending { joins: 30 }
    );
    match g.end_epoch(35, || many.clone()) {
        Evaluated::Upgraded(u) => assert_eq!(u.joins, 30),
        Evaluated::Kept { joins, .. } => assert_eq!(joins, 30),
        other => panic!("30 is due: {other:?}"),
    }
    assert_eq!(g.evaluated, 3);
    assert!(g.architecture.version <= v + 1);
    assert_eq!(g.history.len() as u32, g.architecture.version);
}

#[test]
fn sybils_announcing_petabytes_grow_nothing_honest_nodes_would_not() {
    // 7 honest nodes of 1 GiB cannot hold a deeper model at 3 replicas; 3 registered Sybils
    // (f = 3 of 10) announcing a petabyte each are the claims dropped.
    let mut honest = growth(&[2, 2]);
    let mut lied = growth(&[2, 2]);
    let mut sybil = claims(7, 1);
    sybil.extend((0..3).map(|i| Claim {
        node: [100 + i; 32],
        memory_bytes: 1 << 50,
        flops_per_s: u64::MAX,
    }));
    let mut plain = claims(7, 1);
    plain.extend((0..3).map(|i| Claim {
        node: [100 + i; 32],
        memory_bytes: GIB,
        flops_per_s: 1_000_000_000_000,
    }));
    honest.end_epoch(10, || plain.clone());
    lied.end_epoch(10, || sybil.clone());
    let a = honest.end_epoch(10, || plain.clone());
    let b = lied.end_epoch(10, || sybil.clone());
    assert!(
        !matches!(a, Evaluated::Pending { .. } | Evaluated::NotDue),
        "{a:?}"
    );
    assert_eq!(honest.architecture, lied.architecture, "{a:?} {b:?}");
}

#[test]
fn the_hashed_bytes_name_the_version_layout_and_evaluations() {
    let mut g = growth(&[2, 2]);
    let before = g.to_bytes();
    g.end_epoch(10, || claims(10, 2));
    let pending = g.to_bytes();
    assert_ne!(pending, before);
    g.end_epoch(10, || claims(10, 2));
    assert_ne!(g.to_bytes(), pending);
    let mut same = growth(&[2, 2]);
    same.end_epoch(10, || claims(10, 2));
    same.end_epoch(10, || claims(10, 2));
    assert_eq!(g.to_bytes(), same.to_bytes());
}

#[test]
fn the_claims_counted_are_those_final_an_epoch_after_the_crossing() {
    // The crossing epoch holds ten claims of 600 MiB, too little to hold even the current
    // model (its proposer left nine large ones out); the large ones are final in the next
    // epoch, and the rule counts them: the same upgrade as when all came at once.
    let small: Vec<Claim> = claims(10, 1)
        .into_iter()
        .map(|c| Claim {
            memory_bytes: 600 << 20,
            ..c
        })
        .collect();
    let mut all = small.clone();
    all.extend((0..9).map(|i| Claim {
        node: [50 + i; 32],
        memory_bytes: 64 * GIB,
        flops_per_s: 1_000_000_000_000,
    }));
    let mut small_then_large = growth(&[2, 2]);
    small_then_large.end_epoch(10, || small.clone());
    small_then_large.end_epoch(19, || all.clone());
    let mut all_at_once = growth(&[2, 2]);
    all_at_once.end_epoch(19, || all.clone());
    all_at_once.end_epoch(19, || all.clone());
    assert_eq!(
        all_at_once.architecture.version, 1,
        "the large claims allow growth"
    );
    assert_eq!(small_then_large.architecture, all_at_once.architecture);
    assert_eq!(small_then_large.history, all_at_once.history);
}
