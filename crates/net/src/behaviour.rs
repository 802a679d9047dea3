//! The composed libp2p behaviour: which protocols run, under which names, with which limits.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use libp2p::gossipsub::{self, IdentTopic, MessageId, TopicScoreParams, ValidationMode};
use libp2p::identity::Keypair;
use libp2p::kad::store::{MemoryStore, MemoryStoreConfig};
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::NetworkBehaviour;
use libp2p::{StreamProtocol, allow_block_list, connection_limits, identify, kad, ping};

use crate::blob;
use crate::codec::{CounterSet, FrameCodec};
use crate::{NetConfig, NetError};

/// Opaque requests and responses (activations, gradients, anything the node asks a peer).
pub(crate) const MSG_PROTOCOL: StreamProtocol = StreamProtocol::new("/neuroshard/msg/1");
/// Chunks of content-addressed blobs.
pub(crate) const BLOB_PROTOCOL: StreamProtocol = StreamProtocol::new("/neuroshard/blob/1");
/// Our own Kademlia DHT (kept apart from the public IPFS DHT).
pub(crate) const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/neuroshard/kad/1");
const IDENTIFY_PROTOCOL: &str = "/neuroshard/id/1";
const GOSSIP_PROTOCOL_PREFIX: &str = "/neuroshard/gossip";

/// Largest Kademlia message (a record plus its envelope or a list of peers).
const MAX_KAD_PACKET: usize = 256 * 1024;
/// Largest DHT record value.
pub const MAX_RECORD_VALUE: usize = 64 * 1024;
/// Room for gossipsub's framing, signature and control messages around one maximal message.
const GOSSIP_OVERHEAD: usize = 64 * 1024;

#[derive(NetworkBehaviour)]
pub(crate) struct Behaviour {
    pub limits: connection_limits::Behaviour,
    pub block: allow_block_list::Behaviour<allow_block_list::BlockedPeers>,
    pub identify: identify::Behaviour,
    pub ping: ping::Behaviour,
    pub kad: kad::Behaviour<MemoryStore>,
    pub gossip: gossipsub::Behaviour,
    pub msg: request_response::Behaviour<FrameCodec>,
    pub blob: request_response::Behaviour<FrameCodec>,
}

impl Behaviour {
    pub(crate) fn new(
        key: &Keypair,
        config: &NetConfig,
        counters: &CounterSet,
    ) -> Result<Self, NetError> {
        let local = key.public().to_peer_id();
        let rr_config = request_response::Config::default()
            .with_request_timeout(config.request_timeout)
            .with_max_concurrent_streams(64);
        let msg = request_response::Behaviour::with_codec(
            FrameCodec::new(config.max_frame, config.max_frame, counters.request.clone()),
            [(MSG_PROTOCOL, ProtocolSupport::Full)],
            rr_config.clone(),
        );
        let blob = request_response::Behaviour::with_codec(
            FrameCodec::new(blob::REQUEST_LEN, blob::MAX_RESPONSE, counters.blob.clone()),
            [(BLOB_PROTOCOL, ProtocolSupport::Full)],
            rr_config,
        );
        Ok(Behaviour {
            limits: connection_limits::Behaviour::new(
                connection_limits::ConnectionLimits::default()
                    .with_max_established(Some(config.max_connections))
                    .with_max_established_per_peer(Some(config.max_connections_per_peer)),
            ),
            block: allow_block_list::Behaviour::default(),
            identify: identify::Behaviour::new(
                identify::Config::new(IDENTIFY_PROTOCOL.into(), key.public())
                    .with_agent_version(format!("neuroshard/{}", env!("CARGO_PKG_VERSION"))),
            ),
            ping: ping::Behaviour::new(
                ping::Config::new()
                    .with_interval(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(10)),
            ),
            kad: kademlia(local, config),
            gossip: gossipsub(key, config)?,
            msg,
            blob,
        })
    }
}

fn kademlia(local: libp2p::PeerId, config: &NetConfig) -> kad::Behaviour<MemoryStore> {
    let ttl = config.record_ttl.max(Duration::from_secs(1));
    let republish = config.republish_interval.max(Duration::from_millis(100));
    let mut kcfg = kad::Config::new(KAD_PROTOCOL);
    kcfg.set_record_ttl(Some(ttl))
        .set_publication_interval(Some(republish))
        .set_replication_interval(Some(republish))
        .set_provider_record_ttl(Some(ttl))
        .set_provider_publication_interval(Some(republish))
        .set_record_filtering(kad::StoreInserts::FilterBoth)
        .set_max_packet_size(MAX_KAD_PACKET)
        .set_substreams_timeout(config.request_timeout)
        .set_query_timeout(config.request_timeout * 2);
    let store = MemoryStore::with_config(
        local,
        MemoryStoreConfig {
            max_records: config.max_dht_keys.max(1),
            max_value_bytes: MAX_RECORD_VALUE,
            max_providers_per_key: 64,
            // Provider entries are larger (up to 64 providers a key): a quarter as many keys.
            max_provided_keys: (config.max_dht_keys / 4).max(1),
        },
    );
    let mut kad = kad::Behaviour::with_config(local, store, kcfg);
    // Serve the DHT from the start: peers on loopback or behind NAT never get an external
    // address confirmed, and a network of such peers would otherwise have no servers.
    kad.set_mode(Some(kad::Mode::Server));
    kad
}

fn gossipsub(key: &Keypair, config: &NetConfig) -> Result<gossipsub::Behaviour, NetError> {
    let err = |e: &dyn std::fmt::Display| NetError::Transport(format!("gossipsub: {e}"));
    let gcfg = gossipsub::ConfigBuilder::default()
        .protocol_id_prefix(GOSSIP_PROTOCOL_PREFIX)
        .heartbeat_interval(Duration::from_secs(1))
        .validation_mode(ValidationMode::Strict)
        .validate_messages()
        .message_id_fn(message_id)
        .max_transmit_size(config.max_gossip.saturating_add(GOSSIP_OVERHEAD))
        // Small networks (2–6 peers) must still form a mesh and deliver.
        .mesh_n(4)
        .mesh_n_low(1)
        .mesh_n_high(8)
        .mesh_outbound_min(0)
        .gossip_lazy(4)
        .flood_publish(true)
        .build()
        .map_err(|e| err(&e))?;
    let mut params = gossipsub::PeerScoreParams {
        // The application score is exactly what `Net::penalize` set.
        app_specific_weight: 1.0,
        ..Default::default()
    };
    params.ip_colocation_factor_whitelist.extend([
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ]);
    let mut gossip =
        gossipsub::Behaviour::new(gossipsub::MessageAuthenticity::Signed(key.clone()), gcfg)
            .map_err(|e| err(&e))?;
    gossip
        .with_peer_score(params, gossipsub::PeerScoreThresholds::default())
        .map_err(|e| err(&e))?;
    Ok(gossip)
}

/// A message's id: BLAKE3 over its topic, author and data, so the same bytes from the same
/// author on the same topic are one message however many peers forward them.
fn message_id(m: &gossipsub::Message) -> MessageId {
    let mut h = blake3::Hasher::new();
    let topic = m.topic.as_str().as_bytes();
    h.update(&(topic.len() as u64).to_be_bytes());
    h.update(topic);
    let author = m.source.map(|p| p.to_bytes()).unwrap_or_default();
    h.update(&(author.len() as u64).to_be_bytes());
    h.update(&author);
    h.update(&m.data);
    MessageId::from(h.finalize().as_bytes().to_vec())
}

/// Score parameters of every topic we join. Our topics carry few messages, so a quiet mesh
/// peer is not penalised (mesh delivery weights are 0); invalid messages are (P4).
pub(crate) fn topic_score_params() -> TopicScoreParams {
    TopicScoreParams {
        topic_weight: 1.0,
        time_in_mesh_weight: 0.01,
        time_in_mesh_quantum: Duration::from_secs(1),
        time_in_mesh_cap: 100.0,
        first_message_deliveries_weight: 1.0,
        first_message_deliveries_decay: 0.9,
        first_message_deliveries_cap: 20.0,
        mesh_message_deliveries_weight: 0.0,
        mesh_failure_penalty_weight: 0.0,
        // Squared count: one invalid message costs 10, three cost 90 (graylisted at -80).
        invalid_message_deliveries_weight: -10.0,
        invalid_message_deliveries_decay: gossipsub::score_parameter_decay(Duration::from_secs(
            300,
        )),
        ..Default::default()
    }
}

/// Subscribes to exactly `topics`: joins the new ones, leaves the others.
pub(crate) fn set_topics(
    gossip: &mut gossipsub::Behaviour,
    topics: &[String],
) -> Result<(), NetError> {
    let wanted: Vec<IdentTopic> = topics.iter().map(IdentTopic::new).collect();
    let stale: Vec<gossipsub::TopicHash> = gossip
        .topics()
        .filter(|h| !wanted.iter().any(|t| t.hash() == **h))
        .cloned()
        .collect();
    for hash in stale {
        gossip.unsubscribe(&IdentTopic::new(hash.into_string()));
    }
    for topic in topics {
        subscribe(gossip, topic)?;
    }
    Ok(())
}

/// Joins a topic with its score parameters.
pub(crate) fn subscribe(gossip: &mut gossipsub::Behaviour, topic: &str) -> Result<(), NetError> {
    let topic = IdentTopic::new(topic);
    gossip
        .subscribe(&topic)
        .map_err(|e| NetError::Publish(format!("subscribe {topic}: {e}")))?;
    gossip
        .set_topic_params(topic, topic_score_params())
        .map_err(|e| NetError::Publish(format!("topic score parameters: {e}")))
}
