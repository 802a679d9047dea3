//! Reading a ledger back from its database into a [`LedgerState`].

use super::*;

pub(super) fn load(conn: &Connection) -> Result<LedgerState, StoreError> {
    let meta = |key: &str| -> Result<u64, StoreError> {
        let v: i64 =
            conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))?;
        Ok(from_sql(v))
    };
    let (minted, burned) = (meta("minted")?, meta("burned")?);

    let mut accounts = BTreeMap::new();
    let mut stmt = conn.prepare(
        "SELECT id, balance, stake, unlock_at_ms, next_nonce, unbonding, unbonding_until_ms
             FROM accounts",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            Account {
                balance: from_sql(r.get(1)?),
                stake: from_sql(r.get(2)?),
                unlock_at_ms: from_sql(r.get(3)?),
                next_nonce: from_sql(r.get(4)?),
                unbonding: from_sql(r.get(5)?),
                unbonding_until_ms: from_sql(r.get(6)?),
            },
        ))
    })?;
    for row in rows {
        let (id, account) = row?;
        accounts.insert(NodeId(blob32(id)?), account);
    }

    let triples = |sql: &str| -> Result<Vec<(NodeId, u64, Hash32)>, StoreError> {
        keyed_blobs(conn, sql)?
            .into_iter()
            .map(|(node, nonce, hash)| Ok((node, nonce, blob32(hash)?)))
            .collect()
    };
    let mut proofs = Vec::new();
    let mut stmt = conn.prepare("SELECT node, nonce, hash, round_key, reward, kind FROM proofs")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            from_sql(r.get(1)?),
            r.get::<_, Vec<u8>>(2)?,
            r.get::<_, Option<Vec<u8>>>(3)?,
            from_sql(r.get(4)?),
            r.get::<_, u8>(5)?,
        ))
    })?;
    for row in rows {
        let (node, nonce, hash, key, reward, kind) = row?;
        proofs.push(RestoredProof {
            node: NodeId(blob32(node)?),
            nonce,
            hash: blob32(hash)?,
            round_key: key.map(blob32).transpose()?,
            training: kind == ProofKind::Training as u8,
            reward,
        });
    }
    let mut equivocations = Vec::new();
    let mut stmt =
        conn.prepare("SELECT offender, nonce, round_key, evidence FROM equivocations")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            from_sql(r.get(1)?),
            r.get::<_, Option<Vec<u8>>>(2)?,
            r.get::<_, Vec<u8>>(3)?,
        ))
    })?;
    for row in rows {
        let (node, nonce, key, evidence) = row?;
        equivocations.push((
            NodeId(blob32(node)?),
            nonce,
            key.map(blob32).transpose()?,
            blob32(evidence)?,
        ));
    }
    let ops = triples("SELECT account, nonce, hash FROM ops")?;
    let slashes = triples("SELECT offender, nonce, evidence FROM slashes")?;
    let mut verdicts = Vec::new();
    let mut stmt = conn.prepare("SELECT job, evidence FROM audit_verdicts")?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    for row in rows {
        let (job, evidence) = row?;
        verdicts.push((blob32(job)?, blob32(evidence)?));
    }
    let mut audit_fees = Vec::new();
    let mut stmt = conn.prepare("SELECT key, claim FROM audit_fees")?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    for row in rows {
        let (key, claim) = row?;
        audit_fees.push((blob32(key)?, blob32(claim)?));
    }
    let rules = conn
        .query_row("SELECT rules FROM genesis", [], |r| r.get::<_, Vec<u8>>(0))
        .optional()?
        .map(|b| Rules::from_bytes(&b).ok_or_else(|| StoreError::Corrupt("genesis rules".into())))
        .transpose()?
        .unwrap_or_default();
    // Registrations are what the applied Register ops say; they are rebuilt from the ops'
    // signed bytes rather than stored twice.
    let mut registrations: BTreeMap<NodeId, BTreeSet<u16>> = BTreeMap::new();
    let mut claims: BTreeMap<NodeId, (u64, u64)> = BTreeMap::new();
    let mut announced: BTreeMap<NodeId, u64> = BTreeMap::new();
    // Keys as written, and (for ledgers written before keys were) those of the ops' signers.
    let mut keys = Vec::new();
    let mut stmt = conn.prepare("SELECT key FROM keys")?;
    for key in stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))? {
        let key = neuroshard_proof::PublicKey::from_bytes(&key?)
            .map_err(|e| StoreError::Corrupt(format!("stored key: {e}")))?;
        keys.push(key);
    }
    let mut stmt = conn.prepare("SELECT wire FROM ops")?;
    let wires = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
    for wire in wires {
        let verified = crate::inference::decode_op(&wire?)
            .map_err(|e| StoreError::Corrupt(format!("stored op: {e}")))?;
        keys.push(verified.signer());
        let op = *verified.op();
        match op.action {
            Action::Register { stage } => {
                registrations.entry(op.account).or_default().insert(stage);
            }
            // The latest announcement counts: rows come in no particular order.
            Action::Announce {
                memory_bytes,
                flops_per_s,
            } if announced.get(&op.account).is_none_or(|&n| n < op.nonce) => {
                announced.insert(op.account, op.nonce);
                claims.insert(op.account, (memory_bytes, flops_per_s));
            }
            _ => {}
        }
    }
    let (pot_members, settled) = super::pots::load_pots(conn)?;
    Ok(LedgerState::restore(Restored {
        pot_members,
        settled,
        rules,
        accounts,
        registrations,
        claims,
        proofs,
        ops,
        slashes,
        equivocations,
        verdicts,
        audit_fees,
        keys,
        minted,
        burned,
    }))
}

/// Rows of (node id, integer, blob) from `sql`.
pub(super) fn keyed_blobs(
    conn: &Connection,
    sql: &str,
) -> Result<Vec<(NodeId, u64, Vec<u8>)>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            from_sql(r.get(1)?),
            r.get::<_, Vec<u8>>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (node, n, blob) = row?;
        out.push((NodeId(blob32(node)?), n, blob));
    }
    Ok(out)
}
