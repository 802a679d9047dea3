//! The architecture a network trains, as part of its agreed state.
//!
//! A network founded with a [`GrowthPolicy`] holds a [`NetworkGrowth`]: the current
//! [`Architecture`] (a version, the shape and which layers sit in which stage) and the upgrades
//! taken so far. The ledger keeps it beside the accounts and advances it at the end of every
//! finalized epoch ([`NetworkGrowth::end_epoch`]) from what that state holds: how many
//! accounts ever registered for a stage (the joins) and the capacity the registered ones
//! announced. Every node applies the same finalized epochs, so every node reaches the same
//! version at the same epoch, and the state hash the committee signs covers it.
//!
//! Only depth growth is exact (a new block with zero output projections is an identity), so
//! a network's candidates are the current shape at other depths. The new layers form new
//! stages in the middle of the pipeline (between the embedding's stage and the head's), with
//! new stage ids: existing stages, and every replica's registration for them, keep their
//! layers, and joiners hold the new ones. A one-stage network cannot insert a stage (its only
//! stage holds both ends), so it grows only while the target still fits one stage.

use serde::{Deserialize, Serialize};

use crate::claims::{Capacity, Claim, ClaimLimits};
use crate::error::GrowthError;
use crate::scaler::{Candidates, Decision, ScalerConfig, Target, UpgradeRule, decide};
use crate::shape::Shape;

/// Most stages an architecture may have (stage ids are `u16` on the wire).
pub const MAX_STAGES: usize = 1024;

/// How a network grows; fixed by its genesis, so every node judges alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowthPolicy {
    pub scaler: ScalerConfig,
    pub rule: UpgradeRule,
    pub limits: ClaimLimits,
}

impl GrowthPolicy {
    /// The defaults (K = 50 joins, ≥ 30% larger, at most 2×), growing depth up to
    /// `max_layers`.
    pub fn depth(max_layers: u64) -> Self {
        Self {
            scaler: ScalerConfig {
                candidates: Candidates::Depth { max_layers },
                ..ScalerConfig::default()
            },
            rule: UpgradeRule::default(),
            limits: ClaimLimits::default(),
        }
    }

    pub fn validate(&self) -> Result<(), GrowthError> {
        self.scaler.validate()?;
        if !matches!(self.scaler.candidates, Candidates::Depth { .. }) {
            return Err(GrowthError::Config(
                "a network grows by depth only (a new width would start a new model)".into(),
            ));
        }
        if self.rule.every_joins == 0 {
            return Err(GrowthError::Config("every_joins must be positive".into()));
        }
        if u128::from(self.rule.max_growth_pct) < 100 + u128::from(self.rule.min_gain_pct) {
            return Err(GrowthError::Config(
                "max_growth_pct leaves no room for the minimum gain".into(),
            ));
        }
        Ok(())
    }
}

/// One stage of an architecture: its id (what registrations name) and its block count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLayout {
    pub id: u16,
    pub layers: u64,
}

/// The model a network trains at one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Architecture {
    /// 0 at the genesis, one more with every upgrade.
    pub version: u32,
    pub shape: Shape,
    /// Stages in pipeline order (the first holds the embedding, the last the head).
    pub stages: Vec<StageLayout>,
}

impl Architecture {
    /// Version 0: `shape` split into stages of `stage_layers` blocks, ids 0, 1, ….
    pub fn genesis(shape: Shape, stage_layers: &[u64]) -> Result<Self, GrowthError> {
        let stages = stage_layers
            .iter()
            .enumerate()
            .map(|(i, &layers)| {
                let id =
                    u16::try_from(i).map_err(|_| GrowthError::Config("too many stages".into()))?;
                Ok(StageLayout { id, layers })
            })
            .collect::<Result<Vec<_>, GrowthError>>()?;
        let arch = Self {
            version: 0,
            shape,
            stages,
        };
        arch.validate()?;
        Ok(arch)
    }

    /// The shape is valid and the stages hold its layers, each at least one, ids distinct.
    pub fn validate(&self) -> Result<(), GrowthError> {
        self.shape.validate()?;
        let bad = |m: &str| Err(GrowthError::Config(m.into()));
        if self.stages.is_empty() || self.stages.len() > MAX_STAGES {
            return bad("an architecture has 1 to 1024 stages");
        }
        if self.stages.iter().any(|s| s.layers == 0) {
            return bad("every stage holds at least one layer");
        }
        let total = self
            .stages
            .iter()
            .try_fold(0u64, |sum, s| sum.checked_add(s.layers));
        if total != Some(self.shape.layers) {
            return bad("the stages do not hold the shape's layers");
        }
        let mut ids: Vec<u16> = self.stages.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != self.stages.len() {
            return bad("two stages share an id");
        }
        Ok(())
    }

    /// Parameters of the whole model.
    pub fn params(&self) -> u64 {
        self.shape.params().unwrap_or(u64::MAX)
    }

    /// The next version, grown by depth to `target`: the new layers become new stages of at
    /// most the target's per-stage share of layers, inserted in the middle of the pipeline
    /// with fresh ids; a one-stage network grows in place.
    pub fn grown(&self, target: &Target) -> Result<Self, GrowthError> {
        let new = target.shape;
        let same_width = Shape {
            layers: self.shape.layers,
            ..new
        } == self.shape;
        if !same_width || new.layers <= self.shape.layers {
            return Err(GrowthError::Shape(format!(
                "{new:?} is not a deeper {:?}",
                self.shape
            )));
        }
        let added = new.layers - self.shape.layers;
        let version = self
            .version
            .checked_add(1)
            .ok_or_else(|| GrowthError::Config("version overflow".into()))?;
        let mut stages = self.stages.clone();
        if stages.len() == 1 {
            if target.stages > 1 {
                return Err(GrowthError::Config(
                    "a one-stage network cannot insert a stage".into(),
                ));
            }
            stages[0].layers = new.layers;
        } else {
            let share = new.layers.div_ceil(target.stages.max(1));
            let count = added.div_ceil(share.max(1));
            let mut next_id = stages.iter().map(|s| s.id).max().unwrap_or(0);
            let at = stages.len().div_ceil(2);
            let inserted = (0..count)
                .map(|i| {
                    next_id = next_id
                        .checked_add(1)
                        .ok_or_else(|| GrowthError::Config("stage ids exhausted".into()))?;
                    let layers = added / count + u64::from(i < added % count);
                    Ok(StageLayout {
                        id: next_id,
                        layers,
                    })
                })
                .collect::<Result<Vec<_>, GrowthError>>()?;
            stages.splice(at..at, inserted);
        }
        let grown = Self {
            version,
            shape: new,
            stages,
        };
        grown.validate()?;
        Ok(grown)
    }

    /// Canonical bytes (what the ledger's state hash covers).
    pub fn to_bytes(&self) -> Vec<u8> {
        let s = &self.shape;
        let mut out = Vec::with_capacity(52 + 10 * self.stages.len());
        out.extend_from_slice(&self.version.to_le_bytes());
        for v in [s.layers, s.d_model, s.heads, s.kv_heads, s.ffn, s.vocab] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.stages.len() as u64).to_le_bytes());
        for st in &self.stages {
            out.extend_from_slice(&st.id.to_le_bytes());
            out.extend_from_slice(&st.layers.to_le_bytes());
        }
        out
    }
}

/// One upgrade the network took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upgrade {
    /// The epoch at whose end it was decided.
    pub epoch: u64,
    /// Joins counted when it was decided (a multiple of `every_joins`).
    pub joins: u64,
    /// Registered nodes whose claims counted.
    pub counted: u64,
    pub architecture: Architecture,
}

/// What one evaluation at an epoch's end decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evaluated {
    /// No new multiple of `every_joins` was reached.
    NotDue,
    /// A new multiple was reached in this epoch: the rule runs at the end of the next one, on
    /// the claims final by then (the proposer of the epoch that crossed it does not choose
    /// alone which claims count).
    Pending { joins: u64 },
    /// Evaluated at `joins`; the architecture stays (no target, too small a step, or one the
    /// layout cannot take, said in `why`).
    Kept { joins: u64, why: String },
    /// Evaluated at `joins`; upgraded.
    Upgraded(Upgrade),
}

/// A network's architecture and its growth history: part of the ledger state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkGrowth {
    pub policy: GrowthPolicy,
    pub architecture: Architecture,
    /// Multiples of `every_joins` already evaluated (joins / every_joins at the last
    /// evaluation): each is evaluated once, however many epochs pass.
    pub evaluated: u64,
    /// Epochs ended so far: the finalized state ends each epoch once, in order from the
    /// first, so this is the number of the last one.
    pub epochs: u64,
    /// The epoch in which the joins first reached a multiple not yet evaluated.
    pub pending: Option<u64>,
    pub history: Vec<Upgrade>,
}

impl NetworkGrowth {
    pub fn new(policy: GrowthPolicy, architecture: Architecture) -> Result<Self, GrowthError> {
        policy.validate()?;
        architecture.validate()?;
        Ok(Self {
            policy,
            architecture,
            evaluated: 0,
            epochs: 0,
            pending: None,
            history: Vec::new(),
        })
    }

    /// At the end of an epoch: `joins` so far; `claims` gives the capacity the currently
    /// registered accounts announced (one each; callers pass only registered keys), asked for
    /// only when the rule runs. When `joins` reached a multiple of `every_joins` not yet
    /// evaluated, the rule runs at the end of the next epoch, on the capacity counted then
    /// (once, at the highest multiple reached, when epochs brought more than `every_joins`
    /// joins).
    pub fn end_epoch(&mut self, joins: u64, claims: impl FnOnce() -> Vec<Claim>) -> Evaluated {
        self.epochs = self.epochs.saturating_add(1);
        let every = self.policy.rule.every_joins.max(1);
        let due = joins / every;
        if due <= self.evaluated {
            return Evaluated::NotDue;
        }
        match self.pending {
            Some(epoch) if epoch < self.epochs => self.pending = None,
            _ => {
                self.pending = Some(self.epochs);
                return Evaluated::Pending {
                    joins: due.saturating_mul(every),
                };
            }
        }
        self.evaluated = due;
        let at = due.saturating_mul(every);
        let capacity = Capacity::count(&claims(), |_| true, &self.policy.limits);
        let decision = decide(
            &self.architecture.shape,
            at,
            &capacity,
            &self.policy.scaler,
            &self.policy.rule,
        );
        // `at` is a positive multiple of `every_joins` and the policy was validated, so the
        // rule is always due and never in error here; say so rather than panic if not.
        let why = match decision {
            Ok(Decision::Upgrade(t)) => match self.architecture.grown(&t) {
                Ok(next) => return Evaluated::Upgraded(self.take(next, at, capacity.nodes)),
                Err(e) => e.to_string(),
            },
            Ok(Decision::Keep { target: Some(t) }) => {
                format!("target {} layers is not enough larger", t.shape.layers)
            }
            Ok(Decision::Keep { target: None }) => "nothing fits the trusted capacity".into(),
            Ok(Decision::NotDue) => "not due".into(),
            Err(e) => e.to_string(),
        };
        Evaluated::Kept { joins: at, why }
    }

    /// Moves to `next`, decided at `joins` with `counted` claims.
    fn take(&mut self, next: Architecture, joins: u64, counted: u64) -> Upgrade {
        let upgrade = Upgrade {
            epoch: self.epochs,
            joins,
            counted,
            architecture: next.clone(),
        };
        self.architecture = next;
        self.history.push(upgrade.clone());
        upgrade
    }

    /// Canonical bytes of what the state hash covers: the architecture, the evaluation count
    /// and a pending evaluation (the history follows from the epochs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.architecture.to_bytes();
        out.extend_from_slice(&self.evaluated.to_le_bytes());
        out.extend_from_slice(
            &self
                .pending
                .map_or(0, |e| e.saturating_add(1))
                .to_le_bytes(),
        );
        out
    }
}

#[cfg(test)]
#[path = "network_tests.rs"]
mod tests;
