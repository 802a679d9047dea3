//! What a real node's core starts from, put together: its ledger (the SQLite store and the
//! economy resumed from it), the genesis dataset as its batch source, and what start-up
//! decided.

use std::time::Instant;

use neuroshard_data::Genesis;
use neuroshard_net::{Address, Net};
use neuroshard_proof::{Hash32, Identity};

use super::start::Started;
use super::{CHECKPOINT_DIR, now_ms};
use crate::NodeError;
use crate::core::{CoreConfig, NodeCore};
use crate::economy::{Economy, EconomyConfig, LedgerStore};
use crate::events::{EVENTS_VERSION, NodeEvent};
use crate::genesis_source::{GenesisBatches, ROUND_STEPS_WITHOUT_SYNC};
use crate::network::Network;
use crate::records::Role;
use crate::settings::NodeSettings;

/// Opens (or starts from the network's ledger genesis) the node's database and resumes the
/// economy from what it holds.
pub(super) fn ledger(
    settings: &NodeSettings,
    identity: &Identity,
    network: &Network,
) -> Result<(LedgerStore, Economy), NodeError> {
    let path = settings.data_dir.join(neuroshard_ledger::LEDGER_FILE);
    let (store, snapshot) =
        LedgerStore::open(&path, &identity.node_id(), &network.ledger_genesis()?)?;
    let config = EconomyConfig::new(
        network.id,
        &settings.model,
        settings.stages,
        network.genesis.protocol.min_receipts,
        network.genesis.protocol.audit_rate(),
    )?;
    Ok((store, Economy::resume(identity.clone(), config, snapshot)))
}

/// The node's core, from start-up's decision (its peer table moves into the core), its
/// ledger and the genesis dataset.
pub(super) fn core(
    settings: &NodeSettings,
    identity: &Identity,
    network: &Network,
    genesis: Genesis,
    s: &mut Started,
    addrs: &[Address],
    economy: Economy,
) -> NodeCore {
    let data = GenesisBatches {
        genesis,
        order: settings.data_order,
        seed: settings.seed,
        batch: settings.batch,
        seq: settings.seq,
        round_steps: match settings.sync.every {
            0 => ROUND_STEPS_WITHOUT_SYNC,
            every => every,
        },
    };
    let id = identity.node_id();
    NodeCore::new(
        CoreConfig {
            settings: settings.clone(),
            identity: identity.clone(),
            network: network.id,
            network_genesis: network.signed.clone(),
            stage: s.stage,
            spec: s.spec,
            layouts: s.layouts.clone(),
            numel: s.numel,
            steps_done: s.steps_done,
            sync_round: s.sync_round,
            sync_theta: s.sync_theta,
            seed: u64::from_le_bytes(id.0[..8].try_into().unwrap_or_default()),
            start: Instant::now(),
            start_unix_ms: now_ms(),
            addrs: addrs.iter().map(|a| a.to_string()).collect(),
            peers: std::mem::take(&mut s.peers),
            class: neuroshard_model::replay::determinism_class(
                u16::try_from(settings.micro_batches).unwrap_or(u16::MAX),
            ),
        },
        economy,
        Box::new(data),
    )
}

/// The event that says the node runs: who, where, and what start-up resumed.
pub(super) fn ready(
    identity: &Identity,
    network: Hash32,
    net: &Net,
    s: &Started,
    addrs: &[Address],
) -> NodeEvent {
    NodeEvent::Ready {
        version: EVENTS_VERSION,
        node: identity.node_id().to_string(),
        network: hex::encode(network),
        peer: Some(net.transport_id()),
        stage: s.stage,
        role: {
            let newest = s.layouts.newest();
            Role::from_ends(newest.is_first(s.stage), newest.is_last(s.stage))
                .name()
                .into()
        },
        addrs: addrs.iter().map(|a| a.to_string()).collect(),
        resumed_step: s.steps_done,
        model_hash: hex::encode(s.engine.model_hash()),
        sync_round: s.sync_round,
        theta: hex::encode(s.sync_theta),
        joined_round: s.joined.map(|(r, _)| r),
        join_ms: s.joined.map(|(_, t)| t.as_secs_f64() * 1e3),
        time_ms: now_ms(),
    }
}

/// The event that says the node stopped: where it got to and what it saved.
pub(super) fn stopped(core: &NodeCore, settings: &NodeSettings, net: &Net) -> NodeEvent {
    let saved = core.last_saved();
    NodeEvent::Stopped {
        stage: core.stage(),
        step: core.steps_done(),
        checkpoint: settings.data_dir.join(CHECKPOINT_DIR).display().to_string(),
        model_hash: saved.and_then(|r| r.as_ref().ok().cloned()),
        error: saved.and_then(|r| r.as_ref().err().map(|e| e.to_string())),
        net: Some(Box::new(net.counters())),
        sync_round: core.sync_round(),
        theta: hex::encode(core.theta()),
        ledger: core.ledger_summary(),
        time_ms: now_ms(),
    }
}
