//! Audit verdicts and validator fees as the database holds them (`neuroshard ledger
//! verdicts`, `neuroshard ledger fees`), and the fraud reports behind the verdicts, which the
//! node relays to ledgers that missed them.

use rusqlite::params;

use super::{ChangeLog, Ledger, StoreError, from_sql};
use neuroshard_proof::Hash32;

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

/// One paid validator fee: which auditor audited whose round.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FeeLine {
    /// The auditor paid (hex node id).
    pub auditor: String,
    /// The worker whose round it audited.
    pub worker: String,
    pub stage: u16,
    pub round: u64,
    /// The audited job's key (hex).
    pub job: String,
    pub paid: u64,
    pub timestamp_ms: u64,
}

/// What a ledger holds about audits, network-wide and for one account.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditSummary {
    /// Validator fees paid, and their total.
    pub fees: u64,
    pub fees_paid: u64,
    /// Audit verdicts applied, and the stake they took.
    pub verdicts: u64,
    pub slashed: u64,
    /// The account's fees (count, total), what verdicts took from its stake and paid it.
    pub account_fees: u64,
    pub account_fees_paid: u64,
    pub account_slashed: u64,
    pub account_slash_rewards: u64,
}

impl Ledger {
    /// Audits as this ledger holds them: all fees and verdicts, and `account`'s share.
    pub fn audit_summary(
        &self,
        account: &neuroshard_proof::NodeId,
    ) -> Result<AuditSummary, StoreError> {
        let pair = |sql: &str| -> Result<(u64, u64), StoreError> {
            Ok(self
                .conn
                .query_row(sql, [], |r| Ok((from_sql(r.get(0)?), from_sql(r.get(1)?))))?)
        };
        let (fees, fees_paid) = pair("SELECT COUNT(*), COALESCE(SUM(paid), 0) FROM audit_fees")?;
        let (verdicts, slashed) =
            pair("SELECT COUNT(*), COALESCE(SUM(slashed), 0) FROM audit_verdicts")?;
        let of = |kind: &str| -> Result<(u64, u64), StoreError> {
            Ok(self.conn.query_row(
                "SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM entries
                 WHERE account = ?1 AND kind = ?2",
                params![&account.0[..], kind],
                |r| Ok((from_sql(r.get(0)?), from_sql(r.get(1)?))),
            )?)
        };
        let (account_fees, account_fees_paid) = of(crate::EntryKind::AuditFee.as_str())?;
        let (_, account_slashed) = of(crate::EntryKind::Slashed.as_str())?;
        let (_, account_slash_rewards) = of(crate::EntryKind::SlashReward.as_str())?;
        Ok(AuditSummary {
            fees,
            fees_paid,
            verdicts,
            slashed,
            account_fees,
            account_fees_paid,
            account_slashed,
            account_slash_rewards,
        })
    }

    /// The newest `limit` validator fees this ledger paid.
    pub fn audit_fees(&self, limit: usize) -> Result<Vec<FeeLine>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT auditor, worker, stage, round, job, paid, timestamp_ms FROM audit_fees
             ORDER BY timestamp_ms DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map(params![i64::try_from(limit).unwrap_or(i64::MAX)], |row| {
            Ok(FeeLine {
                auditor: hex::encode(row.get::<_, Vec<u8>>(0)?),
                worker: hex::encode(row.get::<_, Vec<u8>>(1)?),
                stage: row.get(2)?,
                round: from_sql(row.get(3)?),
                job: hex::encode(row.get::<_, Vec<u8>>(4)?),
                paid: from_sql(row.get(5)?),
                timestamp_ms: from_sql(row.get(6)?),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

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

impl Ledger {
    /// The stage weights kept for the replay verdicts applied last, by BLAKE3 hash, oldest
    /// first.
    pub fn verdict_weights(&self) -> Result<Vec<(Hash32, Vec<u8>)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, wire FROM verdict_weights ORDER BY seq")?;
        let rows = stmt.query_map([], |row| {
            Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (hash, wire) = row?;
            let hash: Hash32 = hash
                .try_into()
                .map_err(|_| StoreError::Corrupt("a verdict weights hash".into()))?;
            out.push((hash, wire));
        }
        Ok(out)
    }

    /// The fraud reports kept (their canonical bytes), oldest first.
    pub fn fraud_reports(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT wire FROM fraud_reports ORDER BY seq")?;
        let rows = stmt.query_map([], |row| row.get::<_, Vec<u8>>(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

impl ChangeLog {
    /// Keeps a fraud report whose verdict the ledger applied, by its id (once), and drops the
    /// oldest beyond `max_bytes` in all. Not part of the ledger's state: a lost write only
    /// means the node takes the report back from a peer.
    pub fn keep_report(
        &mut self,
        id: &Hash32,
        wire: &[u8],
        max_bytes: u64,
    ) -> Result<(), StoreError> {
        self.keep_bounded("fraud_reports", id, wire, max_bytes)
    }

    /// Keeps the stage weights a replay verdict's settlement needs (`hash` is their BLAKE3),
    /// so that a restarted node serves them again to ledgers that settle the verdict late;
    /// the oldest go beyond `max_bytes` in all. Not ledger state, like the reports.
    pub fn keep_verdict_weights(
        &mut self,
        hash: &Hash32,
        wire: &[u8],
        max_bytes: u64,
    ) -> Result<(), StoreError> {
        self.keep_bounded("verdict_weights", hash, wire, max_bytes)
    }

    /// Inserts `(id, wire)` into `table` once, then drops its oldest rows beyond `max_bytes`.
    fn keep_bounded(
        &mut self,
        table: &'static str,
        id: &Hash32,
        wire: &[u8],
        max_bytes: u64,
    ) -> Result<(), StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Stopped(why.clone()));
        }
        let tx = self.conn.transaction()?;
        tx.execute(
            &format!("INSERT OR IGNORE INTO {table} (id, wire) VALUES (?1, ?2)"),
            params![&id[..], wire],
        )?;
        tx.execute(
            &format!(
                "DELETE FROM {table} WHERE seq IN (
                    SELECT seq FROM (SELECT seq, SUM(LENGTH(wire)) OVER (ORDER BY seq DESC)
                                     AS kept FROM {table}) WHERE kept > ?1)"
            ),
            params![i64::try_from(max_bytes).unwrap_or(i64::MAX)],
        )?;
        tx.commit()?;
        Ok(())
    }
}
