//! SQLite adapter: persists what [`LedgerState`] decides, nothing more.
//!
//! WAL journal with `synchronous=FULL`, so a write is durable once its transaction commits;
//! callers acknowledge a message only after the apply call that carried it has returned.
//! [`Ledger::apply_batch`] commits many messages in one transaction (one fsync) — sound
//! because every message in the batch is acknowledged together, after that commit.
//! Integers are stored as SQLite INTEGER by reinterpreting the u64 bits as i64 (lossless).
//! Proofs applied with [`Ledger::apply_proof_wire`] also keep their signed wire bytes, in the
//! same transaction as their ledger changes, so the node can serve them to peers that missed
//! them (anti-entropy) and a proof is never counted without being servable.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use neuroshard_proof::{Hash32, NodeId, ProofKind, SignedProof, VerifiedProof};
use rusqlite::{Connection, OptionalExtension, params};

use crate::ops::{Action, VerifiedOp, VerifiedSlash};
use crate::rules::{LedgerGenesis, Rules};
use crate::state::{
    Account, Changes, EntryKind, LedgerError, LedgerState, Outcome, Record, Restored, RestoredProof,
};
use crate::verdict::VerifiedVerdict;

mod finality;
mod load;
mod pots;
mod verdicts;
use load::{keyed_blobs, load};
pub use verdicts::{AuditSummary, FeeLine, VerdictLine};

/// File name of the ledger database inside a node's data directory.
pub const LEDGER_FILE: &str = "ledger.db";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
    id BLOB PRIMARY KEY, balance INTEGER NOT NULL, stake INTEGER NOT NULL,
    unlock_at_ms INTEGER NOT NULL, next_nonce INTEGER NOT NULL, unbonding INTEGER NOT NULL,
    unbonding_until_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS proofs (
    hash BLOB PRIMARY KEY, node BLOB NOT NULL, nonce INTEGER NOT NULL, kind INTEGER NOT NULL,
    reward INTEGER NOT NULL, timestamp_ms INTEGER NOT NULL, round_key BLOB UNIQUE) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS proofs_by_node ON proofs (node, nonce);
CREATE TABLE IF NOT EXISTS genesis (hash BLOB NOT NULL, rules BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS ops (
    account BLOB NOT NULL, nonce INTEGER NOT NULL, hash BLOB NOT NULL, wire BLOB NOT NULL,
    PRIMARY KEY (account, nonce)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS slashes (
    offender BLOB NOT NULL, nonce INTEGER NOT NULL, reporter BLOB NOT NULL,
    evidence BLOB NOT NULL, slashed INTEGER NOT NULL, to_reporter INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL, PRIMARY KEY (offender, nonce)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS audit_verdicts (
    job BLOB PRIMARY KEY, offender BLOB NOT NULL, beneficiary BLOB NOT NULL,
    evidence BLOB NOT NULL, slashed INTEGER NOT NULL, paid INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS audit_fees (
    key BLOB PRIMARY KEY, auditor BLOB NOT NULL, worker BLOB NOT NULL, stage INTEGER NOT NULL,
    round INTEGER NOT NULL, job BLOB NOT NULL, claim BLOB NOT NULL, paid INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS equivocations (
    evidence BLOB PRIMARY KEY, offender BLOB NOT NULL, nonce INTEGER NOT NULL, round_key BLOB,
    clawed INTEGER NOT NULL, slashed INTEGER NOT NULL, timestamp_ms INTEGER NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY, account BLOB NOT NULL, kind TEXT NOT NULL, amount INTEGER NOT NULL,
    counterparty BLOB, reference BLOB NOT NULL, timestamp_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS entries_by_account ON entries (account, seq);
CREATE TABLE IF NOT EXISTS proof_wire (hash BLOB PRIMARY KEY, wire BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS keys (id BLOB PRIMARY KEY, key BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS verdict_weights (
    seq INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE, wire BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS fraud_reports (
    seq INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE, wire BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS finality_chain (epoch INTEGER PRIMARY KEY, link BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS finality_wal (
    seq INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, entry BLOB NOT NULL);
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', 6), ('minted', 0), ('burned', 0);
";

/// The database layout this build reads and writes.
const SCHEMA_VERSION: u64 = 6;

/// Storage failures (the ledger rules' refusals are [`LedgerError`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("ledger database is inconsistent: {0}")]
    Corrupt(String),
    #[error("ledger database has layout {got}, this build reads {SCHEMA_VERSION}: move it away")]
    Schema { got: u64 },
    #[error("ledger belongs to another network (genesis {got}, expected {expected})")]
    OtherGenesis { got: String, expected: String },
    #[error("genesis: {0}")]
    Genesis(#[from] LedgerError),
    #[error("an earlier ledger write failed ({0}); nothing more is written until restart")]
    Stopped(String),
}

/// The durable half of a ledger whose rules run elsewhere: it writes the [`Changes`] the
/// caller's [`LedgerState`] produced, without applying anything again (no second copy of the
/// state in memory, no second run of the rules per proof). After a failed commit it refuses
/// every later one, so the database stays a consistent prefix of what the caller applied
/// (later account values without the records behind them would pay twice once anti-entropy
/// brought those records back); the next start resumes from that prefix.
#[derive(Debug)]
pub struct ChangeLog {
    conn: Connection,
    failed: Option<String>,
}

impl ChangeLog {
    /// Writes `changes` and the signed bytes of the proofs they applied in one transaction.
    pub fn commit(
        &mut self,
        changes: &Changes,
        proof_wires: &[(Hash32, &[u8])],
    ) -> Result<(), StoreError> {
        if let Some(why) = &self.failed {
            return Err(StoreError::Stopped(why.clone()));
        }
        let nothing = changes.records.is_empty()
            && changes.accounts.is_empty()
            && changes.entries.is_empty()
            && proof_wires.is_empty();
        if nothing {
            return Ok(());
        }
        let wires: Vec<_> = proof_wires.iter().map(|(h, w)| (*h, *w, true)).collect();
        write(&mut self.conn, changes, &wires).inspect_err(|e| self.failed = Some(e.to_string()))
    }

    /// Makes every later write fail, as a full disk would (tests of what follows a failure).
    #[cfg(test)]
    pub(crate) fn refuse_writes(&mut self) -> Result<(), StoreError> {
        self.conn.pragma_update(None, "query_only", "ON")?;
        Ok(())
    }
}

/// Either the rules refused the message or storing it failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("rejected: {0}")]
    Rejected(#[from] LedgerError),
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    #[error("wire bytes are not the signed form of this proof")]
    WireMismatch,
}

/// One message for [`Ledger::apply_batch`].
#[derive(Debug, Clone)]
pub enum Message {
    Proof(Box<VerifiedProof>),
    Op(VerifiedOp),
    Slash(VerifiedSlash),
}

/// Whether `wire` is `proof`'s signed form: it is served to peers as this proof.
fn wire_matches(proof: &VerifiedProof, wire: &[u8]) -> bool {
    SignedProof::from_bytes(wire).is_ok_and(|s| s.payload_hash() == proof.hash())
}

/// What [`Ledger::apply_wired_batch`] applies: a proof with its signed wire bytes, or an op.
#[derive(Debug, Clone)]
pub enum WiredMessage<'a> {
    Proof(&'a VerifiedProof, &'a [u8]),
    Op(&'a VerifiedOp),
}

/// One history line as read back from the database.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HistoryLine {
    pub seq: i64,
    pub kind: String,
    pub amount: u64,
    pub counterparty: Option<String>,
    pub reference: String,
    pub timestamp_ms: u64,
}

fn to_sql(v: u64) -> i64 {
    i64::from_ne_bytes(v.to_ne_bytes())
}

fn from_sql(v: i64) -> u64 {
    u64::from_ne_bytes(v.to_ne_bytes())
}

fn blob32(v: Vec<u8>) -> Result<[u8; 32], StoreError> {
    v.try_into()
        .map_err(|v: Vec<u8>| StoreError::Corrupt(format!("expected 32-byte key, got {}", v.len())))
}

/// The ledger: in-memory rules plus their SQLite persistence.
#[derive(Debug)]
pub struct Ledger {
    conn: Connection,
    state: LedgerState,
}

impl Ledger {
    /// Opens (creating if needed) the ledger database at `path` and loads the state.
    pub fn open(path: &Path) -> Result<Ledger, StoreError> {
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    /// A private in-memory ledger (tests, dry runs).
    pub fn open_in_memory() -> Result<Ledger, StoreError> {
        Self::init(Connection::open_in_memory()?)
    }

    /// Opens the ledger of the network that `genesis` starts: a new database starts from its
    /// stakes and rules; one that holds another network's ledger is refused.
    pub fn open_genesis(path: &Path, genesis: &LedgerGenesis) -> Result<Ledger, StoreError> {
        let mut ledger = Self::open(path)?;
        ledger.start_from(genesis)?;
        Ok(ledger)
    }

    /// [`Self::open_genesis`] in memory.
    pub fn in_memory_genesis(genesis: &LedgerGenesis) -> Result<Ledger, StoreError> {
        let mut ledger = Self::open_in_memory()?;
        ledger.start_from(genesis)?;
        Ok(ledger)
    }

    fn start_from(&mut self, genesis: &LedgerGenesis) -> Result<(), StoreError> {
        let expected = genesis.hash();
        let stored: Option<Vec<u8>> = self
            .conn
            .query_row("SELECT hash FROM genesis", [], |r| r.get(0))
            .optional()?;
        match stored {
            Some(got) if got == expected => Ok(()),
            Some(got) => Err(StoreError::OtherGenesis {
                got: hex::encode(got),
                expected: hex::encode(expected),
            }),
            None if self.state.minted() > 0 || self.state.accounts().next().is_some() => {
                Err(StoreError::OtherGenesis {
                    got: "none (a ledger started without a genesis)".into(),
                    expected: hex::encode(expected),
                })
            }
            None => {
                let (state, changes) = LedgerState::from_genesis(genesis)?;
                write(&mut self.conn, &changes, &[])?;
                self.state = state;
                Ok(())
            }
        }
    }

    fn init(conn: Connection) -> Result<Ledger, StoreError> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch(pots::SCHEMA)?;
        let schema: i64 =
            conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })?;
        if from_sql(schema) != SCHEMA_VERSION {
            return Err(StoreError::Schema {
                got: from_sql(schema),
            });
        }
        let state = load(&conn)?;
        state
            .check_invariants()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(Ledger { conn, state })
    }

    pub fn state(&self) -> &LedgerState {
        &self.state
    }

    /// Hands the database over to a caller whose own [`LedgerState`] (loaded from
    /// [`Self::state`]) runs the rules: see [`ChangeLog`]. The copy of the state here is
    /// dropped.
    pub fn into_change_log(self) -> ChangeLog {
        ChangeLog {
            conn: self.conn,
            failed: None,
        }
    }

    pub fn state_hash(&self) -> Hash32 {
        self.state.state_hash()
    }

    pub fn apply_proof(&mut self, proof: &VerifiedProof) -> Result<Outcome, ApplyError> {
        let outcome = self.state.apply_proof(proof)?;
        self.persist(&outcome, None)?;
        Ok(outcome)
    }

    /// [`Self::apply_proof`] that also stores `wire` (the [`SignedProof`] bytes the proof was
    /// verified from) in the same transaction. A duplicate whose wire was never stored (applied
    /// by [`Self::apply_proof`] or before this table existed) gets it now.
    pub fn apply_proof_wire(
        &mut self,
        proof: &VerifiedProof,
        wire: &[u8],
    ) -> Result<Outcome, ApplyError> {
        if !wire_matches(proof, wire) {
            return Err(ApplyError::WireMismatch);
        }
        let hash = proof.hash();
        let outcome = self.state.apply_proof(proof)?;
        match &outcome {
            Outcome::Duplicate if self.proof_wire(&hash)?.is_none() => {
                self.conn
                    .execute(
                        "INSERT OR IGNORE INTO proof_wire (hash, wire) VALUES (?1, ?2)",
                        params![&hash[..], wire],
                    )
                    .map_err(StoreError::from)?;
            }
            _ => self.persist(&outcome, Some((&hash, wire)))?,
        }
        Ok(outcome)
    }

    pub fn apply_op(&mut self, op: VerifiedOp) -> Result<Outcome, ApplyError> {
        let outcome = self.state.apply_op(op)?;
        self.persist(&outcome, None)?;
        Ok(outcome)
    }

    pub fn apply_slash(&mut self, slash: &VerifiedSlash) -> Result<Outcome, ApplyError> {
        let outcome = self.state.apply_slash(slash)?;
        self.persist(&outcome, None)?;
        Ok(outcome)
    }

    /// Applies an audit verdict this node reached by checking the fraud proof itself.
    pub fn apply_verdict(&mut self, verdict: &VerifiedVerdict) -> Result<Outcome, ApplyError> {
        let outcome = self.state.apply_verdict(verdict)?;
        self.persist(&outcome, None)?;
        Ok(outcome)
    }

    /// Applies many messages and commits them in one transaction. Each message gets its own
    /// verdict; refused ones change nothing. The outer error means nothing was stored.
    pub fn apply_batch(
        &mut self,
        messages: impl IntoIterator<Item = Message>,
    ) -> Result<Vec<Result<Outcome, LedgerError>>, StoreError> {
        let mut all = Changes::default();
        let mut verdicts = Vec::new();
        for message in messages {
            let verdict = match message {
                Message::Proof(p) => self.state.apply_proof(&p),
                Message::Op(o) => self.state.apply_op(o),
                Message::Slash(s) => self.state.apply_slash(&s),
            };
            if let Ok(Outcome::Applied(changes)) = &verdict {
                all.merge(changes.clone());
            }
            verdicts.push(verdict);
        }
        self.persist(&Outcome::Applied(all), None)?;
        Ok(verdicts)
    }

    /// Applies proofs (each with the signed bytes it was verified from, stored with it as
    /// [`Self::apply_proof_wire`] does) and ops in order, and commits everything in one
    /// transaction: one fsync for a batch instead of one per message. Each message gets its
    /// own verdict; refused ones change nothing. The outer error means nothing was stored.
    pub fn apply_wired_batch<'a>(
        &mut self,
        messages: impl IntoIterator<Item = WiredMessage<'a>>,
    ) -> Result<Vec<Result<Outcome, ApplyError>>, StoreError> {
        let mut all = Changes::default();
        let mut wires: Vec<(Hash32, &'a [u8], bool)> = Vec::new();
        let mut verdicts = Vec::new();
        for message in messages {
            let verdict = match message {
                WiredMessage::Proof(proof, wire) if wire_matches(proof, wire) => {
                    let outcome = self.state.apply_proof(proof).map_err(ApplyError::from);
                    match &outcome {
                        Ok(Outcome::Applied(_)) => wires.push((proof.hash(), wire, true)),
                        // A duplicate whose wire was never stored gets it now.
                        Ok(Outcome::Duplicate) => wires.push((proof.hash(), wire, false)),
                        _ => {}
                    }
                    outcome
                }
                WiredMessage::Proof(..) => Err(ApplyError::WireMismatch),
                WiredMessage::Op(op) => self.state.apply_op(op.clone()).map_err(ApplyError::from),
            };
            if let Ok(Outcome::Applied(changes)) = &verdict {
                all.merge(changes.clone());
            }
            verdicts.push(verdict);
        }
        self.commit(&all, &wires)?;
        Ok(verdicts)
    }

    fn persist(
        &mut self,
        outcome: &Outcome,
        wire: Option<(&Hash32, &[u8])>,
    ) -> Result<(), StoreError> {
        let Outcome::Applied(changes) = outcome else {
            return Ok(());
        };
        let wires: Vec<_> = wire.map(|(h, b)| (*h, b, true)).into_iter().collect();
        self.commit(changes, &wires)
    }

    /// Writes what memory already applied in one transaction; if that fails, memory falls
    /// back to what the disk holds.
    fn commit(
        &mut self,
        changes: &Changes,
        wires: &[(Hash32, &[u8], bool)],
    ) -> Result<(), StoreError> {
        if changes.is_empty() && wires.is_empty() {
            return Ok(());
        }
        if let Err(e) = write(&mut self.conn, changes, wires) {
            self.state = load(&self.conn)?;
            return Err(e);
        }
        Ok(())
    }

    /// Newest-first history of one account.
    pub fn history(&self, account: &NodeId, limit: usize) -> Result<Vec<HistoryLine>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, kind, amount, counterparty, reference, timestamp_ms FROM entries
             WHERE account = ?1 ORDER BY seq DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(
            params![&account.0[..], i64::try_from(limit).unwrap_or(i64::MAX)],
            |row| {
                Ok(HistoryLine {
                    seq: row.get(0)?,
                    kind: row.get(1)?,
                    amount: from_sql(row.get(2)?),
                    counterparty: row.get::<_, Option<Vec<u8>>>(3)?.map(hex::encode),
                    reference: hex::encode(row.get::<_, Vec<u8>>(4)?),
                    timestamp_ms: from_sql(row.get(5)?),
                })
            },
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// True if the database holds the proof with this hash.
    pub fn stored_proof(&self, hash: &Hash32) -> Result<bool, StoreError> {
        let found: Option<i64> = self
            .conn
            .query_row(
                "SELECT 1 FROM proofs WHERE hash = ?1",
                params![&hash[..]],
                |r| r.get(0),
            )
            .optional()?;
        Ok(found.is_some())
    }

    /// Hashes of every applied proof, sorted (what this node tells peers it holds).
    pub fn proof_hashes(&self) -> Result<Vec<Hash32>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT hash FROM proofs ORDER BY hash")?;
        let rows = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
        rows.map(|row| blob32(row?)).collect()
    }

    /// The stored signed wire bytes of an applied proof, if it was applied with its wire.
    pub fn proof_wire(&self, hash: &Hash32) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .conn
            .query_row(
                "SELECT wire FROM proof_wire WHERE hash = ?1",
                params![&hash[..]],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Highest proof nonce applied for `node` (lets a restarted node keep its nonces rising).
    pub fn last_proof_nonce(&self, node: &NodeId) -> Result<Option<u64>, StoreError> {
        // Nonces are stored as the i64 with the same bits: values >= 2^63 are negative there
        // and rank above every non-negative one, so look at the negatives first.
        let max = |sql: &str| -> Result<Option<i64>, StoreError> {
            Ok(self
                .conn
                .query_row(sql, params![&node.0[..]], |r| r.get(0))?)
        };
        let high = max("SELECT MAX(nonce) FROM proofs WHERE node = ?1 AND nonce < 0")?;
        let top = match high {
            Some(v) => Some(v),
            None => max("SELECT MAX(nonce) FROM proofs WHERE node = ?1")?,
        };
        Ok(top.map(from_sql))
    }

    /// Every stored op envelope by (account, nonce).
    pub fn all_ops(&self) -> Result<BTreeMap<(NodeId, u64), Vec<u8>>, StoreError> {
        Ok(
            keyed_blobs(&self.conn, "SELECT account, nonce, wire FROM ops")?
                .into_iter()
                .map(|(account, nonce, wire)| ((account, nonce), wire))
                .collect(),
        )
    }

    /// Signed op envelopes stored for an account, in nonce order (for audit and re-gossip).
    pub fn stored_ops(&self, account: &NodeId) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT wire FROM ops WHERE account = ?1 ORDER BY nonce")?;
        let rows = stmt.query_map(params![&account.0[..]], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// Writes `changes` and the proofs' wire bytes (replacing a stored one when the flag is set,
/// else only filling a gap) in one transaction.
fn write(
    conn: &mut Connection,
    changes: &Changes,
    wires: &[(Hash32, &[u8], bool)],
) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    {
        for (hash, bytes, replace) in wires {
            let sql = if *replace {
                "INSERT OR REPLACE INTO proof_wire (hash, wire) VALUES (?1, ?2)"
            } else {
                "INSERT OR IGNORE INTO proof_wire (hash, wire) VALUES (?1, ?2)"
            };
            tx.prepare_cached(sql)?.execute(params![&hash[..], bytes])?;
        }
        let mut upsert = tx.prepare_cached(
            "INSERT INTO accounts (id, balance, stake, unlock_at_ms, next_nonce, unbonding,
             unbonding_until_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, stake = excluded.stake,
             unlock_at_ms = excluded.unlock_at_ms, next_nonce = excluded.next_nonce,
             unbonding = excluded.unbonding, unbonding_until_ms = excluded.unbonding_until_ms",
        )?;
        for (id, a) in &changes.accounts {
            upsert.execute(params![
                &id.0[..],
                to_sql(a.balance),
                to_sql(a.stake),
                to_sql(a.unlock_at_ms),
                to_sql(a.next_nonce),
                to_sql(a.unbonding),
                to_sql(a.unbonding_until_ms)
            ])?;
        }
        let mut key = tx.prepare_cached("INSERT OR IGNORE INTO keys (id, key) VALUES (?1, ?2)")?;
        for (id, k) in &changes.keys {
            key.execute(params![&id.0[..], &k.as_bytes()[..]])?;
        }
        let mut proof = tx.prepare_cached(
            "INSERT INTO proofs (hash, node, nonce, kind, reward, timestamp_ms, round_key)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (hash) DO UPDATE SET reward = excluded.reward",
        )?;
        let mut op = tx.prepare_cached(
            "INSERT INTO ops (account, nonce, hash, wire) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut slash = tx.prepare_cached(
            "INSERT INTO slashes (offender, nonce, reporter, evidence, slashed, to_reporter,
             timestamp_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        let mut verdict = tx.prepare_cached(
            "INSERT INTO audit_verdicts (job, offender, beneficiary, evidence, slashed, paid,
             timestamp_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        for record in &changes.records {
            match record {
                Record::Proof {
                    hash,
                    node,
                    nonce,
                    kind,
                    reward,
                    timestamp_ms,
                    round_key,
                } => proof.execute(params![
                    &hash[..],
                    &node.0[..],
                    to_sql(*nonce),
                    *kind as u8,
                    to_sql(*reward),
                    to_sql(*timestamp_ms),
                    round_key.map(|k| k.to_vec())
                ])?,
                Record::Contribution {
                    layers,
                    round,
                    node,
                    contribution,
                } => pots::write_contribution(&tx, *layers, *round, node, contribution)?,
                Record::Settled { layers, round } => pots::write_settled(&tx, *layers, *round)?,
                Record::Genesis { hash, rules } => tx.execute(
                    "INSERT INTO genesis (hash, rules) VALUES (?1, ?2)",
                    params![&hash[..], rules.to_bytes()],
                )?,
                Record::Op {
                    account,
                    nonce,
                    hash,
                    wire,
                } => op.execute(params![&account.0[..], to_sql(*nonce), &hash[..], wire])?,
                Record::Slash {
                    slash: s,
                    slashed,
                    to_reporter,
                } => slash.execute(params![
                    &s.offender.0[..],
                    to_sql(s.nonce),
                    &s.reporter.0[..],
                    &s.evidence_hash[..],
                    to_sql(*slashed),
                    to_sql(*to_reporter),
                    to_sql(s.timestamp_ms)
                ])?,
                Record::Verdict {
                    verdict: v,
                    slashed,
                    paid,
                } => verdict.execute(params![
                    &v.job[..],
                    &v.offender.0[..],
                    &v.beneficiary.0[..],
                    &v.evidence_hash[..],
                    to_sql(*slashed),
                    to_sql(*paid),
                    to_sql(v.timestamp_ms)
                ])?,
                Record::AuditFee { fee, paid } => tx
                    .prepare_cached(
                        "INSERT INTO audit_fees (key, auditor, worker, stage, round, job, claim,
                         paid, timestamp_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    )?
                    .execute(params![
                        &fee.key()[..],
                        &fee.auditor.0[..],
                        &fee.worker.0[..],
                        fee.stage,
                        to_sql(fee.round),
                        &fee.job[..],
                        &fee.claim_hash[..],
                        to_sql(*paid),
                        to_sql(fee.timestamp_ms)
                    ])?,
                Record::Equivocation {
                    offender,
                    nonce,
                    round_key,
                    evidence,
                    clawed,
                    slashed,
                    timestamp_ms,
                } => {
                    if let Some(key) = round_key {
                        pots::forget_contribution(&tx, key)?;
                    }
                    tx.prepare_cached(
                        "INSERT INTO equivocations (offender, nonce, round_key, evidence, clawed,
                         slashed, timestamp_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )?
                    .execute(params![
                        &offender.0[..],
                        to_sql(*nonce),
                        round_key.map(|k| k.to_vec()),
                        &evidence[..],
                        to_sql(*clawed),
                        to_sql(*slashed),
                        to_sql(*timestamp_ms)
                    ])?
                }
            };
        }
        let mut entry = tx.prepare_cached(
            "INSERT INTO entries (account, kind, amount, counterparty, reference, timestamp_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for e in &changes.entries {
            entry.execute(params![
                &e.account.0[..],
                e.kind.as_str(),
                to_sql(e.amount),
                e.counterparty.map(|c| c.0.to_vec()),
                &e.reference[..],
                to_sql(e.timestamp_ms)
            ])?;
        }
        let mut meta = tx.prepare_cached("UPDATE meta SET value = ?2 WHERE key = ?1")?;
        meta.execute(params!["minted", to_sql(changes.minted)])?;
        meta.execute(params!["burned", to_sql(changes.burned)])?;
    }
    tx.commit()?;
    Ok(())
}

/// History kinds as stored, for callers that want to filter.
pub fn entry_kind_names() -> [&'static str; 12] {
    [
        EntryKind::Reward,
        EntryKind::TransferOut,
        EntryKind::TransferIn,
        EntryKind::Burn,
        EntryKind::Stake,
        EntryKind::Unstake,
        EntryKind::Slashed,
        EntryKind::SlashReward,
        EntryKind::InferenceFee,
        EntryKind::InferenceIncome,
        EntryKind::Clawback,
        EntryKind::AuditFee,
    ]
    .map(EntryKind::as_str)
}

#[cfg(test)]
mod tests;
