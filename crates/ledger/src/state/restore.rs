//! Rebuilding a ledger state from what the storage adapter read back.

use super::*;

/// One stored proof.
pub(crate) struct RestoredProof {
    pub node: NodeId,
    pub nonce: u64,
    pub hash: Hash32,
    /// The round key a training proof was paid for; None for one that was not paid (the
    /// second of an equivocating pair).
    pub round_key: Option<Hash32>,
    pub training: bool,
    pub reward: u64,
}

/// What the storage adapter read back, for [`LedgerState::restore`].
pub(crate) struct Restored {
    pub rules: Rules,
    pub accounts: BTreeMap<NodeId, Account>,
    pub registrations: BTreeMap<NodeId, BTreeSet<u16>>,
    /// Latest capacity announcement per account, rebuilt from the ops like registrations.
    pub claims: BTreeMap<NodeId, (u64, u64)>,
    pub proofs: Vec<RestoredProof>,
    pub ops: Vec<(NodeId, u64, Hash32)>,
    pub slashes: Vec<(NodeId, u64, Hash32)>,
    /// Settled equivocations: (offender, nonce, round key of training proofs, evidence).
    /// Both proofs are in `proofs`.
    pub equivocations: Vec<(NodeId, u64, Option<Hash32>, Hash32)>,
    /// (job key, evidence hash) of applied audit verdicts.
    pub verdicts: Vec<(Hash32, Hash32)>,
    /// (fee key, claim hash) of paid validator fees.
    pub audit_fees: Vec<(Hash32, Hash32)>,
    /// Keys of the accounts that signed what was applied.
    pub keys: Vec<PublicKey>,
    pub minted: u64,
    pub burned: u64,
    /// Open training rounds' contributors and each stage's settled round.
    pub pot_members: Vec<(neuroshard_proof::LayerRange, u64, NodeId, Contribution)>,
    pub settled: Vec<(neuroshard_proof::LayerRange, u64)>,
}

impl LedgerState {
    /// Rebuilds the state from persisted parts (used by the storage adapter on open).
    pub(crate) fn restore(parts: Restored) -> Self {
        let Restored {
            rules,
            accounts,
            registrations,
            claims,
            proofs,
            ops,
            slashes,
            equivocations,
            verdicts,
            audit_fees,
            keys,
            minted,
            burned,
            pot_members,
            settled,
        } = parts;
        let mut s = LedgerState {
            rules,
            accounts,
            registrations,
            claims,
            minted,
            burned,
            pots: pots::Pots::restore(pot_members, settled),
            ..Self::default()
        };
        for p in proofs {
            s.proof_hashes.insert(p.hash);
            match (p.round_key, p.training) {
                (Some(key), _) => {
                    s.paid_rounds.insert(key, (p.hash, p.reward));
                }
                (None, true) => {}
                (None, false) => {
                    s.proof_nonces.insert((p.node, p.nonce), (p.hash, p.reward));
                }
            }
        }
        s.op_hashes = ops.into_iter().map(|(a, n, h)| ((a, n), h)).collect();
        s.slashes = slashes.into_iter().map(|(a, n, h)| ((a, n), h)).collect();
        for (node, nonce, round_key, evidence) in equivocations {
            match round_key {
                Some(key) => {
                    s.paid_rounds.remove(&key);
                    s.void_rounds.insert(key, evidence);
                }
                None => {
                    s.proof_nonces.remove(&(node, nonce));
                    s.slashes.insert((node, nonce), evidence);
                }
            }
        }
        s.verdicts = verdicts.into_iter().collect();
        s.audit_fees = audit_fees.into_iter().collect();
        s.keys = keys.into_iter().map(|k| (k.node_id(), k)).collect();
        s.digest = s.rebuilt_digest();
        s
    }
}
