use std::sync::Arc;

use crate::common::*;
use neuroshard_net::{NetConfig, NetError};

#[tokio::test]
async fn blobs_are_fetched_checked_and_capped() {
    let (a, a_events, _) = start(31, NetConfig::local()).await;
    let (b, b_events, b_addr) = start(32, NetConfig::local()).await;
    drain(a_events);
    drain(b_events);
    bounded(a.dial(b_addr)).await.unwrap();

    let data: Vec<u8> = (0..5 * 1024 * 1024u32)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let hash = b.offer_blob(Arc::new(data.clone()));
    assert_eq!(&hash, blake3::hash(&data).as_bytes());

    let got = bounded(a.fetch_blob(b.node_id(), hash, data.len()))
        .await
        .unwrap();
    assert!(got == data);
    let blob = a.counters().blob;
    assert!(
        blob.received_bytes >= data.len() as u64 && blob.messages_sent == 5,
        "{blob:?}"
    );

    let err = bounded(a.fetch_blob(b.node_id(), [9; 32], 1 << 30))
        .await
        .unwrap_err();
    assert!(matches!(err, NetError::BlobNotFound), "{err}");
    let err = bounded(a.fetch_blob(b.node_id(), hash, data.len() - 1))
        .await
        .unwrap_err();
    assert!(matches!(err, NetError::BlobTooLarge { .. }), "{err}");

    b.withdraw_blob(hash);
    let err = bounded(a.fetch_blob(b.node_id(), hash, data.len()))
        .await
        .unwrap_err();
    assert!(matches!(err, NetError::BlobNotFound), "{err}");
    a.shutdown().await;
    b.shutdown().await;
}
