//! Why a stage refuses a peer's pipeline message. The peer is penalised with the reason and
//! gets it back as the refusal's text.

use neuroshard_model::ModelError;

use crate::act_codec::ActCodecError;

#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("stage 0 takes no forward input (micro-batch {0})")]
    ForwardToFirstStage(String),
    #[error("micro-batch {0}'s first hop comes from its driver, not from another replica")]
    NotFromTheDriver(String),
    #[error("stage {0} takes hidden states, got token ids")]
    TokensToLaterStage(usize),
    #[error(transparent)]
    Packed(#[from] ActCodecError),
    #[error(transparent)]
    Tensor(#[from] ModelError),
    #[error(transparent)]
    Norm(#[from] super::norms::NormOutlier),
    #[error("{targets} targets for a [{batch}, {seq}] micro-batch")]
    TargetCount {
        targets: usize,
        batch: usize,
        seq: usize,
    },
    #[error("stage {stage} is not part of architecture version {version}")]
    NotInVersion { stage: usize, version: u32 },
    #[error("target id {0} outside the vocabulary")]
    TargetOutsideVocabulary(u32),
    #[error("the last stage takes no gradient")]
    GradientToLastStage,
    #[error("gradient for micro-batch {0} this node never sent")]
    NeverSent(String),
    #[error("gradient for micro-batch {0} from a replica it was not sent to")]
    NotSentThere(String),
    #[error("loss {0} is not finite")]
    NonFiniteLoss(f32),
    #[error("no stashed input for micro-batch {0}")]
    NotStashed(String),
    #[error(
        "micro-batch of [{batch}, {seq}]: this network's have {min_rows} to {max_rows} rows of {expected_seq}"
    )]
    MicroBatchShape {
        batch: usize,
        seq: usize,
        min_rows: usize,
        max_rows: usize,
        expected_seq: usize,
    },
    #[error("gradient shape [{got_batch}, {got_seq}] for a [{batch}, {seq}] micro-batch")]
    GradientShape {
        got_batch: usize,
        got_seq: usize,
        batch: usize,
        seq: usize,
    },
}
