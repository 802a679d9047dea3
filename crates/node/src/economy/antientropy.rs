//! Ledger anti-entropy: a node asks a random peer for the proofs it lacks. Proofs are not
//! gossiped to everyone (that costs every node one message per proof of the network); they
//! spread this way, many per message.
//!
//! A proof counts only if its receipt signers are known, and a node hears heartbeats of its
//! own stage and its neighbours only. So an answer also carries the *introductions* of the
//! keys its proofs name: the signed heartbeats that made those keys known to the answering
//! node. The requester checks each one itself (signature, network, signer = node), so an
//! introduction is worth exactly what a heartbeat heard directly is worth, no more.

use std::collections::{BTreeSet, HashMap};

use neuroshard_proof::{
    Canonical, CodecError, Hash32, NodeId, Proof, PublicKey, Reader, SignedProof, Writer,
};

use super::{Economy, EconomyError, SyncSummary};
use crate::records::Heartbeat;

/// Most provers a [`LedgerSyncRequest`] may summarise (3.4 MiB); a larger network's request
/// leaves some out and their proofs come again (duplicates, never a loss).
pub const MAX_SYNC_PROVERS: usize = 1 << 16;
/// Most proofs a [`LedgerSyncResponse`] may carry.
pub const MAX_SYNC_PROOFS: usize = 1024;
/// Largest wire form of one proof in a [`LedgerSyncResponse`] (real proofs are under 14 KiB).
pub const MAX_PROOF_WIRE: usize = 64 * 1024;
/// Most introductions one answer carries.
pub const MAX_SYNC_INTRODUCTIONS: usize = 4096;
/// Largest introduction (a signed heartbeat is about 200 bytes).
pub const MAX_INTRODUCTION: usize = 1024;

/// What a node holds of one prover's proofs: enough to tell, without listing them, whether
/// another node holds the same ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProverSummary {
    pub node: NodeId,
    pub count: u32,
    pub max_nonce: u64,
    /// XOR of the first 8 bytes of every held proof hash.
    pub digest: u64,
}

/// "This is what I hold, prover by prover": the receiver answers with what is missing. Its
/// size grows with the number of provers, not with the number of proofs ever made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerSyncRequest {
    pub provers: Vec<ProverSummary>,
}

/// Signed proof wire bytes the requester lacked, and the signed heartbeats that introduce
/// the keys those proofs name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerSyncResponse {
    pub proofs: Vec<Vec<u8>>,
    pub introductions: Vec<Vec<u8>>,
}

impl Canonical for LedgerSyncRequest {
    const DOMAIN: &'static str = "neuroshard/ledger-sync-request/v2";

    fn encode_body(&self, w: &mut Writer) {
        w.len(self.provers.len());
        for p in &self.provers {
            w.fixed(&p.node.0);
            w.u32(p.count);
            w.u64(p.max_nonce);
            w.u64(p.digest);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let n = r.len(MAX_SYNC_PROVERS)?;
        let provers = (0..n)
            .map(|_| {
                Ok(ProverSummary {
                    node: NodeId(r.array()?),
                    count: r.u32()?,
                    max_nonce: r.u64()?,
                    digest: r.u64()?,
                })
            })
            .collect::<Result<_, CodecError>>()?;
        Ok(Self { provers })
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
    /// This node's holdings, prover by prover (at most [`MAX_SYNC_PROVERS`]).
    pub fn sync_request(&self) -> Result<LedgerSyncRequest, EconomyError> {
        let provers = self
            .by_prover
            .iter()
            .take(MAX_SYNC_PROVERS)
            .map(|(node, held)| summarise(*node, held))
            .collect();
        Ok(LedgerSyncRequest { provers })
    }

    /// Wire bytes of proofs this node holds that the summaries say the requester lacks, at
    /// most `max_bytes` in total and [`MAX_SYNC_PROOFS`] in number. First every prover's
    /// proofs above the requester's highest nonce, then, for provers whose summaries still
    /// differ (the requester has holes), the rest of theirs.
    pub fn proofs_missing_for(
        &self,
        request: &LedgerSyncRequest,
        max_bytes: usize,
    ) -> Result<Vec<Vec<u8>>, EconomyError> {
        let theirs: HashMap<&NodeId, &ProverSummary> =
            request.provers.iter().map(|p| (&p.node, p)).collect();
        let mut newer = Vec::new();
        let mut holes = Vec::new();
        for (node, held) in &self.by_prover {
            let summary = theirs.get(node);
            if summary.is_some_and(|s| **s == summarise(*node, held)) {
                continue;
            }
            let Some(s) = summary else {
                newer.extend(held.iter().map(|(_, h)| *h));
                continue;
            };
            let older: BTreeSet<(u64, Hash32)> = held
                .iter()
                .filter(|(nonce, _)| *nonce <= s.max_nonce)
                .copied()
                .collect();
            newer.extend(
                held.iter()
                    .filter(|(nonce, _)| *nonce > s.max_nonce)
                    .map(|(_, h)| *h),
            );
            // Up to their highest nonce they lack one of ours if they hold fewer, or as many
            // but others. Holding more, they are the ones to answer: they will be asked.
            let mine = summarise(*node, &older);
            if mine.count >= s.count && mine.digest != s.digest {
                holes.extend(older.into_iter().map(|(_, h)| h));
            }
        }
        let mut out = Vec::new();
        let mut used = 0usize;
        for hash in newer.into_iter().chain(holes) {
            let Some(wire) = self.wires.get(&hash) else {
                continue;
            };
            used = used.saturating_add(wire.len());
            if out.len() >= MAX_SYNC_PROOFS || used > max_bytes {
                break;
            }
            out.push(wire.clone());
        }
        Ok(out)
    }

    /// The answer to a peer's [`LedgerSyncRequest`]: the proofs it lacks (at most
    /// `max_bytes`) and the introductions of their provers and receipt signers.
    pub fn answer_sync(
        &self,
        request: &LedgerSyncRequest,
        max_bytes: usize,
    ) -> Result<LedgerSyncResponse, EconomyError> {
        let proofs = self.proofs_missing_for(request, max_bytes)?;
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
    let hb = signed.verify().ok()?;
    (hb.node == key.node_id() && hb.network == *network).then_some(key)
}

/// What `held` (one prover's proofs: nonce and hash) looks like from outside.
fn summarise(node: NodeId, held: &BTreeSet<(u64, Hash32)>) -> ProverSummary {
    let mut digest = 0u64;
    for (_, hash) in held {
        let mut first = [0u8; 8];
        first.copy_from_slice(&hash[..8]);
        digest ^= u64::from_le_bytes(first);
    }
    ProverSummary {
        node,
        count: u32::try_from(held.len()).unwrap_or(u32::MAX),
        max_nonce: held.last().map_or(0, |(n, _)| *n),
        digest,
    }
}

/// The prover and nonce of a proof's wire bytes (no signature check: for indexing proofs
/// already verified).
pub(super) fn prover_and_nonce(wire: &[u8]) -> Option<(NodeId, u64)> {
    let signed = SignedProof::from_bytes(wire).ok()?;
    let p = Proof::from_canonical_bytes(signed.payload_bytes()).ok()?;
    Some((p.node_id, p.nonce))
}
