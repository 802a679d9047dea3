//! The one `neuroshard` binary: every subcommand lives in its own module.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod alloc;

#[derive(Parser)]
#[command(name = "neuroshard", version, about = "Train one language model across untrusted peers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
}

fn main() -> Result<()> {
    alloc::tune_allocator();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
    }
}
