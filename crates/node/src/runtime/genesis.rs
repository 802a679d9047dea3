//! Which network a real node belongs to: its signed genesis from a file, from the data
//! directory, founded here, or learned from the bootstrap peers (and, for a pinned id, the
//! DHT); the decisions are in [`crate::network`], here only the files and the lookups.

use std::time::Duration;

use neuroshard_net::Net;
use neuroshard_proof::{Canonical, Hash32, Identity};

use super::now_ms;
use crate::NodeError;
use crate::network::{
    self, FOUNDER_STAKE, GENESIS_FILE, GenesisRequest, Network, NetworkError, NetworkGenesis,
    Protocol,
};
use crate::records::network_key;
use crate::settings::NodeSettings;

/// How long a joiner looks for the network's genesis.
const LOOKUP_FOR: Duration = Duration::from_secs(20);
/// How long one bootstrap peer has to answer a genesis request.
const ASK_FOR: Duration = Duration::from_secs(5);

/// The node's network. A joiner's model and protocol settings are replaced by the genesis's
/// (and saved with it in the data directory, so a restart needs no lookup).
pub async fn resolve(
    settings: &mut NodeSettings,
    identity: &Identity,
    net: &Net,
    dataset_root: Hash32,
) -> Result<Network, NodeError> {
    let saved = settings.data_dir.join(GENESIS_FILE);
    let pin = settings.network.as_deref().map(parse_id).transpose()?;
    let network = if let Some(path) = &settings.network_genesis {
        Network::load(path)?
    } else if saved.exists() {
        Network::load(&saved)?
    } else if settings.bootstrap.is_empty() {
        found(settings, identity, dataset_root)?
    } else {
        lookup(net, pin.as_ref()).await?
    };
    if pin.is_some_and(|p| p != network.id) {
        return Err(NodeError::Config(format!(
            "--network {} differs from the genesis this node holds ({})",
            settings.network.as_deref().unwrap_or_default(),
            hex::encode(network.id)
        )));
    }
    if network.genesis.dataset_root != dataset_root {
        return Err(NodeError::Config(format!(
            "the network trains on dataset {}, this node's --data is {}",
            hex::encode(network.genesis.dataset_root),
            hex::encode(dataset_root)
        )));
    }
    network.genesis.protocol.apply_to(settings);
    if Network::load(&saved).map_or(true, |n| n.id != network.id) {
        network.save(&saved)?;
    }
    Ok(network)
}

/// A network founded by this node: its own settings; its stake and that of `stake_for`.
fn found(
    settings: &NodeSettings,
    identity: &Identity,
    dataset_root: Hash32,
) -> Result<Network, NodeError> {
    let m = &settings.model;
    Ok(Network::found(
        identity,
        NetworkGenesis {
            dataset_root,
            founded_ms: now_ms(),
            protocol: Protocol::from_settings(settings),
            stakes: std::iter::once(identity.public_key())
                .chain(settings.stake_for.iter().copied())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|key| (key, FOUNDER_STAKE))
                .collect(),
            description: format!(
                "{} layers, d_model {}, vocab {}, {} stages",
                m.layers, m.d_model, m.vocab, settings.stages
            ),
        },
    )?)
}

/// Asks the bootstrap peers for their network's genesis, then (with `--network` only) the
/// DHT, until it is found or [`LOOKUP_FOR`] has passed (a joiner may start before its
/// bootstrap peer has); [`network::choose_to_join`] decides.
async fn lookup(net: &Net, pin: Option<&Hash32>) -> Result<Network, NodeError> {
    let deadline = tokio::time::Instant::now() + LOOKUP_FOR;
    let ask = GenesisRequest.to_canonical_bytes();
    loop {
        let mut served = Vec::new();
        for node in net.bootstrap_nodes() {
            let answer = tokio::time::timeout(ASK_FOR, net.request(node, ask.clone())).await;
            if let Ok(Ok(bytes)) = answer {
                served.push(bytes);
            }
        }
        let mut records = Vec::new();
        if let Some(pin) = pin
            && !served
                .iter()
                .any(|v| Network::open(v).is_ok_and(|n| n.id == *pin))
        {
            records = net.get_record(network_key(pin)).await.unwrap_or_default();
        }
        match network::choose_to_join(&served, &records, pin) {
            Ok(n) => return Ok(n),
            Err(e @ NetworkError::Ambiguous(_)) => return Err(e.into()),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn parse_id(hex_id: &str) -> Result<Hash32, NodeError> {
    hex::decode(hex_id)
        .ok()
        .and_then(|b| Hash32::try_from(b).ok())
        .ok_or_else(|| NodeError::Config(format!("--network {hex_id}: not a 64-digit hex id")))
}
