//! ECDSA verification cost: k256 (pure Rust) against libsecp256k1 (the `secp256k1` crate) on
//! the same low-S signatures over SHA-256 prehashes, keys already parsed, on one thread.
//!
//! `cargo run --release -p neuroshard-proof --example ecdsa_verify [N]`
//!
//! Prints wall-clock and this thread's CPU time (getrusage RUSAGE_THREAD) per operation, so a
//! figure taken on a busy machine still says what one core does.

use std::time::Instant;

use k256::ecdsa::signature::hazmat::PrehashVerifier;
use neuroshard_proof::fixtures::test_identity;

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

fn measure(label: &str, n: usize, f: impl FnOnce() -> usize) -> f64 {
    let (w0, c0) = (Instant::now(), thread_cpu_s());
    let ok = f();
    let (wall, cpu) = (w0.elapsed().as_secs_f64(), thread_cpu_s() - c0);
    assert_eq!(ok, n, "{label}: every signature must verify");
    let us = cpu * 1e6 / n as f64;
    println!(
        "{label:<40} {:>8.0}/s wall {:>8.0}/s cpu ({us:>6.1} us cpu each)",
        n as f64 / wall,
        n as f64 / cpu
    );
    us
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let signers: Vec<_> = (0..100).map(|i| test_identity(i + 1)).collect();
    let mut cases = Vec::with_capacity(n);
    for i in 0..n {
        let id = &signers[i % signers.len()];
        let msg = format!("neuroshard ecdsa bench {i}").into_bytes();
        let sig = id.sign(&msg);
        let prehash: [u8; 32] = {
            use sha2::Digest;
            sha2::Sha256::digest(&msg).into()
        };
        cases.push((id.public_key(), prehash, sig));
    }
    println!("{n} signatures by {} keys", signers.len());

    let k_keys: Vec<_> = cases
        .iter()
        .map(|(pk, _, _)| pk.verifying_key())
        .collect::<Result<_, _>>()?;
    let k_sigs: Vec<_> = cases
        .iter()
        .map(|(_, _, s)| k256::ecdsa::Signature::from_slice(&s.0))
        .collect::<Result<_, _>>()?;
    let s_keys: Vec<_> = cases
        .iter()
        .map(|(pk, _, _)| secp256k1::PublicKey::from_byte_array_compressed(pk.to_bytes()))
        .collect::<Result<_, _>>()?;
    let s_sigs: Vec<_> = cases
        .iter()
        .map(|(_, _, s)| secp256k1::ecdsa::Signature::from_compact(&s.0))
        .collect::<Result<_, _>>()?;

    let k = measure("k256 verify_prehash", n, || {
        cases
            .iter()
            .zip(&k_keys)
            .zip(&k_sigs)
            .filter(|(((_, h, _), key), sig)| key.verify_prehash(h, *sig).is_ok())
            .count()
    });
    let s = measure("libsecp256k1 ecdsa::verify", n, || {
        cases
            .iter()
            .zip(&s_keys)
            .zip(&s_sigs)
            .filter(|(((_, h, _), key), sig)| {
                secp256k1::ecdsa::verify(sig, secp256k1::Message::from_digest(*h), key).is_ok()
            })
            .count()
    });
    measure("k256 key decompression", n, || {
        cases
            .iter()
            .filter(|(pk, _, _)| pk.verifying_key().is_ok())
            .count()
    });
    measure("libsecp256k1 key parse", n, || {
        cases
            .iter()
            .filter(|(pk, _, _)| {
                secp256k1::PublicKey::from_byte_array_compressed(pk.to_bytes()).is_ok()
            })
            .count()
    });
    println!("libsecp256k1 verifies {:.2}x as fast as k256", k / s);
    Ok(())
}
