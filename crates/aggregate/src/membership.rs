//! How many of n inputs a robust rule must assume Byzantine, and when n is too few for it.

use crate::{AggregateError, Aggregator};

/// The Byzantine count f assumed among `n` inputs when the operator declared `declared`.
///
/// With 1 or 2 inputs nothing robust is possible (two disagreeing inputs cannot tell which one
/// lies), so f = 0 and every rule keeps its plain behaviour. From 3 inputs on f is at least a
/// fraction of the inputs, ⌊(n − 1)/3⌋ (the network's assumption: fewer than a third of a
/// stage's replicas lie), and never 0: a declared count of 0 in a small stage no longer turns
/// trimmed mean into a plain mean. A larger declared count is kept as declared.
pub fn byzantine_count(n: usize, declared: usize) -> usize {
    if n <= 2 {
        return 0;
    }
    declared.max(((n - 1) / 3).max(1))
}

/// Refuses `n` inputs that cannot outvote `f` Byzantine ones (n < 2f + 1).
pub fn check_quorum(n: usize, f: usize) -> Result<(), AggregateError> {
    if n < 2 * f + 1 {
        return Err(AggregateError::TooFewInputs { n, f });
    }
    Ok(())
}

impl Aggregator {
    /// The Byzantine count this rule was configured with (`None` for rules without one).
    pub fn byzantine(&self) -> Option<usize> {
        self.clone().byzantine_mut().copied()
    }

    /// The rule's Byzantine count, for the parser and [`Self::fitted`] to set: the one list of
    /// rules that take an f.
    pub(crate) fn byzantine_mut(&mut self) -> Option<&mut usize> {
        match self {
            Self::TrimmedMean { f, .. }
            | Self::ClippedMean { f, .. }
            | Self::Krum { f }
            | Self::MultiKrum { f, .. } => Some(f),
            _ => None,
        }
    }

    /// This rule fitted to `n` inputs: its f becomes [`byzantine_count`] of n and the larger of
    /// `declared` and its own, and it is refused when n < 2f + 1 (so the round keeps θ₀).
    pub fn fitted(&self, n: usize, declared: usize) -> Result<Self, AggregateError> {
        let f = byzantine_count(n, declared.max(self.byzantine().unwrap_or(0)));
        check_quorum(n, f)?;
        let mut rule = self.clone();
        if let Some(g) = rule.byzantine_mut() {
            *g = f;
        }
        Ok(rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f_is_a_fraction_of_the_inputs_and_never_zero_from_three() {
        assert_eq!(byzantine_count(1, 5), 0);
        assert_eq!(byzantine_count(2, 1), 0);
        for n in 3..=6 {
            assert_eq!(byzantine_count(n, 0), 1, "{n}");
        }
        assert_eq!(byzantine_count(7, 0), 2);
        assert_eq!(byzantine_count(10, 1), 3);
        assert_eq!(byzantine_count(10, 4), 4);
    }

    #[test]
    fn too_few_inputs_for_the_declared_count_are_refused() {
        let rule = Aggregator::parse("trimmed-mean", 2).unwrap();
        assert_eq!(
            rule.fitted(3, 2),
            Err(AggregateError::TooFewInputs { n: 3, f: 2 })
        );
        assert_eq!(
            rule.fitted(5, 2),
            Ok(Aggregator::TrimmedMean { beta: 0.0, f: 2 })
        );
        // The spec's own f counts as declared.
        let spec = Aggregator::parse("trimmed-mean:f=2", 0).unwrap();
        assert!(spec.fitted(4, 0).is_err());
        // Two inputs keep the plain rule; rules without f pass through.
        assert_eq!(
            rule.fitted(2, 2),
            Ok(Aggregator::TrimmedMean { beta: 0.0, f: 0 })
        );
        assert_eq!(Aggregator::Median.fitted(3, 0), Ok(Aggregator::Median));
        assert!(Aggregator::Median.fitted(3, 2).is_err());
    }

    #[test]
    fn a_scaled_sign_flipped_outlier_among_three_stays_out() {
        let honest = [vec![1.0f32, -2.0], vec![1.2, -2.2]];
        let evil = vec![-1000.0f32, 2000.0];
        let inputs = [honest[0].clone(), evil, honest[1].clone()];
        let rule = Aggregator::parse("trimmed-mean", 0)
            .unwrap()
            .fitted(3, 0)
            .unwrap();
        let out = rule.aggregate(&inputs, None).unwrap();
        // The one kept value per coordinate is an honest one.
        assert_eq!(out, vec![1.0, -2.0]);
    }
}
