//! Joiners: nodes that enter the simulated network through the node's own start-up machine
//! ([`Startup`]), as a real node does: they read the network record, list each stage's
//! replicas, take the emptiest stage, and borrow θ₀ from the publisher of its record.
//!
//! Not modelled: heartbeats while settling (the simulator's gossip reaches running nodes
//! only, so the stage count comes from the providers, the running replicas of each stage),
//! the time a look-up or a start-up fetch takes (answered at once), and borrowed AdamW
//! moments (the simulated engines keep their own).

use neuroshard_model::{ModelError, StageSpec};
use neuroshard_node::core::{EngineJob, EngineOutput, TransferError};
use neuroshard_node::events::NodeEvent;
use neuroshard_node::startup::{JoinError, Joined, Local, Part, Request, Startup, StartupConfig};

use super::{Built, Ev, Sim, UNIX_START_MS};

/// A joiner before its core runs.
#[derive(Default)]
pub(super) struct Joining {
    machine: Option<Startup>,
    built: Option<Built>,
}

impl Sim {
    /// Adds a node that starts after `at` and chooses its stage through the start-up machine
    /// (a node added with [`Sim::add_node`] is told its stage).
    pub fn add_joiner(&mut self, at: std::time::Duration) -> usize {
        let i = self.add_node(0, at);
        self.nodes[i].joining = Some(Joining::default());
        i
    }

    /// Whose outer state joiner `i` took at start-up, and at which round (None: it took none,
    /// or has not started).
    pub fn joined(&self, i: usize) -> Option<Joined> {
        self.nodes[i].joined
    }

    /// Runs node `i`'s start-up as far as it goes: to its core, to its settle deadline (which
    /// comes back as another start event), or to the reason it cannot start.
    pub(super) fn start_joiner(&mut self, i: usize) {
        let Some(mut joining) = self.nodes[i].joining.take() else {
            return;
        };
        let now = self.now;
        let mut machine = match joining.machine.take() {
            Some(mut m) => {
                m.handle_timeout(now);
                m
            }
            None => match self.startup_config(i) {
                Ok(cfg) => Startup::new(cfg, now, self.unix_ms()),
                Err(e) => return self.cannot_start(i, &e.to_string()),
            },
        };
        while let Some(request) = machine.poll_request() {
            self.answer(i, &mut machine, &mut joining, request);
        }
        while let Some(ev) = machine.poll_event() {
            self.record_event(i, ev);
        }
        match machine.poll_outcome() {
            Some(Ok(decision)) => {
                let Some(built) = joining.built.take() else {
                    return self.cannot_start(i, "start-up ended without an engine");
                };
                self.nodes[i].stage = decision.stage;
                self.nodes[i].joined = decision.joined;
                self.nodes[i].prepared = Some((built, decision.peers));
                self.start(i);
            }
            Some(Err(e)) => self.cannot_start(i, &e.to_string()),
            None => {
                if let Some(at) = machine.poll_timeout() {
                    self.push(at.max(now), Ev::Start { node: i });
                }
                joining.machine = Some(machine);
                self.nodes[i].joining = Some(joining);
            }
        }
    }

    fn startup_config(&mut self, i: usize) -> Result<StartupConfig, ModelError> {
        let genesis = self.network().signed.clone();
        let s = &self.settings;
        Ok(StartupConfig {
            identity: self.nodes[i].identity.clone(),
            network: self.network,
            genesis,
            model: s.model.clone(),
            specs: StageSpec::split(&s.model, s.stages)?,
            stage: None,
            need: s.stage_memory()?,
            budget: s.memory_budget,
            settle: std::time::Duration::from_millis(s.settle_ms),
            sync: s.sync.every > 0,
            saved: None,
            grows: s.growth.is_some(),
            overhead: s.replica_overhead(),
        })
    }

    /// Executes one request of node `i`'s machine against the simulated DHT, the running
    /// nodes and its engine-to-be.
    fn answer(&mut self, i: usize, m: &mut Startup, joining: &mut Joining, request: Request) {
        let now = self.now;
        match request {
            Request::GetRecord { key } => {
                let values = self
                    .dht
                    .get(&key)
                    .map(|v| v.values().cloned().collect())
                    .unwrap_or_default();
                m.handle_record(&key, values, now);
            }
            Request::PutRecord { key, value } => {
                let author = self.nodes[i].identity.node_id().0.to_vec();
                self.dht.entry(key).or_default().insert(author, value);
            }
            Request::GetProviders { stage, .. } => {
                let providers = (0..self.nodes.len())
                    .filter(|&j| j != i && self.nodes[j].core.is_some())
                    .filter(|&j| self.nodes[j].stage == stage)
                    .map(|j| self.nodes[j].identity.node_id())
                    .collect();
                m.handle_providers(stage, providers, now);
            }
            Request::LearnKey(_) => {}
            // A joiner has no checkpoint: every load is a fresh engine.
            Request::Load { stage, .. } => {
                let node = self.nodes[i].identity.node_id();
                let result = match self.factory.engine(node, stage) {
                    Ok(built) => {
                        let (round, _) = built.0.sync_state();
                        joining.built = Some(built);
                        Ok(Local { steps: 0, round })
                    }
                    Err(e) => Err(ModelError::Engine(e.0)),
                };
                m.handle_loaded(result, now);
            }
            Request::FetchBlob { peer, hash, max } => {
                let found = self.index.get(&peer).and_then(|&j| {
                    let n = &self.nodes[j];
                    (n.core.is_some() && self.partitions.reachable(i, j))
                        .then(|| n.blobs.get(&hash).cloned())
                });
                let result = match found {
                    None => Err(TransferError("peer is down or unreachable".into())),
                    Some(None) => Err(TransferError("blob not offered".into())),
                    Some(Some(b)) if b.len() > max => Err(TransferError(format!(
                        "blob of {} bytes over {max}",
                        b.len()
                    ))),
                    Some(Some(b)) => Ok(b.to_vec()),
                };
                m.handle_blob(hash, result, now);
            }
            Request::AdoptOuter { bytes, hash, round } => {
                let result = match joining.built.as_mut() {
                    None => Err(JoinError::NotLoaded),
                    // θ = θ₀ in a fresh engine, so adopting the peer's θ₀ replaces both.
                    Some((engine, _)) => match engine.execute(EngineJob::SyncAdopt {
                        round,
                        bytes,
                        included: false,
                    }) {
                        EngineOutput::Adopted(Ok(h)) if h == hash => Ok(()),
                        EngineOutput::Adopted(Ok(_)) => Err(JoinError::HashMismatch),
                        EngineOutput::Adopted(Err(e)) => Err(JoinError::Decode(e.to_string())),
                        _ => Err(JoinError::Decode("unexpected engine output".into())),
                    },
                };
                m.handle_adopted(Part::Outer, result, now);
            }
            Request::AdoptOptimizer { .. } => {
                let why = "the simulated engines keep their own moments".to_string();
                m.handle_adopted(Part::Optimizer, Err(JoinError::Decode(why)), now);
            }
        }
    }

    fn unix_ms(&self) -> u64 {
        UNIX_START_MS
            .saturating_add(u64::try_from((self.now - self.base).as_millis()).unwrap_or(u64::MAX))
    }

    pub(super) fn cannot_start(&mut self, i: usize, why: &str) {
        let ev = NodeEvent::Warning {
            stage: None,
            message: format!("cannot start: {why}"),
            time_ms: self.unix_ms(),
        };
        self.record_event(i, ev);
    }

    /// An event of node `i`, in its log and the trace.
    fn record_event(&mut self, i: usize, ev: NodeEvent) {
        self.trace.update(&(i as u64).to_le_bytes());
        self.trace.update(ev.to_json_line().as_bytes());
        self.nodes[i].events.push(ev);
    }
}
