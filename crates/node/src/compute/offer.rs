//! A replica's DiLoCo offer as an audited job (verification by recomputation, issue 15).
//!
//! When it offers a round, the engine keeps what re-encoding the offer needs: the weights the
//! pseudo-gradient was taken from, and the outer state (θ₀) it was taken against. An auditor
//! gets both in one blob (weights first) and re-encodes θ₀ − θ in the round's encoding
//! ([`crate::replica::recompute_offer`]); an offer that is not the replica's own
//! pseudo-gradient of the weights it names (last round's, say) gives other bytes.

use neuroshard_audit::{
    JobCommitment, JobInputs, JobKind, Replayed, StageData, UpstreamData, offer_micro_batch,
};
use neuroshard_model::{Stage, StageSpec};
use neuroshard_proof::{Hash32, NodeId};

use super::Engine;
use super::audit::{outer_name, weights_from_bytes};
use crate::core::EngineError;
use crate::replica::{Prepared, encode_adamw, recompute_offer};

/// What an offer's commitment names, from the engine that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfferHashes {
    /// Optimizer steps applied when the offer was made (what its evidence is filed under).
    pub step: u64,
    /// The model hash of the weights the pseudo-gradient was taken from.
    pub weights: Hash32,
    /// BLAKE3 of the encoded outer state the offer was taken against (its base), and its
    /// length.
    pub outer: Hash32,
    pub outer_len: u64,
    /// BLAKE3 of the encoded AdamW state then.
    pub adamw: Hash32,
}

impl OfferHashes {
    /// The offer's inputs as its evidence carries them: the outer state, by reference.
    pub fn inputs(&self) -> JobInputs {
        JobInputs {
            input: StageData::Outer {
                hash: self.outer,
                len: self.outer_len,
            },
            upstream: UpstreamData::None,
        }
    }
}

impl Engine {
    /// Our offer of `round`, with what its commitment names; its evidence is kept for our
    /// auditors (a store that fails to write loses it, not the offer: the auditor who asks
    /// gets a refusal).
    pub(super) fn sync_prepare(
        &mut self,
        round: u64,
    ) -> Result<(Prepared, OfferHashes), EngineError> {
        let d = self.diloco.as_mut().ok_or(EngineError::DilocoOff)?;
        let prepared = d.prepare(round, self.stage.params())?;
        let (me, outer, outer_hash) = (d.config().me, d.outer_bytes(), d.hash());
        let step = self.version.unwrap_or(0);
        let hashes = OfferHashes {
            step,
            // Hashed afresh (once a round): the offer names exactly the weights it was taken
            // from, whatever moved them since a job last ran.
            weights: self.stage.model_hash(),
            outer: outer_hash,
            outer_len: outer.len() as u64,
            adamw: *blake3::hash(&encode_adamw(&self.optimizer)).as_bytes(),
        };
        let _ = self.keep_offer_evidence(me, round, &hashes, outer);
        Ok((prepared, hashes))
    }

    /// The offer's weights and inputs are kept as a job's are; its outer state beside them.
    fn keep_offer_evidence(
        &mut self,
        me: NodeId,
        round: u64,
        h: &OfferHashes,
        outer: Vec<u8>,
    ) -> Result<(), EngineError> {
        // Filed under the round its jobs carry (the one before the offer's), as its
        // commitment names it.
        let id = offer_micro_batch(me, round.saturating_sub(1)).into();
        self.keep_evidence(&id, JobKind::Offer, h.step, &h.weights, &h.inputs())?;
        if let Some(store) = self.store.as_mut() {
            store.put(outer_name(&h.outer), outer, h.step)?;
        }
        Ok(())
    }

    /// Re-encodes an offer of the stage `spec` from its evidence blob (the weights, then the
    /// outer state its input names): the replay of a [`JobKind::Offer`].
    pub(super) fn replay_offer(
        &self,
        spec: StageSpec,
        job: &JobCommitment,
        inputs: &JobInputs,
        blob: &[u8],
    ) -> Result<Replayed, EngineError> {
        let (StageData::Outer { hash, len }, UpstreamData::None) =
            (&inputs.input, &inputs.upstream)
        else {
            return Err(EngineError::AuditInputs(
                "an offer's input is an outer state".into(),
            ));
        };
        let cfg = self.diloco.as_ref().ok_or(EngineError::DilocoOff)?.config();
        let mut stage = if spec == *self.stage.spec() {
            self.stage.clone()
        } else {
            Stage::init(self.stage.config().clone(), spec, 0)?
        };
        let numel = stage.params().numel();
        let split = numel.saturating_mul(4);
        if usize::try_from(*len)
            .ok()
            .and_then(|l| l.checked_add(split))
            != Some(blob.len())
        {
            return Err(EngineError::AuditWeights(format!(
                "{} bytes for {numel} parameters and an outer state of {len}",
                blob.len()
            )));
        }
        let (weights, outer) = blob.split_at(split);
        if *blake3::hash(outer).as_bytes() != *hash {
            return Err(EngineError::AuditWeights(
                "the outer state served is not the one the offer names".into(),
            ));
        }
        let theta = weights_from_bytes(weights, numel)?;
        stage.params_mut().set_flat(&theta)?;
        if stage.model_hash() != job.weights_hash {
            return Err(EngineError::AuditWeights(
                "the weights served are not those the offer names".into(),
            ));
        }
        let offer = recompute_offer(cfg, outer, &theta, stage.params(), job.round)?;
        Ok(Replayed {
            output_hash: *blake3::hash(&offer).as_bytes(),
            // The round's state is committed, not recomputed: only the offer is disputed.
            grads_hash: job.grads_hash,
            output: None,
        })
    }
}
