//! Swarm routing: rank the live replicas of the next stage by expected wait.

use std::collections::BTreeSet;
use std::time::Duration;

use neuroshard_proof::NodeId;

use crate::peers::PeerTable;

/// Latency assumed for a replica we have not measured yet: optimistic, so new replicas get
/// tried and measured.
const UNMEASURED: Duration = Duration::from_millis(5);

/// Up to `k` replicas of `stage`, best first, skipping `exclude`. The score is the measured
/// acknowledgement latency plus the work ahead of us there (its reported queue and our own
/// unanswered requests) times `service`, the time one micro-batch takes.
pub fn candidates(
    table: &PeerTable,
    stage: usize,
    k: usize,
    exclude: &BTreeSet<NodeId>,
    service: Duration,
) -> Vec<NodeId> {
    let mut ranked: Vec<(Duration, NodeId)> = table
        .in_stage(stage)
        .filter(|(id, p)| p.routable && !exclude.contains(id))
        .map(|(id, p)| {
            let ahead = p.queue.saturating_add(p.in_flight);
            (p.latency.unwrap_or(UNMEASURED) + service * ahead, *id)
        })
        .collect();
    // Ties break on the peer id so every run with the same inputs routes the same way.
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    ranked.into_iter().take(k).map(|(_, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Heartbeat;
    use neuroshard_proof::NodeId;
    use std::time::Instant;

    fn beat(table: &mut PeerTable, peer: NodeId, stage: u16, queue: u32) {
        let hb = Heartbeat {
            node: NodeId([0; 32]),
            network: [0; 32],
            stage,
            step: 0,
            queue,
            time_ms: 0,
            every_ms: 2_000,
            leaving: false,
            arch: Default::default(),
        };
        table.on_heartbeat(peer, &hb, Instant::now());
    }

    #[test]
    fn prefers_short_queues_and_low_latency() {
        let mut t = PeerTable::default();
        let (a, b, c, other) = (
            NodeId(rand::random()),
            NodeId(rand::random()),
            NodeId(rand::random()),
            NodeId(rand::random()),
        );
        beat(&mut t, a, 1, 4);
        beat(&mut t, b, 1, 0);
        beat(&mut t, c, 1, 0);
        beat(&mut t, other, 2, 0);
        t.observe_latency(&b, Duration::from_millis(50));
        t.observe_latency(&c, Duration::from_millis(2));
        let service = Duration::from_millis(20);
        let got = candidates(&t, 1, 3, &BTreeSet::new(), service);
        assert_eq!(got, vec![c, b, a]);
        let got = candidates(&t, 1, 2, &BTreeSet::from([c]), service);
        assert_eq!(got, vec![b, a]);
        // Our own unanswered requests count as queue.
        if let Some(p) = t.get_mut(&c) {
            p.in_flight = 10;
        }
        assert_eq!(candidates(&t, 1, 1, &BTreeSet::new(), service), vec![b]);
    }
}
