//! The live ledger's open training rounds and settled rounds (`state/pots.rs`) in SQLite.

use neuroshard_proof::{LayerRange, Roles, WorkTally};
use rusqlite::Transaction;

use super::*;
use crate::state::Contribution;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS pot_members (
    layers_start INTEGER NOT NULL, layers_end INTEGER NOT NULL, round INTEGER NOT NULL,
    node BLOB NOT NULL, proof BLOB NOT NULL, roles INTEGER NOT NULL, nonce INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL, round_key BLOB NOT NULL UNIQUE, vouchers BLOB NOT NULL,
    work BLOB NOT NULL,
    PRIMARY KEY (layers_start, layers_end, round, node)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS settled_rounds (
    layers_start INTEGER NOT NULL, layers_end INTEGER NOT NULL, round INTEGER NOT NULL,
    PRIMARY KEY (layers_start, layers_end)) WITHOUT ROWID;
";

pub(super) fn write_contribution(
    tx: &Transaction<'_>,
    layers: LayerRange,
    round: u64,
    node: &NodeId,
    c: &Contribution,
) -> Result<usize, rusqlite::Error> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO pot_members (layers_start, layers_end, round, node, proof, roles,
         nonce, timestamp_ms, round_key, vouchers, work) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8,
         ?9, ?10, ?11)",
    )?
    .execute(params![
        layers.start,
        layers.end,
        to_sql(round),
        &node.0[..],
        &c.proof[..],
        c.roles.bits(),
        to_sql(c.nonce),
        to_sql(c.timestamp_ms),
        &crate::state::round_key_of(node, layers, round)[..],
        c.vouchers.iter().flat_map(|v| v.0).collect::<Vec<u8>>(),
        c.work
            .iter()
            .flat_map(|(id, tally)| id.0.into_iter().chain(tally.to_hash()))
            .collect::<Vec<u8>>(),
    ])
}

pub(super) fn write_settled(
    tx: &Transaction<'_>,
    layers: LayerRange,
    round: u64,
) -> Result<usize, rusqlite::Error> {
    tx.prepare_cached(
        "DELETE FROM pot_members WHERE layers_start = ?1 AND layers_end = ?2 AND round <= ?3",
    )?
    .execute(params![layers.start, layers.end, to_sql(round)])?;
    tx.prepare_cached(
        "INSERT OR REPLACE INTO settled_rounds (layers_start, layers_end, round)
         VALUES (?1, ?2, ?3)",
    )?
    .execute(params![layers.start, layers.end, to_sql(round)])
}

/// A void round's contributor leaves its pot.
pub(super) fn forget_contribution(
    tx: &Transaction<'_>,
    round_key: &Hash32,
) -> Result<usize, rusqlite::Error> {
    tx.prepare_cached("DELETE FROM pot_members WHERE round_key = ?1")?
        .execute(params![&round_key[..]])
}

pub(super) type Members = Vec<(LayerRange, u64, NodeId, Contribution)>;

pub(super) fn load_pots(
    conn: &Connection,
) -> Result<(Members, Vec<(LayerRange, u64)>), StoreError> {
    let mut members = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT layers_start, layers_end, round, node, proof, roles, nonce, timestamp_ms,
         vouchers, work FROM pot_members",
    )?;
    let rows = stmt.query_map([], |r| {
        let (layers, round) = stage_round(r)?;
        Ok((
            layers,
            round,
            r.get::<_, Vec<u8>>(3)?,
            r.get::<_, Vec<u8>>(4)?,
            r.get::<_, u8>(5)?,
            from_sql(r.get(6)?),
            from_sql(r.get(7)?),
            r.get::<_, Vec<u8>>(8)?,
            r.get::<_, Vec<u8>>(9)?,
        ))
    })?;
    for row in rows {
        let (layers, round, node, proof, roles, nonce, timestamp_ms, vouchers, work) = row?;
        if vouchers.len() % 32 != 0 {
            return Err(StoreError::Corrupt("pot vouchers".into()));
        }
        let vouchers = vouchers
            .chunks_exact(32)
            .map(|c| blob32(c.to_vec()).map(NodeId))
            .collect::<Result<Vec<_>, _>>()?;
        // Each tally: the signer's id, then the receipt hash that carries it.
        if work.len() % 64 != 0 {
            return Err(StoreError::Corrupt("pot work tallies".into()));
        }
        let work = work
            .chunks_exact(64)
            .map(|c| {
                let (id, tally) = c.split_at(32);
                let tally = WorkTally::from_hash(&blob32(tally.to_vec())?)
                    .ok_or_else(|| StoreError::Corrupt("pot work tally".into()))?;
                blob32(id.to_vec()).map(|id| (NodeId(id), tally))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let roles =
            Roles::from_bits(roles).map_err(|e| StoreError::Corrupt(format!("pot roles: {e}")))?;
        members.push((
            layers,
            round,
            NodeId(blob32(node)?),
            Contribution {
                proof: blob32(proof)?,
                roles,
                nonce,
                timestamp_ms,
                vouchers,
                work,
            },
        ));
    }
    let mut settled = Vec::new();
    let mut stmt = conn.prepare("SELECT layers_start, layers_end, round FROM settled_rounds")?;
    for row in stmt.query_map([], stage_round)? {
        settled.push(row?);
    }
    Ok((members, settled))
}

/// A row's first three columns: the stage's layers and a round.
fn stage_round(r: &rusqlite::Row<'_>) -> Result<(LayerRange, u64), rusqlite::Error> {
    Ok((
        LayerRange {
            start: r.get(0)?,
            end: r.get(1)?,
        },
        from_sql(r.get(2)?),
    ))
}
