use super::*;
use proptest::prelude::*;

fn spec(fraction: f64, chunk: usize, values: ValueCoding) -> CompressSpec {
    CompressSpec {
        fraction,
        chunk,
        values,
        selection: Selection::TopK,
        dct: false,
        low_rank: None,
    }
}

fn randk(fraction: f64, chunk: usize, values: ValueCoding) -> CompressSpec {
    CompressSpec {
        selection: Selection::Random,
        ..spec(fraction, chunk, values)
    }
}

fn sq(v: impl IntoIterator<Item = f32>) -> f64 {
    v.into_iter().map(|x| f64::from(x).powi(2)).sum()
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
        Just(ValueCoding::Int2),
        Just(ValueCoding::Sign)
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
            // Per chunk, the quantizer keeps every sign and never does worse than sending
            // nothing (the old 2-bit levels ±m/3, ±m sent every small value as ±m/3 and failed
            // this); int8 stays within half a step of max|v| / 127.
            for (c, range) in acc.chunks(chunk).enumerate() {
                let ids: Vec<usize> = picked.iter().copied().filter(|&i| i / chunk == c).collect();
                prop_assert!(range.len() >= ids.len());
                let err = sq(ids.iter().map(|&i| sent[i] - acc[i]));
                let energy = sq(ids.iter().map(|&i| acc[i]));
                prop_assert!(err <= energy * (1.0 + 1e-5) + 1e-9, "chunk {c}: error {err} > {energy}");
                let m = ids.iter().map(|&i| acc[i].abs()).fold(0.0f32, f32::max);
                for &i in &ids {
                    if acc[i].abs() > 1e-6 * m && values != ValueCoding::Int8 {
                        prop_assert_eq!(sent[i] > 0.0, acc[i] > 0.0, "sign at {}", i);
                    }
                    if values == ValueCoding::Int8 {
                        prop_assert!((sent[i] - acc[i]).abs() <= m / 254.0 * 1.0001 + 1e-6);
                    }
                }
            }
        }
    }

    #[test]
    fn random_masks_are_shared_and_fresh(
        a in prop::collection::vec(-10.0f32..10.0, 1..300),
        b in prop::collection::vec(-10.0f32..10.0, 300),
        fraction in 0.01f64..=1.0,
        chunk in 1usize..64,
        seed in any::<u64>(),
        values in coding(),
    ) {
        // Two replicas with the same seed and round send values on the same coordinates, the
        // exact count per chunk, and nothing else; their residual + sent is their input.
        let spec = randk(fraction, chunk, values);
        let b = &b[..a.len()];
        let mut one = Compressor::with_seed(spec, a.len(), seed);
        let mut two = Compressor::with_seed(spec, a.len(), seed);
        let (ma, mb) = (one.compress(&a).unwrap(), two.compress(b).unwrap());
        let (sa, sb) = (decode(&ma, a.len()).unwrap(), decode(&mb, a.len()).unwrap());
        for (c, part) in a.chunks(chunk).enumerate() {
            let keep = spec.keep(part.len());
            let range = c * chunk..c * chunk + part.len();
            let sent_a = range.clone().filter(|&i| one.residual()[i] != a[i] || sa[i] != 0.0);
            prop_assert!(sent_a.count() <= keep);
            for i in range {
                prop_assert!((one.residual()[i] + sa[i] - a[i]).abs() <= 1e-5 * a[i].abs().max(1.0));
                prop_assert!((two.residual()[i] + sb[i] - b[i]).abs() <= 1e-5 * b[i].abs().max(1.0));
                // Where one replica sent nothing the other did not either.
                // (Int8 may round a small sent value to 0, so it is left out of this check.)
                if one.residual()[i] == a[i] && sa[i] == 0.0 && a[i] != 0.0 && values != ValueCoding::Int8 {
                    prop_assert_eq!(sb[i], 0.0);
                }
            }
        }
        prop_assert_eq!(one.round(), 1);
        prop_assert_eq!(one.mask_seed(), two.mask_seed());
    }

    #[test]
    fn indices_are_exact(a in prop::collection::vec(-1e3f32..1e3, 1..300), fraction in 0.001f64..0.5, chunk in 1usize..64) {
        let spec = spec(fraction, chunk, ValueCoding::Int2);
        let bytes = Compressor::new(spec, a.len()).compress(&a).unwrap();
        let mut r = Reader::new(&bytes);
        r.take(3).unwrap();
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

    /// Valid messages of every spec, mutated: decoding returns Ok or Err, never panics, never
    /// allocates beyond the output and one chunk's mask, and an Ok vector is finite.
    #[test]
    fn mutated_messages_decode_or_fail_cleanly(
        a in prop::collection::vec(-1e3f32..1e3, 0..300),
        fraction in 0.01f64..=1.0,
        chunk in 1usize..200,
        values in coding(),
        random in any::<bool>(),
        dct in any::<bool>(),
        seed in any::<u64>(),
        mutations in neuroshard_mutate::mutations(),
    ) {
        let spec = CompressSpec {
            fraction,
            chunk,
            values,
            selection: if random { Selection::Random } else { Selection::TopK },
            dct,
            low_rank: None,
        };
        let msg = Compressor::with_seed(spec, a.len(), seed).compress(&a).unwrap();
        prop_assert_eq!(decode(&msg, a.len()).map(|v| v.len()), Ok(a.len()));
        let bad = neuroshard_mutate::apply(&msg, &mutations);
        let (decoded, largest) = neuroshard_mutate::largest_allocation(|| decode(&bad, a.len()));
        prop_assert!(largest <= 8 * a.len() + 1024, "{largest} bytes for {} values", a.len());
        if let Ok(v) = decoded {
            prop_assert_eq!(v.len(), a.len());
            prop_assert!(v.iter().all(|x| x.is_finite()), "non-finite output from {bad:?}");
        }
    }

    /// A valid message, mutated, read by a receiver that expects another length: an Ok
    /// vector has the expected length, whatever the message claims.
    #[test]
    fn mutated_messages_for_another_length(
        a in prop::collection::vec(-1e3f32..1e3, 1..200),
        spec in prop_oneof![
            Just("topk:0.1:int8:chunk=64"),
            Just("randk:0.25:int2:chunk=50"),
            Just("topk:0.5:int8:chunk=16:dct"),
            Just("topk:1:fp32:chunk=300"),
        ],
        expected in 0usize..400,
        mutations in neuroshard_mutate::mutations(),
    ) {
        let spec: CompressSpec = spec.parse().unwrap();
        let msg = Compressor::with_seed(spec, a.len(), 3).compress(&a).unwrap();
        let bad = neuroshard_mutate::apply(&msg, &mutations);
        let (decoded, largest) = neuroshard_mutate::largest_allocation(|| decode(&bad, expected));
        prop_assert!(largest <= 8 * expected + 1024, "{largest} bytes for {expected} values");
        if let Ok(v) = decoded {
            prop_assert_eq!(v.len(), expected);
        }
        if expected != a.len() {
            prop_assert!(decode(&msg, expected).is_err());
        }
    }
}

#[global_allocator]
static ALLOC: neuroshard_mutate::TrackingAlloc = neuroshard_mutate::TrackingAlloc;

#[test]
fn exact_byte_count_by_hand() {
    // Header: version, coding, selection, len = 10, chunk = 10 (one byte each). One chunk:
    // count 2, scale (4 bytes), indices 3 and 7 as 3 and 7 − 3 − 1 = 3, and one byte holding
    // two 2-bit codes.
    let a = [0.0f32, 0.1, 0.0, 5.0, 0.0, 0.0, 0.0, -4.0, 0.2, 0.0];
    let mut comp = Compressor::new(spec(0.2, 10, ValueCoding::Int2), 10);
    let bytes = comp.compress(&a).unwrap();
    assert_eq!(bytes.len(), 5 + 1 + 4 + 2 + 1);
    assert_eq!(&bytes[10..12], &[3, 3]);
    let sent = decode(&bytes, 10).unwrap();
    // Lloyd from a = rms / 2 = 2.26: both values are ≥ 2a, so code ±3a and a = (5 + 4)·3 / 18
    // = 1.5: 5 → 4.5, −4 → −4.5 (the old levels ±m/3, ±m sent 5 and −5).
    assert_eq!(sent[3], 4.5);
    assert_eq!(sent[7], -4.5);
    assert_eq!(comp.residual()[3], 0.5);
    assert_eq!(comp.residual()[7], 0.5);
    assert_eq!(comp.residual()[1], 0.1);
}

#[test]
fn two_bit_levels_by_hand() {
    // Dense chunk of 0.1, 0.2, −1, 3: rms = 1.585, a₀ = 0.79; codes +a, +a, −a, +3a;
    // a = (0.1 + 0.2 + 1 + 9) / 12 = 0.858 (2a = 1.72, codes unchanged from here on).
    let a = [0.1f32, 0.2, -1.0, 3.0];
    let mut comp = Compressor::new(spec(1.0, 4, ValueCoding::Int2), 4);
    let sent = decode(&comp.compress(&a).unwrap(), 4).unwrap();
    let s = 10.3f32 / 12.0;
    let want = [s, s, -s, 3.0 * s];
    for (x, y) in sent.iter().zip(want) {
        assert!((x - y).abs() < 1e-6, "{sent:?} vs {want:?}");
    }
    // The old quantizer (levels ±1, ±3 for m = 3) sent 1, 1, −1, 3: squared error 1.45
    // against 1.21 here.
    assert!(sq(sent.iter().zip(&a).map(|(x, y)| x - y)) < 1.22);
}

#[test]
fn sign_coding_by_hand() {
    // Scale = mean |v| = (1 + 2 + 3 + 6) / 4 = 3; eight values per byte, low bit first.
    let a = [1.0f32, -2.0, 3.0, -6.0];
    let mut comp = Compressor::new(spec(1.0, 4, ValueCoding::Sign), 4);
    let bytes = comp.compress(&a).unwrap();
    assert_eq!(bytes.len(), 5 + 1 + 4 + 1);
    assert_eq!(bytes[10], 0b0101);
    assert_eq!(decode(&bytes, 4).unwrap(), vec![3.0, -3.0, 3.0, -3.0]);
    assert_eq!(comp.residual(), &[-2.0, 1.0, 0.0, -3.0]);
}

#[test]
fn random_mask_sends_no_indices_and_changes_every_round() {
    // 4 chunks of 4096, a quarter each at one bit: header (5 bytes + the seed varint), then per
    // chunk count (2 bytes), scale (4) and 1024 bits (128 bytes). 16384 · 4 / 552 ≈ 118×.
    let n = 4 * 4096;
    let a: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.618).sin()).collect();
    let spec: CompressSpec = "randk:0.25:sign".parse().unwrap();
    let mut comp = Compressor::with_seed(spec, n, 7);
    let seed_len = crate::varint::len(comp.mask_seed());
    let first = comp.compress(&a).unwrap();
    // Header: version, coding, selection, len (3 bytes), chunk (2 bytes), seed.
    assert_eq!(first.len(), 8 + seed_len + 4 * (2 + 4 + 128));
    assert!((4 * n) as f64 / first.len() as f64 > 100.0);
    let zero = vec![0.0f32; n];
    let mut fresh = Compressor::with_seed(spec, n, 7);
    fresh.set_round(1);
    let second = decode(&fresh.compress(&a).unwrap(), n).unwrap();
    let first = decode(&first, n).unwrap();
    let both = (0..n)
        .filter(|&i| first[i] != 0.0 && second[i] != 0.0)
        .count();
    // Independent quarters overlap on about a sixteenth.
    assert!((800..1250).contains(&both), "{both}");
    assert_ne!(first, zero);
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
    assert_eq!(bytes.len(), 5 + 1 + 4 + 100);
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
    let mut selection = good.clone();
    selection[2] = 7;
    assert_eq!(decode(&selection, 8), Err(DecodeError::Selection(7)));
    // First chunk: count 2 then scale; an index gap pointing past the chunk is rejected.
    let mut index = good.clone();
    index[10] = 9;
    assert!(matches!(
        decode(&index, 8),
        Err(DecodeError::Index { chunk: 0 })
    ));
}

#[test]
fn dct_coefficients_that_overflow_are_rejected() {
    // One full 64-value block of fp32 coefficients near f32::MAX: each is finite, but the
    // inverse transform sums them past f32::MAX.
    let mut msg = vec![VERSION, ValueCoding::F32.tag(), DCT_FLAG];
    varint::put(&mut msg, 64);
    varint::put(&mut msg, 64);
    varint::put(&mut msg, 64);
    for _ in 0..64 {
        msg.extend_from_slice(&3.0e38f32.to_le_bytes());
    }
    assert_eq!(decode(&msg, 64), Err(DecodeError::NonFinite { chunk: 0 }));
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
    let r: CompressSpec = "randk:0.25:sign:chunk=1024".parse().unwrap();
    assert_eq!(r, randk(0.25, 1024, ValueCoding::Sign));
    assert_eq!(r.to_string(), "randk:0.25:sign:chunk=1024");
    assert_eq!(r.to_string().parse::<CompressSpec>().unwrap(), r);
    for bad in [
        "topk", "topk:0", "topk:2", "int3", "chunk=0", "topk:x", "randk:0",
    ] {
        assert!(bad.parse::<CompressSpec>().is_err(), "{bad}");
    }
}

#[test]
fn decayed_error_feedback_by_hand() {
    // Top-1 of 2 values with exact fp32: what is not sent is kept, scaled by β next round.
    let s = spec(0.5, 2, ValueCoding::F32);
    let mut c = Compressor::new(s, 2).with_decay(0.5).unwrap();
    assert_eq!(
        decode(&c.compress(&[4.0, 1.0]).unwrap(), 2).unwrap(),
        [4.0, 0.0]
    );
    assert_eq!(c.residual(), [0.0, 1.0]);
    // Round 2 encodes Δ + 0.5·residual = [1.0, 0.5 + 2.0].
    assert_eq!(
        decode(&c.compress(&[1.0, 2.0]).unwrap(), 2).unwrap(),
        [0.0, 2.5]
    );
    assert_eq!(c.residual(), [1.0, 0.0]);
    // β = 1 keeps everything, as before.
    let mut plain = Compressor::new(s, 2);
    plain.compress(&[4.0, 1.0]).unwrap();
    assert_eq!(
        decode(&plain.compress(&[1.0, 2.0]).unwrap(), 2).unwrap(),
        [0.0, 3.0]
    );
    for bad in [0.0, -0.1, 1.5, f32::NAN] {
        assert!(Compressor::new(s, 2).with_decay(bad).is_err(), "{bad}");
    }
}

#[test]
fn dct_round_trip_and_error_feedback() {
    // A smooth pseudo-gradient: in the cosine basis a few coefficients carry it.
    let delta: Vec<f32> = (0..4096 + 100)
        .map(|i| ((i as f32) / 300.0).sin() + 0.5)
        .collect();
    let plain: CompressSpec = "topk:0.02:fp32".parse().unwrap();
    let dct: CompressSpec = "topk:0.02:fp32:dct".parse().unwrap();
    assert!(dct.dct && !plain.dct);
    assert_eq!(dct.to_string().parse::<CompressSpec>().unwrap(), dct);
    let err = |spec: CompressSpec| {
        let mut c = Compressor::new(spec, delta.len());
        let sent = decode(&c.compress(&delta).unwrap(), delta.len()).unwrap();
        // What was sent plus what is kept is the input (up to the transform's rounding).
        for ((s, r), d) in sent.iter().zip(c.residual()).zip(&delta) {
            assert!((s + r - d).abs() < 1e-4, "{s} + {r} != {d}");
        }
        sq(sent.iter().zip(&delta).map(|(s, d)| s - d)) / sq(delta.iter().copied())
    };
    let (e_plain, e_dct) = (err(plain), err(dct));
    assert!(e_dct < 0.1 * e_plain, "dct {e_dct} vs plain {e_plain}");
    // A message with the flag decodes only through the transform; unknown flag bits are refused.
    let mut bytes = Compressor::new(dct, delta.len()).compress(&delta).unwrap();
    assert_eq!(bytes[2], 0x10);
    bytes[2] = 0x20;
    assert_eq!(
        decode(&bytes, delta.len()),
        Err(DecodeError::Selection(0x20))
    );
}

/// A network's own format decodes; a message with another mask, fraction, coding, selection
/// or chunk is refused by name, though each is well formed and `decode` takes it.
#[test]
fn a_message_in_another_format_than_the_networks_is_refused() {
    let n = 2 * 64;
    let a: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).cos()).collect();
    let network = randk(0.25, 64, ValueCoding::Int2);
    let message = |spec: CompressSpec, seed: u64| {
        let mut c = Compressor::with_seed(spec, n, seed);
        c.set_round(3);
        c.compress(&a).unwrap()
    };
    let ours = message(network, 9);
    let expected = mask_seed(9, 3);
    assert_eq!(decode_for(&ours, &network, expected, n), decode(&ours, n));
    assert!(decode_for(&ours, &network, expected, n).is_ok());
    let other_format = DecodeError::OtherFormat;
    let foreign = [
        (message(network, 10), other_format("mask")),
        (
            message(randk(0.5, 64, ValueCoding::Int2), 9),
            other_format("count"),
        ),
        (
            message(spec(0.25, 64, ValueCoding::Int2), 9),
            other_format("selection"),
        ),
        (
            message(randk(0.25, 32, ValueCoding::Int2), 9),
            other_format("chunk"),
        ),
        (
            message(randk(0.25, 64, ValueCoding::Sign), 9),
            DecodeError::OtherCoding {
                got: ValueCoding::Sign.tag(),
                expected: ValueCoding::Int2.tag(),
            },
        ),
    ];
    for (bytes, error) in foreign {
        assert!(decode(&bytes, n).is_ok());
        assert_eq!(decode_for(&bytes, &network, expected, n), Err(error));
    }
    // The round is part of the mask: last round's message is refused this round.
    assert_eq!(
        decode_for(&ours, &network, mask_seed(9, 4), n),
        Err(other_format("mask"))
    );
}
