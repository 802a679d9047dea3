//! Requests from peers: ledger sync, inference steps and pipeline messages (only from the
//! neighbouring stages' registered replicas; on the last stage, with targets that are the
//! genesis data their driver names).

use std::time::Instant;

use neuroshard_proof::{Canonical, NodeId};

use super::{BatchError, NodeCore, Token, Transmit};
use crate::economy::LedgerSyncRequest;
use crate::events::NodeEvent;
use crate::wire::{Ack, Msg, PipeAnswer, PipeRequest};

impl NodeCore {
    pub(super) fn on_request(&mut self, from: NodeId, token: Token, data: &[u8], now: Instant) {
        if let Ok(req) = LedgerSyncRequest::from_canonical_bytes(data) {
            let max = self.settings.max_frame / 2;
            let resp = self.economy.answer_sync(&req, max, self.unix_ms(now));
            self.transmits.push_back(Transmit::Respond {
                token,
                data: resp.to_canonical_bytes(),
            });
            return;
        }
        if let Ok(req) = crate::finality::FinalityRequest::from_canonical_bytes(data) {
            self.on_finality_request(token, &req);
            return;
        }
        if let Ok(pull) = crate::sync::SyncPull::from_canonical_bytes(data) {
            self.answer_sync_pull(token, &pull);
            return;
        }
        if let Ok(req) = crate::wire::AuditRequest::from_canonical_bytes(data) {
            self.on_audit_request(from, token, req, now);
            return;
        }
        if let Ok(msg) = crate::serve::InferMsg::from_canonical_bytes(data) {
            self.on_infer_request(from, token, msg, now);
            return;
        }
        let mut countersign = None;
        let ack = match PipeRequest::from_canonical_bytes(data) {
            Ok(req) if !self.sent_by_neighbour_stage(from, &req.msg) => {
                // Activations and targets come only from replicas registered for the stage
                // before, gradients only from the stage after: a key without stake cannot get
                // its data trained in. Busy, not refused, and no penalty: an honest sender's
                // registration may not have reached us yet, so we ask it for its ledger.
                self.ask_registration(from, now);
                let what = format!("{} message", req.msg.kind());
                let reason = "sender is not registered for a neighbouring stage";
                self.dropped_request(from, what, reason.into(), now);
                Ack::Busy
            }
            Ok(req) => {
                let what = format!("{} message", req.msg.kind());
                match (
                    self.check_commitment(from, &req),
                    self.check_targets(&req.msg),
                ) {
                    (Err(why), _) if !why.blames_sender() => {
                        // Busy, not refused: the sender may lag one finalized epoch behind
                        // the network and will commit again at a later one.
                        self.dropped_request(from, what, format!("commitment: {why}"), now);
                        Ack::Busy
                    }
                    (Err(why), _) => {
                        self.refuse_request(from, what, format!("commitment: {why}"), now)
                    }
                    (_, Err(why)) => {
                        self.refuse_request(from, what, format!("targets: {why}"), now)
                    }
                    (Ok((cs, c)), Ok(())) => {
                        let (ack, actions) = self.pipeline.on_message(from, req.msg, now);
                        self.run_actions(actions, now);
                        if ack == Ack::Accepted {
                            countersign = Some(cs);
                            self.keep_for_notice(req.job, c);
                        }
                        ack
                    }
                }
            }
            Err(e) => {
                let reason = format!("undecodable message: {e}");
                self.refuse_request(from, "message".into(), reason, now)
            }
        };
        let answer = PipeAnswer { ack, countersign };
        self.transmits.push_back(Transmit::Respond {
            token,
            data: answer.to_canonical_bytes(),
        });
    }

    /// A request from `from` refused as its sender's fault: penalised, reported, rejected.
    fn refuse_request(&mut self, from: NodeId, what: String, reason: String, now: Instant) -> Ack {
        self.penalize(from, reason.clone());
        self.dropped_request(from, what, reason.clone(), now);
        Ack::Rejected(reason)
    }

    fn dropped_request(&mut self, from: NodeId, what: String, reason: String, now: Instant) {
        let time_ms = self.unix_ms(now);
        self.events.push_back(NodeEvent::Dropped {
            what: Some(what),
            peer: Some(from.to_string()),
            stage: Some(self.stage),
            round: None,
            reason,
            time_ms,
        });
    }

    /// On the last stage, the targets of a forward message must be the genesis windows its
    /// driver read them from: whoever forwards them cannot train in text of their own.
    fn check_targets(&self, msg: &Msg) -> Result<(), BatchError> {
        match msg {
            Msg::Forward { mb, targets, .. }
                if self.pipeline.layouts().newest().is_last(self.stage) =>
            {
                self.data
                    .check_targets(&mb.origin, mb.step, self.settings.seq, targets)
            }
            _ => Ok(()),
        }
    }

    /// Whether `from` may send `msg`: registered for the stage that sends this kind to us.
    fn sent_by_neighbour_stage(&self, from: NodeId, msg: &Msg) -> bool {
        self.pipeline
            .sender_stage(msg)
            .and_then(|s| u16::try_from(s).ok())
            .is_some_and(|s| self.economy.ledger().is_registered(&from, s))
    }
}
