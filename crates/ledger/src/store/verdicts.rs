//! Audit verdicts as the database holds them (`neuroshard ledger verdicts`).

use rusqlite::params;

use super::{Ledger, StoreError, from_sql};

/// One applied audit verdict: who was slashed for which job, and who was paid.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VerdictLine {
    /// The audited job's key (hex).
    pub job: String,
    /// The guilty worker, or the false accuser (hex node id).
    pub offender: String,
    /// The auditor, or the wrongly accused worker.
    pub beneficiary: String,
    /// Stake taken from the offender, and the part of it paid to the beneficiary.
    pub slashed: u64,
    pub paid: u64,
    pub timestamp_ms: u64,
}

impl Ledger {
    /// The newest `limit` audit verdicts this ledger applied.
    pub fn verdicts(&self, limit: usize) -> Result<Vec<VerdictLine>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT job, offender, beneficiary, slashed, paid, timestamp_ms FROM audit_verdicts
             ORDER BY timestamp_ms DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map(params![i64::try_from(limit).unwrap_or(i64::MAX)], |row| {
            Ok(VerdictLine {
                job: hex::encode(row.get::<_, Vec<u8>>(0)?),
                offender: hex::encode(row.get::<_, Vec<u8>>(1)?),
                beneficiary: hex::encode(row.get::<_, Vec<u8>>(2)?),
                slashed: from_sql(row.get(3)?),
                paid: from_sql(row.get(4)?),
                timestamp_ms: from_sql(row.get(5)?),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
