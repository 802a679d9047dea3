//! Training rewards reach the live ledger only as finality settled them: a round's fixed
//! reward split among the contributors the finalized state counted (`ledger::state::pots`).
//! A live ledger's own view of a round (which proofs reached this node first) decides
//! nothing, so every node pays the same keys the same shares.

use neuroshard_ledger::{LedgerState, RoundSettlement};

use super::{Economy, EconomyError, LedgerWrite};

/// What following finality's settlements paid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Followed {
    /// Rounds settled.
    pub rounds: usize,
    /// Paid to all contributors.
    pub paid: u64,
    /// Paid to this node.
    pub own: u64,
}

impl Followed {
    /// Both payments together.
    pub fn and(self, other: Followed) -> Followed {
        Followed {
            rounds: self.rounds + other.rounds,
            paid: self.paid.saturating_add(other.paid),
            own: self.own.saturating_add(other.own),
        }
    }
}

impl Economy {
    /// Pays on the live ledger what `finalized` settled and it did not pay yet, of the latest
    /// settlements the finalized state keeps (at start-up: what a crash kept from the store),
    /// and queues the writes.
    pub fn follow_settlements(
        &mut self,
        finalized: &LedgerState,
    ) -> Result<Followed, EconomyError> {
        let changes = self.ledger.follow_settlements(finalized)?;
        Ok(self.keep_settled(changes))
    }

    /// Pays on the live ledger the settlements finalized epochs made, in order (those paid
    /// before are skipped), and queues the writes.
    pub fn apply_settlements(
        &mut self,
        settled: &[RoundSettlement],
    ) -> Result<Followed, EconomyError> {
        let mut changes = Vec::new();
        for s in settled {
            changes.extend(self.ledger.apply_settlement(s)?);
        }
        Ok(self.keep_settled(changes))
    }

    fn keep_settled(&mut self, all: Vec<neuroshard_ledger::Changes>) -> Followed {
        let me = self.node_id();
        let mut followed = Followed::default();
        for changes in all {
            for r in &changes.records {
                if matches!(r, neuroshard_ledger::Record::Settled { .. }) {
                    followed.rounds += 1;
                }
            }
            for e in &changes.entries {
                followed.paid = followed.paid.saturating_add(e.amount);
                if e.account == me {
                    followed.own = followed.own.saturating_add(e.amount);
                }
            }
            self.writes.push_back(LedgerWrite::of(changes));
        }
        if followed.rounds > 0 {
            self.sync.dirty = true;
        }
        followed
    }
}
