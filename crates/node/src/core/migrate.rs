//! Existing replicas move to a stage the network grew.
//!
//! The replicas whose joins triggered an upgrade chose their stages before it: the new stage
//! starts empty, and drivers keep training the old version until someone holds it. Every node
//! ranks the same candidates from its finalized ledger state: registered replicas of stages
//! that keep at least one other replica, the most replicated stages first, then by a hash of
//! (version, new stage, node) that no one picks. The first candidate moves at once; each
//! later one moves only if the stage is still empty [`MOVE_GRACE_EPOCHS`] finalized epochs
//! per rank after the upgrade, so a candidate that is down, or serves the HTTP API and stays,
//! delays the move without blocking it. A mover registers for the new stage as its drain
//! begins, so the stage is taken in the ledger while it drains. Several empty
//! stages fill at once ([`move_plan`]). A candidate leaves only if its stage keeps a live
//! replica besides the candidates ranked before it ([`may_leave`]). Joins that change which
//! stages are most replicated while the first mover drains can change the ranking, so a
//! stage may get a second mover; it then has two replicas.
//!
//! A mover first drains: it takes no new work, finishes what it holds, says it is leaving
//! once nothing of it is in flight (so no co-replica fails over work it still answers), and
//! keeps answering its auditors and the committee's jurors until every job it did has had its
//! beacon for an epoch and `EVIDENCE_GRACE`, as any worker keeps evidence, and no demand
//! holds a round: a restarted node's job log and evidence start empty, and an auditor's
//! "no such job" is a refusal the jurors slash. Then it checkpoints, stops, and starts again
//! in the new stage (the runtime restarts it), where it starts as identity blocks or borrows
//! a holder's θ₀. A drain that cannot end (finality stalled, a stage downstream holding a
//! gradient back) ends after [`MAX_DRAIN`].

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use neuroshard_proof::NodeId;

use super::{NodeCore, Transmit};
use crate::events::NodeEvent;

/// Finalized epochs a new stage waits for each better-ranked candidate to move: a mover
/// registers for the new stage when its drain begins, so the stage is no longer empty an
/// epoch or two later.
pub const MOVE_GRACE_EPOCHS: u64 = 5;

/// Whether `me`, a candidate to leave `source` (its registered replicas), may: the
/// candidates ranked before it (`ahead`) are moving or down, so at least one live replica of
/// the source other than those must stay. Registrations are never withdrawn, so a moved or
/// dead replica still counts as registered: the source's own heartbeats decide.
pub fn may_leave(
    me: NodeId,
    source: &[NodeId],
    ahead: &[NodeId],
    live: impl Fn(&NodeId) -> bool,
) -> bool {
    source
        .iter()
        .any(|n| *n != me && !ahead.contains(n) && live(n))
}

/// Longest a mover drains: past it, it leaves even with audits of its jobs still possible (a
/// network whose finality stalls slashes no one meanwhile either).
pub const MAX_DRAIN: Duration = Duration::from_secs(600);

/// A move under way.
#[derive(Debug, Clone, Copy)]
pub(super) struct Move {
    to: usize,
    since: Instant,
    /// The leaving heartbeat went out: peers route nothing here.
    departed: bool,
    /// Drained: the runtime may stop the node and start it in `to`.
    ready: bool,
}

/// Where each candidate stands for the move into `stage` of `version`: best first.
pub fn move_ranking(version: u32, stage: usize, replicas: &[(usize, Vec<NodeId>)]) -> Vec<NodeId> {
    let mut ranked: Vec<(Reverse<usize>, [u8; 32], NodeId)> = replicas
        .iter()
        .filter(|(s, nodes)| *s != stage && nodes.len() >= 2)
        .flat_map(|(s, nodes)| {
            nodes.iter().map(move |n| {
                let mut h = blake3::Hasher::new();
                h.update(b"neuroshard/move/v1");
                h.update(&version.to_le_bytes());
                h.update(&(*s as u64).to_le_bytes());
                h.update(&(stage as u64).to_le_bytes());
                h.update(&n.0);
                (Reverse(nodes.len()), *h.finalize().as_bytes(), *n)
            })
        })
        .collect();
    ranked.sort();
    ranked.dedup_by_key(|r| r.2);
    ranked.into_iter().map(|r| r.2).collect()
}

/// Who moves where when several stages are empty: for each empty stage in pipeline order,
/// its candidates ranked ([`move_ranking`]), without the first choices of the stages before
/// it, and counting each source stage without them (so concurrent moves never empty one).
pub fn move_plan(version: u32, replicas: &[(usize, Vec<NodeId>)]) -> Vec<(usize, Vec<NodeId>)> {
    let mut left: Vec<(usize, Vec<NodeId>)> = replicas.to_vec();
    let mut plan = Vec::new();
    for (empty, _) in replicas.iter().filter(|(_, nodes)| nodes.is_empty()) {
        let ranking = move_ranking(version, *empty, &left);
        if let Some(first) = ranking.first() {
            for (_, nodes) in &mut left {
                nodes.retain(|n| n != first);
            }
        }
        plan.push((*empty, ranking));
    }
    plan
}

impl NodeCore {
    /// The stage this node is leaving for, once it decided to move.
    pub fn moving(&self) -> Option<usize> {
        self.moving.map(|m| m.to)
    }

    /// The stage to start again in, once the move's drain is over.
    pub fn ready_to_move(&self) -> Option<usize> {
        self.moving.filter(|m| m.ready).map(|m| m.to)
    }

    /// Whether this node said it is leaving (it sends no more heartbeats).
    pub(super) fn departed(&self) -> bool {
        self.moving.is_some_and(|m| m.departed)
    }

    /// A mover's drain goes on: once nothing is in flight it says it is leaving; once no
    /// audit of its jobs can come it is ready to go.
    pub(super) fn progress_move(&mut self, now: Instant) {
        let Some(mut m) = self.moving.filter(|m| !m.ready) else {
            return;
        };
        if !m.departed && self.pipeline.idle() {
            m.departed = true;
            self.moving = Some(m);
            self.heartbeat(true, now);
        }
        let waited = now.saturating_duration_since(m.since);
        let complete = m.departed && self.audits_over(now);
        if !complete && waited < MAX_DRAIN {
            return;
        }
        m.ready = true;
        self.moving = Some(m);
        if !complete {
            self.warn(
                format!(
                    "leaving stage {} after {} s of draining with audits of its jobs still open",
                    self.stage,
                    waited.as_secs()
                ),
                now,
            );
        }
        let time_ms = self.unix_ms(now);
        self.events.push_back(NodeEvent::Drained {
            from: self.stage,
            to: m.to,
            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            complete,
            time_ms,
        });
    }

    /// Looks, after each finalized epoch, whether this node is the one to hold an empty stage
    /// of the newest version.
    pub(super) fn consider_move(&mut self, now: Instant) {
        // A node serving the HTTP API keeps its place (its front end lives in this process).
        if self.moving.is_some() || self.settings.http.is_some() {
            return;
        }
        // Every node ranks from the same finalized state (live ledgers differ by what
        // arrived where: two nodes could each rank themselves first).
        let Some(finalized) = self.finality.as_ref().map(|f| f.finalized_state()) else {
            return;
        };
        let Some(growth) = finalized.growth() else {
            return;
        };
        let Some(upgrade) = growth.history.last() else {
            return;
        };
        let since = growth.epochs.saturating_sub(upgrade.epoch);
        let newest = self.pipeline.layouts().newest();
        if newest.version() != upgrade.architecture.version || !newest.contains(self.stage) {
            return;
        }
        let replicas: Vec<(usize, Vec<NodeId>)> = newest
            .order()
            .iter()
            .filter_map(|&s| {
                let id = u16::try_from(s).ok()?;
                Some((s, finalized.registered(id).collect()))
            })
            .collect();
        // Only a registered replica of its stage may leave it (a node that holds an empty
        // stage, its registration not final yet, is none); `may_leave` keeps another there.
        let Some(source) = replicas
            .iter()
            .find(|(s, nodes)| *s == self.stage && nodes.contains(&self.me))
            .map(|(_, nodes)| nodes.as_slice())
        else {
            return;
        };
        let version = newest.version();
        let live = |n: &NodeId| {
            self.pipeline
                .peers
                .get(n)
                .is_some_and(|p| p.routable && p.stage == self.stage)
        };
        // The first empty stage whose turn for this node has come, and that leaves its
        // source a live replica.
        let due = move_plan(version, &replicas)
            .into_iter()
            .find_map(|(empty, ranking)| {
                let rank = ranking.iter().position(|n| *n == self.me)?;
                let turn = since >= (rank as u64).saturating_mul(MOVE_GRACE_EPOCHS);
                (turn && may_leave(self.me, source, &ranking[..rank], live)).then_some(empty)
            });
        if let Some(empty) = due {
            self.begin_move(empty, version, now);
        }
    }

    /// Leaves this stage for `to` of `version`: the drain starts, and the registration for
    /// `to` goes out (the stage is taken: the next candidates stay).
    pub(super) fn begin_move(&mut self, to: usize, version: u32, now: Instant) {
        self.moving = Some(Move {
            to,
            since: now,
            departed: false,
            ready: false,
        });
        self.pipeline.drain();
        let registration = u16::try_from(to)
            .ok()
            .and_then(|stage| self.economy.register(stage, self.unix_ms(now)));
        match registration {
            Some(Ok(data)) => self.transmits.push_back(Transmit::Publish {
                topic: crate::records::Topic::Ops,
                data,
            }),
            Some(Err(e)) => self.warn(format!("registration for stage {to}: {e}"), now),
            None => {}
        }
        let time_ms = self.unix_ms(now);
        self.events.push_back(NodeEvent::Moving {
            from: self.stage,
            to,
            version,
            time_ms,
        });
        self.progress_move(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    #[test]
    fn movers_come_from_the_most_replicated_stages_and_never_empty_one() {
        let replicas = vec![
            (0, vec![n(1), n(2), n(3)]),
            (1, vec![n(4)]),
            (3, vec![]),
            (2, vec![n(5), n(6)]),
        ];
        let ranking = move_ranking(1, 3, &replicas);
        assert_eq!(ranking.len(), 5, "stage 1's only replica never moves");
        assert!(!ranking.contains(&n(4)));
        let first: Vec<NodeId> = ranking[..3].to_vec();
        for i in 1..=3 {
            assert!(first.contains(&n(i)), "stage 0 (three replicas) goes first");
        }
        // The same inputs rank alike in any order; another version ranks anew.
        let mut shuffled = replicas.clone();
        shuffled.reverse();
        assert_eq!(move_ranking(1, 3, &shuffled), ranking);
        assert!((2..10).any(|v| move_ranking(v, 3, &replicas)[..3] != ranking[..3]));
    }

    /// Two new stages: each gets its own first mover, and the two never come from a stage
    /// that they would leave empty together.
    #[test]
    fn several_empty_stages_fill_at_once_without_emptying_a_source() {
        let replicas = vec![
            (0, vec![n(1), n(2), n(3)]),
            (3, vec![]),
            (4, vec![]),
            (1, vec![n(4), n(5)]),
            (2, vec![n(6)]),
        ];
        let plan = move_plan(2, &replicas);
        assert_eq!(plan.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [3, 4]);
        let (a, b) = (plan[0].1[0], plan[1].1[0]);
        assert_ne!(a, b, "one node cannot fill both");
        assert!(
            !plan[1].1.contains(&a),
            "the first stage's mover is not counted again"
        );
        // Stage 1 keeps a replica: at most one of its two moves first.
        let from_one = [a, b].iter().filter(|m| [n(4), n(5)].contains(m)).count();
        assert!(from_one <= 1);
        // Stage 2's only replica never moves.
        assert!(plan.iter().all(|(_, r)| !r.contains(&n(6))));
        // With one replica left in stage 0 after the first move, a three-replica source
        // gives at most two.
        let tight = vec![
            (0, vec![n(1), n(2)]),
            (3, vec![]),
            (4, vec![]),
            (1, vec![n(4)]),
        ];
        let plan = move_plan(1, &tight);
        assert_eq!(plan[0].1.len(), 2);
        assert!(plan[1].1.is_empty(), "stage 0 cannot give a second replica");
    }

    /// A later-ranked candidate moves only if its source keeps a live replica besides the
    /// candidates ranked before it: registrations stay after a move, so two replicas of a
    /// two-replica stage would otherwise both leave it.
    #[test]
    fn a_backup_mover_never_leaves_its_source_without_a_live_replica() {
        let source = [n(1), n(2)];
        let everyone = |_: &NodeId| true;
        assert!(may_leave(n(1), &source, &[], everyone), "the first of two");
        assert!(
            !may_leave(n(2), &source, &[n(1)], everyone),
            "the second would empty it"
        );
        let three = [n(1), n(2), n(3)];
        assert!(may_leave(n(2), &three, &[n(1)], everyone));
        // The third replica is down: its registration does not keep the stage held.
        assert!(!may_leave(n(2), &three, &[n(1)], |p| *p != n(3)));
    }

    #[test]
    fn no_stage_with_a_single_replica_gives_one() {
        let replicas = vec![(0, vec![n(1)]), (2, vec![]), (1, vec![n(2)])];
        assert!(move_ranking(1, 2, &replicas).is_empty());
    }
}
