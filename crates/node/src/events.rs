//! What a node reports: one typed enum, written as one JSON object per line by the runtime and
//! read back by `neuroshard swarm` and the simulator. The field names are the wire format
//! (version [`EVENTS_VERSION`]); add fields as `Option` so older readers keep working.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Maps the instants a state machine is handed to the Unix time its events carry (virtual in
/// the simulator), without reading a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    pub start: Instant,
    pub start_unix_ms: u64,
}

impl Clock {
    pub fn new(start: Instant, start_unix_ms: u64) -> Self {
        Self {
            start,
            start_unix_ms,
        }
    }

    /// Unix time in ms at `now`.
    pub fn unix_ms(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.start).as_millis();
        self.start_unix_ms
            .saturating_add(u64::try_from(since).unwrap_or(u64::MAX))
    }
}

/// Version of the event format, reported in `ready`.
pub const EVENTS_VERSION: u32 = 1;

/// The ledger as a node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LedgerSummary {
    pub state_hash: String,
    pub proofs: usize,
    pub balance: u64,
    /// The node's own stake (what a slash takes).
    #[serde(default)]
    pub stake: u64,
    /// The node's training claims whose rounds finality has not settled yet (unpaid so far).
    #[serde(default)]
    pub pending: usize,
}

/// One event of a node. `time_ms` is the node's Unix time (virtual in the simulator).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum NodeEvent {
    /// The node runs: its identity, stage and where it starts from.
    Ready {
        version: u32,
        node: String,
        /// The network id (hash of its signed genesis).
        #[serde(default)]
        network: String,
        /// Transport address book entry (libp2p peer id in real processes).
        peer: Option<String>,
        stage: usize,
        role: String,
        addrs: Vec<String>,
        resumed_step: u64,
        model_hash: String,
        sync_round: u64,
        theta: String,
        joined_round: Option<u64>,
        join_ms: Option<f64>,
        time_ms: u64,
    },
    /// This replica applied an optimizer step. `loss` and `tokens` are set on drivers.
    Step {
        stage: usize,
        step: u64,
        loss: Option<f32>,
        tokens: u64,
        lr: f64,
        grad_norm: f64,
        model_hash: String,
        /// Milliseconds the node's engine has spent computing since it started (real
        /// processes only): its utilization between two steps is the difference over the
        /// wall time between them.
        #[serde(default)]
        busy_ms: Option<f64>,
        time_ms: u64,
    },
    /// A driver's validation loss: mean cross-entropy (nats per token) of the network's θ₀ on
    /// `windows` held-out windows, measured at driver step `step` and DiLoCo round `round`.
    Validation {
        step: u64,
        round: u64,
        loss: f64,
        tokens: u64,
        windows: usize,
        /// From the first window sent to the last one scored.
        ms: f64,
        time_ms: u64,
    },
    /// A micro-batch went to another replica after `from` failed or timed out.
    Failover {
        mb: String,
        from: String,
        to: String,
        reason: String,
        /// From noticing the failure to the other replica accepting the work.
        ms: f64,
        time_ms: u64,
    },
    /// The driver stopped: it ran its configured number of steps, or (`reason`) it can
    /// drive no more (its registration lapsed, so no stage takes its micro-batches).
    Finished {
        steps: u64,
        #[serde(default)]
        reason: Option<String>,
        time_ms: u64,
    },
    /// Something from a peer was refused, with the reason.
    Dropped {
        what: Option<String>,
        peer: Option<String>,
        stage: Option<usize>,
        round: Option<u64>,
        reason: String,
        time_ms: u64,
    },
    Warning {
        stage: Option<usize>,
        message: String,
        time_ms: u64,
    },
    /// Periodic state, beside every heartbeat.
    Stats {
        stage: usize,
        step: u64,
        queue: usize,
        peers: usize,
        replicas: Vec<usize>,
        /// Transport counters (real processes only).
        net: Option<Box<neuroshard_net::Counters>>,
        sync_round: u64,
        theta: String,
        ledger: LedgerSummary,
        time_ms: u64,
    },
    /// A clean shutdown checkpointed the stage.
    Stopped {
        stage: usize,
        step: u64,
        checkpoint: String,
        model_hash: Option<String>,
        error: Option<String>,
        net: Option<Box<neuroshard_net::Counters>>,
        sync_round: u64,
        theta: String,
        ledger: LedgerSummary,
        time_ms: u64,
    },
    /// A DiLoCo round this replica aggregated itself.
    Sync {
        stage: usize,
        round: u64,
        theta: String,
        contributors: usize,
        expected: usize,
        included_self: bool,
        wall_ms: f64,
        sent_bytes: u64,
        dense_bytes: u64,
        time_ms: u64,
    },
    /// The replica took another replica's outer state.
    Adopted {
        stage: usize,
        round: u64,
        theta: String,
        reason: String,
        time_ms: u64,
    },
    /// A co-replica agreed with our outcome of a round.
    Agreed {
        stage: usize,
        round: u64,
        peer: String,
        time_ms: u64,
    },
    /// This node signed and gossiped a proof.
    Proof {
        bytes: usize,
        balance: u64,
        /// What the proof earned (the balance it added).
        #[serde(default)]
        reward: Option<u64>,
        time_ms: u64,
    },
    /// A peer's proof was applied to the ledger.
    Ledger {
        applied: String,
        reward: u64,
        /// The proof's kind (`training`, `inference`, `uptime`, `verification`).
        #[serde(default)]
        kind: Option<String>,
        state_hash: String,
        time_ms: u64,
    },
    /// Training rounds that finality settled were paid on this node's ledger: each round's
    /// fixed reward split among its contributors.
    Settled {
        rounds: usize,
        /// Paid to all contributors.
        paid: u64,
        /// Paid to this node.
        reward: u64,
        balance: u64,
        state_hash: String,
        time_ms: u64,
    },
    /// An epoch of the ledger is final here: decided by the committee, or fetched with its
    /// certificate and checked.
    Finalized {
        epoch: u64,
        /// The finalized state's hash (every node reaches the same).
        state_hash: String,
        /// Items the epoch holds.
        items: usize,
        /// Members of the committee of the next epoch.
        committee: usize,
        /// From this node's start of the epoch to its finalization (None when fetched).
        #[serde(default)]
        latency_ms: Option<f64>,
        time_ms: u64,
    },
    /// The network's architecture moved to a new version in the finalized state (a growing
    /// network's upgrade rule, evaluated at the end of epoch `epoch`): every node reports the
    /// same version with the same layout.
    Architecture {
        epoch: u64,
        version: u32,
        layers: u64,
        d_model: u64,
        params: u64,
        /// (stage id, blocks) in pipeline order.
        stages: Vec<(u16, u64)>,
        /// Joins counted at the decision, and the registered nodes whose claims counted.
        joins: u64,
        counted: u64,
        time_ms: u64,
    },
    /// A driver's steps from `step` on run under architecture version `version` (it moves
    /// at a round boundary once every new stage of the version is held).
    Driving {
        step: u64,
        version: u32,
        /// (stage id, blocks) in pipeline order.
        stages: Vec<(u16, u64)>,
        time_ms: u64,
    },
    /// This replica leaves `from` to hold `to`, a stage the network grew that nobody holds
    /// (see `core/migrate.rs`): it checkpoints, stops and starts again in the new stage.
    Moving {
        from: usize,
        to: usize,
        version: u32,
        time_ms: u64,
    },
    /// A mover's drain is over (`complete`: no audit of its jobs can come any more; false
    /// when it gave up after `core::migrate::MAX_DRAIN`): it stops and starts again in `to`.
    Drained {
        from: usize,
        to: usize,
        waited_ms: u64,
        complete: bool,
        time_ms: u64,
    },
    /// Anti-entropy brought proofs this ledger lacked.
    LedgerSync {
        peer: String,
        applied: usize,
        rejected: usize,
        parked: usize,
        state_hash: String,
        time_ms: u64,
    },
    /// A proof waits for a receipt signer this node does not know yet.
    Parked {
        what: String,
        reason: String,
        time_ms: u64,
    },
    /// An audit of a co-replica's job ended (verification by recomputation): `outcome` is
    /// `passed` (the replay gave the committed bits), `guilty` (it did not: a fraud proof
    /// follows) or `refused: <why>` (the worker did not serve the job's evidence).
    Audit {
        stage: usize,
        round: u64,
        worker: String,
        job: String,
        kind: String,
        outcome: String,
        time_ms: u64,
    },
    /// As a validator of the ledger committee, this node judged an auditor's demand for a
    /// job's evidence (`core/jury.rs`): `guilty` when the worker served none (or evidence on
    /// which the job does not replay), so this node votes to slash it; `outcome` says how
    /// its own check ended.
    Jury {
        stage: usize,
        round: u64,
        worker: String,
        auditor: String,
        job: String,
        guilty: bool,
        outcome: String,
        time_ms: u64,
    },
    /// Evidence this replica keeps for its auditors (job inputs, the weights of each step of
    /// the rounds still audited), after dropping that of rounds whose audits are over.
    Evidence {
        bytes: u64,
        budget: u64,
        /// Milliseconds the engine has spent on audit work since the node started (replays,
        /// settlements, serving evidence) and on all jobs (real processes only): their ratio
        /// is what audits cost this replica's compute.
        #[serde(default)]
        audit_ms: Option<f64>,
        #[serde(default)]
        busy_ms: Option<f64>,
        time_ms: u64,
    },
    /// The node's HTTP API listens at `http` (its bound address).
    Serving { http: String, time_ms: u64 },
    /// A speculative checkpoint was written (or failed).
    Checkpoint {
        step: u64,
        ms: f64,
        model_hash: Option<String>,
        error: Option<String>,
        time_ms: u64,
    },
}

impl NodeEvent {
    /// The event's name (its `event` field).
    pub fn name(&self) -> &'static str {
        match self {
            NodeEvent::Ready { .. } => "ready",
            NodeEvent::Step { .. } => "step",
            NodeEvent::Validation { .. } => "validation",
            NodeEvent::Failover { .. } => "failover",
            NodeEvent::Finished { .. } => "finished",
            NodeEvent::Dropped { .. } => "dropped",
            NodeEvent::Warning { .. } => "warning",
            NodeEvent::Stats { .. } => "stats",
            NodeEvent::Stopped { .. } => "stopped",
            NodeEvent::Sync { .. } => "sync",
            NodeEvent::Adopted { .. } => "adopted",
            NodeEvent::Agreed { .. } => "agreed",
            NodeEvent::Proof { .. } => "proof",
            NodeEvent::Ledger { .. } => "ledger",
            NodeEvent::LedgerSync { .. } => "ledger_sync",
            NodeEvent::Finalized { .. } => "finalized",
            NodeEvent::Settled { .. } => "settled",
            NodeEvent::Architecture { .. } => "architecture",
            NodeEvent::Moving { .. } => "moving",
            NodeEvent::Drained { .. } => "drained",
            NodeEvent::Driving { .. } => "driving",
            NodeEvent::Parked { .. } => "parked",
            NodeEvent::Audit { .. } => "audit",
            NodeEvent::Jury { .. } => "jury",
            NodeEvent::Evidence { .. } => "evidence",
            NodeEvent::Checkpoint { .. } => "checkpoint",
            NodeEvent::Serving { .. } => "serving",
        }
    }

    /// One JSON line (no newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            format!("{{\"event\":\"warning\",\"message\":\"unencodable event: {e}\"}}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_json() {
        let ev = NodeEvent::Sync {
            stage: 1,
            round: 3,
            theta: "ab".into(),
            contributors: 2,
            expected: 3,
            included_self: true,
            wall_ms: 1.5,
            sent_bytes: 10,
            dense_bytes: 40,
            time_ms: 7,
        };
        let line = ev.to_json_line();
        assert!(line.contains("\"event\":\"sync\""), "{line}");
        let back: NodeEvent = serde_json::from_str(&line).unwrap();
        assert_eq!(back, ev);
        assert_eq!(back.name(), "sync");
        // An unknown event is an error, not a silent default.
        assert!(serde_json::from_str::<NodeEvent>("{\"event\":\"nope\"}").is_err());
    }
}
