//! A replica that moves to a stage the network grew (`core/migrate.rs`): once its drain is
//! over it stops, as the runtime's `Exit::Move` does, and starts again in the new stage with
//! its ledger, the architecture versions it knew and a fresh engine for the new blocks.

use std::time::Duration;

use neuroshard_node::peers::PeerTable;

use super::{Ev, Sim};

/// How long a mover is down between its stop and its start in the new stage (a process
/// restart: checkpoint, network and engine start-up).
pub const MOVE_RESTART: Duration = Duration::from_secs(2);

impl Sim {
    pub(super) fn move_node(&mut self, i: usize, to: usize) {
        let Some(layouts) = self.nodes[i].core.as_ref().map(|c| c.layouts().clone()) else {
            return;
        };
        // Its connections close as any stopped node's do; its disk keeps the ledger.
        self.crash(i);
        let (Some(spec), Some(model)) = (layouts.spec(to), layouts.newest().stage_model(to)) else {
            return self.cannot_start(i, &format!("stage {to} is in no version it knows"));
        };
        let node = self.nodes[i].identity.node_id();
        match self.factory.grown_engine(node, to, model, spec) {
            Ok(built) => {
                let n = &mut self.nodes[i];
                n.stage = to;
                n.engine = None;
                n.saved_step = 0;
                n.layouts = Some(layouts);
                n.prepared = Some((built, PeerTable::default()));
                self.push(self.now + MOVE_RESTART, Ev::Start { node: i });
            }
            Err(e) => self.cannot_start(i, &format!("moving to stage {to}: {e}")),
        }
    }
}
