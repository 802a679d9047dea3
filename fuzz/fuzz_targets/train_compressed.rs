//! A compressed pseudo-gradient. The first two bytes give the expected vector length (as the
//! receiver knows it); an accepted message decodes to that many finite values. A message in
//! the low-rank encoding (first byte `L`) is decoded on a fixed layout (one 16 × 16 matrix
//! first, the rest dense) and a seeded basis of the rank it names, in the coding its third
//! byte names modulo four (so every coding's decoder is reached, and a mismatch is refused).
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuroshard_train::ValueCoding;
use neuroshard_train::lowrank::{self, Basis, Layout, Matrix};

const CODINGS: [ValueCoding; 4] = [
    ValueCoding::F32,
    ValueCoding::Int8,
    ValueCoding::Int2,
    ValueCoding::Sign,
];

fuzz_target!(|data: &[u8]| {
    let Some((len, msg)) = data.split_first_chunk::<2>() else {
        return;
    };
    let len = usize::from(u16::from_le_bytes(*len));
    if msg.first() == Some(&b'L') {
        let rank = usize::from(msg.get(1).copied().unwrap_or(1)).clamp(1, 4);
        let matrix = Matrix {
            offset: 0,
            rows: 16,
            cols: 16,
        };
        let Ok(layout) = Layout::new(len, &[matrix], rank) else {
            return;
        };
        let Ok(basis) = Basis::for_round(&layout, rank, None, 1, 0) else {
            return;
        };
        let coding = CODINGS[usize::from(msg.get(2).copied().unwrap_or(0) % 4)];
        if let Ok(values) = lowrank::decode(&layout, &basis, coding, msg) {
            assert_eq!(values.len(), len);
            assert!(values.iter().all(|v| v.is_finite()));
        }
        return;
    }
    if let Ok(values) = neuroshard_train::decode(msg, len) {
        assert_eq!(values.len(), len);
        assert!(values.iter().all(|v| v.is_finite()));
    }
});
