//! Cached generation equals recomputing the whole sequence; bad prompts are refused.

mod common;

use neuroshard_model::{AdamWConfig, Generator, Sampling, Trainer};

#[test]
fn kv_cache_matches_full_recompute_greedily() {
    let mut trainer = Trainer::new(common::small_config(48), AdamWConfig::default(), 6).unwrap();
    let batch = common::random_batch(&mut common::rng(5), 48, 2, 16);
    for _ in 0..5 {
        trainer.step(&batch).unwrap();
    }
    let generator = Generator::new(trainer.stage.clone()).unwrap();
    let prompt = vec![3, 17, 9, 40, 2];
    let greedy = Sampling {
        temperature: 0.0,
        ..Default::default()
    };
    let cached = generator.generate(&prompt, 12, &greedy).unwrap();
    assert_eq!(cached.len(), 12);

    let mut seq = prompt.clone();
    for &next in &cached {
        let logits = generator.logits(&seq).unwrap();
        let last = &logits[(seq.len() - 1) * 48..];
        let argmax = last
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        assert_eq!(
            argmax,
            next,
            "cached decoding diverged at position {}",
            seq.len()
        );
        seq.push(next);
    }
}

#[test]
fn sampling_is_seeded_and_stops_at_max_seq() {
    let trainer = Trainer::new(common::small_config(48), AdamWConfig::default(), 6).unwrap();
    let generator = Generator::new(trainer.stage).unwrap();
    let s = Sampling {
        seed: 9,
        ..Default::default()
    };
    let a = generator.generate(&[1, 2, 3], 20, &s).unwrap();
    let b = generator.generate(&[1, 2, 3], 20, &s).unwrap();
    assert_eq!(a, b);
    let long = generator.generate(&[1; 60], 100, &s).unwrap();
    assert_eq!(long.len(), 4, "generation stops at max_seq 64");
}

#[test]
fn bad_prompts_are_clear_errors() {
    let trainer = Trainer::new(common::small_config(48), AdamWConfig::default(), 6).unwrap();
    let generator = Generator::new(trainer.stage).unwrap();
    let s = Sampling::default();
    let err = generator.generate(&[1; 65], 5, &s).unwrap_err().to_string();
    assert!(err.contains("longer than max_seq"), "{err}");
    let err = generator.generate(&[1, 48], 5, &s).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    assert!(generator.generate(&[], 5, &s).is_err());
}
