//! Building a Qwen3-MoE, Mixtral, GLM-4.x or gpt-oss model from a
//! checkpoint or container: the dense weights are loaded (and quantized)
//! once; the routed experts become an expert map of byte ranges for the
//! runtime.

use std::sync::Arc;

use colibri_actors::{ExpertKey, ExpertMap};

use super::config::{DecoderKind, MoeDecoderConfig, RouterChoice};
use super::weights::{DenseWeights, Ffn, LayerWeights};
use crate::model::ModelError;
use crate::model::attention::{AttnBias, AttnWeights};
use crate::model::expert::{
    Activation, ExpertCodec, ExpertNaming, LayoutCollector, checkpoint_expert, load_swiglu,
};
use crate::model::olmoe::LoadOptions;
use crate::quant::QMatrix;
use crate::st::Checkpoint;

/// How the family names its routed experts and routers.
pub fn naming(cfg: &MoeDecoderConfig) -> ExpertNaming {
    match cfg.kind {
        DecoderKind::Qwen3Moe | DecoderKind::Glm4Moe | DecoderKind::GptOss => ExpertNaming::MLP,
        DecoderKind::Mixtral | DecoderKind::MiniMaxM2 => ExpertNaming::BLOCK_SPARSE,
    }
}

/// The router weight (and bias, for gpt-oss) of layer `l`.
fn router_names(cfg: &MoeDecoderConfig, l: usize) -> (String, Option<String>) {
    match cfg.kind {
        DecoderKind::GptOss => (
            format!("model.layers.{l}.mlp.router.weight"),
            Some(format!("model.layers.{l}.mlp.router.bias")),
        ),
        _ => (naming(cfg).router(l), None),
    }
}

/// The sigmoid router's correction bias of layer `l`.
fn correction_name(cfg: &MoeDecoderConfig, l: usize) -> String {
    match cfg.kind {
        DecoderKind::MiniMaxM2 => format!("model.layers.{l}.block_sparse_moe.e_score_correction_bias"),
        _ => format!("model.layers.{l}.mlp.gate.e_score_correction_bias"),
    }
}

/// Loads every resident tensor, checking names, shapes and formats.
pub fn load_dense(
    cfg: &MoeDecoderConfig,
    ck: &Checkpoint,
    opts: LoadOptions,
) -> Result<DenseWeights, ModelError> {
    let h = cfg.hidden_size;
    let hd = cfg.head_dim;
    let q_dim = cfg.num_attention_heads * hd;
    let kv_dim = cfg.num_key_value_heads * hd;
    let dense = opts.dense();
    let vec = |name: &str, n: usize| ck.f32_tensor(name, &[n]);
    let mat = |name: &str, rows: usize, cols: usize| dense.load(ck, name, rows, cols);

    let embed = Arc::new(mat("model.embed_tokens.weight", cfg.vocab_size, h)?);
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for l in 0..cfg.num_hidden_layers {
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let (q_norm, k_norm) = if cfg.qk_norm {
            let (qn, kn) = if cfg.qk_norm_full_width() {
                (q_dim, kv_dim)
            } else {
                (hd, hd)
            };
            (
                vec(&n("self_attn.q_norm.weight"), qn)?,
                vec(&n("self_attn.k_norm.weight"), kn)?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let mut bias = AttnBias::default();
        if cfg.qkv_bias {
            bias.q = vec(&n("self_attn.q_proj.bias"), q_dim)?;
            bias.k = vec(&n("self_attn.k_proj.bias"), kv_dim)?;
            bias.v = vec(&n("self_attn.v_proj.bias"), kv_dim)?;
        }
        if cfg.o_bias {
            bias.o = vec(&n("self_attn.o_proj.bias"), h)?;
        }
        let sinks = if cfg.attention_sinks {
            vec(&n("self_attn.sinks"), cfg.num_attention_heads)?
        } else {
            Vec::new()
        };
        let ffn = if cfg.is_sparse(l) {
            let ne = cfg.num_experts;
            let (name, bias_name) = router_names(cfg, l);
            let router = QMatrix::from_f32(ne, h, ck.f32_tensor(&name, &[ne, h])?)
                .map_err(|e| ModelError::Weights(format!("{name}: {e}")))?;
            let router_bias = match bias_name {
                Some(b) => vec(&b, ne)?,
                None => Vec::new(),
            };
            let (correction, shared) = match cfg.router {
                RouterChoice::Sigmoid { .. } => (
                    vec(&correction_name(cfg, l), ne)?,
                    match cfg.shared_intermediate {
                        0 => None,
                        inter => Some(load_swiglu(ck, &n("mlp.shared_experts"), h, inter, dense)?),
                    },
                ),
                _ => (Vec::new(), None),
            };
            Ffn::Moe {
                router,
                router_bias,
                correction,
                shared,
            }
        } else {
            Ffn::Dense(load_swiglu(ck, &n("mlp"), h, cfg.intermediate_size, dense)?)
        };
        layers.push(LayerWeights {
            input_norm: vec(&n("input_layernorm.weight"), h)?,
            attn: AttnWeights {
                q: mat(&n("self_attn.q_proj.weight"), q_dim, h)?,
                k: mat(&n("self_attn.k_proj.weight"), kv_dim, h)?,
                v: mat(&n("self_attn.v_proj.weight"), kv_dim, h)?,
                o: mat(&n("self_attn.o_proj.weight"), h, q_dim)?,
                q_norm,
                k_norm,
                bias,
                sinks,
                gate: None,
            },
            post_norm: vec(&n("post_attention_layernorm.weight"), h)?,
            ffn,
        });
    }
    let final_norm = vec("model.norm.weight", h)?;
    // transformers ties the head to the embedding when asked, whatever the
    // file holds; untied, the head must be there.
    let lm_head = if cfg.tie_word_embeddings {
        embed.clone()
    } else if ck.has("lm_head.weight") {
        Arc::new(mat("lm_head.weight", cfg.vocab_size, h)?)
    } else {
        return Err(ModelError::Weights(
            "lm_head.weight is missing and tie_word_embeddings is false".into(),
        ));
    };
    Ok(DenseWeights {
        embed,
        layers,
        final_norm,
        lm_head,
    })
}

/// The byte ranges of every routed expert of the sparse layers, and the
/// codec that decodes them. Every expert of a layer must share one layout
/// (dtypes and sizes), which is checked.
pub fn expert_map(
    cfg: &MoeDecoderConfig,
    ck: &Checkpoint,
    opts: LoadOptions,
) -> Result<(ExpertMap, ExpertCodec), ModelError> {
    let (h, inter) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let names = naming(cfg);
    let mut map = ExpertMap::new(ck.files().to_vec(), cfg.num_hidden_layers, cfg.num_experts);
    let mut layouts = LayoutCollector::new(cfg.num_hidden_layers);
    for l in (0..cfg.num_hidden_layers).filter(|&l| cfg.is_sparse(l)) {
        let fused = cfg.kind == DecoderKind::GptOss && super::gpt_oss_experts::is_fused(ck, l);
        for e in 0..cfg.num_experts {
            let key = ExpertKey::new(l as u32, e as u32);
            let (extent, layout) = if fused {
                super::gpt_oss_experts::fused_expert(ck, key, cfg.num_experts, h, inter)?
            } else {
                checkpoint_expert(ck, key, h, inter, names)?
            };
            layouts.add(key, layout).map_err(ModelError::Weights)?;
            map.set_extent(key, extent)
                .map_err(|err| ModelError::Weights(err.to_string()))?;
        }
    }
    let codec = layouts
        .finish(|_| opts.expert_format)
        .map_err(ModelError::Weights)?
        .with_int8_acts(opts.int8_acts)
        .with_activation(match cfg.swiglu_limit {
            Some(limit) => Activation::gpt_oss(limit as f32),
            None => Activation::SiluGlu,
        });
    Ok((map, codec))
}
