//! Where a stage's outputs go: routing to the best replica of the next stage, the answers to
//! our sends, failover on a dead peer or a gradient timeout.

use std::time::Instant;

use neuroshard_proof::NodeId;

use super::*;

impl Pipeline {
    /// Sends (or re-sends) an outstanding micro-batch to the best replica not yet tried.
    pub(super) fn route(&mut self, mb: MicroBatchId, now: Instant) -> Vec<Action> {
        let Some(out) = self.outstanding.get_mut(&mb) else {
            return Vec::new();
        };
        let version = match &out.msg {
            Msg::Forward { version, .. } => *version,
            Msg::Backward { .. } => 0,
        };
        // Versions are never forgotten and a stashed one is known; the last stage of a
        // version has nowhere to send (it never sends forwards).
        let Some(next) = self
            .cfg
            .layouts
            .get(version)
            .and_then(|l| l.next(self.cfg.stage))
        else {
            return Vec::new();
        };
        let mut picks = router::candidates(
            &self.peers,
            next,
            self.cfg.candidates,
            &out.tried,
            self.service,
        );
        if picks.is_empty() && !out.tried.is_empty() {
            // Every replica was tried: start over with all of them after a pause.
            out.tried.clear();
            out.state = SendState::Waiting(now + self.cfg.retry_after);
            return Vec::new();
        }
        if picks.is_empty() {
            let first_wait = !out.warned;
            out.warned = true;
            out.state = SendState::Waiting(now + self.cfg.retry_after);
            if !first_wait {
                return Vec::new();
            }
            return vec![self.warning(
                now,
                format!(
                    "no live replica of stage {next}; micro-batch {} waits",
                    mb.short()
                ),
            )];
        }
        let to = picks.remove(0);
        let sent = self
            .sent_to
            .entry(mb)
            .or_insert_with(|| (BTreeSet::new(), now));
        sent.0.insert(to);
        sent.1 = now;
        out.tried.insert(to);
        out.to = Some(to);
        out.state = SendState::Sending;
        out.sent_at = now;
        if let Some(p) = self.peers.get_mut(&to) {
            p.in_flight += 1;
        }
        vec![Action::Send {
            to,
            msg: out.msg.clone(),
        }]
    }

    /// Outcome of a request this machine asked for.
    pub fn on_send_result(
        &mut self,
        to: NodeId,
        mb: MicroBatchId,
        kind: &str,
        result: Result<Ack, TransferError>,
        now: Instant,
    ) -> Vec<Action> {
        if kind == "backward" {
            return match result {
                Ok(Ack::Accepted) => Vec::new(),
                Ok(other) => vec![self.warning(
                    now,
                    format!("gradient for {} refused by {to}: {other:?}", mb.short()),
                )],
                // The sender is gone; the driver's timeout re-sends through another path.
                Err(e) => vec![self.warning(
                    now,
                    format!("gradient for {} not delivered to {to}: {e}", mb.short()),
                )],
            };
        }
        let Some(out) = self.outstanding.get_mut(&mb) else {
            return Vec::new();
        };
        if out.to != Some(to) || !matches!(out.state, SendState::Sending) {
            return Vec::new();
        }
        let latency = now.saturating_duration_since(out.sent_at);
        match result {
            Ok(Ack::Accepted) => {
                out.state = SendState::Accepted;
                out.sent_at = now;
                let failover = out.failover.take();
                self.peers.observe_latency(&to, latency);
                match failover {
                    Some((from, reason, noticed)) => vec![Action::Event(NodeEvent::Failover {
                        mb: mb.short(),
                        from: from.to_string(),
                        to: to.to_string(),
                        reason,
                        ms: now.saturating_duration_since(noticed).as_secs_f64() * 1e3,
                        time_ms: self.cfg.clock.unix_ms(now),
                    })],
                    None => Vec::new(),
                }
            }
            Ok(Ack::Busy) => {
                self.release(&to);
                self.route(mb, now)
            }
            Ok(Ack::Rejected(why)) => {
                self.release(&to);
                let mut actions = vec![self.warning(
                    now,
                    format!("{to} refused micro-batch {}: {why}", mb.short()),
                )];
                actions.extend(self.route(mb, now));
                actions
            }
            Err(e) => {
                self.release(&to);
                self.fail_over(mb, to, format!("send failed: {e}"), now)
            }
        }
    }

    pub(super) fn warning(&self, now: Instant, message: String) -> Action {
        Action::Event(NodeEvent::Warning {
            stage: Some(self.cfg.stage),
            message,
            time_ms: self.cfg.clock.unix_ms(now),
        })
    }

    pub(super) fn release(&mut self, peer: &NodeId) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.in_flight = p.in_flight.saturating_sub(1);
        }
    }

    pub(super) fn fail_over(
        &mut self,
        mb: MicroBatchId,
        from: NodeId,
        reason: String,
        now: Instant,
    ) -> Vec<Action> {
        if let Some(out) = self.outstanding.get_mut(&mb) {
            if out.failover.is_none() {
                out.failover = Some((from, reason, now));
            }
            out.to = None;
        }
        self.route(mb, now)
    }

    /// A peer died (connection lost, heartbeats missed, or deathrattle): stop routing to it
    /// and re-send everything it held for us.
    pub fn on_peer_down(&mut self, peer: NodeId, why: &str, now: Instant) -> Vec<Action> {
        self.peers.remove(&peer);
        let lost: Vec<MicroBatchId> = self
            .outstanding
            .iter()
            .filter(|(_, o)| o.to == Some(peer))
            .map(|(mb, _)| *mb)
            .collect();
        let mut actions = Vec::new();
        for mb in lost {
            actions.extend(self.fail_over(mb, peer, why.to_string(), now));
        }
        actions
    }

    /// The next instant [`Self::on_tick`] has work: a retry, a gradient timeout or a peer's
    /// heartbeat expiry.
    pub fn next_deadline(&self) -> Option<Instant> {
        let sends = self.outstanding.values().filter_map(|o| match o.state {
            SendState::Waiting(at) => Some(at),
            SendState::Accepted => Some(o.sent_at + self.grad_wait()),
            SendState::Sending => None,
        });
        sends.chain(self.peers.next_expiry()).min()
    }

    /// Timeouts and retries.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        for peer in self.peers.expire(now) {
            actions.extend(self.on_peer_down(peer, "missed 3 heartbeats", now));
        }
        let wait = self.grad_wait();
        let due: Vec<(MicroBatchId, Option<NodeId>)> = self
            .outstanding
            .iter()
            .filter(|(_, o)| match o.state {
                SendState::Waiting(at) => at <= now,
                SendState::Accepted => now.saturating_duration_since(o.sent_at) > wait,
                SendState::Sending => false,
            })
            .map(|(mb, o)| (*mb, o.to))
            .collect();
        for (mb, to) in due {
            match to {
                Some(peer) => {
                    self.release(&peer);
                    actions.extend(self.fail_over(mb, peer, "gradient timed out".into(), now));
                }
                None => actions.extend(self.route(mb, now)),
            }
        }
        // Inputs whose gradient can no longer come (their path died) are forgotten.
        let horizon = wait.saturating_mul(3);
        let outstanding = &self.outstanding;
        let is_first = self.is_first();
        self.stash.retain(|mb, s| {
            is_first
                || outstanding.contains_key(mb)
                || now.saturating_duration_since(s.since) < horizon
        });
        self.slots.keep_only(&self.stash);
        // A replica still answering this long after its last send has no answer worth taking.
        self.sent_to.retain(|mb, (_, at)| {
            outstanding.contains_key(mb) || now.saturating_duration_since(*at) < horizon
        });
        actions
    }
}
