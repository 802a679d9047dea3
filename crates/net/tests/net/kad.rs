use std::sync::Arc;

use crate::common::*;
use neuroshard_net::{NetConfig, NetError};

/// Honest nodes refuse any value starting with "bad".
fn honest() -> NetConfig {
    NetConfig {
        record_validator: Arc::new(|_key, value, _publisher| !value.starts_with(b"bad")),
        ..NetConfig::local()
    }
}

#[tokio::test]
async fn records_and_providers_across_three_nodes() {
    let (b, b_events, b_addr) = start(21, honest()).await;
    let boot = |cfg: NetConfig| NetConfig {
        bootstrap: vec![b_addr.clone()],
        ..cfg
    };
    // A accepts anything: it plays a peer that stores and serves invalid records.
    let (a, a_events, _) = start(22, boot(NetConfig::local())).await;
    let (c, c_events, _) = start(23, boot(honest())).await;
    for e in [a_events, b_events, c_events] {
        drain(e);
    }

    // One-node-style local behaviour first: our own invalid record is refused.
    assert!(matches!(
        c.put_record(b"k0".to_vec(), b"bad".to_vec()).await,
        Err(NetError::InvalidRecord)
    ));

    bounded(a.put_record(b"k1".to_vec(), b"v1".to_vec()))
        .await
        .unwrap();
    bounded(a.put_record(b"k2".to_vec(), b"bad v2".to_vec()))
        .await
        .unwrap();
    let found = eventually(|| async {
        let v = c.get_record(b"k1".to_vec()).await.unwrap();
        (!v.is_empty()).then_some(v)
    })
    .await;
    assert_eq!(found, vec![b"v1".to_vec()]);
    // A serves the invalid record when asked; C drops it on read, B never stored it.
    assert_eq!(
        bounded(a.get_record(b"k2".to_vec())).await.unwrap(),
        vec![b"bad v2".to_vec()]
    );
    assert!(
        bounded(c.get_record(b"k2".to_vec()))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        bounded(b.get_record(b"k2".to_vec()))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        bounded(c.get_record(b"missing".to_vec()))
            .await
            .unwrap()
            .is_empty()
    );

    bounded(a.start_providing(b"shard-7".to_vec()))
        .await
        .unwrap();
    let providers = bounded(a.get_providers(b"shard-7".to_vec())).await.unwrap();
    assert!(providers.contains(&a.node_id()));
    let providers = eventually(|| async {
        let p = c.get_providers(b"shard-7".to_vec()).await.unwrap();
        p.contains(&a.node_id()).then_some(p)
    })
    .await;
    assert_eq!(providers.len(), 1);
    assert!(c.counters().kad_queries >= 4);
    for n in [a, b, c] {
        n.shutdown().await;
    }
}

#[tokio::test]
async fn single_node_records() {
    let (a, a_events, _) = start(24, honest()).await;
    drain(a_events);
    bounded(a.put_record(b"k".to_vec(), b"v".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        bounded(a.get_record(b"k".to_vec())).await.unwrap(),
        vec![b"v".to_vec()]
    );
    bounded(a.start_providing(b"p".to_vec())).await.unwrap();
    assert!(
        bounded(a.get_providers(b"p".to_vec()))
            .await
            .unwrap()
            .contains(&a.node_id())
    );
    let too_big = vec![0u8; neuroshard_net::MAX_RECORD_VALUE + 1];
    assert!(a.put_record(b"big".to_vec(), too_big).await.is_err());
    a.shutdown().await;
}

#[tokio::test]
async fn records_live_while_republished_and_expire_after_the_author_leaves() {
    use std::time::Duration;
    // Republished five times per TTL, so a loaded machine must delay republication by most
    // of a TTL before the "alive" check below can fail.
    let ttl = Duration::from_secs(2);
    let short = || NetConfig {
        record_ttl: ttl,
        republish_interval: ttl / 5,
        ..NetConfig::local()
    };
    let (b, b_events, b_addr) = start(25, short()).await;
    let (a, a_events, _) = start(
        26,
        NetConfig {
            bootstrap: vec![b_addr],
            ..short()
        },
    )
    .await;
    drain(a_events);
    drain(b_events);
    bounded(a.put_record(b"alive".to_vec(), b"yes".to_vec()))
        .await
        .unwrap();
    // Twice the TTL: only republication keeps B's copy. (The wait is what is tested: a lower
    // bound, with no upper margin to miss.)
    tokio::time::sleep(2 * ttl).await;
    a.shutdown().await;
    let got = bounded(b.get_record(b"alive".to_vec())).await.unwrap();
    assert_eq!(got, vec![b"yes".to_vec()]);
    // Without its author the record expires: wait for that, within the generous bound of
    // `eventually` (five TTLs), instead of checking at a fixed instant after one TTL.
    eventually(|| async {
        let got = b.get_record(b"alive".to_vec()).await.ok()?;
        got.is_empty().then_some(())
    })
    .await;
    b.shutdown().await;
}

/// A peer announcing itself as provider of keys nobody looks up used to fill the store's key
/// budget, after which the victim could not even announce its own stage. Now the victim's
/// provider validator refuses such entries and lookups drop them.
#[tokio::test]
async fn junk_provider_keys_are_refused_and_cannot_crowd_out_our_own() {
    let victim_config = || NetConfig {
        provider_validator: Arc::new(|key, _provider| key.starts_with(b"stage/")),
        // Room for 2 keys with providers.
        max_dht_keys: 8,
        ..NetConfig::local()
    };
    let (victim, victim_events, victim_addr) = start(27, victim_config()).await;
    let (hostile, hostile_events, _) = start(
        28,
        NetConfig {
            bootstrap: vec![victim_addr],
            ..NetConfig::local()
        },
    )
    .await;
    drain(victim_events);
    drain(hostile_events);
    for i in 0..6 {
        bounded(hostile.start_providing(format!("junk-{i}").into_bytes()))
            .await
            .unwrap();
    }
    // Every junk entry reached the victim and was refused there.
    eventually(|| async { (victim.counters().providers_refused >= 6).then_some(()) }).await;
    bounded(victim.start_providing(b"stage/0".to_vec()))
        .await
        .expect("the victim's store still has room for its own announcement");
    // Lookups drop providers of keys the validator refuses, whoever serves them.
    assert!(
        bounded(victim.get_providers(b"junk-0".to_vec()))
            .await
            .unwrap()
            .is_empty()
    );
    bounded(hostile.start_providing(b"stage/1".to_vec()))
        .await
        .unwrap();
    let found = eventually(|| async {
        let p = victim.get_providers(b"stage/1".to_vec()).await.unwrap();
        (!p.is_empty()).then_some(p)
    })
    .await;
    assert!(found.contains(&hostile.node_id()));
    for n in [victim, hostile] {
        n.shutdown().await;
    }
}
