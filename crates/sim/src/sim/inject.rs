//! What an adversary outside the nodes' cores needs: speaking as a node on its own schedule.

use neuroshard_node::core::{Inbound, Transmit};
use neuroshard_node::records::Topic;
use neuroshard_proof::Identity;

use super::{Sim, Tamper};

impl Sim {
    /// Leaves node `i` out of the genesis stakes (call before the first start): it can run,
    /// but never register, so the network counts none of its work.
    pub fn without_stake(&mut self, i: usize) {
        self.unstaked.insert(i);
    }

    /// Stakes `amount` for node `i` in the genesis instead of the founders' stake (call
    /// before the first start): later joiners with the minimum stake leave the first
    /// committee's quorum to the founders who run from the start.
    pub fn set_stake(&mut self, i: usize, amount: u64) {
        self.stake_of.insert(i, amount);
    }

    /// Stakes `n` spare keys for joiners in the genesis instead of [`super::SPARE_STAKED`]
    /// (call before the first start). Offline keys' stake counts against finality's quorum.
    pub fn set_spare_keys(&mut self, n: usize) {
        self.spares = n;
    }

    /// Founds the network with this round lead (`Protocol::round_lead`; 0: none) instead of
    /// the default (call before the first start).
    pub fn set_round_lead(&mut self, lead: u64) {
        self.round_lead = Some(lead);
    }

    /// Makes node `i` an adversary: everything it sends passes through `tamper`.
    pub fn set_tamper(&mut self, i: usize, tamper: Tamper) {
        self.nodes[i].tamper = Some(tamper);
    }

    /// Node `i`'s key (an adversary's tamper re-signs what it rewrites with it).
    pub fn identity(&self, i: usize) -> &Identity {
        &self.nodes[i].identity
    }

    /// Sends `t` from node `i` now, as if its core had emitted it (past any tamper): how an
    /// adversary that waits for what others sent answers later. Nothing if `i` is down.
    pub fn transmit_as(&mut self, i: usize, t: Transmit) {
        if self.nodes[i].core.is_some() {
            self.transmit(i, t);
        }
    }

    /// Gossips `data` on `topic` from node `i` to node `j` only: how an adversary shows
    /// different nodes different messages (gossip here reaches every subscriber at once, so
    /// this is the only way to split what they see).
    pub fn gossip_to(&mut self, i: usize, j: usize, topic: &Topic, data: Vec<u8>) {
        if self.nodes[i].core.is_some() {
            let len = data.len();
            let inbound = Inbound::Gossip {
                topic: topic.name(),
                data,
            };
            self.deliver(i, j, len, inbound);
        }
    }

    /// The stage node `i` was added to.
    pub fn stage_of(&self, i: usize) -> usize {
        self.nodes[i].stage
    }
}
