//! MiniMax-M2 (`model_type: "minimax_m2"`): a Mixtral-shaped decoder (every
//! layer routed, experts under `block_sparse_moe.experts.E.{w1,w3,w2}`)
//! with GQA, q/k RMSNorm over the whole projection (all heads at once, as
//! OLMoE), partial rotary (`rotary_dim` in the release, or
//! `partial_rotary_factor`), and a sigmoid router whose correction bias
//! (`block_sparse_moe.e_score_correction_bias`) chooses the experts while
//! the plain sigmoid scores, renormalised, weight them. Parsed into the
//! shared [`MoeDecoderConfig`].

use std::path::Path;

use serde::Deserialize;

use super::config::{DecoderKind, MoeDecoderConfig, RouterChoice, check_act, check_counts, parse_rope};
use crate::config::ConfigError;
use crate::model::family::{Family, FamilyConfig};
use crate::synth::SynthPreset;

pub mod gguf;
pub mod synth;

/// `config.json` of a MiniMax-M2 checkpoint (defaults are `MiniMaxM2Config`'s).
#[derive(Deserialize)]
struct MiniMaxM2Json {
    vocab_size: usize,
    hidden_size: usize,
    /// Rows of a routed expert's w1 / w3 (there are no dense layers).
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    head_dim: Option<usize>,
    /// The release's spelling of the rotated share.
    #[serde(default)]
    rotary_dim: Option<usize>,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    num_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
    /// The release names its router; only sigmoid scoring exists.
    #[serde(default)]
    scoring_func: Option<String>,
}

const COUNT_FIELDS: [&str; 10] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "num_experts",
    "num_experts_per_tok",
];

fn default_max_pos() -> usize {
    196_608
}
fn default_eps() -> f64 {
    1e-6
}

/// Parses and validates a `minimax_m2` config.
pub fn from_json(path: &Path, value: serde_json::Value) -> Result<MoeDecoderConfig, ConfigError> {
    let value = crate::config::spelling::canonical(path, value)?;
    let bad = |field: &'static str, reason: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        reason,
    };
    check_counts(path, &value, &COUNT_FIELDS)?;
    let j: MiniMaxM2Json =
        serde_json::from_value(value).map_err(|source| crate::config::spelling::parse_error(path, source))?;
    check_act(path, j.hidden_act.as_deref())?;
    if let Some(s) = j.scoring_func.as_deref()
        && s != "sigmoid"
    {
        return Err(bad("scoring_func", format!("{s:?} is not supported (sigmoid)")));
    }
    let rope_scaling = parse_rope(path, j.rope_scaling.as_ref(), j.max_position_embeddings)?;
    let heads = j.num_attention_heads;
    let head_dim = j.head_dim.unwrap_or(j.hidden_size / heads.max(1));
    // transformers: partial_rotary_factor = rotary_dim / head_dim, then
    // int(head_dim * partial_rotary_factor).
    let rotary_dim = match (j.partial_rotary_factor, j.rotary_dim) {
        (Some(f), _) => {
            if !(f.is_finite() && f > 0.0 && f <= 1.0) {
                return Err(bad(
                    "partial_rotary_factor",
                    format!("must be in (0, 1], got {f}"),
                ));
            }
            (head_dim as f64 * f) as usize
        }
        (None, Some(r)) => {
            if r == 0 || r > head_dim {
                return Err(bad(
                    "rotary_dim",
                    format!("must be in 1..={head_dim} (head_dim), got {r}"),
                ));
            }
            r
        }
        (None, None) => head_dim,
    };
    let cfg = MoeDecoderConfig {
        model_type: "minimax_m2".into(),
        kind: DecoderKind::MiniMaxM2,
        vocab_size: j.vocab_size,
        hidden_size: j.hidden_size,
        num_hidden_layers: j.num_hidden_layers,
        num_attention_heads: heads,
        num_key_value_heads: j.num_key_value_heads.unwrap_or(heads),
        head_dim,
        max_position_embeddings: j.max_position_embeddings,
        rope_theta: crate::config::rope_theta(j.rope_theta, 5e6),
        rms_norm_eps: j.rms_norm_eps,
        num_experts: j.num_experts,
        num_experts_per_tok: j.num_experts_per_tok,
        moe_intermediate_size: j.intermediate_size,
        intermediate_size: j.intermediate_size,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        sliding_window: None,
        tie_word_embeddings: j.tie_word_embeddings,
        eos_token_id: j.eos_token_id,
        qkv_bias: false,
        o_bias: false,
        qk_norm: true,
        rotary_dim,
        rope_scaling,
        router: RouterChoice::Sigmoid {
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 1.0,
        },
        shared_intermediate: 0,
        first_k_dense_replace: 0,
        sliding_layers: Vec::new(),
        attention_sinks: false,
        swiglu_limit: None,
        num_nextn_predict_layers: 0,
    };
    cfg.validate(path)?;
    Ok(cfg)
}

/// The registry entry for `minimax_m2`: parsed here, run as a
/// [`MoeDecoderConfig`].
pub(crate) struct MiniMaxM2;

/// Listed in [`crate::model::FAMILIES`].
pub(crate) static MINIMAX_M2: MiniMaxM2 = MiniMaxM2;

impl Family for MiniMaxM2 {
    fn model_types(&self) -> &'static [&'static str] {
        &["minimax_m2"]
    }

    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[
            SynthPreset {
                name: "minimax-m2",
                build: synth::minimax_m2,
            },
            SynthPreset {
                name: "minimax-tiny",
                build: synth::minimax_tiny,
            },
        ]
    }

    fn parse(&self, path: &Path, value: serde_json::Value) -> Result<Box<dyn FamilyConfig>, ConfigError> {
        Ok(Box::new(from_json(path, value)?))
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &[gguf::ARCH]
    }

    fn gguf_config(
        &self,
        model: &crate::gguf::GgufModel,
    ) -> Result<serde_json::Value, crate::gguf::GgufError> {
        gguf::config_json(model)
    }

    fn gguf_checkpoint(
        &self,
        model: &crate::gguf::GgufModel,
    ) -> Result<crate::st::Checkpoint, crate::gguf::GgufError> {
        crate::gguf::checkpoint::checkpoint(model, gguf::NAMING)
    }

    fn fuzz_seeds(&self) -> Vec<serde_json::Value> {
        vec![
            // The release's spelling.
            serde_json::json!({
                "model_type": "minimax_m2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                "rotary_dim": 4, "num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 5e6,
                "scoring_func": "sigmoid", "eos_token_id": 1
            }),
            // As transformers 5 writes it.
            serde_json::json!({
                "model_type": "minimax_m2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                "num_local_experts": 8, "num_experts_per_tok": 2,
                "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5}
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release() -> serde_json::Value {
        MINIMAX_M2.fuzz_seeds().remove(0)
    }

    #[test]
    fn both_spellings_of_the_rotated_share_give_the_same_config() {
        let a = from_json(Path::new("c.json"), release()).unwrap();
        let b = from_json(Path::new("c.json"), MINIMAX_M2.fuzz_seeds().remove(1)).unwrap();
        assert_eq!((a.rotary_dim, b.rotary_dim), (4, 4));
        assert_eq!(a.rope_theta, b.rope_theta);
        assert_eq!(a.kind, DecoderKind::MiniMaxM2);
        assert!(a.qk_norm && a.norm_topk_prob && a.shared_intermediate == 0);
        assert_eq!(a.sparse_layers(), vec![true, true]);
    }

    #[test]
    fn refuses_bad_values_by_name() {
        for (field, val) in [
            ("rotary_dim", serde_json::json!(0)),
            ("rotary_dim", serde_json::json!(9)),
            ("scoring_func", serde_json::json!("softmax")),
            ("num_local_experts", serde_json::json!(0)),
            ("num_experts_per_tok", serde_json::json!(9)),
            ("hidden_act", serde_json::json!("gelu")),
        ] {
            let mut v = release();
            v[field] = val.clone();
            let e = from_json(Path::new("c.json"), v).unwrap_err();
            assert!(e.to_string().contains(field), "{field}={val}: {e}");
        }
    }
}
