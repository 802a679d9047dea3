//! `neuroshard export`: a checkpoint as a Hugging Face LLaMA folder.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use neuroshard_model::{SpecialTokens, checkpoint, export_hf};

#[derive(Args)]
pub struct ExportArgs {
    /// Checkpoint directory of a whole model (as written by `train` or `swarm`).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Output folder for config.json, model.safetensors, generation_config.json, tokenizer.json.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: ExportArgs) -> Result<()> {
    let meta = checkpoint::read_meta(&args.checkpoint)
        .with_context(|| format!("reading checkpoint {}", args.checkpoint.display()))?;
    let special: SpecialTokens = meta
        .extra
        .get("tokens")
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .context("checkpoint metadata has malformed special tokens")?
        .unwrap_or_default();
    let report = export_hf(&args.checkpoint, &args.out, special)
        .with_context(|| format!("exporting {}", args.checkpoint.display()))?;
    println!(
        "exported {} tensors ({:.1} MB){} to {}",
        report.tensors,
        report.bytes as f64 / 1e6,
        if report.tokenizer {
            " with tokenizer.json"
        } else {
            " (no tokenizer.json beside the checkpoint)"
        },
        args.out.display()
    );
    Ok(())
}
