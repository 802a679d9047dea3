//! The node's NEURO economy: it turns the node's DiLoCo rounds into signed Proof-of-Neural-Work,
//! verifies proofs from gossip, applies both to the node's SQLite ledger and answers
//! anti-entropy requests, so that every node that holds the same proofs has the same
//! `state_hash()`.
//!
//! Sans-IO like the other protocol modules: the runtime passes in bytes and the time and
//! gossips what comes back. Agreement rests on two properties: proofs are checked with
//! [`ProofVerifier::check_content`], whose verdict does not depend on arrival order or time
//! (except "not from the future", which a later retry fixes), and the ledger's proof rewards
//! commute. The only local input left, which receipt signers are known, is handled by parking
//! proofs until [`Economy::learn_node`] makes their signers known.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::Path;

use neuroshard_ledger::{
    ApplyError, Ledger, LedgerError, LedgerState, Outcome, Record, StoreError,
};
use neuroshard_proof::plausibility::{
    MAX_CLAIMED_DURATION_MS, MAX_TOKENS_PER_BATCH, MIN_CLAIMED_DURATION_MS,
};
use neuroshard_proof::proof::{MAX_RECEIPTS, MAX_SHARDS};
use neuroshard_proof::verify::MIN_TRAINING_RECEIPTS;
use neuroshard_proof::{
    HardwareClass, Hash32, Identity, LayerRange, NodeId, Proof, ProofKind, ProofVerifier,
    PublicKey, Receipt, ReceiptError, ReceiptKind, Roles, ShardWork, SignatureError, SignedProof,
    VerifiedProof, VerifyError,
};

/// Default gap between own proofs: the verifier's rate limit is 120 proofs per node per hour.
pub const DEFAULT_MIN_INTERVAL_MS: u64 = 30_000;
/// Rounds whose pseudo-gradient hash and receipts are remembered.
pub const ROUND_MEMORY: usize = 16;
/// Proofs waiting for an unknown receipt signer; the oldest is dropped beyond this
/// (anti-entropy delivers it again later).
pub const MAX_PARKED: usize = 4096;
/// Receipts kept per round; more than a proof carries, so unknown signers cannot crowd out
/// known ones.
pub const RECEIPTS_PER_ROUND: usize = 4 * MAX_RECEIPTS;
/// Receipts held for rounds not recorded yet (a co-replica can be faster than our own
/// `record_round`).
pub const MAX_EARLY_RECEIPTS: usize = 64;
/// Keys whose introductions are kept for peers (one signed heartbeat each, ~200 bytes).
pub const MAX_INTRODUCED: usize = 1 << 16;

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
}

/// What happened to one proof from the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProofOutcome {
    Applied {
        node: NodeId,
        reward: u64,
    },
    Duplicate,
    /// Waits for a receipt signer to become known; the reason names it.
    Parked(String),
    Rejected(String),
}

/// Counts of [`ProofOutcome`]s for a batch of proofs.
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

/// Work accumulated since the last own proof.
#[derive(Debug, Clone)]
struct Accumulated {
    layers: LayerRange,
    roles: Roles,
    tokens: u64,
    batches: u64,
    duration_ms: u64,
    shards: Vec<ShardWork>,
    model_hash_before: Hash32,
    model_hash_after: Hash32,
    loss_micros: u64,
}

impl Accumulated {
    fn from_work(work: WorkSummary) -> Self {
        let mut shards = work.shards;
        shards.truncate(MAX_SHARDS);
        Self {
            layers: work.layers,
            roles: work.roles,
            tokens: work.tokens,
            batches: work.batches,
            duration_ms: work.duration_ms,
            shards,
            model_hash_before: work.model_hash_before,
            model_hash_after: work.model_hash_after,
            loss_micros: work.loss_micros,
        }
    }

    /// Adds a round. One proof declares one layer range and role set, so the claim narrows to
    /// what was held in every round; with nothing in common the older work cannot be claimed
    /// honestly and is dropped.
    fn add(&mut self, work: WorkSummary) {
        let layers = LayerRange {
            start: self.layers.start.max(work.layers.start),
            end: self.layers.end.min(work.layers.end),
        };
        if layers.is_empty() {
            *self = Self::from_work(work);
            return;
        }
        self.layers = layers;
        self.roles = common_roles(self.roles, work.roles);
        self.tokens = self.tokens.saturating_add(work.tokens);
        self.batches = self.batches.saturating_add(work.batches);
        self.duration_ms = self.duration_ms.saturating_add(work.duration_ms);
        let room = MAX_SHARDS.saturating_sub(self.shards.len());
        self.shards.extend(work.shards.into_iter().take(room));
        self.model_hash_after = work.model_hash_after;
        self.loss_micros = work.loss_micros;
    }

    /// (tokens, batches, claimed ms) that pass the static plausibility limits of `hardware`.
    /// Duration is what was measured, so when the counts exceed what it allows they are
    /// lowered (under-claiming) instead of inflating the time.
    fn claim(&self, hardware: HardwareClass) -> (u64, u64, u64) {
        let measured = self.duration_ms.max(1);
        let duration = measured.clamp(MIN_CLAIMED_DURATION_MS, MAX_CLAIMED_DURATION_MS);
        let scale = |v: u64| {
            if measured <= duration {
                return v;
            }
            let scaled = u128::from(v) * u128::from(duration) / u128::from(measured);
            u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
        };
        let per_duration = |per_sec: u64| {
            let v = u128::from(per_sec) * u128::from(duration) / 1000;
            u64::try_from(v).unwrap_or(u64::MAX)
        };
        let limits = hardware.limits();
        let layers = u64::from(self.layers.len()).max(1);
        let mut tokens =
            scale(self.tokens).min(per_duration(limits.max_layer_tokens_per_sec) / layers);
        let batches = scale(self.batches)
            .min(per_duration(limits.max_batches_per_sec))
            .min(tokens);
        tokens = tokens.min(batches.saturating_mul(MAX_TOKENS_PER_BATCH));
        (tokens, batches, duration)
    }
}

fn common_roles(a: Roles, b: Roles) -> Roles {
    [Roles::EMBEDDING, Roles::LM_HEAD]
        .into_iter()
        .filter(|r| a.contains(*r) && b.contains(*r))
        .fold(Roles::NONE, Roles::with)
}

/// Our pseudo-gradient of one round and the receipts that vouch for it.
#[derive(Debug, Clone)]
struct RoundInfo {
    round: u64,
    hash: Hash32,
    receipts: Vec<Receipt>,
}

#[derive(Debug, Clone)]
struct ParkedProof {
    hash: Hash32,
    wire: Vec<u8>,
    waiting_for: PublicKey,
    /// Arrival time: the retry judges the timestamp as it was judged on arrival.
    now_ms: u64,
}

/// A change the ledger's SQLite adapter must persist: a verified proof and its wire bytes,
/// re-applied there (the rules are deterministic, so the stored state follows this one).
#[derive(Debug, Clone)]
pub struct LedgerWrite {
    pub proof: VerifiedProof,
    pub wire: Vec<u8>,
}

/// What a node's ledger held when it started: the state and the wire bytes of its proofs.
#[derive(Debug, Clone, Default)]
pub struct LedgerSnapshot {
    pub state: LedgerState,
    pub wires: BTreeMap<Hash32, Vec<u8>>,
    /// Highest nonce of each node's proofs (own nonces continue above it).
    pub last_nonce: BTreeMap<NodeId, u64>,
}

impl LedgerSnapshot {
    /// Reads a SQLite ledger.
    pub fn load(ledger: &Ledger, me: &NodeId) -> Result<Self, EconomyError> {
        let mut wires = BTreeMap::new();
        for hash in ledger.proof_hashes()? {
            if let Some(wire) = ledger.proof_wire(&hash)? {
                wires.insert(hash, wire);
            }
        }
        let mut last_nonce = BTreeMap::new();
        if let Some(n) = ledger.last_proof_nonce(me)? {
            last_nonce.insert(*me, n);
        }
        Ok(Self {
            state: ledger.state().clone(),
            wires,
            last_nonce,
        })
    }
}

/// Persists [`LedgerWrite`]s into SQLite (the I/O half of the economy).
#[derive(Debug)]
pub struct LedgerStore {
    ledger: Ledger,
}

impl LedgerStore {
    /// Opens the database and reads what the economy starts from.
    pub fn open(path: &Path, me: &NodeId) -> Result<(Self, LedgerSnapshot), EconomyError> {
        let ledger = Ledger::open(path)?;
        let snapshot = LedgerSnapshot::load(&ledger, me)?;
        Ok((Self { ledger }, snapshot))
    }

    pub fn write(&mut self, w: &LedgerWrite) -> Result<(), EconomyError> {
        self.ledger.apply_proof_wire(&w.proof, &w.wire)?;
        Ok(())
    }

    pub fn state_hash(&self) -> Hash32 {
        self.ledger.state_hash()
    }
}

/// The node's ledger, verifier and identity, and the state of its own proof production.
/// Holds the ledger in memory; every applied proof leaves as a [`LedgerWrite`].
#[derive(Debug)]
pub struct Economy {
    ledger: LedgerState,
    wires: BTreeMap<Hash32, Vec<u8>>,
    writes: VecDeque<LedgerWrite>,
    verifier: ProofVerifier,
    identity: Identity,
    /// Shortest gap between two own proofs.
    pub min_interval_ms: u64,
    /// Hardware class declared in own proofs; its limits bound what a proof claims.
    pub hardware: HardwareClass,
    work: Option<Accumulated>,
    /// Sorted by round, at most [`ROUND_MEMORY`].
    rounds: VecDeque<RoundInfo>,
    early: Vec<(u64, Receipt)>,
    last_proof_ms: Option<u64>,
    last_nonce: Option<u64>,
    parked: VecDeque<ParkedProof>,
    /// The signed heartbeat that made each known key known, passed on in anti-entropy.
    introductions: HashMap<PublicKey, Vec<u8>>,
    /// Applied proofs by prover, as (nonce, hash): what anti-entropy summarises.
    by_prover: BTreeMap<NodeId, BTreeSet<(u64, Hash32)>>,
    /// Layers and roles of each stage of the network (empty: not checked).
    layout: Vec<(LayerRange, Roles)>,
}

impl Economy {
    /// An economy on an empty ledger (tests, simulations, a fresh node).
    pub fn in_memory(identity: Identity) -> Result<Self, EconomyError> {
        Ok(Self::resume(identity, LedgerSnapshot::default()))
    }

    /// Resumes from what the node's ledger held.
    pub fn resume(identity: Identity, snapshot: LedgerSnapshot) -> Self {
        // Own nonces continue above what the ledger holds, so a restart never reuses one even
        // if the clock went back.
        let last_nonce = snapshot.last_nonce.get(&identity.node_id()).copied();
        let ledger = snapshot.state;
        // Our own receipts, on co-replicas' proofs, count like anyone's.
        let mut verifier = ProofVerifier::new();
        verifier.add_known_node(identity.public_key());
        let mut by_prover: BTreeMap<NodeId, BTreeSet<(u64, Hash32)>> = BTreeMap::new();
        for (hash, wire) in &snapshot.wires {
            if let Some((node, nonce)) = antientropy::prover_and_nonce(wire) {
                by_prover.entry(node).or_default().insert((nonce, *hash));
            }
        }
        Self {
            layout: Vec::new(),
            by_prover,
            ledger,
            wires: snapshot.wires,
            writes: VecDeque::new(),
            verifier,
            identity,
            min_interval_ms: DEFAULT_MIN_INTERVAL_MS,
            hardware: HardwareClass::Cpu,
            work: None,
            rounds: VecDeque::new(),
            early: Vec::new(),
            last_proof_ms: None,
            last_nonce,
            parked: VecDeque::new(),
            introductions: HashMap::new(),
        }
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

    /// Makes `key` a known receipt signer (call for every valid signed heartbeat, with its
    /// bytes: they introduce the key to peers that never hear it) and retries the parked
    /// proofs that waited for it.
    pub fn learn_node(&mut self, key: PublicKey, introduction: &[u8]) -> SyncSummary {
        let mut summary = SyncSummary::default();
        if !self.introductions.contains_key(&key)
            && self.introductions.len() < MAX_INTRODUCED
            && introduction.len() <= MAX_INTRODUCTION
        {
            self.introductions.insert(key, introduction.to_vec());
        }
        if self.verifier.is_known(&key) {
            return summary;
        }
        self.verifier.add_known_node(key);
        let (ready, waiting) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition::<VecDeque<_>, _>(|p| p.waiting_for == key);
        self.parked = waiting;
        for p in ready {
            let outcome = self.on_proof(&p.wire, p.now_ms);
            summary.count(&outcome);
        }
        summary
    }

    /// A receipt by this node: "I fetched and aggregated `prover`'s pseudo-gradient `hash`".
    pub fn receipt_for(&self, prover: NodeId, round: u64, hash: Hash32) -> Receipt {
        Receipt::sign(&self.identity, prover, round, ReceiptKind::Gradients, hash)
    }

    /// Keeps a co-replica's receipt for our pseudo-gradient of `round`. `Ok(false)`: valid but
    /// not needed (duplicate signer, round full or forgotten, early buffer full).
    pub fn on_receipt(&mut self, round: u64, receipt: Receipt) -> Result<bool, EconomyError> {
        if receipt.kind != ReceiptKind::Gradients {
            return Err(ReceiptRefused::WrongKind(receipt.kind).into());
        }
        if receipt.signer == self.identity.public_key() {
            return Err(ReceiptRefused::SelfSigned.into());
        }
        receipt
            .signer
            .verify(
                &receipt.signed_bytes(self.node_id(), round),
                &receipt.signature,
            )
            .map_err(ReceiptRefused::Signature)?;
        if let Some(info) = self.rounds.iter_mut().find(|r| r.round == round) {
            if receipt.hash != info.hash {
                return Err(ReceiptRefused::HashMismatch { round }.into());
            }
            return Ok(push_receipt(&mut info.receipts, receipt));
        }
        let newest = self.rounds.back().map(|r| r.round);
        let is_future = newest.is_none_or(|n| round > n);
        let dup = self
            .early
            .iter()
            .any(|(r, e)| *r == round && e.signer == receipt.signer);
        if !is_future || dup || self.early.len() >= MAX_EARLY_RECEIPTS {
            return Ok(false);
        }
        self.early.push((round, receipt));
        Ok(true)
    }

    /// Adds one round's work to what the next proof will claim and remembers the round's
    /// pseudo-gradient hash for receipts.
    pub fn record_round(&mut self, work: WorkSummary) {
        self.remember_round(work.round, work.pseudo_gradient_hash);
        if work.batches == 0 || work.tokens == 0 {
            return;
        }
        match &mut self.work {
            Some(acc) => acc.add(work),
            None => self.work = Some(Accumulated::from_work(work)),
        }
    }

    fn remember_round(&mut self, round: u64, hash: Hash32) {
        let at = self.rounds.partition_point(|r| r.round < round);
        match self.rounds.get_mut(at) {
            Some(info) if info.round == round => {
                if info.hash != hash {
                    *info = RoundInfo {
                        round,
                        hash,
                        receipts: Vec::new(),
                    };
                }
            }
            _ => self.rounds.insert(
                at,
                RoundInfo {
                    round,
                    hash,
                    receipts: Vec::new(),
                },
            ),
        }
        while self.rounds.len() > ROUND_MEMORY {
            self.rounds.pop_front();
        }
        let Some(info) = self.rounds.iter_mut().find(|r| r.round == round) else {
            return;
        };
        for (_, receipt) in self.early.iter().filter(|(r, _)| *r == round) {
            if receipt.hash == hash {
                push_receipt(&mut info.receipts, *receipt);
            }
        }
        self.early.retain(|(r, _)| *r > round);
    }

    /// Builds, signs, verifies and applies one Training proof covering all accumulated work,
    /// if the interval has passed and a recorded round has enough receipts from known
    /// signers (or the node holds the whole model). Returns the wire bytes to gossip.
    pub fn poll_proof(&mut self, now_ms: u64) -> Option<Result<Vec<u8>, EconomyError>> {
        let work = self.work.as_ref()?;
        if self
            .last_proof_ms
            .is_some_and(|last| now_ms < last.saturating_add(self.min_interval_ms))
        {
            return None;
        }
        let whole_model = work.roles.contains(Roles::EMBEDDING.with(Roles::LM_HEAD));
        let known = |r: &RoundInfo| -> Vec<Receipt> {
            r.receipts
                .iter()
                .filter(|x| self.verifier.is_known(&x.signer))
                .take(MAX_RECEIPTS)
                .copied()
                .collect()
        };
        let (round, receipts) = self.rounds.iter().rev().find_map(|r| {
            let receipts = known(r);
            (whole_model || receipts.len() >= MIN_TRAINING_RECEIPTS).then(|| (r.clone(), receipts))
        })?;
        let (tokens, batches, claimed_duration_ms) = work.claim(self.hardware);
        let nonce = self
            .last_nonce
            .map_or(0, |n| n.saturating_add(1))
            .max(now_ms);
        let proof = Proof {
            node_id: self.identity.node_id(),
            public_key: self.identity.public_key(),
            kind: ProofKind::Training,
            round: round.round,
            timestamp_ms: now_ms,
            nonce,
            layers: work.layers,
            roles: work.roles,
            hardware: self.hardware,
            tokens,
            batches,
            shards: work.shards.clone(),
            input_activation_hash: [0; 32],
            output_activation_hash: [0; 32],
            model_hash_before: work.model_hash_before,
            model_hash_after: work.model_hash_after,
            pseudo_gradient_hash: round.hash,
            loss_micros: work.loss_micros,
            claimed_duration_ms,
            receipts,
        };
        // Failures back off for a whole interval instead of retrying on every poll.
        self.last_proof_ms = Some(now_ms);
        let signed = proof.sign(&self.identity);
        let wire = signed.to_bytes();
        let applied = self
            .verifier
            .check_content(&signed, now_ms)
            .map_err(EconomyError::from)
            .and_then(|v| self.apply_verified(&v, &wire).map(|_| ()));
        if let Err(e) = applied {
            return Some(Err(e));
        }
        self.last_nonce = Some(nonce);
        self.work = None;
        // Receipts vouch for one round's gradient: they never back a second proof.
        self.rounds.retain(|r| r.round > round.round);
        Some(Ok(wire))
    }

    /// The stages of this network, as the layers and roles a proof of each claims. Proofs
    /// that match none are refused (with no layout set, as in unit tests, any range goes).
    pub fn set_layout(&mut self, stages: Vec<(LayerRange, Roles)>) {
        self.layout = stages;
    }

    /// What the network produces: training proofs for one stage's layers and roles. A
    /// whole-model claim in a multi-stage network needs no receipt in the verifier, and
    /// Uptime, Verification and Inference proofs need none at all, so each would mint for
    /// free; none is made by any node here. Content-only, so every node decides alike.
    fn check_claim(&self, signed: &SignedProof) -> Result<(), String> {
        let p =
            <Proof as neuroshard_proof::Canonical>::from_canonical_bytes(signed.payload_bytes())
                .map_err(|e| format!("format: {e}"))?;
        if p.kind != ProofKind::Training {
            return Err(format!("the network does not produce {:?} proofs", p.kind));
        }
        if !self.layout.is_empty() && !self.layout.contains(&(p.layers, p.roles)) {
            return Err(format!(
                "layers {}..{} with roles {:?} are no stage of this network",
                p.layers.start, p.layers.end, p.roles
            ));
        }
        Ok(())
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
            return ProofOutcome::Duplicate;
        }
        if self.parked.iter().any(|p| p.hash == hash) {
            return ProofOutcome::Parked("already waiting for a receipt signer".into());
        }
        if let Err(reason) = self.check_claim(&signed) {
            return ProofOutcome::Rejected(reason);
        }
        match self.verifier.check_content(&signed, now_ms) {
            Ok(verified) => self.apply(&verified, wire),
            Err(VerifyError::Receipt(e @ ReceiptError::UnknownSigner { signer, .. })) => {
                if self.parked.len() >= MAX_PARKED {
                    self.parked.pop_front();
                }
                self.parked.push_back(ParkedProof {
                    hash,
                    wire: wire.to_vec(),
                    waiting_for: signer,
                    now_ms,
                });
                ProofOutcome::Parked(e.to_string())
            }
            Err(e) => ProofOutcome::Rejected(e.to_string()),
        }
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
            self.wires.insert(verified.hash(), wire.to_vec());
            let p = verified.proof();
            self.by_prover
                .entry(p.node_id)
                .or_default()
                .insert((p.nonce, verified.hash()));
            self.writes.push_back(LedgerWrite {
                proof: verified.clone(),
                wire: wire.to_vec(),
            });
        }
        Ok(outcome)
    }

    fn apply(&mut self, verified: &VerifiedProof, wire: &[u8]) -> ProofOutcome {
        match self.apply_verified(verified, wire) {
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

    pub fn parked_count(&self) -> usize {
        self.parked.len()
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

    /// The ledger state, for read-only queries (totals, accounts).
    pub fn ledger(&self) -> &LedgerState {
        &self.ledger
    }
}

/// Adds a receipt unless its signer is already there or the list is full.
fn push_receipt(receipts: &mut Vec<Receipt>, receipt: Receipt) -> bool {
    if receipts.len() >= RECEIPTS_PER_ROUND || receipts.iter().any(|r| r.signer == receipt.signer) {
        return false;
    }
    receipts.push(receipt);
    true
}

mod antientropy;
#[cfg(test)]
mod tests;

pub use antientropy::{
    LedgerSyncRequest, LedgerSyncResponse, MAX_INTRODUCTION, MAX_PROOF_WIRE,
    MAX_SYNC_INTRODUCTIONS, MAX_SYNC_PROOFS, MAX_SYNC_PROVERS, ProverSummary,
};
