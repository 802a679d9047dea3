//! Ledger finality in the node (issue 19): the items the live ledger applies wait here until
//! an epoch holds them; every `epoch` the committee (the largest stakes of the last finalized
//! state) runs Tendermint (`neuroshard-finality`, Malachite's core) on one value per epoch:
//! the hash of its items, the state they lead to from the last finalized state, and the next
//! committee. Every node applies finalized epochs in order onto its finalized state.
//!
//! Sans-IO like the core that owns it: messages, the time and the economy's verdict on items
//! come in; gossip, requests, finalized epochs (to persist) and warnings come out.
//!
//! The live ledger still applies items as they arrive (training is paid only as finalized
//! epochs settle rounds: `take_settled`); what finality adds is a second state that every
//! node reaches alike, and that says *when* an item is final:
//! - A proposer's value names its body (the items, with their signed bytes), gossiped beside
//!   the proposal. A validator votes for it only if every item verifies, passes the same
//!   admission rules gossip does against the epoch's state, none is refused by the ledger,
//!   and the state and next committee it names are what applying gives.
//! - A node that misses a decision (it was offline, or joined late) asks a peer for the
//!   certified epochs it lacks and checks them from the genesis committee on: each
//!   certificate against the committee the previous value named, each body against the
//!   value's contents and state. Nothing is taken from the peer that serves them.

mod body;
mod chain;
mod evidence;
mod start;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use neuroshard_finality::{
    CertifiedEpoch, ChainHead, Committee, ConsensusWire, EpochValue, Equivocation, Finality,
    FinalityEvent, Finalized, Timeouts, committee_from_stakes,
};
use neuroshard_ledger::{EpochItem, LedgerState, apply_epoch, apply_epoch_admitted};
use neuroshard_proof::{Canonical, Hash32, Identity, NodeId, ProofVerifier};

pub use body::{
    BodyError, ChainLink, EpochBody, FinalityAnswer, FinalityGossip, FinalityRequest, ItemWire,
    KeyOf, MAX_BODY_BYTES, MAX_BODY_ITEMS, MAX_CHAIN_LINKS,
};
pub use chain::ChainRefused;
pub use evidence::{EQUIVOCATION_NONCE, equivocation_slash};

use crate::economy::epochs::Admit;

/// Items waiting for an epoch at most; beyond it new ones are not taken (and a warning says
/// so): finality has been halted that long.
pub const MAX_PENDING: usize = 65_536;
/// Epochs an item the ledger refuses stays pending (its predecessor may still come).
const REFUSALS_KEPT: u8 = 8;
/// Bodies of epochs not finalized yet that a node holds at most.
const MAX_BODIES: usize = 64;
/// Finalized epochs held in memory to serve nodes behind (all are in the database).
pub const KEPT_LINKS: usize = 4096;
/// Values waiting for a verdict at most.
const MAX_JUDGING: usize = 64;
/// Consensus messages held from before the first start at most.
const MAX_EARLY: usize = 256;
/// Least time between two requests for missing epochs or bodies.
const ASK_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct FinalityConfig {
    pub network: Hash32,
    /// Time between one epoch's finalization and the next one's start.
    pub epoch: Duration,
    pub max_members: usize,
    pub timeouts: Timeouts,
}

/// What the caller carries out.
#[derive(Debug, Clone)]
pub enum FinalityOut {
    /// Gossip on the finality topic (`FinalityGossip` bytes).
    Publish(Vec<u8>),
    /// Send a request to `to`, or to any peer when None.
    Ask {
        to: Option<NodeId>,
        request: FinalityRequest,
    },
    /// An epoch this node finalized: persist it, report it.
    Finalized {
        link: Arc<ChainLink>,
        applied: usize,
        latency: Option<Duration>,
    },
    /// A write-ahead log entry of `epoch` to keep before what follows is sent.
    Wal {
        epoch: u64,
        entry: Vec<u8>,
    },
    Equivocation(Box<Equivocation>),
    Penalize {
        peer: NodeId,
        reason: String,
    },
    Warning(String),
}

/// An item waiting for an epoch.
#[derive(Debug, Clone)]
struct Waiting {
    item: EpochItem,
    wire: ItemWire,
    refused: u8,
}

/// A body received for an epoch not finalized yet, its items checked.
#[derive(Debug, Clone)]
struct Known {
    body: EpochBody,
    items: Vec<EpochItem>,
}

/// One node's ledger finality.
pub struct LedgerFinality {
    cfg: FinalityConfig,
    me: NodeId,
    machine: Finality,
    verifier: ProofVerifier,
    /// The genesis state, and the state after the last finalized epoch.
    genesis: LedgerState,
    finalized: LedgerState,
    /// The write-ahead log of the epoch in progress, as stored.
    wal: Vec<(u64, Vec<u8>)>,
    head: ChainHead,
    /// When the next epoch starts (None while one runs).
    next_start: Option<Instant>,
    started_at: Option<(u64, Instant)>,
    pending: BTreeMap<Hash32, Waiting>,
    full_warned: bool,
    bodies: BTreeMap<Hash32, Known>,
    judging: Vec<EpochValue>,
    /// Finalized here before its body arrived.
    decided: Option<Finalized>,
    links: VecDeque<Arc<ChainLink>>,
    out: VecDeque<FinalityOut>,
    /// When a body, and the finalized epochs, were last asked for (each rate-limited on its
    /// own, so asks of one kind never hold up the other).
    last_body_ask: Option<Instant>,
    last_chain_ask: Option<Instant>,
    /// Consensus messages of the next epoch that came before this node started any epoch
    /// (the machine has no committee to check them with yet), replayed at its start.
    early: VecDeque<(NodeId, Vec<u8>)>,
    /// Committee members heard on the finality topic while the first epoch waits.
    live: BTreeSet<NodeId>,
    /// Until when the first epoch waits for more than two thirds of the committee to run.
    first_gate: Option<Instant>,
    /// When this node last said it runs, and how many times.
    present: (Option<Instant>, u64),
    /// Training rounds the finalized epochs settled, in order, for the live ledger to pay
    /// (`take_settled`); the oldest go beyond [`MAX_SETTLED`].
    settled: VecDeque<neuroshard_ledger::RoundSettlement>,
}

/// Settlements held for the live ledger at most: a node drains them after every message, so
/// only a start-up that replays a long history reaches this (its live ledger paid those
/// before it stopped).
pub const MAX_SETTLED: usize = 65_536;

/// The committee `state`'s stakes seat.
pub fn committee_of(state: &LedgerState, max_members: usize) -> Committee {
    committee_from_stakes(&state.staked_keys(), max_members)
}

impl LedgerFinality {
    /// Finality from the genesis state; the first epoch starts one `epoch` after `now`.
    pub fn new(
        cfg: FinalityConfig,
        identity: Identity,
        genesis: LedgerState,
        now: Instant,
    ) -> Self {
        let head = ChainHead {
            epoch: 0,
            state: genesis.state_hash(),
            committee: committee_of(&genesis, cfg.max_members),
        };
        Self {
            me: identity.node_id(),
            machine: Finality::new(identity, cfg.timeouts),
            verifier: ProofVerifier::new(),
            genesis: genesis.clone(),
            finalized: genesis,
            wal: Vec::new(),
            head,
            next_start: Some(now + cfg.epoch),
            started_at: None,
            pending: BTreeMap::new(),
            full_warned: false,
            bodies: BTreeMap::new(),
            judging: Vec::new(),
            decided: None,
            links: VecDeque::new(),
            settled: VecDeque::new(),
            out: VecDeque::new(),
            last_body_ask: None,
            last_chain_ask: None,
            early: VecDeque::new(),
            live: BTreeSet::new(),
            first_gate: Some(now + cfg.epoch + start::FIRST_EPOCH_WAIT),
            present: (None, 0),
            cfg,
        }
    }

    /// Replays finalized epochs the database kept (checked like a peer's), then, if the log
    /// holds entries of the epoch after them, restarts it from its write-ahead log so that
    /// nothing signed before is signed differently.
    pub fn restore(
        &mut self,
        links: &[ChainLink],
        wal: &[(u64, Vec<u8>)],
        admit: &dyn Fn(&LedgerState, &EpochItem) -> Admit,
        now: Instant,
    ) -> Result<(), ChainRefused> {
        self.apply_links(links)?;
        if self.head.epoch > 0 {
            // The network ran before: its committee does not wait for a start together.
            self.first_gate = None;
        }
        let next = self.head.epoch.saturating_add(1);
        let log: Vec<Vec<u8>> = wal
            .iter()
            .filter(|(e, _)| *e == next)
            .map(|(_, b)| b.clone())
            .collect();
        if !log.is_empty() {
            match self
                .machine
                .restore(next, self.head.committee.clone(), &log, now)
            {
                Ok(()) => {
                    self.next_start = None;
                    self.first_gate = None;
                    self.started_at = Some((next, now));
                    self.prepare_value(admit, now);
                }
                Err(e) => self.warn(format!("restoring epoch {next}: {e}")),
            }
            self.drain(now);
        }
        Ok(())
    }

    /// What the database holds of finality, as a restart reads it (for the simulator's disk:
    /// the epochs this node keeps in memory, at most [`KEPT_LINKS`]).
    pub fn record(&self) -> crate::economy::FinalityStart {
        crate::economy::FinalityStart {
            genesis: self.genesis.clone(),
            epochs: self.links.iter().map(|l| l.to_canonical_bytes()).collect(),
            wal: self.wal.clone(),
        }
    }

    /// The last finalized epoch, its state, and the committee of the next.
    pub fn head(&self) -> &ChainHead {
        &self.head
    }

    /// The beacon of finalized epoch `epoch`: the id of the value its committee certified
    /// (which names its contents, state and next committee). None until the epoch is final
    /// here, or once it is older than the epochs kept in memory.
    pub fn beacon(&self, epoch: u64) -> Option<Hash32> {
        let first = self.links.front()?.certified.value.epoch;
        let at = usize::try_from(epoch.checked_sub(first)?).ok()?;
        let link = self.links.get(at)?;
        (link.certified.value.epoch == epoch).then(|| link.certified.value.id_hash())
    }

    /// The network whose epochs these are.
    pub fn network(&self) -> Hash32 {
        self.cfg.network
    }

    pub fn finalized_state(&self) -> &LedgerState {
        &self.finalized
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    pub fn poll_out(&mut self) -> Option<FinalityOut> {
        self.out.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.next_start,
            self.machine.poll_timeout(),
            self.stall_check_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// An item the live ledger applied: it waits for an epoch, unless one holds it already.
    pub fn add_item(&mut self, item: EpochItem, wire: ItemWire) {
        if is_final_in(&self.finalized, &item) || self.pending.contains_key(&item.id()) {
            return;
        }
        if self.pending.len() >= MAX_PENDING {
            if !self.full_warned {
                self.full_warned = true;
                self.warn(format!(
                    "{MAX_PENDING} items wait for finality (halted?): newer ones are not taken"
                ));
            }
            return;
        }
        self.pending.insert(
            item.id(),
            Waiting {
                item,
                wire,
                refused: 0,
            },
        );
    }

    /// Timers: the next epoch's start, Malachite's timeouts.
    pub fn handle_timeout(
        &mut self,
        admit: &dyn Fn(&LedgerState, &EpochItem) -> Admit,
        now: Instant,
    ) {
        if self.next_start.is_some_and(|t| now >= t) {
            self.start_epoch(admit, now);
        }
        if self.stall_check_at().is_some_and(|t| now >= t) {
            self.ask_chain(None, now);
        }
        self.machine.handle_timeout(now);
        self.drain(now);
        self.judge_waiting(admit, now);
    }

    /// When a running epoch counts as stalled (four epoch lengths, at least a minute, without
    /// finalizing here: the committee may have moved on without us), or when the next ask
    /// for the missing epochs is allowed.
    fn stall_check_at(&self) -> Option<Instant> {
        let (_, since) = self.started_at?;
        if self.next_start.is_some() {
            return None;
        }
        let stalled = since + (self.cfg.epoch * 4).max(Duration::from_secs(60));
        Some(match self.last_chain_ask {
            Some(t) => stalled.max(t + ASK_EVERY),
            None => stalled,
        })
    }

    fn start_epoch(&mut self, admit: &dyn Fn(&LedgerState, &EpochItem) -> Admit, now: Instant) {
        let epoch = self.head.epoch.saturating_add(1);
        if self.first_epoch_waits(epoch, now) {
            return;
        }
        if self.machine.epoch().is_some_and(|e| e >= epoch) {
            self.next_start = None;
            return;
        }
        if let Err(e) = self
            .machine
            .start_epoch(epoch, self.head.committee.clone(), now)
        {
            self.warn(format!("starting epoch {epoch}: {e}"));
            self.next_start = Some(now + self.cfg.epoch);
            return;
        }
        self.next_start = None;
        self.started_at = Some((epoch, now));
        for (from, bytes) in std::mem::take(&mut self.early) {
            self.machine.handle_message(from, &bytes, now);
        }
        self.prepare_value(admit, now);
        self.drain(now);
    }

    /// Chooses this node's body for the next epoch: pending items, ops first and oldest
    /// first within a kind, within the body's limits, without those the rules refuse.
    fn prepare_value(&mut self, admit: &dyn Fn(&LedgerState, &EpochItem) -> Admit, now: Instant) {
        let epoch = self.head.epoch.saturating_add(1);
        if self.head.committee.get(&self.me).is_none() {
            return;
        }
        let finalized = &self.finalized;
        self.pending.retain(|_, w| !is_final_in(finalized, &w.item));
        let mut order: Vec<&Waiting> = self.pending.values().collect();
        order.sort_by_key(|w| (kind_rank(&w.item), w.item.timestamp_ms(), w.item.id()));
        let mut chosen: Vec<(EpochItem, ItemWire)> = Vec::new();
        let mut bytes = 0usize;
        for w in order {
            if chosen.len() >= MAX_BODY_ITEMS {
                break;
            }
            let size = w.wire.size().saturating_add(16);
            if bytes.saturating_add(size) > MAX_BODY_BYTES {
                continue;
            }
            if admit(&self.finalized, &w.item) == Admit::NotYet {
                continue;
            }
            bytes += size;
            chosen.push((w.item.clone(), w.wire.clone()));
        }
        // Drop what the rules refuse (each pass drops at least one, so this ends).
        loop {
            let mut state = self.finalized.clone();
            let items: Vec<EpochItem> = chosen.iter().map(|(i, _)| i.clone()).collect();
            let out = apply_epoch_admitted(&mut state, items, as_rule(admit));
            if out.refused.is_empty() {
                let value = EpochValue {
                    epoch,
                    contents: out.contents,
                    state: out.state,
                    next_committee: committee_of(&state, self.cfg.max_members).hash(),
                };
                let body = EpochBody {
                    epoch,
                    items: chosen.iter().map(|(_, w)| w.clone()).collect(),
                };
                let items = chosen.into_iter().map(|(i, _)| i).collect();
                self.keep_body(value.contents, Known { body, items });
                self.machine.set_value(value, now);
                return;
            }
            for (id, _) in &out.refused {
                if let Some(w) = self.pending.get_mut(id) {
                    w.refused = w.refused.saturating_add(1);
                }
            }
            let refused: Vec<Hash32> = out.refused.iter().map(|(id, _)| *id).collect();
            chosen.retain(|(i, _)| !refused.contains(&i.id()));
            self.pending.retain(|_, w| w.refused < REFUSALS_KEPT);
        }
    }

    /// Bytes from the finality topic.
    pub fn handle_gossip(&mut self, from: NodeId, data: &[u8], now: Instant) {
        self.heard_from(from);
        match FinalityGossip::from_canonical_bytes(data) {
            Ok(FinalityGossip::Present { .. }) => {}
            Ok(FinalityGossip::Consensus(bytes)) => {
                if let Ok(msg) = ConsensusWire::from_canonical_bytes(&bytes)
                    && msg.epoch() > self.head.epoch.saturating_add(1)
                    && self.machine.epoch().is_none_or(|e| msg.epoch() > e)
                    && msg.signed_by_member(&self.head.committee)
                {
                    // A member's vote of an epoch after the one we run: the committee decided
                    // one we missed. (Anyone can claim a later epoch; only a signature of a
                    // member we know makes us ask, so no stranger steers our asks to itself.)
                    self.ask_chain(Some(from), now);
                }
                if self.machine.epoch().is_none() {
                    if self.early.len() >= MAX_EARLY {
                        self.early.pop_front();
                    }
                    self.early.push_back((from, bytes));
                } else {
                    self.machine.handle_message(from, &bytes, now);
                }
            }
            // Bodies travel from their proposer: a committee member (checking one costs a
            // signature per item, so nobody else makes every node check theirs).
            Ok(FinalityGossip::Body(body)) if self.head.committee.get(&from).is_some() => {
                self.on_body(from, body, now)
            }
            Ok(FinalityGossip::Body(_)) => self.out.push_back(FinalityOut::Penalize {
                peer: from,
                reason: "an epoch body from outside the committee".into(),
            }),
            Ok(FinalityGossip::Evidence { first, second }) => {
                if let Err(reason) = self.take_evidence(first, second) {
                    self.out.push_back(FinalityOut::Penalize {
                        peer: from,
                        reason: format!("double-sign evidence: {reason}"),
                    });
                }
            }
            Err(e) => self.out.push_back(FinalityOut::Penalize {
                peer: from,
                reason: format!("finality gossip: {e}"),
            }),
        }
        self.drain(now);
    }

    /// A body a peer gossiped or served. Kept (for an epoch not finalized yet) if every item
    /// verifies; its sender is penalised if one does not.
    pub fn on_body(&mut self, from: NodeId, body: EpochBody, now: Instant) {
        let next = self.head.epoch.saturating_add(1);
        if body.epoch < next || body.epoch > next.saturating_add(1) {
            return;
        }
        let finalized = &self.finalized;
        let items = match body.verify(&mut self.verifier, &|n| finalized.key(n)) {
            Ok(items) => items,
            Err(e) => {
                return self.out.push_back(FinalityOut::Penalize {
                    peer: from,
                    reason: format!("epoch body: {e}"),
                });
            }
        };
        let contents = neuroshard_ledger::epoch_contents(&items);
        if self.bodies.contains_key(&contents) {
            return;
        }
        self.keep_body(contents, Known { body, items });
        if let Some(f) = self.decided.take() {
            self.on_finalized(f, now);
        }
    }

    /// Double signing this node's machine saw: it waits for an epoch (this node's reward if
    /// its body holds it), and goes to every node, which adds it to theirs.
    pub fn report_equivocation(&mut self, e: &Equivocation) {
        let (first, second) = (e.first.to_canonical_bytes(), e.second.to_canonical_bytes());
        match self.take_evidence(first.clone(), second.clone()) {
            Ok(()) => {
                let msg = FinalityGossip::Evidence { first, second };
                self.out
                    .push_back(FinalityOut::Publish(msg.to_canonical_bytes()));
            }
            Err(why) => self.warn(format!("double-sign evidence of {}: {why}", e.validator)),
        }
    }

    /// Checks evidence and keeps its slash (with this node as reporter) for an epoch.
    fn take_evidence(&mut self, first: Vec<u8>, second: Vec<u8>) -> Result<(), String> {
        let finalized = &self.finalized;
        let slash = equivocation_slash(self.me, &first, &second, &|n| finalized.key(n))?;
        let wire = ItemWire::Equivocation {
            reporter: self.me,
            first,
            second,
        };
        self.add_item(EpochItem::Slash(slash), wire);
        Ok(())
    }

    fn keep_body(&mut self, contents: Hash32, known: Known) {
        if self.bodies.len() >= MAX_BODIES
            && let Some(oldest) = self
                .bodies
                .iter()
                .min_by_key(|(_, k)| k.body.epoch)
                .map(|(c, _)| *c)
        {
            self.bodies.remove(&oldest);
        }
        self.bodies.insert(contents, known);
    }

    /// Judges the values waiting for a verdict whose bodies are here; asks for the others.
    pub fn judge_waiting(
        &mut self,
        admit: &dyn Fn(&LedgerState, &EpochItem) -> Admit,
        now: Instant,
    ) {
        let next = self.head.epoch.saturating_add(1);
        let waiting = std::mem::take(&mut self.judging);
        for value in waiting {
            if value.epoch < next {
                continue;
            }
            let Some(known) = self.bodies.get(&value.contents) else {
                if value.epoch == next {
                    self.ask_body(value.contents, now);
                }
                self.judging.push(value);
                continue;
            };
            if value.epoch != next {
                self.judging.push(value);
                continue;
            }
            if known
                .items
                .iter()
                .any(|i| admit(&self.finalized, i) == Admit::NotYet)
            {
                self.judging.push(value);
                continue;
            }
            let ok = self.check_value(&value, &known.items, admit);
            self.machine.judge(value, ok, now);
        }
        self.drain(now);
    }

    /// Whether `value` is what applying `items` onto the finalized state gives, with every
    /// item admitted and none refused.
    fn check_value(
        &self,
        value: &EpochValue,
        items: &[EpochItem],
        admit: &dyn Fn(&LedgerState, &EpochItem) -> Admit,
    ) -> bool {
        let mut state = self.finalized.clone();
        let out = apply_epoch_admitted(&mut state, items.to_vec(), as_rule(admit));
        out.refused.is_empty()
            && out.contents == value.contents
            && out.state == value.state
            && committee_of(&state, self.cfg.max_members).hash() == value.next_committee
    }

    fn ask_body(&mut self, contents: Hash32, now: Instant) {
        if self.last_body_ask.is_some_and(|t| now < t + ASK_EVERY) {
            return;
        }
        self.last_body_ask = Some(now);
        self.out.push_back(FinalityOut::Ask {
            to: None,
            request: FinalityRequest::Body {
                network: self.cfg.network,
                contents,
            },
        });
    }

    fn ask_chain(&mut self, to: Option<NodeId>, now: Instant) {
        if self.last_chain_ask.is_some_and(|t| now < t + ASK_EVERY) {
            return;
        }
        self.last_chain_ask = Some(now);
        self.out.push_back(FinalityOut::Ask {
            to,
            request: FinalityRequest::Chain {
                network: self.cfg.network,
                from: self.head.epoch.saturating_add(1),
                max: MAX_CHAIN_LINKS as u32,
            },
        });
    }

    /// Drains the machine: events first, so a proposal's body goes out before the proposal.
    fn drain(&mut self, now: Instant) {
        while let Some(ev) = self.machine.poll_event() {
            match ev {
                FinalityEvent::Finalized(f) => self.on_finalized(f, now),
                FinalityEvent::Judge { value } => {
                    if self.judging.len() < MAX_JUDGING && !self.judging.contains(&value) {
                        self.judging.push(value);
                    }
                }
                FinalityEvent::Proposing { value } => {
                    if let Some(known) = self.bodies.get(&value.contents) {
                        let msg = FinalityGossip::Body(known.body.clone());
                        self.out
                            .push_back(FinalityOut::Publish(msg.to_canonical_bytes()));
                    }
                }
                FinalityEvent::Equivocation(e) => self.out.push_back(FinalityOut::Equivocation(e)),
                FinalityEvent::Refused { from, reason } => self
                    .out
                    .push_back(FinalityOut::Penalize { peer: from, reason }),
                FinalityEvent::Diverged { finalized } => self.warn(format!(
                    "the committee finalized epoch {} with a value this node judged invalid",
                    finalized.epoch
                )),
                FinalityEvent::Error(e) => self.warn(format!("consensus: {e}")),
            }
        }
        while let Some(entry) = self.machine.poll_wal() {
            self.wal.push((entry.epoch, entry.bytes.clone()));
            self.out.push_back(FinalityOut::Wal {
                epoch: entry.epoch,
                entry: entry.bytes,
            });
        }
        while let Some(bytes) = self.machine.poll_transmit() {
            let msg = FinalityGossip::Consensus(bytes);
            self.out
                .push_back(FinalityOut::Publish(msg.to_canonical_bytes()));
        }
    }

    /// The committee finalized `f`: applied onto the finalized state once its body is here.
    fn on_finalized(&mut self, f: Finalized, now: Instant) {
        if f.epoch != self.head.epoch.saturating_add(1) {
            return;
        }
        let Some(known) = self.bodies.get(&f.value.contents).cloned() else {
            self.ask_body(f.value.contents, now);
            self.decided = Some(f);
            return;
        };
        let certified = CertifiedEpoch {
            value: f.value,
            certificate: f.certificate,
            next_committee: Committee::new(Vec::new()),
        };
        let link = ChainLink {
            certified,
            body: known.body,
        };
        match self.advance(link, known.items) {
            Ok((link, applied)) => {
                let latency = self
                    .started_at
                    .filter(|(e, _)| *e == f.epoch)
                    .map(|(_, t)| now.saturating_duration_since(t));
                self.out.push_back(FinalityOut::Finalized {
                    link,
                    applied,
                    latency,
                });
                self.next_start = Some(now + self.cfg.epoch);
            }
            Err(e) => self.warn(format!("finalized epoch {}: {e}", f.epoch)),
        }
    }

    /// Applies a finalized epoch's items onto the finalized state, checking the state and the
    /// next committee its value names; fills the link's committee.
    fn advance(
        &mut self,
        mut link: ChainLink,
        items: Vec<EpochItem>,
    ) -> Result<(Arc<ChainLink>, usize), ChainRefused> {
        let value = link.certified.value;
        let mut state = self.finalized.clone();
        let out = apply_epoch(&mut state, items);
        if out.contents != value.contents {
            return Err(ChainRefused::Contents { epoch: value.epoch });
        }
        let committee = committee_of(&state, self.cfg.max_members);
        if out.state != value.state || committee.hash() != value.next_committee {
            return Err(ChainRefused::State { epoch: value.epoch });
        }
        link.certified.next_committee = committee.clone();
        self.finalized = state;
        self.settled.extend(out.settled);
        while self.settled.len() > MAX_SETTLED {
            self.settled.pop_front();
        }
        self.head = ChainHead {
            epoch: value.epoch,
            state: value.state,
            committee,
        };
        let finalized = &self.finalized;
        self.pending.retain(|_, w| !is_final_in(finalized, &w.item));
        let head = self.head.epoch;
        self.wal.retain(|(e, _)| *e > head);
        self.bodies.retain(|_, k| k.body.epoch > head);
        self.judging.retain(|v| v.epoch > head);
        self.full_warned = false;
        let link = Arc::new(link);
        if self.links.len() >= KEPT_LINKS {
            self.links.pop_front();
        }
        self.links.push_back(link.clone());
        Ok((link, out.applied))
    }

    /// The training rounds finalized epochs settled since the last call, in order.
    pub fn take_settled(&mut self) -> Vec<neuroshard_ledger::RoundSettlement> {
        self.settled.drain(..).collect()
    }

    fn warn(&mut self, message: String) {
        self.out.push_back(FinalityOut::Warning(message));
    }
}

fn is_final_in(state: &LedgerState, item: &EpochItem) -> bool {
    match item {
        EpochItem::Proof(p) => state.has_proof(&p.hash()),
        EpochItem::Op(o) => state.account(&o.op().account).next_nonce > o.op().nonce,
        EpochItem::Verdict(v) => state.has_verdict(&v.job),
        EpochItem::AuditFee(f) => state.has_audit_fee(f),
        EpochItem::Slash(s) => state.has_slash(&s.offender, s.nonce),
    }
}

/// `admit` as the ledger's admission rule (an item this node cannot judge yet is refused).
fn as_rule(
    admit: &dyn Fn(&LedgerState, &EpochItem) -> Admit,
) -> impl FnMut(&LedgerState, &EpochItem) -> Result<(), String> + '_ {
    move |s, i| match admit(s, i) {
        Admit::Yes => Ok(()),
        Admit::No(reason) => Err(reason),
        Admit::NotYet => Err("not settled here".into()),
    }
}

fn kind_rank(item: &EpochItem) -> u8 {
    match item {
        EpochItem::Op(_) => 0,
        EpochItem::Proof(_) => 1,
        EpochItem::Slash(_) => 2,
        EpochItem::Verdict(_) => 3,
        EpochItem::AuditFee(_) => 4,
    }
}
