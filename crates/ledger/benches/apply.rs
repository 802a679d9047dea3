//! Proofs verified and applied per second on one core.
//!
//! `CARGO_TARGET_DIR=target-proof cargo bench -p neuroshard-ledger --bench apply`
//!
//! Groups split where time goes: signature checks alone, the whole verifier, the verifier
//! plus the in-memory rules, SQLite alone (batched, one transaction per 1000 proofs) and
//! the full path (verify + apply + SQLite batch).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use neuroshard_ledger::{Ledger, LedgerState, Message};
use neuroshard_proof::fixtures::{test_identity, training_proof, uptime_proof};
use neuroshard_proof::{Identity, ProofVerifier, SignedProof, VerifiedProof};

const PROVERS: u64 = 50;
const PER_PROVER: u64 = 40;
const N: u64 = PROVERS * PER_PROVER;
const T0: u64 = 1_800_000_000_000;
const SQL_BATCH: usize = 1_000;

struct Fixture {
    uptime: Vec<Vec<u8>>,
    training: Vec<Vec<u8>>,
    neighbour: Identity,
}

fn fixture() -> Fixture {
    let neighbour = test_identity(9_999);
    let provers: Vec<Identity> = (0..PROVERS).map(test_identity).collect();
    let mut uptime = Vec::new();
    let mut training = Vec::new();
    for nonce in 0..PER_PROVER {
        for p in &provers {
            let t = T0 + nonce * 100;
            uptime.push(uptime_proof(p, nonce, t).sign(p).to_bytes());
            training.push(training_proof(p, &neighbour, nonce, t).sign(p).to_bytes());
        }
    }
    Fixture {
        uptime,
        training,
        neighbour,
    }
}

fn verifier(f: &Fixture) -> ProofVerifier {
    let mut v = ProofVerifier::new();
    v.add_known_node(f.neighbour.public_key());
    v
}

fn verify_all(v: &mut ProofVerifier, proofs: &[Vec<u8>]) -> Vec<VerifiedProof> {
    proofs
        .iter()
        .filter_map(|b| v.verify_bytes(b, T0 + 60_000).ok())
        .collect()
}

fn bench(c: &mut Criterion) {
    let f = fixture();
    let mut g = c.benchmark_group("proofs");
    g.throughput(Throughput::Elements(N));
    g.sample_size(10);

    // Check the fixtures really pass, so no group measures a rejection path.
    let ok = verify_all(&mut verifier(&f), &f.uptime).len() as u64;
    let ok_t = verify_all(&mut verifier(&f), &f.training).len() as u64;
    assert_eq!((ok, ok_t), (N, N), "fixture proofs must all verify");

    g.bench_function("signature_only", |b| {
        let parsed: Vec<SignedProof> = f
            .uptime
            .iter()
            .filter_map(|x| SignedProof::from_bytes(x).ok())
            .collect();
        let keys: Vec<_> = parsed
            .iter()
            .filter_map(|s| s.signer().prepare().ok())
            .collect();
        b.iter(|| {
            for (s, k) in parsed.iter().zip(&keys) {
                let r = neuroshard_proof::verify_with_key(k, s.payload_bytes(), &s.signature());
                black_box(r.is_ok());
            }
        })
    });
    g.bench_function("verify_uptime", |b| {
        b.iter_batched(
            || verifier(&f),
            |mut v| black_box(verify_all(&mut v, &f.uptime)),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("verify_training_with_receipt", |b| {
        b.iter_batched(
            || verifier(&f),
            |mut v| black_box(verify_all(&mut v, &f.training)),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("verify_and_apply_in_memory", |b| {
        b.iter_batched(
            || (verifier(&f), LedgerState::new()),
            |(mut v, mut state)| {
                for p in verify_all(&mut v, &f.uptime) {
                    black_box(state.apply_proof(&p).is_ok());
                }
                state
            },
            BatchSize::PerIteration,
        )
    });
    let verified = verify_all(&mut verifier(&f), &f.uptime);
    g.bench_function("sqlite_apply_only_batched", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().ok();
                let ledger = dir
                    .as_ref()
                    .and_then(|d| Ledger::open(&d.path().join("ledger.db")).ok());
                (dir, ledger)
            },
            |(dir, ledger)| {
                let Some(mut ledger) = ledger else { return dir };
                for chunk in verified.chunks(SQL_BATCH) {
                    let msgs = chunk.iter().map(|p| Message::Proof(Box::new(p.clone())));
                    black_box(ledger.apply_batch(msgs).is_ok());
                }
                dir
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("full_verify_apply_sqlite_batched", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().ok();
                let ledger = dir
                    .as_ref()
                    .and_then(|d| Ledger::open(&d.path().join("ledger.db")).ok());
                (verifier(&f), dir, ledger)
            },
            |(mut v, dir, ledger)| {
                let Some(mut ledger) = ledger else { return dir };
                for chunk in f.uptime.chunks(SQL_BATCH) {
                    let msgs = verify_all(&mut v, chunk)
                        .into_iter()
                        .map(|p| Message::Proof(Box::new(p)));
                    black_box(ledger.apply_batch(msgs).is_ok());
                }
                dir
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
