//! One identity: the node's secp256k1 key (see `neuroshard_proof::Identity`) is also its libp2p
//! key, so the peer id, the node id and the ledger account all name the same key.
//!
//! A secp256k1 public key encodes to 37 protobuf bytes, short enough that libp2p inlines it in
//! the peer id (identity multihash); [`public_key_of`] reads it back out.

use std::collections::{BTreeMap, HashMap};
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

/// Peers the address book holds: it learns every peer heard from, and fresh keys cost nothing
/// to mint, so the one heard from least recently makes room.
pub(crate) const MAX_BOOK: usize = 65_536;

/// Node id → libp2p peer id of the peers this node heard from (at most [`MAX_BOOK`], the most
/// recently heard). Above this crate a peer is a [`NodeId`]; the node id is a hash of the key,
/// so the way back needs a peer seen once.
#[derive(Clone)]
pub(crate) struct AddressBook(Arc<Mutex<Book>>);

struct Book {
    peers: HashMap<NodeId, (PeerId, u64)>,
    /// When each peer was last heard (a counter) → the peer: the eviction order.
    heard: BTreeMap<u64, NodeId>,
    next: u64,
    capacity: usize,
}

impl Default for AddressBook {
    fn default() -> Self {
        Self::with_capacity(MAX_BOOK)
    }
}

impl AddressBook {
    pub fn with_capacity(capacity: usize) -> Self {
        Self(Arc::new(Mutex::new(Book {
            peers: HashMap::new(),
            heard: BTreeMap::new(),
            next: 0,
            capacity: capacity.max(1),
        })))
    }

    /// Records `peer` as heard now and returns its node id (`None` for peers without a
    /// secp256k1 key, which are not NeuroShard nodes).
    pub fn learn(&self, peer: &PeerId) -> Option<NodeId> {
        let node = node_of(peer)?;
        if let Ok(mut book) = self.0.lock() {
            let book = &mut *book;
            let at = book.next;
            book.next += 1;
            match book.peers.insert(node, (*peer, at)) {
                Some((_, before)) => {
                    book.heard.remove(&before);
                }
                None if book.peers.len() > book.capacity => {
                    if let Some((_, oldest)) = book.heard.pop_first() {
                        book.peers.remove(&oldest);
                    }
                }
                None => {}
            }
            book.heard.insert(at, node);
        }
        Some(node)
    }

    pub fn peer(&self, node: &NodeId) -> Option<PeerId> {
        self.0.lock().ok()?.peers.get(node).map(|(p, _)| *p)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.0.lock().map(|b| b.peers.len()).unwrap_or(0)
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

    fn fresh_peer(i: u64) -> PeerId {
        let mut secret = [0u8; 32];
        secret[..8].copy_from_slice(&(i + 1).to_be_bytes());
        secret[31] = 1;
        peer_id_from_secret(&secret).expect("a valid scalar")
    }

    /// Fresh keys cannot grow the book without bound: the least recently heard make room,
    /// and a peer heard again stays.
    #[test]
    fn a_crowd_of_fresh_keys_holds_a_bounded_book_and_recent_peers_stay() {
        let book = AddressBook::with_capacity(16);
        let regular = fresh_peer(1_000);
        let regular_node = book.learn(&regular).expect("secp256k1 peer");
        for i in 0..100 {
            book.learn(&fresh_peer(i));
            // The regular peer keeps talking.
            book.learn(&regular);
        }
        assert_eq!(book.len(), 16);
        assert_eq!(book.peer(&regular_node), Some(regular));
        let early = node_of(&fresh_peer(0)).expect("node id");
        assert_eq!(
            book.peer(&early),
            None,
            "the least recently heard made room"
        );
        let late = node_of(&fresh_peer(99)).expect("node id");
        assert_eq!(book.peer(&late), Some(fresh_peer(99)));
    }

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
