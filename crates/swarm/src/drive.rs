//! Carrying out chaos on the running swarm: kills and restarts (the `--kill` one and the
//! soak's schedule share them), link cuts in the nodes' namespaces, the flood, and the probes
//! the soak is judged by (peak memory, ledger entries seen accepted).

use std::process::Command;
use std::time::{Duration, Instant};

use neuroshard_node::records::Topic;

use crate::chaos::{self, Action, Chaos, Planned};
use crate::flood::{self, Flood};
use crate::launch::{self, netns_addr};
use crate::soak::{CutRecord, FloodRecord, KillRecord};
use crate::{Observer, Swarm, SwarmError, now_ms, probe};

const MEMORY_EVERY: Duration = Duration::from_secs(1);
const LEDGER_EVERY: Duration = Duration::from_secs(5);

/// A soak under way.
pub(crate) struct ChaosRun {
    pub chaos: Chaos,
    pub plan: Vec<Planned>,
    next: usize,
    start: Instant,
    flood: Option<Flood>,
    /// The node whose link is down now.
    cut: Option<usize>,
    over: bool,
    memory_at: Instant,
    ledger_at: Instant,
}

impl ChaosRun {
    pub fn new(chaos: &Chaos, nodes: usize) -> Result<ChaosRun, SwarmError> {
        let now = Instant::now();
        Ok(ChaosRun {
            plan: chaos::plan(chaos, nodes)?,
            chaos: chaos.clone(),
            next: 0,
            start: now,
            flood: None,
            cut: None,
            over: false,
            memory_at: now,
            ledger_at: now,
        })
    }
}

/// Runs `ip -n NS link set lk0 STATE`, the device `bench/links.sh` gives each namespace.
fn set_link(ns: &str, up: bool) -> Result<(), LinkError> {
    let state = if up { "up" } else { "down" };
    let out = Command::new("ip")
        .args(["-n", ns, "link", "set", "lk0", state])
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LinkError::Refused(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// Why `ip` did not set a link.
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("ip: {0}")]
    Run(#[from] std::io::Error),
    /// What `ip` printed.
    #[error("{0}")]
    Refused(String),
}

impl Swarm<'_> {
    /// SIGKILL: no deathrattle, no checkpoint. Restarted `restart_after_ms` later, if set.
    pub(crate) fn kill_node(
        &mut self,
        node: usize,
        restart_after_ms: Option<u64>,
        observer: &mut dyn Observer,
    ) -> bool {
        let Some(m) = self.members.get_mut(node).filter(|m| m.alive) else {
            return false;
        };
        launch::signal(&m.child, libc::SIGKILL);
        let _ = m.child.wait();
        m.alive = false;
        self.report.soak.kills.push(KillRecord {
            node,
            stage: m.stage,
            killed_ms: now_ms(),
            restart_after_ms,
            ..KillRecord::default()
        });
        observer.note(&format!(
            "chaos: killed node {node} (stage {:?}) at driver step {}",
            m.stage,
            self.report.max_driver_step()
        ));
        true
    }

    /// Starts every killed node whose pause is over again; it resumes from its checkpoint.
    pub(crate) fn maybe_restart(&mut self, observer: &mut dyn Observer) -> Result<(), SwarmError> {
        let now = now_ms();
        let due: Vec<usize> = self
            .report
            .soak
            .kills
            .iter()
            .enumerate()
            .filter(|(_, k)| k.restarted_ms.is_none())
            .filter(|(_, k)| k.restart_after_ms.is_some_and(|a| now >= k.killed_ms + a))
            .map(|(j, _)| j)
            .collect();
        for j in due {
            let node = self.report.soak.kills[j].node;
            let m = &mut self.members[node];
            m.child = self.launch.spawn(&m.dir, self.bootstrap.as_deref(), node)?;
            m.alive = true;
            self.report.soak.kills[j].restarted_ms = Some(now_ms());
            observer.note(&format!("chaos: restarted node {node} from its checkpoint"));
        }
        Ok(())
    }

    /// Applies the schedule's due actions and takes the probes.
    pub(crate) fn chaos_tick(&mut self, observer: &mut dyn Observer) {
        let Some(run) = self.chaos.as_mut() else {
            return;
        };
        if run.over {
            return;
        }
        let elapsed = run.start.elapsed().as_millis() as u64;
        let mut due = Vec::new();
        while let Some(p) = run.plan.get(run.next).filter(|p| p.at_ms <= elapsed) {
            due.push(p.action);
            run.next += 1;
        }
        let probe_memory = run.memory_at.elapsed() >= MEMORY_EVERY;
        if probe_memory {
            run.memory_at = Instant::now();
        }
        let probe_ledger = run.ledger_at.elapsed() >= LEDGER_EVERY;
        if probe_ledger {
            run.ledger_at = Instant::now();
        }
        let restart_ms = run.chaos.restart_ms;
        for action in due {
            if self.apply(action, restart_ms, observer) {
                self.report.soak.applied += 1;
            }
        }
        if probe_memory {
            self.probe_memory();
        }
        if probe_ledger {
            self.probe_ledgers();
        }
    }

    fn apply(&mut self, action: Action, restart_ms: u64, observer: &mut dyn Observer) -> bool {
        match action {
            Action::Kill(node) => self.kill_node(node, Some(restart_ms), observer),
            Action::Cut(node) => self.cut(node, false, observer),
            Action::Heal(node) => self.cut(node, true, observer),
            Action::FloodStart(node) => self.start_flood(node, observer),
            Action::FloodStop => self.stop_flood(observer),
        }
    }

    /// Takes node `node`'s link down (or up again).
    fn cut(&mut self, node: usize, heal: bool, observer: &mut dyn Observer) -> bool {
        let Some(prefix) = &self.cfg.netns else {
            return false;
        };
        let result = set_link(&format!("{prefix}{node}"), heal);
        if let Err(e) = &result {
            observer.note(&format!("chaos: link of node {node}: {e}"));
            return false;
        }
        let now = now_ms();
        if heal {
            if let Some(c) = self
                .report
                .soak
                .cuts
                .iter_mut()
                .rev()
                .find(|c| c.node == node)
            {
                c.healed_ms = Some(now);
            }
            if let Some(run) = self.chaos.as_mut() {
                run.cut = None;
            }
            observer.note(&format!("chaos: node {node}'s link is up again"));
        } else {
            self.report.soak.cuts.push(CutRecord {
                node,
                cut_ms: now,
                ..CutRecord::default()
            });
            if let Some(run) = self.chaos.as_mut() {
                run.cut = Some(node);
            }
            observer.note(&format!("chaos: node {node}'s link is down (partition)"));
        }
        true
    }

    fn start_flood(&mut self, node: usize, observer: &mut dyn Observer) -> bool {
        let Some((tcp, p2p)) = self
            .members
            .get(node)
            .and_then(|m| flood::tcp_target(&m.addrs))
        else {
            observer.note(&format!("chaos: node {node} has no TCP address to flood"));
            return false;
        };
        let stages = self.cfg.node.stages;
        let mut topics: Vec<String> = (0..stages)
            .filter_map(|s| u16::try_from(s).ok())
            .flat_map(|s| [Topic::Heartbeat(s), Topic::Proof(s), Topic::Sync(s)])
            .map(|t| t.name())
            .collect();
        topics.push(Topic::Ops.name());
        let hostile = self.cfg.hostile_index();
        let (ns, ip) = match &self.cfg.netns {
            Some(prefix) => (Some(format!("{prefix}{hostile}")), netns_addr(hostile)),
            None => (None, "127.0.0.1".to_string()),
        };
        let seed = self.cfg.chaos.as_ref().map_or(1, |c| c.seed);
        let target = flood::Target {
            node,
            tcp,
            p2p,
            topics,
        };
        match Flood::start(target, ns, ip, seed) {
            Ok(f) => {
                if let Some(run) = self.chaos.as_mut() {
                    run.flood = Some(f);
                }
                self.report.soak.flood = Some(FloodRecord {
                    node,
                    start_ms: now_ms(),
                    ..FloodRecord::default()
                });
                observer.note(&format!("chaos: flooding node {node} at {tcp} with junk"));
                true
            }
            Err(e) => {
                observer.note(&format!("chaos: could not start the flood: {e}"));
                false
            }
        }
    }

    fn stop_flood(&mut self, observer: &mut dyn Observer) -> bool {
        let Some(f) = self.chaos.as_mut().and_then(|r| r.flood.take()) else {
            return false;
        };
        let stats = f.stop();
        observer.note(&format!(
            "chaos: flood over: {} junk connections, {:.1} MB of junk, {} junk gossip messages",
            stats.tcp_connections,
            stats.junk_bytes as f64 / 1e6,
            stats.gossip_sent
        ));
        if let Some(rec) = self.report.soak.flood.as_mut() {
            rec.stop_ms = Some(now_ms());
            rec.stats = Some(stats);
        }
        true
    }

    /// Training is over (or the run stops): no more actions; heal, stop the flood, and note
    /// whether the schedule was cut short.
    pub(crate) fn end_chaos(&mut self, observer: &mut dyn Observer) {
        let Some(run) = self.chaos.as_mut() else {
            return;
        };
        if run.over {
            return;
        }
        run.over = true;
        if run.next < run.plan.len() {
            observer.note(&format!(
                "chaos: training ended with {} of {} actions still to come",
                run.plan.len() - run.next,
                run.plan.len()
            ));
            self.report.soak.cut_short = true;
        }
        let cut = run.cut;
        if let Some(node) = cut {
            self.cut(node, true, observer);
        }
        self.stop_flood(observer);
        self.probe_memory();
        self.probe_ledgers();
    }

    fn probe_memory(&mut self) {
        for m in self.members.iter().filter(|m| m.alive) {
            if let Some(kb) = probe::peak_kb(m.child.id()) {
                self.report.soak.note_memory(m.index, kb);
            }
        }
    }

    fn probe_ledgers(&mut self) {
        let now = now_ms();
        for m in self.members.iter().filter(|m| m.alive) {
            match probe::ledger_hashes(&m.dir) {
                Ok(hashes) => self.report.soak.note_accepted(m.index, &hashes, now),
                Err(e) => {
                    tracing::debug!("ledger of node {}: {e}", m.index);
                    self.report.soak.ledger_sample_errors += 1;
                }
            }
            self.report.soak.ledger_samples += 1;
        }
    }
}
