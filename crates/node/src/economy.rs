//! The node's NEURO economy: it turns the node's DiLoCo rounds into signed Proof-of-Neural-Work,
//! verifies proofs and account ops from gossip, applies both to the node's ledger and answers
//! anti-entropy requests, so that every node that holds the same messages has the same
//! `state_hash()`.
//!
//! Sans-IO like the other protocol modules: the runtime passes in bytes and the time and
//! gossips what comes back. What makes a proof pay is network-agreed, never local memory:
//! - the ledger starts from the network genesis (rules and founders' stakes);
//! - a training proof is for one stage of the network's layout, by a node registered for that
//!   stage (a signed, stake-backed ledger op), and carries gradient receipts from at least the
//!   network's `min_receipts` distinct co-replicas registered there, and the tallies of the
//!   jobs nodes of other stages took from it (`economy/work.rs`), which its share follows;
//! - the ledger counts a claim once per (node, stage, round), for a round that can have
//!   happened by the proof's timestamp, that its stage has reached and that is not long gone
//!   (the round rules, judged by the finalized state's progress: `economy/floor.rs`), nor
//!   settled: a round's fixed reward is split among its contributors when a finalized epoch
//!   settles it, and the live ledger pays those shares (`economy/settle.rs`).
//!
//! Registrations only ever accumulate, so a proof's verdict does not depend on what arrives
//! after it: a proof whose prover or signers are not registered *yet* is parked until their
//! Register op arrives (by gossip or anti-entropy), then applied; one the round rules hold
//! waits for the epoch that allows it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::sync::Arc;

use neuroshard_ledger::{
    ApplyError, ChangeLog, Changes, Ledger, LedgerError, LedgerGenesis, LedgerState, OpError,
    Outcome, Record, StoreError,
};
use neuroshard_proof::{
    HardwareClass, Hash32, Identity, LayerRange, NodeId, Proof, ProofKind, ProofVerifier,
    PublicKey, Receipt, ReceiptKind, Roles, ShardWork, SignatureError, SignedProof, VerifiedProof,
    VerifyError,
};

/// Rounds whose pseudo-gradient hash, work and receipts are remembered.
pub const ROUND_MEMORY: usize = 16;
/// Proofs waiting for a registration; the oldest is dropped beyond this (anti-entropy
/// delivers it again later).
pub const MAX_PARKED: usize = 4096;
/// Receipts kept per round; more than a proof carries, so unregistered signers cannot crowd
/// out registered ones.
pub const RECEIPTS_PER_ROUND: usize = 4 * neuroshard_proof::proof::MAX_RECEIPTS;
/// Receipts held for rounds not recorded yet (a co-replica can be faster than our own
/// `record_round`).
pub const MAX_EARLY_RECEIPTS: usize = 64;

/// What a node needs to know of its network to judge proofs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EconomyConfig {
    pub network: Hash32,
    /// Layers and roles of each stage: what a proof of each claims.
    pub layout: Vec<(LayerRange, Roles)>,
    /// Distinct registered co-replicas whose gradient receipts a training proof needs.
    pub min_receipts: usize,
    /// The network's audit rate: which jobs a validator's fee can be for.
    pub audit_rate: neuroshard_audit::AuditRate,
}

impl EconomyConfig {
    /// The economy of a network of `stages` stages of `model`.
    pub fn new(
        network: Hash32,
        model: &neuroshard_model::ModelConfig,
        stages: usize,
        min_receipts: usize,
        audit_rate: neuroshard_audit::AuditRate,
    ) -> Result<Self, neuroshard_model::ModelError> {
        let specs = neuroshard_model::StageSpec::split(model, stages)?;
        Ok(Self {
            network,
            layout: specs.iter().map(crate::core::stage_claim).collect(),
            min_receipts,
            audit_rate,
        })
    }
}

/// What the node did in one DiLoCo round; the runtime fills it after each sync round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkSummary {
    pub round: u64,
    pub layers: LayerRange,
    pub roles: Roles,
    pub tokens: u64,
    pub batches: u64,
    pub shards: Vec<ShardWork>,
    pub model_hash_before: Hash32,
    pub model_hash_after: Hash32,
    /// BLAKE3 of the compressed pseudo-gradient blob the node offered in this round.
    pub pseudo_gradient_hash: Hash32,
    pub loss_micros: u64,
    pub duration_ms: u64,
}

/// Why a receipt for our own work was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptRefused {
    #[error("receipt is for {0:?}, only gradient receipts count")]
    WrongKind(ReceiptKind),
    #[error("a node cannot receipt its own work")]
    SelfSigned,
    #[error("hash differs from my pseudo-gradient of round {round}")]
    HashMismatch { round: u64 },
    #[error("signature: {0}")]
    Signature(SignatureError),
    #[error("a work tally signed by another node than the one that took the job")]
    NotTheReceiver,
    #[error("a work receipt whose hash is not a tally of jobs")]
    NotATally,
}

/// Why a proof claims nothing this network produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClaimRefused {
    #[error("proof of another network {}", hex::encode(.0))]
    OtherNetwork(Hash32),
    #[error("the network does not produce {0:?} proofs")]
    Kind(ProofKind),
    #[error(
        "layers {}..{} with roles {roles:?} are no stage of this network",
        layers.start,
        layers.end
    )]
    NoSuchStage { layers: LayerRange, roles: Roles },
}

#[derive(Debug, thiserror::Error)]
pub enum EconomyError {
    #[error("ledger storage: {0}")]
    Store(#[from] StoreError),
    #[error("ledger: {0}")]
    Apply(#[from] ApplyError),
    #[error("ledger: {0}")]
    Rules(#[from] LedgerError),
    #[error("own proof does not verify: {0}")]
    OwnProof(#[from] VerifyError),
    #[error("receipt refused: {0}")]
    Receipt(#[from] ReceiptRefused),
    #[error("op: {0}")]
    Op(#[from] OpError),
    #[error("own proof refused: {0}")]
    OwnRound(String),
}

/// What happened to one proof or op from the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProofOutcome {
    Applied {
        node: NodeId,
        reward: u64,
    },
    Duplicate,
    /// Waits for a registration; the reason names whose.
    Parked(String),
    Rejected(String),
}

/// Counts of [`ProofOutcome`]s for a batch of messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncSummary {
    pub applied: usize,
    pub duplicate: usize,
    pub parked: usize,
    pub rejected: usize,
}

impl SyncSummary {
    fn add(&mut self, other: SyncSummary) {
        self.applied += other.applied;
        self.duplicate += other.duplicate;
        self.parked += other.parked;
        self.rejected += other.rejected;
    }

    fn count(&mut self, outcome: &ProofOutcome) {
        match outcome {
            ProofOutcome::Applied { .. } => self.applied += 1,
            ProofOutcome::Duplicate => self.duplicate += 1,
            ProofOutcome::Parked(_) => self.parked += 1,
            ProofOutcome::Rejected(_) => self.rejected += 1,
        }
    }
}

#[derive(Debug, Clone)]
struct ParkedProof {
    hash: Hash32,
    wire: Vec<u8>,
    /// Nodes whose registration would change the verdict.
    waiting_for: Vec<NodeId>,
    /// Arrival time: the retry judges the timestamp as it was judged on arrival.
    now_ms: u64,
}

/// Where a verified proof stands against the ledger's registrations.
enum Standing {
    Ready,
    Wait(Vec<NodeId>),
    Refuse(String),
}

/// Verdict weights a node keeps (in memory, shared with the transport that serves them, and
/// in its ledger database): as many as it serves.
pub const KEPT_VERDICT_WEIGHTS: usize = 32;
/// Bytes of verdict weights the database keeps at most (32 default stages of 10.5 MB fit).
pub const MAX_VERDICT_WEIGHT_BYTES: u64 = 384 << 20;

/// What one applied proof or op changed, for the ledger's SQLite adapter to persist as it is:
/// the rules ran once, here, and the database stores their result.
#[derive(Debug, Clone)]
pub struct LedgerWrite {
    pub changes: Changes,
    /// The signed bytes of the proof applied (ops carry theirs in their records).
    pub proof_wire: Option<(Hash32, Arc<[u8]>)>,
    /// A fraud report whose verdict the ledger applied, by its id, kept to relay.
    pub report: Option<(Hash32, Arc<Vec<u8>>)>,
    /// The stage weights (by BLAKE3) a replay verdict's settlement needs, kept to serve.
    pub weights: Option<(Hash32, Arc<Vec<u8>>)>,
    /// A finalized epoch or a consensus log entry to keep.
    pub finality: Option<FinalityWrite>,
}

impl LedgerWrite {
    /// A write of ledger changes and nothing else.
    pub fn of(changes: Changes) -> Self {
        Self {
            changes,
            proof_wire: None,
            report: None,
            weights: None,
            finality: None,
        }
    }
}

/// What a node's ledger held when it started: the state and the wire bytes of its proofs and
/// ops.
#[derive(Debug, Clone, Default)]
pub struct LedgerSnapshot {
    pub state: LedgerState,
    pub wires: BTreeMap<Hash32, Arc<[u8]>>,
    /// Applied account ops by (account, nonce).
    pub ops: BTreeMap<(NodeId, u64), Vec<u8>>,
    /// Highest nonce of each node's proofs (own nonces continue above it).
    pub last_nonce: BTreeMap<NodeId, u64>,
    /// Fraud reports of the verdicts applied, to relay, oldest first.
    pub reports: Vec<Vec<u8>>,
    /// The weights the last replay verdicts need (by BLAKE3), to serve, oldest first.
    pub verdict_weights: Vec<(Hash32, Arc<Vec<u8>>)>,
    /// Where ledger finality starts from: the genesis state, the finalized epochs kept and
    /// the consensus log of the epoch in progress.
    pub finality: FinalityStart,
}

impl LedgerSnapshot {
    /// A fresh ledger started from `genesis`.
    pub fn genesis(genesis: &LedgerGenesis) -> Result<Self, EconomyError> {
        let (state, _) = LedgerState::from_genesis(genesis)?;
        Ok(Self {
            finality: FinalityStart {
                genesis: state.clone(),
                ..FinalityStart::default()
            },
            state,
            ..Self::default()
        })
    }

    /// Reads a SQLite ledger.
    pub fn load(
        ledger: &Ledger,
        me: &NodeId,
        genesis: &LedgerGenesis,
    ) -> Result<Self, EconomyError> {
        let mut wires = BTreeMap::new();
        for hash in ledger.proof_hashes()? {
            if let Some(wire) = ledger.proof_wire(&hash)? {
                wires.insert(hash, intern::intern(hash, &wire));
            }
        }
        let mut last_nonce = BTreeMap::new();
        if let Some(n) = ledger.last_proof_nonce(me)? {
            last_nonce.insert(*me, n);
        }
        Ok(Self {
            state: ledger.state().clone(),
            wires,
            ops: ledger.all_ops()?,
            last_nonce,
            reports: ledger.fraud_reports()?,
            verdict_weights: ledger
                .verdict_weights()?
                .into_iter()
                .map(|(h, w)| (h, Arc::new(w)))
                .collect(),
            finality: FinalityStart {
                genesis: LedgerState::from_genesis(genesis)?.0,
                epochs: ledger
                    .finalized_epochs()?
                    .into_iter()
                    .map(|(_, l)| l)
                    .collect(),
                wal: ledger.finality_wal()?,
            },
        })
    }
}

/// Persists [`LedgerWrite`]s into SQLite (the I/O half of the economy).
#[derive(Debug)]
pub struct LedgerStore {
    log: ChangeLog,
}

impl LedgerStore {
    /// Opens (or starts from `genesis`) the database and reads what the economy starts from.
    pub fn open(
        path: &Path,
        me: &NodeId,
        genesis: &LedgerGenesis,
    ) -> Result<(Self, LedgerSnapshot), EconomyError> {
        let ledger = Ledger::open_genesis(path, genesis)?;
        let snapshot = LedgerSnapshot::load(&ledger, me, genesis)?;
        Ok((
            Self {
                log: ledger.into_change_log(),
            },
            snapshot,
        ))
    }

    /// Persists `writes` (in the order the economy applied them) in one SQLite transaction:
    /// one fsync however many. An error means nothing of them was stored, and nothing later
    /// will be ([`ChangeLog`]): the database keeps a consistent prefix of the ledger.
    pub fn write_batch(&mut self, writes: &[LedgerWrite]) -> Result<(), EconomyError> {
        let mut all = Changes::default();
        let mut wires = Vec::new();
        for w in writes {
            all.merge(w.changes.clone());
            if let Some((hash, wire)) = &w.proof_wire {
                wires.push((*hash, &wire[..]));
            }
        }
        self.log.commit(&all, &wires)?;
        for (id, wire) in writes.iter().filter_map(|w| w.report.as_ref()) {
            self.log
                .keep_report(id, wire, antientropy::MAX_REPORT_BYTES as u64)?;
        }
        for (hash, wire) in writes.iter().filter_map(|w| w.weights.as_ref()) {
            self.log
                .keep_verdict_weights(hash, wire, MAX_VERDICT_WEIGHT_BYTES)?;
        }
        for f in writes.iter().filter_map(|w| w.finality.as_ref()) {
            match f {
                FinalityWrite::Epoch { epoch, link } => self.log.keep_finalized(*epoch, link)?,
                FinalityWrite::Wal { epoch, entry } => self.log.keep_wal(*epoch, entry)?,
            }
        }
        Ok(())
    }
}

/// The node's ledger, verifier and identity, and the state of its own proof production.
/// Holds the ledger in memory; every applied proof or op leaves as a [`LedgerWrite`].
#[derive(Debug)]
pub struct Economy {
    ledger: LedgerState,
    wires: BTreeMap<Hash32, Arc<[u8]>>,
    op_wires: BTreeMap<(NodeId, u64), Vec<u8>>,
    writes: VecDeque<LedgerWrite>,
    verifier: ProofVerifier,
    identity: Identity,
    cfg: EconomyConfig,
    /// Hardware class declared in own proofs; its limits bound what a proof claims.
    pub hardware: HardwareClass,
    /// Own rounds, sorted, at most [`ROUND_MEMORY`].
    rounds: VecDeque<produce::RoundInfo>,
    early: Vec<(u64, Receipt)>,
    /// Jobs of other nodes we took, and tallies of ours others took (`economy/work.rs`).
    taken: work::TakenJobs,
    tallies: work::Tallies,
    last_nonce: Option<u64>,
    parked: VecDeque<ParkedProof>,
    /// Proofs of rounds past their stage's certified round.
    ahead: ahead::Ahead,
    /// The finalized state's first paid rounds, and the claims waiting for one.
    floor: floor::Floor,
    /// Applied ops by their anti-entropy id.
    op_ids: BTreeMap<Hash32, (NodeId, u64)>,
    sync: antientropy::SyncState,
    /// The weights the last replay verdicts need, as stored (oldest first, at most
    /// [`KEPT_VERDICT_WEIGHTS`]): what a restarted node serves again.
    verdict_weights: VecDeque<(Hash32, Arc<Vec<u8>>)>,
    /// What the live ledger applied, on its way to an epoch.
    epoch_feed: epochs::EpochFeed,
    /// Where finality resumes from, until the core takes it.
    finality_start: Option<FinalityStart>,
    /// Recent finalized epochs' hashes: what validator fees are judged by.
    fee_beacons: fees::FeeBeacons,
}

impl Economy {
    /// An economy on a fresh in-memory ledger started from `genesis` (tests, simulations).
    pub fn in_memory(
        identity: Identity,
        cfg: EconomyConfig,
        genesis: &LedgerGenesis,
    ) -> Result<Self, EconomyError> {
        Ok(Self::resume(
            identity,
            cfg,
            LedgerSnapshot::genesis(genesis)?,
        ))
    }

    /// Resumes from what the node's ledger held.
    pub fn resume(identity: Identity, cfg: EconomyConfig, snapshot: LedgerSnapshot) -> Self {
        // Own nonces continue above what the ledger holds, so a restart never reuses one even
        // if the clock went back.
        let last_nonce = snapshot.last_nonce.get(&identity.node_id()).copied();
        let op_ids = snapshot
            .ops
            .iter()
            .map(|(key, wire)| (antientropy::op_id(wire), *key))
            .collect();
        let mut economy = Self {
            ledger: snapshot.state,
            wires: snapshot.wires,
            op_wires: snapshot.ops,
            writes: VecDeque::new(),
            verifier: ProofVerifier::new(),
            identity,
            cfg,
            hardware: HardwareClass::Cpu,
            rounds: VecDeque::new(),
            early: Vec::new(),
            taken: Default::default(),
            tallies: Default::default(),
            last_nonce,
            parked: VecDeque::new(),
            ahead: Default::default(),
            floor: Default::default(),
            op_ids,
            sync: antientropy::SyncState::default(),
            verdict_weights: snapshot.verdict_weights.into_iter().collect(),
            epoch_feed: Default::default(),
            finality_start: Some(snapshot.finality),
            fee_beacons: Default::default(),
        };
        for wire in snapshot.reports {
            economy.sync.reports.keep(Arc::new(wire));
        }
        economy
    }

    /// The next change to persist.
    pub fn poll_write(&mut self) -> Option<LedgerWrite> {
        self.writes.pop_front()
    }

    pub fn node_id(&self) -> NodeId {
        self.identity.node_id()
    }

    pub fn public_key(&self) -> PublicKey {
        self.identity.public_key()
    }

    pub fn network(&self) -> Hash32 {
        self.cfg.network
    }

    /// What this economy knows of its network (stage layout, receipts a proof needs).
    pub fn config(&self) -> &EconomyConfig {
        &self.cfg
    }

    /// The stage whose layers and roles these are.
    fn stage_of(&self, layers: LayerRange, roles: Roles) -> Option<u16> {
        let at = self.cfg.layout.iter().position(|s| *s == (layers, roles))?;
        u16::try_from(at).ok()
    }

    /// What the network produces: training proofs of this network for one stage's layers
    /// and roles. Uptime, Verification and Inference proofs need no receipt, so each would
    /// mint for free; none is made by any node here. Content-only, so every node decides
    /// alike. Returns the stage.
    fn check_claim(&self, p: &Proof) -> Result<u16, ClaimRefused> {
        if p.network != self.cfg.network {
            return Err(ClaimRefused::OtherNetwork(p.network));
        }
        if p.kind != ProofKind::Training {
            return Err(ClaimRefused::Kind(p.kind));
        }
        self.stage_of(p.layers, p.roles)
            .ok_or(ClaimRefused::NoSuchStage {
                layers: p.layers,
                roles: p.roles,
            })
    }

    /// Whether the prover and enough receipt signers are registered for `stage`. Only
    /// gradient receipts of registered co-replicas count; each signer once (the verifier
    /// refused duplicates).
    fn standing(&self, p: &Proof, stage: u16) -> Standing {
        self.standing_in(&self.ledger, p, stage)
    }

    /// [`Self::standing`] against `ledger` (the live one, or an epoch's state being applied).
    fn standing_in(&self, ledger: &LedgerState, p: &Proof, stage: u16) -> Standing {
        if !ledger.was_registered(&p.node_id, stage) {
            return Standing::Wait(vec![p.node_id]);
        }
        let mut vouching = 0usize;
        let mut unknown = Vec::new();
        for r in p
            .receipts
            .iter()
            .filter(|r| r.kind == ReceiptKind::Gradients)
        {
            let signer = r.signer.node_id();
            if ledger.was_registered(&signer, stage) {
                vouching += 1;
            } else {
                unknown.push(signer);
            }
        }
        if vouching >= self.cfg.min_receipts {
            Standing::Ready
        } else if vouching + unknown.len() >= self.cfg.min_receipts {
            Standing::Wait(unknown)
        } else {
            Standing::Refuse(format!(
                "{vouching} receipts of registered co-replicas, the network needs {}",
                self.cfg.min_receipts
            ))
        }
    }

    /// Verifies and applies a proof from the network. Never panics on any input.
    pub fn on_proof(&mut self, wire: &[u8], now_ms: u64) -> ProofOutcome {
        let signed = match SignedProof::from_bytes(wire) {
            Ok(s) => s,
            Err(e) => return ProofOutcome::Rejected(format!("format: {e}")),
        };
        let hash = signed.payload_hash();
        // Cheap dedup before any curve math; the hash excludes the signature, so a copy with
        // a different signature is the same proof.
        if self.ledger.has_proof(&hash) {
            // A proof finality settled before this node held it (`economy/settle.rs`): keep
            // its bytes now, or anti-entropy would fetch it from peers again and again.
            if !self.wires.contains_key(&hash)
                && self.verifier.check_content(&signed, now_ms).is_ok()
            {
                self.keep_wire(hash, wire);
            }
            return ProofOutcome::Duplicate;
        }
        if self.parked.iter().any(|p| p.hash == hash) {
            return ProofOutcome::Parked("already waiting for a registration".into());
        }
        if self.ahead.contains(&hash) {
            return ProofOutcome::Parked("already waiting for its stage to reach its round".into());
        }
        if self.floor.contains(&hash) {
            return ProofOutcome::Parked("already waiting for its prover's first claim".into());
        }
        let verified = match self.verifier.check_content(&signed, now_ms) {
            Ok(v) => v,
            Err(e) => return ProofOutcome::Rejected(e.to_string()),
        };
        let stage = match self.check_claim(verified.proof()) {
            Ok(stage) => stage,
            Err(reason) => return ProofOutcome::Rejected(reason.to_string()),
        };
        match self.standing(verified.proof(), stage) {
            Standing::Ready => self.apply_claim(&verified, wire),
            Standing::Refuse(reason) => ProofOutcome::Rejected(reason),
            Standing::Wait(nodes) => {
                let reason = format!(
                    "waits for the registration of {} for stage {stage}",
                    nodes
                        .iter()
                        .map(NodeId::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                if self.parked.len() >= MAX_PARKED {
                    self.parked.pop_front();
                }
                self.parked.push_back(ParkedProof {
                    hash,
                    wire: wire.to_vec(),
                    waiting_for: nodes,
                    now_ms,
                });
                ProofOutcome::Parked(reason)
            }
        }
    }

    /// Retries the parked proofs that waited for one of `registered`.
    fn retry_parked(&mut self, registered: &BTreeSet<NodeId>) -> SyncSummary {
        let mut summary = SyncSummary::default();
        let (ready, waiting) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition::<VecDeque<_>, _>(|p| p.waiting_for.iter().any(|n| registered.contains(n)));
        self.parked = waiting;
        for p in ready {
            let outcome = self.on_proof(&p.wire, p.now_ms);
            summary.count(&outcome);
        }
        summary
    }

    /// Applies to the in-memory state and queues the write.
    fn apply_verified(
        &mut self,
        verified: &VerifiedProof,
        wire: &[u8],
    ) -> Result<Outcome, EconomyError> {
        // Served to peers as this proof, so it must be exactly this proof's signed payload.
        let matches =
            SignedProof::from_bytes(wire).is_ok_and(|s| s.payload_hash() == verified.hash());
        if !matches {
            return Err(EconomyError::Apply(ApplyError::WireMismatch));
        }
        let outcome = self.ledger.apply_proof(verified)?;
        if matches!(outcome, Outcome::Applied(_)) {
            let hash = verified.hash();
            let wire = intern::intern(hash, wire);
            self.wires.insert(hash, wire.clone());
            self.epoch_feed.push(
                neuroshard_ledger::EpochItem::Proof(verified.clone()),
                crate::finality::ItemWire::Proof(wire.to_vec()),
            );
            self.sync.dirty = true;
            if let Outcome::Applied(changes) = &outcome {
                self.writes.push_back(LedgerWrite {
                    proof_wire: Some((hash, wire)),
                    ..LedgerWrite::of(changes.clone())
                });
            }
        }
        Ok(outcome)
    }

    /// Keeps the signed bytes of a proof the ledger holds, to serve (and persists them).
    fn keep_wire(&mut self, hash: Hash32, wire: &[u8]) {
        let wire = intern::intern(hash, wire);
        self.wires.insert(hash, wire.clone());
        self.sync.dirty = true;
        self.writes.push_back(LedgerWrite {
            proof_wire: Some((hash, wire)),
            ..LedgerWrite::of(Changes::default())
        });
    }

    /// What applying `verified` gave, as the outcome its sender is told.
    pub(super) fn outcome_of(
        verified: &VerifiedProof,
        result: Result<Outcome, EconomyError>,
    ) -> ProofOutcome {
        match result {
            Ok(Outcome::Applied(changes)) => {
                let reward = changes.records.iter().find_map(|r| match r {
                    Record::Proof { reward, .. } => Some(*reward),
                    _ => None,
                });
                ProofOutcome::Applied {
                    node: verified.proof().node_id,
                    reward: reward.unwrap_or(0),
                }
            }
            Ok(Outcome::Duplicate | Outcome::Queued) => ProofOutcome::Duplicate,
            // A storage failure is reported as a rejection too: nothing was stored, and
            // anti-entropy offers the proof again.
            Err(e) => ProofOutcome::Rejected(e.to_string()),
        }
    }

    /// Hashes of every applied proof, sorted.
    pub fn proof_hashes(&self) -> Result<Vec<Hash32>, EconomyError> {
        Ok(self.wires.keys().copied().collect())
    }

    pub fn state_hash(&self) -> Hash32 {
        self.ledger.state_hash()
    }

    pub fn proof_count(&self) -> usize {
        self.ledger.proof_count()
    }

    /// Proofs waiting for a registration, for their stage to reach their round or for their
    /// prover's first claim of the stage to be final.
    pub fn parked_count(&self) -> usize {
        self.parked.len() + self.ahead.len() + self.floor.held()
    }

    pub fn balance(&self, node: &NodeId) -> u64 {
        self.ledger.account(node).balance
    }

    /// Every account's spendable balance, by node id.
    pub fn balances(&self) -> Vec<(NodeId, u64)> {
        self.ledger
            .accounts()
            .map(|(id, a)| (*id, a.balance))
            .collect()
    }

    pub fn own_balance(&self) -> u64 {
        self.balance(&self.identity.node_id())
    }

    /// What a store that persisted every write so far would hold (the simulator's disk).
    pub fn snapshot(&self) -> LedgerSnapshot {
        LedgerSnapshot {
            state: self.ledger.clone(),
            wires: self.wires.clone(),
            ops: self.op_wires.clone(),
            last_nonce: self
                .last_nonce
                .map(|n| (self.node_id(), n))
                .into_iter()
                .collect(),
            reports: self.sync.reports.wires().cloned().collect(),
            verdict_weights: self.verdict_weights.iter().cloned().collect(),
            // Finality's part is the core's to add (`NodeCore::ledger_snapshot`).
            finality: FinalityStart::default(),
        }
    }

    /// Keeps (and queues for the store) the weights a replay verdict's settlement needs, the
    /// last [`KEPT_VERDICT_WEIGHTS`] of them: a restart does not take them from the ledgers
    /// that settle the verdict late. None: kept already; else the hashes it evicted.
    pub fn keep_verdict_weights(
        &mut self,
        hash: Hash32,
        weights: Arc<Vec<u8>>,
    ) -> Option<Vec<Hash32>> {
        if self.keeps_verdict_weights(&hash) {
            return None;
        }
        self.verdict_weights.push_back((hash, Arc::clone(&weights)));
        let mut evicted = Vec::new();
        while self.verdict_weights.len() > KEPT_VERDICT_WEIGHTS {
            evicted.extend(self.verdict_weights.pop_front().map(|(h, _)| h));
        }
        self.writes.push_back(LedgerWrite {
            weights: Some((hash, weights)),
            ..LedgerWrite::of(Changes::default())
        });
        Some(evicted)
    }

    /// Whether the weights `hash` are kept for a verdict.
    pub fn keeps_verdict_weights(&self, hash: &Hash32) -> bool {
        self.verdict_weights.iter().any(|(h, _)| h == hash)
    }

    /// The verdict weights kept, oldest first (what a restarted node serves again).
    pub fn verdict_weights(&self) -> impl Iterator<Item = &(Hash32, Arc<Vec<u8>>)> {
        self.verdict_weights.iter()
    }

    /// The ledger state, for read-only queries (totals, accounts, registrations).
    pub fn ledger(&self) -> &LedgerState {
        &self.ledger
    }
}

mod ahead;
#[cfg(test)]
mod ahead_tests;
mod antientropy;
#[cfg(test)]
mod antientropy_tests;
pub mod epochs;
#[cfg(test)]
mod fee_tests;
pub use epochs::{FinalityStart, FinalityWrite};
mod fees;
pub use fees::{FEE_BEACONS, FeeRefused};
mod floor;
pub use ahead::MAX_AHEAD;
pub use floor::{ELECTORATE_EPOCHS, FEED_AHEAD, HELD_PER_KEY, MAX_FIRST_HELD};
mod intern;
mod ops;
mod produce;
#[cfg(test)]
mod receipt_tests;
pub mod reconcile;
#[cfg(test)]
mod scale_tests;
pub mod settle;
#[cfg(test)]
mod settle_tests;
#[cfg(test)]
pub(crate) mod tests;
mod work;
#[cfg(test)]
mod work_tests;

pub use antientropy::{
    LedgerSyncRequest, LedgerSyncResponse, MAX_PROOF_WIRE, MAX_REPORT_BYTES, MAX_SYNC_OPS,
    MAX_SYNC_PROOFS, MAX_SYNC_REPORTS, MAX_SYNC_SESSIONS, MAX_SYNC_WANT, report_id,
};
