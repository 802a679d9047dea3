//! Splitting the model into stages and chaining forward/backward by hand reproduces the whole
//! model's loss and gradients.

mod common;

use neuroshard_model::{Batch, Stage, StageInput, StageSpec, Upstream};
use rand::Rng;

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn three_stages_match_the_unsplit_model() {
    let config = common::small_config(97);
    let batch = common::random_batch(&mut common::rng(3), 97, 2, 16);
    let full = Stage::init(config.clone(), StageSpec::full(&config), 11).unwrap();
    let whole = full
        .backward(&batch.input(), &Upstream::Targets(batch.targets.clone()))
        .unwrap();

    let specs = StageSpec::split(&config, 3).unwrap();
    let stages: Vec<Stage> = specs
        .iter()
        .map(|s| Stage::init(config.clone(), *s, 11).unwrap())
        .collect();
    let a0 = stages[0].forward(&batch.input()).unwrap();
    let a1 = stages[1].forward(&StageInput::Hidden(a0.clone())).unwrap();
    let g2 = stages[2]
        .backward(
            &StageInput::Hidden(a1.clone()),
            &Upstream::Targets(batch.targets.clone()),
        )
        .unwrap();
    let g1 = stages[1]
        .backward(
            &StageInput::Hidden(a0),
            &Upstream::Grad(g2.input_grad.clone().unwrap()),
        )
        .unwrap();
    let g0 = stages[0]
        .backward(
            &batch.input(),
            &Upstream::Grad(g1.input_grad.clone().unwrap()),
        )
        .unwrap();
    assert!(
        g0.input_grad.is_none(),
        "the embedding stage has no input gradient"
    );

    let loss_diff = (g2.loss.unwrap() - whole.loss.unwrap()).abs();
    assert!(loss_diff <= 1e-5, "loss differs by {loss_diff}");

    let mut split_grads = Vec::new();
    for (stage, g) in stages.iter().zip([&g0, &g1, &g2]) {
        for (spec, grad) in stage.params().specs().iter().zip(&g.params) {
            split_grads.push((spec.name.clone(), grad.clone()));
        }
    }
    assert_eq!(split_grads.len(), whole.params.len());
    let mut worst = 0.0f32;
    for ((name, g), (spec, w)) in split_grads
        .iter()
        .zip(full.params().specs().iter().zip(&whole.params))
    {
        assert_eq!(name, &spec.name);
        assert!(
            w.iter().any(|x| *x != 0.0),
            "{name} has an all-zero gradient"
        );
        worst = worst.max(max_abs_diff(g, w));
    }
    assert!(worst <= 1e-5, "parameter gradients differ by {worst}");
}

#[test]
fn stage_rejects_bad_input() {
    let config = common::small_config(50);
    let specs = StageSpec::split(&config, 2).unwrap();
    let first = Stage::init(config.clone(), specs[0], 1).unwrap();
    let last = Stage::init(config.clone(), specs[1], 1).unwrap();
    let mut batch = common::random_batch(&mut common::rng(1), 50, 1, 8);
    batch.inputs[3] = 50;
    let err = first.forward(&batch.input()).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");

    let long = common::random_batch(&mut common::rng(1), 50, 1, 65);
    let err = first.forward(&long.input()).unwrap_err().to_string();
    assert!(err.contains("exceeds max_seq"), "{err}");

    let ok = common::random_batch(&mut common::rng(2), 50, 1, 8);
    let mut acts = first.forward(&ok.input()).unwrap();
    acts.data[5] = f32::NAN;
    let err = last
        .backward(
            &StageInput::Hidden(acts.clone()),
            &Upstream::Targets(ok.targets.clone()),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("not finite"), "{err}");
    acts.data.pop();
    assert!(
        last.token_losses(&StageInput::Hidden(acts), &ok.targets)
            .is_err()
    );
    assert!(
        last.forward(&ok.input()).is_err(),
        "the head stage takes hidden states"
    );
}

/// Central difference of the mean loss along `dir` (one tensor of the whole model).
fn directional_derivative(stage: &Stage, index: usize, dir: &[f32], batch: &Batch) -> f64 {
    let eps = 2e-2f32;
    let loss_at = |sign: f32| {
        let mut moved = stage.clone();
        let values = &mut moved.params_mut().values_mut()[index];
        values
            .iter_mut()
            .zip(dir)
            .for_each(|(x, d)| *x += sign * eps * d);
        let losses = moved.token_losses(&batch.input(), &batch.targets).unwrap();
        losses.iter().map(|&l| f64::from(l)).sum::<f64>() / losses.len() as f64
    };
    (loss_at(1.0) - loss_at(-1.0)) / (2.0 * f64::from(eps))
}

#[test]
fn gradients_match_finite_differences() {
    // Guards the hand-written pieces of the backward pass (SwiGLU's factors, attention's
    // softmax, the loss rows) against the loss they claim to differentiate, tensor by tensor.
    // Along a direction d the slope is g·d; with d = g/|g| plus a random unit vector, a wrong
    // term in g shows as a mismatch of the order of its size.
    let config = common::small_config(97);
    let batch = common::random_batch(&mut common::rng(5), 97, 2, 16);
    let stage = Stage::init(config.clone(), StageSpec::full(&config), 13).unwrap();
    let grads = stage
        .backward(&batch.input(), &Upstream::Targets(batch.targets.clone()))
        .unwrap();
    let mut rng = common::rng(6);
    for (index, spec) in stage.params().specs().iter().enumerate() {
        let g = &grads.params[index];
        let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let noise: Vec<f32> = (0..g.len()).map(|_| rng.random_range(-1.0..1.0)).collect();
        let (gn, nn) = (norm(g), norm(&noise));
        let dir: Vec<f32> = g
            .iter()
            .zip(&noise)
            .map(|(a, b)| (f64::from(*a) / gn + f64::from(*b) / nn) as f32)
            .collect();
        let analytic: f64 = g
            .iter()
            .zip(&dir)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let numeric = directional_derivative(&stage, index, &dir, &batch);
        assert!(
            (analytic - numeric).abs() <= 0.01 * analytic.abs() + 2e-5,
            "{}: analytic {analytic:.7}, numeric {numeric:.7}",
            spec.name
        );
    }
}

/// A kept forward pass gives the bits of a plain forward pass, and its backward pass the bits
/// of a backward pass that recomputes the forward (what audits replay), at 1 and 2 threads.
#[test]
fn a_kept_forward_pass_gives_the_bits_of_recomputation() {
    let config = common::small_config(97);
    let batch = common::random_batch(&mut common::rng(5), 97, 2, 16);
    let specs = StageSpec::split(&config, 3).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for threads in [1, 2] {
        neuroshard_model::with_threads(threads, || {
            let mut input = batch.input();
            for spec in &specs[..2] {
                let stage = Stage::init(config.clone(), *spec, 11).unwrap();
                let plain = stage.forward(&input).unwrap();
                let (out, kept) = stage.forward_kept(&input).unwrap();
                assert_eq!(bits(&out.data), bits(&plain.data));
                let dy = neuroshard_model::Activations {
                    data: plain.data.iter().map(|x| (x * 7.3).sin() * 1e-2).collect(),
                    ..plain.clone()
                };
                let up = Upstream::Grad(dy);
                let again = stage.backward(&input, &up).unwrap();
                let kept = stage.backward_kept(kept, &up).unwrap();
                for (a, b) in again.params.iter().zip(&kept.params) {
                    assert_eq!(bits(a), bits(b));
                }
                assert_eq!(
                    again.input_grad.map(|g| bits(&g.data)),
                    kept.input_grad.map(|g| bits(&g.data))
                );
                input = StageInput::Hidden(plain);
            }
            let last = Stage::init(config.clone(), specs[2], 11).unwrap();
            assert!(
                last.forward_kept(&input).is_err(),
                "the last stage has no output"
            );
        })
        .unwrap();
    }
}
