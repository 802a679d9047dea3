//! Ledger anti-entropy: a node asks a random peer for the proofs it lacks. Proofs are not
//! gossiped to everyone (that costs every node one message per proof of the network); they
//! spread this way, many per message.
//!
//! A proof counts only if its receipt signers are known, and a node hears heartbeats of its
//! own stage and its neighbours only. So an answer also carries the *introductions* of the
//! keys its proofs name: the signed heartbeats that made those keys known to the answering
//! node. The requester checks each one itself (signature, network, signer = node), so an
//! introduction is worth exactly what a heartbeat heard directly is worth, no more.

use std::collections::{BTreeSet, HashSet};

use neuroshard_proof::{
    Canonical, CodecError, Hash32, Proof, PublicKey, Reader, SignedProof, Writer,
};

use super::{Economy, EconomyError, SyncSummary};
use crate::records::{Heartbeat, open};

/// Most hashes a [`LedgerSyncRequest`] may list (4 MiB).
pub const MAX_SYNC_HAVE: usize = 1 << 17;
/// Most proofs a [`LedgerSyncResponse`] may carry.
pub const MAX_SYNC_PROOFS: usize = 1024;
/// Largest wire form of one proof in a [`LedgerSyncResponse`] (real proofs are under 14 KiB).
pub const MAX_PROOF_WIRE: usize = 64 * 1024;
/// Most introductions one answer carries.
pub const MAX_SYNC_INTRODUCTIONS: usize = 4096;
/// Largest introduction (a signed heartbeat is about 200 bytes).
pub const MAX_INTRODUCTION: usize = 1024;

/// "These are the proofs I hold": the receiver answers with the ones missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSyncRequest {
    pub have: Vec<Hash32>,
}

/// Signed proof wire bytes the requester lacked, and the signed heartbeats that introduce
/// the keys those proofs name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerSyncResponse {
    pub proofs: Vec<Vec<u8>>,
    pub introductions: Vec<Vec<u8>>,
}

impl Canonical for LedgerSyncRequest {
    const DOMAIN: &'static str = "neuroshard/ledger-sync-request/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.len(self.have.len());
        for h in &self.have {
            w.fixed(h);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let n = r.len(MAX_SYNC_HAVE)?;
        let have = (0..n).map(|_| r.array()).collect::<Result<_, _>>()?;
        Ok(Self { have })
    }
}

impl Canonical for LedgerSyncResponse {
    const DOMAIN: &'static str = "neuroshard/ledger-sync-response/v2";

    fn encode_body(&self, w: &mut Writer) {
        w.len(self.proofs.len());
        for p in &self.proofs {
            w.bytes(p);
        }
        w.len(self.introductions.len());
        for i in &self.introductions {
            w.bytes(i);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let n = r.len(MAX_SYNC_PROOFS)?;
        let proofs = (0..n)
            .map(|_| r.bytes(MAX_PROOF_WIRE).map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        let n = r.len(MAX_SYNC_INTRODUCTIONS)?;
        let introductions = (0..n)
            .map(|_| r.bytes(MAX_INTRODUCTION).map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            proofs,
            introductions,
        })
    }
}

impl Economy {
    /// Wire bytes of proofs this node holds and `theirs` lacks, in hash order, at most
    /// `max_bytes` in total and [`MAX_SYNC_PROOFS`] in number.
    pub fn proofs_missing_from(
        &self,
        theirs: &[Hash32],
        max_bytes: usize,
    ) -> Result<Vec<Vec<u8>>, EconomyError> {
        let theirs: HashSet<&Hash32> = theirs.iter().collect();
        let mut out = Vec::new();
        let mut used = 0usize;
        for (hash, wire) in &self.wires {
            if out.len() >= MAX_SYNC_PROOFS {
                break;
            }
            if theirs.contains(hash) {
                continue;
            }
            used = used.saturating_add(wire.len());
            if used > max_bytes {
                break;
            }
            out.push(wire.clone());
        }
        Ok(out)
    }

    /// The request that asks a peer for what this node lacks (truncated to
    /// [`MAX_SYNC_HAVE`] hashes).
    pub fn sync_request(&self) -> Result<LedgerSyncRequest, EconomyError> {
        let mut have = self.proof_hashes()?;
        have.truncate(MAX_SYNC_HAVE);
        Ok(LedgerSyncRequest { have })
    }

    /// The answer to a peer's [`LedgerSyncRequest`]: the proofs it lacks (at most
    /// `max_bytes`) and the introductions of their provers and receipt signers.
    pub fn answer_sync(
        &self,
        request: &LedgerSyncRequest,
        max_bytes: usize,
    ) -> Result<LedgerSyncResponse, EconomyError> {
        let proofs = self.proofs_missing_from(&request.have, max_bytes)?;
        let mut keys = BTreeSet::new();
        for wire in &proofs {
            if let Ok(p) = SignedProof::from_bytes(wire)
                && let Ok(p) = Proof::from_canonical_bytes(p.payload_bytes())
            {
                keys.insert(p.public_key);
                keys.extend(p.receipts.iter().map(|r| r.signer));
            }
        }
        let introductions = keys
            .iter()
            .filter_map(|k| self.introductions.get(k).cloned())
            .take(MAX_SYNC_INTRODUCTIONS)
            .collect();
        Ok(LedgerSyncResponse {
            proofs,
            introductions,
        })
    }

    /// Learns the keys a sync response introduces (each checked here), then applies its
    /// proofs as if each arrived on its own.
    pub fn on_sync_response(
        &mut self,
        response: &LedgerSyncResponse,
        network: &Hash32,
        now_ms: u64,
    ) -> SyncSummary {
        let mut summary = SyncSummary::default();
        for intro in &response.introductions {
            if let Some(key) = introduced_key(intro, network) {
                summary.add(self.learn_node(key, intro));
            }
        }
        for wire in &response.proofs {
            let outcome = self.on_proof(wire, now_ms);
            summary.count(&outcome);
        }
        summary
    }
}

/// The key a signed heartbeat of `network` introduces, if it is one: signed by the node it
/// names (the same check as a heartbeat heard directly).
pub fn introduced_key(bytes: &[u8], network: &Hash32) -> Option<PublicKey> {
    let signed = neuroshard_proof::Signed::<Heartbeat>::from_bytes(bytes).ok()?;
    let key = signed.signer();
    let hb = open::<Heartbeat>(bytes, Some(&key.node_id())).ok()?;
    (hb.node == key.node_id() && hb.network == *network).then_some(key)
}
