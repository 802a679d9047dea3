//! Signed account operations (transfer, stake, unstake, withdraw, burn, register, announce) and the
//! checked slash the ledger applies for consensus double-signing.
//!
//! Each is a [`Signed`] envelope: the signature is checked before the payload is decoded, and
//! the account an operation debits is always the signer's own node id, so nobody can move
//! another node's funds (the Python original let an unchecked gossip message drain wallets).

use neuroshard_proof::{
    Canonical, CodecError, EnvelopeError, Hash32, Identity, NodeId, PublicKey, Reader, Signed,
    Writer,
};

/// Ops whose timestamp is further than this from the receiver's clock are not admitted.
pub const OP_MAX_CLOCK_SKEW_MS: u64 = 5 * 60 * 1000;
/// A stake must stay locked at least this long after the op that adds it.
pub const MIN_STAKE_LOCK_MS: u64 = 24 * 60 * 60 * 1000;
/// What an account operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send `amount` to `to`; 5 % of it is burned, the recipient gets the rest.
    Transfer { to: NodeId, amount: u64 },
    /// Lock `amount` of balance as stake until `unlock_at_ms` (the lock only ever extends).
    Stake { amount: u64, unlock_at_ms: u64 },
    /// Move `amount` of unlocked stake to unbonding: it no longer counts as stake but stays
    /// slashable until the network's unbonding delay (`Rules::unbonding_ms`) after this op.
    Unstake { amount: u64 },
    /// Return every unbonded amount whose delay has passed to the balance.
    Withdraw,
    /// Destroy `amount` of balance.
    Burn { amount: u64 },
    /// Serve `stage`: the account's receipts and offers count there and its rounds there are
    /// paid, while its stake is at least the network's minimum.
    Register { stage: u16 },
    /// Announce the capacity this node offers for training: memory in bytes and measured
    /// throughput in FLOP/s. Only a staked account may; the latest announcement counts. The
    /// network's scaler reads the registered accounts' announcements (`neuroshard_growth`).
    Announce { memory_bytes: u64, flops_per_s: u64 },
    /// Pay `per_stage` to each of the first `stages` stages that serve request `request`
    /// entered at node `entry`; valid only inside that node's
    /// [`crate::inference::Settlement`], which carries the servers' receipts.
    PayInference {
        entry: NodeId,
        request: Hash32,
        per_stage: u64,
        stages: u16,
    },
}

/// One operation on the signer's own account, valid only at `nonce == account.next_nonce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountOp {
    /// The network the op belongs to (an op from another network is refused).
    pub network: Hash32,
    pub account: NodeId,
    pub nonce: u64,
    pub timestamp_ms: u64,
    pub action: Action,
}

impl AccountOp {
    pub fn sign(&self, identity: &Identity) -> SignedOp {
        Signed::sign(identity, self)
    }
}

pub type SignedOp = Signed<AccountOp>;

impl Canonical for AccountOp {
    const DOMAIN: &'static str = "neuroshard/account-op/v2";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.fixed(&self.account.0);
        w.u64(self.nonce);
        w.u64(self.timestamp_ms);
        match self.action {
            Action::Transfer { to, amount } => {
                w.u8(0);
                w.fixed(&to.0);
                w.u64(amount);
            }
            Action::Stake {
                amount,
                unlock_at_ms,
            } => {
                w.u8(1);
                w.u64(amount);
                w.u64(unlock_at_ms);
            }
            Action::Unstake { amount } => {
                w.u8(2);
                w.u64(amount);
            }
            Action::Burn { amount } => {
                w.u8(3);
                w.u64(amount);
            }
            Action::Register { stage } => {
                w.u8(4);
                w.u16(stage);
            }
            Action::PayInference {
                entry,
                request,
                per_stage,
                stages,
            } => {
                w.u8(5);
                w.fixed(&entry.0);
                w.fixed(&request);
                w.u64(per_stage);
                w.u16(stages);
            }
            Action::Announce {
                memory_bytes,
                flops_per_s,
            } => {
                w.u8(6);
                w.u64(memory_bytes);
                w.u64(flops_per_s);
            }
            Action::Withdraw => w.u8(7),
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let network = r.array()?;
        let account = NodeId(r.array()?);
        let nonce = r.u64()?;
        let timestamp_ms = r.u64()?;
        let action = match r.u8()? {
            0 => Action::Transfer {
                to: NodeId(r.array()?),
                amount: r.u64()?,
            },
            1 => Action::Stake {
                amount: r.u64()?,
                unlock_at_ms: r.u64()?,
            },
            2 => Action::Unstake { amount: r.u64()? },
            3 => Action::Burn { amount: r.u64()? },
            4 => Action::Register { stage: r.u16()? },
            5 => Action::PayInference {
                entry: NodeId(r.array()?),
                request: r.array()?,
                per_stage: r.u64()?,
                stages: r.u16()?,
            },
            6 => Action::Announce {
                memory_bytes: r.u64()?,
                flops_per_s: r.u64()?,
            },
            7 => Action::Withdraw,
            other => {
                return Err(CodecError::Invalid {
                    field: "action",
                    reason: format!("unknown action tag {other}"),
                });
            }
        };
        Ok(Self {
            network,
            account,
            nonce,
            timestamp_ms,
            action,
        })
    }
}

/// Why a signed op is refused before it reaches the ledger rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    #[error("envelope: {0}")]
    Envelope(#[from] EnvelopeError),
    #[error("op debits account {claimed} but is signed by {signer}")]
    NotSigner { claimed: NodeId, signer: NodeId },
    #[error(
        "op timestamp {timestamp_ms} is more than {OP_MAX_CLOCK_SKEW_MS} ms from now ({now_ms})"
    )]
    Clock { timestamp_ms: u64, now_ms: u64 },
    #[error("inference settlement: {0}")]
    Settlement(&'static str),
}

/// An op whose signature and signer binding were checked. Only [`verify_op`] builds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedOp {
    op: AccountOp,
    /// The key that signed it (the account's: its node id derives from it).
    signer: PublicKey,
    hash: Hash32,
    bytes: Vec<u8>,
    /// The stages an inference payment pays (empty for every other op).
    payees: Vec<crate::inference::Payee>,
}

impl VerifiedOp {
    /// The account's key, which signed the op.
    pub fn signer(&self) -> PublicKey {
        self.signer
    }

    pub fn op(&self) -> &AccountOp {
        &self.op
    }

    /// BLAKE3 of the signed payload.
    pub fn hash(&self) -> Hash32 {
        self.hash
    }

    /// Wire bytes of the envelope (kept for audit and re-gossip): the settlement's, for an
    /// inference payment.
    pub fn wire_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The receipted stages an inference payment pays.
    pub fn payees(&self) -> &[crate::inference::Payee] {
        &self.payees
    }

    /// The payment as its checked settlement carries it (hash: the payment op's own).
    pub(crate) fn with_settlement(
        self,
        payees: Vec<crate::inference::Payee>,
        settlement_wire: Vec<u8>,
    ) -> Self {
        Self {
            payees,
            bytes: settlement_wire,
            ..self
        }
    }
}

/// Checks signature (low-S included) and that the debited account is the signer's.
pub fn verify_op(signed: &SignedOp) -> Result<VerifiedOp, OpError> {
    let op = signed.verify()?;
    let signer = signed.signer().node_id();
    if op.account != signer {
        return Err(OpError::NotSigner {
            claimed: op.account,
            signer,
        });
    }
    Ok(VerifiedOp {
        op,
        signer: signed.signer(),
        hash: signed.payload_hash(),
        bytes: signed.to_bytes(),
        payees: Vec::new(),
    })
}

/// Admission check for freshly gossiped ops. The ledger rules themselves never read a clock
/// (they use the signed timestamp) so that replaying history gives the same result.
pub fn check_fresh(op: &AccountOp, now_ms: u64) -> Result<(), OpError> {
    if op.timestamp_ms.abs_diff(now_ms) > OP_MAX_CLOCK_SKEW_MS {
        return Err(OpError::Clock {
            timestamp_ms: op.timestamp_ms,
            now_ms,
        });
    }
    Ok(())
}

/// A checked slash: who cheated, at which nonce, and who reported it. Built from consensus
/// double-sign evidence (`neuroshard_node::finality::evidence`), which convicts only its
/// signer. A proof equivocation needs no slash message: the two signed proofs themselves
/// settle it on every ledger (`state/equivocation.rs`), and each is bound to its signer's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedSlash {
    pub offender: NodeId,
    pub nonce: u64,
    pub reporter: NodeId,
    /// Order-independent hash of the evidence (the same evidence in either order is one).
    pub evidence_hash: Hash32,
    pub timestamp_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuroshard_proof::fixtures::test_identity;

    #[test]
    fn op_roundtrip_and_signer_binding() {
        let alice = test_identity(1);
        let bob = test_identity(2);
        let op = AccountOp {
            network: [0; 32],
            account: alice.node_id(),
            nonce: 0,
            timestamp_ms: 5,
            action: Action::Transfer {
                to: bob.node_id(),
                amount: 10,
            },
        };
        let signed = op.sign(&alice);
        assert_eq!(verify_op(&signed).map(|v| *v.op()), Ok(op));
        let stolen = op.sign(&bob);
        assert!(matches!(verify_op(&stolen), Err(OpError::NotSigner { .. })));
        assert!(check_fresh(&op, 5 + OP_MAX_CLOCK_SKEW_MS).is_ok());
        assert!(check_fresh(&op, 6 + OP_MAX_CLOCK_SKEW_MS).is_err());
    }
}
