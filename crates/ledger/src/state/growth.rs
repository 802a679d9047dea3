//! The network's architecture in the ledger state: capacity announcements and the growth
//! rule, evaluated at the end of every finalized epoch (`crate::epoch`).

use neuroshard_growth::{Architecture, Claim, Evaluated, NetworkGrowth};

use super::*;

impl LedgerState {
    /// The network's growth state, for a network that grows.
    pub fn growth(&self) -> Option<&NetworkGrowth> {
        self.growth.as_ref()
    }

    /// The architecture the network trains now, for a network that grows.
    pub fn architecture(&self) -> Option<&Architecture> {
        self.growth.as_ref().map(|g| &g.architecture)
    }

    /// `id`'s latest capacity announcement (memory bytes, FLOP/s).
    pub fn claim(&self, id: &NodeId) -> Option<(u64, u64)> {
        self.claims.get(id).copied()
    }

    /// Whether `id` ever registered for a stage.
    pub fn has_registered(&self, id: &NodeId) -> bool {
        self.registrations.contains_key(id)
    }

    /// Accounts that registered for a stage and announced their capacity: the joins the
    /// growth rule counts. A node announces once it has measured its throughput, so the rule
    /// runs when the K-th node it can count has arrived, not before its claim. Both sets
    /// only grow, so an evaluation point, once reached, stays reached.
    pub fn joins(&self) -> u64 {
        self.claims
            .keys()
            .filter(|id| self.registrations.contains_key(id))
            .count() as u64
    }

    /// The announcements of the accounts registered now (for some stage, with the minimum
    /// stake): only stake-backed keys count, each once.
    pub fn registered_claims(&self) -> Vec<Claim> {
        self.claims
            .iter()
            .filter(|(id, _)| {
                self.registrations.contains_key(id)
                    && self.account(id).stake >= self.rules.min_stake
            })
            .map(|(id, &(memory_bytes, flops_per_s))| Claim {
                node: id.0,
                memory_bytes,
                flops_per_s,
            })
            .collect()
    }

    /// Ends an epoch of the finalized state: counts it for the stages' progress, settles the
    /// training rounds due (`state/pots.rs`) and runs the growth rule on the joins and the
    /// registered capacity this state holds (`None` for a network that does not grow). Live
    /// ledgers never call it; their architecture stays the genesis's, and they pay the
    /// settlements that finality made.
    pub fn end_epoch(&mut self) -> (Option<Evaluated>, Vec<super::RoundSettlement>) {
        // Stage progress counts activity in epochs (`state/progress.rs`).
        self.progress.end_epoch();
        let settled = self.settle_due();
        (self.run_growth(), settled)
    }

    fn run_growth(&mut self) -> Option<Evaluated> {
        // Out of the state while it runs, so the claims are read only when the rule asks.
        let mut growth = self.growth.take()?;
        let out = growth.end_epoch(self.joins(), || self.registered_claims());
        self.growth = Some(growth);
        Some(out)
    }
}
