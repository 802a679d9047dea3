use super::*;
use proptest::prelude::*;

fn spec(fraction: f64, chunk: usize, values: ValueCoding) -> CompressSpec {
    CompressSpec {
        fraction,
        chunk,
        values,
    }
}

/// Top-k per chunk by (|a| descending, index ascending), computed naively.
fn naive_topk(a: &[f32], spec: &CompressSpec) -> Vec<usize> {
    let mut all = Vec::new();
    for (c, chunk) in a.chunks(spec.chunk).enumerate() {
        let mut idx: Vec<usize> = (0..chunk.len()).collect();
        idx.sort_by(|&i, &j| chunk[j].abs().total_cmp(&chunk[i].abs()).then(i.cmp(&j)));
        idx.truncate(spec.keep(chunk.len()));
        idx.sort_unstable();
        all.extend(idx.into_iter().map(|i| c * spec.chunk + i));
    }
    all
}

fn coding() -> impl Strategy<Value = ValueCoding> {
    prop_oneof![
        Just(ValueCoding::F32),
        Just(ValueCoding::Int8),
        Just(ValueCoding::Int2)
    ]
}

proptest! {
    #[test]
    fn error_feedback_and_round_trip(
        rounds in prop::collection::vec(prop::collection::vec(-100.0f32..100.0, 37), 1..4),
        fraction in 0.01f64..=1.0,
        chunk in 1usize..20,
        values in coding(),
    ) {
        let spec = spec(fraction, chunk, values);
        let mut comp = Compressor::new(spec, 37);
        for delta in &rounds {
            let acc: Vec<f32> = comp.residual().iter().zip(delta).map(|(r, d)| r + d).collect();
            let bytes = comp.compress(delta).unwrap();
            let sent = decode(&bytes, 37).unwrap();
            let picked = naive_topk(&acc, &spec);
            for i in 0..37 {
                // Residual + sent reproduces the error-compensated input, up to the rounding of
                // one f32 subtraction at the scale of the larger operand.
                let total = comp.residual()[i] + sent[i];
                let scale = acc[i].abs().max(sent[i].abs());
                prop_assert!((total - acc[i]).abs() <= 1e-6 * scale, "i={i} {total} vs {}", acc[i]);
                if !picked.contains(&i) {
                    prop_assert_eq!(sent[i], 0.0);
                    prop_assert_eq!(comp.residual()[i], acc[i]);
                }
            }
            // Value error per chunk is bounded by the quantizer step.
            for (c, range) in acc.chunks(chunk).enumerate() {
                let ids: Vec<usize> = picked.iter().copied().filter(|&i| i / chunk == c).collect();
                let m = ids.iter().map(|&i| acc[i].abs()).fold(0.0f32, f32::max);
                let bound = match values {
                    ValueCoding::F32 => 0.0,
                    ValueCoding::Int8 => m / 127.0 / 2.0,
                    ValueCoding::Int2 => m / 3.0,
                } * 1.0001 + 1e-6;
                prop_assert!(range.len() >= ids.len());
                for &i in &ids {
                    prop_assert!((sent[i] - acc[i]).abs() <= bound, "i={i} sent {} acc {}", sent[i], acc[i]);
                }
            }
        }
    }

    #[test]
    fn indices_are_exact(a in prop::collection::vec(-1e3f32..1e3, 1..300), fraction in 0.001f64..0.5, chunk in 1usize..64) {
        let spec = spec(fraction, chunk, ValueCoding::Int2);
        let bytes = Compressor::new(spec, a.len()).compress(&a).unwrap();
        let mut r = Reader::new(&bytes);
        r.take(2).unwrap();
        r.varint().unwrap();
        r.varint().unwrap();
        let picked = naive_topk(&a, &spec);
        let mut decoded = Vec::new();
        for (c, part) in a.chunks(chunk).enumerate() {
            let count = r.varint().unwrap() as usize;
            r.f32().unwrap();
            let mut next = 0;
            for _ in 0..count {
                if count == part.len() {
                    decoded.push(c * chunk + next);
                    next += 1;
                    continue;
                }
                let i = next + r.varint().unwrap() as usize;
                decoded.push(c * chunk + i);
                next = i + 1;
            }
            r.take(count.div_ceil(4)).unwrap();
        }
        prop_assert!(r.at_end());
        prop_assert_eq!(decoded, picked);
    }

    #[test]
    fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64), len in 0usize..40) {
        let _ = decode(&bytes, len);
    }
}

#[test]
fn exact_byte_count_by_hand() {
    // Header: version, coding, len = 10, chunk = 10 (one byte each). One chunk: count 2, scale
    // (4 bytes), indices 3 and 7 as 3 and 7 − 3 − 1 = 3, and one byte holding two 2-bit codes.
    let a = [0.0f32, 0.1, 0.0, 5.0, 0.0, 0.0, 0.0, -4.0, 0.2, 0.0];
    let mut comp = Compressor::new(spec(0.2, 10, ValueCoding::Int2), 10);
    let bytes = comp.compress(&a).unwrap();
    assert_eq!(bytes.len(), 4 + 1 + 4 + 2 + 1);
    assert_eq!(&bytes[9..11], &[3, 3]);
    let sent = decode(&bytes, 10).unwrap();
    // Levels for m = 5: −5, −5/3, 5/3, 5. −4 rounds to −5.
    assert_eq!(sent[3], 5.0);
    assert_eq!(sent[7], -5.0);
    assert_eq!(comp.residual()[7], 1.0);
    assert_eq!(comp.residual()[1], 0.1);
}

#[test]
fn one_percent_two_bit_is_over_100x_smaller() {
    let n = 1 << 20;
    let a: Vec<f32> = (0..n)
        .map(|i| ((i as f32) * 0.618).sin() * (1.0 + (i % 7) as f32))
        .collect();
    let bytes = Compressor::new("topk:0.01:int2".parse().unwrap(), n)
        .compress(&a)
        .unwrap();
    let ratio = (4 * n) as f64 / bytes.len() as f64;
    assert!(ratio >= 100.0, "ratio {ratio}");
}

#[test]
fn dense_coding_has_no_indices() {
    let a: Vec<f32> = (0..100).map(|i| i as f32 - 50.0).collect();
    let bytes = Compressor::new(spec(1.0, 100, ValueCoding::Int8), 100)
        .compress(&a)
        .unwrap();
    assert_eq!(bytes.len(), 4 + 1 + 4 + 100);
    let back = decode(&bytes, 100).unwrap();
    assert!(
        back.iter()
            .zip(&a)
            .all(|(b, a)| (b - a).abs() <= 50.0 / 127.0 / 2.0 + 1e-5)
    );
    let fp = Compressor::new(spec(1.0, 100, ValueCoding::F32), 100)
        .compress(&a)
        .unwrap();
    assert_eq!(decode(&fp, 100).unwrap(), a);
}

#[test]
fn rejects_bad_input_and_messages() {
    let mut comp = Compressor::new(spec(0.5, 4, ValueCoding::Int8), 8);
    assert_eq!(
        comp.compress(&[0.0; 7]),
        Err(CompressError::LengthMismatch {
            len: 7,
            expected: 8
        })
    );
    let mut bad = [1.0f32; 8];
    bad[5] = f32::NAN;
    assert_eq!(
        comp.compress(&bad),
        Err(CompressError::NonFinite { index: 5 })
    );
    assert!(comp.residual().iter().all(|&r| r == 0.0));
    let good = comp
        .compress(&[1.0, -2.0, 3.0, 4.0, 0.5, 0.0, 0.0, 9.0])
        .unwrap();
    assert!(decode(&good, 8).is_ok());
    for cut in 0..good.len() {
        assert!(decode(&good[..cut], 8).is_err(), "prefix {cut}");
    }
    let mut long = good.clone();
    long.push(0);
    assert_eq!(decode(&long, 8), Err(DecodeError::Trailing(1)));
    assert_eq!(
        decode(&good, 9),
        Err(DecodeError::Length {
            len: 8,
            expected: 9
        })
    );
    let mut version = good.clone();
    version[0] = 9;
    assert_eq!(decode(&version, 8), Err(DecodeError::Version(9)));
    // First chunk: count 2 then scale; an index gap pointing past the chunk is rejected.
    let mut index = good.clone();
    index[9] = 9;
    assert!(matches!(
        decode(&index, 8),
        Err(DecodeError::Index { chunk: 0 })
    ));
}

#[test]
fn spec_parsing() {
    let s: CompressSpec = "topk:0.01:int2".parse().unwrap();
    assert_eq!(s, spec(0.01, 4096, ValueCoding::Int2));
    assert_eq!(s.to_string().parse::<CompressSpec>().unwrap(), s);
    assert_eq!(
        "int8:chunk=512".parse::<CompressSpec>().unwrap(),
        spec(1.0, 512, ValueCoding::Int8)
    );
    for bad in ["topk", "topk:0", "topk:2", "int3", "chunk=0", "topk:x"] {
        assert!(bad.parse::<CompressSpec>().is_err(), "{bad}");
    }
}
