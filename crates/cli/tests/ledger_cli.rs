//! `neuroshard wallet` and `neuroshard ledger` end to end: key file, a verified proof credited,
//! a transfer with its burn, stake lock, history, state hash, and refusals.

use std::path::Path;
use std::process::{Command, Output};

use neuroshard_proof::fixtures::{test_identity, training_proof, uptime_proof};
use serde_json::Value;

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn neuroshard(data: &Path, args: &[&str]) -> Res<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_neuroshard"))
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .output()?)
}

fn ok_json(data: &Path, args: &[&str]) -> Res<Value> {
    let out = neuroshard(data, args)?;
    if !out.status.success() {
        return Err(format!(
            "neuroshard {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn fails(data: &Path, args: &[&str]) -> Res<String> {
    let out = neuroshard(data, args)?;
    assert!(!out.status.success(), "neuroshard {args:?} should fail");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn wallet_and_ledger_commands() -> Res {
    let dir = tempfile::tempdir()?;
    let (node, other) = (dir.path().join("node"), dir.path().join("other"));

    let created = ok_json(&other, &["wallet", "new", "--json"])?;
    let other_id = created["node_id"].as_str().ok_or("node_id")?.to_string();
    assert!(fails(&other, &["wallet", "new"])?.contains("already exists"));
    let addr = ok_json(&other, &["wallet", "address", "--json"])?;
    assert_eq!(addr["node_id"], created["node_id"]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(other.join("node.key"))?
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // This node proves some training work, signed with its own key.
    let prover = test_identity(1);
    let neighbour = test_identity(2);
    prover.save_new(&node.join("node.key"))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let proof = training_proof(&prover, &neighbour, 1, now).sign(&prover);
    let file_path = dir.path().join("proof.hex");
    std::fs::write(&file_path, hex::encode(proof.to_bytes()))?;
    let file = file_path.to_str().ok_or("utf-8 path")?;
    let known = neighbour.public_key().to_string();

    let err = fails(&node, &["ledger", "verify-proof", file])?;
    assert!(err.contains("not a known node"), "{err}");
    let v = ok_json(
        &node,
        &[
            "ledger",
            "verify-proof",
            file,
            "--known",
            &known,
            "--apply",
            "--json",
        ],
    )?;
    assert_eq!(v["valid"], true);
    assert_eq!(v["applied"], true);
    // What the round pays at most; a training proof is paid when finality settles its round.
    assert!(v["reward"].as_u64().ok_or("reward")? > 0);
    let again = ok_json(
        &node,
        &[
            "ledger",
            "verify-proof",
            file,
            "--known",
            &known,
            "--apply",
            "--json",
        ],
    )?;
    assert_eq!(again["applied"], false, "a proof is credited once");
    let bal = ok_json(&node, &["ledger", "balance", "--json"])?;
    assert_eq!(
        bal["balance"].as_u64(),
        Some(0),
        "training pays when its round settles"
    );

    // Its uptime pays at once.
    let mut uptime = uptime_proof(&prover, 2, now);
    uptime.claimed_duration_ms = 600_000;
    let uptime = uptime.sign(&prover);
    std::fs::write(&file_path, hex::encode(uptime.to_bytes()))?;
    let v = ok_json(
        &node,
        &["ledger", "verify-proof", file, "--apply", "--json"],
    )?;
    assert_eq!(v["applied"], true);
    let reward = v["reward"].as_u64().ok_or("reward")?;
    assert!(reward > 0);

    let bal = ok_json(&node, &["ledger", "balance", "--json"])?;
    assert_eq!(bal["balance"].as_u64(), Some(reward));

    ok_json(&node, &["ledger", "transfer", &other_id, "0.001", "--json"])?;
    let theirs = ok_json(&node, &["ledger", "balance", &other_id, "--json"])?;
    assert_eq!(theirs["balance"].as_u64(), Some(950_000), "5 % burned");
    let err = fails(&node, &["ledger", "transfer", &other_id, "1000"])?;
    assert!(err.contains("insufficient balance"), "{err}");

    ok_json(&node, &["ledger", "stake", "0.0005", "--json"])?;
    let err = fails(&node, &["ledger", "unstake", "0.0005"])?;
    assert!(err.contains("locked"), "{err}");
    let err = fails(&node, &["ledger", "withdraw"])?;
    assert!(err.contains("nothing is unbonding"), "{err}");
    let bal = ok_json(&node, &["ledger", "balance", "--json"])?;
    assert_eq!(bal["unbonding"].as_u64(), Some(0));

    let history = ok_json(&node, &["ledger", "history", "--json"])?;
    let kinds: Vec<&str> = history
        .as_array()
        .ok_or("history array")?
        .iter()
        .filter_map(|h| h["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["stake", "burn", "transfer_out", "reward"]);

    let h1 = ok_json(&node, &["ledger", "state-hash", "--json"])?;
    assert_eq!(h1["minted"].as_u64(), Some(reward));
    assert_eq!(h1["burned"].as_u64(), Some(50_000));
    let h2 = ok_json(&node, &["ledger", "state-hash", "--json"])?;
    assert_eq!(h1["state_hash"], h2["state_hash"]);

    // A payment for one completion entered at `other`: signed at the next nonce, not applied
    // here (only the entry node's settlement can apply it), so the nonce stays free.
    let before = ok_json(&node, &["ledger", "balance", "--json"])?;
    let paid = ok_json(
        &node,
        &[
            "ledger",
            "pay-inference",
            &other_id,
            "0.0001",
            "--stages",
            "2",
            "--json",
        ],
    )?;
    let wire = hex::decode(paid["payment"].as_str().ok_or("payment")?)?;
    let op = *neuroshard_ledger::decode_op(&wire)?.op();
    assert_eq!(op.nonce, before["next_nonce"].as_u64().ok_or("nonce")?);
    match op.action {
        neuroshard_ledger::Action::PayInference {
            entry,
            per_stage,
            stages,
            ..
        } => {
            assert_eq!(entry.to_string(), other_id);
            assert_eq!((per_stage, stages), (100_000, 2));
        }
        other => return Err(format!("not a payment: {other:?}").into()),
    }
    let after = ok_json(&node, &["ledger", "balance", "--json"])?;
    assert_eq!(after, before, "signing a payment changes nothing");
    let err = fails(&node, &["ledger", "pay-inference", &other_id, "1000"])?;
    assert!(err.contains("holds"), "{err}");
    Ok(())
}
