//! What an adversary outside the nodes' cores needs: speaking as a node on its own schedule.

use neuroshard_node::core::Transmit;

use super::Sim;

impl Sim {
    /// Sends `t` from node `i` now, as if its core had emitted it (past any tamper): how an
    /// adversary that waits for what others sent answers later. Nothing if `i` is down.
    pub fn transmit_as(&mut self, i: usize, t: Transmit) {
        if self.nodes[i].core.is_some() {
            self.transmit(i, t);
        }
    }

    /// The stage node `i` was added to.
    pub fn stage_of(&self, i: usize) -> usize {
        self.nodes[i].stage
    }
}
