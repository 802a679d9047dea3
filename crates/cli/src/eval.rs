//! `neuroshard eval`: how well a model predicts text it never saw.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use neuroshard_data::{Genesis, GenesisTokenizer};
use neuroshard_model::{Batch, Stage, checkpoint};
use serde::Serialize;

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

#[derive(Serialize)]
pub struct EvalReport {
    pub tokens: u64,
    pub bytes: u64,
    pub windows: u64,
    /// Mean cross-entropy per token, in nats.
    pub loss: f64,
    pub bits_per_byte: f64,
    pub perplexity: f64,
}

/// Accumulates per-token losses and the bytes their targets stand for.
struct Tally {
    byte_len: Vec<u32>,
    nats: f64,
    tokens: u64,
    bytes: u64,
    windows: u64,
}

impl Tally {
    fn add(&mut self, stage: &Stage, batch: &Batch) -> Result<()> {
        let losses = stage.token_losses(&batch.input(), &batch.targets)?;
        self.nats += losses.iter().map(|&l| f64::from(l)).sum::<f64>();
        self.tokens += losses.len() as u64;
        self.bytes += batch
            .targets
            .iter()
            .map(|&t| u64::from(self.byte_len.get(t as usize).copied().unwrap_or(0)))
            .sum::<u64>();
        self.windows += batch.batch as u64;
        Ok(())
    }

    fn report(&self) -> Result<EvalReport> {
        if self.tokens == 0 {
            bail!("nothing to evaluate: the input is shorter than one window");
        }
        let loss = self.nats / self.tokens as f64;
        Ok(EvalReport {
            tokens: self.tokens,
            bytes: self.bytes,
            windows: self.windows,
            loss,
            bits_per_byte: if self.bytes > 0 {
                self.nats / std::f64::consts::LN_2 / self.bytes as f64
            } else {
                f64::NAN
            },
            perplexity: loss.exp(),
        })
    }
}

/// Evaluates `stage` on batches; shared with `train` for its validation loss.
pub fn evaluate(
    stage: &Stage,
    tokenizer: &GenesisTokenizer,
    batches: &[Batch],
) -> Result<EvalReport> {
    let mut tally = Tally {
        byte_len: tokenizer.token_byte_lengths(),
        nats: 0.0,
        tokens: 0,
        bytes: 0,
        windows: 0,
    };
    for batch in batches {
        tally.add(stage, batch)?;
    }
    tally.report()
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
        (genesis.tokenizer().clone(), batches)
    } else {
        let tokenizer = crate::generate::checkpoint_tokenizer(&args.checkpoint)?;
        let mut stream = Vec::new();
        for path in &args.text {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let text = String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{} is not valid UTF-8 at byte {}",
                    path.display(),
                    e.utf8_error().valid_up_to()
                )
            })?;
            stream.extend(tokenizer.encode(&text)?);
            stream.push(tokenizer.eos_id());
        }
        let windows: Vec<Vec<u32>> = stream
            .windows(seq + 1)
            .step_by(seq)
            .take(max)
            .map(<[u32]>::to_vec)
            .collect();
        let batches = windows
            .chunks(rows)
            .map(|c| Batch::from_windows(c, seq))
            .collect::<Result<Vec<_>, _>>()?;
        (tokenizer, batches)
    };
    if tokenizer.vocab_size() != stage.config().vocab {
        bail!(
            "the tokenizer has {} tokens but the model's vocabulary is {}",
            tokenizer.vocab_size(),
            stage.config().vocab
        );
    }
    let report = evaluate(&stage, &tokenizer, &batches)?;
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

/// The validation split as model batches (at most `max` batches of `rows` windows).
pub fn val_batches(genesis: &Genesis, rows: usize, seq: usize, max: usize) -> Result<Vec<Batch>> {
    Ok(genesis
        .val_batches(rows, seq, max)?
        .into_iter()
        .map(|b| to_model_batch(b, seq))
        .collect())
}

/// A genesis batch as the model takes it.
pub fn to_model_batch(b: neuroshard_data::Batch, seq: usize) -> Batch {
    Batch {
        batch: b.rows,
        seq,
        inputs: b.inputs,
        targets: b.targets,
    }
}
