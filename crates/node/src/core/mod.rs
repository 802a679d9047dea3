//! The whole node as one sans-IO state machine: the pipeline, the DiLoCo rounds, the peer
//! table, the router and the economy, composed the way quinn-proto composes a connection.
//!
//! Inputs: [`NodeCore::handle_message`], [`NodeCore::handle_engine_done`] and
//! [`NodeCore::handle_timeout`]. Outputs: [`NodeCore::poll_transmit`],
//! [`NodeCore::poll_engine_job`], [`NodeCore::poll_ledger_write`], [`NodeCore::poll_event`]
//! and [`NodeCore::poll_timeout`]. The core never reads a clock, draws unseeded randomness,
//! opens a socket or a file, or starts a thread; the genesis data it trains on is a pure
//! function it is handed ([`BatchSource`]). A runtime over libp2p and the simulator drive
//! the same code.

mod audit;
mod audit_serve;
#[cfg(test)]
mod audit_tests;
mod beacon;
mod capacity;
mod commit;
mod config;
mod evaluate;
#[cfg(test)]
mod evaluate_tests;
mod fees;
mod finality;
mod fraud;
#[cfg(test)]
pub(crate) mod fraud_tests;
mod gossip;
mod io;
mod jury;
#[cfg(test)]
mod jury_tests;
mod migrate;
#[cfg(test)]
mod migrate_tests;
mod paced;
mod pull;
#[cfg(test)]
mod pull_tests;
mod requests;
mod rounds;
mod serve;
mod serve_pay;
mod serve_replica;
#[cfg(test)]
mod serve_tests;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use neuroshard_model::Batch;
use neuroshard_proof::{Canonical, Hash32, Identity, NodeId};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub use commit::{CommitRefusal, JobLog, Logged, MAX_LOGGED_JOBS};
pub use config::{BatchError, BatchSource, CoreConfig};
pub use evaluate::Window;
pub use io::{
    Compute, EngineError, EngineJob, EngineOutput, Evidence, Inbound, JobHashes, OpenError, Token,
    TransferError, Transmit, blob_hash, open_from,
};
use rounds::RoundState;
pub use rounds::{outer_state_limit, stage_claim};
pub use serve_pay::PaymentRefused;

use crate::economy::{Economy, LedgerSyncResponse, LedgerWrite};
use crate::events::{Clock, LedgerSummary, NodeEvent};
use crate::peers::HEARTBEAT_EVERY;
use crate::pipeline::{Action, JobDone, Pipeline, PipelineConfig};
use crate::records::Topic;
use crate::settings::NodeSettings;
use crate::sync::{SyncConfig, Syncer};
use crate::wire::{Ack, MicroBatchId, PipeAnswer, PipeRequest, TargetWindow};

/// How long a DHT record lives, and how often the node re-publishes its own.
pub const RECORD_TTL: Duration = Duration::from_secs(60);
pub const REPUBLISH_EVERY: Duration = Duration::from_secs(20);
/// Anti-entropy: one ledger exchange with a random peer per period.
pub const ANTI_ENTROPY_EVERY: Duration = HEARTBEAT_EVERY;
/// How often a due proof is looked for.
pub const PROOF_POLL_EVERY: Duration = Duration::from_millis(500);
/// Sync messages held while their sender's registration is on its way (oldest dropped).
pub const MAX_UNREGISTERED_HELD: usize = 64;
/// Unregistered peers the peer table holds at most (registered ones always get in).
pub const MAX_UNREGISTERED_PEERS: usize = 256;
/// Least time between two ledger requests prompted by one unregistered sender.
pub const ASK_REGISTRATION_EVERY: Duration = Duration::from_secs(5);

/// What an outstanding request of ours was for.
#[derive(Debug, Clone)]
enum Pending {
    Pipeline {
        to: NodeId,
        mb: MicroBatchId,
        kind: &'static str,
        job: neuroshard_audit::JobKind,
    },
    Ledger {
        peer: NodeId,
    },
    /// A hop of a stream we coordinate (hop 0: closing it).
    Infer {
        stream: u64,
        hop: u64,
    },
    /// A receipt asked of `from` for our paid stream.
    Receipt {
        stream: u64,
        from: NodeId,
    },
    /// `peer`'s own round messages, which gossip did not bring.
    SyncPull {
        peer: NodeId,
    },
    /// `peer`'s job commitments of `round`, to audit.
    AuditList {
        peer: NodeId,
        round: u64,
    },
    /// The evidence of `peer`'s job we audit.
    AuditEvidence {
        peer: NodeId,
        job: neuroshard_audit::JobKey,
    },
    /// A challenged job's commitment we received, sent to its auditor (the answer is an ack).
    AuditNotice,
    /// Finalized epochs or an epoch body, asked of `peer`.
    Finality {
        peer: NodeId,
    },
    /// The signed offers of `round` from `nodes` that `peer`'s outcome names.
    SyncOffers {
        peer: NodeId,
        round: u64,
        nodes: std::collections::BTreeSet<NodeId>,
    },
}

/// One node.
pub struct NodeCore {
    identity: Identity,
    me: NodeId,
    network: Hash32,
    /// The signed genesis of `network`, served to whoever asks (`GenesisRequest`).
    network_genesis: Vec<u8>,
    stage: usize,
    settings: NodeSettings,
    pipeline: Pipeline,
    rounds: RoundState,
    economy: Economy,
    data: Box<dyn BatchSource>,
    rng: ChaCha8Rng,
    clock: Clock,
    addrs: Vec<String>,
    tokens_per_mb: u64,
    started: bool,
    next_token: Token,
    requests: HashMap<Token, Pending>,
    transmits: VecDeque<Transmit>,
    jobs: VecDeque<(Token, EngineJob)>,
    events: VecDeque<NodeEvent>,
    next_beat: Instant,
    next_anti_entropy: Instant,
    next_republish: Instant,
    next_checkpoint: Option<Instant>,
    next_proof: Instant,
    checkpoint_started: HashMap<Token, (u64, Instant)>,
    /// The latest checkpoint's model hash, or why it failed.
    last_saved: Option<Result<String, EngineError>>,
    /// The latest `now` handled: deadlines before it are due at once, never in a loop.
    last_now: Instant,
    /// Sync messages from senders not (yet) registered for our stage, replayed once their
    /// registration arrives, and when we last asked each such sender for its ledger.
    unregistered: VecDeque<(NodeId, Vec<u8>)>,
    asked: HashMap<NodeId, Instant>,
    serve: serve::ServeState,
    eval: evaluate::EvalState,
    /// This replica's signed job commitments.
    job_log: JobLog,
    audit: audit::AuditState,
    fraud: fraud::FraudState,
    /// Ledger finality (set once the core is built).
    finality: Option<crate::finality::LedgerFinality>,
    /// The architecture version last reported (a growing network's, in the finalized state).
    architecture_version: u32,
    /// Measures the training throughput this node announces.
    meter: capacity::Meter,
    /// The stage this node leaves for, and its drain (see `migrate.rs`).
    moving: Option<migrate::Move>,
}

impl NodeCore {
    pub fn new(cfg: CoreConfig, economy: Economy, data: Box<dyn BatchSource>) -> Self {
        let s = &cfg.settings;
        let me = cfg.identity.node_id();
        let clock = Clock::new(cfg.start, cfg.start_unix_ms);
        let pcfg = PipelineConfig {
            stage: cfg.stage,
            layouts: cfg.layouts.clone(),
            version_every: s.sync.every.max(1),
            model: s.model.clone(),
            micro_batches: s.micro_batches.max(1),
            queue_capacity: s.queue_capacity.max(1),
            candidates: 3,
            grad_timeout: s.grad_timeout(),
            retry_after: Duration::from_millis(100),
            steps: s.steps,
            clock,
            activations: s.activations,
            max_rows: s.batch.div_ceil(s.micro_batches.max(1)),
            min_rows: (s.batch / s.micro_batches.max(1)).max(1),
            seq: s.seq,
            weight_lag: s.weight_lag.min(crate::network::MAX_WEIGHT_LAG),
        };
        let syncer = Syncer::new(
            SyncConfig {
                every: s.sync.every,
                timeout: Duration::from_millis(s.sync.timeout_ms),
                retry_after: Duration::from_secs(1),
                network: cfg.network,
                stage: cfg.stage as u16,
                clock,
            },
            me,
            cfg.sync_round,
            cfg.sync_theta,
            cfg.steps_done,
        );
        let rows = s.batch.div_ceil(s.micro_batches.max(1)) as u64;
        let checkpoint_every = Duration::from_secs(s.checkpoint_secs.max(1));
        let start = cfg.start;
        let mut pipeline = Pipeline::new(pcfg, me.0, cfg.steps_done);
        pipeline.peers = cfg.peers;
        let mut core = Self {
            pipeline,
            rounds: RoundState::new(syncer, cfg.spec, cfg.numel, start),
            economy,
            data,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            identity: cfg.identity.clone(),
            me,
            network: cfg.network,
            network_genesis: cfg.network_genesis,
            stage: cfg.stage,
            tokens_per_mb: rows * s.seq as u64,
            settings: cfg.settings.clone(),
            clock,
            addrs: cfg.addrs,
            started: false,
            next_token: 1,
            requests: HashMap::new(),
            transmits: VecDeque::new(),
            jobs: VecDeque::new(),
            events: VecDeque::new(),
            next_beat: start,
            next_anti_entropy: start + ANTI_ENTROPY_EVERY,
            next_republish: start,
            next_checkpoint: (cfg.settings.checkpoint_secs > 0).then(|| start + checkpoint_every),
            next_proof: start + PROOF_POLL_EVERY,
            checkpoint_started: HashMap::new(),
            last_saved: None,
            last_now: start,
            unregistered: VecDeque::new(),
            asked: HashMap::new(),
            serve: serve::ServeState::new(
                crate::serve::ServeLimits {
                    paid_only: s.paid_only,
                    min_fee_per_stage: s.min_fee_per_stage,
                    ..Default::default()
                },
                start,
            ),
            eval: evaluate::EvalState::default(),
            job_log: JobLog::new(cfg.class),
            audit: audit::AuditState::default(),
            fraud: fraud::FraudState::default(),
            finality: None,
            architecture_version: 0,
            meter: capacity::Meter::default(),
            moving: None,
        };
        core.serve_stored_verdict_weights();
        core.start_finality(start);
        core
    }

    /// A peer holds a newer θ₀ of our stage (from its DHT record): catch up at once.
    pub fn hint_theta(&mut self, peer: NodeId, round: u64, theta: Hash32) {
        self.rounds.syncer.on_hint(peer, round, theta);
    }

    /// The latest checkpoint's model hash, or why it failed.
    pub fn last_saved(&self) -> Option<&Result<String, EngineError>> {
        self.last_saved.as_ref()
    }

    pub fn node_id(&self) -> NodeId {
        self.me
    }

    pub fn stage(&self) -> usize {
        self.stage
    }

    /// Every architecture version this node knows, with its layout.
    pub fn layouts(&self) -> &crate::layout::Layouts {
        self.pipeline.layouts()
    }

    pub fn steps_done(&self) -> u64 {
        self.pipeline.steps_done()
    }

    /// Whether the driver ran its configured steps (always false on other stages).
    pub fn finished(&self) -> bool {
        self.pipeline.finished()
    }

    pub fn sync_round(&self) -> u64 {
        self.rounds.syncer.round()
    }

    pub fn theta(&self) -> Hash32 {
        self.rounds.syncer.theta()
    }

    /// The layers this node's stage holds, as its proofs claim them.
    pub fn layers(&self) -> neuroshard_proof::LayerRange {
        rounds::stage_claim(&self.rounds.spec).0
    }

    pub fn economy(&self) -> &Economy {
        &self.economy
    }

    pub fn ledger_summary(&self) -> LedgerSummary {
        LedgerSummary {
            state_hash: hex::encode(self.economy.state_hash()),
            proofs: self.economy.proof_count(),
            balance: self.economy.own_balance(),
            stake: self.economy.ledger().account(&self.me).stake,
            pending: self.economy.ledger().pending_claims(&self.me),
        }
    }

    /// Unix time in ms at `now`.
    pub fn unix_ms(&self, now: Instant) -> u64 {
        self.clock.unix_ms(now)
    }

    /// The gossip topics this node must hear (the transport subscribes to exactly these).
    pub fn topics(&self) -> Vec<Topic> {
        let layouts = self.pipeline.layouts();
        let mut heard = layouts.near(self.stage);
        // A driver starts a new version only once every stage of it is live, so it hears
        // the stages the network grew (few: the rest it never sends to).
        if layouts.newest().is_first(self.stage) {
            let genesis = layouts.oldest();
            heard.extend(
                layouts
                    .stages()
                    .into_iter()
                    .filter(|s| !genesis.contains(*s)),
            );
        }
        Topic::subscriptions(self.stage, &heard)
    }

    /// One more than the largest stage id of any version: how far per-stage tables reach.
    pub fn stage_count(&self) -> usize {
        self.pipeline
            .layouts()
            .stages()
            .last()
            .map_or(1, |s| s.saturating_add(1))
    }

    /// Live peers as the heartbeats tell (for the caller's start condition and reports).
    pub fn peer_count(&self) -> usize {
        self.pipeline.peers.len()
    }

    // ---- inputs -------------------------------------------------------------------------

    /// A peer's message or a transport event about it.
    pub fn handle_message(&mut self, from: NodeId, msg: Inbound, now: Instant) {
        self.last_now = self.last_now.max(now);
        match msg {
            Inbound::Gossip { topic, data } => match Topic::parse(&topic) {
                Some(Topic::Sync(_)) => self.on_sync_gossip(from, &data, now),
                Some(Topic::Heartbeat(stage)) => self.on_heartbeat(from, stage, &data, now),
                Some(Topic::Proof(_)) => self.on_proof_gossip(from, &data, now),
                Some(Topic::Ops) => self.on_ops_topic(from, &data, now),
                Some(Topic::Finality) => self.on_finality_gossip(from, &data, now),
                None => {}
            },
            Inbound::Request { token, data } => self.on_request(from, token, &data, now),
            Inbound::Response { token, result } => self.on_response(from, token, result, now),
            Inbound::Blob { token, result } => {
                if self.audit.fetching(token) {
                    self.on_audit_blob(token, result, now);
                } else if self.fraud.fetching(token) {
                    self.on_fraud_blob(token, result, now);
                } else {
                    self.rounds_on_blob(token, result, now);
                }
            }
            Inbound::Connected => {}
            Inbound::Disconnected => {
                self.serve_peer_down(from, now);
                if self.pipeline.peers.get(&from).is_some() {
                    let actions = self.pipeline.on_peer_down(from, "connection closed", now);
                    self.run_actions(actions, now);
                }
            }
        }
        self.maybe_start(now);
        // A peer's message can start the node or move the round: an evaluation may be due,
        // and the audits of a finished round.
        self.poll_evaluation(now);
        self.poll_audits(now);
        self.finality_step(now, false);
    }

    /// An engine job finished.
    pub fn handle_engine_done(&mut self, token: Token, output: EngineOutput, now: Instant) {
        self.last_now = self.last_now.max(now);
        match output {
            EngineOutput::Job(done, hashes) => {
                if let Some(h) = hashes {
                    self.note_job_hashes(&done, h);
                }
                let stepped = matches!(done, JobDone::Step { .. });
                if let JobDone::Backward { mb, loss, .. } = &done {
                    self.rounds.count_backward(mb, self.tokens_per_mb, *loss);
                }
                let actions = self.pipeline.on_job_done(done, now);
                self.run_actions(actions, now);
                if stepped {
                    self.poll_rounds(now);
                }
            }
            EngineOutput::Inferred(results) => self.on_inferred(token, results, now),
            EngineOutput::Saved(result) => {
                let (step, since) = self.checkpoint_started.remove(&token).unwrap_or((0, now));
                let ms = now.saturating_duration_since(since).as_secs_f64() * 1e3;
                let (model_hash, error) = match &result {
                    Ok(h) => (Some(h.clone()), None),
                    Err(e) => (None, Some(e.to_string())),
                };
                self.last_saved = Some(result);
                let time_ms = self.unix_ms(now);
                self.events.push_back(NodeEvent::Checkpoint {
                    step,
                    ms,
                    model_hash,
                    error,
                    time_ms,
                });
            }
            other => {
                if !self.on_audit_engine(token, &other, now)
                    && !self.on_fraud_engine(token, &other, now)
                {
                    self.rounds_on_engine(token, other, now);
                    self.poll_rounds(now);
                }
            }
        }
        self.poll_audits(now);
        // A step or an applied round moves what the evaluation is keyed by.
        self.poll_evaluation(now);
        self.finality_step(now, false);
        self.progress_move(now);
    }

    /// Timers: heartbeats, re-publication, anti-entropy, checkpoints, proofs, pipeline and
    /// round deadlines. Call at (or after) [`Self::poll_timeout`].
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        if now >= self.next_beat {
            self.next_beat = now + self.heartbeat_every();
            if !self.departed() {
                self.heartbeat(false, now);
            }
        }
        if now >= self.next_anti_entropy {
            self.next_anti_entropy = now + ANTI_ENTROPY_EVERY;
            self.ledger_anti_entropy(now);
        }
        if now >= self.next_republish {
            self.next_republish = now + REPUBLISH_EVERY;
            self.publish_node_record(now);
        }
        if let Some(at) = self.next_checkpoint
            && now >= at
        {
            self.next_checkpoint =
                Some(now + Duration::from_secs(self.settings.checkpoint_secs.max(1)));
            let _ = self.checkpoint(now);
        }
        if now >= self.next_proof {
            self.next_proof = now + PROOF_POLL_EVERY;
            self.poll_proof(now);
        }
        let actions = self.pipeline.on_tick(now);
        self.run_actions(actions, now);
        self.serve_timeout(now);
        self.poll_rounds(now);
        self.maybe_start(now);
        self.poll_evaluation(now);
        self.poll_juries(now);
        self.flush_fee_claims(now);
        self.finality_step(now, true);
        self.progress_move(now);
    }

    /// A clean shutdown: the deathrattle, then a final checkpoint job, whose token this
    /// returns (its result comes back through [`Self::handle_engine_done`] as usual).
    pub fn shutdown(&mut self, now: Instant) -> Token {
        self.heartbeat(true, now);
        self.checkpoint(now)
    }

    // ---- outputs ------------------------------------------------------------------------

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_engine_job(&mut self) -> Option<(Token, EngineJob)> {
        self.jobs.pop_front()
    }

    pub fn poll_ledger_write(&mut self) -> Option<LedgerWrite> {
        self.economy.poll_write()
    }

    pub fn poll_event(&mut self) -> Option<NodeEvent> {
        self.events.pop_front()
    }

    /// The next instant [`Self::handle_timeout`] has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // Deadlines are strict (`>`) inside the machines: wake just after them.
        let after = |t: Instant| t + Duration::from_millis(1);
        [
            Some(self.next_beat),
            Some(self.next_anti_entropy),
            Some(self.next_republish),
            self.next_checkpoint,
            Some(self.next_proof),
            self.pipeline.next_deadline().map(after),
            self.rounds.syncer.next_deadline().map(after),
            self.serve.next_deadline(),
            self.eval_retry_at(),
            self.finality_timeout(),
            self.jury_timeout(),
            self.fee_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|t| t.max(after(self.last_now)))
    }

    // ---- helpers ------------------------------------------------------------------------

    fn token(&mut self) -> Token {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    fn engine(&mut self, job: EngineJob) -> Token {
        let t = self.token();
        self.jobs.push_back((t, job));
        t
    }

    fn warn(&mut self, message: String, now: Instant) {
        let time_ms = self.unix_ms(now);
        self.events.push_back(NodeEvent::Warning {
            stage: Some(self.stage),
            message,
            time_ms,
        });
    }

    /// The network's drivers as this node's ledger knows them (registered for stage 0), with
    /// `origin`: the set the genesis data is shared out over.
    pub(super) fn drivers_with(&self, origin: &[u8; 32]) -> Vec<[u8; 32]> {
        with_driver(self.registered_drivers(), origin)
    }

    /// The registered stage-0 replicas, sorted.
    pub(super) fn registered_drivers(&self) -> Vec<[u8; 32]> {
        self.economy.ledger().registered(0).map(|n| n.0).collect()
    }

    fn penalize(&mut self, peer: NodeId, reason: impl Into<String>) {
        self.transmits.push_back(Transmit::Penalize {
            peer,
            reason: reason.into(),
        });
    }

    /// Whether this stage and its neighbours each have `wait_replicas` live replicas.
    fn stages_ready(&self) -> bool {
        let want = self.settings.wait_replicas;
        let newest = self.pipeline.layouts().newest();
        let near = [
            newest.prev(self.stage),
            Some(self.stage),
            newest.next(self.stage),
        ];
        near.into_iter().flatten().all(|s| {
            let me = usize::from(s == self.stage);
            let live = self.pipeline.peers.in_stage(s).count();
            live.saturating_add(me) >= want
        })
    }

    fn maybe_start(&mut self, now: Instant) {
        if !self.started && self.stages_ready() {
            self.started = true;
            let actions = self.pipeline.start();
            self.run_actions(actions, now);
        }
    }

    /// Carries out the pipeline's actions.
    fn run_actions(&mut self, actions: Vec<Action>, now: Instant) {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Send { to, mut msg } => {
                    if let crate::wire::Msg::Forward {
                        mb,
                        version,
                        stamp,
                        route,
                        ..
                    } = &mut msg
                    {
                        // Our own micro-batch leaves with our stamp of it and its version.
                        if stamp.is_none() && mb.origin == self.me.0 {
                            let s = crate::wire::DriverStamp {
                                network: self.network,
                                mb: *mb,
                                version: *version,
                            };
                            *stamp = Some(neuroshard_proof::Signed::sign(&self.identity, &s));
                        }
                        // And every forward with our signed choice of its receiver.
                        let h = crate::wire::Handoff {
                            network: self.network,
                            mb: *mb,
                            version: *version,
                            to,
                        };
                        route.push(neuroshard_proof::Signed::sign(&self.identity, &h));
                    }
                    let (mb, kind, job) = (msg.mb(), msg.kind(), commit::job_kind(&msg));
                    let signed = match self.commitment_for(&msg) {
                        Ok(signed) => signed,
                        Err(e) => {
                            // The engine gave no hashes for it (the job failed, or its record
                            // was dropped): nothing goes out, and the sender's timeout (or
                            // ours) routes the micro-batch again.
                            self.warn(format!("no commitment for {kind} {}: {e}", mb.short()), now);
                            continue;
                        }
                    };
                    let token = self.token();
                    self.requests
                        .insert(token, Pending::Pipeline { to, mb, kind, job });
                    self.transmits.push_back(Transmit::Request {
                        to,
                        token,
                        data: PipeRequest { msg, job: signed }.to_canonical_bytes(),
                    });
                }
                Action::Compute(job) => {
                    self.engine(EngineJob::Run(job));
                }
                Action::NeedBatch { step } => {
                    match self
                        .data
                        .batch(&self.me.0, step, &self.drivers_with(&self.me.0))
                    {
                        Ok(b) => {
                            let windows = b
                                .windows
                                .iter()
                                .map(|w| TargetWindow {
                                    shard: u32::try_from(w.shard).unwrap_or(u32::MAX),
                                    window: w.window,
                                })
                                .collect();
                            let batch = Batch {
                                batch: b.rows,
                                seq: self.settings.seq,
                                inputs: b.inputs,
                                targets: b.targets,
                            };
                            queue.extend(self.pipeline.on_batch(step, batch, windows, now));
                        }
                        Err(e) => self.warn(format!("loading batch {step}: {e}"), now),
                    }
                }
                Action::Penalize { peer, reason } => self.penalize(peer, reason),
                Action::Event(ev) => self.events.push_back(ev),
            }
        }
    }

    /// `_from` is the peer the transport matched the answer to: the one we asked, since
    /// tokens never leave this node.
    fn on_response(
        &mut self,
        _from: NodeId,
        token: Token,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) {
        match self.requests.remove(&token) {
            // The answer is for the peer we sent to, whoever the transport says it is from.
            Some(Pending::Pipeline { to, mb, kind, job }) => {
                let result = decode_answer::<PipeAnswer>(result).map(|a| {
                    if a.ack == Ack::Accepted {
                        self.on_countersign(to, (mb, job), (a.countersign, a.tally), now);
                    }
                    a.ack
                });
                let actions = self.pipeline.on_send_result(to, mb, kind, result, now);
                self.run_actions(actions, now);
            }
            Some(Pending::Ledger { peer }) => {
                let Ok(resp) = decode_answer::<LedgerSyncResponse>(result) else {
                    return;
                };
                // Verdicts the peer's ledger applied and ours lacks: each settled here.
                for wire in &resp.reports {
                    self.on_relayed_report(peer, wire, now);
                }
                let (summary, next) = self
                    .economy
                    .on_sync_response(peer, &resp, self.unix_ms(now));
                if let Some(next) = next {
                    self.send_ledger_request(peer, next);
                }
                if !resp.ops.is_empty() {
                    self.replay_registered(now);
                }
                if summary.applied > 0 || summary.rejected > 0 {
                    let time_ms = self.unix_ms(now);
                    self.events.push_back(NodeEvent::LedgerSync {
                        peer: peer.to_string(),
                        applied: summary.applied,
                        rejected: summary.rejected,
                        parked: summary.parked,
                        state_hash: hex::encode(self.economy.state_hash()),
                        time_ms,
                    });
                }
            }
            Some(Pending::Infer { stream, hop }) => {
                let answer = decode_answer::<crate::serve::InferReply>(result);
                self.on_hop_answer(stream, hop, answer, now);
            }
            Some(Pending::Receipt { stream, from }) => {
                let answer = decode_answer::<crate::serve::InferReply>(result);
                self.on_receipt(stream, from, answer, now);
            }
            Some(Pending::SyncPull { peer }) => self.on_sync_pull_answer(peer, result, now),
            Some(Pending::AuditList { peer, round }) => {
                self.on_audit_list(peer, round, result, now)
            }
            Some(Pending::AuditEvidence { peer, job }) => {
                self.on_audit_evidence(peer, job, result, now)
            }
            Some(Pending::AuditNotice) => {}
            Some(Pending::Finality { peer }) => self.on_finality_answer(peer, result, now),
            Some(Pending::SyncOffers { peer, round, nodes }) => {
                self.on_sync_offers_answer(peer, round, &nodes, result, now)
            }
            // A late answer to something we gave up on.
            None => {}
        }
    }

    fn checkpoint(&mut self, now: Instant) -> Token {
        let step = self.pipeline.steps_done();
        let extra = serde_json::json!({
            "node": self.me.to_string(),
            "stage_index": self.stage,
        });
        let token = self.engine(EngineJob::Checkpoint { step, extra });
        self.checkpoint_started.insert(token, (step, now));
        token
    }
}

/// Shared by the rounds module.
pub(crate) type SharedBlob = Arc<Vec<u8>>;

/// A peer's answer decoded, or why there is none (the transfer failed or the bytes are not
/// a `T`).
fn decode_answer<T: Canonical>(result: Result<Vec<u8>, TransferError>) -> Result<T, TransferError> {
    result.and_then(|bytes| {
        T::from_canonical_bytes(&bytes).map_err(|e| TransferError(format!("bad answer: {e}")))
    })
}

/// `drivers` (sorted) with `origin` in its place.
pub(super) fn with_driver(mut drivers: Vec<[u8; 32]>, origin: &[u8; 32]) -> Vec<[u8; 32]> {
    if let Err(at) = drivers.binary_search(origin) {
        drivers.insert(at, *origin);
    }
    drivers
}
