//! Ledger anti-entropy: a node asks a random peer for the proofs and account ops it lacks.
//! Proofs are not gossiped to everyone (that costs every node one message per proof of the
//! network); they spread this way, many per message.
//!
//! A proof counts only once its prover and receipt signers are registered, which is ledger
//! state carried by signed ops. So a request also says how far it holds each account's ops,
//! and an answer carries the ops the requester lacks before the proofs that need them; the
//! requester verifies each op itself, so an answer cannot register anyone.

use std::collections::{BTreeSet, HashMap};

use neuroshard_proof::{Canonical, CodecError, Hash32, NodeId, Proof, Reader, SignedProof, Writer};

use super::{Economy, EconomyError, SyncSummary};

/// Most provers a [`LedgerSyncRequest`] may summarise (3.4 MiB); a larger network's request
/// leaves some out and their proofs come again (duplicates, never a loss).
pub const MAX_SYNC_PROVERS: usize = 1 << 16;
/// Most proofs a [`LedgerSyncResponse`] may carry.
pub const MAX_SYNC_PROOFS: usize = 1024;
/// Largest wire form of one proof in a [`LedgerSyncResponse`] (real proofs are under 14 KiB).
pub const MAX_PROOF_WIRE: usize = 64 * 1024;
/// Most accounts a request may say it holds ops of.
pub const MAX_SYNC_ACCOUNTS: usize = 1 << 16;
/// Most ops one answer carries.
pub const MAX_SYNC_OPS: usize = 4096;
/// Largest signed op (real ones are under 300 bytes).
pub const MAX_OP_WIRE: usize = 1024;

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

/// "This is what I hold, prover by prover and account by account": the receiver answers with
/// what is missing. Its size grows with the number of provers and accounts, not with the
/// number of proofs ever made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerSyncRequest {
    pub provers: Vec<ProverSummary>,
    /// (account, next op nonce) for every account with at least one applied op.
    pub accounts: Vec<(NodeId, u64)>,
}

/// Signed proof and op wire bytes the requester lacked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerSyncResponse {
    pub proofs: Vec<Vec<u8>>,
    pub ops: Vec<Vec<u8>>,
}

impl Canonical for LedgerSyncRequest {
    const DOMAIN: &'static str = "neuroshard/ledger-sync-request/v3";

    fn encode_body(&self, w: &mut Writer) {
        w.len(self.provers.len());
        for p in &self.provers {
            w.fixed(&p.node.0);
            w.u32(p.count);
            w.u64(p.max_nonce);
            w.u64(p.digest);
        }
        w.len(self.accounts.len());
        for (account, next) in &self.accounts {
            w.fixed(&account.0);
            w.u64(*next);
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
        let n = r.len(MAX_SYNC_ACCOUNTS)?;
        let accounts = (0..n)
            .map(|_| Ok((NodeId(r.array()?), r.u64()?)))
            .collect::<Result<_, CodecError>>()?;
        Ok(Self { provers, accounts })
    }
}

impl Canonical for LedgerSyncResponse {
    const DOMAIN: &'static str = "neuroshard/ledger-sync-response/v3";

    fn encode_body(&self, w: &mut Writer) {
        w.len(self.proofs.len());
        for p in &self.proofs {
            w.bytes(p);
        }
        w.len(self.ops.len());
        for o in &self.ops {
            w.bytes(o);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let n = r.len(MAX_SYNC_PROOFS)?;
        let proofs = (0..n)
            .map(|_| r.bytes(MAX_PROOF_WIRE).map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        let n = r.len(MAX_SYNC_OPS)?;
        let ops = (0..n)
            .map(|_| r.bytes(MAX_OP_WIRE).map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        Ok(Self { proofs, ops })
    }
}

impl Economy {
    /// This node's holdings, prover by prover (at most [`MAX_SYNC_PROVERS`]) and account by
    /// account (at most [`MAX_SYNC_ACCOUNTS`]).
    pub fn sync_request(&self) -> Result<LedgerSyncRequest, EconomyError> {
        let provers = self
            .by_prover
            .iter()
            .take(MAX_SYNC_PROVERS)
            .map(|(_, held)| held.summary)
            .collect();
        let accounts = self
            .ledger
            .accounts()
            .filter(|(_, a)| a.next_nonce > 0)
            .take(MAX_SYNC_ACCOUNTS)
            .map(|(id, a)| (*id, a.next_nonce))
            .collect();
        Ok(LedgerSyncRequest { provers, accounts })
    }

    /// Ops the requester lacks: for every account, ours from its next nonce on.
    fn ops_missing_for(&self, request: &LedgerSyncRequest, max_bytes: usize) -> Vec<Vec<u8>> {
        let theirs: HashMap<&NodeId, u64> = request.accounts.iter().map(|(a, n)| (a, *n)).collect();
        let mut out = Vec::new();
        let mut used = 0usize;
        for (id, account) in self.ledger.accounts() {
            let from = theirs.get(id).copied().unwrap_or(0);
            if account.next_nonce <= from {
                continue;
            }
            for wire in self.ops_from(*id, from) {
                used = used.saturating_add(wire.len());
                if out.len() >= MAX_SYNC_OPS || used > max_bytes {
                    return out;
                }
                out.push(wire.clone());
            }
        }
        out
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
            if summary.is_some_and(|s| **s == held.summary) {
                continue;
            }
            let Some(s) = summary else {
                newer.extend(held.proofs.iter().map(|(_, h)| *h));
                continue;
            };
            let older: BTreeSet<(u64, Hash32)> = held
                .proofs
                .iter()
                .filter(|(nonce, _)| *nonce <= s.max_nonce)
                .copied()
                .collect();
            newer.extend(
                held.proofs
                    .iter()
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
            out.push(wire.to_vec());
        }
        Ok(out)
    }

    /// The answer to a peer's [`LedgerSyncRequest`]: the ops and proofs it lacks, at most
    /// `max_bytes` of each.
    pub fn answer_sync(
        &self,
        request: &LedgerSyncRequest,
        max_bytes: usize,
    ) -> Result<LedgerSyncResponse, EconomyError> {
        Ok(LedgerSyncResponse {
            proofs: self.proofs_missing_for(request, max_bytes)?,
            ops: self.ops_missing_for(request, max_bytes),
        })
    }

    /// Applies a sync response: its ops first (registrations that its proofs may need), then
    /// its proofs, each as if it arrived on its own.
    pub fn on_sync_response(&mut self, response: &LedgerSyncResponse, now_ms: u64) -> SyncSummary {
        let mut summary = SyncSummary::default();
        for wire in &response.ops {
            let (_, retried) = self.on_op(wire, now_ms);
            summary.add(retried);
        }
        for wire in &response.proofs {
            let outcome = self.on_proof(wire, now_ms);
            summary.count(&outcome);
        }
        summary
    }
}

/// One prover's applied proofs (nonce, hash) and their summary, kept as proofs arrive:
/// answering a request compares summaries without walking every prover's proofs.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub proofs: BTreeSet<(u64, Hash32)>,
    pub summary: ProverSummary,
}

impl Held {
    pub fn new(node: NodeId) -> Self {
        Self {
            proofs: BTreeSet::new(),
            summary: summarise(node, &BTreeSet::new()),
        }
    }

    pub fn insert(&mut self, nonce: u64, hash: Hash32) {
        if self.proofs.insert((nonce, hash)) {
            let s = &mut self.summary;
            s.count = s.count.saturating_add(1);
            s.max_nonce = s.max_nonce.max(nonce);
            s.digest ^= digest_word(&hash);
        }
    }
}

fn digest_word(hash: &Hash32) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash[..8]);
    u64::from_le_bytes(first)
}

/// What `held` (one prover's proofs: nonce and hash) looks like from outside.
fn summarise(node: NodeId, held: &BTreeSet<(u64, Hash32)>) -> ProverSummary {
    let mut digest = 0u64;
    for (_, hash) in held {
        digest ^= digest_word(hash);
    }
    ProverSummary {
        node,
        count: u32::try_from(held.len()).unwrap_or(u32::MAX),
        max_nonce: held.last().map_or(0, |(n, _)| *n),
        digest,
    }
}

#[cfg(test)]
#[test]
fn a_kept_summary_equals_one_rebuilt() {
    let node = NodeId([5; 32]);
    let mut held = Held::new(node);
    for (nonce, byte) in [(3u64, 1u8), (1, 2), (3, 1), (7, 9)] {
        held.insert(nonce, [byte; 32]);
    }
    assert_eq!(held.summary, summarise(node, &held.proofs));
    assert_eq!(held.summary.count, 3);
}

/// The prover and nonce of a proof's wire bytes (no signature check: for indexing proofs
/// already verified).
pub(super) fn prover_and_nonce(wire: &[u8]) -> Option<(NodeId, u64)> {
    let signed = SignedProof::from_bytes(wire).ok()?;
    let p = Proof::from_canonical_bytes(signed.payload_bytes()).ok()?;
    Some((p.node_id, p.nonce))
}
