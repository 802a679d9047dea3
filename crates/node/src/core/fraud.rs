//! Fraud proofs on every ledger (verification by recomputation, issue 15).
//!
//! An auditor whose replay contradicts a worker's commitment gossips a [`FraudReport`] to the
//! whole network and serves the job's weights. Every node settles it on its own: it fetches
//! the weights from the auditor, replays the one job on its engine (`neuroshard_audit::check`:
//! signatures, that the sampler assigned the job to the accuser, the inputs' hashes, then the
//! replay), and applies the verdict to its ledger: the guilty worker, or a false accuser,
//! loses a share of its stake, part of it paid to the other side. Nodes that replay the same
//! evidence reach the same verdict, so every ledger moves alike.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use neuroshard_audit::{
    BEACON_LAG, Charge, FraudProof, GenesisText, JobInputs, JobKey, Replayed, Verdict,
    check_before_replay, check_provenance_charge, verify_job,
};
use neuroshard_ledger::VerifiedVerdict;
use neuroshard_model::StageSpec;
use neuroshard_proof::{Canonical, Hash32, NodeId};

use super::{
    BatchSource, EngineJob, EngineOutput, NodeCore, SharedBlob, Token, TransferError, Transmit,
    blob_hash,
};
use crate::compute::Settle;
use crate::events::NodeEvent;
use crate::recent::RecentSet;
use crate::records::Topic;
use crate::wire::FraudReport;

/// Fraud proofs a node remembers having settled (or settling), to settle each job once.
const MAX_SEEN: usize = 4096;
/// Reports held until the beacon epoch their job names is final here, at most.
const MAX_HELD: usize = 64;

#[derive(Debug, Default)]
pub(super) struct FraudState {
    /// Jobs settled or being settled (each is settled once).
    seen: RecentSet<JobKey, MAX_SEEN>,
    /// Weights fetches, and settlements on the engine (with the weights), by token.
    blobs: HashMap<Token, Case>,
    engine: HashMap<Token, (Case, Option<SharedBlob>)>,
    /// Reports whose job's beacon epoch is not final here yet: (from, report, relayed id).
    held: VecDeque<(NodeId, FraudReport, Option<Hash32>)>,
}

/// A fraud report being settled, and who it came from.
#[derive(Debug)]
struct Case {
    from: NodeId,
    /// Relayed by anti-entropy (from a ledger that applied it), not gossiped by its author:
    /// the id ledgers reconcile it by.
    relayed: Option<Hash32>,
    report: Box<FraudReport>,
}

impl FraudState {
    /// Whether the blob fetch `token` is ours.
    pub(super) fn fetching(&self, token: Token) -> bool {
        self.blobs.contains_key(&token)
    }

    /// A settlement that could not finish: the job may be settled from another report.
    fn forget(&mut self, key: &JobKey) {
        self.seen.remove(key);
    }
}

impl NodeCore {
    /// Our audit of `key` contradicted the worker: report it to every node, serve the
    /// weights it ran at, and settle it here as every node does.
    pub(super) fn file_fraud_proof(&mut self, key: JobKey, replayed: &Replayed, now: Instant) {
        let at = self.unix_ms(now);
        let Some((open, inputs, beacon)) = self.open_case(&key) else {
            return;
        };
        let Some(weights) = open.weights else {
            return;
        };
        let proof = FraudProof::new(
            &self.identity,
            open.job,
            &open.commitment,
            inputs,
            replayed,
            None,
            at,
        );
        let weights_blob = blob_hash(&weights);
        self.offer_audit_blob(open.commitment.round, weights_blob, Arc::clone(&weights));
        self.publish_report(proof, beacon, Some(weights), now);
    }

    /// Our audit found a first-stage job's tokens are not the genesis text they name: report
    /// it to every node (no weights to serve: checkers read their own genesis) and settle it
    /// here as every node does.
    pub(super) fn file_provenance_proof(&mut self, key: JobKey, now: Instant) {
        let at = self.unix_ms(now);
        let Some((open, inputs, beacon)) = self.open_case(&key) else {
            return;
        };
        let proof = FraudProof::provenance(&self.identity, open.job, &open.commitment, inputs, at);
        self.publish_report(proof, beacon, None, now);
    }

    /// An audit of ours with its inputs, and the beacon its challenge was drawn from.
    fn open_case(&self, key: &JobKey) -> Option<(super::audit::Open, JobInputs, Hash32)> {
        let open = self.audit.open.get(key).cloned()?;
        let inputs = open.inputs.clone()?;
        let (_, beacon) = self.job_seed(&open.commitment)?;
        Some((open, inputs, beacon))
    }

    /// Gossips our report to every node and settles it here as they do.
    fn publish_report(
        &mut self,
        proof: FraudProof,
        beacon: Hash32,
        weights: Option<SharedBlob>,
        now: Instant,
    ) {
        let report = FraudReport {
            proof,
            beacon,
            weights_blob: weights
                .as_ref()
                .map_or(neuroshard_audit::NO_HASH, |w| blob_hash(w)),
        };
        self.transmits.push_back(Transmit::Publish {
            topic: Topic::Ops,
            data: report.to_canonical_bytes(),
        });
        let me = self.me;
        let Some(report) = self.precheck_report(me, report, None, now) else {
            return;
        };
        match weights {
            Some(w) => self.settle_report(Case::gossiped(me, report), w),
            None => self.settle_provenance(Case::gossiped(me, report), now),
        }
    }

    /// The network-wide topic carries account ops and fraud reports.
    pub(super) fn on_ops_topic(&mut self, from: NodeId, data: &[u8], now: Instant) {
        if !self.on_fraud_gossip(from, data, now)
            && !self.on_demand_gossip(from, data, now)
            && !self.on_fee_claims_gossip(from, data)
        {
            self.on_op_gossip(from, data, now);
        }
    }

    /// A gossiped fraud report (false: the bytes are not one).
    pub(super) fn on_fraud_gossip(&mut self, from: NodeId, data: &[u8], now: Instant) -> bool {
        let Ok(report) = FraudReport::from_canonical_bytes(data) else {
            return false;
        };
        self.take_report(from, report, None, now);
        true
    }

    /// A fraud report a peer's ledger relayed by anti-entropy: settled here like a gossiped
    /// one (a verdict is never taken on trust), the weights fetched from that peer.
    pub(super) fn on_relayed_report(&mut self, peer: NodeId, wire: &[u8], now: Instant) {
        let id = crate::economy::report_id(wire);
        match FraudReport::from_canonical_bytes(wire) {
            Ok(report) => self.take_report(peer, report, Some(id), now),
            Err(_) => self.economy.refuse_item(id, self.unix_ms(now)),
        }
    }

    fn take_report(
        &mut self,
        from: NodeId,
        report: FraudReport,
        relayed: Option<Hash32>,
        now: Instant,
    ) {
        let Some(report) = self.precheck_report(from, report, relayed, now) else {
            return;
        };
        let case = Case {
            from,
            relayed,
            report: Box::new(report),
        };
        if case.report.proof.charge() == Some(Charge::Provenance) {
            return self.settle_provenance(case, now);
        }
        let Ok(c) = verify_job(&case.report.proof.job) else {
            return;
        };
        let Some(max) = self.evidence_blob_bytes(&c, &case.report.proof.inputs) else {
            return;
        };
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let token = self.token();
        self.transmits.push_back(Transmit::FetchBlob {
            from,
            token,
            hash: case.report.weights_blob,
            max,
        });
        self.fraud.blobs.insert(token, case);
    }

    /// What costs nothing to check before fetching weights and replaying: the report is its
    /// author's accusation (or relayed by a ledger), about a job of this network no verdict
    /// settled yet, drawn from the beacon this node's own finalized epochs give (held until
    /// that epoch is final here).
    fn precheck_report(
        &mut self,
        from: NodeId,
        report: FraudReport,
        relayed: Option<Hash32>,
        now: Instant,
    ) -> Option<FraudReport> {
        let verified = verify_job(&report.proof.job);
        let why = (|| {
            if relayed.is_none() && report.proof.accusation.signer().node_id() != from {
                return Some("a fraud report relayed under another key");
            }
            let Ok(c) = &verified else {
                return Some("a fraud report with a forged commitment");
            };
            if c.network != self.network || self.stage_spec(c.stage).is_none() {
                return Some("a fraud report for another network");
            }
            if self.beacon_lost(c) {
                return Some("a fraud report whose beacon epoch is no longer held here");
            }

            if let Some((_, ours)) = self.job_seed(c)
                && ours != report.beacon
            {
                return Some("a fraud report drawn from another beacon");
            }
            None
        })();
        if let Some(why) = why {
            self.refuse_case(from, relayed, why.into(), now);
            return None;
        }
        let c = verified.ok()?;
        if self.job_seed(&c).is_none() {
            // Its accuser drew the job from a final beacon, so only a report whose beacon
            // epoch is near ours is held: made-up far ones would crowd out genuine ones. One
            // this node lags too far behind for comes again by anti-entropy (no penalty).
            let near = self.finalized_epoch().saturating_add(BEACON_LAG);
            if c.beacon_epoch().is_some_and(|b| b <= near) {
                self.hold_report(from, report, relayed, now);
            } else if let Some(id) = relayed {
                self.economy.refuse_item(id, self.unix_ms(now));
            }
            return None;
        }
        let key = c.key();
        let settled = self.economy.ledger().has_verdict(&key.0);
        if (settled && relayed.is_none()) || self.fraud.seen.contains(&key) {
            return None;
        }
        // Everything but the replay, before anything is fetched: evidence that cannot
        // convict costs this node no weights transfer and no replay.
        let settle = self.settle_context(&report)?;
        let ctx = settle.context(c.stage, c.round);
        if let Err(e) = check_before_replay(&ctx, &report.proof) {
            self.refuse_case(from, relayed, e.to_string(), now);
            return None;
        }
        if settled {
            // Our ledger holds its verdict (we restarted, or settled another report of the
            // job): kept to relay, so the sets of reports ledgers reconcile agree.
            self.economy.keep_report(report.to_canonical_bytes());
            return None;
        }
        self.fraud.seen.insert(key);
        Some(report)
    }

    /// A report whose job's beacon epoch is not final here: settled once it is. A full hold
    /// drops the oldest (a relayed one is asked for again later).
    fn hold_report(
        &mut self,
        from: NodeId,
        report: FraudReport,
        relayed: Option<Hash32>,
        now: Instant,
    ) {
        if self.fraud.held.len() >= MAX_HELD
            && let Some((_, _, Some(id))) = self.fraud.held.pop_front()
        {
            self.economy.refuse_item(id, self.unix_ms(now));
        }
        self.fraud.held.push_back((from, report, relayed));
    }

    /// An epoch was finalized: held reports whose beacon it brings are taken up again.
    pub(super) fn retry_held_reports(&mut self, now: Instant) {
        for (from, report, relayed) in std::mem::take(&mut self.fraud.held) {
            self.take_report(from, report, relayed, now);
        }
    }

    /// A report that cannot convict. Its author is penalised for it; a ledger relaying it is
    /// not (its ledger may know registrations ours does not yet): the report is only not
    /// asked for again for a while.
    fn refuse_case(&mut self, from: NodeId, relayed: Option<Hash32>, reason: String, now: Instant) {
        match relayed {
            Some(id) => self.economy.refuse_item(id, self.unix_ms(now)),
            None => self.refuse_report(from, reason, now),
        }
    }

    /// A report its author is to blame for: penalised, reported, dropped.
    fn refuse_report(&mut self, from: NodeId, reason: String, now: Instant) {
        self.penalize(from, format!("fraud report refused: {reason}"));
        let time_ms = self.unix_ms(now);
        self.events.push_back(NodeEvent::Dropped {
            what: Some("fraud report".into()),
            peer: Some(from.to_string()),
            stage: None,
            round: None,
            reason,
            time_ms,
        });
    }

    /// What `stage` holds, in any version this node knows.
    pub(super) fn stage_spec(&self, stage: u16) -> Option<StageSpec> {
        self.pipeline.layouts().spec(usize::from(stage))
    }

    /// The weights of a reported job arrived (false: not a fetch of ours).
    pub(super) fn on_fraud_blob(
        &mut self,
        token: Token,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) -> bool {
        let Some(case) = self.fraud.blobs.remove(&token) else {
            return false;
        };
        match result {
            Ok(weights) => self.settle_report(case, Arc::new(weights)),
            Err(e) => {
                self.warn(
                    format!("the weights of {}'s fraud report: {e}", case.from),
                    now,
                );
                // Settled later, from another copy of the report or another peer.
                self.unsettled(&case, now);
            }
        }
        true
    }

    /// A case dropped before its verdict: another report of the job may settle it.
    fn unsettled(&mut self, case: &Case, now: Instant) {
        if let Ok(c) = verify_job(&case.report.proof.job) {
            self.fraud.forget(&c.key());
        }
        if let Some(id) = case.relayed {
            self.economy.refuse_item(id, self.unix_ms(now));
        }
    }

    /// What this node checks `report` against: its own ledger's validators, the network's
    /// rules, and the seed its own finalized epochs give.
    fn settle_context(&self, report: &FraudReport) -> Option<Settle> {
        let c = verify_job(&report.proof.job).ok()?;
        let spec = self.stage_spec(c.stage)?;
        let (seed, _) = self.job_seed(&c)?;
        Some(Settle {
            spec,
            proof: report.proof.clone(),
            network: self.network,
            seed,
            validators: self.economy.ledger().ever_registered(c.stage).collect(),
            rate: self.audit_rate(),
            limits: self.evidence_limits(),
            class: self.job_log.class(),
        })
    }

    fn settle_report(&mut self, case: Case, weights: SharedBlob) {
        let Some(settle) = self.settle_context(&case.report) else {
            return;
        };
        let t = self.engine(EngineJob::Settle {
            settle: Box::new(settle),
            weights: Arc::clone(&weights),
        });
        self.fraud.engine.insert(t, (case, Some(weights)));
    }

    /// A settlement's verdict (false: not one of ours).
    pub(super) fn on_fraud_engine(
        &mut self,
        token: Token,
        output: &EngineOutput,
        now: Instant,
    ) -> bool {
        let Some((case, weights)) = self.fraud.engine.remove(&token) else {
            return false;
        };
        let EngineOutput::Settled(result) = output else {
            return true;
        };
        match result {
            Ok(verdict) => self.apply_settled(&case, verdict, weights, now),
            // Evidence that fails before the replay is its author's fault.
            Err(e) => {
                self.refuse_case(case.from, case.relayed, e.to_string(), now);
                self.unsettled(&case, now);
            }
        }
        true
    }

    /// A verdict reached on a report: applied to the ledger (an escalation moves nothing),
    /// and the report kept, with the weights it needs, for ledgers that missed it.
    fn apply_settled(
        &mut self,
        case: &Case,
        verdict: &Verdict,
        weights: Option<SharedBlob>,
        now: Instant,
    ) {
        let (from, report) = (case.from, &case.report);
        if let Verdict::Escalate { .. } = verdict {
            self.unsettled(case, now);
            return self.warn(
                format!("{from}'s fraud report needs a checker of the job's class"),
                now,
            );
        }
        let Some(v) = VerifiedVerdict::from_checked(verdict, &report.proof) else {
            return;
        };
        let applied = match self.economy.apply_verdict(&v) {
            Ok(applied) => applied,
            Err(e) => return self.warn(format!("applying a verdict: {e}"), now),
        };
        // The ledger holds the verdict (now or already): relay the report, and serve what
        // its replay needs.
        self.economy.keep_report(report.to_canonical_bytes());
        if let Some(weights) = weights {
            self.serve_verdict_weights(report.weights_blob, weights);
        }
        if applied {
            let kind = match verdict {
                Verdict::Guilty { .. } => "verdict: guilty",
                _ => "verdict: false accusation",
            };
            let time_ms = self.unix_ms(now);
            self.events.push_back(NodeEvent::Ledger {
                applied: hex::encode(v.job),
                reward: 0,
                kind: Some(kind.into()),
                state_hash: hex::encode(self.economy.state_hash()),
                time_ms,
            });
        }
    }

    /// At start: serves again the verdict weights the ledger database kept.
    pub(super) fn serve_stored_verdict_weights(&mut self) {
        let stored: Vec<_> = self.economy.verdict_weights().cloned().collect();
        for (hash, data) in stored {
            self.transmits.push_back(Transmit::OfferBlob { hash, data });
        }
    }

    /// Serves the weights a verdict's replay needs to ledgers that settle it late (a joiner,
    /// a node that missed the gossip), for the verdicts the economy keeps weights of (in
    /// memory, shared with the transport, and in the ledger database, so that a restart
    /// serves them again: at most 32 stage weights, 340 MB for a default stage, reached only
    /// while that many verdicts are recent; each cost its loser half the minimum stake). A
    /// convicted worker's jobs committed before it was deregistered are audited for two more
    /// rounds, so one cheater alone can bring a dozen verdicts.
    fn serve_verdict_weights(&mut self, hash: Hash32, weights: SharedBlob) {
        let Some(evicted) = self
            .economy
            .keep_verdict_weights(hash, Arc::clone(&weights))
        else {
            return;
        };
        self.transmits.push_back(Transmit::OfferBlob {
            hash,
            data: weights,
        });
        for old in evicted {
            if !self.audit.offers(&old) {
                self.transmits
                    .push_back(Transmit::WithdrawBlob { hash: old });
            }
        }
    }

    /// A provenance charge (the first stage's tokens are not the genesis text they name):
    /// settled here against this node's own copy of the genesis, with no weights and no
    /// replay.
    fn settle_provenance(&mut self, case: Case, now: Instant) {
        let report = &case.report;
        let Some(settle) = self.settle_context(report) else {
            return;
        };
        let Ok(c) = verify_job(&report.proof.job) else {
            return;
        };
        let ctx = settle.context(c.stage, c.round);
        let text = GenesisOf(self.data.as_ref());
        match check_provenance_charge(&ctx, &report.proof, &text) {
            Ok(verdict) => self.apply_settled(&case, &verdict, None, now),
            Err(e) => {
                self.refuse_case(case.from, case.relayed, e.to_string(), now);
                self.unsettled(&case, now);
            }
        }
    }
}

impl Case {
    fn gossiped(from: NodeId, report: FraudReport) -> Self {
        Self {
            from,
            relayed: None,
            report: Box::new(report),
        }
    }
}

/// The node's batch source as the genesis text provenance checks read.
pub(super) struct GenesisOf<'a>(pub &'a dyn BatchSource);

impl GenesisText for GenesisOf<'_> {
    fn window(&self, shard: u32, window: u64, seq: u32) -> Option<Vec<u32>> {
        self.0.genesis_window(shard, window, seq)
    }
}
