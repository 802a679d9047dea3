//! Serving in the simulator: open a stream at a node, read what it reported.

use neuroshard_node::core::NodeCore;
use neuroshard_node::serve::{Completion, OpenError, ServeEvent};

use super::Sim;

impl Sim {
    /// Opens a completion stream at node `i` now (as its HTTP API would).
    pub fn open_stream(&mut self, i: usize, req: Completion) -> Result<u64, OpenError> {
        let now = self.now;
        let core = self.nodes[i]
            .core
            .as_mut()
            .ok_or_else(|| OpenError::Invalid("the node is down".into()))?;
        let id = core.open_stream(req, now)?;
        self.after(i);
        Ok(id)
    }

    /// Node `i`'s core, to change its settings (e.g. serving limits).
    pub fn core_mut(&mut self, i: usize) -> Option<&mut NodeCore> {
        self.nodes[i].core.as_mut()
    }

    /// Tokens and ends of the streams node `i` coordinated.
    pub fn served(&self, i: usize) -> &[ServeEvent] {
        &self.nodes[i].served
    }
}
