//! ByzFL-style runs on the simulator: a network of stages × replicas on the real engine and a
//! tiny model, some replicas of one stage Byzantine ([`Adversary`]), and the validation loss
//! of the honest replicas' agreed model at the end.

use std::time::Duration;

use neuroshard_aggregate::Attack;
use neuroshard_train::SpecError;

use crate::byzantine::Adversary;
use crate::{
    EngineCosts, EngineKind, Factory, LinkModel, PatternBatches, Sim, settings, tiny_model,
    validation_loss,
};

/// Why a run could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("compression spec: {0}")]
    Spec(#[from] SpecError),
    #[error("validation: {0}")]
    Model(#[from] neuroshard_model::ModelError),
    #[error("stage {0} has no honest replica with DiLoCo state")]
    NoHonestReplica(usize),
    #[error("Sybils per stage {sybils:?} do not fit {stages} stages × {replicas} replicas")]
    Shape {
        stages: usize,
        replicas: usize,
        sybils: Vec<usize>,
    },
}

/// The shape of a run and the defence under test.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub stages: usize,
    pub replicas: usize,
    /// Byzantine replicas of each stage (the last ones added to it).
    pub sybils: Vec<usize>,
    /// Driver steps (the LR schedule's length).
    pub steps: u64,
    /// Virtual time the network runs.
    pub virtual_time: Duration,
    pub aggregator: String,
    pub byzantine: usize,
    pub norm_bound: f64,
    /// The outer step every replica applies to the aggregate.
    pub outer_lr: f32,
    pub outer_momentum: f32,
    /// Pseudo-gradient compression spec every replica (and the Sybils) sends.
    pub compression: String,
}

impl Scenario {
    /// `stages` × `replicas`, no Sybils yet, the nodes' default defence.
    pub fn new(stages: usize, replicas: usize) -> Self {
        let defaults = neuroshard_node::settings::SyncSettings::default();
        Self {
            stages,
            replicas,
            sybils: vec![0; stages],
            // Long enough that the clean run is past its fast early descent: at 150 steps the
            // tiny model is still so far from trained that any attack shrinking the aggregate
            // costs as a smaller step would, and the step size, not the attack, is measured.
            steps: 600,
            virtual_time: Duration::from_secs(300),
            aggregator: defaults.aggregator,
            byzantine: defaults.byzantine,
            norm_bound: defaults.norm_bound,
            outer_lr: defaults.outer_lr,
            outer_momentum: defaults.outer_momentum,
            compression: defaults.compression,
        }
    }

    /// `count` Sybils in `stage` (out of range: refused by [`run`]).
    pub fn with_sybils(mut self, stage: usize, count: usize) -> Self {
        if let Some(s) = self.sybils.get_mut(stage) {
            *s = count;
        } else {
            self.sybils.resize(stage + 1, 0);
            self.sybils[stage] = count;
        }
        self
    }

    /// Node indices of the Sybils (node i serves stage i mod stages).
    pub fn sybil_nodes(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for (stage, &count) in self.sybils.iter().enumerate() {
            let members: Vec<usize> = (0..self.stages * self.replicas)
                .filter(|i| i % self.stages == stage)
                .collect();
            out.extend_from_slice(&members[members.len().saturating_sub(count)..]);
        }
        out
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub validation_loss: f32,
    /// The lowest DiLoCo round an honest replica reached.
    pub min_honest_round: u64,
    pub rounds_attacked: usize,
    /// Largest honest norm over the median honest norm, worst round.
    pub max_honest_norm_ratio: f64,
    /// Rounds whose honest offers were all seen, and how many of them had an honest offer
    /// longer than the norm bound allows (clipped though honest).
    pub honest_rounds: usize,
    pub honest_over_bound: usize,
}

/// Runs `scenario` under `attack` (`Attack::None`: the clean run) with `seed`.
pub fn run(scenario: &Scenario, attack: Attack, seed: u64) -> Result<Outcome, RunError> {
    let sc = scenario;
    if sc.stages == 0 || sc.sybils.len() > sc.stages || sc.sybils.iter().any(|&k| k >= sc.replicas)
    {
        return Err(RunError::Shape {
            stages: sc.stages,
            replicas: sc.replicas,
            sybils: sc.sybils.clone(),
        });
    }
    let mut model = tiny_model();
    model.layers = model.layers.max(sc.stages);
    let mut s = settings(model.clone(), sc.stages, sc.replicas);
    s.steps = sc.steps;
    s.seed = seed;
    s.sync.aggregator = sc.aggregator.clone();
    s.sync.byzantine = sc.byzantine;
    s.sync.norm_bound = sc.norm_bound;
    s.sync.outer_lr = sc.outer_lr;
    s.sync.outer_momentum = sc.outer_momentum;
    s.sync.compression = sc.compression.clone();
    let spec = s.sync.compression.parse()?;
    let data = PatternBatches {
        vocab: model.vocab,
        rows: s.batch,
        seq: s.seq,
        shards: 8,
        drawn: Default::default(),
    };
    let factory = Factory::new(s.clone(), EngineKind::Real);
    let mut sim = Sim::new(
        seed,
        s,
        LinkModel::lan(),
        EngineCosts::default(),
        Box::new(factory),
    );
    for i in 0..sc.stages * sc.replicas {
        sim.add_node(i % sc.stages, Duration::from_millis(10 * i as u64));
    }
    let sybils = if attack == Attack::None {
        Vec::new()
    } else {
        sc.sybil_nodes()
    };
    let mut adversary = Adversary::install(&mut sim, &sybils, attack, spec, seed);
    adversary.run_until(&mut sim, sc.virtual_time, Duration::from_millis(50));
    let honest: Vec<usize> = (0..sim.len()).filter(|i| !sybils.contains(i)).collect();
    let mut thetas = Vec::with_capacity(sc.stages);
    let mut min_round = u64::MAX;
    for stage in 0..sc.stages {
        // The honest replica furthest along holds the stage's agreed θ₀.
        let best = honest
            .iter()
            .filter(|&&i| i % sc.stages == stage)
            .filter_map(|&i| Some((sim.core(i)?.sync_round(), i)))
            .inspect(|(r, _)| min_round = min_round.min(*r))
            .max()
            .and_then(|(_, i)| sim.engine(i)?.theta())
            .ok_or(RunError::NoHonestReplica(stage))?;
        thetas.push(best);
    }
    Ok(Outcome {
        validation_loss: validation_loss(&model, &thetas, &data, 16)?,
        min_honest_round: min_round,
        rounds_attacked: adversary.rounds_attacked,
        max_honest_norm_ratio: adversary
            .honest_norm_ratios
            .iter()
            .copied()
            .fold(0.0, f64::max),
        honest_rounds: adversary.honest_norm_ratios.len(),
        honest_over_bound: adversary
            .honest_norm_ratios
            .iter()
            .filter(|&&r| sc.norm_bound > 0.0 && r > sc.norm_bound)
            .count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sybils_are_the_last_replicas_of_their_stage_and_bad_shapes_are_refused() {
        // Node i serves stage i mod 3: stage 1 is 1, 4, 7, 10, 13.
        let sc = Scenario::new(3, 5).with_sybils(1, 2).with_sybils(2, 1);
        assert_eq!(sc.sybil_nodes(), vec![10, 13, 14]);
        for bad in [
            Scenario::new(2, 2).with_sybils(1, 2),
            Scenario::new(2, 3).with_sybils(2, 1),
            Scenario::new(0, 3),
        ] {
            assert!(
                matches!(run(&bad, Attack::SignFlip, 1), Err(RunError::Shape { .. })),
                "{bad:?}"
            );
        }
    }
}
