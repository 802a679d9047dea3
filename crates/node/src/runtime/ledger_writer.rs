//! The ledger's SQLite writes on a thread of their own: the event loop hands each turn's
//! writes over and goes on, so an fsync never holds up gossip, the pipeline or serving.
//!
//! The in-memory ledger in the core is the truth the node acts on; the database is its
//! durable copy, written in the order the core decided. A crash loses at most the batches
//! still queued here, which anti-entropy fetches back from peers after the restart (every
//! proof and op a node accepted was also forwarded or served to others).

use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::thread::JoinHandle;

use crate::economy::{LedgerStore, LedgerWrite};
use crate::events::NodeEvent;

use super::{emit, now_ms};

/// Batches queued before the event loop waits for the disk: backpressure instead of memory
/// that grows while a slow disk falls behind.
const QUEUED_BATCHES: usize = 64;

/// One turn's writes, and where to say they are on disk (for writes a send must wait for).
type Batch = (Vec<LedgerWrite>, Option<SyncSender<()>>);

pub(super) struct LedgerWriter {
    tx: Option<SyncSender<Batch>>,
    thread: Option<JoinHandle<()>>,
    stage: usize,
}

impl LedgerWriter {
    pub fn spawn(store: LedgerStore, stage: usize) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel(QUEUED_BATCHES);
        let thread = std::thread::Builder::new()
            .name("ledger".into())
            .spawn(move || run(store, rx, stage))?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            stage,
        })
    }

    /// Queues one turn's writes (waits only while [`QUEUED_BATCHES`] are queued).
    pub fn write(&self, writes: Vec<LedgerWrite>) {
        self.send(writes, None);
    }

    /// Writes one turn's writes and waits until they are on disk: a consensus log entry must
    /// be durable before the message it records leaves, or a crash could let the restarted
    /// node sign a conflicting one.
    pub fn write_durably(&self, writes: Vec<LedgerWrite>) {
        let (ack, done) = sync_channel(1);
        if self.send(writes, Some(ack)) && done.recv().is_err() {
            warn(
                self.stage,
                "the ledger writer stopped before a log entry was stored".into(),
            );
        }
    }

    fn send(&self, writes: Vec<LedgerWrite>, ack: Option<SyncSender<()>>) -> bool {
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send((writes, ack)).is_ok());
        if !sent {
            warn(
                self.stage,
                "the ledger writer stopped: a write was not stored".into(),
            );
        }
        sent
    }

    /// Writes what is queued and stops the thread.
    pub fn finish(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            warn(self.stage, "the ledger writer panicked".into());
        }
    }
}

impl Drop for LedgerWriter {
    fn drop(&mut self) {
        self.finish();
    }
}

fn warn(stage: usize, message: String) {
    emit(&NodeEvent::Warning {
        stage: Some(stage),
        message,
        time_ms: now_ms(),
    });
}

/// Writes batches in order; what queued up while one was written goes in the next
/// transaction together (one fsync for up to [`QUEUED_BATCHES`] of them).
fn run(mut store: LedgerStore, rx: Receiver<Batch>, stage: usize) {
    while let Ok((mut writes, ack)) = rx.recv() {
        let mut acks: Vec<SyncSender<()>> = ack.into_iter().collect();
        for _ in 1..QUEUED_BATCHES {
            match rx.try_recv() {
                Ok((more, ack)) => {
                    writes.extend(more);
                    acks.extend(ack);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        match store.write_batch(&writes) {
            // Told only once stored: a failed write leaves the waiting sender unanswered
            // (its channel closes), which it reports.
            Ok(()) => {
                for a in acks {
                    let _ = a.send(());
                }
            }
            Err(e) => warn(stage, format!("ledger storage: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::economy::tests::{T, economy, genesis, prove, registered};
    use neuroshard_proof::fixtures::test_identity;

    /// What the event loop handed over is on disk once the writer finishes, in the order the
    /// core decided (a registration before the proof that needs it).
    #[test]
    fn handed_over_writes_are_on_disk_after_finish() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("ledger.db");
        let (mut a, mut b) = (economy(80), economy(81));
        registered(&mut [&mut a, &mut b]);
        prove(&mut a, &b, 1, T);
        let me = test_identity(80).node_id();
        let (store, _) = LedgerStore::open(&path, &me, &genesis())?;
        let mut writer = LedgerWriter::spawn(store, 0)?;
        // One turn's writes at a time, as the event loop hands them over.
        while let Some(w) = a.poll_write() {
            writer.write(vec![w]);
        }
        writer.finish();
        let (_, snapshot) = LedgerStore::open(&path, &me, &genesis())?;
        assert_eq!(snapshot.state.state_hash(), a.state_hash());
        assert_eq!(snapshot.state.proof_count(), 1);
        Ok(())
    }

    /// A consensus log entry written durably is in the database when the call returns, before
    /// the writer finishes: what the event loop relies on before it sends.
    #[test]
    fn a_durable_write_is_on_disk_when_it_returns() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("ledger.db");
        let me = test_identity(82).node_id();
        let (store, _) = LedgerStore::open(&path, &me, &genesis())?;
        let writer = LedgerWriter::spawn(store, 0)?;
        let entry = crate::economy::FinalityWrite::Wal {
            epoch: 3,
            entry: b"vote".to_vec(),
        };
        writer.write_durably(vec![LedgerWrite::finality(entry)]);
        let ledger = neuroshard_ledger::Ledger::open(&path)?;
        assert_eq!(ledger.finality_wal()?, vec![(3, b"vote".to_vec())]);
        drop(writer);
        Ok(())
    }
}
