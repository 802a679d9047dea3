//! `neuroshard eval`: how well a model predicts text it never saw (the scoring lives in
//! `neuroshard-eval`).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use neuroshard_data::Genesis;
use neuroshard_eval::{evaluate_windows, text_batches, text_stream, val_batches};
use neuroshard_model::checkpoint;

#[derive(Args)]
pub struct EvalArgs {
    /// Checkpoint directory of a whole model.
    #[arg(long)]
    checkpoint: PathBuf,
    /// A genesis dataset: its validation split is evaluated.
    #[arg(long, conflicts_with = "text", required_unless_present = "text")]
    data: Option<PathBuf>,
    /// Raw text files, tokenized with the tokenizer saved beside the checkpoint.
    #[arg(long, num_args = 1..)]
    text: Vec<PathBuf>,
    /// Tokens per window (default: the model's max_seq).
    #[arg(long)]
    seq: Option<usize>,
    /// Windows per forward pass.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Stop after this many windows (0: all).
    #[arg(long, default_value_t = 0)]
    max_windows: usize,
    #[arg(long)]
    json: bool,
}

pub fn run(args: EvalArgs) -> Result<()> {
    let ckpt = checkpoint::load(&args.checkpoint)
        .with_context(|| format!("loading {}", args.checkpoint.display()))?;
    let stage = ckpt.stage;
    if !(stage.spec().embed && stage.spec().head) {
        bail!("eval needs a checkpoint of the whole model, not one stage");
    }
    let seq = args.seq.unwrap_or(stage.config().max_seq);
    let max = if args.max_windows == 0 {
        usize::MAX
    } else {
        args.max_windows
    };
    let rows = args.batch.max(1);
    let (tokenizer, batches) = if let Some(dir) = &args.data {
        let genesis =
            Genesis::open(dir).with_context(|| format!("opening genesis {}", dir.display()))?;
        let batches = val_batches(&genesis, rows, seq, max.div_ceil(rows))?;
        let batches = batches.into_iter().map(|b| (b, Vec::new())).collect();
        (genesis.tokenizer().clone(), batches)
    } else {
        let tokenizer = crate::generate::checkpoint_tokenizer(&args.checkpoint)?;
        let mut texts = Vec::new();
        for path in &args.text {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            texts.push(String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{} is not valid UTF-8 at byte {}",
                    path.display(),
                    e.utf8_error().valid_up_to()
                )
            })?);
        }
        let stream = text_stream(&tokenizer, &texts)?;
        let batches = text_batches(&stream, seq, rows, max)?;
        (tokenizer, batches)
    };
    if tokenizer.vocab_size() != stage.config().vocab {
        bail!(
            "the tokenizer has {} tokens but the model's vocabulary is {}",
            tokenizer.vocab_size(),
            stage.config().vocab
        );
    }
    let report = evaluate_windows(&stage, &tokenizer, &batches)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} tokens ({} bytes, {} windows of {seq}): loss {:.4} nats/token, {:.4} bits/byte, perplexity {:.2}",
            report.tokens,
            report.bytes,
            report.windows,
            report.loss,
            report.bits_per_byte,
            report.perplexity
        );
    }
    Ok(())
}
