//! The core's side of pulling round messages (see [`crate::sync::pull`]): it keeps the signed
//! round messages it gossiped, answers a pull with its own of the round asked, and takes a
//! pulled message in exactly as if gossip had brought it from the peer asked.

use std::collections::BTreeSet;
use std::time::Instant;

use neuroshard_proof::{Canonical, NodeId, Signed};

use super::{NodeCore, Pending, TransferError, Transmit};
use crate::records::Topic;
use crate::sync::pull::{MAX_PULLED, MAX_RELAYED};
use crate::sync::{
    DISPLACED_PER_SENDER, SyncMsg, SyncOffer, SyncPull, SyncPullAnswer, keep_latest_per_sender,
};

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

    /// A pull of `round` of our network and stage: the peer's own messages, or (`of` not
    /// empty) the offers of those nodes it holds.
    fn sync_pull(&self, round: u64, of: Vec<NodeId>) -> Vec<u8> {
        SyncPull {
            network: self.network,
            stage: self.stage as u16,
            round,
            of,
        }
        .to_canonical_bytes()
    }

    /// Asks each of `from` for its own messages of `round`.
    pub(super) fn send_sync_pulls(&mut self, round: u64, from: Vec<NodeId>) {
        tracing::debug!(
            "round {round}: pulling the offers of {} co-replicas",
            from.len()
        );
        let data = self.sync_pull(round, Vec::new());
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
        let messages: Vec<Vec<u8>> = if ours && !pull.of.is_empty() {
            // The signed offers we hold of the nodes named (what an outcome of ours names),
            // our own latest included.
            let own = pull.of.contains(&self.me).then(|| {
                let kept = self.rounds.published.iter();
                kept.filter(|((r, offer), _)| *r == pull.round && *offer)
                    .map(|(_, d)| d.clone())
            });
            let round = self.rounds.heard_offers.get(&pull.round);
            let heard = pull
                .of
                .iter()
                .filter_map(|n| round?.get(n))
                .flatten()
                .map(|(_, d)| d.clone());
            own.into_iter()
                .flatten()
                .chain(heard)
                .take(MAX_RELAYED)
                .collect()
        } else if ours {
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
                if answer.messages.len() > MAX_PULLED {
                    self.penalize(
                        peer,
                        "answered a round pull with more than its own messages",
                    );
                }
                for message in answer.messages.into_iter().take(MAX_PULLED) {
                    self.on_sync_gossip(peer, &message, now);
                }
            }
            Err(e) => self.penalize(peer, format!("undecodable answer to a round pull: {e}")),
        }
    }
}

impl NodeCore {
    /// Keeps the envelope of a co-replica's signed offer, to relay to a co-replica that
    /// lacks an offer our outcome names. Bounded like the syncer's own copies: the latest
    /// rounds of each sender, a few offers per round, none of rounds we finished.
    pub(super) fn keep_offer_envelope(&mut self, node: NodeId, offer: &SyncOffer, data: &[u8]) {
        let current = self.rounds.syncer.round();
        if offer.round < current {
            return;
        }
        let heard = &mut self.rounds.heard_offers;
        heard.retain(|r, _| *r >= current);
        let kept = heard
            .entry(offer.round)
            .or_default()
            .entry(node)
            .or_default();
        kept.retain(|(blob, _)| *blob != offer.blob);
        kept.push((offer.blob, data.to_vec()));
        if kept.len() > 1 + DISPLACED_PER_SENDER {
            kept.remove(0);
        }
        keep_latest_per_sender(heard, &node);
    }

    /// Asks `peer`, whose outcome of `round` names offers of `nodes` we lack, for them.
    pub(super) fn send_offer_fetch(&mut self, round: u64, peer: NodeId, nodes: Vec<NodeId>) {
        tracing::debug!(
            "round {round}: asking {peer} for the offers of {} contributors its outcome names",
            nodes.len()
        );
        let data = self.sync_pull(round, nodes.clone());
        let token = self.token();
        self.requests.insert(
            token,
            Pending::SyncOffers {
                peer,
                round,
                nodes: nodes.into_iter().collect(),
            },
        );
        self.transmits.push_back(Transmit::Request {
            to: peer,
            token,
            data,
        });
    }

    /// What `peer` relayed: each message must be an offer of `round`, of our network and
    /// stage, signed by one of the nodes we asked about, which must be registered for the
    /// stage. Anything else (a forgery, another round, a node we did not ask about) costs the
    /// relay as a bad gossip message would.
    pub(super) fn on_sync_offers_answer(
        &mut self,
        peer: NodeId,
        round: u64,
        nodes: &BTreeSet<NodeId>,
        result: Result<Vec<u8>, TransferError>,
        now: Instant,
    ) {
        let Ok(bytes) = result else {
            return;
        };
        let answer = match SyncPullAnswer::from_canonical_bytes(&bytes) {
            Ok(a) => a,
            Err(e) => {
                self.penalize(peer, format!("undecodable answer to an offer fetch: {e}"));
                return;
            }
        };
        for data in answer.messages {
            let signed = match Signed::<SyncMsg>::from_bytes(&data) {
                Ok(s) => s,
                Err(e) => {
                    self.penalize(peer, format!("relayed an undecodable offer: {e}"));
                    continue;
                }
            };
            let node = signed.signer().node_id();
            let offer = match signed.verify() {
                Ok(SyncMsg::Offer(o)) => o,
                Ok(SyncMsg::Done(_)) => {
                    self.penalize(peer, "relayed an outcome where offers were asked");
                    continue;
                }
                Err(e) => {
                    self.penalize(peer, format!("relayed a forged offer: {e}"));
                    continue;
                }
            };
            let ours = offer.network == self.network && usize::from(offer.stage) == self.stage;
            if !ours || offer.round != round || !nodes.contains(&node) {
                self.penalize(peer, "relayed an offer that was not asked for");
                continue;
            }
            if !self.economy.ledger().is_registered(&node, offer.stage) {
                continue;
            }
            if let Err(e) = self.notice_offer(node, &offer, now) {
                if e.blames_sender() {
                    let why = format!("relayed an offer whose commitment fails: {e}");
                    self.penalize(peer, why);
                }
                continue;
            }
            self.keep_offer_envelope(node, &offer, &data);
            let actions = self.rounds.syncer.on_offer(peer, node, offer, now);
            self.run_sync_actions(actions, now);
        }
        self.poll_rounds(now);
    }
}
