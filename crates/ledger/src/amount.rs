//! NEURO amounts: integer base units only, never floats.

/// Base units per NEURO.
pub const UNITS_PER_NEURO: u64 = 1_000_000_000;

/// Basis points: 10_000 = 100 %.
pub const BPS_ONE: u64 = 10_000;

/// `amount * bps / 10_000`, rounded down, computed in u128 so it cannot overflow.
pub fn bps_of(amount: u64, bps: u64) -> u64 {
    let v = u128::from(amount) * u128::from(bps) / u128::from(BPS_ONE);
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Human form, e.g. `12.500000000 NEURO` (exact: integer and fractional parts separately).
pub fn format_neuro(units: u64) -> String {
    format!(
        "{}.{:09} NEURO",
        units / UNITS_PER_NEURO,
        units % UNITS_PER_NEURO
    )
}

/// Parses `12`, `12.5` or `0.000000001` NEURO into base units, exactly.
pub fn parse_neuro(text: &str) -> Option<u64> {
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, f),
        None => (text, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || frac.len() > 9
        || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let int: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut frac_units: u64 = 0;
    if !frac.is_empty() {
        frac_units = frac.parse::<u64>().ok()? * 10u64.pow(9 - frac.len() as u32);
    }
    int.checked_mul(UNITS_PER_NEURO)?.checked_add(frac_units)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_format_are_exact() {
        assert_eq!(parse_neuro("12.5"), Some(12_500_000_000));
        assert_eq!(parse_neuro("0.000000001"), Some(1));
        assert_eq!(parse_neuro("3"), Some(3 * UNITS_PER_NEURO));
        assert_eq!(parse_neuro("1.0000000001"), None);
        assert_eq!(parse_neuro("-1"), None);
        assert_eq!(parse_neuro(""), None);
        assert_eq!(parse_neuro("99999999999999999999"), None);
        assert_eq!(format_neuro(12_500_000_000), "12.500000000 NEURO");
        assert_eq!(bps_of(u64::MAX, BPS_ONE), u64::MAX);
        assert_eq!(bps_of(1_000, 500), 50);
    }
}
