//! Finality latency and traffic in the deterministic harness.
//!
//! `cargo run --release -p neuroshard-finality --example finality_sim -- [VALIDATORS] [EPOCHS] [LATENCY_MS] [JITTER_MS] [SEED]`
//!
//! Prints, per committee size, the virtual time from an epoch's start to its finalization
//! (median and p95 over every node and epoch), the messages and bytes each validator sends
//! per epoch, and how long a joiner takes to verify the whole finalized history from
//! certificates (the committee's powers change every 5 epochs). Links deliver every message
//! after LATENCY ± JITTER ms, all-to-all.

#[path = "../tests/harness/mod.rs"]
mod harness;

use std::time::Duration;

/// The joiner's side, in a fresh process (signatures found valid are remembered per
/// process, so verifying where the chain was made would measure the cache): reads the
/// genesis committee and the chain from a file, verifies, prints the milliseconds taken.
fn verify_file(path: &str) {
    use neuroshard_proof::Reader;
    let bytes = std::fs::read(path).expect("chain file");
    let started = std::time::Instant::now();
    let mut r = Reader::new(&bytes);
    let committee = neuroshard_finality::Committee::decode(&mut r, 1024).expect("committee");
    let n = r.u64().expect("count");
    let chain: Vec<_> = (0..n)
        .map(|_| neuroshard_finality::CertifiedEpoch::decode(&mut r).expect("epoch"))
        .collect();
    let genesis = neuroshard_finality::ChainHead {
        epoch: 0,
        state: [0; 32],
        committee,
    };
    let head = neuroshard_finality::verify_chain(&genesis, &chain).expect("history verifies");
    println!(
        "{} {:.1}",
        head.epoch,
        started.elapsed().as_secs_f64() * 1e3
    );
}

fn main() {
    if let Some(path) = std::env::args()
        .nth(2)
        .filter(|_| std::env::args().nth(1).as_deref() == Some("verify"))
    {
        return verify_file(&path);
    }
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments"))
        .collect();
    let arg = |i: usize, d: u64| args.get(i).copied().unwrap_or(d);
    let sizes: Vec<usize> = match args.first() {
        Some(n) => vec![*n as usize],
        None => vec![4, 7, 31],
    };
    let epochs = arg(1, 1000) as usize;
    for n in sizes {
        let mut net = harness::Net::new(&vec![10; n], arg(4, 1));
        net.latency = Duration::from_millis(arg(2, 40));
        net.jitter = Duration::from_millis(arg(3, 10));
        net.last_epoch = epochs as u64;
        net.rotate = true;
        net.start();
        let wall = std::time::Instant::now();
        let ok = net.run_until(Duration::from_secs(3600), |net| net.all_reached(epochs));
        let took = wall.elapsed();
        let mut lat: Vec<Duration> = (0..n).flat_map(|i| net.latencies(i)).collect();
        lat.sort();
        let pct = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
        let msgs: u64 = net.nodes.iter().map(|x| x.sent_msgs).sum();
        let bytes: u64 = net.nodes.iter().map(|x| x.sent_bytes).sum();
        let per = (n * epochs) as f64;
        let chain: Vec<neuroshard_finality::CertifiedEpoch> = net.nodes[0]
            .finalized
            .iter()
            .map(|f| neuroshard_finality::CertifiedEpoch {
                value: f.value,
                certificate: f.certificate.clone(),
                next_committee: net.committee_of(f.epoch + 1),
            })
            .collect();
        let mut w = neuroshard_proof::Writer::new();
        net.committee_of(1).encode(&mut w);
        w.u64(chain.len() as u64);
        for c in &chain {
            c.encode(&mut w);
        }
        let file = std::env::temp_dir().join(format!("finality-chain-{n}.bin"));
        let chain_bytes = w.into_bytes();
        std::fs::write(&file, &chain_bytes).expect("temp file");
        let out = std::process::Command::new(std::env::current_exe().expect("own path"))
            .arg("verify")
            .arg(&file)
            .output()
            .expect("joiner process");
        let _ = std::fs::remove_file(&file);
        let answer = String::from_utf8_lossy(&out.stdout);
        let mut it = answer.split_whitespace();
        let synced: u64 = it
            .next()
            .and_then(|x| x.parse().ok())
            .expect("joiner's answer");
        let sync_ms: f64 = it
            .next()
            .and_then(|x| x.parse().ok())
            .expect("joiner's time");
        println!(
            "{n:>3} validators, {epochs} epochs{}: finality median {:.0} ms, p95 {:.0} ms; \
             per validator per epoch {:.1} messages, {:.1} kB sent ({:.1} kB received); \
             a joiner (fresh process) decoded and verified {} epochs in {:.0} ms \
             ({:.1} kB per epoch served); \
             {:.2} s of wall time",
            if ok { "" } else { " (NOT all finalized)" },
            pct(0.5).as_secs_f64() * 1e3,
            pct(0.95).as_secs_f64() * 1e3,
            msgs as f64 / per,
            bytes as f64 / per / 1e3,
            bytes as f64 * (n as f64 - 1.0) / per / 1e3,
            synced,
            sync_ms,
            chain_bytes.len() as f64 / chain.len().max(1) as f64 / 1e3,
            took.as_secs_f64(),
        );
    }
}
