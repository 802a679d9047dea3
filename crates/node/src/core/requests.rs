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
        if crate::network::GenesisRequest::from_canonical_bytes(data).is_ok() {
            // The genesis is public, and its bytes prove themselves: anyone may ask.
            self.transmits.push_back(Transmit::Respond {
                token,
                data: self.network_genesis.clone(),
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
        let mut tally = None;
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
                    check_stamp(&self.network, &req.msg),
                    self.check_route(from, &req.msg),
                ) {
                    (_, _, Err(why), _) => {
                        self.refuse_request(from, what, format!("driver stamp: {why}"), now)
                    }
                    (.., Err(why)) => self.refuse_request(from, what, format!("route: {why}"), now),
                    (Err(why), ..) if !why.blames_sender() => {
                        // Busy, not refused: the sender may lag one finalized epoch behind
                        // the network and will commit again at a later one.
                        self.dropped_request(from, what, format!("commitment: {why}"), now);
                        Ack::Busy
                    }
                    (Err(why), ..) => {
                        self.refuse_request(from, what, format!("commitment: {why}"), now)
                    }
                    (_, Err(why), ..) => {
                        self.refuse_request(from, what, format!("targets: {why}"), now)
                    }
                    (Ok((cs, c)), Ok(()), Ok(()), Ok(())) => {
                        let (ack, actions) = self.pipeline.on_message(from, req.msg, now);
                        self.run_actions(actions, now);
                        if ack == Ack::Accepted {
                            countersign = Some(cs);
                            tally = self.economy.tally_job(&c);
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
        let answer = PipeAnswer {
            ack,
            countersign,
            tally,
        };
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

    /// A forward's hand-offs lead from its driver to `from` and from it to us. Where the
    /// micro-batch's version is not final here yet, the pipeline answers busy instead.
    fn check_route(&self, from: NodeId, msg: &Msg) -> Result<(), crate::wire::RouteError> {
        let Msg::Forward {
            mb, version, route, ..
        } = msg
        else {
            return Ok(());
        };
        let hops = self
            .pipeline
            .layouts()
            .get(*version)
            .and_then(|l| l.order().iter().position(|&s| s == self.stage));
        match hops {
            Some(hops) => crate::wire::check_route(
                &self.network,
                (self.me, from),
                (*mb, *version),
                route,
                hops,
            ),
            None => Ok(()),
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

/// Why a forward's driver stamp is refused.
#[derive(Debug, thiserror::Error)]
pub enum StampError {
    #[error("missing")]
    Missing,
    #[error("{0}")]
    Signature(#[from] neuroshard_proof::EnvelopeError),
    #[error("not signed by the micro-batch's driver")]
    NotTheDriver,
    #[error("signed for another network, micro-batch or version")]
    Mismatch,
}

/// A forward carries its driver's signature of exactly this micro-batch, network and
/// version: no stage on the way can relabel the version (to send the micro-batch past a
/// stage), and no key can claim a version for another driver's micro-batches.
pub fn check_stamp(network: &neuroshard_proof::Hash32, msg: &Msg) -> Result<(), StampError> {
    let Msg::Forward {
        mb, version, stamp, ..
    } = msg
    else {
        return Ok(());
    };
    let stamp = stamp.as_ref().ok_or(StampError::Missing)?;
    let signed = stamp.verify()?;
    if stamp.signer().node_id().0 != mb.origin {
        return Err(StampError::NotTheDriver);
    }
    let expected = crate::wire::DriverStamp {
        network: *network,
        mb: *mb,
        version: *version,
    };
    if signed != expected {
        return Err(StampError::Mismatch);
    }
    Ok(())
}

#[cfg(test)]
mod stamp_tests {
    use neuroshard_proof::Signed;
    use neuroshard_proof::fixtures::test_identity;

    use super::*;
    use crate::act_codec::{ActSpec, pack};
    use crate::wire::{DriverStamp, MicroBatchId, Payload};

    const NETWORK: [u8; 32] = [9; 32];

    /// Driver 1's micro-batch under `version`, stamped by `signer` with `stamp`.
    fn forward(version: u32, stamp: Option<(u8, DriverStamp)>) -> Msg {
        let acts = neuroshard_model::Activations {
            batch: 1,
            seq: 2,
            dim: 4,
            data: vec![0.5; 8],
        };
        Msg::Forward {
            mb: mb(),
            version,
            stamp: stamp.map(|(k, s)| Signed::sign(&test_identity(k.into()), &s)),
            route: Vec::new(),
            input: Payload::Hidden(pack(&acts, ActSpec::default().forward).unwrap()),
            targets: vec![1, 2].into(),
        }
    }

    fn mb() -> MicroBatchId {
        MicroBatchId {
            origin: test_identity(1).node_id().0,
            step: 5,
            index: 0,
        }
    }

    fn stamp(version: u32) -> DriverStamp {
        DriverStamp {
            network: NETWORK,
            mb: mb(),
            version,
        }
    }

    /// Only the driver's own signature of exactly this micro-batch, network and version
    /// passes: a relay cannot relabel the version, and no other key can claim one.
    #[test]
    fn only_the_drivers_stamp_of_this_micro_batch_and_version_passes() {
        assert!(check_stamp(&NETWORK, &forward(1, Some((1, stamp(1))))).is_ok());
        // A relay relabels the version it was stamped with.
        assert!(matches!(
            check_stamp(&NETWORK, &forward(0, Some((1, stamp(1))))),
            Err(StampError::Mismatch)
        ));
        // Another key claims a version for driver 1's micro-batch.
        assert!(matches!(
            check_stamp(&NETWORK, &forward(1, Some((4, stamp(1))))),
            Err(StampError::NotTheDriver)
        ));
        // The stamp of another micro-batch, or of another network.
        let other = DriverStamp {
            mb: MicroBatchId { step: 6, ..mb() },
            ..stamp(1)
        };
        assert!(matches!(
            check_stamp(&NETWORK, &forward(1, Some((1, other)))),
            Err(StampError::Mismatch)
        ));
        assert!(matches!(
            check_stamp(&[8; 32], &forward(1, Some((1, stamp(1))))),
            Err(StampError::Mismatch)
        ));
        assert!(matches!(
            check_stamp(&NETWORK, &forward(1, None)),
            Err(StampError::Missing)
        ));
        // A forged signature (the stamp's bytes altered).
        let Msg::Forward { stamp: Some(s), .. } = forward(1, Some((1, stamp(1)))) else {
            unreachable!()
        };
        let mut bytes = s.to_bytes();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        if let Ok(forged) = Signed::<DriverStamp>::from_bytes(&bytes) {
            let mut msg = forward(1, None);
            if let Msg::Forward { stamp, .. } = &mut msg {
                *stamp = Some(forged);
            }
            assert!(check_stamp(&NETWORK, &msg).is_err());
        }
    }
}
