//! Depth growth by identity blocks is exact: the grown model computes the old model's function
//! bit for bit, and the first step after growth moves exactly what the design says it moves.

mod common;

use neuroshard_model::grow::{self, Architecture};
use neuroshard_model::{
    AdamWConfig, Batch, Generator, SpecialTokens, Trainer, checkpoint, export_hf,
};

const VOCAB: usize = 48;

/// A small model trained a few steps, so no tensor is still at its initial value.
fn trained(clip_norm: Option<f64>) -> Trainer {
    let optim = AdamWConfig {
        lr: 3e-3,
        warmup_steps: 2,
        total_steps: 50,
        clip_norm,
        ..Default::default()
    };
    let mut trainer = Trainer::new(common::small_config(VOCAB), optim, 11).unwrap();
    trainer.micro_batches = 2;
    let mut rng = common::rng(5);
    for _ in 0..4 {
        let batch = common::random_batch(&mut rng, VOCAB, 4, 16);
        trainer.step(&batch).unwrap();
    }
    trainer
}

fn batch() -> Batch {
    common::random_batch(&mut common::rng(99), VOCAB, 4, 16)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The old layer a grown layer came from, or None for an identity block.
fn old_layer(grown: usize, inserted: &[usize]) -> Option<usize> {
    (!inserted.contains(&grown)).then(|| grown - inserted.iter().filter(|&&i| i < grown).count())
}

/// The old model's name for a tensor of the grown model (None: an identity block's tensor).
fn old_name(name: &str, inserted: &[usize]) -> Option<String> {
    let Some(rest) = name.strip_prefix("model.layers.") else {
        return Some(name.to_string());
    };
    let (layer, tensor) = rest.split_once('.').unwrap();
    old_layer(layer.parse().unwrap(), inserted).map(|l| format!("model.layers.{l}.{tensor}"))
}

#[test]
fn grown_model_logits_equal_the_old_models_bitwise() {
    let old = trained(Some(1.0));
    // Blocks at the bottom, in the middle (two together) and at the top of 3 layers.
    let mut grown = old.clone();
    let growth = grown.grow_depth(&[0, 2, 2, 3]).unwrap();
    assert_eq!(growth.from_layers, 3);
    assert_eq!(growth.to_layers, 7);
    assert_eq!(growth.inserted, vec![0, 3, 4, 6]);
    assert_eq!(grown.stage.config().layers, 7);
    assert_eq!(grown.architecture.version, 1);
    assert_ne!(grown.stage.model_hash(), old.stage.model_hash());

    let tokens: Vec<u32> = (0..40).map(|i| (i * 7 % VOCAB) as u32).collect();
    let a = Generator::new(old.stage.clone())
        .unwrap()
        .logits(&tokens)
        .unwrap();
    let b = Generator::new(grown.stage.clone())
        .unwrap()
        .logits(&tokens)
        .unwrap();
    assert_eq!(a.len(), 40 * VOCAB);
    assert_eq!(bits(&a), bits(&b));

    // The training path (autodiff graph, micro-batches) sees the same loss, bit for bit.
    let batch = batch();
    let (la, _) = old.gradients(&batch).unwrap();
    let (lb, _) = grown.gradients(&batch).unwrap();
    assert_eq!(la.to_bits(), lb.to_bits());
    let input = batch.input();
    let ta = old.stage.token_losses(&input, &batch.targets).unwrap();
    let tb = grown.stage.token_losses(&input, &batch.targets).unwrap();
    assert_eq!(bits(&ta), bits(&tb));

    // Growing twice stays exact.
    let mut twice = grown.clone();
    twice
        .grow_depth(&grow::spread_positions(7, 9).unwrap())
        .unwrap();
    assert_eq!(twice.architecture.version, 2);
    let c = Generator::new(twice.stage)
        .unwrap()
        .logits(&tokens)
        .unwrap();
    assert_eq!(bits(&a), bits(&c));
}

/// Without clipping (whose scale depends on every gradient, new ones included), the first
/// step after growth moves each old tensor exactly as the old model's step moves it; the new
/// blocks' output projections start to move; their other matrices only decay; their norm
/// gains stay.
#[test]
fn first_step_after_growth_changes_only_what_it_should() {
    let mut old = trained(None);
    let mut grown = old.clone();
    let inserted = grown.grow_depth(&[1, 3]).unwrap().inserted;
    assert_eq!(inserted, vec![1, 4]);

    // New tensors' AdamW moments start at zero; old ones keep theirs.
    let (m, v) = grown.optimizer.moments();
    let (old_m, _) = old.optimizer.moments();
    for (i, spec) in grown.stage.params().specs().iter().enumerate() {
        match old_name(&spec.name, &inserted) {
            None => assert!(m[i].iter().chain(&v[i]).all(|&x| x == 0.0), "{}", spec.name),
            Some(n) => {
                let j = old
                    .stage
                    .params()
                    .specs()
                    .iter()
                    .position(|s| s.name == n)
                    .unwrap();
                assert_eq!(bits(&m[i]), bits(&old_m[j]), "{}", spec.name);
            }
        }
    }
    assert_eq!(grown.optimizer.step_count(), old.optimizer.step_count());

    let batch = batch();
    let (_, old_grads) = old.gradients(&batch).unwrap();
    let (_, grads) = grown.gradients(&batch).unwrap();
    let before = grown.stage.params().clone();
    let old_before = old.stage.params().clone();
    old.step(&batch).unwrap();
    let lr = grown.optimizer.config.lr_at(grown.optimizer.step_count());
    let decay = (1.0 - lr * grown.optimizer.config.weight_decay) as f32;
    grown.step(&batch).unwrap();

    let after = grown.stage.params();
    let mut checked = [0usize; 4];
    for (i, spec) in after.specs().iter().enumerate() {
        let (was, now, g) = (&before.values()[i], &after.values()[i], &grads[i]);
        match old_name(&spec.name, &inserted) {
            Some(n) => {
                let j = old_before.specs().iter().position(|s| s.name == n).unwrap();
                assert_eq!(bits(g), bits(&old_grads[j]), "gradient of {}", spec.name);
                let old_now = old.stage.params().get(&n).unwrap();
                assert_eq!(bits(now), bits(old_now), "{} after the step", spec.name);
                checked[0] += 1;
            }
            None if spec.name.ends_with("o_proj.weight")
                || spec.name.ends_with("down_proj.weight") =>
            {
                assert!(
                    was.iter().all(|&x| x == 0.0),
                    "{} starts at zero",
                    spec.name
                );
                assert!(g.iter().any(|&x| x != 0.0), "{} has a gradient", spec.name);
                assert!(now.iter().any(|&x| x != 0.0), "{} moved", spec.name);
                checked[1] += 1;
            }
            None if spec.name.ends_with("layernorm.weight") => {
                assert!(g.iter().all(|&x| x == 0.0), "gradient of {}", spec.name);
                assert_eq!(bits(now), bits(was), "{} stays", spec.name);
                checked[2] += 1;
            }
            None => {
                assert!(g.iter().all(|&x| x == 0.0), "gradient of {}", spec.name);
                let decayed: Vec<f32> = was.iter().map(|&x| x * decay).collect();
                assert_eq!(bits(now), bits(&decayed), "{} only decays", spec.name);
                checked[3] += 1;
            }
        }
    }
    // 3 old blocks + embedding, final norm and head; 2 new blocks of 2 + 2 + 5 tensors.
    assert_eq!(checked, [3 * 9 + 3, 4, 4, 10]);
}

#[test]
fn a_grown_run_is_deterministic_and_keeps_learning() {
    let run = || {
        let mut t = trained(Some(1.0));
        t.grow_depth(&[3]).unwrap();
        let mut rng = common::rng(8);
        let fixed = common::random_batch(&mut rng, VOCAB, 4, 16);
        let first = t.step(&fixed).unwrap().loss;
        let mut last = first;
        for _ in 0..30 {
            last = t.step(&fixed).unwrap().loss;
        }
        (t.stage.model_hash(), first, last)
    };
    let (h1, first, last) = run();
    let (h2, ..) = run();
    assert_eq!(h1, h2);
    assert!(
        last < first - 0.5,
        "a fixed batch is memorised: {first} → {last}"
    );
}

#[test]
fn growth_refuses_stages_and_bad_positions() {
    let t = trained(Some(1.0));
    let mut bad = t.clone();
    assert!(bad.grow_depth(&[4]).is_err());
    assert!(bad.grow_depth(&[]).is_err());
    assert_eq!(bad.stage.model_hash(), t.stage.model_hash());
    assert_eq!(bad.architecture, Architecture::default());
    let config = t.stage.config().clone();
    let spec = neuroshard_model::StageSpec::split(&config, 2).unwrap()[1];
    let stage = neuroshard_model::Stage::init(config, spec, 1).unwrap();
    let opt = neuroshard_model::AdamW::new(AdamWConfig::default(), stage.params());
    let err = grow::grow_depth(&stage, &opt, &[1], 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("whole model"), "{err}");
}

#[test]
fn checkpoints_and_exports_carry_the_architecture_and_old_ones_load_as_version_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trained(Some(1.0));
    t.grow_depth(&[1]).unwrap();
    let saved = checkpoint::save_with_architecture(
        dir.path(),
        &t.stage,
        Some(&t.optimizer),
        4,
        &t.architecture,
        serde_json::json!({}),
    )
    .unwrap();
    assert_eq!(saved.architecture.version, 1);
    let loaded = checkpoint::load(dir.path()).unwrap();
    assert_eq!(loaded.meta.architecture, t.architecture);
    assert_eq!(loaded.stage.model_hash(), t.stage.model_hash());
    assert_eq!(loaded.optimizer.unwrap(), t.optimizer);

    let out = tempfile::tempdir().unwrap();
    export_hf(dir.path(), out.path(), SpecialTokens::default()).unwrap();
    let hf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(hf["neuroshard_architecture"]["version"], 1);
    assert_eq!(
        hf["neuroshard_architecture"]["history"][0]["inserted"][0],
        1
    );
    assert_eq!(hf["num_hidden_layers"], 4);

    // A checkpoint written before growth existed has no architecture field: version 0.
    let meta_path = dir.path().join(checkpoint::META_FILE);
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    meta.as_object_mut().unwrap().remove("architecture");
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    assert_eq!(
        checkpoint::load(dir.path()).unwrap().meta.architecture,
        Architecture::default()
    );
    // A history that does not describe the model is refused.
    meta["architecture"] = serde_json::json!({"version": 1, "history": [
        {"step": 4, "from_layers": 3, "to_layers": 5, "inserted": [1, 2]}]});
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let err = checkpoint::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("architecture"), "{err}");
}

/// The part of a widened MLP tensor that the old model had: the first `f` columns of
/// gate/up `[d, f']`, the first `f` rows of down `[f', d]`; anything else whole.
fn old_part(name: &str, v: &[f32], d: usize, f: usize, wide: usize) -> Vec<f32> {
    if name.ends_with("gate_proj.weight") || name.ends_with("up_proj.weight") {
        (0..d)
            .flat_map(|r| v[r * wide..r * wide + f].to_vec())
            .collect()
    } else if name.ends_with("down_proj.weight") {
        v[..f * d].to_vec()
    } else {
        v.to_vec()
    }
}

fn new_part(name: &str, v: &[f32], d: usize, f: usize, wide: usize) -> Vec<f32> {
    if name.ends_with("gate_proj.weight") || name.ends_with("up_proj.weight") {
        (0..d)
            .flat_map(|r| v[r * wide + f..(r + 1) * wide].to_vec())
            .collect()
    } else if name.ends_with("down_proj.weight") {
        v[f * d..].to_vec()
    } else {
        Vec::new()
    }
}

#[test]
fn a_widened_mlp_computes_the_old_function() {
    let old = trained(Some(1.0));
    let tokens: Vec<u32> = (0..40).map(|i| (i * 7 % VOCAB) as u32).collect();
    let a = Generator::new(old.stage.clone())
        .unwrap()
        .logits(&tokens)
        .unwrap();
    for wide in [176, 480] {
        let mut t = old.clone();
        let g = t.grow_ffn(wide, 9).unwrap();
        assert_eq!(
            g.ffn,
            Some(neuroshard_model::FfnGrowth {
                from: 160,
                to: wide
            })
        );
        assert_eq!(t.stage.config().ffn, wide);
        let b = Generator::new(t.stage.clone())
            .unwrap()
            .logits(&tokens)
            .unwrap();
        assert_eq!(bits(&a), bits(&b), "ffn 160 → {wide}");
        // Then deeper: both kinds of growth chain, and the checkpoint history validates.
        t.grow_depth(&[1]).unwrap();
        t.architecture.validate(4, wide).unwrap();
        let c = Generator::new(t.stage).unwrap().logits(&tokens).unwrap();
        assert_eq!(bits(&a), bits(&c));
    }
    // At the reference width (d_model 256, ffn 688 → 1376: longer products than above).
    let mut big = Trainer::new(
        neuroshard_model::ModelConfig::tiny(512),
        AdamWConfig::default(),
        2,
    )
    .unwrap();
    big.step(&common::random_batch(&mut common::rng(3), 512, 2, 64))
        .unwrap();
    let tokens: Vec<u32> = (0..128).map(|i| (i * 31 % 512) as u32).collect();
    let a = Generator::new(big.stage.clone())
        .unwrap()
        .logits(&tokens)
        .unwrap();
    big.grow_ffn(1376, 1).unwrap();
    let b = Generator::new(big.stage).unwrap().logits(&tokens).unwrap();
    // Exact in real arithmetic. Whether the longer product keeps the bits depends on how the
    // matrix kernels tile it, which they size from the CPU's caches: bitwise on the machine
    // this was first measured on, within a few ulps on an AMD EPYC (32 KiB L1d, 1 MiB L2),
    // where 62,174 of 65,536 logits moved by at most 8.9e-7 (of 1.43). Growth is applied by
    // every replica alike, so within one determinism class the bits still agree.
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(worst <= 16.0 * f32::EPSILON * scale, "{worst} of {scale}");
    assert!(old.clone().grow_ffn(160, 0).is_err());
}

/// After a widening, old tensors get the old model's gradients bit for bit (so, without
/// clipping, the same update); new rows of `W_down` get a gradient; new gate/up columns get
/// none and only decay.
#[test]
fn first_step_after_widening_changes_only_what_it_should() {
    let (d, f, wide) = (64, 160, 200);
    let mut old = trained(None);
    let mut grown = old.clone();
    grown.grow_ffn(wide, 4).unwrap();
    let batch = batch();
    let (_, old_grads) = old.gradients(&batch).unwrap();
    let (_, grads) = grown.gradients(&batch).unwrap();
    let before = grown.stage.params().clone();
    old.step(&batch).unwrap();
    let lr = grown.optimizer.config.lr_at(grown.optimizer.step_count());
    let decay = (1.0 - lr * grown.optimizer.config.weight_decay) as f32;
    grown.step(&batch).unwrap();
    let mut widened = 0;
    for (i, spec) in grown.stage.params().specs().iter().enumerate() {
        let name = spec.name.as_str();
        let now = &grown.stage.params().values()[i];
        let old_part = |v: &[f32]| old_part(name, v, d, f, wide);
        assert_eq!(
            bits(&old_part(&grads[i])),
            bits(&old_grads[i]),
            "gradient of {name}"
        );
        assert_eq!(
            bits(&old_part(now)),
            bits(old.stage.params().get(name).unwrap()),
            "{name}"
        );
        let new_part = |v: &[f32]| new_part(name, v, d, f, wide);
        if name.ends_with("down_proj.weight") {
            assert!(new_part(&grads[i]).iter().any(|&x| x != 0.0), "{name}");
            assert!(new_part(now).iter().any(|&x| x != 0.0), "{name}");
            widened += 1;
        } else if name.ends_with("gate_proj.weight") || name.ends_with("up_proj.weight") {
            assert!(new_part(&grads[i]).iter().all(|&x| x == 0.0), "{name}");
            let decayed: Vec<f32> = new_part(&before.values()[i])
                .iter()
                .map(|&x| x * decay)
                .collect();
            assert_eq!(bits(&new_part(now)), bits(&decayed), "{name}");
            widened += 1;
        }
    }
    assert_eq!(widened, 3 * 3);
}
