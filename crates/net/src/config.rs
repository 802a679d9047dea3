//! Network configuration and the validator callbacks the application supplies.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::Address;
use neuroshard_proof::NodeId;

/// What the gossip validator decided about a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validation {
    /// Valid: deliver it locally and forward it.
    Accept,
    /// Invalid: drop it and lower the score of the peer that sent it.
    Reject,
    /// Drop it without penalty (stale, duplicate by content, not for us).
    Ignore,
}

/// Decides whether a gossip message is delivered and forwarded: `(topic, author, data)`.
/// Runs inside the swarm task, so it must be quick and must not block.
pub type GossipValidator = Arc<dyn Fn(&str, &NodeId, &[u8]) -> Validation + Send + Sync>;

/// Decides whether a DHT record is valid: `(key, value, publisher)`. Runs on inbound stores,
/// on our own puts, and on every record `get_record` finds (the local one included).
pub type RecordValidator = Arc<dyn Fn(&[u8], &[u8], Option<&NodeId>) -> bool + Send + Sync>;

/// Decides whether a DHT provider entry is valid: `(key, provider)`. Runs on inbound
/// `AddProvider` requests (the provider is the sending peer) and on every provider a lookup
/// finds. Keys the application never looks up are refused, so a peer cannot fill the store's
/// key budget with junk and crowd out the keys that matter (our own announcement included).
pub type ProviderValidator = Arc<dyn Fn(&[u8], &NodeId) -> bool + Send + Sync>;

/// Default budget of DHT records held; a quarter of it bounds the keys with providers.
pub const DEFAULT_MAX_DHT_KEYS: usize = 16 * 1024;

/// Default maximum size of one request or response frame.
pub const DEFAULT_MAX_FRAME: usize = 32 * 1024 * 1024;
/// Default maximum size of one gossip message.
pub const DEFAULT_MAX_GOSSIP: usize = 1024 * 1024;
/// Default budget of message bytes waiting for the application (8 maximal frames).
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 256 * 1024 * 1024;
/// Default limit of established connections, in all and per peer.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 256;
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: u32 = 4;
/// Default gossip rate per (author, topic): far above what a node publishes (a heartbeat
/// every 2 s, a few sync messages a round, a proof a round, a settlement per paid stream).
pub const DEFAULT_GOSSIP_PER_SEC: f64 = 50.0;
pub const DEFAULT_GOSSIP_BURST: u32 = 200;
/// Default request rate per peer and protocol: above a busy pipeline and serving peer (the CI
/// soak's entry node sends one replica about 1,700 inference steps a second).
pub const DEFAULT_REQUEST_PER_SEC: f64 = 5_000.0;
pub const DEFAULT_REQUEST_BURST: u32 = 10_000;

/// Settings of a [`crate::Net`]. Start from [`NetConfig::local`] and change fields.
#[derive(Clone)]
pub struct NetConfig {
    /// Addresses to listen on (TCP `/ip4/../tcp/..` and QUIC `/ip4/../udp/../quic-v1`).
    pub listen: Vec<Address>,
    /// Peers dialled at start and added to Kademlia; each must end in `/p2p/<peer id>`.
    pub bootstrap: Vec<Address>,
    /// Maximum bytes of one request or response (enforced on read and on write).
    pub max_frame: usize,
    /// Maximum bytes of one gossip message.
    pub max_gossip: usize,
    /// Budget of inbound message bytes (gossip and requests) delivered but not yet taken by
    /// the application: past it, gossip is dropped and requests fail at once, so a flood
    /// costs memory up to this bound and no more.
    pub max_queued_bytes: usize,
    /// Established connections at most, in all (incoming and outgoing) and per peer; a
    /// connection over either limit is refused by libp2p's `connection_limits`.
    pub max_connections: u32,
    pub max_connections_per_peer: u32,
    /// Gossip messages per second, and at once, that one author may have delivered and
    /// forwarded on one topic; past it they are ignored and a sending author is penalised.
    pub gossip_per_sec: f64,
    pub gossip_burst: u32,
    /// Inbound requests per second, and at once, one peer may make of one protocol; past it
    /// they are dropped (failing at the peer) and the peer is penalised.
    pub request_per_sec: f64,
    pub request_burst: u32,
    /// How long a request (or one blob chunk) may take, response included.
    pub request_timeout: Duration,
    /// Gossipsub topics subscribed at start.
    pub topics: Vec<String>,
    /// How long other peers keep a record after its last (re)publication (whole seconds, ≥ 1).
    pub record_ttl: Duration,
    /// How often our own records (and provider records) are pushed to the closest peers again.
    pub republish_interval: Duration,
    /// How long an idle connection stays open.
    pub idle_timeout: Duration,
    /// Score taken off a peer by [`crate::Net::penalize`].
    pub penalty: f64,
    /// At or below this application score a peer is disconnected and blocked.
    pub ban_threshold: f64,
    pub gossip_validator: GossipValidator,
    pub record_validator: RecordValidator,
    pub provider_validator: ProviderValidator,
    /// Most DHT records the local store holds (and a quarter as many keys with providers).
    pub max_dht_keys: usize,
}

impl NetConfig {
    /// Listens on 127.0.0.1 (TCP, random port), default limits, validators that accept all.
    pub fn local() -> Self {
        NetConfig {
            listen: vec![
                "/ip4/127.0.0.1/tcp/0"
                    .parse()
                    .expect("constant multiaddr parses"),
            ],
            bootstrap: Vec::new(),
            max_frame: DEFAULT_MAX_FRAME,
            max_gossip: DEFAULT_MAX_GOSSIP,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            gossip_per_sec: DEFAULT_GOSSIP_PER_SEC,
            gossip_burst: DEFAULT_GOSSIP_BURST,
            request_per_sec: DEFAULT_REQUEST_PER_SEC,
            request_burst: DEFAULT_REQUEST_BURST,
            request_timeout: Duration::from_secs(10),
            topics: Vec::new(),
            record_ttl: Duration::from_secs(60),
            republish_interval: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(120),
            penalty: 20.0,
            ban_threshold: -100.0,
            gossip_validator: Arc::new(|_, _, _| Validation::Accept),
            record_validator: Arc::new(|_, _, _| true),
            provider_validator: Arc::new(|_, _| true),
            max_dht_keys: DEFAULT_MAX_DHT_KEYS,
        }
    }
}

impl Default for NetConfig {
    fn default() -> Self {
        Self::local()
    }
}

impl fmt::Debug for NetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetConfig")
            .field("listen", &self.listen)
            .field("bootstrap", &self.bootstrap)
            .field("max_frame", &self.max_frame)
            .field("max_gossip", &self.max_gossip)
            .field("max_queued_bytes", &self.max_queued_bytes)
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_peer", &self.max_connections_per_peer)
            .field("gossip_per_sec", &self.gossip_per_sec)
            .field("gossip_burst", &self.gossip_burst)
            .field("request_per_sec", &self.request_per_sec)
            .field("request_burst", &self.request_burst)
            .field("request_timeout", &self.request_timeout)
            .field("topics", &self.topics)
            .field("record_ttl", &self.record_ttl)
            .field("republish_interval", &self.republish_interval)
            .field("idle_timeout", &self.idle_timeout)
            .field("penalty", &self.penalty)
            .field("ban_threshold", &self.ban_threshold)
            .finish_non_exhaustive()
    }
}
