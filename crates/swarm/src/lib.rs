//! A local network of real `neuroshard node` processes on 127.0.0.1 training one model as
//! pipeline stages with replicas: launch (each node gets its JSON settings file), optional
//! chaos (kill, restart, a joiner), a report built from the nodes' typed [`NodeEvent`]s, and
//! the assembled model at the end. The CLI only parses flags and prints.

mod architecture;
mod assemble;
mod chaos;
mod drive;
mod flood;
mod launch;
mod probe;
mod report;
mod soak;
#[cfg(test)]
mod soak_tests;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use neuroshard_data::Genesis;
use neuroshard_model::StageSpec;
use neuroshard_node::NodeSettings;
use neuroshard_node::events::NodeEvent;

pub use assemble::{Assembly, assemble};
pub use chaos::{Action, Bounds, Chaos, Planned, plan};
pub use flood::FloodStats;
pub use launch::{CONFIG_FILE, Member, nodes_dir};
pub use report::{Report, now_ms};

use launch::{Launch, Line, stop_all};

#[derive(Debug, thiserror::Error)]
pub enum SwarmError {
    #[error("{0}")]
    Config(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting node {node}: {source}")]
    Spawn { node: usize, source: std::io::Error },
    #[error("node {node} did not become ready (see {}/node.log)", dir.display())]
    NotReady { node: usize, dir: PathBuf },
    #[error("node {node} exited ({status}); see {}/node.log", dir.display())]
    Exited {
        node: usize,
        status: String,
        dir: PathBuf,
    },
    #[error("lost the nodes' output")]
    Disconnected,
    #[error("encoding node settings: {0}")]
    Json(#[from] serde_json::Error),
    #[error("model: {0}")]
    Model(#[from] neuroshard_model::ModelError),
    #[error("dataset: {0}")]
    Data(#[from] neuroshard_data::DataError),
    #[error("only stages {have:?} of {stages} have a saved replica; cannot assemble the model")]
    MissingStages { have: Vec<usize>, stages: usize },
    #[error("{}: {message}", dir.display())]
    Checkpoint { dir: PathBuf, message: String },
    #[error("identity: {0}")]
    Identity(#[from] neuroshard_proof::IdentityError),
    #[error("network genesis: {0}")]
    Network(#[from] neuroshard_node::network::NetworkError),
}

impl SwarmError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        SwarmError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Chaos: SIGKILL node `node` once the drivers reach `at_step`; optionally start it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kill {
    pub node: usize,
    pub at_step: u64,
    /// Restart after this many milliseconds; it resumes from its speculative checkpoint.
    pub restart_after_ms: Option<u64>,
}

impl Kill {
    /// `NODE@STEP`, e.g. `3@20`.
    pub fn parse(spec: &str, restart_after_ms: Option<u64>) -> Result<Kill, SwarmError> {
        let bad = || SwarmError::Config(format!("--kill {spec:?}: expected NODE@STEP"));
        let (n, s) = spec.split_once('@').ok_or_else(bad)?;
        Ok(Kill {
            node: n.parse().map_err(|_| bad())?,
            at_step: s.parse().map_err(|_| bad())?,
            restart_after_ms,
        })
    }
}

/// What a swarm runs. `node` is the template every node's settings file starts from; the
/// swarm fills in each node's data dir, listen address, bootstrap peer, attack, settle time
/// and how many peers a driver waits for.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    pub nodes: usize,
    pub node: NodeSettings,
    /// The node binary (`neuroshard`, run as `neuroshard node --config FILE`).
    pub exe: PathBuf,
    /// The assembled model is written here; node data dirs live beside it.
    pub out: PathBuf,
    /// Byzantine nodes that send `attack` instead of their pseudo-gradient.
    pub attackers: Vec<usize>,
    pub attack: String,
    /// Lazy workers: nodes that send noise as their forward outputs (see
    /// `AuditSettings::lazy`), for the audits' real-process test.
    pub lazy: Vec<usize>,
    /// Withholding workers: nodes that serve no evidence of their jobs (see
    /// `AuditSettings::withhold`), for the committee's jurors' real-process test.
    pub withhold: Vec<usize>,
    /// Start `joiners` more nodes once the drivers reach this step.
    pub join_at: Option<u64>,
    /// How many nodes join at `join_at` (at least one when it is set).
    pub joiners: usize,
    pub kill: Option<Kill>,
    /// After the drivers finish: how long to wait for every ledger to agree.
    pub settle: Duration,
    /// Give up after this long (None: never).
    pub timeout: Option<Duration>,
    /// Run node `i` in network namespace `{prefix}{i}` at address `10.77.0.{i+1}` (made by
    /// `bench/links.sh`), instead of all on loopback.
    pub netns: Option<String>,
    /// Node 0's HTTP API address (OpenAI-compatible completions); None: no API.
    pub http: Option<String>,
    /// After training: keep the nodes up, serving, until interrupted.
    pub serve: bool,
    /// The chaos soak: scheduled kills, a partition and a flood, judged at the end.
    pub chaos: Option<Chaos>,
}

impl SwarmConfig {
    pub fn validate(&self) -> Result<(), SwarmError> {
        let (nodes, stages) = (self.nodes, self.node.stages);
        if nodes < stages || stages == 0 {
            return Err(SwarmError::Config(format!(
                "--nodes {nodes} cannot hold --stages {stages}"
            )));
        }
        if let Some(a) = self.lazy.iter().find(|a| **a >= nodes) {
            return Err(SwarmError::Config(format!(
                "--lazy: node {a} does not exist ({nodes} nodes)"
            )));
        }
        if let Some(a) = self.withhold.iter().find(|a| **a >= nodes) {
            return Err(SwarmError::Config(format!(
                "--withhold: node {a} does not exist ({nodes} nodes)"
            )));
        }
        if let Some(a) = self.attackers.iter().find(|a| **a >= nodes) {
            return Err(SwarmError::Config(format!(
                "--attackers: node {a} does not exist ({nodes} nodes)"
            )));
        }
        if let Some(k) = self.kill.filter(|k| k.node >= nodes) {
            return Err(SwarmError::Config(format!(
                "--kill node {} does not exist ({nodes} nodes)",
                k.node
            )));
        }
        StageSpec::split(&self.node.model, stages)?;
        if let Some(c) = &self.chaos {
            chaos::plan(c, nodes)?;
            if c.partition_s > 0 && self.netns.is_none() {
                return Err(SwarmError::Config(
                    "--chaos: a partition takes a node's link down, so it needs --netns \
                     (bench/links.sh); or set partition-s=0"
                        .into(),
                ));
            }
            if let (true, Some(prefix)) = (c.flood, &self.netns) {
                let ns = format!("{prefix}{}", self.hostile_index());
                if !Path::new("/var/run/netns").join(&ns).exists() {
                    return Err(SwarmError::Config(format!(
                        "--chaos flood: the hostile process runs in namespace {ns}, which \
                         does not exist (give bench/links.sh one node more)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The hostile process's slot: after the nodes (and the joiner).
    pub fn hostile_index(&self) -> usize {
        self.nodes + self.joiner_count()
    }

    /// Nodes that join mid-run.
    pub fn joiner_count(&self) -> usize {
        if self.join_at.is_some() {
            self.joiners.max(1)
        } else {
            0
        }
    }
}

/// What the caller shows while the swarm runs.
pub trait Observer {
    /// Node `node` is up and serves `stage` as `role`.
    fn ready(&mut self, node: usize, stage: usize, role: &str);
    /// Every node started: training progress begins.
    fn training(&mut self, steps: u64);
    /// The slowest live driver's step and a one-line status.
    fn progress(&mut self, step: u64, status: &str);
    /// Something worth a line: chaos, a joiner, an exit, why the run stopped.
    fn note(&mut self, text: &str);
    /// A node wrote a stdout line that is not a [`NodeEvent`].
    fn unparsed(&mut self, node: usize, line: &str, error: &str) {
        self.note(&format!(
            "node {node}: unreadable event line ({error}): {line}"
        ));
    }
    /// The run is over; nodes are being stopped.
    fn done(&mut self) {}
}

/// Everything the swarm learnt, and the model it assembled.
pub struct Outcome {
    pub report: Report,
    pub assembly: Assembly,
}

/// Runs the swarm until the drivers finish and the ledgers settle, the time limit, or
/// `interrupted`; stops every node (SIGTERM, so each checkpoints) and assembles the model.
pub fn run(
    cfg: &SwarmConfig,
    genesis: &Genesis,
    observer: &mut dyn Observer,
    interrupted: &AtomicBool,
) -> Result<Outcome, SwarmError> {
    cfg.validate()?;
    let (tx, rx) = mpsc::channel::<(usize, Line)>();
    let root = nodes_dir(&cfg.out);
    let (network, network_id) = found_network(cfg, genesis, &root)?;
    let launch = Launch {
        cfg,
        root,
        tx,
        network,
        network_id,
    };
    let mut swarm = Swarm {
        cfg,
        launch,
        rx,
        members: Vec::new(),
        bootstrap: None,
        report: Report::new(cfg.node.steps),
        api: None,
        chaos: None,
    };
    let started = Instant::now();
    if let Err(e) = swarm.start(observer, interrupted) {
        stop_all(&mut swarm.members, &swarm.rx, observer);
        return Err(e);
    }
    swarm.report.startup = started.elapsed();
    observer.training(cfg.node.steps);
    let result = swarm.train(observer, interrupted, started);
    swarm.end_chaos(observer);
    observer.done();
    if result.is_ok() && cfg.serve {
        swarm.serve_until(observer, interrupted);
    }
    stop_all(&mut swarm.members, &swarm.rx, observer);
    result?;
    for m in &swarm.members {
        if let Some(ev) = &m.stopped {
            swarm.report.on_stopped(m.index, ev);
        }
    }
    if cfg.chaos.is_some() {
        for m in &swarm.members {
            let last = probe::final_ledger(&m.dir);
            swarm.report.soak.finals.insert(m.index, last);
        }
    }
    let assembly = assemble(
        &swarm.members,
        &cfg.node.model,
        &cfg.out,
        genesis,
        cfg.node.stages,
        &swarm.report.architecture.trained(),
    )?;
    Ok(Outcome {
        report: swarm.report,
        assembly,
    })
}

/// Founds the swarm's network: every node that will run (the joiner too) gets its key now
/// and a stake in the genesis, which node 0 signs. Returns the genesis file the first nodes
/// read, and the network id.
fn found_network(
    cfg: &SwarmConfig,
    genesis: &Genesis,
    root: &Path,
) -> Result<(PathBuf, neuroshard_proof::Hash32), SwarmError> {
    use neuroshard_node::network::{FOUNDER_STAKE, Network, NetworkGenesis, Protocol};
    let members = cfg.nodes + cfg.joiner_count();
    let mut keys = Vec::with_capacity(members);
    for index in 0..members {
        let dir = root.join(format!("node-{index}"));
        std::fs::create_dir_all(&dir).map_err(|e| SwarmError::io(&dir, e))?;
        keys.push(neuroshard_proof::Identity::load_or_create(
            &dir.join(neuroshard_proof::KEY_FILE),
        )?);
    }
    let m = &cfg.node.model;
    let network = Network::found(
        &keys[0],
        NetworkGenesis {
            dataset_root: genesis.root(),
            founded_ms: report::now_ms(),
            protocol: Protocol::from_settings(&cfg.node),
            stakes: keys
                .iter()
                .map(|k| (k.public_key(), FOUNDER_STAKE))
                .collect(),
            description: format!(
                "swarm: {} layers, d_model {}, vocab {}, {} stages, {} nodes",
                m.layers, m.d_model, m.vocab, cfg.node.stages, cfg.nodes
            ),
        },
    )?;
    let path = root.join(neuroshard_node::network::GENESIS_FILE);
    network.save(&path)?;
    Ok((path, network.id))
}

struct Swarm<'a> {
    cfg: &'a SwarmConfig,
    launch: Launch<'a>,
    rx: mpsc::Receiver<(usize, Line)>,
    members: Vec<Member>,
    /// The first node's address, which every later node joins through.
    bootstrap: Option<String>,
    report: Report,
    /// Node 0's bound API address, from its `ready` event.
    api: Option<String>,
    chaos: Option<drive::ChaosRun>,
}

impl Swarm<'_> {
    /// Keeps the nodes up after training (their rounds and ledgers go on, node 0 answers its
    /// API) until `interrupted`.
    fn serve_until(&mut self, observer: &mut dyn Observer, interrupted: &AtomicBool) {
        if let Some(addr) = &self.api {
            observer.note(&format!(
                "training done; node 0 serves http://{addr}/v1 and its dashboard at \
                 http://{addr}/ until Ctrl-C"
            ));
        }
        while !interrupted.load(Ordering::SeqCst) {
            match self.rx.recv_timeout(Duration::from_millis(200)) {
                Ok((j, line)) => self.on_line(j, line, observer),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    fn on_line(&mut self, i: usize, line: Line, observer: &mut dyn Observer) {
        match line {
            Line::Event(NodeEvent::Serving { http, .. }) => {
                observer.note(&format!(
                    "node {i}'s OpenAI-compatible API: http://{http}/v1 (model \"neuroshard\")"
                ));
                observer.note(&format!("node {i}'s dashboard: http://{http}/"));
                self.api = Some(http);
            }
            Line::Event(ev) => {
                if let (NodeEvent::Ready { addrs, stage, .. }, Some(m)) =
                    (&ev, self.members.get_mut(i))
                {
                    m.addrs = addrs.clone();
                    // A replica that moved to a stage the network grew is ready again there.
                    if m.stage.is_some() {
                        m.stage = Some(*stage);
                    }
                }
                match &ev {
                    NodeEvent::Moving { from, to, .. } => observer.note(&format!(
                        "node {i} moves from stage {from} to stage {to}: draining"
                    )),
                    NodeEvent::Drained {
                        to,
                        waited_ms,
                        complete,
                        ..
                    } => observer.note(&format!(
                        "node {i} drained in {:.1} s{}; starting in stage {to}",
                        *waited_ms as f64 / 1e3,
                        if *complete {
                            ""
                        } else {
                            " (audits still open)"
                        }
                    )),
                    _ => {}
                }
                self.report.on_event(i, &ev)
            }
            Line::Unparsed { line, error } => observer.unparsed(i, &line, &error),
        }
    }

    /// Starts the nodes one by one, each after the previous one said it is ready, so that
    /// every node sees the earlier ones when it chooses a stage.
    fn start(
        &mut self,
        observer: &mut dyn Observer,
        interrupted: &AtomicBool,
    ) -> Result<(), SwarmError> {
        for i in 0..self.cfg.nodes {
            let member = self.launch.member(i, self.bootstrap.as_deref())?;
            self.members.push(member);
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || interrupted.load(Ordering::SeqCst) {
                    let dir = self.members[i].dir.clone();
                    return Err(SwarmError::NotReady { node: i, dir });
                }
                match self.rx.recv_timeout(left.min(Duration::from_millis(200))) {
                    Ok((
                        j,
                        Line::Event(NodeEvent::Ready {
                            stage, role, addrs, ..
                        }),
                    )) if j == i => {
                        let m = &mut self.members[i];
                        m.stage = Some(stage);
                        m.role = role.clone();
                        m.addrs = addrs.clone();
                        if self.bootstrap.is_none() {
                            self.bootstrap = addrs.first().cloned();
                        }
                        observer.ready(i, stage, &role);
                        break;
                    }
                    // Earlier nodes may already train while later ones start.
                    Ok((j, line)) => self.on_line(j, line, observer),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let m = &mut self.members[i];
                        if let Ok(Some(status)) = m.child.try_wait() {
                            return Err(SwarmError::Exited {
                                node: i,
                                status: status.to_string(),
                                dir: m.dir.clone(),
                            });
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        return Err(SwarmError::Disconnected);
                    }
                }
            }
        }
        Ok(())
    }

    /// Follows training, applies chaos and decides when to stop.
    fn train(
        &mut self,
        observer: &mut dyn Observer,
        interrupted: &AtomicBool,
        started: Instant,
    ) -> Result<(), SwarmError> {
        let deadline = self.cfg.timeout.map(|t| started + t);
        let nodes = self.cfg.nodes;
        self.chaos = (self.cfg.chaos.as_ref())
            .map(|c| drive::ChaosRun::new(c, nodes))
            .transpose()?;
        if let Some(c) = &self.chaos {
            self.report.soak.bounds = Some(c.chaos.bounds);
            self.report.soak.window_ms = c.chaos.secs * 1_000;
            self.report.soak.planned = c.plan.len();
        }
        let mut killed = false;
        let mut settle_since: Option<Instant> = None;
        loop {
            if interrupted.load(Ordering::SeqCst) {
                observer.note("interrupted: stopping every node");
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                observer.note("time limit reached: stopping every node");
                self.report.timed_out = true;
                return Ok(());
            }
            match self.rx.recv_timeout(Duration::from_millis(200)) {
                Ok((i, line)) => self.on_line(i, line, observer),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            }
            for m in self.members.iter_mut().filter(|m| m.alive) {
                if let Ok(Some(status)) = m.child.try_wait() {
                    m.alive = false;
                    observer.note(&format!("node {} exited unexpectedly ({status})", m.index));
                    let exit = (m.index, status.to_string());
                    self.report.soak.unexpected_exits.push(exit);
                }
            }
            if !killed {
                killed = self.maybe_kill(observer);
            }
            self.chaos_tick(observer);
            self.maybe_restart(observer)?;
            self.maybe_join(observer)?;
            for m in self.members.iter_mut().filter(|m| m.stage.is_none()) {
                m.stage = self.report.stage_of(m.index);
            }
            observer.progress(
                self.report.min_driver_step(&self.members),
                &self
                    .report
                    .progress_line(&self.members, self.cfg.node.stages),
            );
            let drivers: Vec<&Member> = self
                .members
                .iter()
                .filter(|m| m.alive && m.stage == Some(0))
                .collect();
            if drivers.is_empty() {
                observer.note("no driver is alive: stopping");
                return Ok(());
            }
            if drivers
                .iter()
                .all(|m| self.report.finished.contains(&m.index))
            {
                self.end_chaos(observer);
                // Let the last proofs spread: stop once every ledger agrees (or time is up).
                let since = *settle_since.get_or_insert_with(Instant::now);
                let live: Vec<usize> = self
                    .members
                    .iter()
                    .filter(|m| m.alive)
                    .map(|m| m.index)
                    .collect();
                if self.report.settled(&live, report::now_ms()) || since.elapsed() > self.cfg.settle
                {
                    return Ok(());
                }
            }
        }
    }

    /// `--kill NODE@STEP`: SIGKILL the victim once the drivers reach the step.
    fn maybe_kill(&mut self, observer: &mut dyn Observer) -> bool {
        let Some(kill) = self.cfg.kill else {
            return false;
        };
        if self.report.max_driver_step() < kill.at_step {
            return false;
        }
        self.kill_node(kill.node, kill.restart_after_ms, observer);
        true
    }

    fn maybe_join(&mut self, observer: &mut dyn Observer) -> Result<(), SwarmError> {
        let Some(at) = self.cfg.join_at else {
            return Ok(());
        };
        if self.report.joiner.is_some() || self.report.max_driver_step() < at {
            return Ok(());
        }
        for k in 0..self.cfg.joiner_count() {
            let index = self.members.len();
            let member = self.launch.member(index, self.bootstrap.as_deref())?;
            self.members.push(member);
            // The report follows the first joiner's catch-up.
            if k == 0 {
                self.report.joiner = Some((index, now_ms()));
            }
            observer.note(&format!("node {index} joins at step {at}"));
        }
        Ok(())
    }
}
