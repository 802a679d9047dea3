//! A growing network's architecture as the swarm's nodes report it: each node's upgrades
//! (from its finalized ledger state) and whether every node reports the same ones.

use std::collections::BTreeMap;

use neuroshard_node::events::NodeEvent;
use serde_json::{Value, json};

/// Per node, the upgrades it reported, in order.
#[derive(Default)]
pub struct ArchitectureLog {
    nodes: BTreeMap<usize, Vec<Value>>,
}

impl ArchitectureLog {
    pub fn on_event(&mut self, i: usize, ev: &NodeEvent) {
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
            self.nodes.entry(i).or_default().push(json!({
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

    /// Null when no node reported an upgrade; else the longest trace, each node's version,
    /// and whether every reporting node's trace is a prefix of it (a node that stopped early
    /// saw fewer).
    pub fn figures(&self) -> Value {
        let Some(longest) = self.nodes.values().max_by_key(|t| t.len()) else {
            return Value::Null;
        };
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
        json!({ "upgrades": longest, "per_node_version": versions, "agree": agree })
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
        assert_eq!(log.figures()["agree"], json!(true));
        assert_eq!(log.figures()["per_node_version"]["1"], json!(1));
        log.on_event(2, &upgrade(1, 6));
        assert_eq!(log.figures()["agree"], json!(false));
        assert_eq!(log.lines().len(), 3);
    }
}
