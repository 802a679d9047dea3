//! Ledger anti-entropy: a node reconciles its ledger items (applied proofs and account ops,
//! by hash) with a random peer's, and fetches what it lacks. Proofs are not gossiped to
//! everyone (that costs every node one message per proof of the network); they spread this
//! way, many per message.
//!
//! Reconciliation is range-based ([`super::reconcile`]): a session is a few round trips whose
//! size grows with the number of differences, whatever the number of provers, accounts or
//! proofs. Each request also names up to [`MAX_SYNC_WANT`] ids the earlier answers showed the
//! peer holds and we lack; the answer carries their signed wire bytes, ops first. A proof
//! counts only once its prover and receipt signers are registered (ledger state carried by
//! ops), and the requester verifies every item itself, so an answer cannot register anyone.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use neuroshard_proof::{Canonical, CodecError, Hash32, NodeId, Reader, SignedProof, Writer};

use super::reconcile::{self, MAX_NEG_BYTES, Session, SyncSet};
use super::{Economy, ProofOutcome, SyncSummary};

/// Most proofs a [`LedgerSyncResponse`] may carry.
pub const MAX_SYNC_PROOFS: usize = 1024;
/// Largest wire form of one proof in a [`LedgerSyncResponse`] (real proofs are under 14 KiB).
pub const MAX_PROOF_WIRE: usize = 64 * 1024;
/// Most ops one answer carries.
pub const MAX_SYNC_OPS: usize = 4096;
/// Largest signed op (real ones are under 300 bytes).
pub const MAX_OP_WIRE: usize = 1024;
/// Most fraud reports one answer carries.
pub const MAX_SYNC_REPORTS: usize = 4;
/// Largest fraud report carried (what gossip carries: one micro-batch's evidence).
pub const MAX_REPORT_WIRE: usize = 1 << 20;
/// Bytes of fraud reports a node keeps to relay, the oldest dropped first. Each verdict
/// costs its loser stake, so there are few; a node that dropped one still holds its verdict.
pub const MAX_REPORT_BYTES: usize = 64 << 20;
/// Most ids one request asks for.
pub const MAX_SYNC_WANT: usize = reconcile::MAX_WANT;
/// Sessions this node runs at once (one per peer; the oldest gives way).
pub const MAX_SYNC_SESSIONS: usize = 8;
/// Least time between two rebuilds of the snapshot answers are computed from: a request flood
/// cannot make the node sort its whole ledger for each one. Items newer than the snapshot are
/// simply offered a little later.
pub const SNAPSHOT_EVERY_MS: u64 = 1_000;
/// Own ops added to the answer to a session's first request.
pub const OWN_OPS_PUSHED: usize = 8;
/// The most recently applied ops added to it too.
pub const RECENT_OPS_PUSHED: usize = 32;
/// How long an item this node refused is not asked for again, unless its ledger's registry
/// moves first (a joiner refuses what needs registrations it has not learned yet, and takes
/// it as soon as it does). Two ledgers may hold items the other refuses for good (each keeps
/// the pair of proofs it saw for a void slot), and without this every session between them
/// would fetch those again.
pub const REFUSED_FOR_MS: u64 = 10 * 60 * 1_000;
/// Most refused items remembered (when full, expired ones go; if none, the newest is not kept).
pub const MAX_REFUSED: usize = 65_536;

/// One step of a reconciliation: the next range message (empty when only ids are asked for)
/// and the ids the requester wants.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerSyncRequest {
    pub neg: Vec<u8>,
    pub want: Vec<Hash32>,
}

/// The answer: the range message (empty when none was asked), then the signed wire bytes of
/// the wanted items held.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LedgerSyncResponse {
    pub neg: Vec<u8>,
    pub proofs: Vec<Vec<u8>>,
    pub ops: Vec<Vec<u8>>,
    /// Fraud reports whose verdicts the answering ledger applied: the requester settles each
    /// itself (a verdict is never taken on trust).
    pub reports: Vec<Vec<u8>>,
}

impl Canonical for LedgerSyncRequest {
    const DOMAIN: &'static str = "neuroshard/ledger-sync-request/v4";

    fn encode_body(&self, w: &mut Writer) {
        w.bytes(&self.neg);
        w.len(self.want.len());
        for id in &self.want {
            w.fixed(id);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let neg = r.bytes(MAX_NEG_BYTES)?.to_vec();
        let n = r.len(MAX_SYNC_WANT)?;
        let want = (0..n).map(|_| r.array()).collect::<Result<_, _>>()?;
        Ok(Self { neg, want })
    }
}

impl Canonical for LedgerSyncResponse {
    const DOMAIN: &'static str = "neuroshard/ledger-sync-response/v5";

    fn encode_body(&self, w: &mut Writer) {
        w.bytes(&self.neg);
        w.len(self.proofs.len());
        for p in &self.proofs {
            w.bytes(p);
        }
        w.len(self.ops.len());
        for o in &self.ops {
            w.bytes(o);
        }
        w.len(self.reports.len());
        for r in &self.reports {
            w.bytes(r);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let neg = r.bytes(MAX_NEG_BYTES)?.to_vec();
        let n = r.len(MAX_SYNC_PROOFS)?;
        let proofs = (0..n)
            .map(|_| r.bytes(MAX_PROOF_WIRE).map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        let n = r.len(MAX_SYNC_OPS)?;
        let ops = (0..n)
            .map(|_| r.bytes(MAX_OP_WIRE).map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        let n = r.len(MAX_SYNC_REPORTS)?;
        let reports = (0..n)
            .map(|_| r.bytes(MAX_REPORT_WIRE).map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            neg,
            proofs,
            ops,
            reports,
        })
    }
}

/// The id an op is reconciled by: the hash of its signed wire bytes.
pub(super) fn op_id(wire: &[u8]) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/op-id/v1");
    h.update(wire);
    *h.finalize().as_bytes()
}

/// The id a fraud report is reconciled by: the hash of its canonical bytes.
pub fn report_id(wire: &[u8]) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/fraud-report-id/v1");
    h.update(wire);
    *h.finalize().as_bytes()
}

/// Fraud reports kept to relay, by id, oldest first, within [`MAX_REPORT_BYTES`], one per
/// audited job: the auditor of a convicted job can sign any number of reports of it (another
/// timestamp each), and without this bound they would push every other report out.
#[derive(Debug, Default)]
pub(super) struct Reports {
    by_id: BTreeMap<Hash32, (Hash32, std::sync::Arc<Vec<u8>>)>,
    jobs: BTreeSet<Hash32>,
    order: std::collections::VecDeque<Hash32>,
    bytes: usize,
}

/// The job a report's commitment names (the signatures are checked before a report is
/// kept; here only its bytes are read).
fn job_of(wire: &[u8]) -> Option<Hash32> {
    let report = crate::wire::FraudReport::from_canonical_bytes(wire).ok()?;
    let c = neuroshard_audit::JobCommitment::from_canonical_bytes(report.proof.job.payload_bytes())
        .ok()?;
    Some(c.key().0)
}

impl Reports {
    /// Its id when newly kept; None when already kept, when a report of the same job is, or
    /// when it is not a report (or larger than one may be).
    pub(super) fn keep(&mut self, wire: std::sync::Arc<Vec<u8>>) -> Option<Hash32> {
        let id = report_id(&wire);
        if wire.len() > MAX_REPORT_WIRE || self.by_id.contains_key(&id) {
            return None;
        }
        let job = job_of(&wire)?;
        if !self.jobs.insert(job) {
            return None;
        }
        self.bytes = self.bytes.saturating_add(wire.len());
        self.by_id.insert(id, (job, wire));
        self.order.push_back(id);
        while self.bytes > MAX_REPORT_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((job, w)) = self.by_id.remove(&old) {
                self.jobs.remove(&job);
                self.bytes = self.bytes.saturating_sub(w.len());
            }
        }
        Some(id)
    }

    pub fn wires(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.order
            .iter()
            .filter_map(|id| self.by_id.get(id).map(|(_, w)| &**w))
    }

    fn get(&self, id: &Hash32) -> Option<&std::sync::Arc<Vec<u8>>> {
        self.by_id.get(id).map(|(_, w)| w)
    }

    fn contains(&self, id: &Hash32) -> bool {
        self.by_id.contains_key(id)
    }

    fn ids(&self) -> impl Iterator<Item = Hash32> + '_ {
        self.by_id.keys().copied()
    }
}

/// What anti-entropy keeps between calls: the snapshot answers use, and our open sessions.
#[derive(Debug, Default)]
pub(super) struct SyncState {
    snapshot: Option<SyncSet>,
    built_ms: u64,
    /// Items arrived since the snapshot was built.
    pub dirty: bool,
    sessions: BTreeMap<NodeId, (u64, Session)>,
    started: u64,
    /// Items fetched and refused: until when they are not asked for again, and under which
    /// registry (an item refused because this ledger did not know a registration yet, as a
    /// joiner's may not, is asked for again as soon as the registry moved).
    refused: HashMap<Hash32, (u64, neuroshard_ledger::Generation)>,
    /// The ops applied last, newest at the back (at most [`RECENT_OPS_PUSHED`]).
    recent_ops: std::collections::VecDeque<(NodeId, u64)>,
    pub reports: Reports,
}

impl SyncState {
    pub fn recent_op(&mut self, account: NodeId, nonce: u64) {
        if self.recent_ops.len() >= RECENT_OPS_PUSHED {
            self.recent_ops.pop_front();
        }
        self.recent_ops.push_back((account, nonce));
    }

    fn refuse(&mut self, id: Hash32, now_ms: u64, registry: neuroshard_ledger::Generation) {
        if self.refused.len() >= MAX_REFUSED {
            self.refused.retain(|_, (until, _)| *until > now_ms);
        }
        if self.refused.len() < MAX_REFUSED {
            self.refused
                .insert(id, (now_ms.saturating_add(REFUSED_FOR_MS), registry));
        }
    }

    fn refused_at(
        &self,
        id: &Hash32,
        now_ms: u64,
        registry: neuroshard_ledger::Generation,
    ) -> bool {
        self.refused
            .get(id)
            .is_some_and(|(until, at)| *until > now_ms && *at == registry)
    }
}

#[cfg(test)]
impl SyncState {
    /// Reconciliations of ours waiting on an answer.
    pub fn sessions_open(&self) -> usize {
        self.sessions.len()
    }
}

impl Economy {
    /// Ids of everything this node can serve: applied proofs, applied ops, and the fraud
    /// reports of verdicts applied.
    /// The ids reconciled first (ops, which proofs wait for, and fraud reports: both few), and
    /// the proofs'.
    fn sync_ids(
        &self,
    ) -> (
        impl Iterator<Item = Hash32> + '_,
        impl Iterator<Item = Hash32> + '_,
    ) {
        let first = self.op_ids.keys().copied().chain(self.sync.reports.ids());
        (first, self.wires.keys().copied())
    }

    pub(super) fn holds(&self, id: &Hash32) -> bool {
        self.wires.contains_key(id)
            || self.op_ids.contains_key(id)
            || self.sync.reports.contains(id)
    }

    /// Keeps the canonical bytes of a fraud report whose verdict this ledger applied (or
    /// holds), to relay it to ledgers that missed it.
    pub fn keep_report(&mut self, wire: Vec<u8>) {
        let wire = std::sync::Arc::new(wire);
        if let Some(id) = self.sync.reports.keep(std::sync::Arc::clone(&wire)) {
            self.sync.dirty = true;
            self.writes.push_back(super::LedgerWrite {
                report: Some((id, wire)),
                ..super::LedgerWrite::of(Default::default())
            });
        }
    }

    /// A relayed item this node could not use (yet): not asked for again for a while.
    pub fn refuse_item(&mut self, id: Hash32, now_ms: u64) {
        self.sync
            .refuse(id, now_ms, self.ledger.registry_generation());
    }

    /// The snapshot answers are computed from, rebuilt when items arrived and the last build
    /// is at least [`SNAPSHOT_EVERY_MS`] old (or `force`).
    fn sync_snapshot(&mut self, now_ms: u64, force: bool) -> &SyncSet {
        let stale = self.sync.snapshot.is_none()
            || (self.sync.dirty
                && (force || now_ms.saturating_sub(self.sync.built_ms) >= SNAPSHOT_EVERY_MS));
        if stale {
            let (first, proofs) = self.sync_ids();
            let set = SyncSet::with_first(first, proofs);
            self.sync.snapshot = Some(set);
            self.sync.built_ms = now_ms;
            self.sync.dirty = false;
        }
        self.sync.snapshot.get_or_insert_with(|| SyncSet::new([]))
    }

    /// Starts a reconciliation with `peer` (replacing any open one with it; the oldest of
    /// [`MAX_SYNC_SESSIONS`] gives way) and returns its first request.
    pub fn start_sync(&mut self, peer: NodeId, now_ms: u64) -> LedgerSyncRequest {
        let set = self.sync_snapshot(now_ms, true).clone();
        let Ok((session, neg)) = Session::start(set) else {
            return LedgerSyncRequest::default();
        };
        let sessions = &mut self.sync.sessions;
        sessions.remove(&peer);
        if sessions.len() >= MAX_SYNC_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(p, _)| *p);
            if let Some(oldest) = oldest {
                sessions.remove(&oldest);
            }
        }
        self.sync.started = self.sync.started.wrapping_add(1);
        sessions.insert(peer, (self.sync.started, session));
        LedgerSyncRequest {
            neg,
            want: Vec::new(),
        }
    }

    /// The answer to a peer's request: our range message, then the wanted items we hold, at
    /// most `max_bytes` of them (ops first, in account and nonce order, so registrations come
    /// before the proofs that need them), and wanted fraud reports in another `max_bytes`
    /// (one may be as large as a gossip message). A malformed range message gets no range
    /// answer.
    pub fn answer_sync(
        &mut self,
        request: &LedgerSyncRequest,
        max_bytes: usize,
        now_ms: u64,
    ) -> LedgerSyncResponse {
        let neg = if request.neg.is_empty() {
            Vec::new()
        } else {
            reconcile::answer(self.sync_snapshot(now_ms, false), &request.neg).unwrap_or_default()
        };
        let mut used = neg.len();
        let wanted: BTreeSet<&Hash32> = request.want.iter().collect();
        let mut ops: BTreeSet<(NodeId, u64)> = wanted
            .iter()
            .filter_map(|id| self.op_ids.get(*id).copied())
            .collect();
        // A session's first request also gets our own latest ops and the ops applied last:
        // a peer that heard from a new replica before its registration reached it holds that
        // replica's messages (its DiLoCo offers among them) until the registration comes, and
        // this brings it in one round trip, not the two a reconciliation takes. Ops are few
        // (a handful per node lifetime), so this costs little.
        if !request.neg.is_empty() && request.want.is_empty() {
            let me = self.identity.node_id();
            let own = self.op_wires.range((me, 0)..=(me, u64::MAX)).rev();
            ops.extend(own.take(OWN_OPS_PUSHED).map(|(key, _)| *key));
            ops.extend(self.sync.recent_ops.iter().copied());
        }
        let mut out = LedgerSyncResponse {
            neg,
            ..Default::default()
        };
        let mut report_bytes = 0usize;
        for id in &wanted {
            let Some(wire) = self.sync.reports.get(id) else {
                continue;
            };
            report_bytes = report_bytes.saturating_add(wire.len());
            if out.reports.len() >= MAX_SYNC_REPORTS || report_bytes > max_bytes {
                break;
            }
            out.reports.push(wire.to_vec());
        }
        for key in ops {
            let Some(wire) = self.op_wires.get(&key) else {
                continue;
            };
            used = used.saturating_add(wire.len());
            if out.ops.len() >= MAX_SYNC_OPS || used > max_bytes {
                return out;
            }
            out.ops.push(wire.clone());
        }
        for id in wanted {
            let Some(wire) = self.wires.get(id) else {
                continue;
            };
            used = used.saturating_add(wire.len());
            if out.proofs.len() >= MAX_SYNC_PROOFS || used > max_bytes {
                break;
            }
            out.proofs.push(wire.to_vec());
        }
        out
    }

    /// Applies an answer from `peer` (its ops first, then its proofs, each as if it arrived on
    /// its own) and returns what it gave with the next request of the session, if any is
    /// left. Items are applied whether or not a session with `peer` is open: each is verified.
    pub fn on_sync_response(
        &mut self,
        peer: NodeId,
        response: &LedgerSyncResponse,
        now_ms: u64,
    ) -> (SyncSummary, Option<LedgerSyncRequest>) {
        let mut summary = SyncSummary::default();
        for wire in &response.ops {
            let (outcome, retried) = self.on_op(wire, now_ms);
            if matches!(outcome, ProofOutcome::Rejected(_)) {
                self.sync
                    .refuse(op_id(wire), now_ms, self.ledger.registry_generation());
            }
            summary.add(retried);
        }
        for wire in &response.proofs {
            let outcome = self.on_proof(wire, now_ms);
            if matches!(outcome, ProofOutcome::Rejected(_))
                && let Ok(signed) = SignedProof::from_bytes(wire)
            {
                self.sync.refuse(
                    signed.payload_hash(),
                    now_ms,
                    self.ledger.registry_generation(),
                );
            }
            summary.count(&outcome);
        }
        let Some((at, mut session)) = self.sync.sessions.remove(&peer) else {
            return (summary, None);
        };
        let neg = if response.neg.is_empty() {
            None
        } else {
            match session.on_answer(&response.neg) {
                Ok(next) => next,
                Err(e) => {
                    tracing::debug!(%peer, "ledger reconciliation: {e}");
                    None
                }
            }
        };
        let registry = self.ledger.registry_generation();
        let want =
            session.take_wants(|id| self.holds(id) || self.sync.refused_at(id, now_ms, registry));
        // Wanted ids are asked for even once the ranges agree; the queue behind them is
        // bounded, so a session's requests are too.
        if neg.is_none() && want.is_empty() {
            return (summary, None);
        }
        self.sync.sessions.insert(peer, (at, session));
        let next = LedgerSyncRequest {
            neg: neg.unwrap_or_default(),
            want,
        };
        (summary, Some(next))
    }
}
