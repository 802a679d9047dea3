//! A new middle stage of identity blocks: the pipeline computes the same function bit for bit,
//! and no existing stage's values or optimizer state change.

mod common;

use neuroshard_model::grow_pipeline::{continue_stage, identity_stage, insert_identity_stage};
use neuroshard_model::{
    AdamW, AdamWConfig, Generator, ParamSet, Stage, StageInput, StageSpec, Trainer,
};

const VOCAB: usize = 48;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `full`'s values for the tensors of `spec`.
fn cut(full: &Stage, spec: StageSpec) -> Stage {
    let config = full.config().clone();
    let specs = spec.param_specs(&config);
    let values = specs
        .iter()
        .map(|s| full.params().get(&s.name).unwrap().to_vec())
        .collect();
    Stage::from_params(config, spec, ParamSet::from_values(specs, values).unwrap()).unwrap()
}

/// The whole model assembled by name from pipeline stages.
fn assemble(stages: &[Stage]) -> Stage {
    let config = stages[0].config().clone();
    let spec = StageSpec::full(&config);
    let specs = spec.param_specs(&config);
    let values = specs
        .iter()
        .map(|s| {
            stages
                .iter()
                .find_map(|st| st.params().get(&s.name))
                .unwrap()
                .to_vec()
        })
        .collect();
    Stage::from_params(config, spec, ParamSet::from_values(specs, values).unwrap()).unwrap()
}

#[test]
fn a_new_middle_stage_of_identity_blocks_changes_no_bit() {
    let mut config = common::small_config(VOCAB);
    config.layers = 4;
    let mut trainer = Trainer::new(config.clone(), AdamWConfig::default(), 6).unwrap();
    let mut rng = common::rng(2);
    for _ in 0..3 {
        trainer
            .step(&common::random_batch(&mut rng, VOCAB, 4, 16))
            .unwrap();
    }
    let specs = StageSpec::split(&config, 2).unwrap();
    let old: Vec<Stage> = specs.iter().map(|s| cut(&trainer.stage, *s)).collect();
    let opts: Vec<AdamW> = old
        .iter()
        .map(|s| AdamW::new(AdamWConfig::default(), s.params()))
        .collect();

    let growth = insert_identity_stage(&config, &specs, 1, 2).unwrap();
    assert_eq!(growth.inserted(), 2..4);
    let mut grown = Vec::new();
    for (i, from) in growth.from.iter().enumerate() {
        match from {
            Some(o) => {
                let (stage, opt) = continue_stage(&old[*o], Some(&opts[*o]), &growth, i).unwrap();
                // The same values and moments in the same order; only names moved.
                assert_eq!(
                    bits(&stage.params().flatten()),
                    bits(&old[*o].params().flatten())
                );
                assert_eq!(opt.unwrap().moments(), opts[*o].moments());
                grown.push(stage);
            }
            None => grown.push(identity_stage(&growth, 77).unwrap()),
        }
    }
    assert!(continue_stage(&old[0], None, &growth, 1).is_err());
    assert!(continue_stage(&old[1], None, &growth, 0).is_err());

    // Through the pipeline: the identity stage hands on its input unchanged, the last stage
    // computes the same per-token losses.
    let batch = common::random_batch(&mut common::rng(9), VOCAB, 3, 16);
    let acts = old[0].forward(&batch.input()).unwrap();
    let acts2 = grown[0].forward(&batch.input()).unwrap();
    assert_eq!(bits(&acts.data), bits(&acts2.data));
    let through = grown[1]
        .forward(&StageInput::Hidden(acts2.clone()))
        .unwrap();
    assert_eq!(bits(&acts.data), bits(&through.data));
    let a = old[1]
        .token_losses(&StageInput::Hidden(acts), &batch.targets)
        .unwrap();
    let b = grown[2]
        .token_losses(&StageInput::Hidden(through), &batch.targets)
        .unwrap();
    assert_eq!(bits(&a), bits(&b));

    // Assembled, the grown model's logits equal the old model's.
    let tokens: Vec<u32> = (0..30).map(|i| (i * 5 % VOCAB) as u32).collect();
    let before = Generator::new(trainer.stage.clone())
        .unwrap()
        .logits(&tokens)
        .unwrap();
    let after = Generator::new(assemble(&grown))
        .unwrap()
        .logits(&tokens)
        .unwrap();
    assert_eq!(bits(&before), bits(&after));
}
