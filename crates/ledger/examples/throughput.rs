//! Where the time goes when verifying and applying proofs, on one thread.
//!
//! `CARGO_TARGET_DIR=target-proof-bench cargo run --release -p neuroshard-ledger --example throughput [N]`
//! (or, sharing the workspace's build: `cargo build --workspace --examples && target/debug/examples/throughput`)
//!
//! Reports both wall-clock and this thread's CPU time (getrusage RUSAGE_THREAD), so a figure
//! taken on a busy machine still says what one core can do.

use std::time::Instant;

use neuroshard_ledger::{Changes, Ledger, LedgerState, Message, Outcome, WiredMessage};
use neuroshard_proof::fixtures::{test_identity, uptime_proof};
use neuroshard_proof::{ProofVerifier, SignedProof, VerifiedProof, verify_with_key};

const T0: u64 = 1_800_000_000_000;
const PER_PROVER: u64 = 100;
const SQL_BATCH: usize = 1_000;

fn thread_cpu_s() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    if rc != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn measure<T>(label: &str, n: usize, f: impl FnOnce() -> T) -> T {
    let (w0, c0) = (Instant::now(), thread_cpu_s());
    let out = f();
    let (wall, cpu) = (w0.elapsed().as_secs_f64(), thread_cpu_s() - c0);
    println!(
        "{label:<44} {:>9.0}/s wall  {:>9.0}/s cpu  ({:>6.1} us cpu each)",
        n as f64 / wall,
        n as f64 / cpu,
        cpu * 1e6 / n as f64
    );
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let provers: Vec<_> = (0..n.div_ceil(PER_PROVER))
        .map(|i| test_identity(i + 1))
        .collect();
    let mut wire = Vec::new();
    for nonce in 0..PER_PROVER {
        for p in &provers {
            if wire.len() as u64 == n {
                break;
            }
            wire.push(uptime_proof(p, nonce, T0 + nonce * 10).sign(p).to_bytes());
        }
    }
    let n = wire.len();
    println!("{n} uptime proofs from {} provers", provers.len());
    let now = T0 + 60_000;

    let parsed: Vec<SignedProof> = wire
        .iter()
        .filter_map(|b| SignedProof::from_bytes(b).ok())
        .collect();
    let keys: Vec<_> = parsed
        .iter()
        .filter_map(|s| s.signer().prepare().ok())
        .collect();
    let ok = measure("ECDSA verify only (key decompressed)", n, || {
        parsed
            .iter()
            .zip(&keys)
            .filter(|(s, k)| verify_with_key(k, s.payload_bytes(), &s.signature()).is_ok())
            .count()
    });
    assert_eq!(ok, n);

    let verified: Vec<VerifiedProof> =
        measure("ProofVerifier::verify_bytes (all checks)", n, || {
            let mut v = ProofVerifier::new();
            wire.iter()
                .filter_map(|b| v.verify_bytes(b, now).ok())
                .collect()
        });
    assert_eq!(verified.len(), n);

    measure("LedgerState::apply_proof (rules, memory)", n, || {
        let mut s = LedgerState::new();
        verified.iter().filter(|p| s.apply_proof(p).is_ok()).count()
    });

    let dir = tempfile::tempdir()?;
    let mut ledger = Ledger::open(&dir.path().join("a.db"))?;
    measure("Ledger::apply_batch (rules + SQLite, 1000/tx)", n, || {
        for chunk in verified.chunks(SQL_BATCH) {
            let msgs = chunk.iter().map(|p| Message::Proof(Box::new(p.clone())));
            let _ = ledger.apply_batch(msgs);
        }
    });
    assert_eq!(ledger.state().proof_count(), n);

    let mut single = Ledger::open(&dir.path().join("c.db"))?;
    let m = 200.min(n);
    measure("Ledger::apply_proof (1 proof/tx, fsync each)", m, || {
        for p in &verified[..m] {
            let _ = single.apply_proof(p);
        }
    });

    // The node's live path: each proof with its wire bytes; one transaction per proof (as
    // before), or one per batch of what is due (as the runtime now writes).
    let mut single = Ledger::open(&dir.path().join("d.db"))?;
    measure("Ledger::apply_proof_wire (1 proof/tx)", m, || {
        for (p, w) in verified[..m].iter().zip(&wire) {
            let _ = single.apply_proof_wire(p, w);
        }
    });
    let mut wired = Ledger::open(&dir.path().join("e.db"))?;
    measure("Ledger::apply_wired_batch (1000/tx)", n, || {
        for (ps, ws) in verified.chunks(SQL_BATCH).zip(wire.chunks(SQL_BATCH)) {
            let msgs = ps.iter().zip(ws).map(|(p, w)| WiredMessage::Proof(p, w));
            let _ = wired.apply_wired_batch(msgs);
        }
    });
    assert_eq!(wired.state().proof_count(), n);

    let mut ledger = Ledger::open(&dir.path().join("b.db"))?;
    measure("full: verify + apply + SQLite (1000/tx)", n, || {
        let mut v = ProofVerifier::new();
        for chunk in wire.chunks(SQL_BATCH) {
            let msgs: Vec<Message> = chunk
                .iter()
                .filter_map(|b| v.verify_bytes(b, now).ok())
                .map(|p| Message::Proof(Box::new(p)))
                .collect();
            let _ = ledger.apply_batch(msgs);
        }
    });
    assert_eq!(ledger.state().proof_count(), n);
    let hash = ledger.state_hash();
    println!("state hash {}", hex::encode(hash));

    // The node's live path since the store stopped re-applying: the economy verifies and
    // applies in memory, and the ledger thread writes the resulting Changes (one transaction
    // per batch of what is due). Here both halves run on this one thread.
    let ledger = Ledger::open(&dir.path().join("f.db"))?;
    let mut state = ledger.state().clone();
    let mut log = ledger.into_change_log();
    measure("live: verify + rules + ChangeLog (1000/tx)", n, || {
        let mut v = ProofVerifier::new();
        for chunk in wire.chunks(SQL_BATCH) {
            let mut all = Changes::default();
            let mut wires = Vec::new();
            for b in chunk {
                let Ok(p) = v.verify_bytes(b, now) else {
                    continue;
                };
                if let Ok(Outcome::Applied(changes)) = state.apply_proof(&p) {
                    all.merge(changes);
                    wires.push((p.hash(), &b[..]));
                }
            }
            let _ = log.commit(&all, &wires);
        }
    });
    assert_eq!(state.proof_count(), n);
    assert_eq!(state.state_hash(), hash);
    drop(log);
    let reopened = Ledger::open(&dir.path().join("f.db"))?;
    assert_eq!(
        reopened.state_hash(),
        hash,
        "what the log wrote reloads to one state"
    );
    Ok(())
}
