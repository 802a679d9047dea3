//! The network genesis: ids, signatures, what a joiner takes, and the protocol it carries.

use super::*;
use neuroshard_proof::fixtures::test_identity;

fn genesis(description: &str, stakes: Vec<(PublicKey, u64)>) -> NetworkGenesis {
    NetworkGenesis {
        dataset_root: [1; 32],
        founded_ms: 1_000,
        protocol: Protocol::from_settings(&crate::settings::tests::settings(0)),
        stakes,
        description: description.into(),
    }
}

#[test]
fn the_id_is_the_hash_of_the_signed_document() -> Result<(), NetworkError> {
    let founder = test_identity(1);
    let a = Network::found(&founder, genesis("a", vec![(founder.public_key(), 5)]))?;
    let again = Network::open(&a.signed)?;
    assert_eq!(again.id, a.id);
    assert_eq!(again.genesis, a.genesis);
    let b = Network::found(&founder, genesis("b", vec![(founder.public_key(), 5)]))?;
    assert_ne!(a.id, b.id);
    let rules = a.ledger_genesis()?.rules;
    assert_eq!(rules.network, a.id);
    assert_eq!(rules.founded_ms, 1_000);
    Ok(())
}

#[test]
fn a_joiner_takes_the_pinned_genesis_and_ignores_planted_ones() -> Result<(), NetworkError> {
    let founder = test_identity(1);
    let ours = Network::found(&founder, genesis("ours", Vec::new()))?;
    // A stranger plants another network under the same key, and garbage.
    let planted = Network::found(&test_identity(9), genesis("planted", Vec::new()))?;
    let values = vec![
        planted.signed.clone(),
        b"garbage".to_vec(),
        ours.signed.clone(),
    ];
    assert_eq!(choose(&values, Some(&ours.id))?.id, ours.id);
    assert!(matches!(
        choose(&values, None),
        Err(NetworkError::Ambiguous(2))
    ));
    assert!(matches!(
        choose(&values[..1], Some(&ours.id)),
        Err(NetworkError::NotFound(_))
    ));
    assert_eq!(choose(&values[1..], None)?.id, ours.id);
    Ok(())
}

/// A joiner that names no network follows its bootstrap peer. Before, it read the DHT's
/// network key, which any stranger can write: it joined a planted genesis found alone,
/// and refused to start when it found two.
#[test]
fn a_joiner_without_an_id_follows_its_bootstrap_peers_and_never_the_dht() -> Result<(), NetworkError>
{
    let ours = Network::found(&test_identity(1), genesis("ours", Vec::new()))?;
    let planted = Network::found(&test_identity(9), genesis("planted", Vec::new()))?;
    let served = vec![ours.signed.clone()];
    let dht = vec![planted.signed.clone()];
    assert_eq!(choose_to_join(&served, &dht, None)?.id, ours.id);
    let both = [planted.signed.clone(), ours.signed.clone()];
    assert_eq!(choose_to_join(&served, &both, None)?.id, ours.id);
    // No answer yet: the planted record is not taken in its place.
    assert!(matches!(
        choose_to_join(&[], &dht, None),
        Err(NetworkError::NotFound(_))
    ));
    // Bootstrap peers of two networks: the user must say which.
    assert!(matches!(
        choose_to_join(&both, &[], None),
        Err(NetworkError::Ambiguous(2))
    ));
    // A pinned id is taken from either source, and only that id.
    assert_eq!(choose_to_join(&[], &both, Some(&ours.id))?.id, ours.id);
    assert_eq!(choose_to_join(&both, &[], Some(&ours.id))?.id, ours.id);
    assert!(matches!(
        choose_to_join(&served, &dht, Some(&[7; 32])),
        Err(NetworkError::NotFound(_))
    ));
    Ok(())
}

/// The weight lag is the network's: a joiner takes it, a genesis naming more than the
/// engine keeps is refused, and one written before the field existed flushed.
#[test]
fn a_growth_policy_travels_in_the_genesis_to_the_ledger_and_joiners() -> Result<(), NetworkError> {
    let founder = test_identity(1);
    let mut g = genesis("grows", Vec::new());
    let fixed = Network::found(&founder, g.clone())?;
    assert!(fixed.ledger_genesis()?.growth.is_none());
    g.protocol.growth = Some(neuroshard_growth::GrowthPolicy::depth(16));
    // New blocks form a stage between the embedding's and the head's: one stage cannot.
    g.protocol.stages = 1;
    assert!(matches!(
        Network::found(&founder, g.clone()),
        Err(NetworkError::Growth(_))
    ));
    g.protocol.stages = 2;
    let grows = Network::found(&founder, g.clone())?;
    let ledger = grows.ledger_genesis()?;
    let arch = &ledger.growth.as_ref().expect("growth").architecture;
    assert_eq!(arch.version, 0);
    assert_eq!(arch.shape.layers, g.protocol.model.layers as u64);
    assert_eq!(arch.stages.len(), g.protocol.stages);
    assert_ne!(ledger.hash(), fixed.ledger_genesis()?.hash());
    let mut joiner = crate::settings::tests::settings(0);
    grows.genesis.protocol.apply_to(&mut joiner);
    assert_eq!(joiner.growth, g.protocol.growth);
    // Width growth is not exact: a genesis asking for it is refused.
    let mut ladder = neuroshard_growth::GrowthPolicy::depth(16);
    ladder.scaler.candidates = neuroshard_growth::Candidates::Ladder;
    g.protocol.growth = Some(ladder);
    assert!(matches!(
        Network::found(&founder, g.clone()),
        Err(NetworkError::Growth(_))
    ));
    // Geneses written before the field did not grow, and a fixed model's genesis is
    // written as they were (so its network id is unchanged).
    let json = serde_json::to_value(&fixed.genesis.protocol).expect("json");
    assert!(json.get("growth").is_none(), "{json}");
    let old: Protocol = serde_json::from_value(json).expect("old protocol");
    assert_eq!(old.growth, None);
    Ok(())
}

/// The layout a growing network agrees on is one the model's pipeline growth realizes:
/// inserting its new stages of identity blocks one by one into the old stages gives the
/// same block ranges, and version 0 is the genesis split.
#[test]
fn an_agreed_layout_is_what_inserting_identity_stages_makes() -> Result<(), NetworkError> {
    let mut settings = crate::settings::tests::settings(0);
    settings.model.layers = 3;
    settings.stages = 3;
    let protocol = Protocol {
        growth: Some(neuroshard_growth::GrowthPolicy::depth(64)),
        ..Protocol::from_settings(&settings)
    };
    let growth = protocol.genesis_growth()?.expect("growth");
    let v0 = growth.architecture.clone();
    // The stages in pipeline order, each as its block count and ends (what the
    // positional growth below makes; block names follow the stage ids instead).
    let specs = |a: &Architecture| -> Vec<(usize, bool, bool)> {
        let l = crate::layout::Layout::of(&settings.model, a).expect("layout");
        l.order()
            .iter()
            .map(|&id| {
                let s = l.spec(id).expect("spec");
                (s.end_layer - s.first_layer, s.embed, s.head)
            })
            .collect()
    };
    let positional = |stages: &[neuroshard_model::StageSpec]| -> Vec<(usize, bool, bool)> {
        stages
            .iter()
            .map(|s| (s.end_layer - s.first_layer, s.embed, s.head))
            .collect()
    };
    let split = neuroshard_model::StageSpec::split(&settings.model, 3)?;
    assert_eq!(specs(&v0), positional(&split));
    let target = |layers: u64, stages: u64| neuroshard_growth::Target {
        shape: Shape { layers, ..v0.shape },
        params: 0,
        stages,
        stage_bytes: 0,
    };
    // 3 → 6 blocks in one new stage, then 6 → 12 in two new stages of 3.
    let v1 = v0.grown(&target(6, 1))?;
    let v2 = v1.grown(&target(12, 4))?;
    for (old, new) in [(&v0, &v1), (&v1, &v2)] {
        let mut config = neuroshard_model::ModelConfig {
            layers: old.shape.layers as usize,
            ..settings.model.clone()
        };
        let mut first = 0;
        let mut stages: Vec<neuroshard_model::StageSpec> = specs(old)
            .into_iter()
            .map(|(blocks, embed, head)| {
                first += blocks;
                neuroshard_model::StageSpec {
                    first_layer: first - blocks,
                    end_layer: first,
                    embed,
                    head,
                }
            })
            .collect();
        let at = old.stages.len().div_ceil(2);
        let added: Vec<u64> = new
            .stages
            .iter()
            .filter(|s| !old.stages.iter().any(|o| o.id == s.id))
            .map(|s| s.layers)
            .collect();
        assert!(!added.is_empty());
        for (k, blocks) in added.iter().enumerate() {
            let g = neuroshard_model::grow_pipeline::insert_identity_stage(
                &config,
                &stages,
                at + k,
                *blocks as usize,
            )?;
            config = g.config;
            stages = g.stages;
        }
        assert_eq!(positional(&stages), specs(new), "{new:?}");
        assert_eq!(config.layers as u64, new.shape.layers);
    }
    Ok(())
}

#[test]
fn the_weight_lag_comes_from_the_genesis_and_is_bounded() -> Result<(), NetworkError> {
    let founder = test_identity(1);
    let mut g = genesis("overlapped", Vec::new());
    g.protocol.weight_lag = 1;
    let ours = Network::found(&founder, g.clone())?;
    let mut joiner = crate::settings::tests::settings(0);
    joiner.weight_lag = 0;
    ours.genesis.protocol.apply_to(&mut joiner);
    assert_eq!(joiner.weight_lag, 1);
    g.protocol.weight_lag = 2;
    assert!(matches!(
        Network::found(&founder, g.clone()),
        Err(NetworkError::WeightLag(2))
    ));
    // More micro-batches than rows, or none: a step would never complete.
    g.protocol.weight_lag = 0;
    for m in [0, g.protocol.batch + 1] {
        g.protocol.micro_batches = m;
        assert!(matches!(
            Network::found(&founder, g.clone()),
            Err(NetworkError::MicroBatches { .. })
        ));
    }
    let mut json = serde_json::to_value(&ours.genesis.protocol).expect("json");
    json.as_object_mut().expect("object").remove("weight_lag");
    let old: Protocol = serde_json::from_value(json).expect("old protocol");
    assert_eq!(old.weight_lag, 0);
    Ok(())
}

#[test]
fn a_joiner_takes_model_and_protocol_from_the_genesis() -> Result<(), NetworkError> {
    let founder = test_identity(1);
    let mut g = genesis("ours", Vec::new());
    g.protocol.model.d_model = 48;
    g.protocol.sync_every = 7;
    g.protocol.activations = "bf16/int4".parse().expect("spec");
    let ours = Network::found(&founder, g)?;
    let mut joiner = crate::settings::tests::settings(0);
    joiner.stages = 9;
    joiner.activations = "f32".parse().expect("spec");
    ours.genesis.protocol.apply_to(&mut joiner);
    assert_eq!(Protocol::from_settings(&joiner), ours.genesis.protocol);
    assert_eq!((joiner.model.d_model, joiner.sync.every), (48, 7));
    assert_eq!(joiner.activations.to_string(), "bf16/int4");
    Ok(())
}

#[test]
fn activation_schemes_in_a_genesis_are_checked_and_default_to_raw() {
    let protocol = Protocol::from_settings(&crate::settings::tests::settings(0));
    let mut json = serde_json::to_value(&protocol).expect("json");
    assert_eq!(json["activations"], "int8/int4");
    // Written before the field existed: those networks ran raw f32.
    json.as_object_mut().expect("object").remove("activations");
    let old: Protocol = serde_json::from_value(json.clone()).expect("old protocol");
    assert_eq!(old.activations, crate::act_codec::ActSpec::UNCOMPRESSED);
    json["activations"] = "int3".into();
    assert!(serde_json::from_value::<Protocol>(json).is_err());
}

#[test]
fn a_bad_genesis_is_refused() {
    let founder = test_identity(1);
    let mut g = genesis("bad", Vec::new());
    g.protocol.stages = g.protocol.model.layers + 1;
    assert!(matches!(
        Network::found(&founder, g),
        Err(NetworkError::Stages { .. })
    ));
    let twice = genesis(
        "twice",
        vec![(founder.public_key(), 1), (founder.public_key(), 2)],
    );
    assert!(matches!(
        Network::found(&founder, twice),
        Err(NetworkError::Stakes(_))
    ));
    let mut signed = Network::found(&founder, genesis("ok", Vec::new()))
        .map(|n| n.signed)
        .unwrap_or_default();
    let last = signed.len() - 1;
    signed[last] ^= 1;
    assert!(Network::open(&signed).is_err());
}

/// The unbonding delay is the genesis's: it reaches every ledger's rules, and a genesis with
/// the default leaves it out, so geneses written before the field keep their bytes and id.
#[test]
fn the_unbonding_delay_comes_from_the_genesis() -> Result<(), NetworkError> {
    let founder = test_identity(1);
    let plain = genesis("plain", vec![(founder.public_key(), 5)]);
    let json = serde_json::to_value(&plain.protocol).expect("json");
    assert!(
        json.get("unbonding_ms").is_none(),
        "the default is left out"
    );
    let old: Protocol = serde_json::from_value(json).expect("old protocol");
    assert_eq!(
        old.unbonding_ms,
        neuroshard_ledger::rules::DEFAULT_UNBONDING_MS
    );
    let mut quick = plain.clone();
    quick.protocol.unbonding_ms = 60_000;
    let a = Network::found(&founder, plain)?;
    let b = Network::found(&founder, quick)?;
    assert_ne!(a.id, b.id);
    assert_eq!(
        a.ledger_genesis()?.rules.unbonding_ms,
        neuroshard_ledger::rules::DEFAULT_UNBONDING_MS
    );
    assert_eq!(b.ledger_genesis()?.rules.unbonding_ms, 60_000);
    assert_eq!(Network::open(&b.signed)?.genesis, b.genesis);
    Ok(())
}

#[test]
fn replicas_started_with_different_seeds_share_the_networks_masks() -> Result<(), NetworkError> {
    use neuroshard_proof::NodeId;
    use neuroshard_train::{Compressor, decode_for, mask_seed};
    let founder = test_identity(1);
    let mut g = genesis("randk", Vec::new());
    g.protocol.compression = "randk:0.25:int8".into();
    let ours = Network::found(&founder, g)?;
    let other = Network::found(&founder, genesis("other", Vec::new()))?;
    assert_ne!(ours.sync_seed(), other.sync_seed());
    let (mut a, mut b) = (
        crate::settings::tests::settings(0),
        crate::settings::tests::settings(0),
    );
    a.seed = 1;
    b.seed = 2;
    ours.genesis.protocol.apply_to(&mut a);
    ours.genesis.protocol.apply_to(&mut b);
    let (me, you) = (NodeId([1; 32]), NodeId([2; 32]));
    let ca = a.diloco(me, ours.sync_seed()).expect("a's config");
    let cb = b.diloco(you, ours.sync_seed()).expect("b's config");
    assert_eq!(ca.seed, cb.seed);
    // A's offer of round 3 decodes on b's mask for round 3.
    let delta: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut compressor = Compressor::with_seed(ca.compression, delta.len(), ca.seed);
    compressor.set_round(3);
    let msg = compressor.compress(&delta).expect("offer");
    let on_b = decode_for(&msg, &cb.compression, mask_seed(cb.seed, 3), delta.len());
    assert!(on_b.is_ok(), "{on_b:?}");
    Ok(())
}
