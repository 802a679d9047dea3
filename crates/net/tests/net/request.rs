use crate::common::*;
use neuroshard_net::{Net, NetConfig, NetError, NetEvent, NetEvents};

/// Answers every request with its bytes reversed.
fn echo_server(net: Net, mut events: NetEvents) {
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let NetEvent::Request {
                mut data, channel, ..
            } = event
            {
                data.reverse();
                net.respond(channel, data);
            }
        }
    });
}

#[tokio::test]
async fn round_trip_oversize_and_counters() {
    let (a, a_events, _) = start(1, NetConfig::local()).await;
    let small = NetConfig {
        max_frame: 1024 * 1024,
        ..NetConfig::local()
    };
    let (b, b_events, b_addr) = start(2, small).await;
    echo_server(b.clone(), b_events);
    drain(a_events);
    bounded(a.dial(b_addr)).await.unwrap();

    let reply = bounded(a.request(b.node_id(), b"hello".to_vec()))
        .await
        .unwrap();
    assert_eq!(reply, b"olleh");

    // Above our own limit: refused before anything is sent.
    let huge = vec![0u8; NetConfig::local().max_frame + 1];
    let err = a.request(b.node_id(), huge).await.unwrap_err();
    assert!(matches!(err, NetError::FrameTooLarge { .. }), "{err}");

    // Above the peer's (smaller) limit: the peer refuses the frame, the request fails.
    let err = bounded(a.request(b.node_id(), vec![1u8; 2 * 1024 * 1024]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, NetError::Remote(_) | NetError::ConnectionClosed),
        "{err}"
    );

    // Both nodes stay usable; a 1 MiB - 4 byte payload still fits B's limit.
    let big = vec![7u8; 1024 * 1024 - 4];
    let reply = bounded(a.request(b.node_id(), big.clone())).await.unwrap();
    assert_eq!(reply, big);

    let c = a.counters();
    // Only complete frames count (the refused 2 MiB frame was cut off mid-write).
    assert_eq!(
        (c.request.messages_sent, c.request.messages_received),
        (2, 2),
        "{c:?}"
    );
    assert_eq!(c.request.sent_bytes, 4 + 5 + 4 + big.len() as u64);
    assert_eq!(c.request.received_bytes, c.request.sent_bytes);
    let cb = b.counters();
    assert_eq!(
        (cb.request.messages_received, cb.request.messages_sent),
        (2, 2),
        "{cb:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn request_to_a_stopped_node_fails_fast() {
    let (a, mut a_events, _) = start(3, NetConfig::local()).await;
    let (b, b_events, b_addr) = start(4, NetConfig::local()).await;
    echo_server(b.clone(), b_events);
    bounded(a.dial(b_addr)).await.unwrap();
    let b_id = b.node_id();
    next_event(&mut a_events, |e| {
        matches!(e, NetEvent::PeerConnected(p) if p == b_id).then_some(())
    })
    .await;
    assert_eq!(
        bounded(a.request(b_id, vec![1, 2])).await.unwrap(),
        vec![2, 1]
    );

    b.shutdown().await;
    assert!(matches!(
        b.request(a.node_id(), vec![]).await,
        Err(NetError::Shutdown)
    ));
    next_event(&mut a_events, |e| {
        matches!(e, NetEvent::PeerDisconnected(p) if p == b_id).then_some(())
    })
    .await;
    // Failing fast shows in the error, not the clock: a request left to hang would end in
    // NetError::Timeout (or trip the bound), never in a dial failure or a closed connection.
    let err = bounded(a.request(b_id, vec![1])).await.unwrap_err();
    assert!(
        matches!(err, NetError::DialFailure(_) | NetError::ConnectionClosed),
        "{err}"
    );
    // A node never met, with no address: refused at once, not a hang.
    let stranger = neuroshard_proof::Identity::from_secret_bytes(&secret(99))
        .unwrap()
        .node_id();
    let err = bounded(a.request(stranger, vec![1])).await.unwrap_err();
    assert!(matches!(err, NetError::UnknownPeer(_)), "{err}");
    a.shutdown().await;
}

#[tokio::test]
async fn quic_round_trip() {
    let quic = || NetConfig {
        listen: vec!["/ip4/127.0.0.1/udp/0/quic-v1".parse().unwrap()],
        ..NetConfig::local()
    };
    let (a, a_events, _) = start(5, quic()).await;
    let (b, b_events, b_addr) = start(6, quic()).await;
    assert!(b_addr.to_string().contains("/quic-v1/p2p/"), "{b_addr}");
    echo_server(b.clone(), b_events);
    drain(a_events);
    bounded(a.dial(b_addr)).await.unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
    let reply = bounded(a.request(b.node_id(), data.clone())).await.unwrap();
    assert_eq!(reply.len(), data.len());
    assert_eq!(reply[0], data[data.len() - 1]);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn penalized_peer_is_disconnected_and_blocked() {
    let (a, mut a_events, _) = start(7, NetConfig::local()).await;
    let (b, b_events, b_addr) = start(8, NetConfig::local()).await;
    echo_server(b.clone(), b_events);
    bounded(a.dial(b_addr.clone())).await.unwrap();
    let b_id = b.node_id();
    next_event(&mut a_events, |e| {
        matches!(e, NetEvent::PeerConnected(p) if p == b_id).then_some(())
    })
    .await;
    a.penalize(b_id, "test: bad gradient");
    assert_eq!(
        bounded(a.request(b_id, vec![1, 2])).await.unwrap(),
        vec![2, 1]
    );
    a.penalize_by(b_id, 1000.0, "test: forged signature");
    next_event(&mut a_events, |e| {
        matches!(e, NetEvent::PeerDisconnected(p) if p == b_id).then_some(())
    })
    .await;
    assert!(a.request(b_id, vec![1]).await.is_err());
    assert!(bounded(a.dial(b_addr)).await.is_err());
    a.shutdown().await;
    b.shutdown().await;
}
