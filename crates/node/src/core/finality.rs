//! The core's side of ledger finality: it feeds what the live ledger applied to
//! [`LedgerFinality`], judges epochs by the economy's admission rules, carries finality's
//! gossip and requests, and persists and reports finalized epochs.

use std::time::{Duration, Instant};

use neuroshard_finality::DEFAULT_MAX_MEMBERS;
use neuroshard_ledger::{EpochItem, LedgerState};
use neuroshard_proof::{Canonical, NodeId};
use rand::seq::IteratorRandom;

use super::{NodeCore, Pending, Token, TransferError, Transmit, decode_answer};
use crate::economy::FinalityWrite;
use crate::events::NodeEvent;
use crate::finality::{
    ChainLink, FinalityAnswer, FinalityConfig, FinalityOut, FinalityRequest, LedgerFinality,
};
use crate::records::Topic;

impl NodeCore {
    /// Finality from where the ledger database left it (the genesis, for a new node).
    pub(super) fn start_finality(&mut self, now: Instant) {
        let start = self.economy.take_finality_start().unwrap_or_default();
        let cfg = FinalityConfig {
            network: self.network,
            epoch: Duration::from_millis(self.settings.epoch_ms.max(1)),
            max_members: DEFAULT_MAX_MEMBERS,
            timeouts: Default::default(),
        };
        let mut finality = LedgerFinality::new(cfg, self.identity.clone(), start.genesis, now);
        let links: Vec<ChainLink> = start
            .epochs
            .iter()
            .filter_map(|b| ChainLink::from_canonical_bytes(b).ok())
            .collect();
        let now_ms = self.unix_ms(now);
        // Fees are judged by the finalized epochs' hashes (before the log's epoch is
        // restored: its value may hold fees).
        for link in &links {
            let value = link.certified.value;
            self.economy.note_beacon(value.epoch, value.id_hash());
        }
        let economy = &self.economy;
        let admit = |s: &LedgerState, i: &EpochItem| economy.admit(s, i, now_ms);
        if let Err(e) = finality.restore(&links, &start.wal, &admit, now) {
            self.warn(format!("finalized epochs in the database: {e}"), now);
        }
        // What the live ledger holds and no finalized epoch does waits again.
        let mut verifier = neuroshard_proof::ProofVerifier::new();
        let state = finality.finalized_state().clone();
        for wire in self.economy.held_items() {
            // A proof a finalized epoch holds is not checked again (its hash needs no
            // signature check; a restarted node holds many).
            if let crate::finality::ItemWire::Proof(w) = &wire
                && neuroshard_proof::SignedProof::from_bytes(w)
                    .is_ok_and(|p| state.has_proof(&p.payload_hash()))
            {
                continue;
            }
            if let Ok(item) = wire.verify(&mut verifier, &|n| state.key(n)) {
                finality.add_item(item, wire);
            }
        }
        if !links.is_empty() {
            self.economy.on_finalized(finality.finalized_state());
        }
        self.finality = Some(finality);
        // Settlements of the replayed epochs (paid before are skipped), and any the finalized
        // state keeps that a crash kept the live ledger from writing.
        self.follow_settlements(now, true);
        self.drain_finality(now);
    }

    /// Hands finality what the live ledger applied, judges what waits, carries out the rest.
    pub(super) fn finality_step(&mut self, now: Instant, timeout: bool) {
        let Some(finality) = self.finality.as_mut() else {
            return;
        };
        while let Some((item, wire)) = self.economy.poll_epoch_item() {
            finality.add_item(item, wire);
        }
        let now_ms = self.clock.unix_ms(now);
        let economy = &self.economy;
        let admit = |s: &LedgerState, i: &EpochItem| economy.admit(s, i, now_ms);
        if timeout {
            finality.handle_timeout(&admit, now);
        } else {
            finality.judge_waiting(&admit, now);
        }
        self.drain_finality(now);
    }

    pub(super) fn finality_timeout(&self) -> Option<Instant> {
        self.finality
            .as_ref()
            .and_then(LedgerFinality::poll_timeout)
    }

    pub(super) fn on_finality_gossip(&mut self, from: NodeId, data: &[u8], now: Instant) {
        // `handle_message` runs `finality_step` after every message.
        if let Some(f) = self.finality.as_mut() {
            f.handle_gossip(from, data, now);
        }
    }

    pub(super) fn on_finality_request(&mut self, token: Token, req: &FinalityRequest) {
        let network = match req {
            FinalityRequest::Body { network, .. } | FinalityRequest::Chain { network, .. } => {
                network
            }
        };
        let answer = match self.finality.as_ref() {
            Some(f) if *network == self.network => f.answer(req, self.settings.max_frame / 2),
            _ => FinalityAnswer::Chain(Vec::new()),
        };
        self.transmits.push_back(Transmit::Respond {
            token,
            data: answer.to_canonical_bytes(),
        });
    }

    pub(super) fn on_finality_answer(
        &mut self,
        peer: NodeId,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) {
        let Some(f) = self.finality.as_mut() else {
            return;
        };
        match decode_answer::<FinalityAnswer>(result) {
            Ok(FinalityAnswer::Body(Some(body))) => f.on_body(peer, body, now),
            Ok(FinalityAnswer::Chain(links)) => f.on_chain(peer, links, now),
            Ok(FinalityAnswer::Body(None)) | Err(_) => {}
        }
    }

    /// Carries out what finality asks for.
    fn drain_finality(&mut self, now: Instant) {
        let mut finalized = false;
        let mut proofs: Vec<Vec<u8>> = Vec::new();
        while let Some(out) = self.finality.as_mut().and_then(LedgerFinality::poll_out) {
            match out {
                FinalityOut::Publish(data) => self.transmits.push_back(Transmit::Publish {
                    topic: Topic::Finality,
                    data,
                }),
                FinalityOut::Ask { to, request } => {
                    let Some(peer) = to.or_else(|| self.any_peer()) else {
                        continue;
                    };
                    let token = self.token();
                    self.requests.insert(token, Pending::Finality { peer });
                    self.transmits.push_back(Transmit::Request {
                        to: peer,
                        token,
                        data: request.to_canonical_bytes(),
                    });
                }
                FinalityOut::Finalized {
                    link,
                    applied,
                    latency,
                } => {
                    finalized = true;
                    proofs.extend(link.body.items.iter().filter_map(|i| match i {
                        crate::finality::ItemWire::Proof(w) => Some(w.clone()),
                        _ => None,
                    }));
                    self.apply_finalized_verdicts(&link, now);
                    let value = link.certified.value;
                    self.economy.note_beacon(value.epoch, value.id_hash());
                    self.apply_finalized_fees(&link, now);
                    self.economy.keep_finality(FinalityWrite::Epoch {
                        epoch: value.epoch,
                        link: std::sync::Arc::new(link.to_canonical_bytes()),
                    });
                    let time_ms = self.unix_ms(now);
                    self.events.push_back(NodeEvent::Finalized {
                        epoch: value.epoch,
                        state_hash: hex::encode(value.state),
                        items: applied,
                        committee: link.certified.next_committee.validators().len(),
                        latency_ms: latency.map(|d| d.as_secs_f64() * 1e3),
                        time_ms,
                    });
                }
                FinalityOut::Wal { epoch, entry } => self
                    .economy
                    .keep_finality(FinalityWrite::Wal { epoch, entry }),
                FinalityOut::Equivocation(e) => {
                    let message = format!(
                        "validator {} signed two conflicting consensus messages in epoch {}",
                        e.validator, e.epoch
                    );
                    self.warn(message, now);
                    if let Some(f) = self.finality.as_mut() {
                        f.report_equivocation(&e);
                    }
                }
                FinalityOut::Penalize { peer, reason } => self.penalize(peer, reason),
                FinalityOut::Warning(message) => self.warn(message, now),
            }
        }
        if finalized {
            // The live ledger takes each key's first paid round from the finalized state
            // (`economy/floor.rs`), then every finalized proof it lacks: a first claim it held,
            // or one that reached finality through other nodes only.
            let mut applied = self
                .finality
                .as_ref()
                .map_or(0, |f| self.economy.on_finalized(f.finalized_state()));
            let now_ms = self.unix_ms(now);
            for wire in &proofs {
                if matches!(
                    self.economy.on_proof(wire, now_ms),
                    crate::economy::ProofOutcome::Applied { .. }
                ) {
                    applied += 1;
                }
            }
            if applied > 0 {
                self.ledger_applied_event(now);
            }
            self.follow_settlements(now, false);
            self.on_new_beacon(now);
        }
        self.report_architecture(now);
        self.consider_move(now);
    }

    /// Pays on the live ledger the training rounds finalized epochs settled since the last
    /// call, in order (`economy/settle.rs`); at start-up also any the finalized state keeps
    /// that the live ledger lacks.
    fn follow_settlements(&mut self, now: Instant, starting: bool) {
        let Some(f) = self.finality.as_mut() else {
            return;
        };
        let settled = f.take_settled();
        let mut result = self.economy.apply_settlements(&settled);
        if starting {
            result = result.and_then(|a| {
                let b = self.economy.follow_settlements(f.finalized_state())?;
                Ok(a.and(b))
            });
        }
        match result {
            Ok(followed) if followed.rounds > 0 => {
                let time_ms = self.unix_ms(now);
                self.events.push_back(NodeEvent::Settled {
                    rounds: followed.rounds,
                    paid: followed.paid,
                    reward: followed.own,
                    balance: self.economy.own_balance(),
                    state_hash: hex::encode(self.economy.state_hash()),
                    time_ms,
                });
            }
            Ok(_) => {}
            Err(e) => self.warn(format!("settling finalized rounds: {e}"), now),
        }
    }

    /// Reports each upgrade the finalized state took since the last report (epochs fetched
    /// with their certificates too): every node reports the same versions.
    fn report_architecture(&mut self, now: Instant) {
        let Some(f) = self.finality.as_ref() else {
            return;
        };
        let Some(growth) = f.finalized_state().growth() else {
            return;
        };
        let seen = self.architecture_version;
        if growth.architecture.version <= seen {
            return;
        }
        let new: Vec<neuroshard_growth::Upgrade> = growth
            .history
            .iter()
            .filter(|u| u.architecture.version > seen)
            .cloned()
            .collect();
        let time_ms = self.unix_ms(now);
        let mut learned = false;
        for up in new {
            let a = &up.architecture;
            self.architecture_version = a.version;
            // Every node builds the same layout from the same finalized state; one it cannot
            // build (a model it cannot hold) leaves it training the versions it has.
            match crate::layout::Layout::of(&self.settings.model, a) {
                Ok(l) => learned |= self.pipeline.learn_layout(l),
                Err(e) => self.events.push_back(NodeEvent::Warning {
                    stage: Some(self.stage),
                    message: format!("architecture version {}: {e}", a.version),
                    time_ms,
                }),
            }
            self.events.push_back(NodeEvent::Architecture {
                epoch: up.epoch,
                version: a.version,
                layers: a.shape.layers,
                d_model: a.shape.d_model,
                params: a.params(),
                stages: a.stages.iter().map(|s| (s.id, s.layers)).collect(),
                joins: up.joins,
                counted: up.counted,
                time_ms,
            });
        }
        if learned {
            let topics = self.topics();
            self.transmits.push_back(Transmit::Subscribe { topics });
            // A joiner that took a version from lying heartbeats holds a stage the network
            // does not have: nobody routes to it, and it says so.
            let newest = self.pipeline.layouts().newest();
            if !newest.contains(self.stage) {
                self.events.push_back(NodeEvent::Warning {
                    stage: Some(self.stage),
                    message: format!(
                        "stage {} is not part of the network's architecture version {}; \
                         this node gets no work (restart it to choose again)",
                        self.stage,
                        newest.version()
                    ),
                    time_ms,
                });
            }
        }
    }

    /// The architecture of the finalized state, for a network that grows.
    pub fn architecture(&self) -> Option<&neuroshard_growth::Architecture> {
        self.finality
            .as_ref()
            .and_then(|f| f.finalized_state().architecture())
    }

    /// A connected peer, chosen with the core's seeded randomness.
    fn any_peer(&mut self) -> Option<NodeId> {
        let me = self.me;
        self.pipeline
            .peers
            .live_peers()
            .filter(|n| *n != me)
            .choose(&mut self.rng)
    }

    /// The finalized epoch, its state hash, and the items waiting for an epoch.
    pub fn finality_head(&self) -> Option<(u64, neuroshard_proof::Hash32, usize)> {
        self.finality
            .as_ref()
            .map(|f| (f.head().epoch, f.head().state, f.pending_len()))
    }

    /// What the node's ledger database holds: the economy's part and finality's.
    pub fn ledger_snapshot(&self) -> crate::economy::LedgerSnapshot {
        let mut snapshot = self.economy.snapshot();
        if let Some(f) = &self.finality {
            snapshot.finality = f.record();
        }
        snapshot
    }

    /// Ledger finality (what it holds and serves).
    pub fn finality(&self) -> Option<&LedgerFinality> {
        self.finality.as_ref()
    }

    /// The finalized ledger state.
    pub fn finalized_state(&self) -> Option<&LedgerState> {
        self.finality.as_ref().map(LedgerFinality::finalized_state)
    }
}
