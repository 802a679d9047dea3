//! The reward rule: a pure, deterministic function of a verified proof and the prover's stake.
//!
//! Integer arithmetic only (the stake multiplier's logarithm is computed in fixed point), so
//! every machine computes the same reward bit for bit.

use neuroshard_proof::{Proof, ProofKind, Roles};

use crate::amount::{UNITS_PER_NEURO, bps_of};

/// Training: per batch, per layer held (0.0001 NEURO).
pub const TRAINING_PER_BATCH_LAYER: u64 = 100_000;
/// Inference: per token served (0.00001 NEURO).
pub const INFERENCE_PER_TOKEN: u64 = 10_000;
/// Uptime: per minute claimed, pro rata to the millisecond (0.001 NEURO).
pub const UPTIME_PER_MINUTE: u64 = 1_000_000;
/// Validator fee: per proof checked in a verification proof (0.00005 NEURO).
pub const VALIDATOR_FEE_PER_CHECK: u64 = 50_000;
/// Extra share for holding the embedding (its optimizer state is the largest).
pub const EMBEDDING_BONUS_BPS: u64 = 2_000;
/// Extra share for holding the LM head (it computes the loss for everyone).
pub const LM_HEAD_BONUS_BPS: u64 = 3_000;
/// Hard ceiling on one proof's reward, whatever the inputs.
pub const MAX_REWARD_PER_PROOF: u64 = 100 * UNITS_PER_NEURO;

/// Multipliers are in parts per billion: 1.0 = `MULTIPLIER_ONE`.
pub const MULTIPLIER_ONE: u64 = 1_000_000_000;
/// Stake scale of the multiplier: `1 + 0.1 * log2(1 + stake / STAKE_SCALE)`.
pub const STAKE_SCALE: u64 = 1_000 * UNITS_PER_NEURO;
/// 0.1 in multiplier units.
pub const STAKE_LOG_WEIGHT: u64 = 100_000_000;
/// Cap of the stake multiplier (1.5).
pub const MAX_STAKE_MULTIPLIER: u64 = 1_500_000_000;

/// `log2(num / den)` in Q32.32 fixed point, rounded down; requires `num >= den > 0` and
/// `num < 2^64 * den`. Bit-by-bit squaring: each step decides one fractional bit exactly.
pub fn log2_q32(num: u128, den: u128) -> u64 {
    if den == 0 || num < den {
        return 0;
    }
    let mut int = 0u32;
    while int < 63 && num >= den << (int + 1) {
        int += 1;
    }
    // y = num / (den * 2^int) in [1, 2), as Q2.62 (fits: y < 2^63, y^2 < 2^126).
    const FRAC: u32 = 62;
    let scaled_den = den << int;
    let Some(shifted) = num.checked_shl(FRAC).filter(|v| v >> FRAC == num) else {
        return u64::from(int) << 32;
    };
    let mut y = shifted / scaled_den;
    let mut frac = 0u64;
    for bit in (0..32).rev() {
        y = (y * y) >> FRAC;
        if y >= 2u128 << FRAC {
            y >>= 1;
            frac |= 1 << bit;
        }
    }
    (u64::from(int) << 32) | frac
}

/// `1 + 0.1 * log2(1 + stake / 1000 NEURO)`, capped at 1.5, in parts per billion.
pub fn stake_multiplier(stake: u64) -> u64 {
    // log2(x) >= 5 reaches the cap; skip the logarithm (and any overflow) beyond that.
    if stake >= 31 * STAKE_SCALE {
        return MAX_STAKE_MULTIPLIER;
    }
    let log = log2_q32(
        u128::from(stake) + u128::from(STAKE_SCALE),
        u128::from(STAKE_SCALE),
    );
    let bonus = (u128::from(STAKE_LOG_WEIGHT) * u128::from(log)) >> 32;
    let m = u128::from(MULTIPLIER_ONE) + bonus;
    u64::try_from(m)
        .unwrap_or(MAX_STAKE_MULTIPLIER)
        .min(MAX_STAKE_MULTIPLIER)
}

/// Reward before the stake multiplier: the named rate for the kind, plus role bonuses.
pub fn base_reward(proof: &Proof) -> u64 {
    let wide = |a: u64| u128::from(a);
    let raw: u128 = match proof.kind {
        ProofKind::Training => {
            wide(TRAINING_PER_BATCH_LAYER)
                * wide(proof.batches)
                * wide(u64::from(proof.layers.len()))
        }
        ProofKind::Inference => wide(INFERENCE_PER_TOKEN) * wide(proof.tokens),
        ProofKind::Uptime => wide(UPTIME_PER_MINUTE) * wide(proof.claimed_duration_ms) / 60_000,
        ProofKind::Verification => wide(VALIDATOR_FEE_PER_CHECK) * wide(proof.batches),
    };
    let base = u64::try_from(raw)
        .unwrap_or(u64::MAX)
        .min(MAX_REWARD_PER_PROOF);
    if !matches!(proof.kind, ProofKind::Training | ProofKind::Inference) {
        return base;
    }
    with_role_bonus(base, proof.roles).min(MAX_REWARD_PER_PROOF)
}

/// `amount` plus the bonuses of `roles`: the embedding's and the LM head's share of it.
pub fn with_role_bonus(amount: u64, roles: Roles) -> u64 {
    let mut bonus = 0u64;
    if roles.contains(Roles::EMBEDDING) {
        bonus = bonus.saturating_add(bps_of(amount, EMBEDDING_BONUS_BPS));
    }
    if roles.contains(Roles::LM_HEAD) {
        bonus = bonus.saturating_add(bps_of(amount, LM_HEAD_BONUS_BPS));
    }
    amount.saturating_add(bonus)
}

/// A training proof's reward: the network's fixed reward for one (node, stage, round) plus
/// the role bonuses; what the proof claims (tokens, batches) does not change it.
pub fn round_reward(proof: &Proof, round_reward: u64) -> u64 {
    with_role_bonus(round_reward, proof.roles)
}

/// The full reward for `proof` given the prover's current stake.
pub fn reward(proof: &Proof, prover_stake: u64) -> u64 {
    let m = u128::from(stake_multiplier(prover_stake));
    let total = u128::from(base_reward(proof)) * m / u128::from(MULTIPLIER_ONE);
    u64::try_from(total)
        .unwrap_or(u64::MAX)
        .min(MAX_REWARD_PER_PROOF)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuroshard_proof::fixtures::{test_identity, training_proof, uptime_proof};

    #[test]
    fn log2_is_exact_on_powers_of_two_and_close_elsewhere() {
        for k in 0..40u32 {
            assert_eq!(log2_q32(1u128 << k, 1), u64::from(k) << 32);
        }
        // log2(3) = 1.584962500721156...
        let l = log2_q32(3, 1) as f64 / 4_294_967_296.0;
        assert!((l - 1.584_962_500_721_156).abs() < 1e-9, "{l}");
        let l = log2_q32(1_000_001, 1_000_000) as f64 / 4_294_967_296.0;
        assert!((l - 1.442_694_e-6).abs() < 1e-9, "{l}");
    }

    #[test]
    fn stake_multiplier_follows_the_formula_and_caps() {
        assert_eq!(stake_multiplier(0), MULTIPLIER_ONE);
        assert_eq!(stake_multiplier(STAKE_SCALE), 1_100_000_000);
        assert_eq!(stake_multiplier(3 * STAKE_SCALE), 1_200_000_000);
        assert_eq!(stake_multiplier(31 * STAKE_SCALE), MAX_STAKE_MULTIPLIER);
        assert_eq!(stake_multiplier(u64::MAX), MAX_STAKE_MULTIPLIER);
        // 500 NEURO: 1 + 0.1 * log2(1.5) = 1.0584962500...
        let m = stake_multiplier(STAKE_SCALE / 2);
        assert!((1_058_496_249..=1_058_496_250).contains(&m), "{m}");
        let mut last = 0;
        for s in (0..40).map(|i| i * STAKE_SCALE) {
            assert!(stake_multiplier(s) >= last);
            last = stake_multiplier(s);
        }
    }

    #[test]
    fn base_rewards_use_the_named_rates() {
        let a = test_identity(1);
        let b = test_identity(2);
        let t = training_proof(&a, &b, 1, 0);
        let expected = TRAINING_PER_BATCH_LAYER * t.batches * u64::from(t.layers.len());
        assert_eq!(base_reward(&t), expected);
        let mut head = t.clone();
        head.roles = Roles::LM_HEAD.with(Roles::EMBEDDING);
        assert_eq!(
            base_reward(&head),
            expected + expected / 5 + expected * 3 / 10
        );
        let u = uptime_proof(&a, 1, 0);
        assert_eq!(
            base_reward(&u),
            UPTIME_PER_MINUTE * u.claimed_duration_ms / 60_000
        );
        assert!(base_reward(&u) > 0);
        assert_eq!(reward(&t, STAKE_SCALE), expected * 11 / 10);
        let mut huge = t;
        huge.batches = u64::MAX;
        assert_eq!(reward(&huge, u64::MAX), MAX_REWARD_PER_PROOF);
    }
}
