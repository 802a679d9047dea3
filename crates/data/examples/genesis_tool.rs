//! Small driver for benchmarks and cross-checks without building the whole CLI:
//!
//! - `genesis_tool build OUT INPUT...`: build with default settings (fresh key in OUT's
//!   parent), print the elapsed time and token counts;
//! - `genesis_tool synthetic OUT [TOKENS]`: the same for the built-in synthetic corpus, also
//!   printing the entropy floor;
//! - `genesis_tool encode TOKENIZER_JSON IN_JSONL OUT_JSONL`: encode each `{"text": …}` line
//!   with our tokenizer wrapper, writing `{"ids": […]}` lines (for bench/tokenizers_check).

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use neuroshard_data::{BuildOptions, GenesisTokenizer, NoProgress, SyntheticConfig, build};
use neuroshard_proof::Identity;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let first = args.first().map(String::as_str);
    match first {
        Some(mode @ ("build" | "synthetic")) if args.len() >= 2 => {
            let out = PathBuf::from(&args[1]);
            let key = out
                .parent()
                .map(|p| p.join("genesis-builder.key"))
                .unwrap_or_else(|| PathBuf::from("genesis-builder.key"));
            let identity = Identity::load_or_create(&key)?;
            let mut opts = BuildOptions {
                inputs: args[2..].iter().map(PathBuf::from).collect(),
                ..BuildOptions::new(out)
            };
            if mode == "synthetic" {
                let mut cfg = SyntheticConfig::default();
                if let Some(t) = args.get(2) {
                    cfg.tokens = t.parse()?;
                }
                opts.inputs.clear();
                opts.synthetic = Some(cfg);
            }
            let t = Instant::now();
            let report = build(&opts, &identity, &NoProgress)?;
            let m = &report.manifest.manifest;
            println!(
                "build: {:.2} s, {} text bytes, {} train + {} val documents, {} train + {} val tokens, {} shards, vocab {}, root {}",
                t.elapsed().as_secs_f64(),
                m.stats.text_bytes,
                m.stats.documents.train,
                m.stats.documents.val,
                m.stats.tokens.train,
                m.stats.tokens.val,
                m.shards.len(),
                m.tokenizer.vocab_size,
                m.merkle_root
            );
            if let Some(f) = m.entropy_floor {
                println!(
                    "entropy floor: {} nats/token ({} bits/token), mean document {} tokens, ln(vocab) {}",
                    f.nats_per_token,
                    f.bits_per_token,
                    f.mean_doc_tokens,
                    (m.tokenizer.vocab_size as f64).ln()
                );
            }
            Ok(())
        }
        Some("encode") if args.len() == 4 => {
            let tok = GenesisTokenizer::load(&PathBuf::from(&args[1]))?;
            let input = std::io::BufReader::new(std::fs::File::open(&args[2])?);
            let mut out = BufWriter::new(std::fs::File::create(&args[3])?);
            let mut n = 0;
            for line in input.lines() {
                let v: serde_json::Value = serde_json::from_str(&line?)?;
                let text = v["text"].as_str().ok_or("line without a text field")?;
                let ids = tok.encode(text)?;
                writeln!(out, "{}", serde_json::json!({ "ids": ids }))?;
                n += 1;
            }
            out.flush()?;
            println!("encoded {n} samples");
            Ok(())
        }
        _ => Err("usage: genesis_tool build OUT INPUT... | synthetic OUT [TOKENS] | encode TOKENIZER IN OUT".into()),
    }
}
