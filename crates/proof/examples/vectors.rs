//! Signature test vectors for cross-checking against libsecp256k1 (bench/coincurve_check.sh).
//!
//! `vectors emit N`         JSON lines {secret, pubkey, msg, sig} signed by test keys over
//!                          canonical proof bytes and other messages.
//! `vectors verify FILE`    checks JSON lines {pubkey, msg, sig, expect} made elsewhere;
//!                          exits non-zero if any verdict differs from `expect`.
//! `vectors sample-proof OUT [KEYFILE]` writes a signed training proof (hex) for
//!                          `ledger verify-proof`, prints the neighbour key to pass as
//!                          `--known`, and optionally saves the prover's test key.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use neuroshard_proof::fixtures::{test_identity, training_proof};
use neuroshard_proof::{Canonical, PublicKey, Signature};

type Error = Box<dyn std::error::Error>;

fn emit(n: u64) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    for i in 0..n {
        let signer = test_identity(1_000 + i % 16);
        let msg = match i % 4 {
            // Canonical proof bytes: what the network actually signs.
            0 | 1 => training_proof(&signer, &test_identity(2_000), i, 1_700_000_000_000 + i)
                .to_canonical_bytes(),
            2 => Vec::new(),
            _ => (0..(i * 37 % 300)).map(|b| (b * 7 + i) as u8).collect(),
        };
        let sig = signer.sign(&msg);
        let line = serde_json::json!({
            "secret": hex::encode(signer.secret_bytes()),
            "pubkey": signer.public_key(),
            "msg": hex::encode(&msg),
            "sig": sig,
        });
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn verify(path: &str) -> Result<bool, Error> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    let (mut agree, mut disagree) = (0u64, 0u64);
    for line in file.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line)?;
        let field = |k: &str| v[k].as_str().ok_or_else(|| format!("missing {k}"));
        let pubkey: PublicKey = field("pubkey")?.parse()?;
        let msg = hex::decode(field("msg")?)?;
        let sig: Signature = field("sig")?.parse()?;
        let expect = v["expect"].as_bool().unwrap_or(true);
        let got = pubkey.verify(&msg, &sig);
        if got.is_ok() == expect {
            agree += 1;
        } else {
            disagree += 1;
            eprintln!("MISMATCH expect={expect} got={got:?} note={}", v["note"]);
        }
    }
    println!("rust verified python vectors: {agree} agree, {disagree} disagree");
    Ok(disagree == 0)
}

fn sample_proof(out: &str, key_file: Option<&str>) -> Result<(), Error> {
    let prover = test_identity(1);
    let neighbour = test_identity(2);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let signed = training_proof(&prover, &neighbour, 1, now).sign(&prover);
    std::fs::write(out, hex::encode(signed.to_bytes()))?;
    if let Some(path) = key_file {
        // Lets a CLI demo act as the prover (a deterministic test key, never for real use).
        prover.save_new(std::path::Path::new(path))?;
    }
    println!("{}", neighbour.public_key());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["emit", n] => n.parse().map_err(Error::from).and_then(emit).map(|()| true),
        ["verify", path] => verify(path),
        ["sample-proof", out] => sample_proof(out, None).map(|()| true),
        ["sample-proof", out, key] => sample_proof(out, Some(key)).map(|()| true),
        _ => Err("usage: vectors emit N | verify FILE | sample-proof OUT [KEYFILE]".into()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
