//! What the soak reads from outside the nodes: a process's peak resident memory, the proof
//! hashes in a node's ledger database while it runs (read-only, beside its writer), and each
//! ledger once every node stopped.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::soak::{FinalLedger, ProofHash};

/// `VmHWM` (peak resident set, kB) of process `pid`, from /proc.
pub fn peak_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_hwm(&status)
}

pub(crate) fn parse_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn hashes_of(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<ProofHash>> {
    // The ledger's table of applied proofs (the query `Ledger::proof_hashes` runs).
    let mut stmt = conn.prepare("SELECT hash FROM proofs")?;
    let rows = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
    let mut out = Vec::new();
    for row in rows {
        if let Ok(h) = ProofHash::try_from(row?) {
            out.push(h);
        }
    }
    Ok(out)
}

/// The proof hashes a running node's ledger holds now. Read-only, with a short busy wait,
/// so the node's writes are never blocked for long.
pub fn ledger_hashes(dir: &Path) -> Result<Vec<ProofHash>, rusqlite::Error> {
    let path = dir.join(neuroshard_ledger::LEDGER_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = rusqlite::Connection::open_with_flags(&path, flags)?;
    conn.busy_timeout(Duration::from_millis(200))?;
    hashes_of(&conn)
}

/// A stopped node's ledger, opened as the node opens it (so its state hash is recomputed
/// from what is on disk, not taken from the node's word).
pub fn final_ledger(dir: &Path) -> FinalLedger {
    let path = dir.join(neuroshard_ledger::LEDGER_FILE);
    let ledger = match neuroshard_ledger::Ledger::open(&path) {
        Ok(l) => l,
        Err(e) => {
            return FinalLedger {
                error: Some(e.to_string()),
                ..FinalLedger::default()
            };
        }
    };
    match ledger.proof_hashes() {
        Ok(hashes) => FinalLedger {
            state_hash: hex::encode(ledger.state_hash()),
            proofs: hashes.into_iter().collect::<BTreeSet<_>>(),
            error: None,
        },
        Err(e) => FinalLedger {
            error: Some(e.to_string()),
            ..FinalLedger::default()
        },
    }
}
