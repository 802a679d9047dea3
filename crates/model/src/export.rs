//! Export to a Hugging Face LLaMA folder that `transformers` loads with `AutoModelForCausalLM`.
//!
//! Our names already follow the HF layout; only the layout of matrices differs: we store linear
//! weights `[d_in, d_out]` (x · W), HF stores `[d_out, d_in]`. Rotary embeddings use the same
//! rotate-half convention, so no permutation of q/k rows is needed.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use safetensors::{Dtype, tensor::TensorView};
use serde_json::json;

use crate::checkpoint::{self, TOKENIZER_FILE, write_atomic};
use crate::error::ModelError;
use crate::params::ParamKind;

/// Special token ids written into the HF configs (from the dataset's tokenizer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
}

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct ExportReport {
    pub tensors: usize,
    pub bytes: u64,
    pub tokenizer: bool,
}

/// Writes `config.json`, `model.safetensors`, `generation_config.json` and, when the
/// checkpoint has one, `tokenizer.json` into `out`.
pub fn export_hf(
    checkpoint_dir: &Path,
    out: &Path,
    special: SpecialTokens,
) -> Result<ExportReport, ModelError> {
    let ckpt = checkpoint::load(checkpoint_dir)?;
    let (config, spec) = (ckpt.stage.config().clone(), *ckpt.stage.spec());
    if !(spec.embed && spec.head && spec.first_layer == 0 && spec.end_layer == config.layers) {
        return Err(ModelError::Input(
            "export needs a checkpoint of the whole model, not one stage".into(),
        ));
    }
    fs::create_dir_all(out).map_err(|e| ModelError::io(out, e))?;
    let params = ckpt.stage.params();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (s, v) in params.specs().iter().zip(params.values()) {
        let (shape, values) = if s.kind == ParamKind::Linear {
            let (rows, cols) = (s.shape[0], s.shape[1]);
            let mut t = vec![0.0f32; v.len()];
            for r in 0..rows {
                for c in 0..cols {
                    t[c * rows + r] = v[r * cols + c];
                }
            }
            (vec![cols, rows], t)
        } else {
            (s.shape.clone(), v.clone())
        };
        let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        tensors.push((s.name.clone(), shape, bytes));
    }
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| ModelError::Checkpoint(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut info = HashMap::new();
    info.insert("format".to_string(), "pt".to_string());
    let data = safetensors::serialize(views, Some(info))
        .map_err(|e| ModelError::Checkpoint(format!("serializing export: {e}")))?;
    let bytes = data.len() as u64;
    write_atomic(&out.join("model.safetensors"), &data)?;

    let hf_config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.d_model,
        "intermediate_size": config.ffn,
        "num_hidden_layers": config.layers,
        "num_attention_heads": config.heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim(),
        "vocab_size": config.vocab,
        "max_position_embeddings": config.max_seq,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "torch_dtype": "float32",
        "bos_token_id": special.bos,
        "eos_token_id": special.eos,
        "pad_token_id": special.pad,
        "neuroshard_architecture": ckpt.meta.architecture,
    });
    let generation = json!({
        "bos_token_id": special.bos,
        "eos_token_id": special.eos,
        "pad_token_id": special.pad,
        "do_sample": true,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "max_length": config.max_seq,
    });
    for (file, value) in [
        ("config.json", hf_config),
        ("generation_config.json", generation),
    ] {
        let text = serde_json::to_vec_pretty(&value)
            .map_err(|e| ModelError::Checkpoint(format!("{file}: {e}")))?;
        write_atomic(&out.join(file), &text)?;
    }
    let tok = checkpoint_dir.join(TOKENIZER_FILE);
    let tokenizer = tok.is_file();
    if tokenizer {
        fs::copy(&tok, out.join(TOKENIZER_FILE)).map_err(|e| ModelError::io(&tok, e))?;
        let tok_config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": config.max_seq,
        });
        let text = serde_json::to_vec_pretty(&tok_config)
            .map_err(|e| ModelError::Checkpoint(format!("tokenizer_config.json: {e}")))?;
        write_atomic(&out.join("tokenizer_config.json"), &text)?;
    }
    Ok(ExportReport {
        tensors: tensors.len(),
        bytes,
        tokenizer,
    })
}
