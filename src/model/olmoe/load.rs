//! Building an OLMoE model from a checkpoint or container: the dense weights
//! are loaded (and quantized) once; the routed experts become an expert map of
//! byte ranges for the runtime.

use std::sync::Arc;

use colibri_actors::{ExpertKey, ExpertMap};

use super::OlmoeConfig;
use crate::model::ModelError;
use crate::model::attention::AttnWeights;
use crate::model::expert::{ExpertCodec, ExpertNaming, LayoutCollector, checkpoint_expert};
use crate::model::moe_decoder::{DenseWeights, Ffn, LayerWeights};
use crate::model::want::MatrixWant;
use crate::quant::{QFormat, QMatrix};
use crate::st::Checkpoint;

/// Precision choices for full-precision tensors (stored quantized tensors
/// keep their format), and whether quantized matrices multiply through
/// int8 activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    pub expert_format: QFormat,
    pub dense_format: QFormat,
    pub int8_acts: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            expert_format: QFormat::F32,
            dense_format: QFormat::F32,
            int8_acts: false,
        }
    }
}

impl LoadOptions {
    /// What the dense matrices are loaded as.
    pub fn dense(&self) -> MatrixWant {
        MatrixWant {
            format: self.dense_format,
            int8_acts: self.int8_acts,
        }
    }
}

fn layer_name(l: usize, rest: &str) -> String {
    format!("model.layers.{l}.{rest}")
}

/// Loads every resident tensor, checking names, shapes and formats.
pub fn load_dense(cfg: &OlmoeConfig, ck: &Checkpoint, opts: LoadOptions) -> Result<DenseWeights, ModelError> {
    let h = cfg.hidden_size;
    let hd = cfg.head_dim();
    let q_dim = cfg.num_attention_heads * hd;
    let kv_dim = cfg.kv_heads() * hd;
    let dense = opts.dense();
    let vec = |name: &str, n: usize| ck.f32_tensor(name, &[n]);
    let mat = |name: &str, rows: usize, cols: usize, f: MatrixWant| f.load(ck, name, rows, cols);

    let embed = Arc::new(mat("model.embed_tokens.weight", cfg.vocab_size, h, dense)?);
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for l in 0..cfg.num_hidden_layers {
        let n = |rest: &str| layer_name(l, rest);
        layers.push(LayerWeights {
            input_norm: vec(&n("input_layernorm.weight"), h)?,
            attn: AttnWeights {
                q: mat(&n("self_attn.q_proj.weight"), q_dim, h, dense)?,
                k: mat(&n("self_attn.k_proj.weight"), kv_dim, h, dense)?,
                v: mat(&n("self_attn.v_proj.weight"), kv_dim, h, dense)?,
                o: mat(&n("self_attn.o_proj.weight"), h, q_dim, dense)?,
                q_norm: vec(&n("self_attn.q_norm.weight"), q_dim)?,
                k_norm: vec(&n("self_attn.k_norm.weight"), kv_dim)?,
                bias: Default::default(),
                sinks: Vec::new(),
                gate: None,
            },
            post_norm: vec(&n("post_attention_layernorm.weight"), h)?,
            ffn: Ffn::Moe {
                router: QMatrix::from_f32(
                    cfg.num_experts,
                    h,
                    ck.f32_tensor(&n("mlp.gate.weight"), &[cfg.num_experts, h])?,
                )
                .map_err(|e| ModelError::Weights(format!("{}: {e}", n("mlp.gate.weight"))))?,
                router_bias: Vec::new(),
                correction: Vec::new(),
                shared: None,
            },
        });
    }
    let final_norm = vec("model.norm.weight", h)?;
    let lm_head = if ck.has("lm_head.weight") {
        Arc::new(mat("lm_head.weight", cfg.vocab_size, h, dense)?)
    } else if cfg.tie_word_embeddings {
        embed.clone()
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

/// The byte ranges of every routed expert, and the codec that decodes them.
/// Every expert of a layer must share one layout (dtypes and sizes), which is checked.
pub fn expert_map(
    cfg: &OlmoeConfig,
    ck: &Checkpoint,
    opts: LoadOptions,
) -> Result<(ExpertMap, ExpertCodec), ModelError> {
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let mut map = ExpertMap::new(ck.files().to_vec(), cfg.num_hidden_layers, cfg.num_experts);
    let mut layouts = LayoutCollector::new(cfg.num_hidden_layers);
    for l in 0..cfg.num_hidden_layers {
        for e in 0..cfg.num_experts {
            let key = ExpertKey::new(l as u32, e as u32);
            let (extent, layout) = checkpoint_expert(ck, key, h, inter, ExpertNaming::MLP)?;
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
