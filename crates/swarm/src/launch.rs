//! Node processes: each gets its settings as a JSON file in its data dir and is started as
//! `neuroshard node --config FILE`; its stdout is read as typed events.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use neuroshard_node::events::NodeEvent;

use crate::{Observer, SwarmConfig, SwarmError};

/// The settings file the swarm writes into each node's data dir.
pub const CONFIG_FILE: &str = "node.json";

/// One node process of the swarm.
pub struct Member {
    pub index: usize,
    pub child: Child,
    pub dir: PathBuf,
    pub stage: Option<usize>,
    pub role: String,
    /// Its listen addresses, from its latest `ready` event.
    pub addrs: Vec<String>,
    pub alive: bool,
    /// Its `stopped` event, once it shut down cleanly.
    pub stopped: Option<NodeEvent>,
}

/// One stdout line of a node: an event, or a line that is not one (kept to be reported).
pub(crate) enum Line {
    Event(NodeEvent),
    Unparsed { line: String, error: String },
}

/// Node `index`'s address in its own network namespace (`bench/links.sh` assigns them).
pub fn netns_addr(index: usize) -> String {
    format!("10.77.0.{}", index + 1)
}

/// Node data directories live beside the output.
pub fn nodes_dir(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map_or("swarm".into(), |n| n.to_string_lossy().into_owned());
    out.with_file_name(format!("{name}-nodes"))
}

/// Starts node processes of this swarm.
pub(crate) struct Launch<'a> {
    pub cfg: &'a SwarmConfig,
    pub root: PathBuf,
    pub tx: mpsc::Sender<(usize, Line)>,
    /// The network's signed genesis file, and its id.
    pub network: PathBuf,
    pub network_id: neuroshard_proof::Hash32,
}

impl Launch<'_> {
    /// Node `index` starting afresh: no checkpoint to resume and no ledger or network of an
    /// earlier run. Its key (staked in this run's genesis) stays.
    pub fn member(&self, index: usize, bootstrap: Option<&str>) -> Result<Member, SwarmError> {
        let dir = self.root.join(format!("node-{index}"));
        let _ = std::fs::remove_dir_all(dir.join("checkpoint"));
        for suffix in ["", "-wal", "-shm"] {
            let ledger = format!("{}{suffix}", neuroshard_ledger::LEDGER_FILE);
            let _ = std::fs::remove_file(dir.join(ledger));
        }
        let _ = std::fs::remove_file(dir.join(neuroshard_node::network::GENESIS_FILE));
        for log in ["events.jsonl", "node.log"] {
            let _ = std::fs::remove_file(dir.join(log));
        }
        std::fs::create_dir_all(&dir).map_err(|e| SwarmError::io(&dir, e))?;
        let child = self.spawn(&dir, bootstrap, index)?;
        Ok(Member {
            index,
            child,
            dir,
            stage: None,
            role: String::new(),
            addrs: Vec::new(),
            alive: true,
            stopped: None,
        })
    }

    /// Writes node `index`'s settings file and starts it. A restarted node gets the same
    /// file again (with the current bootstrap) and resumes from its checkpoint.
    pub fn spawn(
        &self,
        dir: &Path,
        bootstrap: Option<&str>,
        index: usize,
    ) -> Result<Child, SwarmError> {
        let cfg = self.cfg;
        let mut s = cfg.node.clone();
        s.data_dir = dir.to_path_buf();
        // The first nodes get the genesis file; a joiner gets only the network id and learns
        // the genesis (and with it the model) from the DHT, as a real joiner does.
        if index < cfg.nodes {
            s.network_genesis = Some(self.network.clone());
        } else {
            s.network = Some(hex::encode(self.network_id));
        }
        s.listen = vec![match &cfg.netns {
            Some(_) => format!("/ip4/{}/tcp/0", netns_addr(index)),
            None => "/ip4/127.0.0.1/tcp/0".into(),
        }];
        s.bootstrap = bootstrap.map(str::to_string).into_iter().collect();
        s.sync.attack = if cfg.attackers.contains(&index) {
            cfg.attack.clone()
        } else {
            "none".into()
        };
        s.audit.lazy = cfg.lazy.contains(&index);
        s.audit.withhold = cfg.withhold.contains(&index);
        s.http = if index == 0 { cfg.http.clone() } else { None };
        // The first node is alone anyway; later ones listen long enough to see the stages.
        s.settle_ms = if index == 0 { 200 } else { 2500 };
        // Nodes fill the emptiest stage, so every stage gets at least this many.
        s.wait_replicas = cfg.nodes / cfg.node.stages.max(1);
        let config = dir.join(CONFIG_FILE);
        std::fs::write(&config, serde_json::to_vec_pretty(&s)?)
            .map_err(|e| SwarmError::io(&config, e))?;
        let log_path = dir.join("node.log");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| SwarmError::io(&log_path, e))?;
        let mut command = match &cfg.netns {
            // `ip netns exec` execs the node, so the child's pid is the node's (signals work).
            Some(prefix) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &format!("{prefix}{index}")])
                    .arg(&cfg.exe);
                c
            }
            None => Command::new(&cfg.exe),
        };
        let mut child = command
            .arg("node")
            .arg("--config")
            .arg(&config)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|source| SwarmError::Spawn {
                node: index,
                source,
            })?;
        let stdout = child.stdout.take().ok_or_else(|| SwarmError::Spawn {
            node: index,
            source: std::io::Error::other("no stdout pipe"),
        })?;
        // Every event line is also kept beside the node's log; a restart appends to it.
        let events_path = dir.join("events.jsonl");
        let events = File::options()
            .create(true)
            .append(true)
            .open(&events_path)
            .map_err(|e| SwarmError::io(&events_path, e))?;
        let tx = self.tx.clone();
        std::thread::spawn(move || read_events(index, stdout, events, tx));
        Ok(child)
    }
}

/// Forwards each stdout line as a typed event; a line that is not one is forwarded as such.
pub(crate) fn read_events(
    index: usize,
    stdout: impl std::io::Read,
    mut events: impl Write,
    tx: mpsc::Sender<(usize, Line)>,
) {
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let _ = writeln!(events, "{line}");
        let item = match serde_json::from_str::<NodeEvent>(&line) {
            Ok(ev) => Line::Event(ev),
            Err(e) => Line::Unparsed {
                error: e.to_string(),
                line,
            },
        };
        if tx.send((index, item)).is_err() {
            break;
        }
    }
}

pub(crate) fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on a pid we spawned and have not yet reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Keeps a node's `stopped` event; other late lines are only reported if unreadable.
fn take_stopped(members: &mut [Member], (i, line): (usize, Line), observer: &mut dyn Observer) {
    match line {
        Line::Event(ev @ NodeEvent::Stopped { .. }) => {
            if let Some(m) = members.get_mut(i) {
                m.stopped = Some(ev);
            }
        }
        Line::Event(_) => {}
        Line::Unparsed { line, error } => observer.unparsed(i, &line, &error),
    }
}

/// SIGTERM to every live node, then wait for each to checkpoint and exit (SIGKILL after 30 s).
pub(crate) fn stop_all(
    members: &mut [Member],
    rx: &mpsc::Receiver<(usize, Line)>,
    observer: &mut dyn Observer,
) {
    for m in members.iter().filter(|m| m.alive) {
        signal(&m.child, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while members.iter().any(|m| m.alive) && Instant::now() < deadline {
        while let Ok(item) = rx.recv_timeout(Duration::from_millis(100)) {
            take_stopped(members, item, observer);
        }
        for m in members.iter_mut().filter(|m| m.alive) {
            if let Ok(Some(_)) = m.child.try_wait() {
                m.alive = false;
            }
        }
    }
    // Late lines from nodes that already exited.
    while let Ok(item) = rx.recv_timeout(Duration::from_millis(50)) {
        take_stopped(members, item, observer);
    }
    for m in members.iter_mut().filter(|m| m.alive) {
        let _ = m.child.kill();
        let _ = m.child.wait();
        m.alive = false;
    }
}
