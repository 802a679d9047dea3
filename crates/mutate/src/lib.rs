//! Test support for decoders of untrusted bytes.
//!
//! Uniformly random bytes almost never get past a decoder's first check (a version byte, a
//! domain tag), so "never panics" tests built on them prove little. Here a test starts from a
//! *valid* encoding and applies a few [`Mutation`]s: flipped bits, overwritten bytes,
//! truncation, extension, spliced copies and integer/varint "length fields" set to edge values.
//! Most mutants then fail deep inside the decoder, where the interesting bugs are.
//!
//! [`TrackingAlloc`] with [`largest_allocation`] lets a test assert that a decoder never asks
//! for an allocation out of proportion to its input (a length field read as a capacity).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;

/// One edit of a byte string. Positions are taken modulo the current length at apply time, so
/// one mutation strategy fits messages of every size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// XOR one byte with a non-zero mask.
    Flip { at: usize, mask: u8 },
    /// Overwrite one byte.
    Set { at: usize, byte: u8 },
    /// Keep only the first `at` bytes.
    Truncate { at: usize },
    /// Append bytes.
    Extend { bytes: Vec<u8> },
    /// Insert bytes at a position.
    Insert { at: usize, bytes: Vec<u8> },
    /// Remove up to `len` bytes from a position.
    Remove { at: usize, len: usize },
    /// Copy a span of the message to another position (repeats a field or a record).
    Splice { from: usize, len: usize, to: usize },
    /// Overwrite a little-endian integer of `width` bytes (1, 2, 4 or 8): a length, count or
    /// size field set to an edge value.
    SetInt { at: usize, width: u8, value: u64 },
    /// Overwrite bytes with the LEB128 encoding of `value` (varint length fields).
    SetVarint { at: usize, value: u64 },
}

/// Applies `mutations` in order to a copy of `bytes`.
pub fn apply(bytes: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for m in mutations {
        apply_one(&mut out, m);
    }
    out
}

fn apply_one(out: &mut Vec<u8>, m: &Mutation) {
    let n = out.len();
    let pos = |at: usize| if n == 0 { 0 } else { at % n };
    match m {
        Mutation::Flip { at, mask } if n > 0 => out[pos(*at)] ^= (*mask).max(1),
        Mutation::Set { at, byte } if n > 0 => out[pos(*at)] = *byte,
        Mutation::Truncate { at } => out.truncate(pos(*at)),
        Mutation::Extend { bytes } => out.extend_from_slice(bytes),
        Mutation::Insert { at, bytes } => {
            let at = if n == 0 { 0 } else { at % (n + 1) };
            out.splice(at..at, bytes.iter().copied());
        }
        Mutation::Remove { at, len } if n > 0 => {
            let at = pos(*at);
            let end = at.saturating_add(*len).min(n);
            out.drain(at..end);
        }
        Mutation::Splice { from, len, to } if n > 0 => {
            let from = pos(*from);
            let end = from.saturating_add(*len).min(n);
            let span = out[from..end].to_vec();
            let to = to % (n + 1);
            out.splice(to..to, span);
        }
        Mutation::SetInt { at, width, value } if n > 0 => {
            let at = pos(*at);
            let bytes = value.to_le_bytes();
            let width = usize::from(*width).clamp(1, 8);
            for (i, b) in bytes[..width].iter().enumerate() {
                if let Some(slot) = out.get_mut(at + i) {
                    *slot = *b;
                }
            }
        }
        Mutation::SetVarint { at, value } if n > 0 => {
            let at = pos(*at);
            let mut v = *value;
            let mut encoded = Vec::new();
            while v >= 0x80 {
                encoded.push((v as u8) | 0x80);
                v >>= 7;
            }
            encoded.push(v as u8);
            for (i, b) in encoded.into_iter().enumerate() {
                match out.get_mut(at + i) {
                    Some(slot) => *slot = b,
                    None => out.push(b),
                }
            }
        }
        // Edits of an empty message that need a byte to act on.
        _ => {}
    }
}

/// Integers that break length and count checks: zero, one, powers of two and their
/// neighbours, and the maxima of every width.
fn edge_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(0x7f),
        Just(0x80),
        Just(0xff),
        Just(0xffff),
        Just(0x7fff_ffff),
        Just(0xffff_ffff),
        Just(0x7f7f_ffff),           // f32::MAX
        Just(0x7ff0_0000_0000_0000), // f64 infinity
        Just(1 << 32),
        Just(i64::MAX as u64),
        Just(u64::MAX),
        (0u32..64).prop_map(|s| 1u64 << s),
        (0u32..64).prop_map(|s| (1u64 << s) - 1),
        any::<u64>(),
        0u64..1024,
    ]
}

/// One random mutation.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    let small_bytes = || prop::collection::vec(any::<u8>(), 1..24);
    prop_oneof![
        4 => (at, 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        2 => (at, any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        2 => at.prop_map(|at| Mutation::Truncate { at }),
        1 => small_bytes().prop_map(|bytes| Mutation::Extend { bytes }),
        1 => (at, small_bytes()).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (at, 1usize..64).prop_map(|(at, len)| Mutation::Remove { at, len }),
        1 => (at, 1usize..128, at)
            .prop_map(|(from, len, to)| Mutation::Splice { from, len, to }),
        3 => (at, prop_oneof![Just(1u8), Just(2), Just(4), Just(8)], edge_value())
            .prop_map(|(at, width, value)| Mutation::SetInt { at, width, value }),
        2 => (at, edge_value()).prop_map(|(at, value)| Mutation::SetVarint { at, value }),
    ]
}

/// One to four mutations, applied in order.
pub fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..=4)
}

thread_local! {
    // Const-initialised and without destructors, so the allocator can touch them without
    // allocating or running into thread teardown.
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn record(size: usize) {
    let _ = TRACKING.try_with(|on| {
        if on.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

/// The system allocator, noting the largest single request made on each thread while
/// [`largest_allocation`] runs there. Install it in a test binary with
/// `#[global_allocator] static ALLOC: TrackingAlloc = TrackingAlloc;`.
pub struct TrackingAlloc;

// SAFETY: every call is forwarded unchanged to `System`; the bookkeeping only touches
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for TrackingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns its result with the largest single allocation (in bytes) it made on
/// this thread. Panics if [`TrackingAlloc`] is not the global allocator, so a test cannot
/// pass by measuring nothing.
pub fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    TRACKING.with(|on| on.set(true));
    LARGEST.with(|l| l.set(0));
    let probe: Vec<u8> = Vec::with_capacity(std::hint::black_box(4096));
    drop(std::hint::black_box(probe));
    let installed = LARGEST.with(|l| l.get()) >= 4096;
    LARGEST.with(|l| l.set(0));
    let out = f();
    let largest = LARGEST.with(|l| l.get());
    TRACKING.with(|on| on.set(false));
    assert!(
        installed,
        "largest_allocation needs `#[global_allocator] static A: TrackingAlloc = TrackingAlloc;`"
    );
    (out, largest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOC: TrackingAlloc = TrackingAlloc;

    #[test]
    fn edits_by_hand() {
        let base = [1u8, 2, 3, 4, 5];
        assert_eq!(
            apply(&base, &[Mutation::Flip { at: 6, mask: 0x80 }]),
            [1, 0x82, 3, 4, 5]
        );
        assert_eq!(apply(&base, &[Mutation::Truncate { at: 2 }]), [1, 2]);
        assert_eq!(
            apply(&base, &[Mutation::Remove { at: 3, len: 9 }]),
            [1, 2, 3]
        );
        assert_eq!(
            apply(
                &base,
                &[Mutation::SetInt {
                    at: 3,
                    width: 4,
                    value: 0x0102_0304
                }]
            ),
            [1, 2, 3, 4, 3]
        );
        assert_eq!(
            apply(&base, &[Mutation::SetVarint { at: 4, value: 300 }]),
            [1, 2, 3, 4, 0xac, 0x02]
        );
        assert_eq!(
            apply(
                &base,
                &[Mutation::Splice {
                    from: 0,
                    len: 2,
                    to: 5
                }]
            ),
            [1, 2, 3, 4, 5, 1, 2]
        );
        assert_eq!(apply(&[], &[Mutation::Flip { at: 0, mask: 1 }]), [0u8; 0]);
    }

    #[test]
    fn tracks_the_largest_request() {
        let (len, largest) = largest_allocation(|| vec![0u8; 100_000].len());
        assert_eq!(len, 100_000);
        assert!(largest >= 100_000);
        let ((), small) = largest_allocation(|| ());
        assert!(small < 100_000);
    }
}
