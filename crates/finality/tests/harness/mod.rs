//! A deterministic network of finality machines: a virtual clock, seeded link latency,
//! crashes and partitions, and adversaries as rewriters of a node's transmits.

#![allow(dead_code)] // each test binary uses part of it

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use malachite_types::{NilOrVal, SignedMessage};
use neuroshard_finality::context::{Sig, ValueId};
use neuroshard_finality::{
    Committee, ConsensusWire, EpochValue, Equivocation, Finality, FinalityEvent, Finalized,
    Timeouts, Validator,
};
use neuroshard_proof::fixtures::test_identity;
use neuroshard_proof::{Canonical, Identity};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The state an epoch's contents lead to (in the node: applying them to the last finalized
/// ledger state).
pub fn state_of(epoch: u64, contents: &[u8; 32]) -> [u8; 32] {
    let mut x = blake3::Hasher::new();
    x.update(b"state");
    x.update(&epoch.to_le_bytes());
    x.update(contents);
    *x.finalize().as_bytes()
}

/// The committee of `epoch`: the base powers, rotated every 5 epochs when `rotate` (stakes
/// that change with the ledger's state).
pub fn committee_for(
    keys: &[(neuroshard_proof::PublicKey, u64)],
    rotate: bool,
    epoch: u64,
) -> Committee {
    Committee::new(
        keys.iter()
            .enumerate()
            .map(|(i, (k, p))| {
                let extra = if rotate {
                    (epoch / 5 + i as u64) % 3 * 7
                } else {
                    0
                };
                Validator::new(*k, p + extra)
            })
            .collect(),
    )
}

/// A message on its way: (arrival, sequence number, to, from, bytes).
type InFlight = (Instant, u64, usize, usize, Vec<u8>);

/// How a node misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Byzantine {
    Honest,
    /// Computes (and proposes) another state for every epoch.
    WrongState,
    /// Signs a second, conflicting vote for every vote it sends.
    Equivocates,
    /// For every vote it sends, sends the same vote for nil in every other validator's name
    /// (signed with its own key): counted, these would skip every round.
    Impersonates,
}

pub struct Node {
    pub identity: Identity,
    pub finality: Finality,
    pub up: bool,
    pub byzantine: Byzantine,
    pub finalized: Vec<Finalized>,
    pub equivocations: Vec<Equivocation>,
    pub errors: Vec<String>,
    /// (epoch, when it started here).
    pub started: Vec<(u64, Instant)>,
    pub sent_msgs: u64,
    pub sent_bytes: u64,
    /// Its write-ahead log, as a disk would keep it.
    pub wal: Vec<neuroshard_finality::WalEntry>,
    /// Restarts so far: each one gives it more contents (another value) for the epoch.
    pub restarts: u64,
    /// Epochs in which it sent a proposal.
    pub proposed: Vec<u64>,
}

pub struct Net {
    pub nodes: Vec<Node>,
    /// The committee of epoch 1 (of every epoch unless `rotate`).
    pub committee: Committee,
    pub keys: Vec<(neuroshard_proof::PublicKey, u64)>,
    pub rotate: bool,
    pub now: Instant,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    rng: ChaCha8Rng,
    pub latency: Duration,
    pub jitter: Duration,
    /// Group of each node: messages cross only within a group.
    pub groups: Option<Vec<u8>>,
    /// Stop starting epochs past this one.
    pub last_epoch: u64,
}

impl Net {
    /// `powers[i]` is node i's voting power; every node is a committee member.
    pub fn new(powers: &[u64], seed: u64) -> Self {
        Self::with_keys(powers, seed, 1000)
    }

    /// The same with node i's key drawn from `first_key + i`.
    pub fn with_keys(powers: &[u64], seed: u64, first_key: u64) -> Self {
        let identities: Vec<Identity> = (0..powers.len())
            .map(|i| test_identity(first_key + i as u64))
            .collect();
        let keys: Vec<_> = identities
            .iter()
            .zip(powers)
            .map(|(id, p)| (id.public_key(), *p))
            .collect();
        let committee = committee_for(&keys, false, 1);
        let nodes = identities
            .into_iter()
            .map(|identity| Node {
                finality: Finality::new(identity.clone(), Timeouts::default()),
                identity,
                up: true,
                byzantine: Byzantine::Honest,
                finalized: Vec::new(),
                equivocations: Vec::new(),
                errors: Vec::new(),
                started: Vec::new(),
                sent_msgs: 0,
                sent_bytes: 0,
                wal: Vec::new(),
                restarts: 0,
                proposed: Vec::new(),
            })
            .collect();
        Self {
            nodes,
            committee,
            keys,
            rotate: false,
            now: Instant::now(),
            queue: BinaryHeap::new(),
            seq: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            latency: Duration::from_millis(40),
            jitter: Duration::from_millis(10),
            groups: None,
            last_epoch: u64::MAX,
        }
    }

    pub fn committee_of(&self, epoch: u64) -> Committee {
        committee_for(&self.keys, self.rotate, epoch)
    }

    /// Whether a value's state follows from its contents and it names the next epoch's
    /// committee: what an honest node checks.
    pub fn is_valid(&self, v: &EpochValue) -> bool {
        v.state == state_of(v.epoch, &v.contents)
            && v.next_committee == self.committee_of(v.epoch + 1).hash()
    }

    /// The value honest node `i` would propose: each node holds slightly different contents
    /// (what gossip brought it so far), the state they lead to, and the next committee.
    pub fn honest_value(&self, i: usize, epoch: u64) -> EpochValue {
        let mut x = blake3::Hasher::new();
        x.update(b"contents");
        x.update(&epoch.to_le_bytes());
        x.update(&(i as u64).to_le_bytes());
        x.update(&self.nodes[i].restarts.to_le_bytes());
        let contents = *x.finalize().as_bytes();
        EpochValue {
            epoch,
            contents,
            state: state_of(epoch, &contents),
            next_committee: self.committee_of(epoch + 1).hash(),
        }
    }

    pub fn value_of(&self, i: usize, epoch: u64) -> EpochValue {
        match self.nodes[i].byzantine {
            Byzantine::WrongState => EpochValue {
                state: [0xEE; 32],
                ..self.honest_value(i, epoch)
            },
            _ => self.honest_value(i, epoch),
        }
    }

    /// Starts epoch 1 on every node that is up (one down now starts when it comes up).
    pub fn start(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].up {
                self.start_epoch(i, 1);
            }
        }
    }

    /// Brings node i (back) up, starting it if it never started.
    pub fn revive(&mut self, i: usize) {
        self.nodes[i].up = true;
        if self.nodes[i].started.is_empty() {
            self.start_epoch(i, 1);
        }
    }

    fn start_epoch(&mut self, i: usize, epoch: u64) {
        if epoch > self.last_epoch {
            return;
        }
        let (now, committee, value) = (self.now, self.committee_of(epoch), self.value_of(i, epoch));
        let n = &mut self.nodes[i];
        n.started.push((epoch, now));
        n.finality
            .start_epoch(epoch, committee, now)
            .expect("epochs start in order");
        n.finality.set_value(value, now);
        self.flush(i);
    }

    fn delay(&mut self) -> Duration {
        let j = self.jitter.as_micros() as u64;
        let extra = if j == 0 {
            0
        } else {
            self.rng.random_range(0..=2 * j)
        };
        (self.latency + Duration::from_micros(extra)).saturating_sub(self.jitter)
    }

    fn send(&mut self, from: usize, bytes: Vec<u8>) {
        if !self.nodes[from].up {
            return;
        }
        self.nodes[from].sent_msgs += 1;
        self.nodes[from].sent_bytes += bytes.len() as u64;
        for to in 0..self.nodes.len() {
            if to == from {
                continue;
            }
            let at = self.now + self.delay();
            self.seq += 1;
            self.queue
                .push(Reverse((at, self.seq, to, from, bytes.clone())));
        }
    }

    /// Sends node i's transmits (rewritten by its adversary) and takes its events.
    fn flush(&mut self, i: usize) {
        loop {
            // The log first, as a node must (what it sends follows from what it logged).
            while let Some(e) = self.nodes[i].finality.poll_wal() {
                self.nodes[i].wal.push(e);
            }
            let mut out = Vec::new();
            while let Some(t) = self.nodes[i].finality.poll_transmit() {
                if let Ok(ConsensusWire::Proposal(p)) = ConsensusWire::from_canonical_bytes(&t) {
                    self.nodes[i].proposed.push(p.message.epoch.0);
                }
                out.push(t);
            }
            let mut finished = Vec::new();
            let mut judged = false;
            while let Some(e) = self.nodes[i].finality.poll_event() {
                match e {
                    FinalityEvent::Finalized(f) => finished.push(f),
                    FinalityEvent::Judge { value } => {
                        // A liar judges by its own rule: its own state is the right one.
                        let ok = match self.nodes[i].byzantine {
                            Byzantine::WrongState => value.state == [0xEE; 32],
                            _ => self.is_valid(&value),
                        };
                        let now = self.now;
                        self.nodes[i].finality.judge(value, ok, now);
                        judged = true;
                    }
                    FinalityEvent::Proposing { .. } => {}
                    FinalityEvent::Equivocation(q) => self.nodes[i].equivocations.push(*q),
                    FinalityEvent::Refused { reason, .. } => self.nodes[i].errors.push(reason),
                    FinalityEvent::Error(e) => self.nodes[i].errors.push(e),
                    FinalityEvent::Diverged { finalized } => self.nodes[i]
                        .errors
                        .push(format!("diverged at epoch {}", finalized.epoch)),
                }
            }
            if out.is_empty() && finished.is_empty() && !judged {
                return;
            }
            for bytes in out {
                let extra = self.forge(i, &bytes);
                self.send(i, bytes);
                for x in extra {
                    self.send(i, x);
                }
            }
            for f in finished {
                let next = f.epoch + 1;
                self.nodes[i].wal.retain(|e| e.epoch > f.epoch);
                self.nodes[i].finalized.push(f);
                self.start_epoch(i, next);
            }
        }
    }

    /// What an adversary sends besides `bytes`: an equivocator's second vote (the same vote
    /// for another value), an impersonator's votes in others' names for its proposal.
    fn forge(&self, i: usize, bytes: &[u8]) -> Vec<Vec<u8>> {
        let me = &self.nodes[i].identity;
        let sign = |v: neuroshard_finality::context::Vote| {
            let sig = Sig(me.sign(&v.to_canonical_bytes()).0);
            ConsensusWire::Vote(SignedMessage::new(v, sig)).to_canonical_bytes()
        };
        match (
            self.nodes[i].byzantine,
            ConsensusWire::from_canonical_bytes(bytes),
        ) {
            (Byzantine::Equivocates, Ok(ConsensusWire::Vote(v))) => {
                let mut other = v.message.clone();
                other.value = NilOrVal::Val(ValueId([0xAB; 32]));
                vec![sign(other)]
            }
            (Byzantine::Impersonates, Ok(ConsensusWire::Vote(v))) => self
                .committee
                .validators()
                .iter()
                .filter(|x| x.address.0 != me.node_id())
                .map(|x| {
                    let mut forged = v.message.clone();
                    forged.value = NilOrVal::Nil;
                    forged.validator = x.address;
                    sign(forged)
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Node i crashes and restarts in its current epoch, from its write-ahead log or (a disk
    /// lost) without it. It has gathered more contents meanwhile: another value to propose.
    pub fn restart(&mut self, i: usize, with_log: bool) {
        let epoch = self.nodes[i].finality.epoch().expect("started");
        let committee = self.committee_of(epoch);
        let now = self.now;
        let n = &mut self.nodes[i];
        n.restarts += 1;
        n.finality = Finality::new(n.identity.clone(), Timeouts::default());
        if with_log {
            let log: Vec<Vec<u8>> = n
                .wal
                .iter()
                .filter(|e| e.epoch == epoch)
                .map(|e| e.bytes.clone())
                .collect();
            n.finality
                .restore(epoch, committee, &log, now)
                .expect("the log replays");
        } else {
            n.wal.clear();
            n.finality
                .start_epoch(epoch, committee, now)
                .expect("a fresh machine starts");
        }
        let value = self.value_of(i, epoch);
        self.nodes[i].finality.set_value(value, now);
        self.flush(i);
    }

    fn crosses(&self, a: usize, b: usize) -> bool {
        self.groups.as_ref().is_some_and(|g| g[a] != g[b])
    }

    /// Runs until `done` holds or virtual time passes `limit`; returns whether `done` held.
    pub fn run_until(&mut self, limit: Duration, done: impl Fn(&Net) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            let next_msg = self.queue.peek().map(|Reverse((at, ..))| *at);
            let next_timer = self
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| n.up)
                .filter_map(|(i, n)| n.finality.poll_timeout().map(|t| (t, i)))
                .min();
            let (at, timer) = match (next_msg, next_timer) {
                (Some(m), Some((t, i))) if t < m => (t, Some(i)),
                (Some(m), _) => (m, None),
                (None, Some((t, i))) => (t, Some(i)),
                (None, None) => return false,
            };
            if at > end {
                self.now = end;
                return false;
            }
            self.now = self.now.max(at);
            match timer {
                Some(i) => {
                    let now = self.now;
                    self.nodes[i].finality.handle_timeout(now);
                    self.flush(i);
                }
                None => {
                    let Some(Reverse((_, _, to, from, bytes))) = self.queue.pop() else {
                        continue;
                    };
                    if !self.nodes[to].up || self.crosses(from, to) {
                        continue;
                    }
                    let (now, id) = (self.now, self.nodes[from].identity.node_id());
                    self.nodes[to].finality.handle_message(id, &bytes, now);
                    self.flush(to);
                }
            }
        }
    }

    /// The epochs node i finalized, as (epoch, value).
    pub fn chain(&self, i: usize) -> Vec<(u64, EpochValue)> {
        self.nodes[i]
            .finalized
            .iter()
            .map(|f| (f.epoch, f.value))
            .collect()
    }

    /// Every up, honest node has finalized at least `epochs` epochs.
    pub fn all_reached(&self, epochs: usize) -> bool {
        self.nodes
            .iter()
            .filter(|n| n.up && n.byzantine == Byzantine::Honest)
            .all(|n| n.finalized.len() >= epochs)
    }

    /// Virtual time from each epoch's start to its finalization on node i.
    pub fn latencies(&self, i: usize) -> Vec<Duration> {
        let n = &self.nodes[i];
        n.finalized
            .iter()
            .filter_map(|f| {
                let start = n.started.iter().find(|(e, _)| *e == f.epoch)?.1;
                let next = n.started.iter().find(|(e, _)| *e == f.epoch + 1)?.1;
                Some(next - start)
            })
            .collect()
    }
}
