//! Throughput of each aggregator on 16 inputs × 10M floats (640 MB read per call).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use neuroshard_aggregate::Aggregator;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const N: usize = 16;
const LEN: usize = 10_000_000;

fn bench(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let inputs: Vec<Vec<f32>> = (0..N)
        .map(|_| (0..LEN).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect();
    let mut group = c.benchmark_group("aggregate_16x10M");
    group.sample_size(10);
    group.throughput(Throughput::Bytes((N * LEN * 4) as u64));
    for spec in [
        "mean",
        "trimmed-mean",
        "median",
        "krum",
        "multi-krum",
        "geometric-median:iters=3",
        "centered-clipping:tau=100,iters=1",
    ] {
        let agg = match Aggregator::parse(spec, 3) {
            Ok(a) => a,
            Err(e) => panic!("bench spec {spec}: {e}"),
        };
        group.bench_function(spec, |b| b.iter(|| agg.aggregate(&inputs, None)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
