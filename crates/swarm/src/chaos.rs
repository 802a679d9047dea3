//! The chaos soak's schedule: from a seed, when to SIGKILL which node, when to cut one node's
//! link and heal it, and when a hostile process floods which node. Pure, so a schedule is
//! tested (and repeated) without processes; `soak.rs` carries it out and judges the run.

use neuroshard_linkem::Rng;

use crate::SwarmError;

/// `--chaos SPEC`: what the soak does and the bounds it is judged by.
#[derive(Debug, Clone, PartialEq)]
pub struct Chaos {
    /// Length of the chaos window, from the start of training.
    pub secs: u64,
    pub seed: u64,
    /// Gap between two kills, drawn uniformly from this range (seconds).
    pub kill_every: (u64, u64),
    /// A killed node is started again (from its checkpoint) this long after the kill.
    pub restart_ms: u64,
    /// One node's link is down this long, once (0: no partition). Needs `--netns`.
    pub partition_s: u64,
    /// A hostile process floods one node with junk for most of the window.
    pub flood: bool,
    pub bounds: Bounds,
}

/// What a soak must show to pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// A restarted (or healed) node steps again within this long.
    pub recover_ms: u64,
    /// No node's peak resident memory (VmHWM) above this.
    pub mem_mb: u64,
    /// Final validation loss at least this far (nats) below the initial one.
    pub loss_drop: f64,
}

impl Default for Chaos {
    fn default() -> Self {
        Chaos {
            secs: 600,
            seed: 1,
            kill_every: (30, 60),
            restart_ms: 3_000,
            partition_s: 20,
            flood: true,
            bounds: Bounds {
                recover_ms: 60_000,
                mem_mb: 2_048,
                loss_drop: 0.2,
            },
        }
    }
}

impl Chaos {
    /// `key=value,…` over the defaults: `secs`, `seed`, `kill=MIN-MAX` (seconds),
    /// `restart-ms`, `partition-s`, `flood=on|off`, `recover-ms`, `mem-mb`, `loss-drop`.
    pub fn parse(spec: &str) -> Result<Chaos, SwarmError> {
        let mut c = Chaos::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || SwarmError::Config(format!("--chaos: cannot read {part:?}"));
            let (key, value) = part.split_once('=').ok_or_else(bad)?;
            let num = || value.parse::<u64>().map_err(|_| bad());
            match key {
                "secs" => c.secs = num()?,
                "seed" => c.seed = num()?,
                "kill" => {
                    let (lo, hi) = value.split_once('-').ok_or_else(bad)?;
                    let lo: u64 = lo.parse().map_err(|_| bad())?;
                    let hi: u64 = hi.parse().map_err(|_| bad())?;
                    if lo == 0 || hi < lo {
                        return Err(bad());
                    }
                    c.kill_every = (lo, hi);
                }
                "restart-ms" => c.restart_ms = num()?,
                "partition-s" => c.partition_s = num()?,
                "flood" => {
                    c.flood = match value {
                        "on" => true,
                        "off" => false,
                        _ => return Err(bad()),
                    }
                }
                "recover-ms" => c.bounds.recover_ms = num()?,
                "mem-mb" => c.bounds.mem_mb = num()?,
                "loss-drop" => {
                    c.bounds.loss_drop = value
                        .parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite())
                        .ok_or_else(bad)?
                }
                _ => return Err(bad()),
            }
        }
        if c.secs == 0 {
            return Err(SwarmError::Config("--chaos: secs must be positive".into()));
        }
        Ok(c)
    }
}

/// No kill of the node to be cut this long before its cut: it would be judged on
/// recovering through the partition.
const QUIET_BEFORE_CUT_MS: u64 = 15_000;

/// One chaos action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL the node; it is started again `restart_ms` later.
    Kill(usize),
    /// Take the node's link down.
    Cut(usize),
    /// Bring it up again.
    Heal(usize),
    FloodStart(usize),
    FloodStop,
}

/// An action and when it is due, in ms from the start of training.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub at_ms: u64,
    pub action: Action,
}

/// Uniform in `lo..=hi`.
fn between(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    lo + rng.next_u64() % (hi - lo + 1)
}

fn pick(rng: &mut Rng, from: &[usize]) -> Option<usize> {
    (!from.is_empty()).then(|| from[(rng.next_u64() % from.len() as u64) as usize])
}

/// The schedule for `nodes` nodes, sorted by time. Node 0 is everyone's bootstrap peer and is
/// never touched. The flooded node is never killed or cut, so the flood measures one node
/// under attack the whole time; kills spare the cut node from a while before its partition to
/// the recovery target after it, so each recovery is timed against one fault.
pub fn plan(c: &Chaos, nodes: usize) -> Result<Vec<Planned>, SwarmError> {
    let mut rng = Rng::new(c.seed);
    let mut others: Vec<usize> = (1..nodes).collect();
    let window = c.secs * 1_000;
    let mut out = Vec::new();
    if c.flood {
        let victim = pick(&mut rng, &others)
            .ok_or_else(|| SwarmError::Config("--chaos: a flood needs 2 nodes or more".into()))?;
        others.retain(|n| *n != victim);
        out.push(Planned {
            at_ms: window / 10,
            action: Action::FloodStart(victim),
        });
        out.push(Planned {
            at_ms: window * 9 / 10,
            action: Action::FloodStop,
        });
    }
    if others.is_empty() {
        return Err(SwarmError::Config(
            "--chaos: no node left to kill (node 0 and the flooded node are spared)".into(),
        ));
    }
    let mut cut: Option<(usize, u64, u64)> = None;
    if c.partition_s > 0 {
        let node = pick(&mut rng, &others).unwrap_or(others[0]);
        let at = between(&mut rng, window / 3, window / 2);
        let heal = at + c.partition_s * 1_000;
        out.push(Planned {
            at_ms: at,
            action: Action::Cut(node),
        });
        out.push(Planned {
            at_ms: heal,
            action: Action::Heal(node),
        });
        cut = Some((node, at, heal));
    }
    let (lo, hi) = (c.kill_every.0 * 1_000, c.kill_every.1 * 1_000);
    let mut t = between(&mut rng, lo, hi);
    // A kill's restart must fall inside the window, so the run can judge its recovery.
    while t + c.restart_ms < window {
        let busy = |n: &usize| {
            cut.is_some_and(|(node, at, heal)| {
                *n == node
                    && t + c.restart_ms + QUIET_BEFORE_CUT_MS >= at
                    && t <= heal + c.bounds.recover_ms
            })
        };
        let free: Vec<usize> = others.iter().copied().filter(|n| !busy(n)).collect();
        if let Some(node) = pick(&mut rng, &free) {
            out.push(Planned {
                at_ms: t,
                action: Action::Kill(node),
            });
        }
        t += between(&mut rng, lo, hi);
    }
    out.sort_by_key(|p| p.at_ms);
    Ok(out)
}
