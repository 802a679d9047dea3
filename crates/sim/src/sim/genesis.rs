//! The simulated network's genesis.

use std::collections::VecDeque;

use neuroshard_node::NodeSettings;
use neuroshard_node::network::{FOUNDER_STAKE, Network, NetworkGenesis, Protocol};

use neuroshard_proof::{Hash32, Identity};
use rand_chacha::ChaCha8Rng;

use super::{SimNode, UNIX_START_MS};

/// Keys staked in the genesis for nodes added after the first start.
pub const SPARE_STAKED: usize = 8;

/// The simulated network's genesis: the settings' protocol, every node added so far staked
/// with `stake_of` its index (none: left out) and [`SPARE_STAKED`] keys for later joiners
/// staked, founded at the start of virtual time, with `round_lead` where given.
#[allow(clippy::too_many_arguments)]
pub(super) fn freeze_genesis(
    settings: &NodeSettings,
    tag: &Hash32,
    nodes: &[SimNode],
    stake_of: impl Fn(usize) -> Option<u64>,
    rng: &mut ChaCha8Rng,
    spare: &mut VecDeque<Identity>,
    spares: usize,
    round_lead: Option<u64>,
) -> Network {
    spare.extend((0..spares).map(|_| Identity::generate_with(&mut *rng)));
    let stakes = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| Some((n.identity.public_key(), stake_of(i)?)))
        .chain(spare.iter().map(|id| (id.public_key(), FOUNDER_STAKE)))
        .collect();
    let founder = Identity::generate_with(&mut *rng);
    let mut protocol = Protocol::from_settings(settings);
    if let Some(lead) = round_lead {
        protocol.round_lead = lead;
    }
    let genesis = NetworkGenesis {
        dataset_root: *tag,
        founded_ms: UNIX_START_MS,
        protocol,
        stakes,
        description: "simulated network".into(),
    };
    // Only a malformed model could fail here, and the settings' model built every engine.
    match Network::found(&founder, genesis) {
        Ok(n) => n,
        Err(e) => panic!("simulated genesis: {e}"),
    }
}
