use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use neuroshard_net::{NetConfig, NetEvent, Validation};

const TOPIC: &str = "neuroshard/test";

fn config() -> NetConfig {
    NetConfig {
        topics: vec![TOPIC.to_string()],
        gossip_validator: Arc::new(|topic, _author, data| {
            if topic != TOPIC {
                Validation::Ignore
            } else if data.starts_with(b"bad") {
                Validation::Reject
            } else {
                Validation::Accept
            }
        }),
        ..NetConfig::local()
    }
}

fn gossip(e: NetEvent) -> Option<(String, neuroshard_net::NodeId, Vec<u8>)> {
    match e {
        NetEvent::Gossip {
            topic,
            author,
            data,
        } => Some((topic, author, data)),
        _ => None,
    }
}

#[tokio::test]
async fn accepted_messages_reach_all_rejected_ones_none() {
    let (a, a_events, a_addr) = start(11, config()).await;
    let (b, mut b_events, _) = start(12, config()).await;
    let (c, mut c_events, _) = start(13, config()).await;
    drain(a_events);
    // A line: B - A - C, so C only hears B through A's forwarding.
    bounded(b.dial(a_addr.clone())).await.unwrap();
    bounded(c.dial(a_addr)).await.unwrap();
    // Subscriptions propagate and meshes form on 1 s heartbeats: B publishes probes until
    // one reaches C through A, which is the event the rest of the test needs.
    bounded(async {
        for i in 0u32.. {
            b.publish(TOPIC, format!("probe {i}").into_bytes()).unwrap();
            // How long to listen before the next probe, not an expectation.
            let heard = tokio::time::timeout(Duration::from_millis(500), async {
                while let Some(e) = c_events.recv().await {
                    if gossip(e).is_some_and(|(_, _, data)| data.starts_with(b"probe")) {
                        return;
                    }
                }
            })
            .await;
            if heard.is_ok() {
                return;
            }
        }
    })
    .await;

    b.publish(TOPIC, b"bad message".to_vec()).unwrap();
    b.publish(TOPIC, b"good message".to_vec()).unwrap();
    // B sends both to A in this order, so had A accepted the bad one it would have forwarded
    // it to C before the good one: waiting for the good one is enough to know it did not.
    let (topic, author, data) = next_event(&mut c_events, |e| {
        let (topic, author, data) = gossip(e)?;
        assert_ne!(data, b"bad message", "a rejected message was forwarded");
        (!data.starts_with(b"probe")).then_some((topic, author, data))
    })
    .await;
    assert_eq!(
        (topic.as_str(), author, data.as_slice()),
        (TOPIC, b.node_id(), &b"good message"[..])
    );

    c.publish(TOPIC, b"from c".to_vec()).unwrap();
    let (_, author, data) = next_event(&mut b_events, gossip).await;
    assert_eq!((author, data.as_slice()), (c.node_id(), &b"from c"[..]));

    assert!(b.counters().gossip.messages_sent >= 2);
    assert!(c.counters().gossip.messages_received >= 1);
    // Too large for gossip: refused locally.
    assert!(b.publish(TOPIC, vec![0; 2 * 1024 * 1024]).is_err());
    for n in [a, b, c] {
        n.shutdown().await;
    }
}
