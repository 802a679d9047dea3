//! The core's side of pulling round messages (see [`crate::sync::pull`]): it keeps the signed
//! round messages it gossiped, answers a pull with its own of the round asked, and takes a
//! pulled message in exactly as if gossip had brought it from the peer asked.

use std::time::Instant;

use neuroshard_proof::{Canonical, NodeId, Signed};

use super::{NodeCore, Pending, TransferError, Transmit};
use crate::records::Topic;
use crate::sync::pull::MAX_PULLED;
use crate::sync::{SyncMsg, SyncPull, SyncPullAnswer};

/// Signed round messages kept for pulls: a round's offer and outcome (the latest of each), for
/// the last few rounds (a co-replica pulls the round it is collecting, a round or two behind).
pub const PUBLISHED_KEPT: usize = 8;

impl NodeCore {
    /// Signs and gossips a round message, and keeps the envelope for co-replicas that pull it.
    /// A later outcome of the same round (a recomputation, an adoption) replaces the earlier
    /// one, so an answer always has room for the offer, which is what a puller lacks.
    pub(super) fn publish_sync(&mut self, msg: &SyncMsg) {
        let data = Signed::sign(&self.identity, msg).to_bytes();
        let key = (msg.round(), matches!(msg, SyncMsg::Offer(_)));
        let kept = &mut self.rounds.published;
        kept.retain(|(k, _)| *k != key);
        while kept.len() >= PUBLISHED_KEPT {
            kept.pop_front();
        }
        kept.push_back((key, data.clone()));
        let topic = Topic::Sync(self.stage as u16);
        self.transmits.push_back(Transmit::Publish { topic, data });
    }

    /// Asks each of `from` for its own messages of `round`.
    pub(super) fn send_sync_pulls(&mut self, round: u64, from: Vec<NodeId>) {
        tracing::debug!(
            "round {round}: pulling the offers of {} co-replicas",
            from.len()
        );
        let data = SyncPull {
            network: self.network,
            stage: self.stage as u16,
            round,
        }
        .to_canonical_bytes();
        for peer in from {
            let token = self.token();
            self.requests.insert(token, Pending::SyncPull { peer });
            self.transmits.push_back(Transmit::Request {
                to: peer,
                token,
                data: data.clone(),
            });
        }
    }

    /// Answers a pull with our latest messages of the round asked (none for another network
    /// or stage, or a round we no longer keep). They are public anyway: gossip carries them to
    /// every subscriber; the answer costs a copy of at most two of them.
    pub(super) fn answer_sync_pull(&mut self, token: super::Token, pull: &SyncPull) {
        let ours = pull.network == self.network && usize::from(pull.stage) == self.stage;
        let messages: Vec<Vec<u8>> = if ours {
            let kept = self.rounds.published.iter();
            kept.filter(|((r, _), _)| *r == pull.round)
                .take(MAX_PULLED)
                .map(|(_, d)| d.clone())
                .collect()
        } else {
            Vec::new()
        };
        self.transmits.push_back(Transmit::Respond {
            token,
            data: SyncPullAnswer { messages }.to_canonical_bytes(),
        });
    }

    /// What `peer` answered: each message is checked as gossip from `peer` is (signed by it,
    /// our network and stage, a registered replica), so relaying a third key's message or a
    /// forgery costs the peer as a bad gossip message would.
    pub(super) fn on_sync_pull_answer(
        &mut self,
        peer: NodeId,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) {
        // A failed transfer changes nothing: the round's deadline still ends the wait.
        let Ok(bytes) = result else {
            return;
        };
        match SyncPullAnswer::from_canonical_bytes(&bytes) {
            Ok(answer) => {
                for message in answer.messages {
                    self.on_sync_gossip(peer, &message, now);
                }
            }
            Err(e) => self.penalize(peer, format!("undecodable answer to a round pull: {e}")),
        }
    }
}
