//! Properties of training: causality on random tokens and bitwise determinism.

mod common;

use neuroshard_model::{AdamWConfig, Trainer, with_threads};

/// On i.i.d. uniform tokens nothing is predictable, so a causal model's loss can never fall
/// below ln(V). A model that peeks at the future drives it toward zero.
#[test]
fn random_tokens_stay_at_the_entropy_floor() {
    let vocab = 64;
    let floor = (vocab as f32).ln();
    let optim = AdamWConfig {
        lr: 3e-3,
        warmup_steps: 10,
        total_steps: 300,
        ..Default::default()
    };
    let mut trainer = Trainer::new(common::small_config(vocab), optim, 5).unwrap();
    let mut rng = common::rng(42);
    let mut late = Vec::new();
    for step in 0..300 {
        let batch = common::random_batch(&mut rng, vocab, 8, 32);
        let loss = trainer.step(&batch).unwrap().loss;
        if step >= 100 {
            assert!(
                loss >= floor - 0.05,
                "step {step}: loss {loss} < ln(V) - 0.05 = {}",
                floor - 0.05
            );
            late.push(loss);
        }
    }
    let mean = late.iter().sum::<f32>() / late.len() as f32;
    assert!(
        mean >= floor - 0.02,
        "late mean loss {mean} under the floor {floor}"
    );
    assert!(
        mean < floor + 0.2,
        "late mean loss {mean} did not even reach the floor {floor}"
    );
}

/// Training on a repeated batch must drive the loss down: the model does learn.
#[test]
fn memorises_a_fixed_batch() {
    let vocab = 64;
    let optim = AdamWConfig {
        lr: 3e-3,
        warmup_steps: 5,
        total_steps: 80,
        ..Default::default()
    };
    let mut trainer = Trainer::new(common::small_config(vocab), optim, 9).unwrap();
    let batch = common::random_batch(&mut common::rng(8), vocab, 4, 32);
    let first = trainer.step(&batch).unwrap().loss;
    let mut last = first;
    for _ in 0..80 {
        last = trainer.step(&batch).unwrap().loss;
    }
    assert!(last < first * 0.5, "loss went from {first} to {last}");
}

fn three_steps(threads: usize, micro_batches: usize) -> ([u8; 32], f32) {
    with_threads(threads, || {
        let mut trainer =
            Trainer::new(common::small_config(80), AdamWConfig::default(), 21).unwrap();
        trainer.micro_batches = micro_batches;
        let mut rng = common::rng(4);
        let mut loss = 0.0;
        for _ in 0..3 {
            loss = trainer
                .step(&common::random_batch(&mut rng, 80, 4, 32))
                .unwrap()
                .loss;
        }
        (trainer.stage.model_hash(), loss)
    })
    .unwrap()
}

/// Validators verify work by recomputation: the same step must give the same bits on every
/// run and for any thread count.
#[test]
fn training_steps_are_bitwise_deterministic_across_runs_and_threads() {
    let (h1, l1) = three_steps(1, 1);
    let (h1b, l1b) = three_steps(1, 1);
    let (h2, l2) = three_steps(2, 1);
    assert_eq!(l1.to_bits(), l1b.to_bits());
    assert_eq!(h1, h1b, "two runs with 1 thread differ");
    assert_eq!(l1.to_bits(), l2.to_bits());
    assert_eq!(h1, h2, "1 and 2 threads give different parameters");
}

/// Micro-batches run concurrently; their sum is taken in a fixed order, so the bits still do
/// not depend on the thread count, and the result is the full-batch step up to rounding.
#[test]
fn micro_batched_steps_are_deterministic_and_match_the_full_batch() {
    let (h1, l1) = three_steps(1, 2);
    let (h2, l2) = three_steps(2, 2);
    assert_eq!(h1, h2, "micro-batched step differs between 1 and 2 threads");
    assert_eq!(l1.to_bits(), l2.to_bits());
    let (_, full) = three_steps(1, 1);
    assert!(
        (l1 - full).abs() < 1e-4,
        "micro-batched loss {l1} vs full batch {full}"
    );
}
