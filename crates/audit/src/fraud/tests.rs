//! Attacks on the audit protocol, each against a cheap deterministic stand-in for the engine
//! (the real engine's replay is tested in the model crate).

use super::*;
use crate::class::tests::class;
use crate::commit::MicroBatchRef;
use crate::provenance::tests::{Counting, genesis_inputs};
use crate::tensor::tests::{arb_inputs, hidden};
use crate::tensor::{NO_HASH, StageData, grads_hash};
use neuroshard_proof::fixtures::test_identity;
use proptest::prelude::*;

const DIM: u32 = 4;
const WEIGHTS: Hash32 = [0x77; 32];

/// y = x/2 + 1/4 (+ a class-dependent rounding `noise`); backward: dx = dy/2, and a one-value
/// "parameter gradient" Σ x·dy.
struct Fake {
    class: DeterminismClass,
    noise: f32,
}

#[derive(Debug, thiserror::Error)]
#[error("no weights with that hash")]
struct UnknownWeights;

impl Replayer for Fake {
    type Error = UnknownWeights;

    fn class(&self) -> DeterminismClass {
        self.class
    }

    fn replay(&self, job: &JobCommitment, inputs: &JobInputs) -> Result<Replayed, UnknownWeights> {
        if job.weights_hash != WEIGHTS {
            return Err(UnknownWeights);
        }
        let StageData::Hidden(x) = &inputs.input else {
            return Err(UnknownWeights);
        };
        let map = |t: &Tensor| Tensor {
            data: t.data.iter().map(|v| v * 0.5 + 0.25 + self.noise).collect(),
            ..t.clone()
        };
        Ok(match &inputs.upstream {
            UpstreamData::Grad(g) => {
                let dx = map(g);
                let dot: f32 = x.data.iter().zip(&g.data).map(|(a, b)| a * b).sum();
                Replayed {
                    output_hash: dx.hash(),
                    grads_hash: grads_hash(None, &[vec![dot]]),
                    output: Some(dx),
                }
            }
            _ => {
                let y = map(x);
                Replayed {
                    output_hash: y.hash(),
                    grads_hash: NO_HASH,
                    output: Some(y),
                }
            }
        })
    }
}

fn engine() -> Fake {
    Fake {
        class: class(1),
        noise: 0.0,
    }
}

/// A stage with a worker (seed 1) and four other validators (seeds 2..=5).
struct World {
    worker: Identity,
    others: Vec<Identity>,
    validators: Vec<NodeId>,
}

impl World {
    fn new() -> Self {
        let worker = test_identity(1);
        let others: Vec<Identity> = (2..=5).map(test_identity).collect();
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

    /// Every job is audited, so tests can pick any; one test uses the default rate.
    fn ctx(&self) -> AuditContext<'_> {
        AuditContext {
            network: [5; 32],
            stage: 1,
            round: 3,
            seed: ChallengeSeed::from_beacon([5; 32], 1, 3, [0xab; 32]),
            validators: &self.validators,
            rate: AuditRate {
                per_million: 1_000_000,
            },
            limits: EvidenceLimits {
                max_rows: 16,
                dim: DIM,
            },
            tolerance: Tolerance::default(),
        }
    }

    fn assigned(&self, job: &JobCommitment) -> &Identity {
        let ctx = self.ctx();
        let a = auditor_for(&ctx.seed, &job.key(), job.worker, &self.validators).unwrap();
        self.others.iter().find(|i| i.node_id() == a).unwrap()
    }

    fn unassigned(&self, job: &JobCommitment) -> &Identity {
        let a = self.assigned(job).node_id();
        self.others.iter().find(|i| i.node_id() != a).unwrap()
    }
}

fn inputs(kind: JobKind) -> JobInputs {
    JobInputs {
        input: StageData::Hidden(hidden(2, 3, DIM, 0.5)),
        upstream: match kind {
            JobKind::Forward | JobKind::Offer => UpstreamData::None,
            JobKind::Backward => UpstreamData::Grad(hidden(2, 3, DIM, 1.5)),
        },
    }
}

/// The commitment an honest worker makes for `inputs`.
fn honest(worker: &Identity, kind: JobKind, inputs: &JobInputs) -> JobCommitment {
    let r = engine().replay(&template(worker, kind), inputs).unwrap();
    JobCommitment {
        input_hash: inputs.input.hash(),
        upstream_hash: inputs.upstream.hash(),
        output_hash: r.output_hash,
        grads_hash: r.grads_hash,
        ..template(worker, kind)
    }
}

fn template(worker: &Identity, kind: JobKind) -> JobCommitment {
    JobCommitment {
        network: [5; 32],
        worker: worker.node_id(),
        stage: 1,
        round: 3,
        step: 12,
        micro_batch: MicroBatchRef {
            origin: NodeId([9; 32]),
            step: 30,
            index: 1,
        },
        kind,
        class: class(1),
        weights_hash: WEIGHTS,
        input_hash: NO_HASH,
        upstream_hash: NO_HASH,
        output_hash: NO_HASH,
        grads_hash: NO_HASH,
        epoch: 0,
    }
}

/// What an auditor files after replaying `c` with `replayer`, claiming what it got.
fn accuse(
    auditor: &Identity,
    worker: &Identity,
    c: &JobCommitment,
    inputs: &JobInputs,
    replayer: &impl Replayer,
) -> FraudProof {
    let mine = replayer.replay(c, inputs).unwrap();
    let mut claimed = mine.clone();
    if (claimed.output_hash, claimed.grads_hash) == (c.output_hash, c.grads_hash) {
        // A lying accuser: it claims other bits than its honest replay gave.
        claimed.output_hash = [0xee; 32];
    }
    FraudProof::new(
        auditor,
        c.sign(worker),
        c,
        inputs.clone(),
        &claimed,
        None,
        1_000,
    )
}

#[test]
fn a_worker_returning_random_outputs_is_guilty() {
    let w = World::new();
    let inp = inputs(JobKind::Forward);
    let mut c = honest(&w.worker, JobKind::Forward, &inp);
    c.output_hash = hidden(2, 3, DIM, 9.0).hash();
    let proof = accuse(w.assigned(&c), &w.worker, &c, &inp, &engine());
    let v = check(&w.ctx(), &proof, &engine()).unwrap();
    assert_eq!(
        v,
        Verdict::Guilty {
            job: c.key(),
            worker: w.worker.node_id(),
            auditor: w.assigned(&c).node_id(),
        }
    );
}

#[test]
fn a_backward_job_with_forged_parameter_gradients_is_guilty() {
    let w = World::new();
    let inp = inputs(JobKind::Backward);
    let mut c = honest(&w.worker, JobKind::Backward, &inp);
    c.grads_hash = grads_hash(None, &[vec![0.0]]);
    let proof = accuse(w.assigned(&c), &w.worker, &c, &inp, &engine());
    assert!(matches!(
        check(&w.ctx(), &proof, &engine()),
        Ok(Verdict::Guilty { .. })
    ));
}

#[test]
fn an_auditor_accusing_an_honest_worker_loses() {
    let w = World::new();
    for kind in [JobKind::Forward, JobKind::Backward] {
        let inp = inputs(kind);
        let c = honest(&w.worker, kind, &inp);
        let auditor = w.assigned(&c);
        let proof = accuse(auditor, &w.worker, &c, &inp, &engine());
        assert_eq!(
            check(&w.ctx(), &proof, &engine()).unwrap(),
            Verdict::FalseAccusation {
                job: c.key(),
                worker: w.worker.node_id(),
                auditor: auditor.node_id(),
            }
        );
    }
}

#[test]
fn only_the_sampled_auditor_may_accuse_and_never_the_worker() {
    let w = World::new();
    let inp = inputs(JobKind::Forward);
    let mut c = honest(&w.worker, JobKind::Forward, &inp);
    c.output_hash = [1; 32];
    // A Sybil validator that appoints itself.
    let sybil = w.unassigned(&c);
    let proof = accuse(sybil, &w.worker, &c, &inp, &engine());
    assert!(matches!(
        check(&w.ctx(), &proof, &engine()),
        Err(EvidenceError::NotAssigned { assigned: Some(a) }) if a == w.assigned(&c).node_id()
    ));
    // The worker "auditing" itself, e.g. to collect the fee on its own honest job.
    let c = honest(&w.worker, JobKind::Forward, &inp);
    let proof = accuse(&w.worker, &w.worker, &c, &inp, &engine());
    assert!(matches!(
        check(&w.ctx(), &proof, &engine()),
        Err(EvidenceError::SelfAudit)
    ));
    // A key that is not even a registered validator.
    let outsider = test_identity(99);
    let proof = accuse(&outsider, &w.worker, &c, &inp, &engine());
    assert!(matches!(
        check(&w.ctx(), &proof, &engine()),
        Err(EvidenceError::NotAssigned { .. })
    ));
}

#[test]
fn jobs_the_sampler_did_not_pick_cannot_be_accused() {
    let w = World::new();
    let inp = inputs(JobKind::Forward);
    let mut c = honest(&w.worker, JobKind::Forward, &inp);
    c.output_hash = [1; 32];
    let mut ctx = w.ctx();
    ctx.rate = AuditRate { per_million: 0 };
    let proof = accuse(w.assigned(&c), &w.worker, &c, &inp, &engine());
    assert!(matches!(
        check(&ctx, &proof, &engine()),
        Err(EvidenceError::NotChallenged)
    ));
}

#[test]
fn old_or_misdirected_evidence_is_refused() {
    let w = World::new();
    let inp = inputs(JobKind::Forward);
    let mut c = honest(&w.worker, JobKind::Forward, &inp);
    c.output_hash = [1; 32];
    let proof = accuse(w.assigned(&c), &w.worker, &c, &inp, &engine());
    // The same evidence replayed into a later round's audit, or another stage's.
    let mut later = w.ctx();
    later.round = 4;
    assert!(matches!(
        check(&later, &proof, &engine()),
        Err(EvidenceError::WrongRound { round: 3, .. })
    ));
    let mut other_stage = w.ctx();
    other_stage.stage = 0;
    assert!(matches!(
        check(&other_stage, &proof, &engine()),
        Err(EvidenceError::WrongRound { .. })
    ));
    let mut other_net = w.ctx();
    other_net.network = [6; 32];
    assert!(matches!(
        check(&other_net, &proof, &engine()),
        Err(EvidenceError::WrongNetwork { .. })
    ));
    // An accusation about one commitment stapled to another.
    let mut other = c;
    other.micro_batch.index = 2;
    let mut stapled = proof.clone();
    stapled.job = other.sign(&w.worker);
    assert!(matches!(
        check(&w.ctx(), &stapled, &engine()),
        Err(EvidenceError::AccusationMismatch)
    ));
    // A commitment "by" the worker, signed by the accuser.
    let mut forged = proof.clone();
    forged.job = c.sign(w.assigned(&c));
    assert!(matches!(
        check(&w.ctx(), &forged, &engine()),
        Err(EvidenceError::Commitment(CommitError::NotTheWorker { .. }))
    ));
}

#[test]
fn inputs_must_be_the_committed_ones_and_one_micro_batch_at_most() {
    let w = World::new();
    let inp = inputs(JobKind::Backward);
    let mut c = honest(&w.worker, JobKind::Backward, &inp);
    c.output_hash = [1; 32];
    let proof = accuse(w.assigned(&c), &w.worker, &c, &inp, &engine());
    let mut swapped = proof.clone();
    swapped.inputs.input = StageData::Hidden(hidden(2, 3, DIM, 0.75));
    assert!(matches!(
        check(&w.ctx(), &swapped, &engine()),
        Err(EvidenceError::InputMismatch("input"))
    ));
    let mut no_grad = proof.clone();
    no_grad.inputs.upstream = UpstreamData::None;
    assert!(matches!(
        check(&w.ctx(), &no_grad, &engine()),
        Err(EvidenceError::KindMismatch(JobKind::Backward))
    ));
    let mut huge = proof.clone();
    huge.inputs.input = StageData::Hidden(hidden(4, 5, DIM, 0.5));
    assert!(matches!(
        check(&w.ctx(), &huge, &engine()),
        Err(EvidenceError::Limits(LimitError::Rows { rows: 20, .. }))
    ));
    let mut nan = proof.clone();
    if let StageData::Hidden(t) = &mut nan.inputs.input {
        t.data[0] = f32::NAN;
    }
    assert!(matches!(
        check(&w.ctx(), &nan, &engine()),
        Err(EvidenceError::NonFinite)
    ));
    // The same NaN never decodes from bytes at all.
    let bytes = nan.to_canonical_bytes();
    assert!(FraudProof::from_canonical_bytes(&bytes).is_err());
}

#[test]
fn an_accusation_without_a_dispute_or_with_a_forged_signature_is_refused() {
    let w = World::new();
    let inp = inputs(JobKind::Forward);
    let c = honest(&w.worker, JobKind::Forward, &inp);
    let auditor = w.assigned(&c);
    let same = engine().replay(&c, &inp).unwrap();
    let proof = FraudProof::new(
        auditor,
        c.sign(&w.worker),
        &c,
        inp.clone(),
        &same,
        None,
        1_000,
    );
    assert!(matches!(
        check(&w.ctx(), &proof, &engine()),
        Err(EvidenceError::NoDispute)
    ));
    let mut forged = accuse(auditor, &w.worker, &c, &inp, &engine());
    forged.accusation = Signed::from_parts(
        forged.accusation.payload_bytes().to_vec(),
        forged.accusation.signer(),
        forged.accusation.signature().malleate(),
    );
    assert!(matches!(
        check(&w.ctx(), &forged, &engine()),
        Err(EvidenceError::Accusation(_))
    ));
}

#[test]
fn a_checker_of_another_class_escalates_and_never_slashes() {
    let w = World::new();
    let other = Fake {
        class: class(2),
        noise: 1e-6,
    };
    let inp = inputs(JobKind::Forward);
    let honest_c = honest(&w.worker, JobKind::Forward, &inp);
    let sent = engine().replay(&honest_c, &inp).unwrap().output;
    let mut proof = accuse(w.assigned(&honest_c), &w.worker, &honest_c, &inp, &engine());
    proof.sent_output = sent;
    match check(&w.ctx(), &proof, &other).unwrap() {
        Verdict::Escalate {
            comparison: Some(cmp),
            job_class,
            checker_class,
            ..
        } => {
            assert!(cmp.within_tolerance && cmp.max_abs_diff > 0.0);
            assert_eq!((job_class, checker_class), (class(1), class(2)));
        }
        v => panic!("{v:?}"),
    }
    // A worker that sent garbage: far outside the tolerance, still only escalated.
    let garbage = hidden(2, 3, DIM, 9.0);
    let mut c = honest_c;
    c.output_hash = garbage.hash();
    let mut proof = accuse(w.assigned(&c), &w.worker, &c, &inp, &engine());
    proof.sent_output = Some(garbage);
    assert!(matches!(
        check(&w.ctx(), &proof, &other),
        Ok(Verdict::Escalate {
            comparison: Some(CrossClass {
                within_tolerance: false,
                ..
            }),
            ..
        })
    ));
    // A sent tensor that is not what the worker committed is refused.
    proof.sent_output = Some(hidden(2, 3, DIM, 8.0));
    assert!(matches!(
        check(&w.ctx(), &proof, &other),
        Err(EvidenceError::InputMismatch("sent output"))
    ));
}

#[test]
fn a_replayer_without_the_weights_gives_no_verdict() {
    let w = World::new();
    let inp = inputs(JobKind::Forward);
    let mut c = honest(&w.worker, JobKind::Forward, &inp);
    c.output_hash = [1; 32];
    let proof = accuse(w.assigned(&c), &w.worker, &c, &inp, &engine());
    let mut c2 = c;
    c2.weights_hash = [0; 32];
    let proof2 = FraudProof::new(
        w.assigned(&c2),
        c2.sign(&w.worker),
        &c2,
        inp.clone(),
        &Replayed {
            output_hash: [2; 32],
            grads_hash: NO_HASH,
            output: None,
        },
        None,
        1_000,
    );
    assert!(check(&w.ctx(), &proof, &engine()).is_ok());
    assert!(matches!(
        check(&w.ctx(), &proof2, &engine()),
        Err(EvidenceError::Replay(_))
    ));
}

#[test]
fn two_outputs_for_one_job_on_the_same_inputs_is_equivocation() {
    let w = World::new();
    let inp = inputs(JobKind::Forward);
    let sent = honest(&w.worker, JobKind::Forward, &inp);
    let mut kept = sent;
    kept.output_hash = [3; 32];
    assert_eq!(
        check_equivocation(&sent.sign(&w.worker), &kept.sign(&w.worker)).unwrap(),
        (sent.key(), w.worker.node_id())
    );
    // A micro-batch honestly run again after a step (other weights) is no equivocation.
    let mut rerun = kept;
    rerun.weights_hash = [8; 32];
    rerun.step += 1;
    assert!(check_equivocation(&sent.sign(&w.worker), &rerun.sign(&w.worker)).is_err());
    assert!(matches!(
        check_equivocation(&sent.sign(&w.worker), &sent.sign(&w.worker)),
        Err(EvidenceError::NoDispute)
    ));
}

#[test]
fn fraud_proofs_decode_from_their_bytes_and_truncation_is_an_error() {
    let w = World::new();
    let inp = inputs(JobKind::Backward);
    let mut c = honest(&w.worker, JobKind::Backward, &inp);
    c.output_hash = [1; 32];
    let mut proof = accuse(w.assigned(&c), &w.worker, &c, &inp, &engine());
    proof.sent_output = Some(hidden(2, 3, DIM, 0.0));
    let bytes = proof.to_canonical_bytes();
    let back = FraudProof::from_canonical_bytes(&bytes).unwrap();
    assert_eq!(back, proof);
    assert!(matches!(
        check(&w.ctx(), &back, &engine()),
        Err(EvidenceError::InputMismatch("sent output"))
    ));
    for cut in (0..bytes.len()).step_by(37) {
        assert!(FraudProof::from_canonical_bytes(&bytes[..cut]).is_err());
    }
}

proptest! {
    #[test]
    fn fraud_proofs_round_trip(inputs in arb_inputs(), claimed in any::<[u8; 32]>()) {
        let worker = test_identity(1);
        let c = template(&worker, JobKind::Forward);
        let proof = FraudProof::new(
            &test_identity(2),
            c.sign(&worker),
            &c,
            inputs,
            &Replayed { output_hash: claimed, grads_hash: NO_HASH, output: None },
            None,
            7,
        );
        let bytes = proof.to_canonical_bytes();
        prop_assert_eq!(FraudProof::from_canonical_bytes(&bytes).ok(), Some(proof));
    }

    #[test]
    fn accusations_round_trip(net in any::<[u8; 32]>(), stage in any::<u16>(), round in any::<u64>(),
                              h in prop::array::uniform4(any::<[u8; 32]>()), t in any::<u64>(),
                              provenance in any::<bool>()) {
        let charge = if provenance { Charge::Provenance } else { Charge::Replay };
        let a = Accusation {
            network: net, stage, round, job: JobKey(h[0]), commitment: h[1],
            claimed_output_hash: h[2], claimed_grads_hash: h[3], charge, timestamp_ms: t,
        };
        prop_assert_eq!(Accusation::from_canonical_bytes(&a.to_canonical_bytes()), Ok(a));
    }
}

/// A first-stage audit: the world's context and commitments moved to stage 0.
fn first_stage(w: &World) -> (AuditContext<'_>, JobCommitment, JobInputs) {
    let mut ctx = w.ctx();
    ctx.stage = 0;
    ctx.seed = ChallengeSeed::from_beacon(ctx.network, 0, ctx.round, [0xab; 32]);
    let inp = genesis_inputs(&[(1, 5), (2, 7)], 3, false);
    let c = JobCommitment {
        stage: 0,
        input_hash: inp.input.hash(),
        output_hash: [0x42; 32],
        ..template(&w.worker, JobKind::Forward)
    };
    (ctx, c, inp)
}

fn assigned_in<'w>(w: &'w World, ctx: &AuditContext<'_>, c: &JobCommitment) -> &'w Identity {
    let a = auditor_for(&ctx.seed, &c.key(), c.worker, &w.validators).unwrap();
    w.others.iter().find(|i| i.node_id() == a).unwrap()
}

#[test]
fn a_driver_training_on_text_that_is_not_the_genesis_it_names_is_guilty() {
    let w = World::new();
    let (ctx, _, honest_inputs) = first_stage(&w);
    // Other text under genesis names: the commitment binds exactly these tokens and names.
    let mut other = honest_inputs.clone();
    if let StageData::Genesis(g) = &mut other.input {
        g.tokens.ids.reverse();
    }
    let (_, mut c, _) = first_stage(&w);
    c.input_hash = other.input.hash();
    let auditor = assigned_in(&w, &ctx, &c);
    let proof = FraudProof::provenance(auditor, c.sign(&w.worker), &c, other, 9);
    assert_eq!(
        check_provenance_charge(&ctx, &proof, &Counting).unwrap(),
        Verdict::Guilty {
            job: c.key(),
            worker: w.worker.node_id(),
            auditor: auditor.node_id(),
        }
    );
    // Tokens with no names at all are no better.
    let StageData::Genesis(named) = &honest_inputs.input else {
        unreachable!("first_stage gives genesis inputs")
    };
    let plain = JobInputs {
        input: StageData::Tokens(named.tokens.clone()),
        upstream: UpstreamData::None,
    };
    c.input_hash = plain.input.hash();
    let auditor = assigned_in(&w, &ctx, &c);
    let proof = FraudProof::provenance(auditor, c.sign(&w.worker), &c, plain, 9);
    assert!(matches!(
        check_provenance_charge(&ctx, &proof, &Counting),
        Ok(Verdict::Guilty { .. })
    ));
}

#[test]
fn a_provenance_charge_against_genesis_text_convicts_the_accuser() {
    let w = World::new();
    let (ctx, c, inp) = first_stage(&w);
    let auditor = assigned_in(&w, &ctx, &c);
    let proof = FraudProof::provenance(auditor, c.sign(&w.worker), &c, inp.clone(), 9);
    assert!(matches!(
        check_provenance_charge(&ctx, &proof, &Counting),
        Ok(Verdict::FalseAccusation { .. })
    ));
    // Renaming the windows to frame the worker breaks the committed input hash.
    let mut renamed = inp;
    if let StageData::Genesis(g) = &mut renamed.input {
        g.windows[0].window = 6;
    }
    let proof = FraudProof::provenance(auditor, c.sign(&w.worker), &c, renamed, 9);
    assert!(matches!(
        check_provenance_charge(&ctx, &proof, &Counting),
        Err(EvidenceError::InputMismatch("input"))
    ));
}

#[test]
fn provenance_charges_stay_on_the_first_stage_and_in_their_own_check() {
    let w = World::new();
    let (ctx, c, inp) = first_stage(&w);
    let auditor = assigned_in(&w, &ctx, &c);
    let proof = FraudProof::provenance(auditor, c.sign(&w.worker), &c, inp.clone(), 9);
    // The replay check does not settle a provenance charge, nor the reverse.
    assert!(matches!(
        check(&ctx, &proof, &engine()),
        Err(EvidenceError::WrongCharge)
    ));
    let replay_charge = FraudProof::new(
        auditor,
        c.sign(&w.worker),
        &c,
        inp.clone(),
        &Replayed {
            output_hash: [0x43; 32],
            grads_hash: NO_HASH,
            output: None,
        },
        None,
        9,
    );
    assert!(matches!(
        check_provenance_charge(&ctx, &replay_charge, &Counting),
        Err(EvidenceError::WrongCharge)
    ));
    // A later stage reads no genesis text: nothing to charge there.
    let later = JobCommitment { stage: 1, ..c };
    let ctx1 = w.ctx();
    let auditor = assigned_in(&w, &ctx1, &later);
    let proof = FraudProof::provenance(auditor, later.sign(&w.worker), &later, inp, 9);
    assert!(matches!(
        check_provenance_charge(&ctx1, &proof, &Counting),
        Err(EvidenceError::NotFirstStage)
    ));
}

/// A round's offer on the first stage: the outer state it was taken against is its input.
fn offer(w: &World) -> (AuditContext<'_>, JobCommitment, JobInputs) {
    let (ctx, c, _) = first_stage(w);
    let inp = JobInputs {
        input: StageData::Outer {
            hash: [0x0e; 32],
            len: 1 << 20,
        },
        upstream: UpstreamData::None,
    };
    let c = JobCommitment {
        kind: JobKind::Offer,
        micro_batch: crate::commit::offer_micro_batch(w.worker.node_id(), ctx.round),
        input_hash: inp.input.hash(),
        upstream_hash: NO_HASH,
        ..c
    };
    (ctx, c, inp)
}

/// Re-encodes the offer: the outer state's hash stands in for θ₀ − θ, so an offer whose
/// output is that hash is the honest one.
struct Offers;

impl Replayer for Offers {
    type Error = UnknownWeights;

    fn class(&self) -> DeterminismClass {
        class(1)
    }

    fn replay(&self, job: &JobCommitment, inputs: &JobInputs) -> Result<Replayed, UnknownWeights> {
        match inputs.input {
            StageData::Outer { hash, .. } if job.kind == JobKind::Offer => Ok(Replayed {
                output_hash: hash,
                grads_hash: job.grads_hash,
                output: None,
            }),
            _ => Err(UnknownWeights),
        }
    }
}

#[test]
fn an_offer_that_is_not_the_pseudo_gradient_of_its_weights_is_guilty_and_an_honest_one_is_not() {
    let w = World::new();
    let (ctx, c, inp) = offer(&w);
    let auditor = assigned_in(&w, &ctx, &c);
    let replayed = |c: &JobCommitment| Replayed {
        output_hash: c.input_hash,
        grads_hash: c.grads_hash,
        output: None,
    };
    // The worker offered last round's blob ([0x42; 32]); the replay gives another.
    let proof = FraudProof::new(
        auditor,
        c.sign(&w.worker),
        &c,
        inp.clone(),
        &replayed(&c),
        None,
        9,
    );
    assert_eq!(
        check(&ctx, &proof, &Offers).unwrap(),
        Verdict::Guilty {
            job: c.key(),
            worker: w.worker.node_id(),
            auditor: auditor.node_id(),
        }
    );
    // An honest offer re-encodes to what it committed: accusing it convicts the accuser.
    let honest = JobCommitment {
        output_hash: c.input_hash,
        ..c
    };
    let lie = Replayed {
        output_hash: [0x42; 32],
        ..replayed(&honest)
    };
    let proof = FraudProof::new(
        auditor,
        honest.sign(&w.worker),
        &honest,
        inp.clone(),
        &lie,
        None,
        9,
    );
    assert_eq!(
        check(&ctx, &proof, &Offers).unwrap(),
        Verdict::FalseAccusation {
            job: honest.key(),
            worker: w.worker.node_id(),
            auditor: auditor.node_id(),
        }
    );
    // Its input is the outer state, never tokens or activations, and it reads no genesis
    // text: an offer with a micro-batch's inputs, or a provenance charge against one, is
    // refused before anything is replayed.
    let (_, forward, tokens) = first_stage(&w);
    let mixed = JobCommitment {
        input_hash: tokens.input.hash(),
        ..c
    };
    let proof = FraudProof::new(
        auditor,
        mixed.sign(&w.worker),
        &mixed,
        tokens.clone(),
        &replayed(&c),
        None,
        9,
    );
    assert!(matches!(
        check(&ctx, &proof, &Offers),
        Err(EvidenceError::KindMismatch(JobKind::Offer))
    ));
    let as_forward = JobCommitment {
        input_hash: inp.input.hash(),
        ..forward
    };
    let proof = FraudProof::new(
        auditor,
        as_forward.sign(&w.worker),
        &as_forward,
        inp.clone(),
        &replayed(&c),
        None,
        9,
    );
    assert!(matches!(
        check(&ctx, &proof, &Offers),
        Err(EvidenceError::KindMismatch(JobKind::Forward))
    ));
    let proof = FraudProof::provenance(auditor, c.sign(&w.worker), &c, inp, 9);
    assert!(matches!(
        check_provenance_charge(&ctx, &proof, &Counting),
        Err(EvidenceError::KindMismatch(JobKind::Offer))
    ));
}
