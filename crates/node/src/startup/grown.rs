//! Start-up in a network that grew: a node has no ledger yet, so the heartbeats it hears say
//! which architecture the network trains. It takes the one the most peers name and chooses its
//! stage among that version's (a stage nobody holds yet first); the core checks the choice
//! against its own finalized ledger once it runs. A stage born after the genesis starts as
//! identity blocks drawn from the network's seed, the same on every first holder.

use std::collections::BTreeMap;
use std::time::Instant;

use neuroshard_model::{ModelConfig, StageSpec};

use super::Startup;
use crate::layout::Layout;
use crate::records::ArchView;

/// Stage ids past the genesis ones a starting node of a growing network looks up and
/// listens to (each upgrade adds one or a few).
pub const EXTRA_STAGE_IDS: usize = 8;

impl Startup {
    /// Stage ids a starting node asks about and accepts heartbeats from.
    pub(super) fn stage_ids(&self) -> usize {
        let extra = if self.cfg.grows { EXTRA_STAGE_IDS } else { 0 };
        self.cfg.specs.len().saturating_add(extra)
    }

    /// Stage ids of the version the node chose in (dense: each upgrade takes the next ids).
    pub(super) fn stage_count(&self) -> usize {
        match &self.layout {
            Some(l) => l
                .order()
                .iter()
                .max()
                .map_or(0, |m| m.saturating_add(1))
                .max(self.cfg.specs.len()),
            None => self.cfg.specs.len(),
        }
    }

    /// The model config and spec a holder of `stage` runs, and whether the stage was born
    /// after the genesis (then it starts as identity blocks).
    pub fn stage_model(&self, stage: usize) -> Option<(ModelConfig, StageSpec, bool)> {
        if let Some(spec) = self.cfg.specs.get(stage) {
            return Some((self.cfg.model.clone(), *spec, false));
        }
        let l = self.layout.as_ref()?;
        Some((l.stage_model(stage)?, l.spec(stage)?, true))
    }

    /// Bytes a replica of each stage id needs.
    pub(super) fn need(&self) -> Vec<u64> {
        (0..self.stage_count())
            .map(|s| match (self.cfg.need.get(s), self.stage_model(s)) {
                (Some(n), _) => *n,
                (None, Some((model, spec, _))) => {
                    let params: u64 = spec
                        .param_specs(&model)
                        .iter()
                        .map(|p| p.numel() as u64)
                        .sum();
                    params.saturating_mul(16).saturating_add(self.cfg.overhead)
                }
                // Not a stage of the chosen version: nothing fits it.
                (None, None) => u64::MAX,
            })
            .collect()
    }

    /// Takes the architecture the most peers' heartbeats name (ties: the lower one, the
    /// conservative choice). A view that is not this model grown by depth is ignored.
    pub(super) fn choose_layout(&mut self, now: Instant) {
        if !self.cfg.grows || self.layout.is_some() {
            return;
        }
        let mut support: BTreeMap<&ArchView, usize> = BTreeMap::new();
        for view in self.views.values() {
            *support.entry(view).or_default() += 1;
        }
        let Some((view, _)) = support
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
        else {
            return;
        };
        match Layout::of(&self.cfg.model, &view.architecture(&self.cfg.model)) {
            Ok(l) => self.layout = Some(l),
            Err(e) => self.warn(
                format!(
                    "peers name architecture version {} ({e}); choosing among version 0's stages",
                    view.version
                ),
                now,
            ),
        }
    }

    /// A stage of the chosen version that the checkpoint on disk holds.
    pub(super) fn resume_in_layout(&self) -> Option<usize> {
        if let Some(s) = super::resume_stage(&self.cfg) {
            return Some(s);
        }
        let (model, spec) = self.cfg.saved.as_ref()?.holds.as_ref()?;
        let l = self.layout.as_ref()?;
        l.order()
            .iter()
            .copied()
            .find(|&s| l.spec(s) == Some(*spec) && l.stage_model(s).as_ref() == Some(model))
    }
}
