//! Verification by recomputation on the real engine: replays agree bit for bit across thread
//! counts, and fraud proofs against a tiny two-stage model convict cheaters, clear honest
//! workers and only escalate across determinism classes.

mod common;

use neuroshard_audit::{
    AuditContext, AuditRate, ChallengeSeed, EvidenceError, EvidenceLimits, FraudProof,
    JobCommitment, JobInputs, JobKind, MicroBatchRef, Replayed, Replayer, StageData, Tensor,
    Tolerance, UpstreamData, Verdict, auditor_for, check,
};
use neuroshard_model::replay::{job_inputs, replay_job, tensor};
use neuroshard_model::{
    EngineReplayer, ModelConfig, ParamSet, Stage, StageInput, StageSpec, Tokens, Upstream, Wire,
    determinism_class, with_threads,
};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Identity, NodeId};

const VOCAB: usize = 64;

fn config() -> ModelConfig {
    ModelConfig {
        layers: 4,
        ..common::small_config(VOCAB)
    }
}

/// Stage 0: embedding and layers 0–1; stage 1: layers 2–3 and the head.
fn stages() -> (Stage, Stage) {
    let specs = StageSpec::split(&config(), 2).unwrap();
    (
        Stage::init(config(), specs[0], 11).unwrap(),
        Stage::init(config(), specs[1], 12).unwrap(),
    )
}

fn tokens(seed: u64) -> (Tokens, Vec<u32>) {
    let batch = common::random_batch(&mut common::rng(seed), VOCAB, 2, 16);
    let StageInput::Tokens(t) = batch.input() else {
        panic!("a batch's input is token ids")
    };
    (t, batch.targets.clone())
}

/// The four jobs of one micro-batch through both stages, as the pipeline runs them: the
/// inputs each job consumed and the hashes replaying it gives.
fn pipeline_jobs(s0: &Stage, s1: &Stage, seed: u64) -> Vec<(JobKind, JobInputs, Replayed)> {
    let (t, targets) = tokens(seed);
    let wire = Wire::default();
    let mut jobs = Vec::new();
    let x0 = job_inputs(&StageInput::Tokens(t.clone()), None).unwrap();
    let f0 = replay_job(s0, JobKind::Forward, &x0, &wire).unwrap();
    jobs.push((JobKind::Forward, x0, f0.clone()));
    let h = f0.output.unwrap();
    let hidden = StageInput::Hidden(neuroshard_model::Activations {
        batch: h.batch as usize,
        seq: h.seq as usize,
        dim: h.dim as usize,
        data: h.data.clone(),
    });
    let x1 = job_inputs(&hidden, Some(&Upstream::Targets(targets))).unwrap();
    let b1 = replay_job(s1, JobKind::Backward, &x1, &wire).unwrap();
    jobs.push((JobKind::Backward, x1, b1.clone()));
    let g = b1.output.unwrap();
    let grad = neuroshard_model::Activations {
        batch: g.batch as usize,
        seq: g.seq as usize,
        dim: g.dim as usize,
        data: g.data,
    };
    let x0b = job_inputs(&StageInput::Tokens(t), Some(&Upstream::Grad(grad))).unwrap();
    let b0 = replay_job(s0, JobKind::Backward, &x0b, &wire).unwrap();
    jobs.push((JobKind::Backward, x0b, b0));
    jobs
}

#[test]
fn replays_are_bitwise_identical_across_runs_and_thread_counts() {
    let (s0, s1) = stages();
    let reference = with_threads(1, || pipeline_jobs(&s0, &s1, 3)).unwrap();
    for threads in [1, 2, 3] {
        let again = with_threads(threads, || pipeline_jobs(&s0, &s1, 3)).unwrap();
        for ((_, _, a), (_, _, b)) in reference.iter().zip(&again) {
            assert_eq!(a.output_hash, b.output_hash, "{threads} threads");
            assert_eq!(a.grads_hash, b.grads_hash, "{threads} threads");
        }
    }
    // Other data gives other bits: the hashes do say something.
    let other = pipeline_jobs(&s0, &s1, 4);
    assert_ne!(reference[0].2.output_hash, other[0].2.output_hash);
}

/// A stage with the worker and three validators.
struct World {
    worker: Identity,
    others: Vec<Identity>,
    validators: Vec<NodeId>,
}

impl World {
    fn new() -> Self {
        let worker = test_identity(1);
        let others: Vec<Identity> = (2..=4).map(test_identity).collect();
        let validators = std::iter::once(&worker)
            .chain(&others)
            .map(Identity::node_id)
            .collect();
        Self {
            worker,
            others,
            validators,
        }
    }

    fn ctx(&self, stage: u16) -> AuditContext<'_> {
        AuditContext {
            network: [5; 32],
            stage,
            round: 2,
            seed: ChallengeSeed::from_beacon([5; 32], stage, 2, [0x42; 32]),
            validators: &self.validators,
            // Every job audited, so each case below is picked.
            rate: AuditRate {
                per_million: 1_000_000,
            },
            limits: EvidenceLimits {
                max_rows: 32,
                dim: config().d_model as u32,
            },
            tolerance: Tolerance::default(),
        }
    }

    fn auditor(&self, c: &JobCommitment) -> &Identity {
        let ctx = self.ctx(c.stage);
        let a = auditor_for(&ctx.seed, &c.key(), c.worker, &self.validators).unwrap();
        self.others.iter().find(|i| i.node_id() == a).unwrap()
    }
}

fn commit(
    w: &World,
    stage: u16,
    weights: [u8; 32],
    kind: JobKind,
    inputs: &JobInputs,
    out: &Replayed,
) -> JobCommitment {
    JobCommitment {
        network: [5; 32],
        worker: w.worker.node_id(),
        stage,
        round: 2,
        step: 7,
        micro_batch: MicroBatchRef {
            origin: NodeId([3; 32]),
            step: 9,
            index: 0,
        },
        kind,
        class: determinism_class(2),
        weights_hash: weights,
        input_hash: inputs.input.hash(),
        upstream_hash: inputs.upstream.hash(),
        output_hash: out.output_hash,
        grads_hash: out.grads_hash,
        epoch: 0,
    }
}

/// The assigned auditor replays the job honestly and files what it got if it disagrees,
/// or a made-up hash if it is lying about an honest worker.
fn audit(
    w: &World,
    c: &JobCommitment,
    inputs: &JobInputs,
    replayer: &EngineReplayer,
    sent: Option<Tensor>,
) -> FraudProof {
    let mut mine = replayer.replay(c, inputs).unwrap();
    if (mine.output_hash, mine.grads_hash) == (c.output_hash, c.grads_hash) {
        mine.output_hash = [0xee; 32];
    }
    FraudProof::new(
        w.auditor(c),
        c.sign(&w.worker),
        c,
        inputs.clone(),
        &mine,
        sent,
        1_000,
    )
}

fn replayer(s0: &Stage, s1: &Stage) -> (EngineReplayer, [u8; 32], [u8; 32]) {
    let mut r = EngineReplayer::new(determinism_class(2), Wire::default());
    let h0 = r.add(s0.clone());
    let h1 = r.add(s1.clone());
    (r, h0, h1)
}

#[test]
fn honest_jobs_are_cleared_and_their_accusers_lose() {
    let w = World::new();
    let (s0, s1) = stages();
    let (r, h0, h1) = replayer(&s0, &s1);
    let jobs = with_threads(1, || pipeline_jobs(&s0, &s1, 5)).unwrap();
    for ((kind, inputs, out), (stage, weights)) in jobs.into_iter().zip([(0, h0), (1, h1), (0, h0)])
    {
        let c = commit(&w, stage, weights, kind, &inputs, &out);
        let proof = audit(&w, &c, &inputs, &r, None);
        // Checked on 2 threads while the worker computed on 1: still the same bits.
        let verdict = with_threads(2, || check(&w.ctx(stage), &proof, &r)).unwrap();
        assert!(
            matches!(verdict, Ok(Verdict::FalseAccusation { .. })),
            "{kind:?} on stage {stage}: {verdict:?}"
        );
    }
}

#[test]
fn a_worker_returning_random_outputs_is_convicted() {
    let w = World::new();
    let (s0, s1) = stages();
    let (r, h0, _) = replayer(&s0, &s1);
    let (kind, inputs, mut out) = pipeline_jobs(&s0, &s1, 6).remove(0);
    let mut noise = out.output.clone().unwrap();
    noise
        .data
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i as f32).sin());
    out.output_hash = noise.hash();
    let c = commit(&w, 0, h0, kind, &inputs, &out);
    let proof = audit(&w, &c, &inputs, &r, Some(noise));
    assert!(matches!(
        check(&w.ctx(0), &proof, &r),
        Ok(Verdict::Guilty { .. })
    ));
}

/// The first stage's output without its second layer, computed by a stage that holds only
/// the first layer (the same weights by name).
fn skip_last_layer(s0: &Stage, input: &StageInput) -> Tensor {
    let cfg = config();
    let spec = StageSpec {
        end_layer: s0.spec().end_layer - 1,
        ..*s0.spec()
    };
    let specs = spec.param_specs(&cfg);
    let values = specs
        .iter()
        .map(|p| s0.params().get(&p.name).unwrap().to_vec())
        .collect();
    let lazy =
        Stage::from_params(cfg, spec, ParamSet::from_values(specs, values).unwrap()).unwrap();
    tensor(&lazy.forward(input).unwrap()).unwrap()
}

#[test]
fn a_worker_skipping_a_layer_is_convicted_and_other_classes_only_escalate() {
    let w = World::new();
    let (s0, s1) = stages();
    let (r, h0, _) = replayer(&s0, &s1);
    let (kind, inputs, honest) = pipeline_jobs(&s0, &s1, 7).remove(0);
    let StageData::Tokens(t) = &inputs.input else {
        panic!("stage 0 takes tokens")
    };
    let input = StageInput::Tokens(Tokens {
        batch: t.batch as usize,
        seq: t.seq as usize,
        ids: t.ids.clone(),
    });
    let lazy = skip_last_layer(&s0, &input);
    let out = Replayed {
        output_hash: lazy.hash(),
        ..honest.clone()
    };
    let c = commit(&w, 0, h0, kind, &inputs, &out);
    let proof = audit(&w, &c, &inputs, &r, Some(lazy));
    assert!(matches!(
        check(&w.ctx(0), &proof, &r),
        Ok(Verdict::Guilty { .. })
    ));

    // A checker of another build cannot convict: it sees the lazy output far outside the
    // tolerance and escalates; an honest worker's output is within it, and still escalated.
    let mut foreign_class = determinism_class(2);
    foreign_class.build[0] ^= 1;
    let mut foreign = EngineReplayer::new(foreign_class, Wire::default());
    foreign.add(s0.clone());
    match check(&w.ctx(0), &proof, &foreign) {
        Ok(Verdict::Escalate {
            comparison: Some(cmp),
            ..
        }) => assert!(!cmp.within_tolerance, "{cmp:?}"),
        v => panic!("{v:?}"),
    }
    let c = commit(&w, 0, h0, kind, &inputs, &honest);
    let proof = audit(&w, &c, &inputs, &r, honest.output.clone());
    match check(&w.ctx(0), &proof, &foreign) {
        Ok(Verdict::Escalate {
            comparison: Some(cmp),
            ..
        }) => assert!(cmp.within_tolerance, "{cmp:?}"),
        v => panic!("{v:?}"),
    }
}

#[test]
fn a_worker_training_on_other_targets_is_convicted() {
    let w = World::new();
    let (s0, s1) = stages();
    let (r, _, h1) = replayer(&s0, &s1);
    let (kind, inputs, _) = pipeline_jobs(&s0, &s1, 8).remove(1);
    // It commits to the targets it received but computes its gradients on others.
    let mut other = inputs.clone();
    if let UpstreamData::Targets(t) = &mut other.upstream {
        t.ids.iter_mut().for_each(|x| *x = (*x + 1) % VOCAB as u32);
    }
    let out = replay_job(&s1, kind, &other, &Wire::default()).unwrap();
    let c = commit(&w, 1, h1, kind, &inputs, &out);
    let proof = audit(&w, &c, &inputs, &r, None);
    assert!(matches!(
        check(&w.ctx(1), &proof, &r),
        Ok(Verdict::Guilty { .. })
    ));
    // Evidence that swaps in the other targets no longer matches the commitment.
    let mut swapped = proof.clone();
    swapped.inputs = other;
    assert!(matches!(
        check(&w.ctx(1), &swapped, &r),
        Err(EvidenceError::InputMismatch("upstream data"))
    ));
}

#[test]
fn weights_the_checker_does_not_hold_give_no_verdict() {
    let w = World::new();
    let (s0, s1) = stages();
    let (kind, inputs, mut out) = pipeline_jobs(&s0, &s1, 9).remove(0);
    out.output_hash = [1; 32];
    let c = commit(&w, 0, s0.model_hash(), kind, &inputs, &out);
    let empty = EngineReplayer::new(determinism_class(2), Wire::default());
    let (full, _, _) = replayer(&s0, &s1);
    let proof = audit(&w, &c, &inputs, &full, None);
    assert!(matches!(
        check(&w.ctx(0), &proof, &empty),
        Err(EvidenceError::Replay(_))
    ));
}
