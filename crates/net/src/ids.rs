//! One identity: the node's secp256k1 key (see `neuroshard_proof::Identity`) is also its libp2p
//! key, so the peer id, the node id and the ledger account all name the same key.
//!
//! A secp256k1 public key encodes to 37 protobuf bytes, short enough that libp2p inlines it in
//! the peer id (identity multihash); [`public_key_of`] reads it back out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use libp2p::PeerId;
use libp2p::identity::{self, Keypair};
use neuroshard_proof::{NodeId, PublicKey};

use crate::NetError;

/// The node id of a peer id that inlines a secp256k1 key; `None` for any other peer.
pub(crate) fn node_of(peer: &PeerId) -> Option<NodeId> {
    let key = public_key_of(peer)?;
    PublicKey::from_bytes(&key).ok().map(|k| k.node_id())
}

/// Node id → libp2p peer id of every peer this node heard from. Above this crate a peer is a
/// [`NodeId`]; the node id is a hash of the key, so the way back needs a peer seen once.
#[derive(Clone, Default)]
pub(crate) struct AddressBook(Arc<Mutex<HashMap<NodeId, PeerId>>>);

impl AddressBook {
    /// Records `peer` and returns its node id (`None` for peers without a secp256k1 key,
    /// which are not NeuroShard nodes).
    pub fn learn(&self, peer: &PeerId) -> Option<NodeId> {
        let node = node_of(peer)?;
        if let Ok(mut book) = self.0.lock() {
            book.insert(node, *peer);
        }
        Some(node)
    }

    pub fn peer(&self, node: &NodeId) -> Option<PeerId> {
        self.0.lock().ok()?.get(node).copied()
    }
}

/// Multihash code of the identity "hash" (the digest is the input itself).
const IDENTITY_MULTIHASH: u64 = 0x00;

/// The libp2p keypair for a node secret (32-byte big-endian secp256k1 scalar).
pub(crate) fn keypair_from_secret(secret: &[u8; 32]) -> Result<Keypair, NetError> {
    let mut bytes = *secret;
    let sk = identity::secp256k1::SecretKey::try_from_bytes(&mut bytes)
        .map_err(|_| NetError::InvalidSecret)?;
    Ok(Keypair::from(identity::secp256k1::Keypair::from(sk)))
}

/// The peer id of the node with this secret.
#[cfg(test)]
pub(crate) fn peer_id_from_secret(secret: &[u8; 32]) -> Result<PeerId, NetError> {
    Ok(keypair_from_secret(secret)?.public().to_peer_id())
}

/// The compressed (SEC1, 33-byte) secp256k1 key inlined in a peer id; `None` for peer ids of
/// other key types or hashed (non-inlined) keys.
pub(crate) fn public_key_of(peer: &PeerId) -> Option<[u8; 33]> {
    let mh = peer.as_ref();
    if mh.code() != IDENTITY_MULTIHASH {
        return None;
    }
    let public = identity::PublicKey::try_decode_protobuf(mh.digest()).ok()?;
    let key = public.try_into_secp256k1().ok()?;
    Some(key.to_bytes())
}

/// The peer id of a compressed secp256k1 public key.
pub(crate) fn peer_id_of(public_key: &[u8; 33]) -> Result<PeerId, NetError> {
    let key = identity::secp256k1::PublicKey::try_from_bytes(public_key)
        .map_err(|_| NetError::InvalidPublicKey)?;
    Ok(identity::PublicKey::from(key).to_peer_id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let secret = [7u8; 32];
        let peer = peer_id_from_secret(&secret).unwrap();
        let pk = public_key_of(&peer).unwrap();
        assert_eq!(peer_id_of(&pk).unwrap(), peer);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(peer_id_from_secret(&[0u8; 32]).is_err());
        assert!(peer_id_from_secret(&[0xff; 32]).is_err());
        assert!(peer_id_of(&[0u8; 33]).is_err());
        let ed = Keypair::generate_ed25519().public().to_peer_id();
        assert_eq!(public_key_of(&ed), None);
        assert_eq!(public_key_of(&PeerId::random()), None);
    }
}
