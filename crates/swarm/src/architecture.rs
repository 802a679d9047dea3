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
    /// Replicas that moved to a new stage.
    moves: Vec<Move>,
}

/// A replica leaving its stage for a new one, and its drain once over.
struct Move {
    node: usize,
    from: usize,
    to: usize,
    version: u32,
    /// (milliseconds drained, whether every audit of its jobs was over).
    drained: Option<(u64, bool)>,
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
                self.moves.push(Move {
                    node: i,
                    from: *from,
                    to: *to,
                    version: *version,
                    drained: None,
                });
                return;
            }
            NodeEvent::Drained {
                to,
                waited_ms,
                complete,
                ..
            } => {
                if let Some(m) = self
                    .moves
                    .iter_mut()
                    .rev()
                    .find(|m| m.node == i && m.to == *to)
                {
                    m.drained = Some((*waited_ms, *complete));
                }
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
            .map(|m| {
                json!({
                    "node": m.node,
                    "from": m.from,
                    "to": m.to,
                    "version": m.version,
                    "drained_ms": m.drained.map(|d| d.0),
                    "drain_complete": m.drained.map(|d| d.1),
                })
            })
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
        for m in &self.moves {
            let drained = match m.drained {
                Some((ms, true)) => format!(", drained in {:.1} s", ms as f64 / 1e3),
                Some((ms, false)) => {
                    format!(", left after {:.1} s with audits open", ms as f64 / 1e3)
                }
                None => ", still draining".into(),
            };
            out.push(format!(
                "node {} moves from stage {} to stage {} (v{}){drained}",
                m.node, m.from, m.to, m.version
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

    #[test]
    fn a_move_reports_its_drain() {
        let mut log = ArchitectureLog::default();
        log.on_event(0, &upgrade(1, 5));
        let moving = NodeEvent::Moving {
            from: 0,
            to: 3,
            version: 1,
            time_ms: 1,
        };
        log.on_event(2, &moving);
        assert!(
            log.lines()[1].ends_with("still draining"),
            "{:?}",
            log.lines()
        );
        log.on_event(
            2,
            &NodeEvent::Drained {
                from: 0,
                to: 3,
                waited_ms: 80_500,
                complete: true,
                time_ms: 2,
            },
        );
        assert_eq!(
            log.lines()[1],
            "node 2 moves from stage 0 to stage 3 (v1), drained in 80.5 s"
        );
        let m = &log.figures()["moves"][0];
        assert_eq!(
            (&m["drained_ms"], &m["drain_complete"]),
            (&json!(80_500), &json!(true))
        );
    }
}
