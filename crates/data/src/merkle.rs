//! Binary Merkle tree over shard hashes, with inclusion proofs a peer can check while
//! holding only its own shard.
//!
//! Leaves are `BLAKE3(0x00 ‖ shard_hash)`, inner nodes `BLAKE3(0x01 ‖ left ‖ right)`; the
//! prefixes keep a leaf from ever being confused with an inner node. A level with an odd
//! number of nodes promotes its last node unchanged (no duplication, so two different leaf
//! lists cannot share a root the way Bitcoin's duplicated-last-node trees can).

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A 32-byte BLAKE3 digest (the same type as `neuroshard_proof::Hash32`).
pub type Hash32 = [u8; 32];

/// Why a Merkle proof or tree could not be made or checked.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MerkleError {
    #[error("a Merkle tree needs at least one leaf")]
    Empty,
    #[error("leaf index {index} is out of range for {leaf_count} leaves")]
    IndexOutOfRange { index: u64, leaf_count: u64 },
    #[error("proof has {found} sibling hashes, a tree of {leaf_count} leaves needs {expected}")]
    WrongLength {
        found: usize,
        expected: usize,
        leaf_count: u64,
    },
    #[error("proof does not lead to the expected root")]
    RootMismatch,
}

fn leaf(hash: &Hash32) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(&[0x00]);
    h.update(hash);
    *h.finalize().as_bytes()
}

fn node(left: &Hash32, right: &Hash32) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(&[0x01]);
    h.update(left);
    h.update(right);
    *h.finalize().as_bytes()
}

fn next_level(level: &[Hash32]) -> Vec<Hash32> {
    level
        .chunks(2)
        .map(|pair| match pair {
            [l, r] => node(l, r),
            [only] => *only,
            _ => unreachable!("chunks(2) yields one or two items"),
        })
        .collect()
}

/// Root over `shard_hashes` in order.
pub fn merkle_root(shard_hashes: &[Hash32]) -> Result<Hash32, MerkleError> {
    if shard_hashes.is_empty() {
        return Err(MerkleError::Empty);
    }
    let mut level: Vec<Hash32> = shard_hashes.iter().map(leaf).collect();
    while level.len() > 1 {
        level = next_level(&level);
    }
    Ok(level[0])
}

/// Proof that the shard at `index` is part of a tree of `leaf_count` shards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MerkleProof {
    pub index: u64,
    pub leaf_count: u64,
    /// Sibling hashes from the leaf level upward; levels where the node is promoted have none.
    #[serde(with = "hex_hashes")]
    pub siblings: Vec<Hash32>,
}

impl MerkleProof {
    /// Builds the proof for `index` from the full list of shard hashes.
    pub fn new(shard_hashes: &[Hash32], index: u64) -> Result<MerkleProof, MerkleError> {
        let leaf_count = shard_hashes.len() as u64;
        if leaf_count == 0 {
            return Err(MerkleError::Empty);
        }
        if index >= leaf_count {
            return Err(MerkleError::IndexOutOfRange { index, leaf_count });
        }
        let mut level: Vec<Hash32> = shard_hashes.iter().map(leaf).collect();
        let mut pos = index as usize;
        let mut siblings = Vec::new();
        while level.len() > 1 {
            let sibling = pos ^ 1;
            if sibling < level.len() {
                siblings.push(level[sibling]);
            }
            level = next_level(&level);
            pos /= 2;
        }
        Ok(MerkleProof {
            index,
            leaf_count,
            siblings,
        })
    }

    /// Checks that a shard whose file hashes to `shard_hash` sits at `self.index` under `root`.
    /// Needs nothing but this proof, the shard's hash and the root.
    pub fn verify(&self, root: &Hash32, shard_hash: &Hash32) -> Result<(), MerkleError> {
        let (index, leaf_count) = (self.index, self.leaf_count);
        if leaf_count == 0 {
            return Err(MerkleError::Empty);
        }
        if index >= leaf_count {
            return Err(MerkleError::IndexOutOfRange { index, leaf_count });
        }
        let mut acc = leaf(shard_hash);
        let (mut pos, mut n) = (index, leaf_count);
        let mut used = 0usize;
        while n > 1 {
            let promoted = pos == n - 1 && n % 2 == 1;
            if !promoted {
                let sibling = self.siblings.get(used).ok_or(MerkleError::WrongLength {
                    found: self.siblings.len(),
                    expected: used + 1,
                    leaf_count,
                })?;
                used += 1;
                acc = if pos % 2 == 0 {
                    node(&acc, sibling)
                } else {
                    node(sibling, &acc)
                };
            }
            pos /= 2;
            n = n.div_ceil(2);
        }
        if used != self.siblings.len() {
            return Err(MerkleError::WrongLength {
                found: self.siblings.len(),
                expected: used,
                leaf_count,
            });
        }
        if &acc == root {
            Ok(())
        } else {
            Err(MerkleError::RootMismatch)
        }
    }
}

mod hex_hashes {
    use super::Hash32;
    use serde::{Deserialize, Deserializer, Serializer, de::Error, ser::SerializeSeq};

    pub fn serialize<S: Serializer>(v: &[Hash32], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(v.len()))?;
        for h in v {
            seq.serialize_element(&hex::encode(h))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Hash32>, D::Error> {
        let strings = Vec::<String>::deserialize(d)?;
        strings
            .iter()
            .map(|s| {
                let mut out = [0u8; 32];
                hex::decode_to_slice(s, &mut out).map_err(D::Error::custom)?;
                Ok(out)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hashes(n: usize) -> Vec<Hash32> {
        (0..n as u32)
            .map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes())
            .collect()
    }

    proptest! {
        #[test]
        fn every_leaf_proves_and_only_at_its_index(n in 1usize..40, pick in any::<u64>()) {
            let hs = hashes(n);
            let root = merkle_root(&hs).unwrap();
            let i = (pick % n as u64) as usize;
            let proof = MerkleProof::new(&hs, i as u64).unwrap();
            prop_assert_eq!(proof.verify(&root, &hs[i]), Ok(()));
            // The same proof does not vouch for any other shard's hash.
            for (j, h) in hs.iter().enumerate() {
                if h != &hs[i] {
                    prop_assert!(proof.verify(&root, h).is_err(), "leaf {} accepted at {}", j, i);
                }
            }
            // Nor does it survive a moved index.
            if n > 1 {
                let mut moved = proof.clone();
                moved.index = (moved.index + 1) % n as u64;
                prop_assert!(moved.verify(&root, &hs[i]).is_err());
            }
        }
    }

    #[test]
    fn single_leaf_root_is_the_leaf_hash() {
        let hs = hashes(1);
        assert_eq!(merkle_root(&hs).unwrap(), leaf(&hs[0]));
        let proof = MerkleProof::new(&hs, 0).unwrap();
        assert!(proof.siblings.is_empty());
        assert_eq!(proof.verify(&merkle_root(&hs).unwrap(), &hs[0]), Ok(()));
    }

    #[test]
    fn promotion_does_not_collide_with_duplication() {
        // [a, b, c] must not share a root with [a, b, c, c].
        let mut hs = hashes(3);
        let r3 = merkle_root(&hs).unwrap();
        hs.push(hs[2]);
        assert_ne!(r3, merkle_root(&hs).unwrap());
    }

    #[test]
    fn tampered_proofs_fail() {
        let hs = hashes(7);
        let root = merkle_root(&hs).unwrap();
        let mut proof = MerkleProof::new(&hs, 3).unwrap();
        proof.siblings[1][0] ^= 1;
        assert_eq!(proof.verify(&root, &hs[3]), Err(MerkleError::RootMismatch));
        let mut short = MerkleProof::new(&hs, 3).unwrap();
        short.siblings.pop();
        assert!(matches!(
            short.verify(&root, &hs[3]),
            Err(MerkleError::WrongLength { .. })
        ));
        assert_eq!(merkle_root(&[]), Err(MerkleError::Empty));
        assert!(matches!(
            MerkleProof::new(&hs, 7),
            Err(MerkleError::IndexOutOfRange { .. })
        ));
    }

    #[test]
    fn proof_serde_round_trip() {
        let hs = hashes(5);
        let proof = MerkleProof::new(&hs, 4).unwrap();
        let json = serde_json::to_string(&proof).unwrap();
        let back: MerkleProof = serde_json::from_str(&json).unwrap();
        assert_eq!(back, proof);
    }
}
