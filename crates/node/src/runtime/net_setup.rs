//! The transport's configuration from the node's settings: listen and bootstrap addresses,
//! budgets, and the validators that check gossip, records and provider entries before they
//! reach the core.

use std::sync::{Arc, OnceLock};

use neuroshard_net::{Address, NetConfig};
use neuroshard_proof::{Hash32, NodeId};

use super::now_ms;
use crate::NodeError;
use crate::core::{RECORD_TTL, REPUBLISH_EVERY};
use crate::records::{Topic, validate_gossip, validate_record};
use crate::settings::NodeSettings;

/// `network` is set once the node knows which network it follows; provider entries are then
/// checked against its stage keys only.
pub(super) fn net_config(
    settings: &NodeSettings,
    network: Arc<OnceLock<Hash32>>,
) -> Result<NetConfig, NodeError> {
    let mut cfg = NetConfig::local();
    cfg.listen = parse_addrs(&settings.listen)?;
    cfg.bootstrap = parse_addrs(&settings.bootstrap)?;
    cfg.max_frame = settings.max_frame;
    let b = settings.budgets;
    cfg.max_queued_bytes = b
        .inbound_queue_mb
        .saturating_mul(1 << 20)
        .max(settings.max_frame);
    cfg.max_connections = b.connections;
    cfg.max_connections_per_peer = b.connections_per_peer;
    cfg.gossip_per_sec = b.gossip_per_sec;
    cfg.gossip_burst = b.gossip_burst;
    cfg.request_per_sec = b.request_per_sec;
    cfg.request_burst = b.request_burst;
    cfg.request_timeout = settings.grad_timeout();
    // Every stage's heartbeats while the node chooses its stage; then only what it needs.
    // A growing network's joiner also hears the stages it grew (ids after the genesis ones).
    let heard = match settings.growth {
        Some(_) => settings
            .stages
            .saturating_add(crate::startup::EXTRA_STAGE_IDS),
        None => settings.stages,
    };
    cfg.topics = Topic::all_heartbeats(heard)
        .iter()
        .map(Topic::name)
        .collect();
    cfg.record_ttl = RECORD_TTL;
    cfg.republish_interval = REPUBLISH_EVERY;
    cfg.gossip_validator = Arc::new(validate_gossip);
    cfg.record_validator =
        Arc::new(|k: &[u8], v: &[u8], p: Option<&NodeId>| validate_record(k, v, p, now_ms()));
    // Stage ids a provider record may name: a growing network's new stages take fresh ids.
    let stages = match settings.growth {
        Some(_) => neuroshard_growth::MAX_STAGES,
        None => settings.stages,
    };
    cfg.provider_validator = Arc::new(move |key: &[u8], _provider: &NodeId| {
        crate::records::validate_provider_key(key, network.get(), stages)
    });
    Ok(cfg)
}

fn parse_addrs(list: &[String]) -> Result<Vec<Address>, NodeError> {
    list.iter()
        .map(|a| {
            a.parse::<Address>()
                .map_err(|e| NodeError::Config(format!("address {a:?}: {e}")))
        })
        .collect()
}
