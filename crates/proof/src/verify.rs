//! The proof verification pipeline as a sans-IO state machine.
//!
//! [`ProofVerifier::verify`] takes the wire bytes and `now_ms` and returns either a
//! [`VerifiedProof`] or the first failed step as a typed [`VerifyError`]. Steps, in order:
//! framing/version → low-S → signature → key/node-id binding → timestamp (±5 min) → replay
//! (proof hash, then (node id, nonce)) → rate (≤120 per node per sliding hour) → plausibility
//! (hardware limits, cumulative claimed time, the node's own history) → receipts.
//! Only a proof that passes every step changes the verifier's memory.
//!
//! [`ProofVerifier::check_content`] is the ledger's entry point: it runs only the steps whose
//! verdict is a function of the proof itself, so
//! every node that holds the same proofs reaches the same ledger whatever the arrival order.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::codec::{Canonical, CodecError};
use crate::envelope::EnvelopeError;
use crate::keys::{NodeId, PreparedKey, PublicKey, SignatureError, verify_with_key};
use crate::plausibility::{self, PlausibilityError, RateHistory};
use crate::proof::{Hash32, Proof, ProofKind, ReceiptKind, Roles, SignedProof};
use crate::tally::tally_jobs;

/// Largest allowed distance between a proof's timestamp and the verifier's clock.
pub const MAX_CLOCK_SKEW_MS: u64 = 5 * 60 * 1000;
/// The sliding rate window.
pub const RATE_WINDOW_MS: u64 = 60 * 60 * 1000;
/// Most proofs accepted from one node inside [`RATE_WINDOW_MS`].
pub const MAX_PROOFS_PER_WINDOW: usize = 120;
/// Training proofs need this many neighbour receipts unless the node held the whole model.
pub const MIN_TRAINING_RECEIPTS: usize = 1;
/// How often the verifier sweeps expired entries of all nodes.
pub const PRUNE_INTERVAL_MS: u64 = 10_000;
/// Decompressed public keys kept to skip point decompression on repeat signers.
pub const KEY_CACHE_CAPACITY: usize = 65_536;

/// Which replay rule caught a proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayKind {
    /// The exact signed bytes were seen before (also catches re-signed/malleated copies).
    ProofHash,
    /// Another proof from this node already used this nonce.
    Nonce,
    /// The nonce is below this node's floor (older nonces have expired from memory).
    NonceBelowFloor,
}

/// Why a receipt was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("receipt {index}: signer {signer} is not a known node")]
    UnknownSigner { index: usize, signer: PublicKey },
    #[error("receipt {index}: a node cannot sign a receipt for itself")]
    SelfSigned { index: usize },
    #[error("receipt {index}: signer appears twice")]
    DuplicateSigner { index: usize },
    #[error("receipt {index}: its {kind:?} hash is not the proof's (a work tally's: not a tally)")]
    HashMismatch { index: usize, kind: ReceiptKind },
    #[error("receipt {index}: {source}")]
    Signature {
        index: usize,
        source: SignatureError,
    },
    #[error("training proof has {got} receipts, needs {needed}")]
    Missing { got: usize, needed: usize },
}

/// The first verification step a proof failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("format: {0}")]
    Format(EnvelopeError),
    #[error("unsupported proof version {got} (supported: {supported})")]
    Version { got: u16, supported: u16 },
    #[error("signature is not low-S normalized")]
    HighS,
    #[error("signature: {0}")]
    Signature(SignatureError),
    #[error("signer key does not match the proof's public key or node id")]
    KeyMismatch,
    #[error("timestamp {timestamp_ms} is {age_ms} ms in the past (limit {MAX_CLOCK_SKEW_MS})")]
    Stale { timestamp_ms: u64, age_ms: u64 },
    #[error("timestamp {timestamp_ms} is {ahead_ms} ms in the future (limit {MAX_CLOCK_SKEW_MS})")]
    Future { timestamp_ms: u64, ahead_ms: u64 },
    #[error("replay ({0:?})")]
    Replay(ReplayKind),
    #[error(
        "rate: node already has {count} proofs in the last hour (limit {MAX_PROOFS_PER_WINDOW})"
    )]
    Rate { count: usize },
    #[error("implausible: {0}")]
    Implausible(#[from] PlausibilityError),
    #[error("receipt: {0}")]
    Receipt(#[from] ReceiptError),
}

/// A proof that passed every step. Only the verifier constructs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedProof {
    proof: Proof,
    hash: Hash32,
}

impl VerifiedProof {
    pub fn proof(&self) -> &Proof {
        &self.proof
    }

    /// BLAKE3 of the signed proof bytes (signature excluded).
    pub fn hash(&self) -> Hash32 {
        self.hash
    }
}

#[derive(Debug, Default)]
struct NodeState {
    /// (timestamp, nonce) of accepted proofs still inside the replay horizon.
    recent_nonces: VecDeque<(u64, u64)>,
    nonces: HashSet<u64>,
    /// Nonces at or below this were pruned and are refused outright.
    nonce_floor: Option<u64>,
    /// Arrival times (verifier clock) of accepted proofs in the rate window.
    arrivals: VecDeque<u64>,
    /// (arrival, kind, claimed ms) for the cumulative-time check.
    claimed: VecDeque<(u64, ProofKind, u64)>,
    history: RateHistory,
}

/// Sans-IO proof verifier: feed it bytes and the current time, get decisions.
#[derive(Debug, Default)]
pub struct ProofVerifier {
    known: HashSet<PublicKey>,
    keys: HashMap<PublicKey, PreparedKey>,
    seen: HashMap<Hash32, u64>,
    seen_order: VecDeque<(u64, Hash32)>,
    nodes: HashMap<NodeId, NodeState>,
    last_prune_ms: u64,
}

impl ProofVerifier {
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks a node as known (from its signed heartbeat or DHT record) so that its receipts
    /// count. Unknown signers cannot vouch for anyone.
    pub fn add_known_node(&mut self, key: PublicKey) {
        self.known.insert(key);
    }

    /// True if receipts signed by `key` count.
    pub fn is_known(&self, key: &PublicKey) -> bool {
        self.known.contains(key)
    }

    /// Parses, verifies and (on success) records a proof from its wire bytes.
    pub fn verify_bytes(
        &mut self,
        bytes: &[u8],
        now_ms: u64,
    ) -> Result<VerifiedProof, VerifyError> {
        let signed = SignedProof::from_bytes(bytes).map_err(VerifyError::Format)?;
        self.verify(&signed, now_ms)
    }

    /// Runs every step; records the proof only if all pass.
    pub fn verify(
        &mut self,
        signed: &SignedProof,
        now_ms: u64,
    ) -> Result<VerifiedProof, VerifyError> {
        // Full pruning walks every node, so it runs at most once per interval; the checks
        // below filter by time themselves and stay exact in between.
        if now_ms >= self.last_prune_ms.saturating_add(PRUNE_INTERVAL_MS) {
            self.prune(now_ms);
            self.last_prune_ms = now_ms;
        }
        let verified = self.check(signed, now_ms)?;
        self.record(&verified, now_ms);
        Ok(verified)
    }

    /// The decompressed key, from the cache or computed (not cached: see [`Self::remember`]).
    fn verifying_key(&self, key: &PublicKey) -> Result<PreparedKey, VerifyError> {
        match self.keys.get(key) {
            Some(vk) => Ok(*vk),
            None => key.prepare().map_err(VerifyError::Signature),
        }
    }

    /// Caches a key once a signature under it verified: garbage signatures under fresh keys
    /// must not flush the keys of the nodes that sign for real.
    fn remember(&mut self, key: &PublicKey, vk: PreparedKey) {
        if self.keys.contains_key(key) {
            return;
        }
        if self.keys.len() >= KEY_CACHE_CAPACITY {
            // Crude but bounded: a full cache is rebuilt from the keys seen next.
            self.keys.clear();
        }
        self.keys.insert(*key, vk);
    }

    /// Keys cached for verification.
    pub fn cached_keys(&self) -> usize {
        self.keys.len()
    }

    /// All checks without recording (callers that want a dry run, e.g. `verify-proof`).
    pub fn check(
        &mut self,
        signed: &SignedProof,
        now_ms: u64,
    ) -> Result<VerifiedProof, VerifyError> {
        let (proof, hash) = self.authenticate(signed)?;
        check_timestamp(proof.timestamp_ms, now_ms)?;
        self.check_replay(&proof, &hash)?;
        let state = self.nodes.get(&proof.node_id);
        let window_start = now_ms.saturating_sub(RATE_WINDOW_MS);
        let count = state.map_or(0, |s| {
            s.arrivals.iter().filter(|&&t| t > window_start).count()
        });
        if count >= MAX_PROOFS_PER_WINDOW {
            return Err(VerifyError::Rate { count });
        }
        plausibility::check_static(&proof)?;
        if let Some(state) = state {
            check_cumulative(state, &proof, window_start)?;
            if matches!(proof.kind, ProofKind::Training | ProofKind::Inference) {
                state
                    .history
                    .check(plausibility::layer_token_rate(&proof))?;
            }
        }
        self.check_receipts(&proof, true)?;
        Ok(VerifiedProof { proof, hash })
    }

    /// The order-independent subset of [`Self::check`], for applying proofs to the ledger.
    ///
    /// Runs low-S → signature → key/node-id binding → timestamp at most [`MAX_CLOCK_SKEW_MS`]
    /// in the future → static plausibility → receipts, and records nothing. Left out on
    /// purpose, because their verdict depends on when and in which order this node saw
    /// proofs: the staleness bound (a node catching up after a restart, or via anti-entropy,
    /// receives proofs hours old), replay memory and the hourly rate and cumulative-time
    /// windows (they count arrivals), and the node's rate history (it depends on which of the
    /// node's proofs came first). The ledger dedups by proof hash and (node, nonce) instead.
    /// Whether a receipt's signer may vouch for the prover is not checked here: that is
    /// ledger state (the signer's registration), which the caller checks.
    pub fn check_content(
        &mut self,
        signed: &SignedProof,
        now_ms: u64,
    ) -> Result<VerifiedProof, VerifyError> {
        let (proof, hash) = self.authenticate(signed)?;
        if proof.timestamp_ms > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
            return Err(VerifyError::Future {
                timestamp_ms: proof.timestamp_ms,
                ahead_ms: proof.timestamp_ms - now_ms,
            });
        }
        plausibility::check_static(&proof)?;
        self.check_receipts(&proof, false)?;
        Ok(VerifiedProof { proof, hash })
    }

    /// Signature (low-S first), decoding and key/node-id binding: the steps every entry point
    /// shares.
    fn authenticate(&mut self, signed: &SignedProof) -> Result<(Proof, Hash32), VerifyError> {
        // Low-S before the curve math: the malleated twin of a valid signature must fail here.
        if signed.signature().is_high_s() {
            return Err(VerifyError::HighS);
        }
        let vk = self.verifying_key(&signed.signer())?;
        verify_with_key(&vk, signed.payload_bytes(), &signed.signature())
            .map_err(VerifyError::Signature)?;
        self.remember(&signed.signer(), vk);
        let proof = Proof::from_canonical_bytes(signed.payload_bytes()).map_err(|e| match e {
            CodecError::Version { got, supported } => VerifyError::Version { got, supported },
            other => VerifyError::Format(EnvelopeError::Payload(other)),
        })?;
        if proof.public_key != signed.signer() || proof.node_id != proof.public_key.node_id() {
            return Err(VerifyError::KeyMismatch);
        }
        Ok((proof, signed.payload_hash()))
    }

    fn check_replay(&self, proof: &Proof, hash: &Hash32) -> Result<(), VerifyError> {
        if self.seen.contains_key(hash) {
            return Err(VerifyError::Replay(ReplayKind::ProofHash));
        }
        if let Some(state) = self.nodes.get(&proof.node_id) {
            if state.nonce_floor.is_some_and(|floor| proof.nonce <= floor) {
                return Err(VerifyError::Replay(ReplayKind::NonceBelowFloor));
            }
            if state.nonces.contains(&proof.nonce) {
                return Err(VerifyError::Replay(ReplayKind::Nonce));
            }
        }
        Ok(())
    }

    /// `known_only`: refuse receipts whose signer is not in the verifier's known set.
    fn check_receipts(&mut self, proof: &Proof, known_only: bool) -> Result<(), VerifyError> {
        let whole_model = proof.roles.contains(Roles::EMBEDDING.with(Roles::LM_HEAD));
        if proof.kind == ProofKind::Training
            && !whole_model
            && proof.receipts.len() < MIN_TRAINING_RECEIPTS
        {
            return Err(ReceiptError::Missing {
                got: proof.receipts.len(),
                needed: MIN_TRAINING_RECEIPTS,
            }
            .into());
        }
        let mut signers = HashSet::new();
        for (index, receipt) in proof.receipts.iter().enumerate() {
            if receipt.signer == proof.public_key {
                return Err(ReceiptError::SelfSigned { index }.into());
            }
            if known_only && !self.known.contains(&receipt.signer) {
                return Err(ReceiptError::UnknownSigner {
                    index,
                    signer: receipt.signer,
                }
                .into());
            }
            if !signers.insert(receipt.signer) {
                return Err(ReceiptError::DuplicateSigner { index }.into());
            }
            let matches = match receipt.kind {
                ReceiptKind::Activations => tally_jobs(&receipt.hash).is_some(),
                ReceiptKind::Gradients => receipt.hash == proof.pseudo_gradient_hash,
            };
            if !matches {
                return Err(ReceiptError::HashMismatch {
                    index,
                    kind: receipt.kind,
                }
                .into());
            }
            let vk = self.verifying_key(&receipt.signer)?;
            verify_with_key(
                &vk,
                &receipt.signed_bytes(proof.network, proof.node_id, proof.round),
                &receipt.signature,
            )
            .map_err(|source| ReceiptError::Signature { index, source })?;
            self.remember(&receipt.signer, vk);
        }
        Ok(())
    }

    fn record(&mut self, verified: &VerifiedProof, now_ms: u64) {
        let proof = &verified.proof;
        self.seen.insert(verified.hash, proof.timestamp_ms);
        self.seen_order
            .push_back((proof.timestamp_ms, verified.hash));
        let state = self.nodes.entry(proof.node_id).or_default();
        state
            .recent_nonces
            .push_back((proof.timestamp_ms, proof.nonce));
        state.nonces.insert(proof.nonce);
        state.arrivals.push_back(now_ms);
        state
            .claimed
            .push_back((now_ms, proof.kind, proof.claimed_duration_ms));
        if matches!(proof.kind, ProofKind::Training | ProofKind::Inference) {
            state.history.record(plausibility::layer_token_rate(proof));
        }
    }

    /// Forgets what can no longer matter: proof hashes whose timestamps are too old to pass
    /// the timestamp check, and rate entries outside the window. Pruned nonces raise the
    /// node's nonce floor, so an old nonce stays refused with bounded memory.
    pub fn prune(&mut self, now_ms: u64) {
        let horizon = now_ms.saturating_sub(MAX_CLOCK_SKEW_MS);
        // Hash order is by insertion, not timestamp; entries are dropped once they reach the
        // front and are old, which bounds memory to roughly the proofs of the last horizon.
        while let Some(&(ts, hash)) = self.seen_order.front() {
            if ts >= horizon {
                break;
            }
            self.seen.remove(&hash);
            self.seen_order.pop_front();
        }
        let window_start = now_ms.saturating_sub(RATE_WINDOW_MS);
        for state in self.nodes.values_mut() {
            while let Some(&(ts, nonce)) = state.recent_nonces.front() {
                if ts >= horizon {
                    break;
                }
                state.recent_nonces.pop_front();
                state.nonces.remove(&nonce);
                state.nonce_floor = Some(state.nonce_floor.map_or(nonce, |f| f.max(nonce)));
            }
            while state.arrivals.front().is_some_and(|&t| t <= window_start) {
                state.arrivals.pop_front();
            }
            while state
                .claimed
                .front()
                .is_some_and(|&(t, _, _)| t <= window_start)
            {
                state.claimed.pop_front();
            }
        }
    }
}

fn check_timestamp(timestamp_ms: u64, now_ms: u64) -> Result<(), VerifyError> {
    if timestamp_ms.saturating_add(MAX_CLOCK_SKEW_MS) < now_ms {
        return Err(VerifyError::Stale {
            timestamp_ms,
            age_ms: now_ms - timestamp_ms,
        });
    }
    if timestamp_ms > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
        return Err(VerifyError::Future {
            timestamp_ms,
            ahead_ms: timestamp_ms - now_ms,
        });
    }
    Ok(())
}

/// A node cannot claim more time of one kind inside the window than the window (plus the
/// clock skew allowance) holds.
fn check_cumulative(
    state: &NodeState,
    proof: &Proof,
    window_start: u64,
) -> Result<(), PlausibilityError> {
    let max = RATE_WINDOW_MS + MAX_CLOCK_SKEW_MS;
    let got = state
        .claimed
        .iter()
        .filter(|(t, kind, _)| *t > window_start && *kind == proof.kind)
        .map(|(_, _, ms)| *ms)
        .sum::<u64>()
        .saturating_add(proof.claimed_duration_ms);
    if got > max {
        return Err(PlausibilityError::CumulativeDuration {
            kind: proof.kind,
            got,
            max,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
