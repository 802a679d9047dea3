//! Which stages a micro-batch crosses, in which order, at each architecture version.
//!
//! A stage id is a stage's identity for good: its topics, DHT key, registrations and the
//! global indices of the blocks it holds never change. A network that grows inserts new stage
//! ids in the middle of the pipeline, so the *order* is what a version changes. Block indices
//! follow the ids (stage `i` holds the blocks after those of every stage with a smaller id):
//! an existing stage's tensor names, hashes and checkpoints stay bit for bit what they were,
//! and the model in pipeline order is assembled by [`Layout::order`].
//!
//! A fixed network has one layout, version 0, its stages `0..n` in order.

use std::collections::{BTreeMap, BTreeSet};

use neuroshard_growth::Architecture;
use neuroshard_model::{ModelConfig, StageSpec};

/// Why a layout cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("a layout needs at least one stage")]
    Empty,
    #[error("stage {0} appears twice in the layout")]
    Duplicate(usize),
    #[error("the architecture's shape ({0}) is not the network's model grown by depth")]
    Shape(String),
    #[error("stage {stage} would hold blocks {first}..{end} of a {layers}-layer model")]
    Blocks {
        stage: usize,
        first: usize,
        end: usize,
        layers: usize,
    },
    #[error("{0}")]
    Model(String),
}

/// The stages of one architecture version in pipeline order, with what each holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    version: u32,
    /// Stage ids, first (embedding) to last (head).
    order: Vec<usize>,
    specs: BTreeMap<usize, StageSpec>,
    /// The whole model at this version.
    model: ModelConfig,
    /// Blocks of the genesis model.
    base_layers: usize,
}

impl Layout {
    /// Version 0 of a network of `stages` stages: `StageSpec::split` of its model.
    pub fn fixed(model: &ModelConfig, stages: usize) -> Result<Self, LayoutError> {
        let split =
            StageSpec::split(model, stages).map_err(|e| LayoutError::Model(e.to_string()))?;
        Ok(Self {
            version: 0,
            order: (0..split.len()).collect(),
            specs: split.into_iter().enumerate().collect(),
            model: model.clone(),
            base_layers: model.layers,
        })
    }

    /// The layout of `arch`, a version of a network founded with model `base`: the same
    /// width, `arch.shape.layers` blocks.
    pub fn of(base: &ModelConfig, arch: &Architecture) -> Result<Self, LayoutError> {
        let shape = &arch.shape;
        let layers =
            usize::try_from(shape.layers).map_err(|_| LayoutError::Shape("layers".into()))?;
        let model = ModelConfig {
            layers,
            ..base.clone()
        };
        let same = |a: u64, b: usize| usize::try_from(a).is_ok_and(|a| a == b);
        if !(same(shape.d_model, base.d_model)
            && same(shape.heads, base.heads)
            && same(shape.kv_heads, base.kv_heads)
            && same(shape.ffn, base.ffn)
            && same(shape.vocab, base.vocab))
        {
            return Err(LayoutError::Shape(format!("{shape:?}")));
        }
        model
            .validate()
            .map_err(|e| LayoutError::Model(e.to_string()))?;
        if arch.stages.is_empty() {
            return Err(LayoutError::Empty);
        }
        let order: Vec<usize> = arch.stages.iter().map(|s| usize::from(s.id)).collect();
        let mut by_id: BTreeMap<usize, u64> = BTreeMap::new();
        for s in &arch.stages {
            if by_id.insert(usize::from(s.id), s.layers).is_some() {
                return Err(LayoutError::Duplicate(usize::from(s.id)));
            }
        }
        let (first_id, last_id) = (order[0], order[order.len() - 1]);
        let mut specs = BTreeMap::new();
        let mut first = 0usize;
        for (&id, &blocks) in &by_id {
            let end = usize::try_from(blocks)
                .ok()
                .and_then(|b| first.checked_add(b))
                .filter(|&end| end <= layers && blocks > 0)
                .ok_or(LayoutError::Blocks {
                    stage: id,
                    first,
                    end: first.saturating_add(usize::try_from(blocks).unwrap_or(usize::MAX)),
                    layers,
                })?;
            specs.insert(
                id,
                StageSpec {
                    first_layer: first,
                    end_layer: end,
                    embed: id == first_id,
                    head: id == last_id,
                },
            );
            first = end;
        }
        if first != layers {
            return Err(LayoutError::Blocks {
                stage: last_id,
                first,
                end: first,
                layers,
            });
        }
        Ok(Self {
            version: arch.version,
            order,
            specs,
            model,
            base_layers: base.layers,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Stage ids in pipeline order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The whole model at this version.
    pub fn model(&self) -> &ModelConfig {
        &self.model
    }

    pub fn contains(&self, stage: usize) -> bool {
        self.specs.contains_key(&stage)
    }

    /// What `stage` holds: its blocks by global index, and whether it has the embedding or
    /// the head.
    pub fn spec(&self, stage: usize) -> Option<StageSpec> {
        self.specs.get(&stage).copied()
    }

    /// The model config a holder of `stage` runs: the genesis model, deep enough for the
    /// stage's block indices. The same in every version (only the depth bounds the indices),
    /// so a stage's checkpoints and config never change as the network grows.
    pub fn stage_model(&self, stage: usize) -> Option<ModelConfig> {
        let spec = self.spec(stage)?;
        Some(ModelConfig {
            layers: self.base_layers.max(spec.end_layer),
            ..self.model.clone()
        })
    }

    fn position(&self, stage: usize) -> Option<usize> {
        self.order.iter().position(|&s| s == stage)
    }

    /// The stage `stage` sends its outputs to (None for the last one, or a stage not here).
    pub fn next(&self, stage: usize) -> Option<usize> {
        let at = self.position(stage)?;
        self.order.get(at + 1).copied()
    }

    /// The stage `stage` receives its inputs from.
    pub fn prev(&self, stage: usize) -> Option<usize> {
        let at = self.position(stage)?;
        at.checked_sub(1).map(|p| self.order[p])
    }

    pub fn is_first(&self, stage: usize) -> bool {
        self.order.first() == Some(&stage)
    }

    pub fn is_last(&self, stage: usize) -> bool {
        self.order.last() == Some(&stage)
    }

    /// Stages after `stage` in the pipeline.
    pub fn after(&self, stage: usize) -> usize {
        self.position(stage)
            .map_or(0, |at| self.order.len().saturating_sub(at + 1))
    }

    /// The blocks in pipeline order, as global indices: where block `i` of the assembled
    /// model comes from.
    pub fn block_order(&self) -> Vec<usize> {
        self.order
            .iter()
            .filter_map(|id| self.specs.get(id))
            .flat_map(|s| s.first_layer..s.end_layer)
            .collect()
    }
}

/// Every architecture version a node knows (the genesis one and each finalized upgrade).
#[derive(Debug, Clone, PartialEq)]
pub struct Layouts {
    by_version: BTreeMap<u32, Layout>,
}

impl Layouts {
    pub fn new(first: Layout) -> Self {
        Self {
            by_version: BTreeMap::from([(first.version, first)]),
        }
    }

    /// Layout 0 of a fixed network of `stages` stages (tests, and networks that never grow).
    pub fn fixed(model: &ModelConfig, stages: usize) -> Result<Self, LayoutError> {
        Layout::fixed(model, stages).map(Self::new)
    }

    /// Adds a version, or replaces a different one of the same number (a joiner's guess from
    /// heartbeats gives way to its own finalized ledger); whether anything changed.
    pub fn insert(&mut self, layout: Layout) -> bool {
        if self.by_version.get(&layout.version) == Some(&layout) {
            return false;
        }
        self.by_version.insert(layout.version, layout);
        true
    }

    pub fn get(&self, version: u32) -> Option<&Layout> {
        self.by_version.get(&version)
    }

    pub fn newest(&self) -> &Layout {
        self.by_version
            .values()
            .next_back()
            .expect("Layouts always holds its first layout")
    }

    pub fn oldest(&self) -> &Layout {
        self.by_version
            .values()
            .next()
            .expect("Layouts always holds its first layout")
    }

    /// Versions, newest first.
    pub fn newest_first(&self) -> impl Iterator<Item = &Layout> {
        self.by_version.values().rev()
    }

    /// Every stage id of any version.
    pub fn stages(&self) -> BTreeSet<usize> {
        self.by_version
            .values()
            .flat_map(|l| l.order.iter().copied())
            .collect()
    }

    /// The stages `stage` sends to or receives from in any version, and itself.
    pub fn near(&self, stage: usize) -> BTreeSet<usize> {
        let mut near = BTreeSet::from([stage]);
        for l in self.by_version.values() {
            near.extend(l.prev(stage));
            near.extend(l.next(stage));
        }
        near
    }

    /// What `stage` holds (the same in every version that has it).
    pub fn spec(&self, stage: usize) -> Option<StageSpec> {
        self.newest_first().find_map(|l| l.spec(stage))
    }
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
