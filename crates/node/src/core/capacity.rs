//! The capacity this node announces to a growing network: memory from its settings, and
//! training throughput from its settings or, when they leave it at 0, measured from the
//! engine's busy time over the node's first optimizer steps (the driver reports it).

use neuroshard_model::{ModelConfig, StageSpec};

use super::*;

/// Optimizer steps the throughput is measured over (after the first, which includes
/// start-up work).
pub(super) const MEASURED_STEPS: u64 = 10;

/// Where a measurement started: (optimizer step, engine busy ms then).
#[derive(Debug, Default)]
pub(super) struct Meter {
    start: Option<(u64, f64)>,
    done: bool,
}

impl NodeCore {
    /// The engine had been busy `busy_ms` in all when optimizer step `step` finished (what
    /// the driver measures). Once `MEASURED_STEPS` steps are timed, the node's training
    /// FLOP/s (6 · the stage's matrix parameters per token, `batch · seq` tokens a step)
    /// becomes what it announces, unless its settings name a figure.
    pub fn handle_engine_busy(&mut self, step: u64, busy_ms: f64) {
        if self.settings.capacity.flops_per_s > 0 || self.meter.done || !busy_ms.is_finite() {
            return;
        }
        let Some((first, start_ms)) = self.meter.start else {
            self.meter.start = Some((step, busy_ms));
            return;
        };
        let steps = step.saturating_sub(first);
        let secs = (busy_ms - start_ms) / 1e3;
        if steps < MEASURED_STEPS || secs <= 0.0 {
            return;
        }
        self.meter.done = true;
        let Some(spec) = u16::try_from(self.stage)
            .ok()
            .and_then(|s| self.stage_spec(s))
        else {
            return;
        };
        let tokens = (self.settings.batch * self.settings.seq) as f64 * steps as f64;
        let flops = stage_flops_per_token(&self.settings.model, &spec) * tokens / secs;
        if flops.is_finite() && flops >= 1.0 {
            self.settings.capacity.flops_per_s = flops.min(u64::MAX as f64) as u64;
        }
    }
}

/// Training FLOPs per token of one stage by the 6·N estimate, N its parameters in matrix
/// products (its blocks, and the LM head on the last stage; the embedding is a lookup).
pub fn stage_flops_per_token(model: &ModelConfig, spec: &StageSpec) -> f64 {
    let blocks = (spec.end_layer - spec.first_layer) * model.params_per_layer();
    let head = if spec.head {
        model.vocab * model.d_model
    } else {
        0
    };
    6.0 * (blocks + head) as f64
}

#[cfg(test)]
mod tests {
    use neuroshard_ledger::{Action, SignedOp};
    use neuroshard_proof::fixtures::test_identity;

    use super::*;
    use crate::core::io::Transmit;
    use crate::core::tests::{core_with, drain};
    use crate::settings::CapacityClaim;

    /// The announcements among `core`'s transmits: (memory, FLOP/s).
    fn announced(core: &mut NodeCore) -> Vec<(u64, u64)> {
        drain(core)
            .into_iter()
            .filter_map(|t| match t {
                Transmit::Publish {
                    topic: Topic::Ops,
                    data,
                } => SignedOp::from_bytes(&data).ok(),
                _ => None,
            })
            .filter_map(|op| match op.verify().ok()?.action {
                Action::Announce {
                    memory_bytes,
                    flops_per_s,
                } => Some((memory_bytes, flops_per_s)),
                _ => None,
            })
            .collect()
    }

    fn growing(memory_bytes: u64, flops_per_s: u64) -> impl FnOnce(&mut NodeSettings) {
        move |s| {
            s.growth = Some(neuroshard_growth::GrowthPolicy::depth(8));
            s.capacity = CapacityClaim {
                memory_bytes,
                flops_per_s,
            };
        }
    }

    /// The heartbeat timer fires (it checks the registration and the announcement).
    fn heartbeat(core: &mut NodeCore, at: Instant) {
        core.handle_timeout(at);
    }

    #[test]
    fn a_growing_networks_node_announces_its_measured_throughput_once() {
        let start = Instant::now();
        let id = test_identity(1);
        let mut core = core_with(&id, start, 1, 2, growing(2 << 30, 0));
        heartbeat(&mut core, start + Duration::from_secs(3));
        assert!(announced(&mut core).is_empty(), "nothing measured yet");
        // Ten steps in one second of engine time after the first.
        core.handle_engine_busy(1, 500.0);
        core.handle_engine_busy(5, 900.0);
        assert!(!core.meter.done, "four steps are not enough");
        core.handle_engine_busy(11, 1_500.0);
        heartbeat(&mut core, start + Duration::from_secs(60));
        let spec = core.stage_spec(1).unwrap();
        let tokens = (core.settings.batch * core.settings.seq * 10) as f64;
        let flops = (stage_flops_per_token(&core.settings.model, &spec) * tokens) as u64;
        assert_eq!(announced(&mut core), vec![(2 << 30, flops)]);
        // Held by the ledger now: not announced again, and later steps change nothing.
        core.handle_engine_busy(30, 9_000.0);
        heartbeat(&mut core, start + Duration::from_secs(120));
        assert!(announced(&mut core).is_empty());
    }

    #[test]
    fn a_node_announces_nothing_to_a_network_that_does_not_grow_or_without_a_figure() {
        let start = Instant::now();
        let id = test_identity(1);
        let mut fixed = core_with(&id, start, 1, 2, |s| {
            s.capacity = CapacityClaim {
                memory_bytes: 2 << 30,
                flops_per_s: 5,
            };
        });
        heartbeat(&mut fixed, start + Duration::from_secs(3));
        assert!(announced(&mut fixed).is_empty());
        let mut unknown = core_with(&id, start, 1, 2, growing(0, 5));
        heartbeat(&mut unknown, start + Duration::from_secs(3));
        assert!(announced(&mut unknown).is_empty());
        // A configured figure is announced at once and never replaced by a measurement.
        let mut set = core_with(&id, start, 1, 2, growing(2 << 30, 5));
        set.handle_engine_busy(1, 0.0);
        set.handle_engine_busy(20, 10.0);
        heartbeat(&mut set, start + Duration::from_secs(3));
        assert_eq!(announced(&mut set), vec![(2 << 30, 5)]);
    }
}
