//! The node's event handlers: gossip, requests, engine results, heartbeats, checkpoints.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use neuroshard_data::{Genesis, Split};
use neuroshard_model::Batch;
use neuroshard_net::{Net, NetEvent, PeerId};
use neuroshard_proof::{Canonical, Identity, Signed};
use serde_json::json;
use tokio::sync::mpsc;

use super::sync_io::{SyncResult, SyncState};
use super::{CHECKPOINT_DIR, SendResult, emit, now_ms};
use crate::NodeError;
use crate::compute::{EngineRequest, ask};
use crate::economy::{Economy, LedgerSyncRequest, LedgerSyncResponse};
use crate::pipeline::{Action, Pipeline};
use crate::records::{HEARTBEAT_TOPIC, Heartbeat, open};
use crate::settings::{DataOrder, NodeSettings};
use crate::sync::SYNC_TOPIC;
use crate::wire::{Ack, Msg};

pub(super) struct Node {
    pub(super) pipeline: Pipeline,
    pub(super) net: Net,
    pub(super) engine: std::sync::mpsc::Sender<EngineRequest>,
    pub(super) genesis: Genesis,
    pub(super) settings: NodeSettings,
    pub(super) identity: Identity,
    pub(super) network: [u8; 32],
    pub(super) stage: usize,
    pub(super) send_tx: mpsc::UnboundedSender<SendResult>,
    pub(super) sync_tx: mpsc::UnboundedSender<SyncResult>,
    pub(super) sync: SyncState,
    pub(super) economy: Economy,
}

impl Node {
    pub(super) fn on_net_event(&mut self, ev: NetEvent, queue: &mut VecDeque<Action>) {
        let now = Instant::now();
        match ev {
            NetEvent::Gossip {
                topic,
                author,
                data,
            } => match topic.as_str() {
                SYNC_TOPIC => self.on_sync_gossip(author, &data, now),
                crate::records::PROOF_TOPIC => self.on_proof_gossip(&data),
                _ => {
                    // Already verified by the gossip validator; decode again for the contents.
                    let Ok(hb) = open::<Heartbeat>(&data, Some(&author)) else {
                        return;
                    };
                    if hb.network != self.network {
                        return;
                    }
                    if let Some(key) = crate::records::public_key_of(&author) {
                        self.economy.learn_node(key);
                    }
                    if hb.leaving {
                        queue.extend(self.pipeline.on_peer_down(author, "left the network", now));
                    } else {
                        self.pipeline.peers.on_heartbeat(author, &hb, now);
                    }
                }
            },
            NetEvent::Request {
                peer,
                data,
                channel,
            } => {
                if let Ok(req) = LedgerSyncRequest::from_canonical_bytes(&data) {
                    let max = self.settings.max_frame / 2;
                    let resp = self
                        .economy
                        .answer_sync(&req, max)
                        .unwrap_or(LedgerSyncResponse { proofs: Vec::new() });
                    self.net.respond(channel, resp.to_canonical_bytes());
                    return;
                }
                let ack = match Msg::from_canonical_bytes(&data) {
                    Ok(msg) => {
                        let (ack, actions) = self.pipeline.on_message(peer, msg, now);
                        queue.extend(actions);
                        ack
                    }
                    Err(e) => {
                        let reason = format!("undecodable message: {e}");
                        self.net.penalize(peer, &reason);
                        emit(
                            json!({"event": "dropped", "peer": peer.to_string(), "reason": reason}),
                        );
                        Ack::Rejected(reason)
                    }
                };
                self.net.respond(channel, ack.to_canonical_bytes());
            }
            NetEvent::PeerConnected(_) => {}
            NetEvent::PeerDisconnected(peer) => {
                if self.pipeline.peers.get(&peer).is_some() {
                    queue.extend(self.pipeline.on_peer_down(peer, "connection closed", now));
                }
            }
        }
    }

    pub(super) fn apply(&mut self, queue: &mut VecDeque<Action>) {
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Send { to, msg } => self.send(to, msg),
                Action::Compute(job) => {
                    if self.engine.send(EngineRequest::Run(job)).is_err() {
                        tracing::error!("the engine thread stopped");
                    }
                }
                Action::NeedBatch { step } => match self.load_batch(step) {
                    Ok(batch) => queue.extend(self.pipeline.on_batch(step, batch)),
                    Err(e) => emit(
                        json!({"event": "warning", "message": format!("loading batch {step}: {e}")}),
                    ),
                },
                Action::Penalize { peer, reason } => self.net.penalize(peer, &reason),
                Action::Event(ev) => {
                    let mut v = serde_json::to_value(&ev).unwrap_or_default();
                    if let Some(obj) = v.as_object_mut() {
                        obj.insert("time_ms".into(), json!(now_ms()));
                    }
                    emit(v);
                }
            }
        }
    }

    fn send(&self, to: PeerId, msg: Msg) {
        let net = self.net.clone();
        let tx = self.send_tx.clone();
        let (mb, kind) = (msg.mb(), msg.kind());
        let bytes = msg.to_canonical_bytes();
        tokio::spawn(async move {
            let result = match net.request(to, bytes).await {
                Ok(reply) => {
                    Ack::from_canonical_bytes(&reply).map_err(|e| format!("bad answer: {e}"))
                }
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(SendResult {
                to,
                mb,
                kind,
                result,
            });
        });
    }

    fn load_batch(&self, step: u64) -> Result<Batch, NodeError> {
        let b = self.load_batch_of(&self.identity.node_id().0, step)?;
        Ok(Batch {
            batch: b.rows,
            seq: self.settings.seq,
            inputs: b.inputs,
            targets: b.targets,
        })
    }

    /// The batch the driver `origin` trains on at `step` (a pure function of the dataset).
    pub(super) fn load_batch_of(
        &self,
        origin: &[u8; 32],
        step: u64,
    ) -> Result<neuroshard_data::Batch, NodeError> {
        let s = &self.settings;
        Ok(match s.data_order {
            DataOrder::Assigned => self.genesis.train_batch(origin, 0, step, s.batch, s.seq)?,
            DataOrder::Global => self
                .genesis
                .batch(Split::Train, s.seed, step, s.batch, s.seq)?,
        })
    }

    pub(super) fn heartbeat(&self, leaving: bool) {
        let hb = Heartbeat {
            node: self.identity.node_id(),
            network: self.network,
            stage: self.stage as u16,
            step: self.pipeline.steps_done(),
            queue: self.pipeline.queue_depth() as u32,
            time_ms: now_ms(),
            leaving,
        };
        if let Err(e) = self.net.publish(
            HEARTBEAT_TOPIC,
            Signed::sign(&self.identity, &hb).to_bytes(),
        ) {
            tracing::debug!("heartbeat not published: {e}");
        }
        let counters = self.net.counters();
        emit(json!({
            "event": "stats",
            "stage": self.stage,
            "step": self.pipeline.steps_done(),
            "queue": self.pipeline.queue_depth(),
            "peers": self.pipeline.peers.len(),
            "replicas": self.pipeline.peers.replica_counts(self.settings.stages),
            "net": counters,
            "sync_round": self.sync.syncer.round(),
            "theta": hex::encode(self.sync.syncer.theta()),
            "ledger": self.ledger_summary(),
            "time_ms": now_ms(),
        }));
    }

    pub(super) fn ledger_summary(&self) -> serde_json::Value {
        json!({
            "state_hash": hex::encode(self.economy.state_hash()),
            "proofs": self.economy.proof_count(),
            "balance": self.economy.own_balance(),
        })
    }

    pub(super) fn checkpoint_extra(&self) -> serde_json::Value {
        json!({
            "node": self.identity.node_id().to_string(),
            "stage_index": self.stage,
            "dataset": { "root": hex::encode(self.genesis.root()) },
        })
    }

    /// Checkpoints in the engine between jobs; the result is reported as an event.
    pub(super) fn speculative_checkpoint(&self) {
        let started = Instant::now();
        let step = self.pipeline.steps_done();
        let dir = self.settings.data_dir.join(CHECKPOINT_DIR);
        let extra = self.checkpoint_extra();
        let saved = ask(&self.engine, |reply| EngineRequest::Save {
            dir,
            step,
            extra,
            reply,
        });
        tokio::spawn(async move {
            let result = saved.answer().await;
            emit(json!({
                "event": "checkpoint",
                "step": step,
                "ms": started.elapsed().as_secs_f64() * 1e3,
                "model_hash": result.as_ref().ok(),
                "error": result.as_ref().err(),
                "time_ms": now_ms(),
            }));
        });
    }

    pub(super) async fn shutdown(self) -> Result<(), NodeError> {
        self.heartbeat(true);
        let dir = self.settings.data_dir.join(CHECKPOINT_DIR);
        let saved = ask(&self.engine, |reply| EngineRequest::Save {
            dir: dir.clone(),
            step: self.pipeline.steps_done(),
            extra: self.checkpoint_extra(),
            reply,
        })
        .answer()
        .await;
        // Give the deathrattle a moment on the wire before the connections close.
        tokio::time::sleep(Duration::from_millis(200)).await;
        emit(json!({
            "event": "stopped",
            "stage": self.stage,
            "step": self.pipeline.steps_done(),
            "checkpoint": dir.display().to_string(),
            "model_hash": saved.as_ref().ok(),
            "error": saved.as_ref().err(),
            "net": self.net.counters(),
            "sync_round": self.sync.syncer.round(),
            "theta": hex::encode(self.sync.syncer.theta()),
            "ledger": self.ledger_summary(),
            "time_ms": now_ms(),
        }));
        self.net.shutdown().await;
        saved.map(|_| ()).map_err(NodeError::Checkpoint)
    }
}
