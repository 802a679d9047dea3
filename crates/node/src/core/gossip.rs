//! Gossip and periodic duties of the core: heartbeats, the node's DHT record, proofs and
//! ledger anti-entropy, and the sync gossip that drives the rounds.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use neuroshard_proof::{Canonical, NodeId, Signed};
use rand::seq::IteratorRandom;

use super::{NodeCore, Pending, RECORD_TTL, Transmit, open_from};
use crate::economy::{LedgerSyncRequest, ProofOutcome};
use crate::events::NodeEvent;
use crate::peers::heartbeat_every;
use crate::records::{Heartbeat, NodeRecord, Topic, node_key};
use crate::sync::SyncMsg;

impl NodeCore {
    pub(super) fn on_heartbeat(&mut self, from: NodeId, topic: u16, data: &[u8], now: Instant) {
        let Ok((hb, _)) = open_from::<Heartbeat>(data, &from) else {
            self.penalize(from, "heartbeat not signed by its sender");
            return;
        };
        // A heartbeat on another stage's topic would put its sender where it is not heard;
        // one of a stage we do not follow (heard while choosing ours) is not our business.
        if hb.node != from
            || hb.network != self.network
            || hb.stage != topic
            || !self.topics().contains(&Topic::Heartbeat(topic))
        {
            return;
        }
        if hb.leaving {
            let actions = self.pipeline.on_peer_down(from, "left the network", now);
            self.run_actions(actions, now);
        } else {
            let registered = self.economy.ledger().is_registered(&from, hb.stage);
            // Keys are free: unregistered senders get a bounded share of the table, so a crowd
            // of fresh keys cannot grow it (a joiner whose registration lands gets in then).
            if !registered
                && self.pipeline.peers.get(&from).is_none()
                && self.pipeline.peers.unroutable() >= super::MAX_UNREGISTERED_PEERS
            {
                return;
            }
            self.pipeline.peers.on_heartbeat(from, &hb, now);
            // Only registered replicas are routed to: an unstaked node that took micro-batches
            // would hold them until they time out (its gradients are not taken). Its
            // registration may be on its way: ask it.
            if let Some(p) = self.pipeline.peers.get_mut(&from) {
                p.routable = registered;
            }
            if !registered {
                self.ask_registration(from, now);
            }
        }
    }

    /// This node's heartbeat period: longer as its stage gains registered replicas, so what
    /// each listener receives per second stays bounded (`peers::heartbeat_every`).
    pub(super) fn heartbeat_every(&self) -> Duration {
        let replicas = u16::try_from(self.stage)
            .map_or(0, |stage| self.economy.ledger().registered(stage).count());
        heartbeat_every(replicas)
    }

    pub(super) fn heartbeat(&mut self, leaving: bool, now: Instant) {
        let hb = Heartbeat {
            node: self.me,
            network: self.network,
            stage: self.stage as u16,
            step: self.pipeline.steps_done(),
            queue: self.pipeline.queue_depth() as u32,
            time_ms: self.unix_ms(now),
            every_ms: u32::try_from(self.heartbeat_every().as_millis()).unwrap_or(u32::MAX),
            leaving,
            arch: self
                .architecture()
                .filter(|a| a.version > 0)
                .map(crate::records::ArchView::of)
                .unwrap_or_default(),
        };
        let data = Signed::sign(&self.identity, &hb).to_bytes();
        self.transmits.push_back(Transmit::Publish {
            topic: Topic::Heartbeat(hb.stage),
            data,
        });
        if !leaving {
            self.register(now);
            self.events.push_back(NodeEvent::Stats {
                stage: self.stage,
                step: self.pipeline.steps_done(),
                queue: self.pipeline.queue_depth(),
                peers: self.pipeline.peers.len(),
                replicas: self.pipeline.peers.replica_counts(self.stage_count()),
                net: None,
                sync_round: self.rounds.syncer.round(),
                theta: hex::encode(self.rounds.syncer.theta()),
                ledger: self.ledger_summary(),
                time_ms: hb.time_ms,
            });
        }
    }

    pub(super) fn publish_node_record(&mut self, now: Instant) {
        let rec = NodeRecord {
            node: self.me,
            network: self.network,
            stage: self.stage as u16,
            expires_ms: self.unix_ms(now) + RECORD_TTL.as_millis() as u64,
            addrs: self.addrs.clone(),
        };
        let value = Signed::sign(&self.identity, &rec).to_bytes();
        self.transmits.push_back(Transmit::PutRecord {
            key: node_key(&self.me),
            value,
        });
    }

    fn hold_unregistered(&mut self, from: NodeId, data: &[u8], now: Instant) {
        if self.unregistered.len() >= super::MAX_UNREGISTERED_HELD {
            self.unregistered.pop_front();
        }
        self.unregistered.push_back((from, data.to_vec()));
        self.ask_registration(from, now);
    }

    /// Asks `from` for its ledger (it holds its own registration), at most once per
    /// [`super::ASK_REGISTRATION_EVERY`].
    pub(super) fn ask_registration(&mut self, from: NodeId, now: Instant) {
        let due = self
            .asked
            .get(&from)
            .is_none_or(|t| now >= *t + super::ASK_REGISTRATION_EVERY);
        if due {
            // Bounded like the buffer: a flood of fresh keys cannot grow it.
            if self.asked.len() >= super::MAX_UNREGISTERED_HELD {
                self.asked
                    .retain(|_, t| now < *t + super::ASK_REGISTRATION_EVERY);
            }
            if self.asked.len() < super::MAX_UNREGISTERED_HELD {
                self.asked.insert(from, now);
                self.ledger_request(from, now);
            }
        }
    }

    /// Replays held sync messages whose senders are now registered (after ops applied).
    pub(super) fn replay_registered(&mut self, now: Instant) {
        let Ok(stage) = u16::try_from(self.stage) else {
            return;
        };
        let ledger = self.economy.ledger();
        let (ready, held): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.unregistered)
            .into_iter()
            .partition(|(n, _)| ledger.is_registered(n, stage));
        self.unregistered = held;
        for (from, data) in ready {
            self.on_sync_gossip(from, &data, now);
        }
    }

    /// Anti-entropy: asks one random live peer for the proofs this ledger lacks, so a node
    /// that was down or joined late ends with the same ledger as the others.
    pub(super) fn ledger_anti_entropy(&mut self, now: Instant) {
        let Some(peer) = self.pipeline.peers.live_peers().choose(&mut self.rng) else {
            return;
        };
        self.ledger_request(peer, now);
    }

    /// Starts a ledger reconciliation with `peer`.
    fn ledger_request(&mut self, peer: NodeId, now: Instant) {
        let request = self.economy.start_sync(peer, self.unix_ms(now));
        self.send_ledger_request(peer, request);
    }

    /// Sends one step of a reconciliation with `peer`.
    pub(super) fn send_ledger_request(&mut self, peer: NodeId, request: LedgerSyncRequest) {
        let token = self.token();
        self.requests.insert(token, Pending::Ledger { peer });
        self.transmits.push_back(Transmit::Request {
            to: peer,
            token,
            data: request.to_canonical_bytes(),
        });
    }

    /// Makes our next proof when one is due. It enters our ledger at once, is gossiped to our
    /// stage and its neighbours, and reaches the rest by anti-entropy: a proof gossiped to
    /// everyone would cost every node a message per proof of the whole network.
    pub(super) fn poll_proof(&mut self, now: Instant) {
        let before = self.economy.own_balance();
        let Some(result) = self.economy.poll_proof(self.unix_ms(now)) else {
            return;
        };
        match result {
            Ok(wire) => {
                let time_ms = self.unix_ms(now);
                let balance = self.economy.own_balance();
                self.events.push_back(NodeEvent::Proof {
                    bytes: wire.len(),
                    balance,
                    reward: Some(balance.saturating_sub(before)),
                    time_ms,
                });
                self.transmits.push_back(Transmit::Publish {
                    topic: Topic::Proof(self.stage as u16),
                    data: wire,
                });
            }
            Err(e) => self.warn(format!("proof: {e}"), now),
        }
    }

    pub(super) fn on_proof_gossip(&mut self, from: NodeId, data: &[u8], now: Instant) {
        let time_ms = self.unix_ms(now);
        // Only provers publish proofs; a relayed one comes by anti-entropy.
        let signed = neuroshard_proof::SignedProof::from_bytes(data);
        let signer = signed.as_ref().map(|p| p.signer().node_id());
        let outcome = match signer {
            Ok(signer) if signer == from => self.economy.on_proof(data, time_ms),
            Ok(_) => {
                ProofOutcome::Rejected("proof gossiped by another node than its prover".into())
            }
            Err(e) => ProofOutcome::Rejected(format!("format: {e}")),
        };
        match outcome {
            ProofOutcome::Applied { node, reward } => self.events.push_back(NodeEvent::Ledger {
                applied: node.to_string(),
                reward,
                // Applied, so its payload decodes.
                kind: signed.ok().and_then(|s| {
                    neuroshard_proof::Proof::from_canonical_bytes(s.payload_bytes())
                        .ok()
                        .map(|p| proof_kind_name(p.kind).to_string())
                }),
                state_hash: hex::encode(self.economy.state_hash()),
                time_ms,
            }),
            // No penalty: an honest prover's proof can look early to a node whose clock lags.
            ProofOutcome::Rejected(reason) => self.events.push_back(NodeEvent::Dropped {
                what: Some("proof".into()),
                peer: Some(from.to_string()),
                stage: None,
                round: None,
                reason,
                time_ms,
            }),
            ProofOutcome::Parked(reason) => self.events.push_back(NodeEvent::Parked {
                what: "proof".into(),
                reason,
                time_ms,
            }),
            ProofOutcome::Duplicate => {}
        }
    }

    /// A driver registered for its stage once whose stake fell below the minimum since
    /// (slashed, unstaked) stops: every stage refuses its micro-batches now, so it would
    /// re-send them forever and never finish. A key never registered is left alone (it may
    /// be waiting for its stake).
    fn stop_driving_if_lapsed(&mut self, stage: u16, now: Instant) {
        let (ledger, me) = (self.economy.ledger(), self.economy.node_id());
        if self.pipeline.finished()
            || !ledger.was_registered(&me, stage)
            || ledger.is_registered(&me, stage)
        {
            return;
        }
        let reason = format!(
            "its registration for stage {stage} lapsed: its stake of {} is below the minimum of {}",
            neuroshard_ledger::format_neuro(ledger.account(&me).stake),
            neuroshard_ledger::format_neuro(ledger.rules().min_stake),
        );
        let actions = self.pipeline.stop_driving(reason, now);
        self.run_actions(actions, now);
    }

    /// Registers for our stage when we are not (checked every heartbeat: a registration can
    /// lapse with the stake behind it, and a node that moved stage needs a new one).
    fn register(&mut self, now: Instant) {
        let Ok(stage) = u16::try_from(self.stage) else {
            return;
        };
        match self.economy.register(stage, self.unix_ms(now)) {
            Some(Ok(data)) => self.transmits.push_back(Transmit::Publish {
                topic: Topic::Ops,
                data,
            }),
            Some(Err(e)) => self.warn(format!("registration: {e}"), now),
            None => {}
        }
        self.stop_driving_if_lapsed(stage, now);
        // Once registered, the capacity a growing network's scaler reads (the op after the
        // registration: each needs the nonce before it). A network of one fixed model does
        // not need it.
        if self.settings.growth.is_none() {
            return;
        }
        match self
            .economy
            .announce(self.settings.capacity, self.unix_ms(now))
        {
            Some(Ok(data)) => self.transmits.push_back(Transmit::Publish {
                topic: Topic::Ops,
                data,
            }),
            Some(Err(e)) => self.warn(format!("capacity announcement: {e}"), now),
            None => {}
        }
    }

    /// Verifies and applies an op (a peer's, or our own settlement); true if it was applied.
    pub(super) fn on_op_gossip(&mut self, from: NodeId, data: &[u8], now: Instant) -> bool {
        let time_ms = self.unix_ms(now);
        let (outcome, retried) = self.economy.on_op(data, time_ms);
        let applied = matches!(outcome, ProofOutcome::Applied { .. });
        if retried.applied > 0 {
            self.ledger_applied_event(now);
        }
        if applied {
            self.replay_registered(now);
        }
        if let ProofOutcome::Rejected(reason) = outcome {
            self.events.push_back(NodeEvent::Dropped {
                what: Some("op".into()),
                peer: Some(from.to_string()),
                stage: None,
                round: None,
                reason,
                time_ms,
            });
        }
        applied
    }

    pub(super) fn ledger_applied_event(&mut self, now: Instant) {
        let time_ms = self.unix_ms(now);
        self.events.push_back(NodeEvent::Ledger {
            applied: "parked proofs".into(),
            reward: 0,
            kind: None,
            state_hash: hex::encode(self.economy.state_hash()),
            time_ms,
        });
    }

    pub(super) fn on_sync_gossip(&mut self, from: NodeId, data: &[u8], now: Instant) {
        let Ok((msg, _)) = open_from::<SyncMsg>(data, &from) else {
            self.penalize(from, "sync message not signed by its sender");
            return;
        };
        if *msg.network() != self.network || usize::from(msg.stage()) != self.stage {
            return;
        }
        // Offers and outcomes count only from replicas registered for the stage: a key
        // without stake cannot put its pseudo-gradient into the average or vouch for a round.
        // No penalty: its registration may simply not have reached us yet (a node that
        // started after it was gossiped). The message waits, and the sender, which holds its
        // own registration, is asked for its ledger.
        if !self.economy.ledger().is_registered(&from, msg.stage()) {
            self.hold_unregistered(from, data, now);
            return;
        }
        match msg {
            SyncMsg::Offer(offer) => {
                // Only an offer its sender committed to as a job can be audited: one
                // without, or whose commitment names other bytes, never reaches an average.
                if let Err(e) = self.notice_offer(from, &offer, now) {
                    if e.blames_sender() {
                        self.penalize(from, format!("offer: {e}"));
                    }
                    return;
                }
                self.keep_offer_envelope(from, &offer, data);
                let actions = self.rounds.syncer.on_offer(from, from, offer, now);
                self.run_sync_actions(actions, now);
            }
            SyncMsg::Done(done) => {
                for (_, receipt) in done.receipts.iter().filter(|(p, _)| *p == self.me) {
                    // A refused receipt changes nothing; the proof waits for a good one.
                    let _ = self.economy.on_receipt(done.round, *receipt);
                }
                let actions = self.rounds.syncer.on_done(from, from, done, now);
                self.run_sync_actions(actions, now);
            }
        }
        // An offer may make us follow a round; a Done may show we are behind.
        self.poll_rounds(now);
    }
}

impl NodeCore {
    /// What the read API needs of the core beyond its events: the live peer table, the
    /// ledger's registrations (how stages this node does not hear are known) and the
    /// richest accounts.
    pub fn telemetry_snapshot(&self) -> crate::telemetry::CoreSnapshot {
        use crate::telemetry::{AccountView, CoreSnapshot, MAX_ACCOUNTS, MAX_NODES, SeenPeer};
        let peers = self
            .pipeline
            .peers
            .live_peers()
            .filter_map(|id| {
                let p = self.pipeline.peers.get(&id)?;
                Some(SeenPeer {
                    node: id.0,
                    stage: p.stage,
                    last_seen_ms: self.unix_ms(p.last_seen),
                })
            })
            .collect();
        let ledger = self.economy.ledger();
        let registered = (0..self.stage_count())
            .filter_map(|s| u16::try_from(s).ok())
            .flat_map(|s| ledger.registered(s).map(move |n| (n.0, usize::from(s))))
            .take(MAX_NODES)
            .collect();
        let mut accounts: Vec<AccountView> = ledger
            .accounts()
            .map(|(id, a)| AccountView {
                node: hex::encode(id.0),
                balance: a.balance,
                stake: a.stake,
            })
            .collect();
        if accounts.len() > MAX_ACCOUNTS {
            accounts.select_nth_unstable_by(MAX_ACCOUNTS, |a, b| b.balance.cmp(&a.balance));
            accounts.truncate(MAX_ACCOUNTS);
        }
        CoreSnapshot {
            stages: self.stage_count(),
            step: self.pipeline.steps_done(),
            sync_round: self.rounds.syncer.round(),
            ledger: self.ledger_summary(),
            peers,
            registered,
            accounts,
            model: self.model_view(),
        }
    }

    /// The model trained: a growing network's architecture from the finalized state, else
    /// the genesis model.
    fn model_view(&self) -> crate::telemetry::ModelView {
        let m = &self.settings.model;
        match self.architecture() {
            Some(a) => crate::telemetry::ModelView {
                version: Some(a.version),
                layers: a.shape.layers,
                d_model: a.shape.d_model,
                params: a.params(),
                stages: a.stages.iter().map(|s| (s.id, s.layers)).collect(),
            },
            None => crate::telemetry::ModelView {
                version: None,
                layers: m.layers as u64,
                d_model: m.d_model as u64,
                params: m.num_params() as u64,
                stages: Vec::new(),
            },
        }
    }
}

/// The name reports give a proof kind.
pub(crate) fn proof_kind_name(kind: neuroshard_proof::ProofKind) -> &'static str {
    use neuroshard_proof::ProofKind;
    match kind {
        ProofKind::Training => "training",
        ProofKind::Inference => "inference",
        ProofKind::Uptime => "uptime",
        ProofKind::Verification => "verification",
    }
}
