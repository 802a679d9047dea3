use neuroshard_growth::{Architecture, StageLayout};

use super::*;
use crate::network::shape_of;

fn model(layers: usize) -> ModelConfig {
    let mut m = ModelConfig::tiny(64);
    m.layers = layers;
    m
}

/// Version 1 of a 3-stage, 4-block network: a stage of 3 identity blocks (id 3) between
/// stages 1 and 2.
fn grown() -> (ModelConfig, Architecture) {
    let base = model(4);
    let mut shape = shape_of(&base);
    shape.layers = 7;
    let arch = Architecture {
        version: 1,
        shape,
        stages: vec![
            StageLayout { id: 0, layers: 2 },
            StageLayout { id: 1, layers: 1 },
            StageLayout { id: 3, layers: 3 },
            StageLayout { id: 2, layers: 1 },
        ],
    };
    (base, arch)
}

#[test]
fn a_fixed_network_is_its_stages_in_order() {
    let l = Layout::fixed(&model(4), 3).unwrap();
    assert_eq!(l.order(), &[0, 1, 2]);
    assert_eq!(l.next(0), Some(1));
    assert_eq!(l.next(2), None);
    assert_eq!(l.prev(0), None);
    assert_eq!(l.prev(2), Some(1));
    assert!(l.is_first(0) && l.is_last(2) && !l.is_last(1));
    assert_eq!(l.after(0), 2);
    assert_eq!(l.block_order(), vec![0, 1, 2, 3]);
    let split = StageSpec::split(&model(4), 3).unwrap();
    for (i, s) in split.iter().enumerate() {
        assert_eq!(l.spec(i), Some(*s));
    }
}

#[test]
fn a_new_stage_sits_in_the_order_but_takes_the_next_block_indices() {
    let (base, arch) = grown();
    let l = Layout::of(&base, &arch).unwrap();
    assert_eq!(l.order(), &[0, 1, 3, 2]);
    assert_eq!((l.next(1), l.next(3), l.next(2)), (Some(3), Some(2), None));
    assert_eq!((l.prev(2), l.prev(3)), (Some(3), Some(1)));
    // Existing stages hold what they held at version 0 (same names, same hashes).
    let v0 = Layout::fixed(&base, 3).unwrap();
    for id in 0..3 {
        assert_eq!(l.spec(id), v0.spec(id));
    }
    let new = l.spec(3).unwrap();
    assert_eq!((new.first_layer, new.end_layer), (4, 7));
    assert!(!new.embed && !new.head);
    assert_eq!(l.model().layers, 7);
    // Pipeline order: stage 0's blocks, stage 1's, the new ones, then the head's.
    assert_eq!(l.block_order(), vec![0, 1, 2, 4, 5, 6, 3]);
}

#[test]
fn layouts_route_by_version_and_know_every_neighbour() {
    let (base, arch) = grown();
    let mut all = Layouts::fixed(&base, 3).unwrap();
    assert!(all.insert(Layout::of(&base, &arch).unwrap()));
    assert!(!all.insert(Layout::of(&base, &arch).unwrap()));
    assert_eq!(all.newest().version(), 1);
    assert_eq!(all.get(0).unwrap().next(1), Some(2));
    assert_eq!(all.get(1).unwrap().next(1), Some(3));
    assert_eq!(all.near(1), BTreeSet::from([0, 1, 2, 3]));
    assert_eq!(all.near(2), BTreeSet::from([1, 2, 3]));
    assert_eq!(all.stages(), BTreeSet::from([0, 1, 2, 3]));
    let model_of = |s| all.newest().stage_model(s);
    assert_eq!(model_of(2).unwrap().layers, 4);
    assert_eq!(model_of(3).unwrap().layers, 7);
    assert_eq!(model_of(9), None);
}

#[test]
fn an_architecture_that_is_not_this_model_is_refused() {
    let (base, mut arch) = grown();
    let mut wider = arch.clone();
    wider.shape.d_model *= 2;
    assert!(matches!(
        Layout::of(&base, &wider),
        Err(LayoutError::Shape(_))
    ));
    let mut dup = arch.clone();
    dup.stages[2].id = 1;
    assert_eq!(Layout::of(&base, &dup), Err(LayoutError::Duplicate(1)));
    arch.stages[2].layers = 4;
    assert!(matches!(
        Layout::of(&base, &arch),
        Err(LayoutError::Blocks { .. })
    ));
    arch.stages.clear();
    assert_eq!(Layout::of(&base, &arch), Err(LayoutError::Empty));
}
