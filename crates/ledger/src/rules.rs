//! The network's economic rules and its initial stakes, fixed by the network genesis.
//!
//! Every node of a network opens its ledger with the same [`LedgerGenesis`], so they start from
//! one state and judge every message by the same numbers. Nothing here reads a clock: the one
//! time-dependent rule (how many rounds can have happened by a proof's timestamp) reads the
//! proof's signed timestamp and the genesis's founding time.

use neuroshard_growth::NetworkGrowth;
use neuroshard_proof::{Hash32, NodeId, PublicKey};

use crate::amount::UNITS_PER_NEURO;

/// Most initial stakes one genesis may name.
pub const MAX_GENESIS_STAKES: usize = 4096;
/// Stake needed to register for a stage unless the genesis says otherwise (10 NEURO).
pub const DEFAULT_MIN_STAKE: u64 = 10 * UNITS_PER_NEURO;
/// Reward of one (node, stage, round) unless the genesis says otherwise (1 NEURO).
pub const DEFAULT_ROUND_REWARD: u64 = UNITS_PER_NEURO;
/// Shortest possible DiLoCo round unless the genesis says otherwise: a proof for round r is
/// refused before `founded_ms + r × min_round_ms`.
pub const DEFAULT_MIN_ROUND_MS: u64 = 250;
/// How many rounds past its stage's certified round (see `LedgerState::certified_round`) a
/// training proof may claim unless the genesis says otherwise.
pub const DEFAULT_ROUND_LEAD: u64 = 8;
/// How long unstaked funds stay slashable before a withdrawal frees them, unless the genesis
/// says otherwise (a day): evidence of what the stake did just before (an equivocation, a
/// cheated job) reaches every ledger well within it.
pub const DEFAULT_UNBONDING_MS: u64 = 24 * 60 * 60 * 1000;

/// Numbers every ledger of one network applies alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The network's id; proofs, receipts and ops naming another are refused.
    pub network: Hash32,
    /// When the network started (the genesis's signed time).
    pub founded_ms: u64,
    /// Stake an account needs to register for a stage.
    pub min_stake: u64,
    /// What one registered replica earns for one certified round of its stage.
    pub round_reward: u64,
    /// Rounds cannot be faster than this (0: no bound).
    pub min_round_ms: u64,
    /// A training proof may claim at most this many rounds past the round that half of its
    /// stage's recently active provers reached (0: no bound). Encoded only when set, so
    /// rules written before it existed keep their bytes and hash.
    pub round_lead: u64,
    /// An unstake leaves its amount slashable this long before a withdrawal frees it.
    /// Encoded only when not [`DEFAULT_UNBONDING_MS`], for the same reason.
    pub unbonding_ms: u64,
}

impl Default for Rules {
    /// Rules for tests and offline tools: network id zero, founded at time zero.
    fn default() -> Self {
        Self {
            network: [0; 32],
            founded_ms: 0,
            min_stake: DEFAULT_MIN_STAKE,
            round_reward: DEFAULT_ROUND_REWARD,
            min_round_ms: 0,
            round_lead: 0,
            unbonding_ms: DEFAULT_UNBONDING_MS,
        }
    }
}

/// Encoded length of [`Rules`] without a round lead, with one, and with an unbonding delay
/// of its own (after a round lead, 0 where there is none).
const RULES_LEN: usize = 32 + 4 * 8;
const RULES_LEN_LEAD: usize = RULES_LEN + 8;
const RULES_LEN_UNBONDING: usize = RULES_LEN_LEAD + 8;

impl Rules {
    /// The highest round a proof signed at `timestamp_ms` can claim.
    pub fn max_round_at(&self, timestamp_ms: u64) -> u64 {
        if self.min_round_ms == 0 {
            return u64::MAX;
        }
        timestamp_ms.saturating_sub(self.founded_ms) / self.min_round_ms
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RULES_LEN_UNBONDING);
        out.extend_from_slice(&self.network);
        for v in [
            self.founded_ms,
            self.min_stake,
            self.round_reward,
            self.min_round_ms,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let own_unbonding = self.unbonding_ms != DEFAULT_UNBONDING_MS;
        if self.round_lead != 0 || own_unbonding {
            out.extend_from_slice(&self.round_lead.to_le_bytes());
        }
        if own_unbonding {
            out.extend_from_slice(&self.unbonding_ms.to_le_bytes());
        }
        out
    }

    /// Reads [`Self::to_bytes`]; a default written out (a zero round lead with the default
    /// unbonding delay, or the default delay) is not its canonical form.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if ![RULES_LEN, RULES_LEN_LEAD, RULES_LEN_UNBONDING].contains(&bytes.len()) {
            return None;
        }
        let (network, rest) = bytes.split_at(32);
        let word = |i: usize| {
            rest.get(i * 8..i * 8 + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        Some(Self {
            network: network.try_into().ok()?,
            founded_ms: word(0)?,
            min_stake: word(1)?,
            round_reward: word(2)?,
            min_round_ms: word(3)?,
            round_lead: match (word(4), word(5)) {
                (Some(0), None) => return None,
                (Some(lead), _) => lead,
                (None, _) => 0,
            },
            unbonding_ms: match word(5) {
                Some(DEFAULT_UNBONDING_MS) => return None,
                Some(ms) => ms,
                None => DEFAULT_UNBONDING_MS,
            },
        })
    }
}

/// What a network's ledger starts from: its rules and the stakes its founders hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerGenesis {
    pub rules: Rules,
    /// (founder's key, stake), sorted by node id, each account once. Keys, not bare ids: the
    /// first finality committee is made of them (`LedgerState::staked_keys`).
    pub stakes: Vec<(PublicKey, u64)>,
    /// The architecture the network starts with and how it grows (`None`: a network of one
    /// fixed model). Its ledger advances it at the end of every finalized epoch.
    pub growth: Option<NetworkGrowth>,
}

/// Why a genesis cannot start a ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenesisError {
    #[error("genesis names {0} stakes (most {MAX_GENESIS_STAKES})")]
    TooManyStakes(usize),
    #[error("genesis names account {0} twice")]
    DuplicateAccount(NodeId),
    #[error("genesis stakes overflow the supply")]
    Overflow,
}

impl LedgerGenesis {
    /// Sorts the stakes by account and checks them.
    pub fn new(rules: Rules, mut stakes: Vec<(PublicKey, u64)>) -> Result<Self, GenesisError> {
        if stakes.len() > MAX_GENESIS_STAKES {
            return Err(GenesisError::TooManyStakes(stakes.len()));
        }
        stakes.sort_unstable_by_key(|(k, s)| (k.node_id(), *s));
        if let Some(w) = stakes.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(GenesisError::DuplicateAccount(w[0].0.node_id()));
        }
        stakes
            .iter()
            .try_fold(0u64, |sum, (_, s)| sum.checked_add(*s))
            .ok_or(GenesisError::Overflow)?;
        Ok(Self {
            rules,
            stakes,
            growth: None,
        })
    }

    /// The same genesis for a network that grows under `growth`.
    pub fn with_growth(mut self, growth: NetworkGrowth) -> Self {
        self.growth = Some(growth);
        self
    }

    /// BLAKE3 of the rules and stakes: two ledgers with one genesis hash started alike.
    pub fn hash(&self) -> Hash32 {
        let mut h = blake3::Hasher::new();
        h.update(b"neuroshard/ledger-genesis/v2");
        h.update(&self.rules.to_bytes());
        h.update(&(self.stakes.len() as u64).to_le_bytes());
        for (key, stake) in &self.stakes {
            h.update(key.as_bytes());
            h.update(&stake.to_le_bytes());
        }
        // Only a growing network's hash names its architecture, so other geneses keep theirs.
        if let Some(g) = &self.growth {
            h.update(b"growth");
            h.update(&g.to_bytes());
        }
        *h.finalize().as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_roundtrip_and_bound_rounds_by_time() {
        let rules = Rules {
            network: [7; 32],
            founded_ms: 1_000,
            min_stake: 5,
            round_reward: 9,
            min_round_ms: 100,
            round_lead: 0,
            unbonding_ms: DEFAULT_UNBONDING_MS,
        };
        assert_eq!(Rules::from_bytes(&rules.to_bytes()), Some(rules));
        assert_eq!(Rules::from_bytes(&rules.to_bytes()[1..]), None);
        // A round lead adds a word; without one the bytes are what they were before it.
        assert_eq!(rules.to_bytes().len(), RULES_LEN);
        let led = Rules {
            round_lead: 8,
            ..rules
        };
        assert_eq!(Rules::from_bytes(&led.to_bytes()), Some(led));
        let mut zero = rules.to_bytes();
        zero.extend_from_slice(&0u64.to_le_bytes());
        assert_eq!(Rules::from_bytes(&zero), None, "not the canonical form");
        // An unbonding delay of its own adds a word after the lead, which may then be 0.
        for lead in [0, 8] {
            let quick = Rules {
                round_lead: lead,
                unbonding_ms: 60_000,
                ..rules
            };
            assert_eq!(quick.to_bytes().len(), RULES_LEN_UNBONDING);
            assert_eq!(Rules::from_bytes(&quick.to_bytes()), Some(quick));
        }
        let mut default_written = led.to_bytes();
        default_written.extend_from_slice(&DEFAULT_UNBONDING_MS.to_le_bytes());
        assert_eq!(
            Rules::from_bytes(&default_written),
            None,
            "not the canonical form"
        );
        assert_eq!(rules.max_round_at(0), 0);
        assert_eq!(rules.max_round_at(1_099), 0);
        assert_eq!(rules.max_round_at(1_100), 1);
        assert_eq!(Rules::default().max_round_at(0), u64::MAX);
    }

    #[test]
    fn a_genesis_names_each_account_once() {
        let (x, y) = (
            neuroshard_proof::fixtures::test_identity(1).public_key(),
            neuroshard_proof::fixtures::test_identity(2).public_key(),
        );
        // Sorted by node id.
        let (a, b) = if x.node_id() < y.node_id() {
            (x, y)
        } else {
            (y, x)
        };
        let g = LedgerGenesis::new(Rules::default(), vec![(b, 1), (a, 2)]);
        assert_eq!(
            g.as_ref().map(|g| g.stakes.clone()),
            Ok(vec![(a, 2), (b, 1)])
        );
        assert_eq!(
            LedgerGenesis::new(Rules::default(), vec![(a, 1), (a, 2)]),
            Err(GenesisError::DuplicateAccount(a.node_id()))
        );
        assert_eq!(
            LedgerGenesis::new(Rules::default(), vec![(a, u64::MAX), (b, 1)]),
            Err(GenesisError::Overflow)
        );
        let other = LedgerGenesis::new(Rules::default(), vec![(a, 3)]);
        assert_ne!(g.map(|g| g.hash()), other.map(|g| g.hash()));
    }
}
