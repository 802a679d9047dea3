//! DiLoCo rounds inside the core: the [`Syncer`]'s decisions turned into blob fetches and
//! engine jobs, and their results back into the syncer and the economy.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use neuroshard_ledger::Generation;
use neuroshard_model::StageSpec;
use neuroshard_proof::proof::MAX_SHARDS;
use neuroshard_proof::{Hash32, LayerRange, NodeId, Roles, ShardWork};

use super::{EngineJob, EngineOutput, NodeCore, RECORD_TTL, SharedBlob, Token, TransferError};
use super::{Transmit, blob_hash};
use crate::economy::WorkSummary;
use crate::events::NodeEvent;
use crate::replica::Applied;
use crate::sync::theta_key;
use crate::sync::{SyncAction, SyncDone, SyncMsg, Syncer, ThetaRecord};
use crate::wire::MicroBatchId;

/// Largest outer state of a stage: θ₀, velocity and the previous aggregate, plus a header.
pub fn outer_state_limit(numel: usize) -> usize {
    numel * 12 + 64
}

/// Largest pseudo-gradient message of a stage: dense f32 plus headers.
pub fn pseudo_gradient_limit(numel: usize) -> usize {
    numel * 4 + (1 << 20)
}

/// Work done since the last round, for the proof of that round.
struct Work {
    tokens: u64,
    batches: u64,
    loss: Option<f32>,
    since: Instant,
    /// (driver node id, driver step) of the data trained on: any node can rebuild those
    /// batches from the genesis dataset, which is what makes the shard claims checkable.
    data: BTreeSet<([u8; 32], u64)>,
}

impl Work {
    fn new(since: Instant) -> Self {
        Self {
            tokens: 0,
            batches: 0,
            loss: None,
            since,
            data: BTreeSet::new(),
        }
    }
}

/// Why a set of blobs is being fetched; what to do once they are all in.
enum Purpose {
    /// Aggregate `round` from the offers.
    Aggregate { round: u64 },
    /// Recompute `round` over `set` to check another replica's claim.
    Verify {
        round: u64,
        set: Vec<(NodeId, Hash32)>,
        claimed: Hash32,
        announcer: NodeId,
        fetched: Vec<(NodeId, Hash32)>,
    },
    /// Adopt a peer's outer state.
    Adopt {
        round: u64,
        peer: NodeId,
        hash: Hash32,
        included: bool,
    },
}

struct FetchSet {
    purpose: Purpose,
    waiting: usize,
    got: Vec<(NodeId, Vec<u8>)>,
    failed: Vec<(NodeId, String)>,
}

/// What an engine job of a round was for.
enum EngineCtx {
    Prepare {
        round: u64,
    },
    Apply {
        round: u64,
        failed: Vec<(NodeId, String)>,
    },
    Reapply {
        round: u64,
        claimed: Hash32,
        announcer: NodeId,
        set: Vec<(NodeId, Hash32)>,
        fetched: Vec<(NodeId, Hash32)>,
    },
    Adopt {
        round: u64,
        hash: Hash32,
        bytes: SharedBlob,
        reason: String,
    },
}

/// Co-replicas announcing an outer state after which a replica that adopted it stays silent.
pub const ENOUGH_VOUCHERS: usize = 3;

/// A signed offer as it arrived, with its pseudo-gradient's hash.
type Envelope = (Hash32, Vec<u8>);

/// What the live co-replicas depend on: our stage, the peer table's membership, the registry.
type LiveKey = (usize, u64, Generation);

/// Round state of a node.
pub(super) struct RoundState {
    pub syncer: Syncer,
    /// Blobs we serve, by round, withdrawn two rounds later.
    offered: VecDeque<(u64, Hash32)>,
    /// Our latest pseudo-gradient offer: (round, blob hash).
    my_offer: Option<(u64, Hash32)>,
    /// The signed round messages we gossiped last, keyed by (round, is an offer): what a
    /// co-replica's pull gets.
    pub(super) published: VecDeque<((u64, bool), Vec<u8>)>,
    /// Co-replicas' signed offers of the rounds not yet finished, by (round, sender), a few
    /// each: relayed to a co-replica that lacks one our outcome names.
    pub(super) heard_offers: BTreeMap<u64, BTreeMap<NodeId, Vec<Envelope>>>,
    optimizer_blob: Hash32,
    work: Work,
    pub(super) spec: StageSpec,
    /// Parameters of the stage: bounds what a peer may send us.
    pub(super) numel: usize,
    /// Blob fetch token → (fetch set, the node whose blob it is).
    fetches: HashMap<Token, (Token, NodeId)>,
    sets: HashMap<Token, FetchSet>,
    engine: HashMap<Token, EngineCtx>,
    /// The live registered co-replicas, kept while neither the peer table's membership nor
    /// the ledger's registry changed: rebuilding it on every sync message cost O(peers)
    /// lookups each, 15% of a 300-node simulation.
    live: Option<(LiveKey, Arc<BTreeSet<NodeId>>)>,
    /// (finalized epoch, registry generation) the syncer's active provers were taken at.
    active_at: Option<(u64, Generation)>,
}

impl RoundState {
    pub fn new(syncer: Syncer, spec: StageSpec, numel: usize, now: Instant) -> Self {
        Self {
            syncer,
            offered: VecDeque::new(),
            my_offer: None,
            published: VecDeque::new(),
            heard_offers: BTreeMap::new(),
            optimizer_blob: [0; 32],
            work: Work::new(now),
            spec,
            numel,
            fetches: HashMap::new(),
            sets: HashMap::new(),
            engine: HashMap::new(),
            live: None,
            active_at: None,
        }
    }

    /// Counts a finished backward pass of `tokens` tokens toward the next proof.
    pub fn count_backward(&mut self, mb: &MicroBatchId, tokens: u64, loss: Option<f32>) {
        self.work.tokens = self.work.tokens.saturating_add(tokens);
        self.work.batches = self.work.batches.saturating_add(1);
        if self.work.data.len() < MAX_SHARDS {
            self.work.data.insert((mb.origin, mb.step));
        }
        if loss.is_some() {
            self.work.loss = loss;
        }
    }
}

impl NodeCore {
    /// Drives the rounds: after an optimizer step, a round result, sync gossip and timers.
    pub(super) fn poll_rounds(&mut self, now: Instant) {
        // Co-replicas count (a round waits for them, their votes move us) only while they are
        // alive and registered for the stage with stake behind them.
        let live = self.live_co_replicas();
        self.update_active_co_replicas();
        let steps = self.pipeline.steps_done();
        if self.pipeline.finished() {
            self.rounds.syncer.end_training();
        }
        let actions = self.rounds.syncer.poll(now, steps, &live);
        self.run_sync_actions(actions, now);
    }

    pub(super) fn live_co_replicas(&mut self) -> Arc<BTreeSet<NodeId>> {
        let ledger = self.economy.ledger();
        let key = (
            self.stage,
            self.pipeline.peers.membership(),
            ledger.registry_generation(),
        );
        if let Some((at, live)) = &self.rounds.live
            && *at == key
        {
            return Arc::clone(live);
        }
        let stage = u16::try_from(self.stage).unwrap_or(u16::MAX);
        let live: Arc<BTreeSet<NodeId>> = Arc::new(
            self.pipeline
                .peers
                .in_stage(self.stage)
                .map(|(n, _)| *n)
                .filter(|n| ledger.is_registered(n, stage))
                .collect(),
        );
        self.rounds.live = Some((key, Arc::clone(&live)));
        live
    }

    /// Hands the syncer the stage's active provers by the latest finalized state that are
    /// still registered for it, whenever that state or the registry changed: a replica catching
    /// up needs a majority of them and the live co-replicas together.
    fn update_active_co_replicas(&mut self) {
        let ledger = self.economy.ledger();
        let at = (self.finalized_epoch(), ledger.registry_generation());
        if self.rounds.active_at == Some(at) {
            return;
        }
        self.rounds.active_at = Some(at);
        let (layers, _) = stage_claim(&self.rounds.spec);
        let stage = u16::try_from(self.stage).unwrap_or(u16::MAX);
        let active = self
            .economy
            .active_provers(layers)
            .filter(|n| ledger.is_registered(n, stage))
            .collect();
        self.rounds.syncer.set_active(active);
    }

    fn offer_blob(&mut self, round: u64, data: SharedBlob) -> Hash32 {
        let hash = blob_hash(&data);
        self.transmits.push_back(Transmit::OfferBlob { hash, data });
        self.rounds.offered.push_back((round, hash));
        while let Some(&(r, h)) = self.rounds.offered.front() {
            if r.saturating_add(2) > round {
                break;
            }
            self.transmits.push_back(Transmit::WithdrawBlob { hash: h });
            self.rounds.offered.pop_front();
        }
        hash
    }

    pub(super) fn run_sync_actions(&mut self, actions: Vec<SyncAction>, now: Instant) {
        for action in actions {
            match action {
                SyncAction::Prepare { round } => {
                    let token = self.engine(EngineJob::SyncPrepare { round });
                    self.rounds
                        .engine
                        .insert(token, EngineCtx::Prepare { round });
                }
                SyncAction::Publish(msg) => self.publish_sync(&msg),
                SyncAction::Pull { round, from } => self.send_sync_pulls(round, from),
                SyncAction::Aggregate { round, from } => {
                    let remote = from
                        .into_iter()
                        .filter_map(|(n, p, h)| p.map(|p| (n, p, h)))
                        .collect();
                    self.fetch_set(Purpose::Aggregate { round }, remote, now);
                }
                SyncAction::FetchOffers { round, from, nodes } => {
                    self.send_offer_fetch(round, from, nodes)
                }
                SyncAction::Adopt {
                    round,
                    peer,
                    hash,
                    included,
                } => self.fetch_set(
                    Purpose::Adopt {
                        round,
                        peer,
                        hash,
                        included,
                    },
                    vec![(peer, peer, hash)],
                    now,
                ),
                SyncAction::Verify {
                    round,
                    fetch,
                    set,
                    theta,
                    announcer,
                } => {
                    let fetched = fetch.iter().map(|(n, _, h)| (*n, *h)).collect();
                    self.fetch_set(
                        Purpose::Verify {
                            round,
                            set,
                            claimed: theta,
                            announcer,
                            fetched,
                        },
                        fetch,
                        now,
                    );
                }
                SyncAction::Event(ev) => self.events.push_back(ev),
            }
        }
    }

    /// Fetches blobs `(node, from, hash)`: `node`'s blob, from the peer `from` that brought
    /// us its offer (the node itself, or a co-replica that relayed it), then continues with
    /// `purpose`.
    fn fetch_set(&mut self, purpose: Purpose, list: Vec<(NodeId, NodeId, Hash32)>, now: Instant) {
        let max = match purpose {
            Purpose::Adopt { .. } => outer_state_limit(self.rounds.numel),
            _ => pseudo_gradient_limit(self.rounds.numel),
        };
        let set = self.token();
        self.rounds.sets.insert(
            set,
            FetchSet {
                purpose,
                waiting: list.len(),
                got: Vec::new(),
                failed: Vec::new(),
            },
        );
        for (node, from, hash) in list {
            let token = self.token();
            self.rounds.fetches.insert(token, (set, node));
            self.transmits.push_back(Transmit::FetchBlob {
                from,
                token,
                hash,
                max,
            });
        }
        self.try_finish_set(set, now);
    }

    pub(super) fn rounds_on_blob(
        &mut self,
        token: Token,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) {
        let Some((set, node)) = self.rounds.fetches.remove(&token) else {
            return;
        };
        let Some(s) = self.rounds.sets.get_mut(&set) else {
            return;
        };
        s.waiting = s.waiting.saturating_sub(1);
        match result {
            Ok(bytes) => s.got.push((node, bytes)),
            Err(e) => s.failed.push((node, format!("fetching its blob: {e}"))),
        }
        self.try_finish_set(set, now);
    }

    fn try_finish_set(&mut self, set: Token, now: Instant) {
        if self.rounds.sets.get(&set).is_none_or(|s| s.waiting > 0) {
            return;
        }
        let Some(s) = self.rounds.sets.remove(&set) else {
            return;
        };
        // We serve the pseudo-gradients that went into our outcome, so a co-replica can
        // recompute it even when a contributor showed it another offer (or withholds).
        if let Purpose::Aggregate { round } | Purpose::Verify { round, .. } = s.purpose {
            for (_, bytes) in &s.got {
                self.offer_blob(round, Arc::new(bytes.clone()));
            }
        }
        match s.purpose {
            Purpose::Aggregate { round } => {
                let token = self.engine(EngineJob::SyncApply {
                    round,
                    messages: s.got,
                });
                self.rounds.engine.insert(
                    token,
                    EngineCtx::Apply {
                        round,
                        failed: s.failed,
                    },
                );
            }
            Purpose::Verify {
                round,
                set,
                claimed,
                announcer,
                fetched,
            } => {
                if let Some((n, e)) = s.failed.first() {
                    self.sync_failed(format!("recomputing round {round}: offer of {n}: {e}"), now);
                    return;
                }
                let token = self.engine(EngineJob::SyncReapply {
                    round,
                    extra: s.got,
                    set: set.iter().map(|(n, _)| *n).collect(),
                });
                self.rounds.engine.insert(
                    token,
                    EngineCtx::Reapply {
                        round,
                        claimed,
                        announcer,
                        set,
                        fetched,
                    },
                );
            }
            Purpose::Adopt {
                round,
                peer,
                hash,
                included,
            } => {
                let reason = format!("outer state of round {round} from {peer}");
                let Some((_, bytes)) = s.got.into_iter().next() else {
                    let e = s.failed.first().map(|(_, e)| e.clone()).unwrap_or_default();
                    self.sync_failed(format!("{reason}: {e}"), now);
                    return;
                };
                let bytes = Arc::new(bytes);
                let token = self.engine(EngineJob::SyncAdopt {
                    round,
                    bytes: bytes.to_vec(),
                    included,
                });
                self.rounds.engine.insert(
                    token,
                    EngineCtx::Adopt {
                        round,
                        hash,
                        bytes,
                        reason,
                    },
                );
            }
        }
    }

    pub(super) fn rounds_on_engine(&mut self, token: Token, output: EngineOutput, now: Instant) {
        let Some(ctx) = self.rounds.engine.remove(&token) else {
            return;
        };
        match (ctx, output) {
            (EngineCtx::Prepare { round }, EngineOutput::Prepared(Ok((p, hashes)))) => {
                let (sent, dense) = (p.blob.len() as u64, p.dense_bytes);
                let hash = self.offer_blob(round, p.blob);
                self.rounds.my_offer = Some((round, hash));
                let commitment = self.sign_offer(round, hash, &hashes).map(Box::new);
                let actions = self
                    .rounds
                    .syncer
                    .on_prepared(round, hash, sent, dense, commitment, now);
                self.run_sync_actions(actions, now);
            }
            (EngineCtx::Prepare { round }, EngineOutput::Prepared(Err(e))) => {
                self.sync_failed(format!("preparing round {round}: {e}"), now)
            }
            (EngineCtx::Apply { round, failed }, EngineOutput::Applied(Ok((applied, opt)))) => {
                self.on_applied(round, applied, opt, failed, now)
            }
            (EngineCtx::Apply { round, .. }, EngineOutput::Applied(Err(e))) => {
                self.sync_failed(format!("aggregating round {round}: {e}"), now)
            }
            (
                EngineCtx::Reapply {
                    round,
                    claimed,
                    announcer,
                    set,
                    fetched,
                },
                EngineOutput::Applied(Ok((applied, opt))),
            ) => {
                if applied.theta != claimed {
                    self.penalize(
                        announcer,
                        "announced a round outcome that does not recompute",
                    );
                }
                self.serve_outcome(round, &applied, opt);
                let steps = self.pipeline.steps_done();
                let actions = self.rounds.syncer.on_recomputed(
                    round,
                    applied.theta,
                    claimed,
                    set.clone(),
                    steps,
                    now,
                );
                self.announce_outcome(round, &applied, &set, &fetched, now);
                self.run_sync_actions(actions, now);
            }
            (EngineCtx::Reapply { round, .. }, EngineOutput::Applied(Err(e))) => {
                self.sync_failed(format!("recomputing round {round}: {e}"), now)
            }
            (
                EngineCtx::Adopt {
                    round,
                    hash,
                    bytes,
                    reason,
                },
                EngineOutput::Adopted(Ok(_)),
            ) => {
                self.offer_blob(round, bytes);
                let steps = self.pipeline.steps_done();
                let ev = self
                    .rounds
                    .syncer
                    .on_adopted(round, hash, steps, &reason, now);
                self.run_sync_actions(vec![ev], now);
                // Vouch for the state we now hold (no contributors: we did not aggregate it),
                // so a co-replica still behind counts us; without it a replica that caught up
                // keeps voting for its old outcome and the stage can stay split for rounds.
                if self.must_vouch(round, hash) {
                    let msg = SyncMsg::Done(SyncDone {
                        network: self.network,
                        stage: self.stage as u16,
                        round,
                        theta: hash,
                        contributors: Vec::new(),
                        blobs: Vec::new(),
                        receipts: Vec::new(),
                    });
                    self.publish_sync(&msg);
                }
                self.publish_theta_record(now);
            }
            (EngineCtx::Adopt { reason, .. }, EngineOutput::Adopted(Err(e))) => {
                self.sync_failed(format!("{reason}: {e}"), now)
            }
            (_, other) => {
                self.sync_failed(format!("engine answered a round job with {other:?}"), now)
            }
        }
    }

    /// Whether to announce an outer state of `round` we adopted. We must when something we
    /// gossiped still votes otherwise (our outcome of that round, or an offer of the next
    /// against another θ₀: a new announcement replaces it). Otherwise only while fewer than
    /// [`ENOUGH_VOUCHERS`] live co-replicas announced it: a replica behind needs two live
    /// vouchers, and in a large stage most replicas adopt each round, so one announcement per
    /// adopter was most of the stage's round traffic (44k of 60k round messages a round at
    /// 300 nodes).
    pub(super) fn must_vouch(&mut self, round: u64, theta: Hash32) -> bool {
        let ours_vote = self.rounds.published.iter().any(|((r, offer), _)| {
            (*r == round && !offer) || (*r == round.saturating_add(1) && *offer)
        });
        let live = self.live_co_replicas();
        ours_vote || self.rounds.syncer.announced(round, theta, &live) < ENOUGH_VOUCHERS
    }

    fn sync_failed(&mut self, message: String, now: Instant) {
        self.warn(message, now);
        self.rounds.syncer.on_failed(now);
    }

    fn on_applied(
        &mut self,
        round: u64,
        applied: Applied,
        optimizer: SharedBlob,
        failed: Vec<(NodeId, String)>,
        now: Instant,
    ) {
        let time_ms = self.unix_ms(now);
        for (node, reason) in failed.iter().chain(&applied.rejected) {
            self.events.push_back(NodeEvent::Dropped {
                what: Some("pseudo-gradient".into()),
                peer: Some(node.to_string()),
                stage: Some(self.stage),
                round: Some(round),
                reason: reason.clone(),
                time_ms,
            });
        }
        for (node, reason) in &applied.rejected {
            // A malformed pseudo-gradient is the sender's fault: it costs reputation.
            self.penalize(*node, reason.clone());
        }
        let theta_before = self.rounds.syncer.theta();
        self.serve_outcome(round, &applied, optimizer);
        let steps = self.pipeline.steps_done();
        let (actions, named) = self.rounds.syncer.on_applied(
            round,
            applied.theta,
            applied.contributors.clone(),
            steps,
            now,
        );
        let others: Vec<(NodeId, Hash32)> = named
            .iter()
            .filter(|(n, _)| *n != self.me)
            .copied()
            .collect();
        // A round we only recomputed (we had no offer in it: `Syncer::join_closed_round`) is
        // announced like an adopted state, only while it still needs vouchers: in a large
        // stage most replicas may join a round, each heard by all the others.
        if applied.contributors.contains(&self.me) || self.must_vouch(round, applied.theta) {
            self.announce_outcome(round, &applied, &named, &others, now);
        } else {
            self.publish_theta_record(now);
        }
        self.run_sync_actions(actions, now);
        if let Some((r, hash)) = self.rounds.my_offer
            && r == round
            && applied.contributors.contains(&self.me)
        {
            self.record_round(round, theta_before, &applied, hash, now);
        }
    }

    /// Hands the round's work to the economy, which turns it into a proof.
    fn record_round(
        &mut self,
        round: u64,
        theta_before: Hash32,
        applied: &Applied,
        gradient_hash: Hash32,
        now: Instant,
    ) {
        let registered = self.registered_drivers();
        let shards = self
            .rounds
            .work
            .data
            .iter()
            .filter_map(|(origin, step)| {
                let drivers = super::with_driver(registered.clone(), origin);
                let b = self.data.batch(origin, *step, &drivers).ok()?;
                Some(ShardWork {
                    shard_id: b.windows.first()?.shard as u64,
                    batch_token_hash: b.token_hash,
                })
            })
            .collect();
        let work = std::mem::replace(&mut self.rounds.work, Work::new(now));
        let (layers, roles) = stage_claim(&self.rounds.spec);
        self.economy.record_round(WorkSummary {
            round,
            layers,
            roles,
            tokens: work.tokens,
            batches: work.batches,
            shards,
            model_hash_before: theta_before,
            model_hash_after: applied.theta,
            pseudo_gradient_hash: gradient_hash,
            loss_micros: work.loss.map_or(0, |l| (f64::from(l) * 1e6) as u64),
            duration_ms: now.saturating_duration_since(work.since).as_millis() as u64,
        });
    }

    /// Serves a round's outer state and our optimizer blob to peers that fetch them.
    fn serve_outcome(&mut self, round: u64, applied: &Applied, optimizer: SharedBlob) {
        self.offer_blob(round, applied.outer.clone());
        self.rounds.optimizer_blob = self.offer_blob(round, optimizer);
    }

    /// Gossips our outcome of `round`, naming the offer of each contributor in `named`, with
    /// receipts for the offers in `receipted`, and points the stage's DHT record at it.
    fn announce_outcome(
        &mut self,
        round: u64,
        applied: &Applied,
        named: &[(NodeId, Hash32)],
        receipted: &[(NodeId, Hash32)],
        now: Instant,
    ) {
        let receipts = receipted
            .iter()
            .map(|(node, blob)| (*node, self.economy.receipt_for(*node, round, *blob)))
            .collect();
        let msg = SyncMsg::Done(SyncDone {
            network: self.network,
            stage: self.stage as u16,
            round,
            theta: applied.theta,
            contributors: named.iter().map(|(n, _)| *n).collect(),
            blobs: named.iter().map(|(_, b)| *b).collect(),
            receipts,
        });
        self.publish_sync(&msg);
        self.publish_theta_record(now);
    }

    /// Announces where newcomers fetch this stage's θ₀ and optimizer state.
    fn publish_theta_record(&mut self, now: Instant) {
        let rec = ThetaRecord {
            node: self.me,
            network: self.network,
            stage: self.stage as u16,
            round: self.rounds.syncer.round(),
            theta: self.rounds.syncer.theta(),
            optimizer: self.rounds.optimizer_blob,
            expires_ms: self.unix_ms(now) + RECORD_TTL.as_millis() as u64,
        };
        let value = neuroshard_proof::Signed::sign(&self.identity, &rec).to_bytes();
        self.transmits.push_back(Transmit::PutRecord {
            key: theta_key(&self.network, self.stage),
            value,
        });
    }
}

/// The layers and roles a proof of work on `spec` claims.
pub fn stage_claim(spec: &StageSpec) -> (LayerRange, Roles) {
    let mut roles = Roles::NONE;
    if spec.embed {
        roles = roles.with(Roles::EMBEDDING);
    }
    if spec.head {
        roles = roles.with(Roles::LM_HEAD);
    }
    let layers = LayerRange {
        start: u32::try_from(spec.first_layer).unwrap_or(u32::MAX),
        end: u32::try_from(spec.end_layer).unwrap_or(u32::MAX),
    };
    (layers, roles)
}
