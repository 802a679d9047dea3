use neuroshard_net::{peer_id_from_secret, peer_id_of, public_key_of};
use neuroshard_proof::Identity;

#[test]
fn peer_id_carries_the_identity_key() {
    for i in 1..=20u8 {
        let secret = [i; 32];
        let identity = Identity::from_secret_bytes(&secret).unwrap();
        let peer = peer_id_from_secret(&identity.secret_bytes()).unwrap();
        let key = public_key_of(&peer).unwrap();
        assert_eq!(key, identity.public_key().to_bytes());
        assert_eq!(peer_id_of(&key).unwrap(), peer);
        // The node id (ledger account) follows from the key inside the peer id.
        let pk = neuroshard_proof::PublicKey::from_bytes(&key).unwrap();
        assert_eq!(pk.node_id(), identity.node_id());
    }
}

#[test]
fn invalid_secrets_and_keys_are_errors() {
    assert!(peer_id_from_secret(&[0; 32]).is_err());
    assert!(peer_id_from_secret(&[0xff; 32]).is_err());
    assert!(peer_id_of(&[0; 33]).is_err());
}
