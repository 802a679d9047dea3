//! Pulling a co-replica's round messages when gossip did not bring them. Gossip can lose a
//! message (a replica that just joined is not yet in the topic's mesh; a link drops), and a
//! replica that misses one live co-replica's offer aggregates without it after the deadline,
//! while the others count it: their outcomes differ, and the larger one cannot be checked
//! without the missing offer. So a replica still waiting for some live co-replicas' offers a
//! quarter into the wait asks a few of them ([`MAX_PULLS_PER_ROUND`]), once per round, for
//! their own signed messages of the round. The answer is checked like gossip: signed by the peer asked, for our network and
//! stage, from a registered replica.

use std::time::Instant;

use neuroshard_proof::{Canonical, CodecError, Hash32, NodeId, Reader, Writer};

use super::{Phase, SyncAction, Syncer};

/// Co-replicas a replica asks per round at most.
pub const MAX_PULLS_PER_ROUND: usize = 4;
/// Messages one answer to a pull of the peer's own messages carries: its offer and its
/// outcome of the round.
pub const MAX_PULLED: usize = 2;
/// Signed offers one answer to a pull of others' offers carries at most (every offer of a
/// round's contributors an outcome names, a few per contributor).
pub const MAX_RELAYED: usize = 256;
/// Largest answer in all.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Largest signed round message an answer may carry (an outcome lists at most 256
/// contributors and receipts: about 50 KB).
pub const MAX_PULLED_BYTES: usize = 128 * 1024;

/// "Send me your own signed round messages of `round`", or, when `of` names nodes, "send me
/// the signed offers of `round` you hold from these nodes" (the ones an outcome of yours names
/// and we lack).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncPull {
    pub network: Hash32,
    pub stage: u16,
    pub round: u64,
    pub of: Vec<NodeId>,
}

/// The answer: the responder's signed envelopes (as gossiped) of that round, possibly none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncPullAnswer {
    pub messages: Vec<Vec<u8>>,
}

impl Canonical for SyncPull {
    const DOMAIN: &'static str = "neuroshard/sync-pull/v2";

    fn encode_body(&self, w: &mut Writer) {
        w.fixed(&self.network);
        w.u16(self.stage);
        w.u64(self.round);
        w.len(self.of.len());
        for n in &self.of {
            w.fixed(&n.0);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let network = r.array()?;
        let stage = r.u16()?;
        let round = r.u64()?;
        let n = r.len(super::msgs::MAX_CONTRIBUTORS)?;
        let of = (0..n)
            .map(|_| r.array().map(NodeId))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            network,
            stage,
            round,
            of,
        })
    }
}

impl Canonical for SyncPullAnswer {
    const DOMAIN: &'static str = "neuroshard/sync-pull-answer/v2";

    fn encode_body(&self, w: &mut Writer) {
        w.len(self.messages.len());
        for m in &self.messages {
            w.bytes(m);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        let n = r.len(MAX_RELAYED)?;
        let mut total = 0usize;
        let mut messages = Vec::with_capacity(n);
        for _ in 0..n {
            let m = r.bytes(MAX_PULLED_BYTES)?;
            total = total.saturating_add(m.len());
            if total > MAX_ANSWER_BYTES {
                return Err(CodecError::Invalid {
                    field: "sync pull answer",
                    reason: format!("more than {MAX_ANSWER_BYTES} bytes"),
                });
            }
            messages.push(m.to_vec());
        }
        Ok(Self { messages })
    }
}

impl Syncer {
    /// While collecting `round`: once the pull time has come, the live co-replicas whose
    /// offers have not arrived, to be asked directly (at each quarter of the wait).
    pub(super) fn poll_pull(
        &mut self,
        now: Instant,
        live: &std::collections::BTreeSet<NodeId>,
    ) -> Option<SyncAction> {
        let Phase::Collecting {
            round, deadline, ..
        } = self.phase
        else {
            return None;
        };
        let (r, at) = self.pull_at?;
        if r != round || now < at || now >= deadline {
            return None;
        }
        // Again a quarter of the wait later, for those still missing: a co-replica slower than
        // us has no offer yet at the first pull, and would otherwise be left out of a round
        // whose other replicas count it.
        let next = at + self.cfg.timeout / 4;
        self.pull_at = (next < deadline).then_some((round, next));
        // In a large stage most missing offers are replicas that have not started the round
        // yet, not lost ones: ask a few, starting after our own id so that the stage's pulls
        // spread over its replicas instead of all landing on the lowest ids.
        let missing = live.iter().filter(|n| !self.heard(round, n));
        let (after, before): (Vec<&NodeId>, Vec<&NodeId>) = missing.partition(|n| **n > self.me);
        let from: Vec<NodeId> = after
            .into_iter()
            .chain(before)
            .take(MAX_PULLS_PER_ROUND)
            .copied()
            .collect();
        (!from.is_empty()).then_some(SyncAction::Pull { round, from })
    }

    /// Whether `node`'s offer of `round` is here.
    pub(super) fn heard(&self, round: u64, node: &NodeId) -> bool {
        self.offers
            .get(&round)
            .is_some_and(|o| o.contains_key(node))
    }

    /// When the missing offers of the round being collected are to be pulled.
    pub(super) fn pull_deadline(&self) -> Option<Instant> {
        match (&self.phase, self.pull_at) {
            (Phase::Collecting { round, .. }, Some((r, at))) if *round == r => Some(at),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_messages_round_trip_and_answers_are_bounded() {
        let pull = SyncPull {
            network: [7; 32],
            stage: 1,
            round: u64::MAX,
            of: vec![NodeId([3; 32])],
        };
        assert_eq!(
            SyncPull::from_canonical_bytes(&pull.to_canonical_bytes()).unwrap(),
            pull
        );
        let answer = SyncPullAnswer {
            messages: vec![vec![1, 2, 3], Vec::new()],
        };
        let bytes = answer.to_canonical_bytes();
        assert_eq!(
            SyncPullAnswer::from_canonical_bytes(&bytes).unwrap(),
            answer
        );
        let too_many = SyncPullAnswer {
            messages: vec![Vec::new(); MAX_RELAYED + 1],
        };
        assert!(SyncPullAnswer::from_canonical_bytes(&too_many.to_canonical_bytes()).is_err());
        let huge = SyncPullAnswer {
            messages: vec![vec![0; MAX_PULLED_BYTES + 1]],
        };
        assert!(SyncPullAnswer::from_canonical_bytes(&huge.to_canonical_bytes()).is_err());
        let too_large = SyncPullAnswer {
            messages: vec![vec![0; MAX_PULLED_BYTES]; MAX_ANSWER_BYTES / MAX_PULLED_BYTES + 1],
        };
        assert!(SyncPullAnswer::from_canonical_bytes(&too_large.to_canonical_bytes()).is_err());
        // Neither decodes as the other, nor as a round message.
        assert!(SyncPullAnswer::from_canonical_bytes(&pull.to_canonical_bytes()).is_err());
        assert!(super::super::SyncMsg::from_canonical_bytes(&pull.to_canonical_bytes()).is_err());
    }
}
