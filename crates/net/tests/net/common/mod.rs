//! Shared helpers: real swarms on 127.0.0.1 in one process, with bounded waits.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use neuroshard_net::{Address, Net, NetConfig, NetEvent, NetEvents};

/// Upper bound for any single wait in the tests.
pub const WAIT: Duration = Duration::from_secs(10);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A valid secp256k1 secret for test node `i` (1..=255).
pub fn secret(i: u8) -> [u8; 32] {
    [i; 32]
}

pub async fn start(i: u8, config: NetConfig) -> (Net, NetEvents, Address) {
    init_tracing();
    let (net, events) = Net::start(secret(i), config).await.expect("start");
    let addr = bounded(net.listen_addrs()).await.remove(0);
    (net, events, addr)
}

pub async fn bounded<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, fut).await.expect("timed out")
}

/// Waits for the first event matching `pick`, skipping others.
pub async fn next_event<T>(
    events: &mut NetEvents,
    mut pick: impl FnMut(NetEvent) -> Option<T>,
) -> T {
    bounded(async {
        loop {
            let event = events.recv().await.expect("event channel closed");
            if let Some(t) = pick(event) {
                return t;
            }
        }
    })
    .await
}

/// Retries `f` until it returns `Some`, for at most [`WAIT`].
pub async fn eventually<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    bounded(async {
        loop {
            if let Some(t) = f().await {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
}

/// Drops every event so a node's queue never fills.
pub fn drain(mut events: NetEvents) {
    tokio::spawn(async move { while events.recv().await.is_some() {} });
}
