//! Rebuilding a ledger state from what the storage adapter read back.

use super::*;

/// What the storage adapter read back, for [`LedgerState::restore`].
pub(crate) struct Restored {
    pub rules: Rules,
    pub accounts: BTreeMap<NodeId, Account>,
    pub registrations: BTreeMap<NodeId, BTreeSet<u16>>,
    /// (node, nonce, hash, round key of a training proof)
    pub proofs: Vec<(NodeId, u64, Hash32, Option<Hash32>)>,
    pub ops: Vec<(NodeId, u64, Hash32)>,
    pub slashes: Vec<(NodeId, u64, Hash32)>,
    /// (job key, evidence hash) of applied audit verdicts.
    pub verdicts: Vec<(Hash32, Hash32)>,
    pub minted: u64,
    pub burned: u64,
}

impl LedgerState {
    /// Rebuilds the state from persisted parts (used by the storage adapter on open).
    pub(crate) fn restore(parts: Restored) -> Self {
        let Restored {
            rules,
            accounts,
            registrations,
            proofs,
            ops,
            slashes,
            verdicts,
            minted,
            burned,
        } = parts;
        let mut s = LedgerState {
            rules,
            accounts,
            registrations,
            minted,
            burned,
            ..Self::default()
        };
        for (node, nonce, hash, round_key) in proofs {
            s.proof_hashes.insert(hash);
            match round_key {
                Some(key) => {
                    s.paid_rounds.insert(key, hash);
                }
                None => {
                    s.proof_nonces.insert((node, nonce), hash);
                }
            }
        }
        s.op_hashes = ops.into_iter().map(|(a, n, h)| ((a, n), h)).collect();
        s.slashes = slashes.into_iter().map(|(a, n, h)| ((a, n), h)).collect();
        s.verdicts = verdicts.into_iter().collect();
        s.digest = s.rebuilt_digest();
        s
    }
}
