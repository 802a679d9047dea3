//! The one `neuroshard` binary: every subcommand lives in its own module.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod alloc;
mod bench;
mod bench_byzantine;
mod bench_sim;
mod eval;
mod experiment;
mod export;
mod generate;
mod genesis;
mod ledger;
mod node;
mod scale;
mod swarm;
mod train;
mod wallet;

#[derive(Parser)]
#[command(
    name = "neuroshard",
    version,
    about = "Train one language model across untrusted peers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks with figures for the speed goals.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Genesis dataset: build (tokenizer, shards, signed manifest), verify, info.
    Genesis(genesis::GenesisArgs),
    /// Train the whole model in one process on a genesis dataset.
    Train(train::TrainArgs),
    /// Cross-entropy, bits per byte and perplexity of a checkpoint on unseen text.
    Eval(eval::EvalArgs),
    /// Continue a prompt with a trained checkpoint.
    Generate(generate::GenerateArgs),
    /// Print a checkpoint's logits for given token ids as JSON (for cross-checks).
    Logits(generate::LogitsArgs),
    /// Write a checkpoint as a Hugging Face LLaMA folder.
    Export(export::ExportArgs),
    /// The node key that is also its ledger account: new, show, address.
    Wallet(wallet::WalletArgs),
    /// NEURO ledger: balance, history, stake, unstake, transfer, verify-proof, state-hash.
    Ledger(ledger::LedgerArgs),
    /// A local network of node processes training one model as pipeline stages (the main job).
    Swarm(swarm::SwarmArgs),
    /// Run one network node (deployment across machines).
    Node(node::NodeArgs),
    /// The scaler: the size table, and the upgrades its rule predicts as nodes join.
    Scale(scale::ScaleArgs),
    /// In-process experiments: DiLoCo replicas, robust aggregation, attacks, compression.
    #[command(subcommand)]
    Experiment(experiment::ExperimentCommand),
}

fn main() -> Result<()> {
    alloc::tune_allocator();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // Malachite logs every vote and round certificate at info: thousands of lines
                // a minute from a validator (and from `bench sim`'s whole network).
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("info,arc_malachitebft=warn")
                }),
        )
        .with_writer(std::io::stderr)
        // The log is stderr: a failed write (a full disk under the log file) would be
        // reported to stderr by `eprintln!`, which panics when that write fails too. A node
        // keeps running with its log lost; its events still reach stdout.
        .log_internal_errors(false)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(cmd) => bench::run(cmd),
        Command::Genesis(args) => genesis::run(args),
        Command::Train(args) => train::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Generate(args) => generate::run_generate(args),
        Command::Logits(args) => generate::run_logits(args),
        Command::Export(args) => export::run(args),
        Command::Wallet(args) => wallet::run(args),
        Command::Ledger(args) => ledger::run(args),
        Command::Experiment(cmd) => experiment::run(cmd),
        Command::Swarm(args) => swarm::run(args),
        Command::Node(args) => node::run(args),
        Command::Scale(args) => scale::run(args),
    }
}
