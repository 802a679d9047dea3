//! Start-up in a network that grew: the version the most peers name, a new stage nobody
//! holds chosen first and started as identity blocks, and lies from a few keys outvoted.

use super::*;
use crate::records::ArchView;

/// Version 1 of a 2-stage, 4-block model: one block in a new stage 2 between stages 0 and 1.
fn v1() -> ArchView {
    ArchView {
        version: 1,
        stages: vec![(0, 2), (2, 1), (1, 2)],
    }
}

fn growing() -> StartupConfig {
    StartupConfig {
        grows: true,
        need: vec![100; 2],
        budget: 1 << 40,
        ..config(2)
    }
}

/// Listens (providers: `held[s]` for each stage id looked up), hears `beats`, settles.
fn choose(cfg: StartupConfig, beats: &[(u8, u16, ArchView)]) -> (Startup, Request) {
    let t0 = Instant::now();
    let mut m = Startup::new(cfg, t0, UNIX);
    drain(&mut m);
    let asked = providers_asked(&mut m, t0);
    for (i, stage, arch) in beats {
        let id = test_identity(u64::from(*i));
        m.handle_gossip(
            id.node_id(),
            &heartbeat_naming(&id, NET, *stage, arch.clone()),
            t0,
        );
    }
    for s in asked {
        m.handle_providers(s, Vec::new(), t0);
    }
    m.handle_timeout(t0 + SETTLE);
    let load = drain(&mut m).pop().expect("a load request");
    (m, load)
}

#[test]
fn a_joiner_takes_the_new_stage_nobody_holds_and_starts_it_as_identity_blocks() {
    let beats = [(1, 0, v1()), (2, 0, v1()), (3, 1, v1()), (4, 1, v1())];
    let (m, load) = choose(growing(), &beats);
    assert_eq!(
        load,
        Request::Load {
            stage: 2,
            init: Init::Fresh
        }
    );
    let (model, spec, born) = m.stage_model(2).expect("stage 2 of version 1");
    assert!(born, "a stage the network grew starts as identity blocks");
    assert_eq!((spec.first_layer, spec.end_layer), (4, 5));
    assert!(!spec.embed && !spec.head);
    assert_eq!(model.layers, 5);
    // The genesis stages are what they always were.
    assert_eq!(
        m.stage_model(1),
        Some((super::model(), config(2).specs[1], false))
    );
}

#[test]
fn a_few_keys_naming_a_made_up_version_are_outvoted() {
    let fake = ArchView {
        version: 9,
        stages: vec![(0, 2), (2, 40), (1, 2)],
    };
    let beats = [
        (1, 0, v1()),
        (2, 1, v1()),
        (3, 1, v1()),
        (7, 0, fake.clone()),
        (8, 1, fake),
    ];
    let (m, load) = choose(growing(), &beats);
    assert!(matches!(load, Request::Load { stage: 2, .. }));
    assert_eq!(m.stage_model(2).map(|(_, s, _)| s.end_layer), Some(5));
}

#[test]
fn a_view_that_is_not_this_model_grown_is_ignored_with_a_warning() {
    // Blocks that do not add up to a model: version 0's stages are chosen among.
    let broken = ArchView {
        version: 1,
        stages: vec![(0, 2), (0, 1), (1, 2)],
    };
    let (mut m, load) = choose(growing(), &[(1, 0, broken.clone()), (2, 1, broken)]);
    assert!(matches!(load, Request::Load { stage: 0 | 1, .. }));
    assert!(m.stage_model(2).is_none());
    assert!(warnings(&mut m).iter().any(|w| w.contains("version 1")));
}

#[test]
fn a_network_that_never_grows_ignores_architecture_views() {
    let (m, load) = choose(config(2), &[(1, 0, v1()), (2, 1, v1())]);
    assert!(matches!(load, Request::Load { stage: 0 | 1, .. }));
    assert!(m.stage_model(2).is_none());
}
