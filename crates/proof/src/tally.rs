//! Work tallies: what the receiver of a worker's pipeline outputs signs about them.
//!
//! A tally says "I took the outputs of `jobs` distinct jobs of yours in this round" and
//! carries a small sketch of which: one bit per job key, set in a 192-bit map. Counts from
//! different receivers add up only as far as their jobs differ: a worker that sends one
//! output to three receivers has three tallies of the same jobs, and the union of their
//! sketches shows it ([`distinct_jobs`]). Its estimate grows coarse past about 700 distinct
//! jobs of one worker in one round (a few bits left unset), and it tells nothing once every
//! bit is set (about 1,100 jobs on average); then counts add up as they are.

use crate::proof::Hash32;

/// Bytes of a tally's job sketch: what is left of a receipt's 32-byte hash after the tag and
/// the count.
pub const SKETCH_BYTES: usize = 24;
const SKETCH_BITS: u32 = (SKETCH_BYTES * 8) as u32;
const TAG: &[u8; 4] = b"jobs";

/// One bit per job key (the key's first 8 bytes modulo 192), so the same job sets the same
/// bit at every receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct JobSketch(pub [u8; SKETCH_BYTES]);

impl JobSketch {
    pub fn insert(&mut self, job_key: &Hash32) {
        let mut low = [0u8; 8];
        low.copy_from_slice(&job_key[..8]);
        let bit = u64::from_le_bytes(low) % u64::from(SKETCH_BITS);
        // Below 192, so both casts are lossless.
        self.0[(bit / 8) as usize] |= 1 << (bit % 8);
    }

    pub fn union(&self, other: &Self) -> Self {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0) {
            *a |= b;
        }
        out
    }

    /// Bits set.
    pub fn ones(&self) -> u32 {
        self.0.iter().map(|b| b.count_ones()).sum()
    }

    /// Every bit set: the sketch no longer tells how many jobs it holds.
    pub fn is_full(&self) -> bool {
        self.ones() == SKETCH_BITS
    }
}

/// A receiver's count of one worker's distinct jobs in a round, and their sketch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkTally {
    pub jobs: u32,
    pub sketch: JobSketch,
}

impl WorkTally {
    /// A tally of the jobs with these keys (each counted once).
    pub fn of_keys<'a>(keys: impl IntoIterator<Item = &'a Hash32>) -> Self {
        let keys: std::collections::BTreeSet<&Hash32> = keys.into_iter().collect();
        let mut sketch = JobSketch::default();
        for k in &keys {
            sketch.insert(k);
        }
        Self {
            jobs: u32::try_from(keys.len()).unwrap_or(u32::MAX),
            sketch,
        }
    }

    /// The receipt hash that carries it: tag, count, sketch; one encoding per tally.
    pub fn to_hash(&self) -> Hash32 {
        let mut out = [0u8; 32];
        out[..4].copy_from_slice(TAG);
        out[4..8].copy_from_slice(&self.jobs.to_le_bytes());
        out[8..].copy_from_slice(&self.sketch.0);
        out
    }

    /// The tally a receipt hash carries; `None` for any other 32 bytes, a count of 0, or a
    /// sketch that cannot be of that count (no bit, or more bits than jobs).
    pub fn from_hash(hash: &Hash32) -> Option<Self> {
        if hash[..4] != *TAG {
            return None;
        }
        let jobs = u32::from_le_bytes(hash[4..8].try_into().ok()?);
        let sketch = JobSketch(hash[8..].try_into().ok()?);
        let ones = sketch.ones();
        (jobs > 0 && ones > 0 && ones <= jobs).then_some(Self { jobs, sketch })
    }
}

/// The job count of a tally's receipt hash; `None` for anything else.
pub fn tally_jobs(hash: &Hash32) -> Option<u32> {
    WorkTally::from_hash(hash).map(|t| t.jobs)
}

/// `ESTIMATE[b]`: how many distinct jobs a sketch with `b` bits set holds, by linear
/// counting (the n whose expected bits m·(1 − (1 − 1/m)ⁿ) are `b`, between integers
/// interpolated), in 1/65536ths, computed in integers so every node agrees.
const ESTIMATE: [u64; SKETCH_BITS as usize] = estimates();
const ONE: u128 = 1 << 16;

const fn estimates() -> [u64; SKETCH_BITS as usize] {
    let m = SKETCH_BITS as u128;
    let mut out = [0u64; SKETCH_BITS as usize];
    // (1 − 1/m)ⁿ in 64-bit fixed point, and the expected bits of n jobs in the same unit.
    let mut unset: u128 = 1 << 64;
    let mut n: u128 = 0;
    let mut b = 0usize;
    while b < SKETCH_BITS as usize {
        let want = (b as u128) << 64;
        let mut next = unset * (m - 1) / m;
        while expected_bits(m, next) <= want {
            unset = next;
            next = unset * (m - 1) / m;
            n += 1;
        }
        // expected_bits(m, unset) ≤ want < expected_bits(m, next): n and a fraction.
        let low = expected_bits(m, unset);
        let frac = (want - low) * ONE / (expected_bits(m, next) - low);
        out[b] = (n * ONE + frac) as u64;
        b += 1;
    }
    out
}

/// m·(1 − unset) in 64-bit fixed point: the bits `unset` = (1 − 1/m)ⁿ leaves set.
const fn expected_bits(m: u128, unset: u128) -> u128 {
    m * ((1u128 << 64) - unset)
}

/// Distinct jobs behind one worker's tallies from different receivers: the sum of their
/// counts, scaled down by how much their sketches overlap (the estimated jobs of the union
/// over the sum of each one's estimate). Exact for one tally; for tallies of disjoint jobs
/// within the sketch's noise; for one set of jobs tallied by k receivers, that set's count.
/// A full union sketch says nothing, and the counts add up.
pub fn distinct_jobs(tallies: &[WorkTally]) -> u64 {
    let sum = tallies
        .iter()
        .fold(0u64, |s, t| s.saturating_add(u64::from(t.jobs)));
    let union = tallies
        .iter()
        .fold(JobSketch::default(), |u, t| u.union(&t.sketch));
    if tallies.len() < 2 || union.is_full() {
        return sum;
    }
    let estimate =
        |s: &JobSketch| u128::from(ESTIMATE.get(s.ones() as usize).copied().unwrap_or(u64::MAX));
    let each: u128 = tallies.iter().map(|t| estimate(&t.sketch)).sum();
    if each == 0 {
        return sum;
    }
    let scaled = u128::from(sum) * estimate(&union) / each;
    u64::try_from(scaled).unwrap_or(u64::MAX).min(sum)
}

#[cfg(test)]
mod tests;
