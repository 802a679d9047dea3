//! The soak's hostile process: one thread (in its own network namespace when the swarm runs
//! in namespaces) that floods one node with junk two ways at once: raw TCP connections to its
//! listen port writing garbage (half of them after a valid multistream header, so the junk
//! reaches the next protocol step), and a real libp2p peer that dials it and publishes junk
//! on every gossip topic of the network. It counts what it sent; the soak judges the victim.

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use neuroshard_linkem::Rng;
use neuroshard_net::{Address, Net, NetConfig, NetError};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use crate::SwarmError;

/// Concurrent raw junk connections.
const CONNECTIONS: usize = 16;
/// Each writes this much every [`JUNK_EVERY`], and is dropped (and made again) after
/// [`CONN_LIFE`]: connection churn as well as bytes.
const JUNK_CHUNK: usize = 8 * 1024;
const JUNK_EVERY: Duration = Duration::from_millis(100);
const CONN_LIFE: Duration = Duration::from_secs(5);
/// Junk gossip messages per second, spread over the topics.
const GOSSIP_PER_SEC: u64 = 50;
const REDIAL: Duration = Duration::from_secs(10);
const MULTISTREAM: &[u8] = b"\x13/multistream/1.0.0\n";

/// Where and whom to flood.
#[derive(Debug, Clone)]
pub struct Target {
    pub node: usize,
    /// The victim's TCP listen address.
    pub tcp: SocketAddr,
    /// Its full multiaddr (with `/p2p/<peer id>`), for the libp2p peer.
    pub p2p: String,
    pub topics: Vec<String>,
}

/// What the hostile process sent.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FloodStats {
    pub node: usize,
    pub secs: f64,
    pub tcp_connections: u64,
    pub tcp_connect_errors: u64,
    pub junk_bytes: u64,
    pub p2p_dialled: bool,
    pub p2p_error: Option<String>,
    pub p2p_dial_errors: u64,
    pub gossip_sent: u64,
    pub gossip_errors: u64,
}

#[derive(Default)]
struct Counts {
    conns: AtomicU64,
    conn_errors: AtomicU64,
    bytes: AtomicU64,
    gossip: AtomicU64,
    gossip_errors: AtomicU64,
    dial_errors: AtomicU64,
}

/// A running flood; [`Flood::stop`] ends it and returns its figures.
pub struct Flood {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<FloodStats>,
}

/// The victim's TCP address and full multiaddr among its listen addresses.
pub fn tcp_target(addrs: &[String]) -> Option<(SocketAddr, String)> {
    addrs.iter().find_map(|a| {
        let parts: Vec<&str> = a.split('/').collect();
        match parts.as_slice() {
            ["", "ip4", ip, "tcp", port, "p2p", _] => {
                let sock = format!("{ip}:{port}").parse().ok()?;
                Some((sock, a.clone()))
            }
            _ => None,
        }
    })
}

impl Flood {
    /// Starts flooding `target` from namespace `netns` (None: this one), the hostile peer
    /// listening on `listen_ip`.
    pub fn start(
        target: Target,
        netns: Option<String>,
        listen_ip: String,
        seed: u64,
    ) -> Result<Flood, SwarmError> {
        let ns = match &netns {
            Some(name) => {
                let path = format!("/var/run/netns/{name}");
                Some(File::open(&path).map_err(|e| SwarmError::io(path.as_ref(), e))?)
            }
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("flood".into())
            .spawn(move || run(target, ns, listen_ip, seed, flag))
            .map_err(|e| SwarmError::io("flood thread".as_ref(), e))?;
        Ok(Flood { stop, handle })
    }

    pub fn stop(self) -> FloodStats {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().unwrap_or_else(|_| FloodStats {
            p2p_error: Some("the flood thread panicked".into()),
            ..FloodStats::default()
        })
    }
}

fn run(
    target: Target,
    ns: Option<File>,
    listen_ip: String,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> FloodStats {
    let started = Instant::now();
    let mut stats = FloodStats {
        node: target.node,
        ..FloodStats::default()
    };
    if let Some(ns) = ns {
        // SAFETY: setns(2) on a namespace fd we hold; it moves only this thread, and the
        // sockets (and the runtime's threads) made after it live in that namespace.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            stats.p2p_error = Some(format!(
                "entering the flood namespace: {}",
                std::io::Error::last_os_error()
            ));
            return stats;
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            stats.p2p_error = Some(format!("runtime: {e}"));
            return stats;
        }
    };
    let counts = Arc::new(Counts::default());
    let p2p = rt.block_on(async {
        for i in 0..CONNECTIONS {
            let c = counts.clone();
            let stop = stop.clone();
            let rng = Rng::new(seed.wrapping_add(i as u64));
            tokio::spawn(junk_connection(target.tcp, i % 2 == 0, rng, c, stop));
        }
        gossip(&target, &listen_ip, seed, &counts, &stop).await
    });
    stats.p2p_dialled = p2p.is_ok();
    stats.p2p_error = p2p.err().map(|e| e.to_string());
    stats.secs = started.elapsed().as_secs_f64();
    stats.tcp_connections = counts.conns.load(Ordering::Relaxed);
    stats.tcp_connect_errors = counts.conn_errors.load(Ordering::Relaxed);
    stats.junk_bytes = counts.bytes.load(Ordering::Relaxed);
    stats.gossip_sent = counts.gossip.load(Ordering::Relaxed);
    stats.gossip_errors = counts.gossip_errors.load(Ordering::Relaxed);
    stats.p2p_dial_errors = counts.dial_errors.load(Ordering::Relaxed);
    stats
}

fn junk(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// Connects, writes junk until the node hangs up or the connection's life ends, again.
async fn junk_connection(
    to: SocketAddr,
    header: bool,
    mut rng: Rng,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let conn = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(to));
        let mut stream = match conn.await {
            Ok(Ok(s)) => s,
            _ => {
                counts.conn_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        counts.conns.fetch_add(1, Ordering::Relaxed);
        if header && stream.write_all(MULTISTREAM).await.is_err() {
            continue;
        }
        let born = Instant::now();
        while !stop.load(Ordering::Relaxed) && born.elapsed() < CONN_LIFE {
            let chunk = junk(&mut rng, JUNK_CHUNK);
            match tokio::time::timeout(Duration::from_secs(1), stream.write_all(&chunk)).await {
                Ok(Ok(())) => counts
                    .bytes
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed),
                _ => break,
            };
            tokio::time::sleep(JUNK_EVERY).await;
        }
    }
}

/// Why the hostile libp2p peer could not flood.
#[derive(Debug, thiserror::Error)]
enum FloodError {
    #[error("address: {0}")]
    Address(#[from] NetError),
    #[error("could not start the hostile libp2p peer")]
    Start,
    #[error("no topic to flood")]
    NoTopic,
    #[error("dialling the victim: {0}")]
    Dial(NetError),
    #[error("never dialled the victim")]
    NeverDialled,
}

/// A libp2p peer with a fresh key: dials the victim and publishes junk on every topic.
async fn gossip(
    target: &Target,
    listen_ip: &str,
    seed: u64,
    counts: &Counts,
    stop: &AtomicBool,
) -> Result<(), FloodError> {
    let mut rng = Rng::new(seed ^ 0x5EED);
    let listen: Address = format!("/ip4/{listen_ip}/tcp/0").parse()?;
    let cfg = NetConfig {
        listen: vec![listen],
        topics: target.topics.clone(),
        ..NetConfig::local()
    };
    // Nearly every 32 random bytes are a valid secp256k1 secret; try a few.
    let mut started = None;
    for _ in 0..8 {
        let mut secret = [0u8; 32];
        secret.copy_from_slice(&junk(&mut rng, 32));
        if let Ok(s) = Net::start(secret, cfg.clone()).await {
            started = Some(s);
            break;
        }
    }
    let (net, mut events) = started.ok_or(FloodError::Start)?;
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    let addr: Address = target.p2p.parse()?;
    if target.topics.is_empty() {
        return Err(FloodError::NoTopic);
    }
    let mut dialled = false;
    let mut last_dial: Option<Instant> = None;
    let mut last_error = None;
    let period = Duration::from_millis(1_000 / GOSSIP_PER_SEC);
    while !stop.load(Ordering::Relaxed) {
        // Dial again now and then: a victim that banned us should have to keep refusing.
        if last_dial.is_none_or(|t| t.elapsed() > REDIAL) {
            last_dial = Some(Instant::now());
            match net.dial(addr.clone()).await {
                Ok(()) => dialled = true,
                Err(e) => {
                    counts.dial_errors.fetch_add(1, Ordering::Relaxed);
                    last_error = Some(e);
                }
            }
        }
        if !dialled {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let topic = &target.topics[(rng.next_u64() % target.topics.len() as u64) as usize];
        let len = 1 + (rng.next_u64() % 4_096) as usize;
        match net.publish(topic, junk(&mut rng, len)) {
            Ok(()) => counts.gossip.fetch_add(1, Ordering::Relaxed),
            Err(_) => counts.gossip_errors.fetch_add(1, Ordering::Relaxed),
        };
        tokio::time::sleep(period).await;
    }
    net.shutdown().await;
    match (dialled, last_error) {
        (false, Some(e)) => Err(FloodError::Dial(e)),
        (false, None) => Err(FloodError::NeverDialled),
        _ => Ok(()),
    }
}
