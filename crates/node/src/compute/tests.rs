use super::*;
use crate::replica::ReplicaError;
use crate::replica::tests::{cfg, tiny_config};
use neuroshard_model::{AdamWConfig, StageSpec};

fn dcfg() -> crate::replica::DilocoConfig {
    cfg(1, "randk:0.25:sign")
}

#[test]
fn inference_steps_go_first_and_other_jobs_keep_their_order() {
    let infer = || EngineJob::Infer {
        steps: Vec::new(),
        evict: Vec::new(),
    };
    let mut waiting: VecDeque<(Token, EngineJob)> = VecDeque::from(vec![
        (1, EngineJob::SyncPrepare { round: 1 }),
        (
            2,
            EngineJob::Checkpoint {
                step: 2,
                extra: serde_json::Value::Null,
            },
        ),
        (3, infer()),
        (4, EngineJob::SyncPrepare { round: 2 }),
        (5, infer()),
    ]);
    let order: Vec<Token> = std::iter::from_fn(|| next_job(&mut waiting))
        .map(|(t, _)| t)
        .collect();
    assert_eq!(order, vec![3, 5, 1, 2, 4]);
}

#[test]
fn checkpoints_carry_the_outer_state_and_refuse_a_damaged_one() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("checkpoint");
    let stage = Stage::init(tiny_config(), StageSpec::full(&tiny_config()), 3).unwrap();
    let opt = AdamW::new(AdamWConfig::default(), stage.params());
    let diloco = Diloco::new(dcfg(), stage.params()).unwrap();
    let hash = diloco.hash();
    let engine = Engine::new(stage, opt, Some(diloco));
    engine
        .save(&ck, 7, serde_json::json!({"node": "test"}))
        .unwrap();
    let meta = checkpoint::read_meta(&ck).unwrap();
    assert_eq!(meta.step, 7);
    let n = engine.params().numel();
    let back = load_diloco(&ck, &meta, dcfg(), n).unwrap();
    assert_eq!(back.hash(), hash);
    // Another stage size, a truncated file, a missing file: each refused with the reason.
    assert!(matches!(
        load_diloco(&ck, &meta, dcfg(), n + 1),
        Err(EngineError::DilocoState { source, .. })
            if matches!(*source, ReplicaError::StateLength { .. })
    ));
    let file = ck.join(DILOCO_FILE);
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    assert!(matches!(
        load_diloco(&ck, &meta, dcfg(), n),
        Err(EngineError::DilocoHash { .. })
    ));
    std::fs::remove_file(&file).unwrap();
    assert!(matches!(
        load_diloco(&ck, &meta, dcfg(), n),
        Err(EngineError::File { .. })
    ));
    assert_eq!(latest_checkpoint(&ck), Some(ck.clone()));
}

/// Verification by recomputation replays a job through the model crate; its bits must be
/// those this engine produced in the pipeline, whatever either side's thread count.
#[test]
fn a_replayed_job_gives_the_bits_the_engine_produced() {
    use crate::wire::MicroBatchId;
    use neuroshard_audit::{JobKind, grads_hash};
    use neuroshard_model::replay::{job_inputs, replay_job};
    use neuroshard_model::{StageInput, Tokens, Upstream, Wire};

    let mut config = tiny_config();
    config.layers = 2;
    let specs = StageSpec::split(&config, 2).unwrap();
    let s0 = Stage::init(config.clone(), specs[0], 5).unwrap();
    let s1 = Stage::init(config.clone(), specs[1], 6).unwrap();
    let engine = |s: &Stage| {
        Engine::new(
            s.clone(),
            AdamW::new(AdamWConfig::default(), s.params()),
            None,
        )
    };
    let (mut e0, mut e1) = (engine(&s0), engine(&s1));
    let mb = MicroBatchId {
        origin: [1; 32],
        step: 0,
        index: 0,
    };
    let tokens = StageInput::Tokens(Tokens {
        batch: 2,
        seq: 4,
        ids: (0..8).collect(),
    });
    let replay = |s: &Stage, kind, input: &StageInput, up: Option<&Upstream>| {
        let inputs = job_inputs(input, up).unwrap();
        neuroshard_model::with_threads(2, || replay_job(s, kind, &inputs, &Wire::default()))
            .unwrap()
            .unwrap()
    };

    let done = neuroshard_model::with_threads(1, || {
        e0.run(Job::Forward {
            mb,
            input: tokens.clone(),
            weights: 0,
            genesis: Vec::new(),
        })
    })
    .unwrap();
    let JobDone::Forward { output, .. } = done else {
        panic!("{done:?}")
    };
    let r = replay(&s0, JobKind::Forward, &tokens, None);
    assert_eq!(r.output_hash, output.hash());

    let hidden = StageInput::Hidden(output);
    let up = Upstream::Targets((1..9).collect());
    let done = e1.run(Job::Backward {
        mb,
        input: hidden.clone(),
        upstream: up.clone(),
        weights: 0,
        genesis: Vec::new(),
    });
    let JobDone::Backward {
        input_grad: Some(g),
        loss,
        ..
    } = done
    else {
        panic!("{done:?}")
    };
    let r = replay(&s1, JobKind::Backward, &hidden, Some(&up));
    assert_eq!(r.output_hash, g.hash());
    // The engine keeps the parameter gradients, accumulated from zero: value for value
    // the replay's (0 + x only turns −0 into +0, which compares equal).
    assert_eq!(
        r.grads_hash,
        grads_hash(loss, &s1.backward(&hidden, &up).unwrap().params)
    );
    let replayed = s1.backward(&hidden, &up).unwrap();
    assert_eq!(e1.accum, replayed.params);
    assert_eq!(loss.map(f32::to_bits), replayed.loss.map(f32::to_bits));

    let up0 = Upstream::Grad(g);
    let done = e0.run(Job::Backward {
        mb,
        input: tokens.clone(),
        upstream: up0.clone(),
        weights: 0,
        genesis: Vec::new(),
    });
    assert!(matches!(
        done,
        JobDone::Backward {
            input_grad: None,
            ..
        }
    ));
    let r = replay(&s0, JobKind::Backward, &tokens, Some(&up0));
    assert_eq!(r.output_hash, neuroshard_audit::NO_HASH);
    assert_eq!(e0.accum, s0.backward(&tokens, &up0).unwrap().params);
}

/// Forward passes are kept for their backward passes up to a bound; a backward pass whose
/// forward was dropped (or ran on another input) recomputes it, with the same bits.
#[test]
fn kept_forward_passes_are_bounded_and_recomputation_gives_their_bits() {
    use neuroshard_model::{Tokens, Upstream};
    let mut config = tiny_config();
    config.layers = 2;
    let spec = StageSpec::split(&config, 2).unwrap()[0];
    let stage = Stage::init(config.clone(), spec, 5).unwrap();
    let mut engine = Engine::new(
        stage.clone(),
        AdamW::new(AdamWConfig::default(), stage.params()),
        None,
    );
    let mb = |index| MicroBatchId {
        origin: [1; 32],
        step: 0,
        index,
    };
    let input = |i: u32| {
        StageInput::Tokens(Tokens {
            batch: 1,
            seq: 4,
            ids: (i..i + 4).collect(),
        })
    };
    let n = KEPT_FORWARDS as u32 + 2;
    let mut outputs = Vec::new();
    for i in 0..n {
        let done = engine.run(Job::Forward {
            mb: mb(i),
            input: input(i),
            weights: 0,
            genesis: Vec::new(),
        });
        let JobDone::Forward { output, .. } = done else {
            panic!("{done:?}")
        };
        outputs.push(output);
    }
    assert_eq!(engine.kept.len(), KEPT_FORWARDS, "bounded");
    assert!(engine.kept.iter().all(|k| k.mb != mb(0)), "the oldest went");
    // Micro-batch 0 recomputes, the last one uses its kept graph, and one whose input
    // changed since its forward recomputes on the new input.
    for (i, inp) in [(0, input(0)), (n - 1, input(n - 1)), (n - 2, input(20))] {
        let dy = neuroshard_model::Activations {
            data: vec![0.01; outputs[i as usize].data.len()],
            ..outputs[i as usize].clone()
        };
        let up = Upstream::Grad(dy);
        let before = engine.accum.clone();
        let done = engine.run(Job::Backward {
            mb: mb(i),
            input: inp.clone(),
            upstream: up.clone(),
            weights: 0,
            genesis: Vec::new(),
        });
        assert!(matches!(done, JobDone::Backward { .. }), "{done:?}");
        let want = stage.backward(&inp, &up).unwrap().params;
        for ((after, was), w) in engine.accum.iter().zip(&before).zip(&want) {
            let got: Vec<f32> = after.iter().zip(was).map(|(a, b)| a - b).collect();
            let diff = got
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(diff <= 1e-6, "micro-batch {i}: {diff}");
        }
    }
    assert!(
        engine
            .kept
            .iter()
            .all(|k| k.mb != mb(n - 1) && k.mb != mb(n - 2))
    );
}

/// With a weight lag the engine keeps the weights before its last step for the jobs one
/// step behind; a DiLoCo step that moves the weights moves them by the same difference, and
/// a job at weights it no longer holds fails instead of running at others.
#[test]
fn the_weights_one_step_behind_are_kept_and_move_with_diloco() {
    use neuroshard_model::{Tokens, Upstream};
    let stage = Stage::init(tiny_config(), StageSpec::full(&tiny_config()), 3).unwrap();
    let opt = AdamW::new(AdamWConfig::default(), stage.params());
    let diloco = Diloco::new(cfg(1, "fp32"), stage.params()).unwrap();
    let mut engine = Engine::new(stage, opt, Some(diloco)).with_weight_lag(1);
    let input = StageInput::Tokens(Tokens {
        batch: 1,
        seq: 4,
        ids: vec![1, 2, 3, 4],
    });
    let backward = |e: &mut Engine, index, weights| {
        e.run(Job::Backward {
            mb: MicroBatchId {
                origin: [1; 32],
                step: 0,
                index,
            },
            input: input.clone(),
            upstream: Upstream::Targets(vec![2, 3, 4, 5]),
            weights,
            genesis: Vec::new(),
        })
    };
    for step in 0..2u64 {
        let done = backward(&mut engine, step as u32, step);
        assert!(matches!(done, JobDone::Backward { .. }), "{done:?}");
        assert!(matches!(
            engine.run(Job::Step { step }),
            JobDone::Step { .. }
        ));
    }
    let gap = |e: &Engine| -> Vec<f32> {
        let (v, prev) = e.previous.as_ref().expect("kept");
        assert_eq!(*v, 1);
        let now = e.stage.params().flatten();
        prev.params()
            .flatten()
            .iter()
            .zip(&now)
            .map(|(p, c)| c - p)
            .collect()
    };
    let before = gap(&engine);
    assert!(before.iter().any(|d| *d != 0.0), "a step moved the weights");
    // The stage adopts another replica's outer state: θ₀, hence the weights, move.
    let other = Stage::init(tiny_config(), StageSpec::full(&tiny_config()), 4).unwrap();
    let outer = Diloco::new(cfg(1, "fp32"), other.params())
        .unwrap()
        .outer_bytes();
    let moved = engine.stage.params().flatten();
    let EngineOutput::Adopted(adopted) = engine.execute(EngineJob::SyncAdopt {
        round: 0,
        bytes: outer,
        included: false,
    }) else {
        panic!("not an adoption")
    };
    adopted.unwrap();
    assert_ne!(engine.stage.params().flatten(), moved, "the weights moved");
    // The gap between the current and the kept weights is what it was, to rounding.
    for (a, b) in gap(&engine).iter().zip(&before) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
    }
    // Weights of step 1 are kept, of step 2 current; step 0's are gone.
    assert!(matches!(
        backward(&mut engine, 5, 1),
        JobDone::Backward { .. }
    ));
    assert!(matches!(
        backward(&mut engine, 6, 2),
        JobDone::Backward { .. }
    ));
    let JobDone::Failed { error, .. } = backward(&mut engine, 7, 0) else {
        panic!("ran at weights it does not hold")
    };
    assert!(error.contains("not held"), "{error}");
}

/// A replica's offer is kept as evidence (its weights, then the outer state) and an auditor's
/// engine re-encodes it to the same bytes; an offer of other bytes (last round's) does not,
/// and a blob that is not the one the offer names is refused.
#[test]
fn an_offer_replays_from_its_evidence_and_a_stale_one_does_not() {
    use crate::wire::MicroBatchId;
    use neuroshard_audit::{JobCommitment, JobKind, OfferClaims, offer_micro_batch};

    let config = tiny_config();
    let spec = StageSpec::full(&config);
    let stage = Stage::init(config.clone(), spec, 5).unwrap();
    let engine = |me: u8| {
        let diloco = Diloco::new(cfg(me, "int2"), stage.params()).unwrap();
        Engine::new(
            stage.clone(),
            AdamW::new(AdamWConfig::default(), stage.params()),
            Some(diloco),
        )
        .with_job_store(JobStore::new(None, 1 << 30).unwrap(), Default::default())
    };
    let (mut worker, auditor) = (engine(1), engine(2));
    let me = neuroshard_proof::NodeId([1; 32]);
    let mut offers = Vec::new();
    for round in 1..=2u64 {
        // Inner steps: the weights move.
        let flat: Vec<f32> = (worker.stage.params().flatten().iter().enumerate())
            .map(|(i, x)| x - 0.01 * ((i as f32) * round as f32).sin())
            .collect();
        worker.stage.params_mut().set_flat(&flat).unwrap();
        let (prepared, h) = worker.sync_prepare(round).unwrap();
        let jobs_round = round - 1;
        let mb = offer_micro_batch(me, jobs_round);
        let id = MicroBatchId {
            origin: mb.origin.0,
            step: mb.step,
            index: mb.index,
        };
        let evidence = worker.evidence(&id, JobKind::Offer, &h.weights).unwrap();
        let inputs = crate::compute::decode_inputs(&evidence.inputs).unwrap();
        assert_eq!(inputs, h.inputs());
        let claims = OfferClaims {
            step: h.step,
            class: neuroshard_model::replay::determinism_class(1),
            weights: h.weights,
            outer: h.outer,
            blob: *blake3::hash(&prepared.blob).as_bytes(),
            round_state: [3; 32],
            epoch: 0,
        };
        let c = JobCommitment::offer([0; 32], me, 0, jobs_round, claims);
        assert_eq!(c.micro_batch, mb);
        let r = auditor
            .replay(spec, &c, &inputs, &evidence.weights)
            .unwrap();
        assert_eq!(r.output_hash, c.output_hash, "round {round}");
        offers.push((c, inputs, evidence.weights, prepared.blob));
        worker.sync_apply(round, Vec::new()).unwrap();
    }
    // Round 2 offered round 1's blob instead: the replay gives its own bytes.
    let (c, inputs, blob, _) = &offers[1];
    let stale = JobCommitment {
        output_hash: *blake3::hash(&offers[0].3).as_bytes(),
        ..*c
    };
    let r = auditor.replay(spec, &stale, inputs, blob).unwrap();
    assert_ne!(r.output_hash, stale.output_hash);
    // Round 1's blob (another outer state and weights) is not round 2's evidence.
    assert!(auditor.replay(spec, c, inputs, &offers[0].2).is_err());
    let mut short = blob.to_vec();
    short.pop();
    assert!(auditor.replay(spec, c, inputs, &short).is_err());
}

#[test]
fn a_non_finite_gradient_value_is_found_wherever_it_sits() {
    let finite = [0.0, -0.0, 1.5, f32::MAX, f32::MIN, f32::MIN_POSITIVE, 1e-45];
    for len in [0, 1, 15, 16, 17, 40] {
        let clean: Vec<f32> = (0..len).map(|i| finite[i % finite.len()]).collect();
        assert!(all_finite(&clean), "length {len}");
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in 0..len {
                let mut v = clean.clone();
                v[at] = bad;
                assert!(!all_finite(&v), "{bad} at {at} of {len}");
            }
        }
    }
}
