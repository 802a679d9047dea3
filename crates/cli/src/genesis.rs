//! `neuroshard genesis build|verify|info`: the verifiable training dataset.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use neuroshard_data::{
    BuildOptions, Progress, SignedManifest, Split, SyntheticConfig, build, verify_dir,
};
use neuroshard_proof::Identity;

#[derive(Args)]
pub struct GenesisArgs {
    #[command(subcommand)]
    command: GenesisCommand,
}

#[derive(Subcommand)]
enum GenesisCommand {
    /// Build a dataset: train the tokenizer, write shards, sign the manifest.
    Build(BuildArgs),
    /// Recompute every hash, the Merkle root and the signature of a dataset.
    Verify {
        /// The dataset folder (holding manifest.json).
        dir: PathBuf,
    },
    /// Summarize a dataset (its manifest signature is checked).
    Info {
        dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct BuildArgs {
    /// Input files or folders: .txt (folders walked recursively), .jsonl with a "text"
    /// field, .parquet with a "text" column.
    #[arg(long, num_args = 1.., required_unless_present = "synthetic")]
    input: Vec<PathBuf>,
    /// Output folder (must be absent or empty).
    #[arg(long)]
    out: PathBuf,
    /// Maximum vocabulary size, special tokens included.
    #[arg(long, default_value_t = 4096)]
    vocab: usize,
    /// Tokens per shard file.
    #[arg(long, default_value_t = 1 << 20)]
    shard_tokens: u64,
    /// Fraction of documents (chosen by content hash) in the validation split.
    #[arg(long, default_value_t = 0.01)]
    val_fraction: f64,
    /// Use the built-in synthetic corpus (second-order Markov chain with a known loss floor)
    /// instead of --input.
    #[arg(long, conflicts_with = "input")]
    synthetic: bool,
    /// Synthetic corpus size in tokens.
    #[arg(long, default_value_t = SyntheticConfig::default().tokens, requires = "synthetic")]
    synthetic_tokens: u64,
    /// Seed of the synthetic source.
    #[arg(long, default_value_t = 0, requires = "synthetic")]
    synthetic_seed: u64,
    /// Number of distinct synthetic words.
    #[arg(long, default_value_t = SyntheticConfig::default().words, requires = "synthetic")]
    synthetic_words: u32,
    /// Skip (and count) unreadable or invalid documents instead of failing.
    #[arg(long)]
    skip_bad: bool,
    /// Dataset name (default: the output folder's name).
    #[arg(long)]
    name: Option<String>,
    /// Builder signing key (created if missing). Default: genesis-builder.key beside the
    /// output folder, so the secret never lands inside the dataset that gets shared.
    #[arg(long)]
    key: Option<PathBuf>,
}

pub fn run(args: GenesisArgs) -> Result<()> {
    match args.command {
        GenesisCommand::Build(b) => run_build(b),
        GenesisCommand::Verify { dir } => {
            let report =
                verify_dir(&dir).with_context(|| format!("verify {} failed", dir.display()))?;
            println!(
                "ok: {} shards, {} tokens, merkle root {}, signature valid",
                report.shards, report.tokens, report.root
            );
            Ok(())
        }
        GenesisCommand::Info { dir, json } => info(&dir, json),
    }
}

fn default_key_path(out: &Path) -> PathBuf {
    out.parent()
        .unwrap_or_else(|| Path::new(""))
        .join("genesis-builder.key")
}

fn run_build(b: BuildArgs) -> Result<()> {
    let key_path = b.key.clone().unwrap_or_else(|| default_key_path(&b.out));
    let identity = Identity::load_or_create(&key_path)
        .with_context(|| format!("builder key {}", key_path.display()))?;
    let synthetic = b.synthetic.then(|| SyntheticConfig {
        seed: b.synthetic_seed,
        tokens: b.synthetic_tokens,
        words: b.synthetic_words,
        ..SyntheticConfig::default()
    });
    let opts = BuildOptions {
        inputs: b.input,
        synthetic,
        out: b.out.clone(),
        name: b.name,
        vocab: b.vocab,
        shard_tokens: b.shard_tokens,
        val_fraction: b.val_fraction,
        skip_bad: b.skip_bad,
    };
    let started = Instant::now();
    let bar = Bar::default();
    let report = build(&opts, &identity, &bar)
        .with_context(|| format!("genesis build into {} failed", b.out.display()))?;
    let m = &report.manifest.manifest;
    for msg in &report.skipped {
        eprintln!("skipped: {msg}");
    }
    println!(
        "built {} in {:.1} s: {} train + {} val documents, {} train + {} val tokens, {} shards",
        b.out.display(),
        started.elapsed().as_secs_f64(),
        m.stats.documents.train,
        m.stats.documents.val,
        m.stats.tokens.train,
        m.stats.tokens.val,
        m.shards.len()
    );
    println!(
        "vocab {} ({:?}), merkle root {}",
        m.tokenizer.vocab_size, m.dtype, m.merkle_root
    );
    if m.stats.skipped_documents > 0 {
        println!("skipped {} bad documents", m.stats.skipped_documents);
    }
    if let Some(f) = m.entropy_floor {
        println!(
            "entropy floor {:.6} nats/token ({:.6} bits/token)",
            f.nats_per_token, f.bits_per_token
        );
    }
    println!(
        "signed by {} (key {})",
        identity.node_id(),
        key_path.display()
    );
    Ok(())
}

fn info(dir: &Path, json: bool) -> Result<()> {
    let signed = SignedManifest::load(dir)
        .with_context(|| format!("reading manifest in {}", dir.display()))?;
    let m = &signed.manifest;
    let shards = |split| m.shards.iter().filter(|s| s.split == split).count();
    if json {
        let v = serde_json::json!({
            "name": m.name,
            "merkle_root": m.merkle_root.to_string(),
            "builder": m.builder.to_string(),
            "builder_node_id": m.builder.node_id().to_string(),
            "documents": m.stats.documents,
            "tokens": m.stats.tokens,
            "shards": { "train": shards(Split::Train), "val": shards(Split::Val) },
            "shard_tokens": m.params.shard_tokens,
            "vocab_size": m.tokenizer.vocab_size,
            "dtype": m.dtype,
            "text_bytes": m.stats.text_bytes,
            "skipped_documents": m.stats.skipped_documents,
            "entropy_floor": m.entropy_floor,
            "synthetic": m.params.synthetic,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("name          {}", m.name);
    println!("merkle root   {}", m.merkle_root);
    println!("builder       {} (node {})", m.builder, m.builder.node_id());
    println!(
        "documents     {} train, {} val ({} skipped, {} empty)",
        m.stats.documents.train,
        m.stats.documents.val,
        m.stats.skipped_documents,
        m.stats.empty_documents
    );
    println!(
        "tokens        {} train, {} val ({} text bytes)",
        m.stats.tokens.train, m.stats.tokens.val, m.stats.text_bytes
    );
    println!(
        "shards        {} train, {} val ({} tokens each, {:?})",
        shards(Split::Train),
        shards(Split::Val),
        m.params.shard_tokens,
        m.dtype
    );
    println!("vocab         {}", m.tokenizer.vocab_size);
    match m.entropy_floor {
        Some(f) => println!(
            "entropy floor {:.6} nats/token ({:.6} bits/token; synthetic)",
            f.nats_per_token, f.bits_per_token
        ),
        None => println!("entropy floor none (not synthetic)"),
    }
    Ok(())
}

/// indicatif bar over text bytes, one per build stage; hidden when stderr is not a terminal.
#[derive(Default)]
struct Bar {
    bar: std::sync::Mutex<Option<ProgressBar>>,
}

impl Progress for Bar {
    fn stage(&self, name: &str, total: u64) {
        let bar = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template(
            "{msg:30} [{elapsed_precise}] {wide_bar} {binary_bytes}/{binary_total_bytes} ({eta})",
        ) {
            bar.set_style(style);
        }
        bar.set_message(name.to_owned());
        if let Ok(mut slot) = self.bar.lock() {
            *slot = Some(bar);
        }
    }

    fn advance(&self, n: u64) {
        if let Ok(slot) = self.bar.lock()
            && let Some(bar) = slot.as_ref()
        {
            bar.inc(n);
        }
    }

    fn finish(&self) {
        if let Ok(mut slot) = self.bar.lock()
            && let Some(bar) = slot.take()
        {
            bar.finish_and_clear();
        }
    }
}
