//! Ledger finality in a simulated network of real node cores (issue 19's figures):
//! latency per epoch, consensus bytes per epoch per node, and the time a node with nothing
//! takes to check and apply the finalized history a peer serves.
//!
//!   cargo run --release -p neuroshard-sim --example finality_nodes [NODES] [EPOCH_MS] [SECS] [LINK]
//!
//! NODES nodes (2 stages, stand-in engines, drivers stopping after 20 steps) on `home`
//! links (40 ± 10 ms, 20 Mbit/s, 0.5% loss) or `lan`; epochs start EPOCH_MS after the last
//! finalized one; SECS of virtual time.

use std::time::{Duration, Instant};

use neuroshard_finality::DEFAULT_MAX_MEMBERS;
use neuroshard_ledger::LedgerState;
use neuroshard_node::events::NodeEvent;
use neuroshard_node::finality::{
    FinalityAnswer, FinalityConfig, FinalityOut, FinalityRequest, LedgerFinality,
};
use neuroshard_proof::Identity;
use neuroshard_sim::{EngineCosts, EngineKind, Factory, LinkModel, Sim, settings, tiny_model};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (nodes, epoch_ms, secs) = (arg(1, 4) as usize, arg(2, 100), arg(3, 120));
    let link = match args.get(4).map(String::as_str) {
        Some("lan") => LinkModel::lan(),
        _ => LinkModel::home(),
    };
    let mut s = settings(tiny_model(), 2, 1);
    s.steps = 20;
    s.epoch_ms = epoch_ms;
    let factory = Factory::new(s.clone(), EngineKind::StandIn);
    let mut sim = Sim::new(7, s, link, EngineCosts::default(), Box::new(factory));
    sim.set_spare_keys(0);
    for i in 0..nodes {
        sim.add_node(i % 2, Duration::from_millis(10 * i as u64));
    }
    let wall = Instant::now();
    sim.run_until(Duration::from_secs(secs));
    let mut latencies: Vec<f64> = Vec::new();
    let mut heads = Vec::new();
    for i in 0..nodes {
        for e in sim.events(i) {
            if let NodeEvent::Finalized {
                latency_ms: Some(ms),
                ..
            } = e
            {
                latencies.push(*ms);
            }
        }
        heads.push(sim.core(i).and_then(|c| c.finality_head()));
    }
    latencies.sort_by(f64::total_cmp);
    let pick = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    let epochs = heads[0].map_or(0, |h| h.0);
    let agree = heads
        .iter()
        .all(|h| h.map(|x| x.1) == heads[0].map(|x| x.1));
    let traffic = sim.traffic();
    let bytes = traffic.bytes_by_kind.get("finality").copied().unwrap_or(0);
    let msgs = traffic.by_kind.get("finality").copied().unwrap_or(0);
    println!(
        "{nodes} nodes, epochs every {epoch_ms} ms after the last, {secs} s virtual ({:.1} s wall)",
        wall.elapsed().as_secs_f64()
    );
    println!("finalized epochs: {epochs}; every node on one state: {agree}");
    println!(
        "latency per epoch (start to finalized, per node): median {:.0} ms, p95 {:.0} ms",
        pick(0.5),
        pick(0.95)
    );
    let per = (epochs as f64 * nodes as f64).max(1.0);
    println!(
        "consensus traffic received per node per epoch: {:.0} messages, {:.1} kB",
        msgs as f64 / per,
        bytes as f64 / per / 1e3
    );

    // A node with nothing: the history node 0 serves, page by page, checked and applied.
    let genesis = sim
        .network()
        .ledger_genesis()
        .ok()
        .and_then(|g| LedgerState::from_genesis(&g).ok())
        .map(|(s, _)| s)
        .expect("genesis");
    let Some(source) = sim.core(0).and_then(|c| c.finality()) else {
        return;
    };
    let network = source.network();
    let cfg = FinalityConfig {
        network,
        epoch: Duration::from_millis(epoch_ms),
        max_members: DEFAULT_MAX_MEMBERS,
        timeouts: Default::default(),
    };
    let now = Instant::now();
    let mut joiner = LedgerFinality::new(cfg, Identity::generate(), genesis, now);
    let peer = sim.node_id(0);
    // The simulated nodes checked these signatures in this process already.
    neuroshard_proof::forget_verified_signatures();
    let started = Instant::now();
    let mut pages = 0;
    loop {
        let from = joiner.head().epoch + 1;
        let FinalityAnswer::Chain(links) = source.answer(
            &FinalityRequest::Chain {
                network,
                from,
                max: 256,
            },
            16 << 20,
        ) else {
            break;
        };
        if links.is_empty() {
            break;
        }
        pages += 1;
        joiner.on_chain(peer, links, now);
        while let Some(out) = joiner.poll_out() {
            if let FinalityOut::Penalize { reason, .. } = out {
                panic!("the honest chain was refused: {reason}");
            }
        }
    }
    println!(
        "a node with nothing checks and applies {} epochs in {:.0} ms ({pages} pages of ≤ 256), ending on node 0's state: {}",
        joiner.head().epoch,
        started.elapsed().as_secs_f64() * 1e3,
        Some(joiner.head().state) == heads[0].map(|h| h.1)
    );
}
