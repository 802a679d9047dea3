//! One identity: the transport's key is the node's key, so the node id the network reports is
//! the ledger account of the same secret.

use crate::common::{bounded, secret, start};
use neuroshard_net::{Net, NetConfig};
use neuroshard_proof::Identity;

#[tokio::test]
async fn the_network_speaks_for_the_same_key_as_the_identity() {
    for i in [1u8, 7, 200] {
        let identity = Identity::from_secret_bytes(&secret(i)).unwrap();
        let (net, _events, _) = start(i, NetConfig::local()).await;
        assert_eq!(net.node_id(), identity.node_id());
        // A node known only by its key (e.g. a record's signer) becomes reachable by node id.
        let other = Identity::from_secret_bytes(&secret(i + 1)).unwrap();
        assert_eq!(
            net.learn_key(&other.public_key().to_bytes()),
            Some(other.node_id())
        );
        assert_eq!(net.learn_key(&[0; 33]), None);
        bounded(net.shutdown()).await;
    }
}

#[tokio::test]
async fn invalid_secrets_are_refused() {
    for bad in [[0u8; 32], [0xff; 32]] {
        assert!(Net::start(bad, NetConfig::local()).await.is_err());
    }
}
