//! Replay of one pipeline job, bit for bit, for verification by recomputation.
//!
//! A job is replayed through the very functions the node's engine runs ([`Stage::forward`]
//! for a forward job, [`Stage::backward`] for a backward one), on the weights the job used and
//! its committed inputs, and its outputs are hashed as commitments name them. Within one
//! [`DeterminismClass`] the bits, hence the hashes, are those the worker's engine produced,
//! whatever the thread count.

use std::collections::BTreeMap;
use std::sync::Arc;

use neuroshard_audit::{
    DeterminismClass, GenesisTokens, IsaLevel, JobCommitment, JobInputs, JobKind, NO_HASH,
    Replayed, Replayer, StageData, Tensor, TokenIds, UpstreamData, grads_hash,
};

use crate::error::ModelError;
use crate::stage::{Activations, Stage, StageGrads, StageInput, Tokens, Upstream};

/// The determinism class of this process: build, instruction level, cache geometry as the
/// matrix kernels see it, and the micro-batch count the caller trains with.
pub fn determinism_class(micro_batches: u16) -> DeterminismClass {
    DeterminismClass {
        build: build_hash(),
        isa: isa_level(),
        cache_bytes: cache_bytes(),
        micro_batches,
    }
}

/// Engine name and version, kernel features and target. Two builds of this crate's version
/// for one target with the same features run the same kernels; a node may fold its binary's
/// hash into a class of its own when it wants to be stricter.
fn build_hash() -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/build/v1");
    for part in [
        crate::engine_name().as_str(),
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        std::env::consts::OS,
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    *h.finalize().as_bytes()
}

/// The instruction level detected at run time, which the kernels dispatch on.
fn isa_level() -> IsaLevel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            IsaLevel::X86V4
        } else if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            IsaLevel::X86V3
        } else if std::arch::is_x86_feature_detected!("sse4.2") {
            IsaLevel::X86V2
        } else {
            IsaLevel::Baseline
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        IsaLevel::Neon
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        IsaLevel::Baseline
    }
}

/// L1d, L2, L3 sizes as the matrix kernels read them: their blocking, hence their order of
/// summation, follows these numbers.
fn cache_bytes() -> [u64; 3] {
    let info = &*gemm_common::cache::CACHE_INFO;
    [0, 1, 2].map(|i| info[i].cache_bytes as u64)
}

/// A committed input as the engine takes it (an offer's outer state is no stage input).
pub fn stage_input(data: &StageData) -> Result<StageInput, ModelError> {
    Ok(match data {
        StageData::Tokens(t) | StageData::Genesis(GenesisTokens { tokens: t, .. }) => {
            StageInput::Tokens(Tokens {
                batch: t.batch as usize,
                seq: t.seq as usize,
                ids: t.ids.clone(),
            })
        }
        StageData::Hidden(t) => StageInput::Hidden(activations(t)),
        StageData::Outer { .. } => {
            return Err(ModelError::Input(
                "an outer state is an offer's input, not a stage's".into(),
            ));
        }
    })
}

fn activations(t: &Tensor) -> Activations {
    Activations {
        batch: t.batch as usize,
        seq: t.seq as usize,
        dim: t.dim as usize,
        data: t.data.clone(),
    }
}

/// An engine tensor as evidence carries it; None when a dimension exceeds `u32`.
pub fn tensor(a: &Activations) -> Option<Tensor> {
    Some(Tensor {
        batch: u32::try_from(a.batch).ok()?,
        seq: u32::try_from(a.seq).ok()?,
        dim: u32::try_from(a.dim).ok()?,
        data: a.data.clone(),
    })
}

/// What a job consumed, as a commitment hashes it and evidence carries it: the stage input,
/// and for a backward job what came from downstream. None when a dimension exceeds `u32`.
pub fn job_inputs(input: &StageInput, upstream: Option<&Upstream>) -> Option<JobInputs> {
    let (batch, seq) = match input {
        StageInput::Tokens(t) => (t.batch, t.seq),
        StageInput::Hidden(a) => (a.batch, a.seq),
    };
    let (batch, seq) = (u32::try_from(batch).ok()?, u32::try_from(seq).ok()?);
    let input = match input {
        StageInput::Tokens(t) => StageData::Tokens(TokenIds {
            batch,
            seq,
            ids: t.ids.clone(),
        }),
        StageInput::Hidden(a) => StageData::Hidden(tensor(a)?),
    };
    let upstream = match upstream {
        None => UpstreamData::None,
        Some(Upstream::Grad(g)) => UpstreamData::Grad(tensor(g)?),
        Some(Upstream::Targets(ids)) => UpstreamData::Targets(TokenIds {
            batch,
            seq,
            ids: ids.clone(),
        }),
    };
    Some(JobInputs { input, upstream })
}

/// What the network does to a tensor before its receiver computes on it (the activation
/// codec's pack and unpack); the identity when tensors travel as raw `f32`.
pub type WireFn = Arc<dyn Fn(&Activations) -> Activations + Send + Sync>;

/// The hashes a forward job's commitment names, from its output as the engine produced it.
pub fn forward_hashes(output: &Activations, wire: Option<&WireFn>) -> Replayed {
    let sent = wire.map_or_else(|| output.clone(), |w| w(output));
    Replayed {
        output_hash: sent.hash(),
        grads_hash: NO_HASH,
        output: tensor(&sent),
    }
}

/// The hashes a backward job's commitment names: the input gradient sent upstream (none on
/// the embedding stage) and the parameter gradients with the loss.
pub fn backward_hashes(grads: &StageGrads, wire: Option<&WireFn>) -> Replayed {
    let sent = grads
        .input_grad
        .as_ref()
        .map(|g| wire.map_or_else(|| g.clone(), |w| w(g)));
    Replayed {
        output_hash: sent.as_ref().map_or(NO_HASH, Activations::hash),
        grads_hash: grads_hash(grads.loss, &grads.params),
        output: sent.as_ref().and_then(tensor),
    }
}

/// Replays one job on `stage` (the weights it used): the engine's own forward or backward.
pub fn replay_job(
    stage: &Stage,
    kind: JobKind,
    inputs: &JobInputs,
    wire: &Wire,
) -> Result<Replayed, ModelError> {
    let input = stage_input(&inputs.input)?;
    match (kind, &inputs.upstream) {
        (JobKind::Forward, UpstreamData::None) => Ok(forward_hashes(
            &stage.forward(&input)?,
            wire.forward.as_ref(),
        )),
        (JobKind::Backward, UpstreamData::Grad(g)) => Ok(backward_hashes(
            &stage.backward(&input, &Upstream::Grad(activations(g)))?,
            wire.backward.as_ref(),
        )),
        (JobKind::Backward, UpstreamData::Targets(t)) => Ok(backward_hashes(
            &stage.backward(&input, &Upstream::Targets(t.ids.clone()))?,
            wire.backward.as_ref(),
        )),
        (kind, _) => Err(ModelError::Input(format!(
            "a {kind:?} job with the other kind's upstream data"
        ))),
    }
}

/// The network's activation codec per direction (None: raw `f32`).
#[derive(Clone, Default)]
pub struct Wire {
    pub forward: Option<WireFn>,
    pub backward: Option<WireFn>,
}

/// Why a job could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("no weights with hash {0:02x?} are held for replay")]
    UnknownWeights([u8; 32]),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// The real [`Replayer`]: the engine, with the weights of the jobs it may be asked about,
/// found by their hash ([`Stage::model_hash`]).
#[derive(Clone)]
pub struct EngineReplayer {
    class: DeterminismClass,
    stages: BTreeMap<[u8; 32], Stage>,
    wire: Wire,
}

impl EngineReplayer {
    pub fn new(class: DeterminismClass, wire: Wire) -> Self {
        Self {
            class,
            stages: BTreeMap::new(),
            wire,
        }
    }

    /// Holds `stage`'s weights for replay; returns their hash.
    pub fn add(&mut self, stage: Stage) -> [u8; 32] {
        let hash = stage.model_hash();
        self.stages.insert(hash, stage);
        hash
    }
}

impl Replayer for EngineReplayer {
    type Error = ReplayError;

    fn class(&self) -> DeterminismClass {
        self.class
    }

    fn replay(&self, job: &JobCommitment, inputs: &JobInputs) -> Result<Replayed, ReplayError> {
        let stage = self
            .stages
            .get(&job.weights_hash)
            .ok_or(ReplayError::UnknownWeights(job.weights_hash))?;
        Ok(replay_job(stage, job.kind, inputs, &self.wire)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::params::StageSpec;

    #[test]
    fn the_class_is_stable_within_a_process() {
        let a = determinism_class(2);
        assert_eq!(a, determinism_class(2));
        assert_eq!(a.micro_batches, 2);
        assert!(a.cache_bytes.iter().all(|&c| c > 0));
    }

    #[test]
    fn tensor_hashes_agree_between_model_and_audit() {
        let a = Activations {
            batch: 2,
            seq: 3,
            dim: 5,
            data: (0..30).map(|i| i as f32 * 0.1).collect(),
        };
        assert_eq!(a.hash(), tensor(&a).unwrap().hash());
    }

    #[test]
    fn a_job_with_the_other_kinds_data_is_an_error_not_a_panic() {
        let cfg = ModelConfig {
            layers: 2,
            d_model: 16,
            heads: 2,
            kv_heads: 2,
            ffn: 32,
            vocab: 32,
            max_seq: 8,
            tie_embeddings: false,
            rope_theta: 10_000.0,
            norm_eps: 1e-6,
        };
        let spec = StageSpec::split(&cfg, 2).unwrap()[0];
        let stage = Stage::init(cfg, spec, 1).unwrap();
        let inputs = JobInputs {
            input: StageData::Tokens(TokenIds {
                batch: 1,
                seq: 2,
                ids: vec![1, 2],
            }),
            upstream: UpstreamData::None,
        };
        assert!(replay_job(&stage, JobKind::Backward, &inputs, &Wire::default()).is_err());
        // Token ids outside the vocabulary: refused by the engine's own validation.
        let bad = JobInputs {
            input: StageData::Tokens(TokenIds {
                batch: 1,
                seq: 2,
                ids: vec![1, 999],
            }),
            upstream: UpstreamData::None,
        };
        assert!(replay_job(&stage, JobKind::Forward, &bad, &Wire::default()).is_err());
        assert!(replay_job(&stage, JobKind::Forward, &inputs, &Wire::default()).is_ok());
    }
}
