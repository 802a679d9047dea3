//! A growing network's architecture as the swarm's nodes report it: each node's upgrades
//! (from its finalized ledger state) and whether every node reports the same ones.

use std::collections::BTreeMap;

use neuroshard_node::events::NodeEvent;
use serde_json::{Value, json};

/// Stages in pipeline order as (id, blocks).
pub type StageOrder = Vec<(u16, u64)>;

/// A version drivers trained: (version, the first step a driver ran it, its stages).
pub type Trained = (u32, u64, StageOrder);

/// Per node, the upgrades it reported, in order; per driver, the versions it trained.
#[derive(Default)]
pub struct ArchitectureLog {
    nodes: BTreeMap<usize, Vec<Value>>,
    /// Per driver: (first step, version, stages in pipeline order as (id, blocks)).
    driving: BTreeMap<usize, Vec<(u64, u32, StageOrder)>>,
    /// Replicas that moved to a new stage: (node, from, to, version).
    moves: Vec<(usize, usize, usize, u32)>,
}

impl ArchitectureLog {
    pub fn on_event(&mut self, i: usize, ev: &NodeEvent) {
        match ev {
            NodeEvent::Driving {
                step,
                version,
                stages,
                ..
            } => {
                self.driving
                    .entry(i)
                    .or_default()
                    .push((*step, *version, stages.clone()));
                return;
            }
            NodeEvent::Moving {
                from, to, version, ..
            } => {
                self.moves.push((i, *from, *to, *version));
                return;
            }
            _ => {}
        }
        if let NodeEvent::Architecture {
            epoch,
            version,
            layers,
            d_model,
            params,
            stages,
            joins,
            counted,
            ..
        } = ev
        {
            let trace = self.nodes.entry(i).or_default();
            // A node that restarted (a mover) reports its ledger's upgrades again.
            if trace.iter().any(|u| u["version"] == json!(version)) {
                return;
            }
            trace.push(json!({
                "epoch": epoch,
                "version": version,
                "layers": layers,
                "d_model": d_model,
                "params": params,
                "stages": stages,
                "joins": joins,
                "counted": counted,
            }));
        }
    }

    /// Each version a driver trained, in order: (version, the first step a driver ran it,
    /// its stages in pipeline order). The newest is what the model is assembled as.
    pub fn trained(&self) -> Vec<Trained> {
        let mut by_version: BTreeMap<u32, (u64, StageOrder)> = BTreeMap::new();
        for (step, version, stages) in self.driving.values().flatten() {
            let e = by_version
                .entry(*version)
                .or_insert((*step, stages.clone()));
            e.0 = e.0.min(*step);
        }
        by_version
            .into_iter()
            .map(|(v, (step, stages))| (v, step, stages))
            .collect()
    }

    /// The version driver `i` ran at `step`.
    pub fn version_at(&self, i: usize, step: u64) -> u32 {
        self.driving.get(&i).map_or(0, |d| {
            d.iter()
                .filter(|(from, ..)| *from <= step)
                .map(|(_, v, _)| *v)
                .max()
                .unwrap_or(0)
        })
    }

    /// Null when no node reported an upgrade; else the longest trace, each node's version,
    /// whether every reporting node's trace is a prefix of it (a node that stopped early
    /// saw fewer), the step at which each driver moved to each version, and the moves.
    pub fn figures(&self) -> Value {
        let Some(longest) = self.nodes.values().max_by_key(|t| t.len()) else {
            return Value::Null;
        };
        let driving: BTreeMap<String, Value> = self
            .driving
            .iter()
            .map(|(i, d)| {
                let at: Vec<Value> = d
                    .iter()
                    .map(|(step, v, _)| json!({"from_step": step, "version": v}))
                    .collect();
                (i.to_string(), Value::from(at))
            })
            .collect();
        let moves: Vec<Value> = self
            .moves
            .iter()
            .map(|(i, from, to, v)| json!({"node": i, "from": from, "to": to, "version": v}))
            .collect();
        let agree = self.nodes.values().all(|t| longest.starts_with(t));
        let versions: BTreeMap<String, Value> = self
            .nodes
            .iter()
            .map(|(i, t)| {
                (
                    i.to_string(),
                    t.last().map_or(Value::Null, |u| u["version"].clone()),
                )
            })
            .collect();
        json!({
            "upgrades": longest,
            "per_node_version": versions,
            "agree": agree,
            "driving": driving,
            "moves": moves,
        })
    }

    pub fn lines(&self) -> Vec<String> {
        let Some(longest) = self.nodes.values().max_by_key(|t| t.len()) else {
            return Vec::new();
        };
        let mut out: Vec<String> = longest
            .iter()
            .map(|u| {
                format!(
                    "architecture v{} at epoch {}: {} layers × {} ({} parameters), stages {} \
                     ({} joins, {} claims counted)",
                    u["version"],
                    u["epoch"],
                    u["layers"],
                    u["d_model"],
                    u["params"],
                    u["stages"],
                    u["joins"],
                    u["counted"]
                )
            })
            .collect();
        for (i, from, to, v) in &self.moves {
            out.push(format!(
                "node {i} moves from stage {from} to stage {to} (v{v})"
            ));
        }
        for (i, d) in &self.driving {
            for (step, v, _) in d {
                out.push(format!("driver node {i} trains v{v} from step {step}"));
            }
        }
        out.push(format!(
            "architecture: {} of {} reporting nodes agree",
            self.nodes
                .values()
                .filter(|t| longest.starts_with(t))
                .count(),
            self.nodes.len()
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrade(version: u32, epoch: u64) -> NodeEvent {
        NodeEvent::Architecture {
            epoch,
            version,
            layers: 4 + u64::from(version),
            d_model: 16,
            params: 100,
            stages: vec![(0, 2), (2, u64::from(version)), (1, 2)],
            joins: 3 * u64::from(version),
            counted: 3,
            time_ms: 1,
        }
    }

    #[test]
    fn nodes_with_one_trace_agree_and_a_different_one_does_not() {
        let mut log = ArchitectureLog::default();
        assert_eq!(log.figures(), Value::Null);
        log.on_event(0, &upgrade(1, 5));
        log.on_event(0, &upgrade(2, 9));
        log.on_event(1, &upgrade(1, 5));
        // A restarted node reports its ledger's upgrades again: one trace still.
        log.on_event(1, &upgrade(1, 5));
        assert_eq!(log.figures()["agree"], json!(true));
        assert_eq!(log.figures()["per_node_version"]["1"], json!(1));
        log.on_event(2, &upgrade(1, 6));
        assert_eq!(log.figures()["agree"], json!(false));
        assert_eq!(log.lines().len(), 3);
    }

    #[test]
    fn the_trained_version_is_the_newest_a_driver_ran() {
        let mut log = ArchitectureLog::default();
        assert!(log.trained().is_empty());
        let driving = |step, version| NodeEvent::Driving {
            step,
            version,
            stages: vec![(0, 2), (2, u64::from(version)), (1, 2)],
            time_ms: 1,
        };
        log.on_event(0, &upgrade(1, 5));
        log.on_event(0, &driving(40, 1));
        log.on_event(1, &driving(45, 1));
        assert_eq!(log.trained(), vec![(1, 40, vec![(0, 2), (2, 1), (1, 2)])]);
        assert_eq!((log.version_at(0, 39), log.version_at(0, 40)), (0, 1));
        assert_eq!(log.figures()["driving"]["1"][0]["from_step"], json!(45));
    }
}
