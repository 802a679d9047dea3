//! Plausibility: is the claimed work physically possible for the declared hardware and
//! consistent with the node's own history? All limits are named constants.

use crate::proof::{HardwareClass, Proof, ProofKind, Roles};

/// Shortest work interval a proof may claim; shorter claims make rates meaningless.
pub const MIN_CLAIMED_DURATION_MS: u64 = 1_000;
/// Longest work interval a proof may claim.
pub const MAX_CLAIMED_DURATION_MS: u64 = 3_600_000;
/// Model depth bound for layer ranges.
pub const MAX_LAYERS: u32 = 1_024;
/// Largest batch (in tokens) any stage accepts.
pub const MAX_TOKENS_PER_BATCH: u64 = 1 << 20;
/// Samples of a node's own history needed before its history limit applies.
pub const HISTORY_MIN_SAMPLES: u32 = 8;
/// A proof may claim at most this multiple of the node's smoothed past rate.
pub const HISTORY_BURST_FACTOR: u64 = 4;
/// Smoothing of the history rate: new = old + (sample - old) / 2^HISTORY_EMA_SHIFT.
pub const HISTORY_EMA_SHIFT: u32 = 3;

/// Per-hardware-class throughput ceilings. A "layer-token" is one token through one layer,
/// so holding more layers does not let a node claim more tokens per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HardwareLimits {
    pub max_layer_tokens_per_sec: u64,
    pub max_batches_per_sec: u64,
}

pub const CPU_LIMITS: HardwareLimits = HardwareLimits {
    max_layer_tokens_per_sec: 200_000,
    max_batches_per_sec: 20,
};
pub const CONSUMER_GPU_LIMITS: HardwareLimits = HardwareLimits {
    max_layer_tokens_per_sec: 20_000_000,
    max_batches_per_sec: 500,
};
pub const DATACENTER_GPU_LIMITS: HardwareLimits = HardwareLimits {
    max_layer_tokens_per_sec: 200_000_000,
    max_batches_per_sec: 5_000,
};

impl HardwareClass {
    pub fn limits(self) -> HardwareLimits {
        match self {
            HardwareClass::Cpu => CPU_LIMITS,
            HardwareClass::ConsumerGpu => CONSUMER_GPU_LIMITS,
            HardwareClass::DatacenterGpu => DATACENTER_GPU_LIMITS,
        }
    }
}

/// Why a proof's claims are implausible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlausibilityError {
    #[error("claimed duration {got} ms outside [{min}, {max}] ms")]
    Duration { got: u64, min: u64, max: u64 },
    #[error("layer range {start}..{end} is empty or beyond {max} layers")]
    Layers { start: u32, end: u32, max: u32 },
    #[error("{kind:?} proof is inconsistent: {reason}")]
    Inconsistent {
        kind: ProofKind,
        reason: &'static str,
    },
    #[error("{got} layer-tokens/s exceeds the {hardware:?} limit of {max}")]
    TokenRate {
        got: u64,
        max: u64,
        hardware: HardwareClass,
    },
    #[error("{got} batches/s exceeds the {hardware:?} limit of {max}")]
    BatchRate {
        got: u64,
        max: u64,
        hardware: HardwareClass,
    },
    #[error("{got} layer-tokens/s is over {HISTORY_BURST_FACTOR}x this node's history ({history})")]
    AboveHistory { got: u64, history: u64 },
    #[error("claimed {kind:?} time in the last window is {got} ms, more than the window {max} ms")]
    CumulativeDuration { kind: ProofKind, got: u64, max: u64 },
}

/// `numerator * 1000 / duration_ms` without overflow (saturating at u64::MAX).
pub fn per_second(amount: u64, duration_ms: u64) -> u64 {
    let v = u128::from(amount) * 1000 / u128::from(duration_ms.max(1));
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Layer-tokens per second claimed by `proof`.
pub fn layer_token_rate(proof: &Proof) -> u64 {
    per_second(
        proof.tokens.saturating_mul(u64::from(proof.layers.len())),
        proof.claimed_duration_ms,
    )
}

/// Stateless checks: field consistency per kind and the hardware ceilings.
pub fn check_static(proof: &Proof) -> Result<(), PlausibilityError> {
    let d = proof.claimed_duration_ms;
    if !(MIN_CLAIMED_DURATION_MS..=MAX_CLAIMED_DURATION_MS).contains(&d) {
        return Err(PlausibilityError::Duration {
            got: d,
            min: MIN_CLAIMED_DURATION_MS,
            max: MAX_CLAIMED_DURATION_MS,
        });
    }
    let inconsistent = |reason| PlausibilityError::Inconsistent {
        kind: proof.kind,
        reason,
    };
    match proof.kind {
        ProofKind::Training | ProofKind::Inference => {
            if proof.layers.is_empty() || proof.layers.end > MAX_LAYERS {
                return Err(PlausibilityError::Layers {
                    start: proof.layers.start,
                    end: proof.layers.end,
                    max: MAX_LAYERS,
                });
            }
            if proof.batches == 0 || proof.tokens < proof.batches {
                return Err(inconsistent(
                    "needs at least one batch and one token per batch",
                ));
            }
            if proof.tokens / proof.batches > MAX_TOKENS_PER_BATCH {
                return Err(inconsistent("batch larger than MAX_TOKENS_PER_BATCH"));
            }
            if proof.kind == ProofKind::Training && proof.shards.is_empty() {
                return Err(inconsistent("training proof names no data shard"));
            }
        }
        ProofKind::Uptime => {
            if proof.tokens != 0 || proof.batches != 0 || proof.roles != Roles::NONE {
                return Err(inconsistent("uptime proof claims tokens, batches or roles"));
            }
        }
        ProofKind::Verification => {
            // `batches` counts the proofs this validator checked.
            if proof.batches == 0 || proof.tokens != 0 {
                return Err(inconsistent(
                    "verification proof must count checked proofs only",
                ));
            }
        }
    }
    let limits = proof.hardware.limits();
    let token_rate = layer_token_rate(proof);
    if token_rate > limits.max_layer_tokens_per_sec {
        return Err(PlausibilityError::TokenRate {
            got: token_rate,
            max: limits.max_layer_tokens_per_sec,
            hardware: proof.hardware,
        });
    }
    let batch_rate = per_second(proof.batches, d);
    if proof.kind != ProofKind::Verification && batch_rate > limits.max_batches_per_sec {
        return Err(PlausibilityError::BatchRate {
            got: batch_rate,
            max: limits.max_batches_per_sec,
            hardware: proof.hardware,
        });
    }
    Ok(())
}

/// A node's smoothed past layer-token rate (integer EMA, identical on every machine).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHistory {
    pub samples: u32,
    pub ema: u64,
}

impl RateHistory {
    pub fn check(&self, rate: u64) -> Result<(), PlausibilityError> {
        if self.samples >= HISTORY_MIN_SAMPLES
            && rate > self.ema.saturating_mul(HISTORY_BURST_FACTOR)
        {
            return Err(PlausibilityError::AboveHistory {
                got: rate,
                history: self.ema,
            });
        }
        Ok(())
    }

    pub fn record(&mut self, rate: u64) {
        if self.samples == 0 {
            self.ema = rate;
        } else {
            let delta = (i128::from(rate) - i128::from(self.ema)) >> HISTORY_EMA_SHIFT;
            let next = i128::from(self.ema) + delta;
            self.ema = u64::try_from(next.max(0)).unwrap_or(u64::MAX);
        }
        self.samples = self.samples.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_handles_extremes() {
        assert_eq!(per_second(1_000, 1_000), 1_000);
        assert_eq!(per_second(u64::MAX, 1), u64::MAX);
        assert_eq!(per_second(5, 0), 5_000);
    }

    #[test]
    fn history_limits_sudden_bursts_only_after_warmup() {
        let mut h = RateHistory::default();
        for _ in 0..HISTORY_MIN_SAMPLES {
            assert_eq!(h.check(1_000_000), Ok(()));
            h.record(1_000);
        }
        assert_eq!(h.ema, 1_000);
        assert_eq!(h.check(4_000), Ok(()));
        assert!(matches!(
            h.check(4_001),
            Err(PlausibilityError::AboveHistory { .. })
        ));
    }
}
