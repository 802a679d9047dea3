//! Starting a simulated node: engine, economy and core, and the catch-up hint a restarted
//! replica reads from the DHT.

use neuroshard_node::core::{CoreConfig, NodeCore};
use neuroshard_node::economy::{Economy, EconomyConfig, LedgerSnapshot};
use neuroshard_node::events::NodeEvent;
use neuroshard_node::peers::PeerTable;

use super::{Sim, UNIX_START_MS};

impl Sim {
    /// Starts node `i`: a joiner through the start-up machine, anyone else at once from
    /// its prepared engine, its restored one or a new one, with the ledger its disk holds.
    pub(super) fn start(&mut self, i: usize) {
        if self.nodes[i].core.is_some() {
            return;
        }
        self.network = self.network().id;
        if self.nodes[i].joining.is_some() {
            return self.start_joiner(i);
        }
        let (node, stage) = (self.nodes[i].identity.node_id(), self.nodes[i].stage);
        let (prepared, peers) = self.nodes[i]
            .prepared
            .take()
            .map_or((None, PeerTable::default()), |(b, p)| (Some(b), p));
        let restored = self.nodes[i].engine.take().and_then(|e| e.restore_saved());
        let (engine, data, steps) = match (prepared, restored) {
            (Some((engine, data)), _) => (engine, data, 0),
            (None, Some(engine)) => (
                engine,
                self.factory.data(node, stage),
                self.nodes[i].saved_step,
            ),
            (None, None) => match self.factory.engine(node, stage) {
                Ok((e, d)) => (e, d, 0),
                Err(message) => {
                    self.nodes[i].events.push(NodeEvent::Warning {
                        stage: Some(stage),
                        message: format!("cannot start: {message}"),
                        time_ms: UNIX_START_MS + (self.now - self.base).as_millis() as u64,
                    });
                    return;
                }
            },
        };
        let (round, theta) = engine.sync_state();
        let network = self.network().clone();
        if self.nodes[i].disk.state.rules().network != network.id {
            match network
                .ledger_genesis()
                .map_err(|e| e.to_string())
                .and_then(|g| LedgerSnapshot::genesis(&g).map_err(|e| e.to_string()))
            {
                Ok(disk) => self.nodes[i].disk = disk,
                Err(e) => return self.cannot_start(i, &e),
            }
        }
        let ecfg = match EconomyConfig::new(
            network.id,
            &self.settings.model,
            self.settings.stages,
            network.genesis.protocol.min_receipts,
            network.genesis.protocol.audit_rate(),
        ) {
            Ok(c) => c,
            Err(e) => return self.cannot_start(i, &e.to_string()),
        };
        let economy = Economy::resume(
            self.nodes[i].identity.clone(),
            ecfg,
            self.nodes[i].disk.clone(),
        );
        // A mover starts with the versions it knew; anyone else with the genesis split.
        let layouts = match self.nodes[i].layouts.clone().map_or_else(
            || neuroshard_node::layout::Layouts::fixed(&self.settings.model, self.settings.stages),
            Ok,
        ) {
            Ok(l) => l,
            Err(e) => return self.cannot_start(i, &e.to_string()),
        };
        let mut settings = self.settings.clone();
        settings.data_dir = format!("sim/{i}").into();
        let core = NodeCore::new(
            CoreConfig {
                settings,
                identity: self.nodes[i].identity.clone(),
                network: self.network,
                network_genesis: network.signed.clone(),
                stage,
                spec: engine.spec(),
                layouts,
                numel: engine.numel(),
                steps_done: steps,
                sync_round: round,
                sync_theta: theta,
                seed: self.seq ^ i as u64,
                start: self.now,
                start_unix_ms: UNIX_START_MS + (self.now - self.base).as_millis() as u64,
                addrs: vec![format!("sim/{i}")],
                peers,
                class: neuroshard_model::replay::determinism_class(
                    u16::try_from(self.settings.micro_batches).unwrap_or(u16::MAX),
                ),
            },
            economy,
            data,
        );
        for topic in core.topics() {
            self.subscribers.entry(topic).or_default().insert(i);
        }
        let n = &mut self.nodes[i];
        n.core = Some(core);
        n.engine = Some(engine);
        n.engine_busy = false;
        n.engine_queue.clear();
        n.timer = None;
        // A restarted node learns of its stage's newer θ₀ from the DHT record.
        let key = neuroshard_node::sync::theta_key(&self.network, stage);
        let hint = self.dht.get(&key).and_then(|recs| {
            recs.values()
                .filter_map(|v| {
                    neuroshard_proof::Signed::<neuroshard_node::sync::ThetaRecord>::from_bytes(v)
                        .ok()?
                        .verify()
                        .ok()
                })
                .filter(|r| r.node != node)
                .max_by_key(|r| r.round)
        });
        if let (Some(rec), Some(core)) = (hint, self.nodes[i].core.as_mut())
            && rec.round > round
        {
            core.hint_theta(rec.node, rec.round, rec.theta);
        }
        self.after(i);
    }
}
