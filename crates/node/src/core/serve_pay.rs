//! Paid inference in the core: the coordinator checks a caller's payment when it opens a
//! stream, asks the stream's stage replicas for signed receipts when it ends, and signs the
//! settlement that every ledger applies (`neuroshard_ledger::inference`). A replica signs a
//! receipt only for a stream it holds positions of, so a coordinator cannot collect receipts
//! for work nobody did.

use std::collections::BTreeMap;
use std::time::Instant;

use neuroshard_ledger::{
    Action, OpError, ServeReceipt, Settlement, SignedOp, check_fresh, verify_op,
};
use neuroshard_proof::{Canonical, EnvelopeError, Hash32, NodeId, Signed};

use super::serve::Reply;
use super::{NodeCore, Pending, TransferError, Transmit};
use crate::records::Topic;
use crate::serve::{InferMsg, InferReply};

/// Why a stream's payment is refused (missing on a paid-only node, malformed, or not good
/// for this node).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaymentRefused {
    #[error("this node serves paid requests only")]
    PaidOnly,
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    #[error(transparent)]
    Op(#[from] OpError),
    #[error("not an inference payment")]
    NotAPayment,
    #[error("the payment is for another network")]
    OtherNetwork,
    #[error("the payment names entry node {0}, not this one")]
    OtherEntry(NodeId),
    #[error("the payment covers {stages} stages; this network has {network}")]
    Stages { stages: u16, network: usize },
    #[error("the fee per stage {per_stage} is below this node's {min}")]
    FeeTooLow { per_stage: u64, min: u64 },
    #[error("the fee overflows")]
    FeeOverflow,
    #[error("the payer holds {holds} of the {offers} it offers")]
    Balance { holds: u64, offers: u64 },
    #[error("the payment uses nonce {nonce}, the payer's next is {next}")]
    Nonce { nonce: u64, next: u64 },
    #[error("the payer has a paid stream in progress on this node")]
    InProgress,
}

/// A stream's checked payment.
#[derive(Debug, Clone)]
pub(super) struct Paid {
    pub(super) wire: Vec<u8>,
    pub(super) payer: NodeId,
    pub(super) request: Hash32,
}

/// A paid stream that ended, waiting for its replicas' receipts.
#[derive(Debug)]
pub(super) struct Settling {
    paid: Paid,
    /// Receipts by stage.
    receipts: BTreeMap<u16, Vec<u8>>,
    /// Replicas asked and not answered yet.
    awaiting: usize,
    deadline: Instant,
}

impl Settling {
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl NodeCore {
    /// Checks a request's payment (or its absence on a paid-only node). The caller must have
    /// the balance for every stage, use its next nonce, and have no other paid stream here:
    /// a later nonce would wait in every ledger behind one that may never be settled.
    pub(super) fn check_payment(
        &self,
        payment: Option<&[u8]>,
        now: Instant,
    ) -> Result<Option<Paid>, PaymentRefused> {
        let limits = self.serve.limits;
        let Some(wire) = payment else {
            return if limits.paid_only {
                Err(PaymentRefused::PaidOnly)
            } else {
                Ok(None)
            };
        };
        let signed = SignedOp::from_bytes(wire)?;
        let op = *verify_op(&signed)?.op();
        let Action::PayInference {
            entry,
            request,
            per_stage,
            stages,
        } = op.action
        else {
            return Err(PaymentRefused::NotAPayment);
        };
        if op.network != self.network {
            return Err(PaymentRefused::OtherNetwork);
        }
        check_fresh(&op, self.unix_ms(now))?;
        if entry != self.me {
            return Err(PaymentRefused::OtherEntry(entry));
        }
        let route = self.serve_route().len();
        if usize::from(stages) != route {
            return Err(PaymentRefused::Stages {
                stages,
                network: route,
            });
        }
        if per_stage == 0 || per_stage < limits.min_fee_per_stage {
            return Err(PaymentRefused::FeeTooLow {
                per_stage,
                min: limits.min_fee_per_stage.max(1),
            });
        }
        let account = self.economy.ledger().account(&op.account);
        let total = per_stage
            .checked_mul(u64::from(stages))
            .ok_or(PaymentRefused::FeeOverflow)?;
        if account.balance < total {
            return Err(PaymentRefused::Balance {
                holds: account.balance,
                offers: total,
            });
        }
        if op.nonce != account.next_nonce {
            return Err(PaymentRefused::Nonce {
                nonce: op.nonce,
                next: account.next_nonce,
            });
        }
        if self.serve.paying.contains(&op.account) {
            return Err(PaymentRefused::InProgress);
        }
        Ok(Some(Paid {
            wire: wire.to_vec(),
            payer: op.account,
            request,
        }))
    }

    /// A paid stream ended: ask each replica that holds it for a receipt (instead of a plain
    /// close); the settlement goes out when all answered or at the hop timeout.
    pub(super) fn start_settling(
        &mut self,
        stream: u64,
        paid: Paid,
        holders: Vec<(usize, NodeId)>,
        now: Instant,
    ) {
        let deadline = now + self.serve.limits.hop_timeout;
        self.serve.settling.insert(
            stream,
            Settling {
                paid: paid.clone(),
                receipts: BTreeMap::new(),
                awaiting: holders.len(),
                deadline,
            },
        );
        for (_, holder) in holders {
            let msg = InferMsg::Settle {
                stream,
                request: paid.request,
            };
            if holder == self.me {
                let answer = self.accept_infer(self.me, Reply::Local { stream, hop: 0 }, msg, now);
                let answer = answer.ok_or_else(|| TransferError("no answer".into()));
                self.on_receipt(stream, holder, answer, now);
            } else {
                let token = self.token();
                self.requests.insert(
                    token,
                    Pending::Receipt {
                        stream,
                        from: holder,
                    },
                );
                self.transmits.push_back(Transmit::Request {
                    to: holder,
                    token,
                    data: msg.to_canonical_bytes(),
                });
            }
        }
        self.finish_settling(stream, now);
    }

    /// A replica's answer to `Settle`: its receipt is kept if it is its own, for this
    /// request and entry; anything else counts as no receipt.
    pub(super) fn on_receipt(
        &mut self,
        stream: u64,
        from: NodeId,
        answer: Result<InferReply, TransferError>,
        now: Instant,
    ) {
        let network = self.network;
        let me = self.me;
        let Some(s) = self.serve.settling.get_mut(&stream) else {
            return;
        };
        s.awaiting = s.awaiting.saturating_sub(1);
        if let Ok(InferReply::Receipt(wire)) = answer {
            let checked = Signed::<ServeReceipt>::from_bytes(&wire)
                .ok()
                .and_then(|e| e.verify().ok().map(|r| (e.signer().node_id(), r)));
            match checked {
                Some((signer, r))
                    if signer == from
                        && r.server == from
                        && r.request == s.paid.request
                        && r.entry == me
                        && r.network == network
                        && r.positions > 0 =>
                {
                    s.receipts.entry(r.stage).or_insert(wire);
                }
                _ => self.penalize(from, "a receipt that does not match the stream"),
            }
        }
        self.finish_settling(stream, now);
    }

    /// Sends the settlement once every replica answered or the deadline passed.
    pub(super) fn finish_settling(&mut self, stream: u64, now: Instant) {
        let due = self
            .serve
            .settling
            .get(&stream)
            .is_some_and(|s| s.awaiting == 0 || now >= s.deadline);
        if !due {
            return;
        }
        let Some(s) = self.serve.settling.remove(&stream) else {
            return;
        };
        self.serve.paying.remove(&s.paid.payer);
        if s.receipts.is_empty() {
            self.warn(
                "a paid stream ended without any receipt: nothing is charged".into(),
                now,
            );
            return;
        }
        let settlement = Settlement {
            payment: s.paid.wire,
            receipts: s.receipts.into_values().collect(),
        };
        let wire = Signed::sign(&self.identity, &settlement).to_bytes();
        // Checked and applied here as every peer will; published only if our ledger took it.
        if self.on_op_gossip(self.me, &wire, now) {
            self.transmits.push_back(Transmit::Publish {
                topic: Topic::Ops,
                data: wire,
            });
        }
    }

    /// The replica side of `Settle`: a receipt for the positions we hold of the stream.
    pub(super) fn sign_receipt(&self, from: NodeId, stream: u64, request: Hash32) -> InferReply {
        let positions = self
            .serve
            .cached
            .get(&(from, stream))
            .map_or(0, |c| c.positions);
        let Ok(stage) = u16::try_from(self.stage) else {
            return InferReply::Rejected("stage out of range".into());
        };
        if positions == 0 {
            return InferReply::Rejected("this replica holds nothing of the stream".into());
        }
        let receipt = ServeReceipt {
            network: self.network,
            request,
            entry: from,
            stage,
            server: self.me,
            positions,
        };
        InferReply::Receipt(Signed::sign(&self.identity, &receipt).to_bytes())
    }

    /// Settlements whose replicas did not all answer in time.
    pub(super) fn settle_due(&mut self, now: Instant) {
        let due: Vec<u64> = self
            .serve
            .settling
            .iter()
            .filter(|(_, s)| now >= s.deadline)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.finish_settling(id, now);
        }
    }
}
