//! Building a GLM-5 / DeepSeek-V3 model from a checkpoint or container: the
//! dense weights (and the MTP module's) are loaded once; the routed experts
//! of sparse layers (and of the MTP layer) become an expert map for the runtime.

use std::sync::Arc;

use colibri_actors::{ExpertKey, ExpertMap};

use super::config::GlmConfig;
use super::config::{IndexerKind, MlaFamily};
use super::weights::{
    DenseWeights, IndexerWeights, KvProj, LayerWeights, MlaWeights, Mlp, MoeWeights, MtpWeights,
};
use crate::model::ModelError;
use crate::model::expert::{ExpertCodec, ExpertNaming, LayoutCollector, checkpoint_expert, load_swiglu};
use crate::model::olmoe::LoadOptions;
use crate::model::want::MatrixWant;
use crate::quant::{QFormat, QMatrix};
use crate::st::Checkpoint;

/// Names of the MTP module's own tensors (besides its decoder layer).
const MTP_OWN: [&str; 4] = [
    "enorm.weight",
    "hnorm.weight",
    "eh_proj.weight",
    "shared_head.norm.weight",
];

/// Whether the checkpoint holds a complete MTP module for `cfg`; `Err` is a
/// note explaining why speculative MTP drafting is unavailable.
pub fn mtp_available(cfg: &GlmConfig, ck: &Checkpoint) -> Result<(), String> {
    if cfg.num_nextn_predict_layers == 0 {
        return Err("the config declares no MTP layer (num_nextn_predict_layers = 0)".into());
    }
    let l = cfg.num_hidden_layers;
    let missing: Vec<String> = MTP_OWN
        .iter()
        .map(|s| format!("model.layers.{l}.{s}"))
        .chain([format!("model.layers.{l}.self_attn.kv_b_proj.weight")])
        .filter(|n| !ck.has(n))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the config declares an MTP layer but the checkpoint lacks {} (transformers drops MTP weights \
             on save; convert from the original checkpoint to keep them)",
            missing.join(", ")
        ))
    }
}

/// The format the MTP layer's matrices get when `requested` is what the
/// rest of the model gets: never below int8 (f32 and int8 stay as asked;
/// int4 and int2 become int8), because int4 draft heads collapse draft
/// acceptance. `coli convert` and load-time quantization share this rule, so
/// a container and its source quantized at load give the same tokens.
pub fn mtp_format(requested: QFormat) -> QFormat {
    match requested {
        QFormat::F32 | QFormat::Int8 => requested,
        _ => QFormat::Int8,
    }
}

fn weights_err(name: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Weights(format!("{name}: {e}"))
}

fn f32_matrix(ck: &Checkpoint, name: &str, rows: usize, cols: usize) -> Result<QMatrix, ModelError> {
    QMatrix::from_f32(rows, cols, ck.f32_tensor(name, &[rows, cols])?).map_err(|e| weights_err(name, e))
}

/// Layer `l`'s `kv_b_proj`, or llama.cpp's split `k_b_proj` / `v_b_proj`
/// (a GGUF from a newer converter) cut into one matrix per head, rows
/// copied as stored.
fn kv_proj(cfg: &GlmConfig, ck: &Checkpoint, l: usize, dense: MatrixWant) -> Result<KvProj, ModelError> {
    let heads = cfg.num_attention_heads;
    let (nope, vd, kvl) = (cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank);
    let joint = format!("model.layers.{l}.self_attn.kv_b_proj.weight");
    let (k_name, v_name) = (
        format!("model.layers.{l}.self_attn.k_b_proj.weight"),
        format!("model.layers.{l}.self_attn.v_b_proj.weight"),
    );
    if ck.has(&joint) || !ck.has(&k_name) {
        return Ok(KvProj::Joint(dense.load(ck, &joint, heads * (nope + vd), kvl)?));
    }
    let stacked = |name: &str, rows: usize, cols: usize| -> Result<Vec<QMatrix>, ModelError> {
        let m = ck
            .stacked_matrix(name, heads, rows, cols, dense.format)?
            .with_int8_acts(dense.int8_acts);
        (0..heads)
            .map(|h| {
                let idx: Vec<usize> = (h * rows..(h + 1) * rows).collect();
                m.select_rows(&idx)
                    .ok_or_else(|| weights_err(name, format!("head {h} is out of range")))
            })
            .collect()
    };
    Ok(KvProj::PerHead {
        k: stacked(&k_name, kvl, nope)?,
        v: stacked(&v_name, vd, kvl)?,
    })
}

/// Loads decoder layer `l` (a main layer, or the MTP layer at `num_hidden_layers`).
fn load_layer(
    cfg: &GlmConfig,
    ck: &Checkpoint,
    l: usize,
    sparse: bool,
    indexer: bool,
    dense: MatrixWant,
) -> Result<LayerWeights, ModelError> {
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let n = |rest: &str| format!("model.layers.{l}.{rest}");
    let vec = |name: String, len: usize| ck.f32_tensor(&name, &[len]);
    let mat = |name: String, r: usize, c: usize| dense.load(ck, &name, r, c);
    let (q_a, q_a_norm, q_b) = match cfg.q_lora_rank {
        Some(qr) => (
            Some(mat(n("self_attn.q_a_proj.weight"), qr, h)?),
            vec(n("self_attn.q_a_layernorm.weight"), qr)?,
            mat(n("self_attn.q_b_proj.weight"), heads * cfg.q_head_dim(), qr)?,
        ),
        None => (
            None,
            Vec::new(),
            mat(n("self_attn.q_proj.weight"), heads * cfg.q_head_dim(), h)?,
        ),
    };
    let indexer = if indexer {
        let (ih, ihd) = (cfg.index_n_heads(), cfg.index_head_dim());
        let qr = cfg.q_lora_rank.unwrap_or(0);
        Some(IndexerWeights {
            wq_b: mat(n("self_attn.indexer.wq_b.weight"), ih * ihd, qr)?,
            wk: mat(n("self_attn.indexer.wk.weight"), ihd, h)?,
            k_norm_w: vec(n("self_attn.indexer.k_norm.weight"), ihd)?,
            k_norm_b: vec(n("self_attn.indexer.k_norm.bias"), ihd)?,
            weights_proj: f32_matrix(ck, &n("self_attn.indexer.weights_proj.weight"), ih, h)?,
        })
    } else {
        None
    };
    let attn = MlaWeights {
        q_a,
        q_a_norm,
        q_b,
        kv_a: mat(
            n("self_attn.kv_a_proj_with_mqa.weight"),
            cfg.kv_lora_rank + cfg.qk_rope_head_dim,
            h,
        )?,
        kv_a_norm: vec(n("self_attn.kv_a_layernorm.weight"), cfg.kv_lora_rank)?,
        kv_b: kv_proj(cfg, ck, l, dense)?,
        o: mat(n("self_attn.o_proj.weight"), h, heads * cfg.v_head_dim)?,
        indexer,
    };
    let mlp = if sparse {
        let e = cfg.n_routed_experts;
        let shared = if cfg.n_shared_experts > 0 {
            Some(load_swiglu(
                ck,
                &n("mlp.shared_experts"),
                h,
                cfg.moe_intermediate_size * cfg.n_shared_experts,
                dense,
            )?)
        } else {
            None
        };
        let bias_name = n("mlp.gate.e_score_correction_bias");
        Mlp::Moe(MoeWeights {
            router: f32_matrix(ck, &n("mlp.gate.weight"), e, h)?,
            bias: if ck.has(&bias_name) {
                vec(bias_name, e)?
            } else {
                vec![0.0; e]
            },
            shared,
        })
    } else {
        Mlp::Dense(load_swiglu(ck, &n("mlp"), h, cfg.intermediate_size, dense)?)
    };
    Ok(LayerWeights {
        input_norm: vec(n("input_layernorm.weight"), h)?,
        attn,
        post_norm: vec(n("post_attention_layernorm.weight"), h)?,
        mlp,
    })
}

/// Loads every resident tensor, checking names, shapes and formats. The MTP
/// module is loaded when the checkpoint has it (see [`mtp_available`]); its
/// full-precision matrices are quantized to [`mtp_format`] of the dense format.
pub fn load_dense(
    cfg: &GlmConfig,
    ck: &Checkpoint,
    opts: LoadOptions,
    with_mtp: bool,
) -> Result<DenseWeights, ModelError> {
    let h = cfg.hidden_size;
    let dense = opts.dense();
    let sparse = cfg.mlp_sparse().map_err(ModelError::Weights)?;
    let kinds = match cfg.family() {
        MlaFamily::GlmMoeDsa => cfg.indexer_kinds().map_err(ModelError::Weights)?,
        MlaFamily::DeepseekV3 => vec![IndexerKind::Shared; cfg.num_hidden_layers],
    };
    let glm = cfg.family() == MlaFamily::GlmMoeDsa;
    let embed = Arc::new(dense.load(ck, "model.embed_tokens.weight", cfg.vocab_size, h)?);
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for l in 0..cfg.num_hidden_layers {
        let full = glm && kinds[l] == IndexerKind::Full;
        layers.push(load_layer(cfg, ck, l, sparse[l], full, dense)?);
    }
    let final_norm = ck.f32_tensor("model.norm.weight", &[h])?;
    let lm_head = if ck.has("lm_head.weight") {
        Arc::new(dense.load(ck, "lm_head.weight", cfg.vocab_size, h)?)
    } else if cfg.tie_word_embeddings {
        embed.clone()
    } else {
        return Err(ModelError::Weights(
            "lm_head.weight is missing and tie_word_embeddings is false".into(),
        ));
    };
    let mtp = if with_mtp {
        let l = cfg.num_hidden_layers;
        let dense = dense.with_format(mtp_format(dense.format));
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let indexer = glm && ck.has(&n("self_attn.indexer.wq_b.weight"));
        let head_name = n("shared_head.head.weight");
        Some(MtpWeights {
            enorm: ck.f32_tensor(&n("enorm.weight"), &[h])?,
            hnorm: ck.f32_tensor(&n("hnorm.weight"), &[h])?,
            eh_proj: dense.load(ck, &n("eh_proj.weight"), h, 2 * h)?,
            layer: load_layer(cfg, ck, l, true, indexer, dense)?,
            head_norm: ck.f32_tensor(&n("shared_head.norm.weight"), &[h])?,
            head: if ck.has(&head_name) {
                Some(dense.load(ck, &head_name, cfg.vocab_size, h)?)
            } else {
                None
            },
        })
    } else {
        None
    };
    Ok(DenseWeights {
        embed,
        layers,
        final_norm,
        lm_head,
        mtp,
    })
}

/// The byte ranges of every routed expert of the sparse layers (and of the
/// MTP layer when `with_mtp`), and the codec that decodes them. Every expert
/// must share one layout (dtypes and sizes), which is checked.
pub fn expert_map(
    cfg: &GlmConfig,
    ck: &Checkpoint,
    opts: LoadOptions,
    with_mtp: bool,
) -> Result<(ExpertMap, ExpertCodec), ModelError> {
    let (h, inter) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let sparse = cfg.mlp_sparse().map_err(ModelError::Weights)?;
    let total_layers = cfg.num_hidden_layers + usize::from(with_mtp);
    let mut map = ExpertMap::new(ck.files().to_vec(), total_layers, cfg.n_routed_experts);
    let mut layouts = LayoutCollector::new(total_layers);
    #[allow(clippy::needless_range_loop)]
    for l in 0..total_layers {
        if !sparse.get(l).copied().unwrap_or(true) {
            continue;
        }
        for e in 0..cfg.n_routed_experts {
            let key = ExpertKey::new(l as u32, e as u32);
            let (extent, layout) = checkpoint_expert(ck, key, h, inter, ExpertNaming::MLP)?;
            layouts.add(key, layout).map_err(ModelError::Weights)?;
            map.set_extent(key, extent)
                .map_err(|err| ModelError::Weights(err.to_string()))?;
        }
    }
    let main_layers = cfg.num_hidden_layers;
    let codec = layouts
        .finish(|l| {
            if l >= main_layers {
                mtp_format(opts.expert_format)
            } else {
                opts.expert_format
            }
        })
        .map_err(ModelError::Weights)?
        .with_int8_acts(opts.int8_acts);
    Ok((map, codec))
}
