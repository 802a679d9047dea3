//! Runs one aggregator (or attack) on raw little-endian f32 files, for cross-checks against
//! other implementations (bench/byzfl_check.py).
//!
//! agg_file aggregate SPEC F N INPUT OUTPUT [REPEATS]   # prints {"spec":..,"seconds":[..]}
//! agg_file attack NAME F N INPUT OUTPUT                # writes the first forged vector

use std::time::Instant;

use neuroshard_aggregate::{Aggregator, Attack};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn read_vectors(path: &str, n: usize) -> Result<Vec<Vec<f32>>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("read {path}: {e}"))?;
    if n == 0 || bytes.len() % (4 * n) != 0 {
        return Err(format!(
            "{path}: {} bytes is not {n} equal f32 vectors",
            bytes.len()
        ));
    }
    let len = bytes.len() / 4 / n;
    Ok(bytes
        .chunks_exact(4 * len)
        .map(|v| {
            v.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        })
        .collect())
}

fn write_vector(path: &str, v: &[f32]) -> Result<(), String> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|e| format!("write {path}: {e}"))
}

fn run(args: &[String]) -> Result<(), String> {
    let parse = |i: usize| -> Result<usize, String> {
        args.get(i)
            .ok_or("missing argument")?
            .parse()
            .map_err(|e| format!("argument {i}: {e}"))
    };
    let arg = |i: usize| {
        args.get(i)
            .map(String::as_str)
            .ok_or_else(|| format!("missing argument {i}"))
    };
    let (mode, spec, f, n, input, output) =
        (arg(1)?, arg(2)?, parse(3)?, parse(4)?, arg(5)?, arg(6)?);
    let inputs = read_vectors(input, n)?;
    match mode {
        "aggregate" => {
            let repeats = if args.len() > 7 { parse(7)? } else { 1 };
            let agg = Aggregator::parse(spec, f).map_err(|e| e.to_string())?;
            let mut seconds = Vec::new();
            let mut out = Vec::new();
            for _ in 0..repeats.max(1) {
                let start = Instant::now();
                out = agg.aggregate(&inputs, None).map_err(|e| e.to_string())?;
                seconds.push(start.elapsed().as_secs_f64());
            }
            write_vector(output, &out)?;
            println!("{{\"spec\":\"{agg}\",\"seconds\":{seconds:?}}}");
        }
        "attack" => {
            let attack: Attack = spec
                .parse()
                .map_err(|e: neuroshard_aggregate::AttackParseError| e.to_string())?;
            let forged = attack.forge(&inputs, f, &mut ChaCha8Rng::seed_from_u64(0));
            write_vector(output, forged.first().ok_or("attack forged nothing")?)?;
        }
        other => return Err(format!("unknown mode {other}")),
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Err(e) = run(&args) {
        eprintln!("agg_file: {e}");
        std::process::exit(1);
    }
}
