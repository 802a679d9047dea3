//! Paid inference: a caller's signed [`Action::PayInference`] op, the receipts of the stage
//! replicas that served the request, and the entry node's [`Settlement`] that binds them.
//!
//! Why three signatures: the caller authorises a price per stage and names the entry node and
//! a request id; each stage replica signs that it served that request; the entry node, the
//! only one that knows who served, signs the bundle. The ledger pays a stage only against its
//! server's receipt and only if that server is registered for the stage, so an entry node
//! cannot pay itself another stage's share, cannot name a node that did not serve, and cannot
//! pay a Sybil that holds no stake. A [`Action::PayInference`] op on its own is refused: its
//! fee would have no payee.

use std::collections::BTreeSet;

use neuroshard_proof::{Canonical, CodecError, Hash32, NodeId, Reader, Signed, Writer};

use crate::ops::{Action, OpError, SignedOp, VerifiedOp, verify_op};

/// Share of every stage's fee that is burned (10 %).
pub const INFERENCE_BURN_BPS: u64 = 1_000;
/// Most stages one payment can cover (and receipts one settlement can carry).
pub const MAX_PAID_STAGES: u16 = 256;

/// A stage replica's signed statement that it served `positions` of request `request` for the
/// stream coordinated by `entry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeReceipt {
    pub network: Hash32,
    pub request: Hash32,
    pub entry: NodeId,
    pub stage: u16,
    pub server: NodeId,
    pub positions: u32,
}

impl Canonical for ServeReceipt {
    const DOMAIN: &'static str = "neuroshard/serve-receipt/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.fixed(&self.request);
        w.fixed(&self.entry.0);
        w.u16(self.stage);
        w.fixed(&self.server.0);
        w.u32(self.positions);
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(Self {
            network: r.array()?,
            request: r.array()?,
            entry: NodeId(r.array()?),
            stage: r.u16()?,
            server: NodeId(r.array()?),
            positions: r.u32()?,
        })
    }
}

/// The entry node's bundle: the caller's payment op and the receipts of the servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub payment: Vec<u8>,
    pub receipts: Vec<Vec<u8>>,
}

/// Largest signed receipt accepted (its fixed fields plus the envelope).
const MAX_RECEIPT_BYTES: usize = 512;
/// Largest signed op accepted inside a settlement.
const MAX_PAYMENT_BYTES: usize = 512;

impl Canonical for Settlement {
    const DOMAIN: &'static str = "neuroshard/inference-settlement/v1";

    fn encode_body(&self, w: &mut Writer) {
        w.bytes(&self.payment);
        w.len(self.receipts.len());
        self.receipts.iter().for_each(|r| w.bytes(r));
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let payment = r.bytes(MAX_PAYMENT_BYTES)?.to_vec();
        let n = r.len(usize::from(MAX_PAID_STAGES))?;
        let receipts = (0..n)
            .map(|_| r.bytes(MAX_RECEIPT_BYTES).map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        Ok(Self { payment, receipts })
    }
}

/// A stage to pay, as a checked receipt says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Payee {
    pub stage: u16,
    pub server: NodeId,
}

/// Checks a settlement: the payment is a valid `PayInference` op, the settlement is signed by
/// the entry node the caller named, and every receipt is signed by its server, for this
/// request, network and entry, for a distinct stage below the paid stage count. The result
/// carries the settlement's bytes, so it is stored, replayed and re-gossiped whole.
pub fn verify_settlement(signed: &Signed<Settlement>) -> Result<VerifiedOp, OpError> {
    let settlement = signed.verify()?;
    let payment = verify_op(&SignedOp::from_bytes(&settlement.payment)?)?;
    let op = *payment.op();
    let Action::PayInference {
        entry,
        request,
        stages,
        ..
    } = op.action
    else {
        return Err(OpError::Settlement(
            "the payment is not an inference payment",
        ));
    };
    if signed.signer().node_id() != entry {
        return Err(OpError::Settlement(
            "the settlement is not signed by the entry node the caller named",
        ));
    }
    if settlement.receipts.is_empty() {
        return Err(OpError::Settlement(
            "a settlement needs at least one receipt",
        ));
    }
    let mut seen = BTreeSet::new();
    let mut payees = Vec::with_capacity(settlement.receipts.len());
    for wire in &settlement.receipts {
        let envelope = Signed::<ServeReceipt>::from_bytes(wire)?;
        let receipt = envelope.verify()?;
        if envelope.signer().node_id() != receipt.server {
            return Err(OpError::Settlement("a receipt is not signed by its server"));
        }
        if receipt.network != op.network || receipt.request != request || receipt.entry != entry {
            return Err(OpError::Settlement("a receipt is for another request"));
        }
        if receipt.stage >= stages {
            return Err(OpError::Settlement(
                "a receipt names a stage the caller did not pay",
            ));
        }
        if receipt.positions == 0 {
            return Err(OpError::Settlement("a receipt covers no positions"));
        }
        if !seen.insert(receipt.stage) {
            return Err(OpError::Settlement("two receipts for one stage"));
        }
        payees.push(Payee {
            stage: receipt.stage,
            server: receipt.server,
        });
    }
    Ok(payment.with_settlement(payees, signed.to_bytes()))
}

/// Decodes and checks an op as it travels and is stored: a plain signed op, or a settlement
/// that carries an inference payment.
pub fn decode_op(wire: &[u8]) -> Result<VerifiedOp, OpError> {
    let plain = SignedOp::from_bytes(wire)?;
    match verify_op(&plain) {
        Err(OpError::Envelope(neuroshard_proof::EnvelopeError::Payload(CodecError::Domain {
            ..
        }))) => verify_settlement(&Signed::<Settlement>::from_bytes(wire)?),
        other => other,
    }
}

/// What one paid stage costs the caller and what its server gets (the rest is burned).
pub fn stage_split(per_stage: u64) -> (u64, u64) {
    let burn = crate::amount::bps_of(per_stage, INFERENCE_BURN_BPS);
    (per_stage, per_stage - burn)
}

#[cfg(test)]
mod tests;
