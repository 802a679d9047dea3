//! `neuroshard generate` and `neuroshard logits`: run a trained model.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use neuroshard_data::GenesisTokenizer;
use neuroshard_model::{Generator, Sampling, checkpoint};

#[derive(Args)]
pub struct GenerateArgs {
    /// Checkpoint directory of a whole model, with its tokenizer.json.
    #[arg(long)]
    checkpoint: PathBuf,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 100)]
    max_tokens: usize,
    /// 0 for greedy decoding.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Sample among the k most likely tokens (0: no limit).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling threshold (1.0: no limit).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
pub struct LogitsArgs {
    #[arg(long)]
    checkpoint: PathBuf,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    tokens: Vec<u32>,
}

/// Loads the tokenizer saved beside a checkpoint.
pub fn checkpoint_tokenizer(dir: &Path) -> Result<GenesisTokenizer> {
    let path = dir.join(checkpoint::TOKENIZER_FILE);
    if !path.is_file() {
        bail!(
            "{} has no {}: train with a genesis dataset so the tokenizer is saved with the model",
            dir.display(),
            checkpoint::TOKENIZER_FILE
        );
    }
    GenesisTokenizer::load(&path).with_context(|| format!("loading {}", path.display()))
}

pub fn load_generator(dir: &Path) -> Result<Generator> {
    let ckpt = checkpoint::load(dir).with_context(|| format!("loading {}", dir.display()))?;
    Ok(Generator::new(ckpt.stage)?)
}

pub fn run_generate(args: GenerateArgs) -> Result<()> {
    let tokenizer = checkpoint_tokenizer(&args.checkpoint)?;
    let generator = load_generator(&args.checkpoint)?;
    let prompt = tokenizer.encode(&args.prompt)?;
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: (args.top_k > 0).then_some(args.top_k),
        top_p: (args.top_p < 1.0).then_some(args.top_p),
        seed: args.seed,
        stop_token: Some(tokenizer.eos_id()),
    };
    let out = generator.generate(&prompt, args.max_tokens, &sampling)?;
    println!("{}{}", args.prompt, tokenizer.decode(&out)?);
    Ok(())
}

pub fn run_logits(args: LogitsArgs) -> Result<()> {
    let generator = load_generator(&args.checkpoint)?;
    let logits = generator.logits(&args.tokens)?;
    println!(
        "{}",
        serde_json::json!({ "tokens": args.tokens, "logits": logits })
    );
    Ok(())
}
