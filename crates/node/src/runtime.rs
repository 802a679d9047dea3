//! The running node: a thin driver of [`NodeCore`] over libp2p, the engine thread and the
//! SQLite ledger. It moves bytes, maps node ids to transport ids and wakes the core at its
//! deadlines; every decision is the core's.

mod assemble;
mod genesis;
mod ledger_writer;
mod net_setup;
mod start;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use neuroshard_data::Genesis;
use neuroshard_net::{Net, NetEvent, ResponseChannel};
use neuroshard_proof::{Identity, NodeId};
use tokio::sync::mpsc;

use crate::NodeError;
use crate::compute;
use crate::core::{EngineJob, EngineOutput, Inbound, NodeCore, Token, TransferError, Transmit};
use crate::events::NodeEvent;
use crate::records::Topic;
use crate::serve::{ServeCmd, ServeEvent};
use crate::settings::NodeSettings;
use crate::telemetry::Telemetry;
use ledger_writer::LedgerWriter;

const CHECKPOINT_DIR: &str = "checkpoint";

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes one event as a JSON line on stdout (the swarm launcher reads them).
pub fn emit(event: &NodeEvent) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", event.to_json_line());
    let _ = out.flush();
}

/// Results of the transport's asynchronous work, back on the event loop.
struct Done {
    from: NodeId,
    inbound: Inbound,
}

/// The driver's side of the node: transport handles and the id map.
struct Driver {
    net: Net,
    engine: std::sync::mpsc::Sender<(Token, EngineJob)>,
    busy: compute::BusyTime,
    ledger: LedgerWriter,
    /// Inbound requests waiting for the core's answer.
    channels: HashMap<Token, ResponseChannel>,
    next_inbound: Token,
    done_tx: mpsc::UnboundedSender<Done>,
    /// Checkpoint jobs whose result ends a clean shutdown.
    stopping: Option<Token>,
    /// Where each stream's tokens go (the front end's receiver).
    streams: HashMap<u64, mpsc::UnboundedSender<ServeEvent>>,
    /// What the read API serves, when the node has one.
    telemetry: Option<Telemetry>,
    /// Engine jobs sent and not yet answered (a metric).
    engine_pending: usize,
}

/// The next serving command, or never when the node serves no front end.
async fn next_cmd(serve: &mut Option<mpsc::Receiver<ServeCmd>>) -> Option<ServeCmd> {
    match serve {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// How a node's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Ctrl-C or SIGTERM: it announced its departure and checkpointed.
    Stopped,
    /// It left its stage to hold `stage`, one the network grew (see `core/migrate.rs`):
    /// start it again there.
    Move { stage: usize },
}

/// Runs a node until Ctrl-C or SIGTERM; then it announces its departure, checkpoints its
/// stage and exits. A node that moves to a stage the network grew starts again there.
pub async fn run(mut settings: NodeSettings) -> Result<(), NodeError> {
    loop {
        match run_serving(settings.clone(), None, None).await? {
            Exit::Stopped => return Ok(()),
            Exit::Move { stage } => settings.stage = Some(stage),
        }
    }
}

/// Runs a node that also serves the streams its handle's front end opens, and folds its
/// events into `telemetry` for a read API.
pub async fn run_serving(
    mut settings: NodeSettings,
    mut serve: Option<mpsc::Receiver<ServeCmd>>,
    telemetry: Option<Telemetry>,
) -> Result<Exit, NodeError> {
    std::fs::create_dir_all(&settings.data_dir)
        .map_err(|e| NodeError::io(&settings.data_dir, e))?;
    let identity = Identity::load_or_create(&settings.data_dir.join(neuroshard_proof::KEY_FILE))?;
    let genesis = Genesis::open(&settings.genesis)?;
    let known_network = Arc::new(OnceLock::new());
    let config = net_setup::net_config(&settings, known_network.clone())?;
    let (net, mut net_events) = Net::start(identity.secret_bytes(), config).await?;
    let the_network = genesis::resolve(&mut settings, &identity, &net, genesis.root()).await?;
    let network = the_network.id;
    let _ = known_network.set(network);
    if genesis.vocab_size() != settings.model.vocab {
        return Err(NodeError::Config(format!(
            "model vocabulary {} differs from the dataset's {}",
            settings.model.vocab,
            genesis.vocab_size()
        )));
    }
    let addrs = net.listen_addrs().await;
    let mut s = start::start(
        &settings,
        &identity,
        &net,
        &mut net_events,
        &genesis,
        &the_network,
    )
    .await?;

    let (store, economy) = assemble::ledger(&settings, &identity, &the_network)?;
    let ready = assemble::ready(&identity, network, &net, &s, &addrs);
    let mut core = assemble::core(
        &settings,
        &identity,
        &the_network,
        genesis,
        &mut s,
        &addrs,
        economy,
    );

    let (engine_tx, mut engine_rx) = mpsc::unbounded_channel::<(Token, EngineOutput)>();
    let busy = compute::BusyTime::default();
    let engine = compute::spawn(s.engine, settings.threads, engine_tx, busy.clone())
        .map_err(|e| NodeError::io(&settings.data_dir, e))?;
    let _ = net
        .start_providing(crate::records::stage_key(&network, s.stage))
        .await;
    emit(&ready);
    if let Some(t) = &telemetry {
        t.record(&ready);
    }

    if let Some(http) = &settings.http {
        emit(&NodeEvent::Serving {
            http: http.clone(),
            time_ms: now_ms(),
        });
    }

    net.set_topics(core.topics().iter().map(Topic::name).collect())
        .await?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut driver = Driver {
        net: net.clone(),
        engine,
        busy,
        ledger: LedgerWriter::spawn(store, core.stage())
            .map_err(|e| NodeError::Config(format!("starting the ledger writer: {e}")))?,
        channels: HashMap::new(),
        next_inbound: 1,
        done_tx,
        stopping: None,
        streams: HashMap::new(),
        telemetry,
        engine_pending: 0,
    };
    if let Some(h) = s.hint {
        core.hint_theta(h.node, h.round, h.theta);
    }
    for ev in s.pending {
        driver.on_net_event(&mut core, ev);
    }
    let mut term = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let result = loop {
        driver.flush(&mut core);
        if core.ready_to_move().is_some() && driver.stopping.is_none() {
            driver.stop(&mut core);
        }
        let wake = core
            .poll_timeout()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
        tokio::select! {
            ev = net_events.recv() => match ev {
                Some(ev) => driver.on_net_event(&mut core, ev),
                None => break Err(NodeError::Config("network task stopped".into())),
            },
            Some((token, out)) = engine_rx.recv() => {
                driver.engine_pending = driver.engine_pending.saturating_sub(1);
                let saved = matches!(out, EngineOutput::Saved(_));
                core.handle_engine_done(token, out, Instant::now());
                if saved && driver.stopping == Some(token) {
                    break Ok(match core.moving() {
                        Some(stage) => Exit::Move { stage },
                        None => Exit::Stopped,
                    });
                }
            }
            Some(done) = done_rx.recv() => core.handle_message(done.from, done.inbound, Instant::now()),
            _ = tokio::time::sleep_until(wake.into()) => core.handle_timeout(Instant::now()),
            Some(cmd) = next_cmd(&mut serve) => driver.on_serve(&mut core, cmd),
            _ = term.recv(), if driver.stopping.is_none() => driver.stop(&mut core),
            _ = int.recv(), if driver.stopping.is_none() => driver.stop(&mut core),
        }
    };
    driver.flush(&mut core);
    // What the core decided is on disk before the node says it stopped.
    driver.ledger.finish();
    // Give the deathrattle a moment on the wire before the connections close.
    tokio::time::sleep(Duration::from_millis(200)).await;
    emit(&assemble::stopped(&core, &settings, &net));
    net.shutdown().await;
    result
}

impl Driver {
    fn on_serve(&mut self, core: &mut NodeCore, cmd: ServeCmd) {
        match cmd {
            ServeCmd::Open { req, reply } => {
                let opened = core.open_stream(req, Instant::now()).map(|id| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    self.streams.insert(id, tx);
                    (id, rx)
                });
                let _ = reply.send(opened);
            }
            ServeCmd::Cancel { stream } => {
                self.streams.remove(&stream);
                core.cancel_stream(stream, Instant::now());
            }
        }
    }

    fn stop(&mut self, core: &mut NodeCore) {
        self.stopping = Some(core.shutdown(Instant::now()));
    }

    fn on_net_event(&mut self, core: &mut NodeCore, ev: NetEvent) {
        let now = Instant::now();
        match ev {
            NetEvent::Gossip {
                topic,
                author,
                data,
            } => core.handle_message(author, Inbound::Gossip { topic, data }, now),
            NetEvent::Request {
                peer,
                data,
                channel,
            } => {
                let token = self.next_inbound;
                self.next_inbound += 1;
                self.channels.insert(token, channel);
                core.handle_message(peer, Inbound::Request { token, data }, now);
            }
            NetEvent::PeerConnected(peer) => core.handle_message(peer, Inbound::Connected, now),
            NetEvent::PeerDisconnected(peer) => {
                core.handle_message(peer, Inbound::Disconnected, now)
            }
        }
    }

    /// Carries out everything the core asked for.
    fn flush(&mut self, core: &mut NodeCore) {
        // Everything due goes to disk in one transaction, off this loop: an anti-entropy answer
        // of a thousand proofs costs one fsync on the ledger thread, not a thousand here. A
        // consensus log entry is on disk before the messages of the same turn leave.
        let writes: Vec<_> = std::iter::from_fn(|| core.poll_ledger_write()).collect();
        let logged = writes
            .iter()
            .any(|w| matches!(w.finality, Some(crate::economy::FinalityWrite::Wal { .. })));
        if logged {
            self.ledger.write_durably(writes);
        } else if !writes.is_empty() {
            self.ledger.write(writes);
        }
        while let Some(t) = core.poll_transmit() {
            self.transmit(t);
        }
        while let Some(job) = core.poll_engine_job() {
            if self.engine.send(job).is_err() {
                tracing::error!("the engine thread stopped");
            } else {
                self.engine_pending += 1;
            }
        }
        while let Some(ev) = core.poll_serve() {
            let id = ev.stream();
            let ended = !matches!(ev, ServeEvent::Token { .. });
            let delivered = self.streams.get(&id).is_some_and(|tx| tx.send(ev).is_ok());
            if ended {
                self.streams.remove(&id);
            } else if !delivered {
                // The client went away: stop generating for it.
                self.streams.remove(&id);
                core.cancel_stream(id, Instant::now());
            }
        }
        let mut changed = false;
        while let Some(mut ev) = core.poll_event() {
            // What only the driver knows: the transport's counters and the engine's busy time.
            match &mut ev {
                NodeEvent::Stats { net, .. } => *net = Some(Box::new(self.net.counters())),
                NodeEvent::Step { busy_ms, step, .. } => {
                    *busy_ms = Some(self.busy.ms());
                    core.handle_engine_busy(*step, self.busy.ms());
                }
                NodeEvent::Evidence {
                    audit_ms, busy_ms, ..
                } => {
                    *audit_ms = Some(self.busy.audit_ms());
                    *busy_ms = Some(self.busy.ms());
                }
                _ => {}
            }
            emit(&ev);
            if let Some(t) = &self.telemetry {
                t.record(&ev);
                changed |= matches!(
                    ev,
                    NodeEvent::Stats { .. }
                        | NodeEvent::Proof { .. }
                        | NodeEvent::Ledger { .. }
                        | NodeEvent::LedgerSync { .. }
                );
            }
        }
        if let Some(t) = &self.telemetry {
            t.metrics().set_engine_queue(self.engine_pending);
            // Peers and accounts change with heartbeats and proofs: copied then, not per loop.
            if changed {
                t.snapshot(core.telemetry_snapshot());
            }
        }
    }

    fn transmit(&mut self, t: Transmit) {
        match t {
            Transmit::Publish { topic, data } => {
                if let Err(e) = self.net.publish(&topic.name(), data) {
                    tracing::debug!("{topic}: not published: {e}");
                }
            }
            Transmit::Request { to, token, data } => {
                let (net, tx) = (self.net.clone(), self.done_tx.clone());
                tokio::spawn(async move {
                    let result = net
                        .request(to, data)
                        .await
                        .map_err(|e| TransferError(e.to_string()));
                    let _ = tx.send(Done {
                        from: to,
                        inbound: Inbound::Response { token, result },
                    });
                });
            }
            Transmit::Respond { token, data } => {
                if let Some(channel) = self.channels.remove(&token) {
                    self.net.respond(channel, data);
                }
            }
            Transmit::FetchBlob {
                from,
                token,
                hash,
                max,
            } => {
                let (net, tx) = (self.net.clone(), self.done_tx.clone());
                tokio::spawn(async move {
                    let result = net
                        .fetch_blob(from, hash, max)
                        .await
                        .map_err(|e| TransferError(e.to_string()));
                    let _ = tx.send(Done {
                        from,
                        inbound: Inbound::Blob { token, result },
                    });
                });
            }
            Transmit::OfferBlob { data, .. } => {
                self.net.offer_blob(data);
            }
            Transmit::WithdrawBlob { hash } => self.net.withdraw_blob(hash),
            Transmit::PutRecord { key, value } => {
                let net = self.net.clone();
                tokio::spawn(async move {
                    if let Err(e) = net.put_record(key, value).await {
                        tracing::debug!("publishing a record: {e}");
                    }
                });
            }
            Transmit::Penalize { peer, reason } => self.net.penalize(peer, &reason),
            Transmit::Subscribe { topics } => {
                let net = self.net.clone();
                tokio::spawn(async move {
                    if let Err(e) = net
                        .set_topics(topics.iter().map(Topic::name).collect())
                        .await
                    {
                        tracing::warn!("subscribing to the grown stages' topics: {e}");
                    }
                });
            }
        }
    }
}

fn signal(kind: tokio::signal::unix::SignalKind) -> Result<tokio::signal::unix::Signal, NodeError> {
    tokio::signal::unix::signal(kind).map_err(|e| NodeError::Config(format!("signal handler: {e}")))
}
