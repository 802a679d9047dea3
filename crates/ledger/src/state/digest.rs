//! An incremental, order-independent digest of the ledger's contents (LtHash16: Bellare and
//! Micciancio's additive hash with the parameters of Lewi et al., "Securing Update
//! Propagation with Homomorphic Hashing", 2019: 1024 lanes of u16, ~200-bit security).
//!
//! Every element (an account with its registrations, a paid round key, a proof, op or slash
//! hash) is expanded by BLAKE3 to 2 KiB and added lane by lane; removing it subtracts the
//! same. Two ledgers holding the same elements hold the same digest whatever the order, and an
//! update costs one expansion instead of rehashing the whole ledger: `state_hash` used to sort
//! and hash every applied proof, and a node asks for it after each applied proof, which made
//! a network's ledger work grow as proofs².

use neuroshard_proof::NodeId;

use super::Account;

const LANES: usize = 1024;

/// What kind of element is added, so that one 32-byte value in two sets counts twice.
#[derive(Debug, Clone, Copy)]
pub(super) enum Set {
    /// A proof that is not paid by round (its hash).
    Proof = 0,
    /// A paid (node, stage, round) key.
    Round = 1,
    Op = 2,
    Slash = 3,
    /// A paid validator fee's (auditor, worker, stage, round) key.
    Fee = 4,
    /// A stage's highest settled round (`state/pots.rs`).
    Settled = 5,
}

#[derive(Clone, PartialEq, Eq)]
pub(super) struct Digest([u16; LANES]);

impl Default for Digest {
    fn default() -> Self {
        Self([0; LANES])
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Digest({})",
            hex::encode(self.bytes().get(..8).unwrap_or(&[]))
        )
    }
}

fn expand(tag: &[u8], parts: &[&[u8]]) -> [u16; LANES] {
    let mut h = blake3::Hasher::new();
    h.update(b"neuroshard/ledger-element/v1");
    h.update(tag);
    for p in parts {
        h.update(p);
    }
    let mut bytes = [0u8; 2 * LANES];
    h.finalize_xof().fill(&mut bytes);
    let mut lanes = [0u16; LANES];
    for (lane, pair) in lanes.iter_mut().zip(bytes.chunks_exact(2)) {
        *lane = u16::from_le_bytes([pair[0], pair[1]]);
    }
    lanes
}

/// An account's element: its values and the stages it registered for.
fn account_lanes<'a>(
    id: &NodeId,
    a: &Account,
    stages: impl Iterator<Item = &'a u16>,
) -> [u16; LANES] {
    let mut buf = Vec::with_capacity(32 + 6 * 8 + 16);
    buf.extend_from_slice(&id.0);
    for v in [
        a.balance,
        a.stake,
        a.unlock_at_ms,
        a.next_nonce,
        a.unbonding,
        a.unbonding_until_ms,
    ] {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    for s in stages {
        buf.extend_from_slice(&s.to_le_bytes());
    }
    expand(b"account", &[&buf])
}

impl Digest {
    fn add(&mut self, lanes: &[u16; LANES]) {
        for (d, l) in self.0.iter_mut().zip(lanes) {
            *d = d.wrapping_add(*l);
        }
    }

    fn sub(&mut self, lanes: &[u16; LANES]) {
        for (d, l) in self.0.iter_mut().zip(lanes) {
            *d = d.wrapping_sub(*l);
        }
    }

    pub(super) fn insert(&mut self, set: Set, value: &[u8; 32]) {
        self.add(&expand(&[set as u8], &[value]));
    }

    pub(super) fn remove(&mut self, set: Set, value: &[u8; 32]) {
        self.sub(&expand(&[set as u8], &[value]));
    }

    pub(super) fn add_account<'a>(
        &mut self,
        id: &NodeId,
        a: &Account,
        stages: impl Iterator<Item = &'a u16>,
    ) {
        self.add(&account_lanes(id, a, stages));
    }

    pub(super) fn remove_account<'a>(
        &mut self,
        id: &NodeId,
        a: &Account,
        stages: impl Iterator<Item = &'a u16>,
    ) {
        self.sub(&account_lanes(id, a, stages));
    }

    pub(super) fn bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|l| l.to_le_bytes()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_does_not_matter_and_removal_undoes_an_insert() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let mut x = Digest::default();
        x.insert(Set::Round, &a);
        x.insert(Set::Op, &b);
        let mut y = Digest::default();
        y.insert(Set::Op, &b);
        y.insert(Set::Round, &a);
        assert_eq!(x, y);
        // The same value in another set is another element.
        let mut z = Digest::default();
        z.insert(Set::Proof, &a);
        z.insert(Set::Op, &b);
        assert_ne!(x, z);
        let id = NodeId([3; 32]);
        let acct = Account {
            balance: 5,
            ..Account::default()
        };
        x.add_account(&id, &acct, [1u16].iter());
        assert_ne!(x, y);
        // Other registrations make another element.
        x.remove_account(&id, &acct, [2u16].iter());
        assert_ne!(x, y);
        x.add_account(&id, &acct, [2u16].iter());
        x.remove_account(&id, &acct, [1u16].iter());
        assert_eq!(x, y);
    }
}
