use proptest::prelude::*;

use super::*;

use crate::fixtures::tally_of as tally;

fn key(i: u64) -> Hash32 {
    *blake3::hash(&i.to_le_bytes()).as_bytes()
}

#[test]
fn a_tally_has_one_encoding_and_only_consistent_ones_decode() {
    let t = tally(0..80);
    assert_eq!(t.jobs, 80);
    assert_eq!(WorkTally::from_hash(&t.to_hash()), Some(t));
    assert_eq!(tally_jobs(&t.to_hash()), Some(80));
    let mut other_tag = t.to_hash();
    other_tag[0] = b'J';
    assert_eq!(WorkTally::from_hash(&other_tag), None);
    let no_jobs = WorkTally { jobs: 0, ..t };
    assert_eq!(
        WorkTally::from_hash(&no_jobs.to_hash()),
        None,
        "no jobs is no tally"
    );
    let no_bits = WorkTally {
        jobs: 3,
        sketch: JobSketch::default(),
    };
    assert_eq!(WorkTally::from_hash(&no_bits.to_hash()), None);
    let too_many_bits = WorkTally {
        jobs: 2,
        ..tally(0..20)
    };
    assert_eq!(WorkTally::from_hash(&too_many_bits.to_hash()), None);
    assert_eq!(WorkTally::from_hash(&[0; 32]), None);
}

#[test]
fn a_job_counts_once_and_sets_the_same_bit_everywhere() {
    let keys = [key(1), key(1), key(2)];
    let t = WorkTally::of_keys(&keys);
    assert_eq!(t.jobs, 2);
    assert_eq!(tally(1..2).sketch.union(&tally(2..3).sketch), t.sketch);
}

#[test]
fn the_estimate_table_is_linear_counting() {
    let jobs = |b: usize| ESTIMATE[b] as f64 / ONE as f64;
    assert_eq!(ESTIMATE[0], 0);
    assert!(ESTIMATE.windows(2).all(|w| w[0] < w[1]));
    // −m·ln(1 − b/m), to within the interpolation.
    for b in [1, 12, 96, 150, 191] {
        let exact = -192.0 * (1.0 - b as f64 / 192.0).ln();
        assert!(
            (jobs(b) - exact).abs() < 0.02 * exact,
            "{b}: {} vs {exact}",
            jobs(b)
        );
    }
}

/// The attack the sketch answers: a worker sends each of its jobs to three receivers, so
/// three honest tallies count the same jobs. They add up to the jobs once, not three times;
/// a worker whose receivers took different jobs keeps (about) their sum.
#[test]
fn one_output_sent_to_three_receivers_counts_once() {
    for jobs in [10, 40, 120, 300] {
        let same = vec![tally(0..jobs); 3];
        assert_eq!(distinct_jobs(&same), jobs, "three copies of {jobs} jobs");
        let split = [
            tally(0..jobs),
            tally(jobs..2 * jobs),
            tally(2 * jobs..3 * jobs),
        ];
        let apart = distinct_jobs(&split) as f64 / (3 * jobs) as f64;
        assert!(apart > 0.8, "{jobs} jobs each to three receivers: {apart}");
        let half = [tally(0..jobs), tally(jobs / 2..jobs / 2 + jobs)];
        let overlap = distinct_jobs(&half) as f64 / (jobs + jobs / 2) as f64;
        assert!(
            (0.8..=1.15).contains(&overlap),
            "half overlap at {jobs}: {overlap}"
        );
    }
}

/// Honest workers are barely touched: over many disjoint splits the estimate stays close to
/// the sum (noise, and never above it).
#[test]
fn disjoint_tallies_keep_nearly_their_sum() {
    let mut worst: f64 = 1.0;
    let mut total = 0.0;
    for seed in 0..200u64 {
        let a = 20 + seed % 60;
        let b = 10 + (seed * 7) % 50;
        let base = seed * 1_000;
        let t = [tally(base..base + a), tally(base + a..base + a + b)];
        let r = distinct_jobs(&t) as f64 / (a + b) as f64;
        assert!(r <= 1.0);
        worst = worst.min(r);
        total += r;
    }
    assert!(total / 200.0 > 0.95, "mean {}", total / 200.0);
    assert!(worst > 0.75, "worst {worst}");
}

#[test]
fn a_full_sketch_tells_nothing_and_counts_add_up() {
    let t = [tally(0..5_000), tally(0..5_000)];
    assert!(t[0].sketch.is_full());
    assert_eq!(distinct_jobs(&t), 10_000);
    assert_eq!(distinct_jobs(&[]), 0);
}

proptest! {
    /// Never more than the counts' sum; one tally, or copies of one, count exactly its jobs.
    #[test]
    fn distinct_jobs_is_bounded_by_the_counts(
        sets in proptest::collection::vec((0u64..10_000, 1u64..400), 1..8),
        copies in 1usize..6,
    ) {
        let tallies: Vec<WorkTally> = sets.iter().map(|(at, n)| tally(*at..*at + *n)).collect();
        let sum: u64 = tallies.iter().map(|t| u64::from(t.jobs)).sum();
        prop_assert!(distinct_jobs(&tallies) <= sum);
        let one = tallies[0];
        prop_assert_eq!(distinct_jobs(&vec![one; copies]), u64::from(one.jobs));
    }

    /// Any 32 bytes decode to a consistent tally or to nothing, and a decoded one re-encodes
    /// to the same bytes.
    #[test]
    fn decoding_is_strict(bytes in any::<[u8; 32]>(), jobs in 1u32..1_000) {
        let mut hash = bytes;
        hash[..4].copy_from_slice(b"jobs");
        hash[4..8].copy_from_slice(&jobs.to_le_bytes());
        if let Some(t) = WorkTally::from_hash(&hash) {
            prop_assert_eq!(t.to_hash(), hash);
            prop_assert!(t.sketch.ones() <= t.jobs);
        }
    }
}
