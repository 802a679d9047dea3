//! The I/O side of DiLoCo rounds and of the economy: engine requests, blob transfers, gossip
//! and the DHT record. Decisions are the [`Syncer`]'s and the [`crate::economy::Economy`]'s.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use neuroshard_model::StageSpec;
use neuroshard_net::{Net, PeerId};
use neuroshard_proof::{Canonical, LayerRange, NodeId, Roles, ShardWork, Signed};
use serde_json::json;

use super::node::Node;
use super::{RECORD_TTL, emit, now_ms};
use crate::compute::{EngineRequest, ask};
use crate::economy::{LedgerSyncResponse, ProofOutcome, WorkSummary};
use crate::records::PROOF_TOPIC;
use crate::records::{node_of, open};
use crate::replica::{Applied, Prepared};
use crate::sync::{SYNC_TOPIC, SyncAction, SyncDone, SyncMsg, Syncer, ThetaRecord, theta_key};
use crate::wire::MicroBatchId;
use neuroshard_proof::proof::MAX_SHARDS;

/// Results of the asynchronous parts of a round, back on the event loop.
pub(in crate::runtime) enum SyncResult {
    Prepared(u64, Result<Prepared, String>),
    Applied {
        round: u64,
        result: Result<(Applied, Arc<Vec<u8>>), String>,
        failed: Vec<(NodeId, PeerId, String)>,
        peers: Vec<(NodeId, PeerId)>,
    },
    Adopted {
        round: u64,
        hash: [u8; 32],
        result: Result<Vec<u8>, String>,
        reason: String,
    },
    /// Our recomputation of a round another replica announced a larger outcome of.
    Recomputed {
        round: u64,
        claimed: [u8; 32],
        announcer: PeerId,
        result: Result<(Applied, Arc<Vec<u8>>), String>,
        fetched: Vec<(NodeId, [u8; 32])>,
    },
    /// A peer's answer to our ledger anti-entropy request.
    Ledger(PeerId, Result<LedgerSyncResponse, String>),
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
    fn new() -> Self {
        Self {
            tokens: 0,
            batches: 0,
            loss: None,
            since: Instant::now(),
            data: BTreeSet::new(),
        }
    }
}

/// Round state of the event loop.
pub(in crate::runtime) struct SyncState {
    pub syncer: Syncer,
    /// Blobs we serve, by round, withdrawn two rounds later.
    offered: VecDeque<(u64, [u8; 32])>,
    /// Our latest pseudo-gradient offer: (round, blob hash).
    my_offer: Option<(u64, [u8; 32])>,
    optimizer_blob: [u8; 32],
    work: Work,
    spec: StageSpec,
    /// Parameters of the stage: bounds what a peer may send us.
    numel: usize,
}

impl SyncState {
    pub fn new(syncer: Syncer, spec: StageSpec, numel: usize) -> Self {
        Self {
            syncer,
            offered: VecDeque::new(),
            my_offer: None,
            optimizer_blob: [0; 32],
            work: Work::new(),
            spec,
            numel,
        }
    }

    /// Counts a finished backward pass of `tokens` tokens toward the next proof.
    pub fn count_backward(&mut self, mb: &MicroBatchId, tokens: u64, loss: Option<f32>) {
        self.work.tokens += tokens;
        self.work.batches += 1;
        if self.work.data.len() < MAX_SHARDS {
            self.work.data.insert((mb.origin, mb.step));
        }
        if loss.is_some() {
            self.work.loss = loss;
        }
    }
}

impl Node {
    fn publish_sync(&self, msg: SyncMsg) {
        let bytes = Signed::sign(&self.identity, &msg).to_bytes();
        if let Err(e) = self.net.publish(SYNC_TOPIC, bytes) {
            tracing::debug!("sync message not published: {e}");
        }
    }

    fn offer(&mut self, round: u64, blob: Arc<Vec<u8>>) -> [u8; 32] {
        let hash = self.net.offer_blob(blob);
        self.sync.offered.push_back((round, hash));
        while let Some(&(r, h)) = self.sync.offered.front() {
            if r + 2 > round {
                break;
            }
            self.net.withdraw_blob(h);
            self.sync.offered.pop_front();
        }
        hash
    }

    /// Drives the rounds: after an optimizer step, a sync event, and on the tick.
    pub(in crate::runtime) fn poll_sync(&mut self, now: Instant) {
        let live: BTreeSet<NodeId> = self
            .pipeline
            .peers
            .in_stage(self.stage)
            .filter_map(|(p, _)| node_of(p))
            .collect();
        let steps = self.pipeline.steps_done();
        let actions = self.sync.syncer.poll(now, steps, &live);
        self.run_sync_actions(actions);
    }

    /// Emits our next proof when one is due.
    pub(in crate::runtime) fn poll_proof(&mut self) {
        if let Some(result) = self.economy.poll_proof(now_ms()) {
            match result {
                Ok(wire) => {
                    emit(
                        json!({"event": "proof", "bytes": wire.len(), "balance": self.economy.own_balance(), "time_ms": now_ms()}),
                    );
                    if let Err(e) = self.net.publish(PROOF_TOPIC, wire) {
                        tracing::debug!("proof not published: {e}");
                    }
                }
                Err(e) => emit(json!({"event": "warning", "message": format!("proof: {e}")})),
            }
        }
    }

    fn run_sync_actions(&mut self, actions: Vec<SyncAction>) {
        for action in actions {
            match action {
                SyncAction::Prepare { round } => {
                    let prepared = ask(&self.engine, |reply| EngineRequest::SyncPrepare {
                        round,
                        reply,
                    });
                    let tx = self.sync_tx.clone();
                    tokio::spawn(async move {
                        let _ = tx.send(SyncResult::Prepared(round, prepared.answer().await));
                    });
                }
                SyncAction::Publish(msg) => self.publish_sync(msg),
                SyncAction::Aggregate { round, from } => self.aggregate(round, from),
                SyncAction::Adopt {
                    round,
                    peer,
                    hash,
                    included,
                } => self.adopt(round, peer, hash, included),
                SyncAction::Verify {
                    round,
                    fetch,
                    set,
                    theta,
                    announcer,
                } => self.verify(round, fetch, set, theta, announcer),
                SyncAction::Event(ev) => {
                    let mut v = serde_json::to_value(&ev).unwrap_or_default();
                    if let Some(obj) = v.as_object_mut() {
                        obj.insert("stage".into(), json!(self.stage));
                        obj.insert("time_ms".into(), json!(now_ms()));
                    }
                    emit(v);
                }
            }
        }
    }

    fn aggregate(&self, round: u64, from: Vec<(NodeId, Option<PeerId>, [u8; 32])>) {
        let (net, engine, tx) = (self.net.clone(), self.engine.clone(), self.sync_tx.clone());
        let max = pseudo_gradient_limit(self.sync.numel);
        tokio::spawn(async move {
            let remote: Vec<(NodeId, PeerId, [u8; 32])> = from
                .into_iter()
                .filter_map(|(n, p, h)| p.map(|p| (n, p, h)))
                .collect();
            let peers = remote.iter().map(|(n, p, _)| (*n, *p)).collect();
            let (messages, failed) = fetch_all(&net, remote, max).await;
            let result = ask(&engine, |reply| EngineRequest::SyncApply {
                round,
                messages,
                reply,
            })
            .answer()
            .await;
            let _ = tx.send(SyncResult::Applied {
                round,
                result,
                failed,
                peers,
            });
        });
    }

    fn verify(
        &self,
        round: u64,
        fetch: Vec<(NodeId, PeerId, [u8; 32])>,
        set: Vec<NodeId>,
        claimed: [u8; 32],
        announcer: PeerId,
    ) {
        let (net, engine, tx) = (self.net.clone(), self.engine.clone(), self.sync_tx.clone());
        let max = pseudo_gradient_limit(self.sync.numel);
        tokio::spawn(async move {
            let fetched = fetch.iter().map(|(n, _, h)| (*n, *h)).collect();
            let (extra, failed) = fetch_all(&net, fetch, max).await;
            let result = match failed.first() {
                Some((n, _, e)) => Err(format!("offer of {n}: {e}")),
                None => {
                    ask(&engine, |reply| EngineRequest::SyncReapply {
                        round,
                        extra,
                        set,
                        reply,
                    })
                    .answer()
                    .await
                }
            };
            let _ = tx.send(SyncResult::Recomputed {
                round,
                claimed,
                announcer,
                result,
                fetched,
            });
        });
    }

    fn adopt(&self, round: u64, peer: PeerId, hash: [u8; 32], included: bool) {
        let (net, engine, tx) = (self.net.clone(), self.engine.clone(), self.sync_tx.clone());
        let max = outer_state_limit(self.sync.numel);
        let reason = format!("outer state of round {round} from {peer}");
        tokio::spawn(async move {
            // The transport checks the bytes against `hash`, so the state we adopt is the
            // one announced.
            let result = match net.fetch_blob(peer, hash, max).await {
                Ok(bytes) => {
                    let adopted = ask(&engine, |reply| EngineRequest::SyncAdopt {
                        round,
                        bytes: bytes.clone(),
                        included,
                        reply,
                    });
                    adopted.answer().await.map(|_| bytes)
                }
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(SyncResult::Adopted {
                round,
                hash,
                result,
                reason,
            });
        });
    }

    pub(in crate::runtime) fn on_sync_result(&mut self, result: SyncResult, now: Instant) {
        match result {
            SyncResult::Prepared(round, Ok(p)) => {
                let (sent, dense) = (p.blob.len() as u64, p.dense_bytes);
                let hash = self.offer(round, p.blob);
                self.sync.my_offer = Some((round, hash));
                let actions = self.sync.syncer.on_prepared(round, hash, sent, dense, now);
                self.run_sync_actions(actions);
            }
            SyncResult::Applied {
                round,
                result: Ok((applied, optimizer)),
                failed,
                peers,
            } => self.on_applied(round, applied, optimizer, failed, peers, now),
            SyncResult::Adopted {
                round,
                hash,
                result: Ok(bytes),
                reason,
            } => {
                self.offer(round, Arc::new(bytes));
                let steps = self.pipeline.steps_done();
                let ev = self.sync.syncer.on_adopted(round, hash, steps, &reason);
                self.run_sync_actions(vec![ev]);
                self.publish_theta_record();
            }
            SyncResult::Prepared(round, Err(e)) => {
                self.sync_failed(&format!("preparing round {round}: {e}"), now)
            }
            SyncResult::Applied {
                round,
                result: Err(e),
                ..
            } => self.sync_failed(&format!("aggregating round {round}: {e}"), now),
            SyncResult::Adopted {
                result: Err(e),
                reason,
                ..
            } => self.sync_failed(&format!("{reason}: {e}"), now),
            SyncResult::Recomputed {
                round,
                claimed,
                announcer,
                result: Ok((applied, optimizer)),
                fetched,
            } => {
                if applied.theta != claimed {
                    self.net.penalize(
                        announcer,
                        "announced a round outcome that does not recompute",
                    );
                }
                self.serve_outcome(round, &applied, optimizer);
                let steps = self.pipeline.steps_done();
                let contributors = applied.contributors.clone();
                let actions = self.sync.syncer.on_recomputed(
                    round,
                    applied.theta,
                    claimed,
                    contributors,
                    steps,
                );
                self.announce_outcome(round, &applied, &fetched);
                self.run_sync_actions(actions);
            }
            SyncResult::Recomputed {
                round,
                result: Err(e),
                ..
            } => self.sync_failed(&format!("recomputing round {round}: {e}"), now),
            SyncResult::Ledger(peer, Ok(resp)) => {
                let summary = self.economy.on_sync_response(&resp, now_ms());
                if summary.applied > 0 || summary.rejected > 0 {
                    emit(
                        json!({"event": "ledger_sync", "peer": peer.to_string(), "applied": summary.applied, "rejected": summary.rejected, "parked": summary.parked, "state_hash": hex::encode(self.economy.state_hash()), "time_ms": now_ms()}),
                    );
                }
            }
            SyncResult::Ledger(peer, Err(e)) => tracing::debug!(%peer, "ledger sync: {e}"),
        }
    }

    /// Anti-entropy: asks one random live peer for the proofs this ledger lacks, so a node
    /// that was down or joined late ends with the same ledger as the others.
    pub(in crate::runtime) fn ledger_anti_entropy(&self) {
        use rand::seq::IteratorRandom;
        let Some(peer) = self.pipeline.peers.live_peers().choose(&mut rand::rng()) else {
            return;
        };
        let request = match self.economy.sync_request() {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("ledger sync request: {e}");
                return;
            }
        };
        let (net, tx) = (self.net.clone(), self.sync_tx.clone());
        tokio::spawn(async move {
            let result = match net.request(peer, request.to_canonical_bytes()).await {
                Ok(bytes) => {
                    LedgerSyncResponse::from_canonical_bytes(&bytes).map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(SyncResult::Ledger(peer, result));
        });
    }

    fn sync_failed(&mut self, message: &str, now: Instant) {
        emit(
            json!({"event": "warning", "stage": self.stage, "message": message, "time_ms": now_ms()}),
        );
        self.sync.syncer.on_failed(now);
    }

    fn on_applied(
        &mut self,
        round: u64,
        applied: Applied,
        optimizer: Arc<Vec<u8>>,
        failed: Vec<(NodeId, PeerId, String)>,
        peers: Vec<(NodeId, PeerId)>,
        now: Instant,
    ) {
        for (node, peer, reason) in &failed {
            emit(
                json!({"event": "dropped", "stage": self.stage, "round": round, "node": node.to_string(), "peer": peer.to_string(), "reason": reason}),
            );
        }
        for (node, reason) in &applied.rejected {
            // A malformed pseudo-gradient is the sender's fault: it costs reputation.
            if let Some((_, peer)) = peers.iter().find(|(n, _)| n == node) {
                self.net.penalize(*peer, reason);
            }
            emit(
                json!({"event": "dropped", "stage": self.stage, "round": round, "node": node.to_string(), "reason": reason}),
            );
        }
        let theta_before = self.sync.syncer.theta();
        self.serve_outcome(round, &applied, optimizer);
        let steps = self.pipeline.steps_done();
        let (actions, offered) = self.sync.syncer.on_applied(
            round,
            applied.theta,
            applied.contributors.clone(),
            steps,
            now,
        );
        self.announce_outcome(round, &applied, &offered);
        self.run_sync_actions(actions);
        if let Some((r, hash)) = self.sync.my_offer
            && r == round
            && applied.contributors.contains(&self.identity.node_id())
        {
            let shards = self
                .sync
                .work
                .data
                .iter()
                .filter_map(|(origin, step)| {
                    let b = self.load_batch_of(origin, *step).ok()?;
                    Some(ShardWork {
                        shard_id: b.windows.first()?.shard as u64,
                        batch_token_hash: b.token_hash,
                    })
                })
                .collect();
            let work = &mut self.sync.work;
            let spec = self.sync.spec;
            let mut roles = Roles::NONE;
            if spec.embed {
                roles = roles.with(Roles::EMBEDDING);
            }
            if spec.head {
                roles = roles.with(Roles::LM_HEAD);
            }
            self.economy.record_round(WorkSummary {
                round,
                layers: LayerRange {
                    start: spec.first_layer as u32,
                    end: spec.end_layer as u32,
                },
                roles,
                tokens: work.tokens,
                batches: work.batches,
                shards,
                model_hash_before: theta_before,
                model_hash_after: applied.theta,
                pseudo_gradient_hash: hash,
                loss_micros: work.loss.map_or(0, |l| (f64::from(l) * 1e6) as u64),
                duration_ms: work.since.elapsed().as_millis() as u64,
            });
            *work = Work::new();
        }
    }

    /// Serves a round's outer state and our optimizer blob to peers that fetch them.
    fn serve_outcome(&mut self, round: u64, applied: &Applied, optimizer: Arc<Vec<u8>>) {
        self.offer(round, applied.outer.clone());
        self.sync.optimizer_blob = self.offer(round, optimizer);
    }

    /// Gossips our outcome of `round` with receipts for the offers in `receipted`, and points
    /// the stage's DHT record at it.
    fn announce_outcome(&self, round: u64, applied: &Applied, receipted: &[(NodeId, [u8; 32])]) {
        let receipts = receipted
            .iter()
            .map(|(node, blob)| (*node, self.economy.receipt_for(*node, round, *blob)))
            .collect();
        self.publish_sync(SyncMsg::Done(SyncDone {
            network: self.network,
            stage: self.stage as u16,
            round,
            theta: applied.theta,
            contributors: applied.contributors.clone(),
            receipts,
        }));
        self.publish_theta_record();
    }

    /// Announces where newcomers fetch this stage's θ₀ and optimizer state.
    fn publish_theta_record(&self) {
        let rec = ThetaRecord {
            node: self.identity.node_id(),
            network: self.network,
            stage: self.stage as u16,
            round: self.sync.syncer.round(),
            theta: self.sync.syncer.theta(),
            optimizer: self.sync.optimizer_blob,
            expires_ms: now_ms() + RECORD_TTL.as_millis() as u64,
        };
        let net = self.net.clone();
        let key = theta_key(&self.network, self.stage);
        let value = Signed::sign(&self.identity, &rec).to_bytes();
        tokio::spawn(async move {
            if let Err(e) = net.put_record(key, value).await {
                tracing::debug!("publishing the θ₀ record: {e}");
            }
        });
    }

    pub(in crate::runtime) fn on_sync_gossip(&mut self, author: PeerId, data: &[u8], now: Instant) {
        let Ok(msg) = open::<SyncMsg>(data, Some(&author)) else {
            return;
        };
        let Some(node) = node_of(&author) else {
            return;
        };
        if *msg.network() != self.network || usize::from(msg.stage()) != self.stage {
            return;
        }
        match msg {
            SyncMsg::Offer(offer) => self.sync.syncer.on_offer(author, node, offer),
            SyncMsg::Done(done) => {
                let me = self.identity.node_id();
                for (prover, receipt) in done.receipts.iter().filter(|(p, _)| *p == me) {
                    if let Err(e) = self.economy.on_receipt(done.round, *receipt) {
                        tracing::debug!(%prover, "receipt refused: {e}");
                    }
                }
                let actions = self.sync.syncer.on_done(author, node, done);
                self.run_sync_actions(actions);
            }
        }
        // An offer may make us follow a round; a Done may show we are behind.
        self.poll_sync(now);
    }

    pub(in crate::runtime) fn on_proof_gossip(&mut self, data: &[u8]) {
        let outcome = self.economy.on_proof(data, now_ms());
        match outcome {
            ProofOutcome::Applied { node, reward } => emit(json!({
                "event": "ledger", "applied": node.to_string(), "reward": reward,
                "state_hash": hex::encode(self.economy.state_hash()), "time_ms": now_ms(),
            })),
            ProofOutcome::Rejected(reason) => emit(json!({
                "event": "dropped", "what": "proof", "reason": reason, "time_ms": now_ms(),
            })),
            ProofOutcome::Parked(reason) => emit(json!({
                "event": "parked", "what": "proof", "reason": reason, "time_ms": now_ms(),
            })),
            ProofOutcome::Duplicate => {}
        }
    }
}

/// Reads the stage's θ₀ records from the DHT: the latest round first.
pub(in crate::runtime) fn theta_records(
    values: &[Vec<u8>],
    network: &[u8; 32],
    stage: usize,
    me: &NodeId,
) -> Vec<(PeerId, ThetaRecord)> {
    let mut out: Vec<(PeerId, ThetaRecord)> = values
        .iter()
        .filter_map(|v| {
            let signed = Signed::<ThetaRecord>::from_bytes(v).ok()?;
            let rec = signed.verify().ok()?;
            let peer = neuroshard_net::peer_id_of(signed.signer().as_bytes()).ok()?;
            (rec.network == *network
                && usize::from(rec.stage) == stage
                && rec.node == signed.signer().node_id()
                && rec.node != *me
                && rec.expires_ms > now_ms())
            .then_some((peer, rec))
        })
        .collect();
    out.sort_by_key(|(_, r)| std::cmp::Reverse(r.round));
    out
}

/// Largest outer state of a stage: θ₀, velocity and the previous aggregate, plus a header.
pub(in crate::runtime) fn outer_state_limit(numel: usize) -> usize {
    numel * 12 + 64
}

/// Largest pseudo-gradient message of a stage: dense f32 plus headers.
fn pseudo_gradient_limit(numel: usize) -> usize {
    numel * 4 + (1 << 20)
}

/// Fetches blobs concurrently: those that arrived, and the failures with their peer.
async fn fetch_all(
    net: &Net,
    list: Vec<(NodeId, PeerId, [u8; 32])>,
    max: usize,
) -> (Vec<(NodeId, Vec<u8>)>, Vec<(NodeId, PeerId, String)>) {
    let fetched = futures::future::join_all(
        list.into_iter()
            .map(|(n, p, h)| async move { (n, p, net.fetch_blob(p, h, max).await) }),
    )
    .await;
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for (n, p, r) in fetched {
        match r {
            Ok(bytes) => ok.push((n, bytes)),
            Err(e) => failed.push((n, p, format!("fetching its pseudo-gradient: {e}"))),
        }
    }
    (ok, failed)
}
