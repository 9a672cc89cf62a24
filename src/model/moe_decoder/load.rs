//! Building a Qwen3-MoE or Mixtral model from a checkpoint or container: the
//! dense weights are loaded (and quantized) once; the routed experts become
//! an expert map of byte ranges for the runtime.

use std::sync::Arc;

use colibri_actors::{ExpertKey, ExpertMap};

use super::weights::{DenseWeights, Ffn, LayerWeights};
use crate::config::{DecoderKind, MoeDecoderConfig};
use crate::model::ModelError;
use crate::model::attention::AttnWeights;
use crate::model::expert::{ExpertCodec, ExpertNaming, ExpertWeights, LayoutCollector, checkpoint_expert};
use crate::model::olmoe::LoadOptions;
use crate::quant::QMatrix;
use crate::st::Checkpoint;

/// How the family names its routed experts and routers.
pub fn naming(cfg: &MoeDecoderConfig) -> ExpertNaming {
    match cfg.kind {
        DecoderKind::Qwen3Moe => ExpertNaming::Mlp,
        DecoderKind::Mixtral => ExpertNaming::BlockSparse,
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
    let names = naming(cfg);
    let vec = |name: &str, n: usize| ck.f32_tensor(name, &[n]);
    let mat = |name: &str, rows: usize, cols: usize| dense.load(ck, name, rows, cols);

    let embed = Arc::new(mat("model.embed_tokens.weight", cfg.vocab_size, h)?);
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for l in 0..cfg.num_hidden_layers {
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let (q_norm, k_norm) = match cfg.kind {
            DecoderKind::Qwen3Moe => (
                vec(&n("self_attn.q_norm.weight"), hd)?,
                vec(&n("self_attn.k_norm.weight"), hd)?,
            ),
            DecoderKind::Mixtral => (Vec::new(), Vec::new()),
        };
        let ffn = if cfg.is_sparse(l) {
            let name = names.router(l);
            let router = QMatrix::from_f32(cfg.num_experts, h, ck.f32_tensor(&name, &[cfg.num_experts, h])?)
                .map_err(|e| ModelError::Weights(format!("{name}: {e}")))?;
            Ffn::Moe { router }
        } else {
            let inter = cfg.intermediate_size;
            Ffn::Dense(ExpertWeights {
                gate: mat(&n("mlp.gate_proj.weight"), inter, h)?,
                up: mat(&n("mlp.up_proj.weight"), inter, h)?,
                down: mat(&n("mlp.down_proj.weight"), h, inter)?,
            })
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
        for e in 0..cfg.num_experts {
            let key = ExpertKey::new(l as u32, e as u32);
            let (extent, layout) = checkpoint_expert(ck, key, h, inter, names)?;
            layouts.add(key, layout).map_err(ModelError::Weights)?;
            map.set_extent(key, extent)
                .map_err(|err| ModelError::Weights(err.to_string()))?;
        }
    }
    let codec = layouts
        .finish(|_| opts.expert_format)
        .map_err(ModelError::Weights)?
        .with_int8_acts(opts.int8_acts);
    Ok((map, codec))
}
