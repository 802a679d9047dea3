//! Ledger finality as the database keeps it: each finalized epoch (its certificate and body,
//! as the node encoded them), replayed and checked again at start, and the consensus
//! write-ahead log of the epoch in progress. Neither is ledger state: the finalized state is
//! rebuilt from the epochs, and a lost write only means the node fetches the epoch again.

use rusqlite::params;

use super::{ChangeLog, Ledger, StoreError, from_sql, to_sql};

impl Ledger {
    /// The finalized epochs kept, in order, as `(epoch, bytes)`.
    pub fn finalized_epochs(&self) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        self.epoch_blobs("SELECT epoch, link FROM finality_chain ORDER BY epoch")
    }

    /// The write-ahead log, in the order it was written, as `(epoch, entry)`.
    pub fn finality_wal(&self) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        self.epoch_blobs("SELECT epoch, entry FROM finality_wal ORDER BY seq")
    }

    fn epoch_blobs(&self, sql: &str) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows = stmt.query_map([], |row| {
            Ok((from_sql(row.get(0)?), row.get::<_, Vec<u8>>(1)?))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

impl ChangeLog {
    /// Keeps a finalized epoch, and drops the log entries of it and those before.
    pub fn keep_finalized(&mut self, epoch: u64, link: &[u8]) -> Result<(), StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Stopped(why.clone()));
        }
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT OR REPLACE INTO finality_chain (epoch, link) VALUES (?1, ?2)",
            params![to_sql(epoch), link],
        )?;
        tx.execute(
            "DELETE FROM finality_wal WHERE epoch <= ?1",
            params![to_sql(epoch)],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Appends one write-ahead log entry of `epoch`.
    pub fn keep_wal(&mut self, epoch: u64, entry: &[u8]) -> Result<(), StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Stopped(why.clone()));
        }
        self.conn.execute(
            "INSERT INTO finality_wal (epoch, entry) VALUES (?1, ?2)",
            params![to_sql(epoch), entry],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::rules::{LedgerGenesis, Rules};
    use crate::store::Ledger;

    #[test]
    fn finalized_epochs_and_the_log_survive_a_restart_and_an_epoch_drops_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let genesis = LedgerGenesis::new(Rules::default(), Vec::new()).unwrap();
        let mut log = Ledger::open_genesis(&path, &genesis)
            .unwrap()
            .into_change_log();
        log.keep_wal(1, b"a").unwrap();
        log.keep_wal(2, b"b").unwrap();
        log.keep_finalized(1, b"one").unwrap();
        drop(log);
        let ledger = Ledger::open_genesis(&path, &genesis).unwrap();
        assert_eq!(
            ledger.finalized_epochs().unwrap(),
            vec![(1, b"one".to_vec())]
        );
        assert_eq!(ledger.finality_wal().unwrap(), vec![(2, b"b".to_vec())]);
    }
}
