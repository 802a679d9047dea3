//! Error bounds, determinism, and what a hostile peer's bytes get.

use proptest::prelude::*;

use super::*;

fn acts(batch: usize, seq: usize, dim: usize, data: Vec<f32>) -> Activations {
    Activations {
        batch,
        seq,
        dim,
        data,
    }
}

fn expect(scheme: Scheme, dim: usize) -> Expect {
    Expect {
        scheme,
        dim,
        max_batch: 4,
        max_seq: 8,
    }
}

/// A tensor and the bytes of one packed row of it, for tampering.
fn packed(scheme: Scheme, dim: usize) -> (Packed, Expect) {
    let data: Vec<f32> = (0..2 * dim)
        .map(|i| (i as f32 * 0.37).sin() * 3.0)
        .collect();
    (
        pack(&acts(1, 2, dim, data), scheme).unwrap(),
        expect(scheme, dim),
    )
}

fn with_bytes(p: &Packed, f: impl FnOnce(&mut Vec<u8>)) -> Packed {
    let mut bytes = p.bytes().to_vec();
    f(&mut bytes);
    let (b, s, d) = p.shape();
    Packed::from_parts(p.scheme(), b, s, d, bytes).unwrap()
}

fn tensor() -> impl Strategy<Value = Activations> {
    (1usize..3, 1usize..5, 1usize..70, -6i32..6).prop_flat_map(|(b, s, d, exp)| {
        let scale = 10f32.powi(exp);
        prop::collection::vec(-1.0f32..1.0, b * s * d)
            .prop_map(move |v| acts(b, s, d, v.into_iter().map(|x| x * scale).collect()))
    })
}

fn bound(scheme: Scheme, a: &Activations, i: usize) -> f32 {
    let row = &a.data[i / a.dim * a.dim..][..a.dim];
    let x = a.data[i];
    match scheme {
        Scheme::F32 => 0.0,
        Scheme::Bf16 => x.abs() / 256.0,
        // Half a quantization step, plus a few ulps of the largest value for the rounding of
        // x / scale and q · scale in f32 (without it a value next to the row's maximum can
        // miss the bound by 1e-6 of it).
        Scheme::Int8 => {
            let m = absmax(row);
            m / 127.0 * 0.5 * (1.0 + 1e-5) + 4.0 * f32::EPSILON * m
        }
        Scheme::Int4 => {
            let col = i % a.dim;
            let g = col / INT4_GROUP * INT4_GROUP;
            let m = absmax(&row[g..(g + INT4_GROUP).min(a.dim)]);
            m / 7.0 * (1.0 + 1e-5) + 4.0 * f32::EPSILON * m
        }
        Scheme::Int2 => {
            let col = i % a.dim;
            let g = col / INT2_GROUP * INT2_GROUP;
            let m = absmax(&row[g..(g + INT2_GROUP).min(a.dim)]);
            m * (1.0 + 1e-5) + 4.0 * f32::EPSILON * m
        }
    }
}

proptest! {
    #[test]
    fn round_trips_within_each_schemes_bound(a in tensor()) {
        for scheme in Scheme::ALL {
            let p = pack(&a, scheme).unwrap();
            prop_assert_eq!(
                Some(p.bytes().len()),
                scheme.encoded_len(a.batch * a.seq, a.dim)
            );
            let back = p.unpack(&expect(scheme, a.dim)).unwrap();
            prop_assert_eq!(back.data.len(), a.data.len());
            for (i, (x, y)) in a.data.iter().zip(&back.data).enumerate() {
                let tol = bound(scheme, &a, i);
                prop_assert!((x - y).abs() <= tol, "{scheme} at {i}: {x} vs {y} (±{tol})");
            }
            // Same input, same bits: peers recomputing a step get what was sent.
            prop_assert_eq!(pack(&a, scheme).unwrap(), p);
        }
    }

    /// Any bytes under any declared shape and scheme: an error or finite values, no panic.
    #[test]
    fn arbitrary_bytes_never_panic(
        id in 0u8..6,
        b in 0usize..3,
        s in 0usize..3,
        d in 0usize..40,
        bytes in prop::collection::vec(any::<u8>(), 0..400),
    ) {
        let Ok(scheme) = Scheme::from_id(id) else {
            prop_assert!(id > 4);
            return Ok(());
        };
        if let Ok(p) = Packed::from_parts(scheme, b, s, d, bytes)
            && let Ok(a) = p.unpack(&expect(scheme, d))
        {
            prop_assert!(a.data.iter().all(|x| x.is_finite() && x.abs() <= MAX_MAGNITUDE));
        }
    }

    /// Flipped bytes of a valid tensor: an error or finite values, and truncation is refused.
    #[test]
    fn tampered_and_truncated_bytes(at in 0usize..10_000, xor in 1u8..=255, cut in 1usize..40) {
        for scheme in Scheme::ALL {
            let (p, e) = packed(scheme, 37);
            let at = at % p.bytes().len();
            let q = with_bytes(&p, |b| b[at] ^= xor);
            if let Ok(a) = q.unpack(&e) {
                prop_assert!(a.data.iter().all(|x| x.is_finite()));
            }
            let (b, s, d) = p.shape();
            let short = p.bytes()[..p.bytes().len() - cut.min(p.bytes().len())].to_vec();
            prop_assert!(Packed::from_parts(scheme, b, s, d, short).is_err());
        }
    }
}

#[test]
fn non_finite_and_huge_inputs_are_refused_at_packing() {
    for scheme in Scheme::ALL {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, f32::MAX] {
            let err = pack(&acts(1, 1, 3, vec![1.0, bad, 2.0]), scheme).unwrap_err();
            assert!(
                matches!(err, ActCodecError::Value { index: 1, .. }),
                "{scheme} {bad}: {err}"
            );
        }
        // A tensor whose length is not its shape's.
        assert!(pack(&acts(1, 2, 3, vec![0.0; 5]), scheme).is_err());
    }
}

#[test]
fn zeros_pack_to_zero_scales_and_come_back_zero() {
    for scheme in Scheme::ALL {
        let a = acts(1, 2, 33, vec![0.0; 66]);
        let back = pack(&a, scheme)
            .unwrap()
            .unpack(&expect(scheme, 33))
            .unwrap();
        assert_eq!(back, a);
    }
}

/// Packs and unpacks `rows` rows of `dim` values in `scheme`.
fn round_trip(scheme: Scheme, rows: usize, dim: usize, data: Vec<f32>) -> Vec<f32> {
    pack(&acts(rows, 1, dim, data), scheme)
        .unwrap()
        .unpack(&Expect {
            scheme,
            dim,
            max_batch: rows,
            max_seq: 1,
        })
        .unwrap()
        .data
}

/// One value per group at `big` fixes the scale; the others sit at `small`, between two
/// codes: their mean after packing is `small`, where rounding to nearest would give 0, and
/// each lands on a neighbouring code.
fn assert_unbiased(
    scheme: Scheme,
    group: usize,
    big: f32,
    small: f32,
    codes: [f32; 2],
    tolerance: f32,
) {
    let (dim, rows) = (64, 300);
    let data: Vec<f32> = (0..rows * dim)
        .map(|i| if i % group == 0 { big } else { small })
        .collect();
    let back = round_trip(scheme, rows, dim, data);
    let rest: Vec<f32> = back
        .iter()
        .enumerate()
        .filter(|(i, _)| i % group != 0)
        .map(|(_, x)| *x)
        .collect();
    let mean = rest.iter().sum::<f32>() / rest.len() as f32;
    assert!((mean - small).abs() < tolerance, "{scheme}: {mean}");
    assert!(rest.iter().all(|x| codes.contains(x)), "{scheme}");
    assert!(back.iter().step_by(group).all(|x| *x == big), "{scheme}");
}

#[test]
fn int2_rounding_is_unbiased() {
    assert_unbiased(Scheme::Int2, INT2_GROUP, -1.0, 1.0 / 3.0, [0.0, 1.0], 0.02);
}

#[test]
fn int4_rounding_is_unbiased() {
    assert_unbiased(Scheme::Int4, INT4_GROUP, 7.0, 0.3, [0.0, 1.0], 0.03);
}

/// A declared shape far beyond the bytes: refused on the byte count, before any allocation.
#[test]
fn a_huge_declared_shape_is_refused_before_allocating() {
    let err = Packed::from_parts(Scheme::Int8, u32::MAX as usize, 1 << 20, 256, vec![0; 520])
        .unwrap_err();
    assert!(matches!(err, ActCodecError::Length { .. }), "{err}");
    let err = Packed::from_parts(Scheme::F32, usize::MAX, usize::MAX, 2, vec![]).unwrap_err();
    assert!(
        matches!(err, ActCodecError::Length { want: None, .. }),
        "{err}"
    );
    assert!(Packed::from_parts(Scheme::F32, 0, 1, 1, vec![]).is_err());
}

/// Bytes consistent with a shape larger than the stage's micro-batch: refused by the stage's
/// expectation (the frame limit alone would let it decode 8× the bytes it was sent).
#[test]
fn a_shape_beyond_the_micro_batch_or_width_is_refused() {
    let dim = 16;
    let e = expect(Scheme::Int4, dim);
    for (b, s) in [(e.max_batch + 1, 1), (1, e.max_seq + 1)] {
        let p = pack(&acts(b, s, dim, vec![0.5; b * s * dim]), Scheme::Int4).unwrap();
        let err = p.unpack(&e).unwrap_err();
        assert!(matches!(err, ActCodecError::Shape { .. }), "{err}");
    }
    let p = pack(&acts(1, 1, dim, vec![0.5; dim]), Scheme::Int4).unwrap();
    let err = p.unpack(&expect(Scheme::Int4, dim * 2)).unwrap_err();
    assert!(matches!(err, ActCodecError::Shape { .. }), "{err}");
}

#[test]
fn hostile_scales_are_refused() {
    for scheme in [Scheme::Int8, Scheme::Int4] {
        let (p, e) = packed(scheme, 37);
        assert!(p.unpack(&e).is_ok());
        for bad in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e30,
            f32::MAX,
            -1.0,
        ] {
            let q = with_bytes(&p, |b| b[..4].copy_from_slice(&bad.to_le_bytes()));
            let err = q.unpack(&e).unwrap_err();
            assert!(
                matches!(err, ActCodecError::Value { what: "scale", .. }),
                "{scheme} {bad}: {err}"
            );
        }
        let q = with_bytes(&p, |b| b[..4].copy_from_slice(&(-0.0f32).to_le_bytes()));
        assert!(q.unpack(&e).is_err());
    }
}

#[test]
fn hostile_raw_values_are_refused() {
    for (scheme, width) in [(Scheme::F32, 4), (Scheme::Bf16, 2)] {
        let (p, e) = packed(scheme, 37);
        for bad in [f32::NAN, f32::INFINITY, 1e30] {
            let bits = bad.to_le_bytes();
            let q = with_bytes(&p, |b| b[..width].copy_from_slice(&bits[4 - width..]));
            let err = q.unpack(&e).unwrap_err();
            assert!(
                matches!(err, ActCodecError::Value { .. }),
                "{scheme}: {err}"
            );
        }
    }
}

#[test]
fn codes_the_packer_never_writes_are_refused() {
    let (p, e) = packed(Scheme::Int8, 37);
    let q = with_bytes(&p, |b| b[4] = 0x80);
    assert_eq!(
        q.unpack(&e),
        Err(ActCodecError::NonCanonical("int8 code -128"))
    );
    let (p, e) = packed(Scheme::Int4, 37);
    let codes = 2 * 4;
    let q = with_bytes(&p, |b| b[codes] = 0x08);
    assert_eq!(
        q.unpack(&e),
        Err(ActCodecError::NonCanonical("int4 code -8"))
    );
    // 37 values: the last byte of a row holds one code and four padding bits.
    let last = codes + 18;
    let q = with_bytes(&p, |b| b[last] |= 0x10);
    assert_eq!(
        q.unpack(&e),
        Err(ActCodecError::NonCanonical("int4 padding bits set"))
    );
    // int2, 37 values: two scales, then ten bytes of codes, the last with one code.
    let (p, e) = packed(Scheme::Int2, 37);
    let q = with_bytes(&p, |b| b[8] = 0b10);
    assert_eq!(
        q.unpack(&e),
        Err(ActCodecError::NonCanonical("int2 code 0b10"))
    );
    let q = with_bytes(&p, |b| b[8 + 9] |= 0b0100);
    assert_eq!(
        q.unpack(&e),
        Err(ActCodecError::NonCanonical("int2 padding bits set"))
    );
}

#[test]
fn another_scheme_than_the_networks_is_refused() {
    let (p, _) = packed(Scheme::F32, 8);
    let err = p.unpack(&expect(Scheme::Int8, 8)).unwrap_err();
    assert_eq!(
        err,
        ActCodecError::WrongScheme {
            got: Scheme::F32,
            want: Scheme::Int8
        }
    );
}

#[test]
fn unknown_scheme_ids_and_names_are_refused() {
    for s in Scheme::ALL {
        assert_eq!(Scheme::from_id(s.id()), Ok(s));
    }
    assert_eq!(Scheme::from_id(5), Err(ActCodecError::UnknownScheme(5)));
    assert_eq!(Scheme::from_id(255), Err(ActCodecError::UnknownScheme(255)));
    assert!("int3".parse::<ActSpec>().is_err());
    assert!("int8/".parse::<ActSpec>().is_err());
}

#[test]
fn specs_read_and_write_as_text() {
    let spec: ActSpec = "int8/int4".parse().unwrap();
    assert_eq!(spec, ActSpec::default());
    assert_eq!(spec.to_string(), "int8/int4");
    assert_eq!("bf16".parse::<ActSpec>().unwrap().to_string(), "bf16");
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(json, "\"int8/int4\"");
    assert_eq!(serde_json::from_str::<ActSpec>(&json).unwrap(), spec);
    assert!(serde_json::from_str::<ActSpec>("\"fp7\"").is_err());
}

#[test]
fn default_is_at_least_four_times_smaller_than_f32() {
    // One driver step of the reference run: 2 micro-batches of [4, 128, 256], one boundary,
    // activations forward and gradients back, plus the targets (u32 each).
    let (rows, dim) = (4 * 128, 256);
    let step = |s: ActSpec| {
        2 * (s.forward.encoded_len(rows, dim).unwrap()
            + s.backward.encoded_len(rows, dim).unwrap()
            + rows * 4)
    };
    let raw = step(ActSpec::UNCOMPRESSED);
    assert!(raw >= 4 * step(ActSpec::default()), "{raw}");
    let int8: ActSpec = "int8".parse().unwrap();
    assert!(raw < 4 * step(int8));
}
