//! Validation loss of a simulated network's agreed model: every stage's θ₀ chained on
//! held-out pattern batches (an origin no driver has, so no batch was trained on).

use neuroshard_data::Batch;
use neuroshard_model::{
    Activations, ModelConfig, ModelError, Stage, StageInput, StageSpec, Tokens,
};
use neuroshard_node::core::BatchSource;

use crate::PatternBatches;

/// The origin of the held-out batches (drivers' origins are their node ids).
const HELD_OUT: [u8; 32] = [0xee; 32];

/// Mean next-token cross-entropy of the model whose stage `s` has parameters `thetas[s]`,
/// over `batches` held-out batches from `data`.
pub fn validation_loss(
    model: &ModelConfig,
    thetas: &[Vec<f32>],
    data: &PatternBatches,
    batches: u64,
) -> Result<f32, ModelError> {
    let specs = StageSpec::split(model, thetas.len())?;
    let stages = specs
        .iter()
        .zip(thetas)
        .map(|(spec, theta)| {
            let mut stage = Stage::init(model.clone(), *spec, 0)?;
            stage.params_mut().set_flat(theta)?;
            Ok(stage)
        })
        .collect::<Result<Vec<Stage>, ModelError>>()?;
    let mut total = 0.0f64;
    let mut count = 0usize;
    for step in 0..batches {
        let batch: Batch = data
            .batch(&HELD_OUT, step, &[HELD_OUT])
            .map_err(|e| ModelError::Input(e.0))?;
        let mut input = StageInput::Tokens(Tokens {
            batch: batch.rows,
            seq: batch.seq_len,
            ids: batch.inputs.clone(),
        });
        let (last, middle) = stages
            .split_last()
            .ok_or_else(|| ModelError::Input("no stages".into()))?;
        for stage in middle {
            let out: Activations = stage.forward(&input)?;
            input = StageInput::Hidden(out);
        }
        for l in last.token_losses(&input, &batch.targets)? {
            total += f64::from(l);
            count += 1;
        }
    }
    Ok((total / count.max(1) as f64) as f32)
}
