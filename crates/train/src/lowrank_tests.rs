use super::*;
use proptest::prelude::*;

/// Two matrices (8 × 12 and 16 × 6) with dense coordinates before, between and after them.
fn layout(rank: usize) -> Layout {
    let m = [
        Matrix {
            offset: 3,
            rows: 8,
            cols: 12,
        },
        Matrix {
            offset: 3 + 96 + 5,
            rows: 16,
            cols: 6,
        },
    ];
    Layout::new(3 + 96 + 5 + 96 + 7, &m, rank).unwrap()
}

fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix(seed);
    (0..len)
        .map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

fn sq(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x).powi(2)).sum()
}

fn gram(b: &Basis, k: usize, matrix: usize) -> Vec<Vec<f64>> {
    let cols = &b.columns[matrix];
    (0..b.rank)
        .map(|p| {
            (0..b.rank)
                .map(|q| {
                    (0..k)
                        .map(|i| f64::from(cols[p * k + i]) * f64::from(cols[q * k + i]))
                        .sum()
                })
                .collect()
        })
        .collect()
}

#[test]
fn bases_are_orthonormal_even_when_the_aggregate_did_not_move_a_matrix() {
    let l = layout(3);
    let mut previous = values(l.len(), 1);
    // The second matrix did not move: its basis must still have r directions.
    previous[104..200].iter_mut().for_each(|x| *x = 0.0);
    for round in [1, 2, 3] {
        for prev in [None, Some(previous.as_slice())] {
            let b = Basis::for_round(&l, 3, prev, round, 7).unwrap();
            for (i, m) in l.matrices().iter().enumerate() {
                let k = if b.side() == Side::Right {
                    m.cols
                } else {
                    m.rows
                };
                let g = gram(&b, k, i);
                for (p, row) in g.iter().enumerate() {
                    for (q, &x) in row.iter().enumerate() {
                        let want = if p == q { 1.0 } else { 0.0 };
                        assert!((x - want).abs() < 1e-5, "round {round} matrix {i}: {g:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn the_basis_follows_the_previous_aggregate_and_alternates_sides() {
    let l = layout(2);
    // A rank-2 aggregate: the basis of the next round spans exactly its row (or column) space,
    // so a pseudo-gradient in that space goes through unchanged.
    let mut previous = vec![0.0f32; l.len()];
    let (a, b) = (values(8, 2), values(12, 3));
    let (c, d) = (values(8, 4), values(12, 5));
    for i in 0..8 {
        for j in 0..12 {
            previous[3 + i * 12 + j] = a[i] * b[j] + c[i] * d[j];
        }
    }
    for round in [1, 2] {
        let basis = Basis::for_round(&l, 2, Some(&previous), round, 9).unwrap();
        assert_eq!(basis.side(), Side::of_round(round));
        let mut delta = vec![0.0f32; l.len()];
        delta[3..99].copy_from_slice(&previous[3..99]);
        let (_, decoded) = encode(&l, &basis, ValueCoding::F32, &delta).unwrap();
        for (x, y) in decoded[3..99].iter().zip(&delta[3..99]) {
            assert!((x - y).abs() < 1e-5, "round {round}: {x} vs {y}");
        }
    }
}

#[test]
fn a_message_is_the_projection_and_leaves_the_rest_to_error_feedback() {
    let l = layout(2);
    let delta = values(l.len(), 11);
    let basis = Basis::for_round(&l, 2, Some(&values(l.len(), 12)), 4, 1).unwrap();
    let (msg, decoded) = encode(&l, &basis, ValueCoding::F32, &delta).unwrap();
    assert_eq!(decode(&l, &basis, ValueCoding::F32, &msg).unwrap(), decoded);
    // Dense coordinates go whole.
    assert_eq!(&decoded[..3], &delta[..3]);
    assert_eq!(&decoded[200..], &delta[200..]);
    // An orthogonal projection: the residual is orthogonal to what was sent, and shorter.
    let residual: Vec<f32> = delta.iter().zip(&decoded).map(|(a, b)| a - b).collect();
    let cross: f64 = residual
        .iter()
        .zip(&decoded)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum();
    assert!(cross.abs() < 1e-4 * sq(&delta), "{cross}");
    assert!(sq(&decoded) < sq(&delta));
    // Sizes: 3 header bytes, then (round 4 has a left basis) Mᵀ·P, cols × r per matrix.
    let (msg8, decoded8) = encode(&l, &basis, ValueCoding::Int8, &delta).unwrap();
    let factors = 2 * (12 + 6);
    let dense = 3 + 5 + 7;
    assert_eq!(msg.len(), 11 + 4 * (factors + dense));
    // One scale per factor column and per dense range's chunk.
    assert_eq!(msg8.len(), 11 + factors + dense + 4 * (4 + 3));
    let err: Vec<f32> = decoded8.iter().zip(&decoded).map(|(a, b)| a - b).collect();
    assert!(sq(&err) < 1e-3 * sq(&decoded));
    // Two- and one-bit codes, packed: each column or chunk a scale and ⌈k·bits / 8⌉ bytes, and
    // what receivers rebuild is what the sender's residual is taken against.
    let packed = |bits: usize| {
        let groups = [12, 12, 6, 6, 3, 5, 7];
        11 + groups
            .iter()
            .map(|k| 4 + (k * bits).div_ceil(8))
            .sum::<usize>()
    };
    let mut errors = Vec::new();
    for (coding, bits) in [(ValueCoding::Int2, 2), (ValueCoding::Sign, 1)] {
        let (msg, coded) = encode(&l, &basis, coding, &delta).unwrap();
        assert_eq!(msg.len(), packed(bits), "{coding:?}");
        assert_eq!(decode(&l, &basis, coding, &msg).unwrap(), coded);
        let err: Vec<f32> = coded.iter().zip(&decoded).map(|(a, b)| a - b).collect();
        errors.push(sq(&err) / sq(&decoded));
    }
    // More bits, less error; two bits already keep most of the projection.
    assert!(errors[0] < errors[1] && errors[0] < 0.2, "{errors:?}");
}

#[test]
fn replicas_with_the_same_aggregate_build_the_same_basis_bit_for_bit() {
    let l = layout(3);
    let prev = values(l.len(), 21);
    let a = Basis::for_round(&l, 3, Some(&prev), 6, 5).unwrap();
    assert_eq!(a, Basis::for_round(&l, 3, Some(&prev), 6, 5).unwrap());
    assert_ne!(a, Basis::for_round(&l, 3, Some(&prev), 6, 6).unwrap());
}

#[test]
fn layouts_and_specs_are_checked() {
    let m = |offset, rows, cols| Matrix { offset, rows, cols };
    assert!(
        Layout::new(10, &[m(0, 3, 3), m(8, 1, 3)], 1).is_err(),
        "past the end"
    );
    assert!(
        Layout::new(20, &[m(5, 3, 3), m(0, 2, 2)], 1).is_err(),
        "out of order"
    );
    assert!(
        Layout::new(20, &[m(0, usize::MAX, 2)], 1).is_err(),
        "overflow"
    );
    assert!(Layout::new(20, &[], 0).is_err());
    // Too small to gain from rank 2: left to the dense part.
    assert!(
        Layout::new(16, &[m(0, 4, 4)], 2)
            .unwrap()
            .matrices()
            .is_empty()
    );
    let l = layout(2);
    assert!(Basis::for_round(&l, 2, Some(&[0.0; 3]), 1, 0).is_err());
    let basis = Basis::for_round(&l, 2, None, 1, 0).unwrap();
    assert!(encode(&l, &basis, ValueCoding::F32, &[1.0; 4]).is_err());
    for good in [
        "lowrank:4:int8",
        "lowrank:2:fp32",
        "lowrank:1",
        "lowrank:16:int2",
        "lowrank:8:sign",
    ] {
        let spec: crate::CompressSpec = good.parse().unwrap();
        assert_eq!(
            spec.to_string().parse::<crate::CompressSpec>().unwrap(),
            spec
        );
    }
    for bad in [
        "lowrank:0",
        "lowrank:65",
        "lowrank:4:int2:chunk=64",
        "lowrank:4:randk:0.5",
    ] {
        assert!(bad.parse::<crate::CompressSpec>().is_err(), "{bad}");
    }
}

#[test]
fn the_sparse_codec_refuses_low_rank_specs_and_messages() {
    let spec: crate::CompressSpec = "lowrank:2:int8".parse().unwrap();
    let mut c = crate::Compressor::new(spec, 4);
    assert_eq!(c.compress(&[1.0; 4]), Err(crate::CompressError::LowRank));
    let l = layout(2);
    let basis = Basis::for_round(&l, 2, None, 1, 0).unwrap();
    let (msg, _) = encode(&l, &basis, ValueCoding::Int8, &values(l.len(), 3)).unwrap();
    assert!(crate::decode(&msg, l.len()).is_err());
}

#[test]
fn a_message_for_another_rank_or_coding_is_refused() {
    let l = layout(2);
    let b2 = Basis::for_round(&l, 2, None, 1, 0).unwrap();
    let b3 = Basis::for_round(&l, 3, None, 1, 0).unwrap();
    let (msg, _) = encode(&l, &b3, ValueCoding::Int8, &values(l.len(), 3)).unwrap();
    assert!(matches!(
        decode(&l, &b2, ValueCoding::Int8, &msg),
        Err(DecodeError::Rank { got: 3, .. })
    ));
    let mut bad = msg.clone();
    bad[2] = 2;
    assert!(decode(&l, &b3, ValueCoding::Int8, &bad).is_err());
    // A well-formed message in another coding than the network's.
    let (sign, _) = encode(&l, &b3, ValueCoding::Sign, &values(l.len(), 3)).unwrap();
    assert!(decode(&l, &b3, ValueCoding::Sign, &sign).is_ok());
    assert_eq!(
        decode(&l, &b3, ValueCoding::Int8, &sign),
        Err(DecodeError::OtherCoding {
            got: 3,
            expected: 1
        })
    );
    assert!(decode(&l, &b3, ValueCoding::Int8, &msg).is_ok());
    // A message on another round's basis.
    let other = Basis::for_round(&l, 3, None, 3, 0).unwrap();
    assert_eq!(
        decode(&l, &other, ValueCoding::Int8, &msg),
        Err(DecodeError::Basis)
    );
    // A negative or non-finite scale, a truncation, trailing bytes.
    let mut nan = msg.clone();
    nan[11..15].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(decode(&l, &b3, ValueCoding::Int8, &nan).is_err());
    let mut neg = msg.clone();
    neg[11..15].copy_from_slice(&(-1.0f32).to_le_bytes());
    assert!(decode(&l, &b3, ValueCoding::Int8, &neg).is_err());
    assert!(decode(&l, &b3, ValueCoding::Int8, &msg[..msg.len() - 1]).is_err());
    let mut long = msg.clone();
    long.push(0);
    assert_eq!(
        decode(&l, &b3, ValueCoding::Int8, &long),
        Err(DecodeError::Trailing(1))
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever a peer sends: a finite vector of the layout's length or an error, never a
    /// panic; and an honest message round-trips.
    #[test]
    fn any_bytes_decode_to_finite_values_or_an_error(
        seed in any::<u64>(),
        round in 1u64..10,
        coding in 0u8..4,
        mutations in neuroshard_mutate::mutations(),
    ) {
        let l = layout(2);
        let coding = ValueCoding::from_tag(coding).unwrap();
        let basis = Basis::for_round(&l, 2, Some(&values(l.len(), seed)), round, seed).unwrap();
        let (msg, decoded) = encode(&l, &basis, coding, &values(l.len(), !seed)).unwrap();
        prop_assert_eq!(decode(&l, &basis, coding, &msg).unwrap(), decoded);
        let bad = neuroshard_mutate::apply(&msg, &mutations);
        if let Ok(v) = decode(&l, &basis, coding, &bad) {
            prop_assert_eq!(v.len(), l.len());
            prop_assert!(v.iter().all(|x| x.is_finite()));
        }
    }
}
