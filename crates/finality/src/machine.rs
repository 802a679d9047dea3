//! One validator's (or observer's) finality, sans-IO: Malachite's Tendermint core driven by
//! messages, a clock reading and the node's own view of each epoch's value, returning
//! messages to broadcast, the next deadline and finalized epochs.
//!
//! The caller owns every input: `start_epoch` with the committee (from the stake of the
//! previous finalized epoch), `set_value` with the value this node would propose (the hash of
//! the epoch's contents it holds and the state they lead to), `judge` with its verdict on a
//! value others proposed (asked for by a `Judge` event), `handle_message` for what peers sent
//! and `handle_timeout` when `poll_timeout` is due. Nothing here reads a clock, draws
//! randomness or touches a socket or a file. A proposal gets this node's vote only once the
//! caller judged its value valid; until then it waits (and the round's timeout moves
//! consensus on).

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use malachite::{
    Effect, Input, LivenessMsg, LocallyProposedValue, Params, ProposedValue, Resumable, Resume,
    SignedConsensusMsg, State, ValuePayload, process,
};
use malachite_types::{
    CommitCertificate, SignedMessage, ThresholdParams, Timeout, TimeoutKind, Validity, ValueOrigin,
    VoteExtensionPolicy,
};
use neuroshard_proof::{Canonical, Identity, NodeId};

use crate::context::{Address, Committee, Epoch, EpochValue, FinalityContext, Sig};
use crate::wal::{WalEntry, decode_entry, encode_entry};
use crate::wire::{ConsensusWire, verify_commit, verify_polka, verify_round, verify_signed};

/// Largest consensus message accepted (a certificate of a full committee is ~100 kB).
pub const MAX_MESSAGE_BYTES: usize = 128 * 1024;
/// Future epochs Malachite buffers inputs for, and inputs per epoch (a committee of 31 sends
/// 62 votes a round).
const QUEUE: usize = 8;
const QUEUE_PER_HEIGHT: usize = 256;
/// Proposals are considered for the epoch in progress and the next one only: a proposal for
/// a later epoch is dropped (its proposer re-sends it), so nobody can make a node hold views
/// of, or ask its caller to judge values of, epochs far ahead.
const EPOCHS_AHEAD: u64 = 1;

/// How long each step of a round waits: Malachite's linear timeouts (3 s to propose, 1 s
/// to prevote and precommit, each 0.5 s longer per round, at most 60 s).
pub type Timeouts = malachite_types::LinearTimeouts;

/// An epoch the committee finalized: its value, and the commit certificate (more than 2/3 of
/// the committee's power signed it) that lets anyone check it without trusting a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalized {
    pub epoch: u64,
    pub value: EpochValue,
    pub certificate: CommitCertificate<FinalityContext>,
}

/// Two votes of one validator for one (epoch, round, step) with different values: signed
/// evidence anyone can check, for the ledger to slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Equivocation {
    pub validator: NodeId,
    pub epoch: u64,
    pub first: ConsensusWire,
    pub second: ConsensusWire,
}

/// What the caller learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalityEvent {
    Finalized(Finalized),
    /// A proposal names a value this node has no verdict on: answer with
    /// [`Finality::judge`] (until then it does not vote for it).
    Judge {
        value: EpochValue,
    },
    /// This node proposes `value` (its own): whoever judges it needs the contents it names,
    /// so the caller sends them beside the proposal.
    Proposing {
        value: EpochValue,
    },
    Equivocation(Box<Equivocation>),
    /// A message that does not decode or is too large (its sender can be penalised).
    Refused {
        from: NodeId,
        reason: String,
    },
    /// The committee finalized a value this node judged invalid: its own ledger diverged
    /// from the network's and must resync from the finalized state.
    Diverged {
        finalized: EpochValue,
    },
    /// Malachite reported an error handling an input (nothing was applied from it).
    Error(String),
}

#[derive(Debug, thiserror::Error)]
pub enum FinalityError {
    #[error("epoch {0} has an empty committee")]
    EmptyCommittee(u64),
    #[error("epoch {got} cannot start: epoch {current} is in progress")]
    NotNext { got: u64, current: u64 },
    #[error("write-ahead log: {0}")]
    Wal(String),
}

/// The caller's side of one epoch: the value it would propose, its verdicts on others'
/// values, and proposals waiting for a verdict.
#[derive(Debug, Default)]
struct EpochView {
    value: Option<EpochValue>,
    verdicts: Vec<(EpochValue, bool)>,
    waiting: Vec<ProposedValue<FinalityContext>>,
    /// The round Malachite asked us to propose in, while we had no value.
    want: Option<malachite_types::Round>,
    /// Values proposed for the epoch (bounded): what a decision names by id.
    proposed: Vec<EpochValue>,
}

impl EpochView {
    /// Our verdict on `value`, if we have one: our own value is valid.
    fn verdict(&self, value: &EpochValue) -> Option<bool> {
        if self.value.as_ref() == Some(value) {
            return Some(true);
        }
        self.verdicts
            .iter()
            .find(|(v, _)| v == value)
            .map(|(_, ok)| *ok)
    }
}

/// Everything the effect handler touches besides Malachite's state.
struct Io<'a> {
    identity: &'a Identity,
    now: Instant,
    timeouts: Timeouts,
    timers: &'a mut Vec<(Timeout, Instant)>,
    transmits: &'a mut VecDeque<Vec<u8>>,
    events: &'a mut VecDeque<FinalityEvent>,
    queue: &'a mut VecDeque<Input<FinalityContext>>,
    wal: &'a mut VecDeque<WalEntry>,
    epochs: &'a mut BTreeMap<u64, EpochView>,
    finalized: &'a mut bool,
}

/// One node's finality state machine.
pub struct Finality {
    identity: Identity,
    timeouts: Timeouts,
    state: Option<State<FinalityContext>>,
    timers: Vec<(Timeout, Instant)>,
    transmits: VecDeque<Vec<u8>>,
    events: VecDeque<FinalityEvent>,
    queue: VecDeque<Input<FinalityContext>>,
    epochs: BTreeMap<u64, EpochView>,
    now: Option<Instant>,
    wal: VecDeque<WalEntry>,
    /// The current epoch finalized here: Malachite still re-broadcasts our votes of it every
    /// few seconds until the next epoch starts, which helps no one (a lagging validator
    /// catches up from certificates), so those timers are dropped.
    finalized: bool,
}

impl Finality {
    pub fn new(identity: Identity, timeouts: Timeouts) -> Self {
        Self {
            identity,
            timeouts,
            state: None,
            timers: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            queue: VecDeque::new(),
            epochs: BTreeMap::new(),
            now: None,
            wal: VecDeque::new(),
            finalized: false,
        }
    }

    /// Restarts a validator mid-epoch from its write-ahead log (the entries `poll_wal` gave
    /// for `epoch`, in order): Malachite re-derives what it signed before and reuses the
    /// recorded messages, so the restart signs nothing that conflicts with them.
    pub fn restore(
        &mut self,
        epoch: u64,
        committee: Committee,
        log: &[Vec<u8>],
        now: Instant,
    ) -> Result<(), FinalityError> {
        let entries = log
            .iter()
            .map(|b| decode_entry(b))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| FinalityError::Wal(e.to_string()))?;
        self.start_epoch(epoch, committee, now)?;
        // The values proposed and judged before the restart, as the log recorded them: a
        // decision may name one of them.
        let view = self.epochs.entry(epoch).or_default();
        for input in &entries {
            if let Input::ProposedValue(p, _) = input {
                if !view.proposed.contains(&p.value) {
                    view.proposed.push(p.value);
                }
                if view.verdict(&p.value).is_none() {
                    view.verdicts.push((p.value, p.validity.is_valid()));
                }
            }
        }
        if let Some(state) = self.state.as_mut() {
            state.index_wal_entries(&entries);
        }
        for input in entries {
            self.run(input);
        }
        if let Some(state) = self.state.as_mut() {
            state.reset_entries_index();
        }
        // What replaying the log recorded is recorded already.
        self.wal.clear();
        Ok(())
    }

    /// The next write-ahead log entry to keep durably, before sending what `poll_transmit`
    /// gives after it (entries of an epoch can be dropped once it finalized).
    pub fn poll_wal(&mut self) -> Option<WalEntry> {
        self.wal.pop_front()
    }

    /// The epoch in progress (None before the first start).
    pub fn epoch(&self) -> Option<u64> {
        self.state.as_ref().map(|s| s.height().0)
    }

    /// Starts `epoch` with its committee. Epochs start in order, each after the previous one
    /// finalized here (or, for the first, at any number).
    pub fn start_epoch(
        &mut self,
        epoch: u64,
        committee: Committee,
        now: Instant,
    ) -> Result<(), FinalityError> {
        if committee.validators().is_empty() {
            return Err(FinalityError::EmptyCommittee(epoch));
        }
        if let Some(current) = self.epoch()
            && epoch <= current
        {
            return Err(FinalityError::NotNext {
                got: epoch,
                current,
            });
        }
        self.now = Some(now);
        let address = Address(self.identity.node_id());
        if self.state.is_none() {
            let params = Params {
                address,
                threshold_params: ThresholdParams::default(),
                // The value travels inside the proposal; parts mode keeps Malachite from
                // taking every proposed value as valid, so the caller judges it (`judge`).
                value_payload: ValuePayload::ProposalAndParts,
                enabled: true,
            };
            self.state = Some(State::new(
                FinalityContext,
                Epoch(epoch),
                committee.clone(),
                params,
                QUEUE,
                QUEUE_PER_HEIGHT,
            ));
        }
        self.epochs.retain(|e, _| *e >= epoch);
        self.timers.clear();
        self.finalized = false;
        // No target time: Malachite would measure it with its own clock.
        let input = Input::StartHeight(
            Epoch(epoch),
            committee,
            false,
            None,
            VoteExtensionPolicy::Disabled,
        );
        self.run(input);
        Ok(())
    }

    /// The value this node would propose for its epoch (the contents it holds and the state
    /// they lead to). A proposal of exactly this value is valid without asking.
    pub fn set_value(&mut self, value: EpochValue, now: Instant) {
        self.now = Some(now);
        let view = self.epochs.entry(value.epoch).or_default();
        view.value = Some(value);
        if let Some(round) = view.want.take() {
            self.events.push_back(FinalityEvent::Proposing { value });
            self.queue
                .push_back(Input::Propose(LocallyProposedValue::new(
                    Epoch(value.epoch),
                    round,
                    value,
                )));
        }
        self.release(value.epoch);
        self.drain();
    }

    /// The caller's verdict on a value it was asked about ([`FinalityEvent::Judge`]): valid
    /// when it holds the contents named and applying them on the last finalized state gives
    /// the state named. Only valid values get this node's vote.
    pub fn judge(&mut self, value: EpochValue, valid: bool, now: Instant) {
        self.now = Some(now);
        let view = self.epochs.entry(value.epoch).or_default();
        if view.verdict(&value).is_none() && view.verdicts.len() < QUEUE_PER_HEIGHT {
            view.verdicts.push((value, valid));
        }
        self.release(value.epoch);
        self.drain();
    }

    /// Feeds Malachite every waiting proposal of `epoch` that now has a verdict.
    fn release(&mut self, epoch: u64) {
        let Some(view) = self.epochs.get_mut(&epoch) else {
            return;
        };
        let waiting = std::mem::take(&mut view.waiting);
        for mut proposed in waiting {
            match view.verdict(&proposed.value) {
                Some(ok) => {
                    proposed.validity = Validity::from_bool(ok);
                    self.queue
                        .push_back(Input::ProposedValue(proposed, ValueOrigin::Consensus));
                }
                None => view.waiting.push(proposed),
            }
        }
    }

    /// A consensus message from a peer (its signature, not `from`, says who wrote it: gossip
    /// relays).
    pub fn handle_message(&mut self, from: NodeId, bytes: &[u8], now: Instant) {
        self.now = Some(now);
        if bytes.len() > MAX_MESSAGE_BYTES {
            let reason = format!("a consensus message of {} bytes", bytes.len());
            self.events
                .push_back(FinalityEvent::Refused { from, reason });
            return;
        }
        let msg = match ConsensusWire::from_canonical_bytes(bytes) {
            Ok(m) => m,
            Err(e) => {
                let reason = e.to_string();
                self.events
                    .push_back(FinalityEvent::Refused { from, reason });
                return;
            }
        };
        let input = match msg {
            ConsensusWire::Vote(v) => Input::Vote(v),
            ConsensusWire::Proposal(p) => {
                let epoch = p.message.epoch.0;
                let Some(current) = self.epoch() else { return };
                if epoch < current || epoch > current.saturating_add(EPOCHS_AHEAD) {
                    return;
                }
                // Checked here, before the caller is asked to judge anything: only a member
                // of the committee (the current one: the next may differ, but rarely by
                // much) gets a value considered.
                let signed = self
                    .state
                    .as_ref()
                    .and_then(|s| s.validator_set().get(&p.message.proposer.0))
                    .is_some_and(|v| verify_signed(&p.message, &p.signature, &v.public_key));
                if !signed {
                    // For the next epoch the committee may have changed: an unknown proposer
                    // there is dropped, not blamed (it proposes again in a later round).
                    if epoch == current {
                        let reason = format!(
                            "a proposal for epoch {epoch} not signed by a committee member"
                        );
                        self.events
                            .push_back(FinalityEvent::Refused { from, reason });
                    }
                    return;
                }
                let proposed = ProposedValue {
                    height: p.message.epoch,
                    round: p.message.round,
                    valid_round: p.message.pol_round,
                    proposer: p.message.proposer,
                    value: p.message.value,
                    validity: Validity::Invalid,
                };
                self.queue.push_back(Input::Proposal(p));
                self.consider(proposed);
                return self.drain();
            }
            ConsensusWire::Polka(c) => Input::PolkaCertificate(c),
            ConsensusWire::Round(c) => Input::RoundCertificate(c),
        };
        self.run(input);
    }

    /// Feeds a proposed value to Malachite with our verdict, or keeps it and asks the caller
    /// for one (once per value).
    fn consider(&mut self, proposed: ProposedValue<FinalityContext>) {
        let epoch = proposed.height.0;
        if self.epoch().is_some_and(|e| epoch < e) {
            return;
        }
        let view = self.epochs.entry(epoch).or_default();
        let new = !view.proposed.contains(&proposed.value);
        if new && view.proposed.len() < QUEUE_PER_HEIGHT {
            view.proposed.push(proposed.value);
        }
        match view.verdict(&proposed.value) {
            Some(ok) => {
                let mut proposed = proposed;
                proposed.validity = Validity::from_bool(ok);
                self.queue
                    .push_back(Input::ProposedValue(proposed, ValueOrigin::Consensus));
            }
            None if view.waiting.len() < QUEUE_PER_HEIGHT => {
                if new {
                    self.events.push_back(FinalityEvent::Judge {
                        value: proposed.value,
                    });
                }
                view.waiting.push(proposed);
            }
            None => {}
        }
    }

    /// Fires every timeout due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = Some(now);
        let mut due: Vec<(Timeout, Instant)> = Vec::new();
        self.timers.retain(|(t, at)| {
            if *at <= now {
                due.push((*t, *at));
                false
            } else {
                true
            }
        });
        due.sort_by_key(|(_, at)| *at);
        for (t, _) in due {
            self.queue.push_back(Input::TimeoutElapsed(t));
        }
        self.drain();
    }

    /// The earliest pending deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.iter().map(|(_, at)| *at).min()
    }

    /// The next message to broadcast to the committee (and observers).
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmits.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<FinalityEvent> {
        self.events.pop_front()
    }

    fn run(&mut self, input: Input<FinalityContext>) {
        self.queue.push_back(input);
        self.drain();
    }

    /// Processes queued inputs one at a time (handling an effect can queue more: a proposal
    /// once we have a value, a proposed value once its proposal is filed).
    fn drain(&mut self) {
        let Some(now) = self.now else { return };
        while let Some(input) = self.queue.pop_front() {
            let Some(mut state) = self.state.take() else {
                self.queue.clear();
                return;
            };
            let mut io = Io {
                identity: &self.identity,
                now,
                timeouts: self.timeouts,
                timers: &mut self.timers,
                transmits: &mut self.transmits,
                events: &mut self.events,
                queue: &mut self.queue,
                wal: &mut self.wal,
                epochs: &mut self.epochs,
                finalized: &mut self.finalized,
            };
            let result: Result<(), malachite::Error<FinalityContext>> = process!(
                input: input,
                state: &mut state,
                metrics: &(),
                with: effect => io.handle(effect)
            );
            self.state = Some(state);
            if let Err(e) = result {
                self.events.push_back(FinalityEvent::Error(e.to_string()));
            }
        }
    }
}

/// Effects Malachite cannot be resumed from (never produced in this configuration).
#[derive(Debug, thiserror::Error)]
#[error("unexpected consensus effect: {0}")]
struct Unexpected(&'static str);

impl Io<'_> {
    fn broadcast(&mut self, msg: ConsensusWire) {
        self.transmits.push_back(msg.to_canonical_bytes());
    }

    fn schedule(&mut self, t: Timeout) {
        if *self.finalized && t.kind == TimeoutKind::Rebroadcast {
            return;
        }
        // A timeout of the nil round never comes from Malachite; were it asked for, it gets
        // round 0's duration rather than the panic `duration_for` has for it.
        let at = match t.round {
            malachite_types::Round::Nil => Timeout::new(malachite_types::Round::new(0), t.kind),
            _ => t,
        };
        let after = self.timeouts.duration_for(at);
        self.timers.retain(|(x, _)| *x != t);
        self.timers.push((t, self.now + after));
    }

    fn handle(
        &mut self,
        effect: Effect<FinalityContext>,
    ) -> Result<Resume<FinalityContext>, Unexpected> {
        Ok(match effect {
            Effect::CancelAllTimeouts(r) => {
                self.timers.clear();
                r.resume_with(())
            }
            Effect::CancelTimeout(t, r) => {
                self.timers.retain(|(x, _)| *x != t);
                r.resume_with(())
            }
            Effect::ScheduleTimeout(t, r) => {
                self.schedule(t);
                r.resume_with(())
            }
            Effect::StartRound(.., r) => r.resume_with(()),
            Effect::PublishConsensusMsg(msg, r) => {
                self.broadcast(match msg {
                    SignedConsensusMsg::Vote(v) => ConsensusWire::Vote(v),
                    SignedConsensusMsg::Proposal(p) => ConsensusWire::Proposal(p),
                });
                r.resume_with(())
            }
            Effect::PublishLivenessMsg(msg, r) => {
                self.broadcast(match msg {
                    LivenessMsg::Vote(v) => ConsensusWire::Vote(v),
                    LivenessMsg::PolkaCertificate(c) => ConsensusWire::Polka(c),
                    LivenessMsg::SkipRoundCertificate(c) => ConsensusWire::Round(c),
                });
                r.resume_with(())
            }
            Effect::RepublishVote(v, r) => {
                self.broadcast(ConsensusWire::Vote(v));
                r.resume_with(())
            }
            Effect::RepublishRoundCertificate(c, r) => {
                self.broadcast(ConsensusWire::Round(c));
                r.resume_with(())
            }
            Effect::GetValue(epoch, round, _, r) => {
                let view = self.epochs.entry(epoch.0).or_default();
                match view.value {
                    Some(value) => {
                        self.events.push_back(FinalityEvent::Proposing { value });
                        self.queue
                            .push_back(Input::Propose(LocallyProposedValue::new(
                                epoch, round, value,
                            )))
                    }
                    None => view.want = Some(round),
                }
                r.resume_with(())
            }
            // The proposal message carries the whole value: there are no parts to stream.
            Effect::RestreamProposal(.., r) => r.resume_with(()),
            // Joiners sync from certificates outside consensus (not by Malachite's sync).
            Effect::CertVerifiedSyncValue(.., r) | Effect::CertRejectedSyncValue(.., r) => {
                r.resume_with(())
            }
            Effect::Decide(.., r) => r.resume_with(()),
            Effect::Finalize(certificate, _, evidence, r) => {
                *self.finalized = true;
                self.timers
                    .retain(|(t, _)| t.kind != TimeoutKind::Rebroadcast);
                let epoch = certificate.height.0;
                let votes = evidence.votes.iter().flat_map(|(who, pairs)| {
                    pairs.iter().map(move |(a, b)| {
                        (
                            who.0,
                            ConsensusWire::Vote(a.clone()),
                            ConsensusWire::Vote(b.clone()),
                        )
                    })
                });
                let proposals = evidence.proposals.iter().flat_map(|(who, pairs)| {
                    pairs.iter().map(move |(a, b)| {
                        let (a, b) = (a.clone(), b.clone());
                        (
                            who.0,
                            ConsensusWire::Proposal(a),
                            ConsensusWire::Proposal(b),
                        )
                    })
                });
                for (validator, first, second) in votes.chain(proposals) {
                    self.events
                        .push_back(FinalityEvent::Equivocation(Box::new(Equivocation {
                            validator,
                            epoch,
                            first,
                            second,
                        })));
                }
                let view = self.epochs.get(&epoch);
                let decided = view.and_then(|v| {
                    v.value
                        .iter()
                        .chain(&v.proposed)
                        .find(|x| malachite_types::Value::id(*x) == certificate.value_id)
                        .copied()
                });
                let judged = decided.and_then(|d| view.and_then(|v| v.verdict(&d)));
                match decided {
                    Some(value) => {
                        if judged == Some(false) {
                            // More than 2/3 of the power finalized a value this node found
                            // invalid: its own ledger is the one that diverged.
                            self.events
                                .push_back(FinalityEvent::Diverged { finalized: value });
                        }
                        self.events.push_back(FinalityEvent::Finalized(Finalized {
                            epoch,
                            value,
                            certificate,
                        }));
                    }
                    None => self.events.push_back(FinalityEvent::Error(format!(
                        "epoch {epoch} finalized value {} that was never proposed here",
                        certificate.value_id
                    ))),
                }
                r.resume_with(())
            }
            Effect::SignVote(vote, r) => {
                let sig = Sig(self.identity.sign(&vote.to_canonical_bytes()).0);
                r.resume_with(SignedMessage::new(vote, sig))
            }
            Effect::SignProposal(proposal, r) => {
                let sig = Sig(self.identity.sign(&proposal.to_canonical_bytes()).0);
                r.resume_with(SignedMessage::new(proposal, sig))
            }
            Effect::VerifySignature(signed, key, r) => {
                let ok = match &signed.message {
                    malachite::ConsensusMsg::Vote(v) => verify_signed(v, &signed.signature, &key),
                    malachite::ConsensusMsg::Proposal(p) => {
                        verify_signed(p, &signed.signature, &key)
                    }
                };
                r.resume_with(ok)
            }
            Effect::VerifyCommitCertificate(c, committee, t, r) => {
                r.resume_with(verify_commit(&c, &committee, t.quorum))
            }
            Effect::VerifyExtendedCommitCertificate(c, committee, t, _, r) => r.resume_with(
                verify_commit(&c.trim_vote_extensions(), &committee, t.quorum),
            ),
            Effect::VerifyPolkaCertificate(c, committee, t, r) => {
                r.resume_with(verify_polka(&c, &committee, t.quorum))
            }
            Effect::VerifyRoundCertificate(c, committee, t, r) => {
                r.resume_with(verify_round(&c, &committee, t.quorum, t.honest))
            }
            Effect::WalAppend(epoch, input, r) => {
                if let Some(bytes) = encode_entry(&input) {
                    self.wal.push_back(WalEntry {
                        epoch: epoch.0,
                        bytes,
                    });
                }
                r.resume_with(())
            }
            Effect::ExtendVote(.., r) => r.resume_with(None),
            Effect::VerifyVoteExtension(.., r) => r.resume_with(Ok(())),
        })
    }
}
