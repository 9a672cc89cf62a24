//! The hyper-parameters llama.cpp stores under the same `{arch}.` keys for
//! every decoder architecture, read into the config.json fields
//! transformers names them by. A family's GGUF mapping (in its own folder)
//! starts from [`ArchKeys::decoder_config`] and adds what is its own, so
//! the shared keys are spelled once.

use serde_json::{Map, Value, json};

use super::{GgufError, GgufModel, optional};

/// `{arch}.`-prefixed metadata of one model.
#[derive(Clone, Copy)]
pub struct ArchKeys<'a> {
    pub model: &'a GgufModel,
    pub arch: &'static str,
}

impl<'a> ArchKeys<'a> {
    pub fn new(model: &'a GgufModel, arch: &'static str) -> Self {
        Self { model, arch }
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch)
    }

    pub fn count(&self, name: &str) -> Result<usize, GgufError> {
        self.model.metadata().get_count(&self.key(name))
    }

    pub fn opt_count(&self, name: &str) -> Result<Option<usize>, GgufError> {
        optional(self.count(name))
    }

    pub fn float(&self, name: &str) -> Result<f64, GgufError> {
        self.model.metadata().get_float(&self.key(name))
    }

    pub fn opt_float(&self, name: &str) -> Result<Option<f64>, GgufError> {
        optional(self.float(name))
    }

    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, GgufError> {
        optional(self.model.metadata().get_bool(&self.key(name)))
    }

    pub fn opt_str(&self, name: &str) -> Result<Option<&'a str>, GgufError> {
        optional(self.model.metadata().get_str(&self.key(name)))
    }

    /// Whether layer `l` has tensor `blk.l.{suffix}`.
    pub fn layer_has(&self, l: usize, suffix: &str) -> bool {
        self.model.has(&format!("blk.{l}.{suffix}"))
    }

    /// The fields every MoE decoder's config.json has: sizes, attention
    /// heads, context, RoPE (base and scaling), norm epsilon, expert
    /// counts, the tied head (the absence of `output.weight`, as llama.cpp
    /// loads it) and the special token ids.
    pub fn decoder_config(&self, model_type: &str) -> Result<Map<String, Value>, GgufError> {
        let mut c = self.base_config(model_type)?;
        if let Some(d) = self.opt_count("attention.key_length")? {
            if let Some(v) = self.opt_count("attention.value_length")?
                && v != d
            {
                return Err(GgufError::Key {
                    key: self.key("attention.value_length"),
                    reason: format!(
                        "is {v}, but the key length is {d}: colibri's attention needs them equal"
                    ),
                });
            }
            c.insert("head_dim".into(), json!(d));
        }
        Ok(c)
    }

    /// [`ArchKeys::decoder_config`] without the head size, for
    /// architectures whose `key_length` / `value_length` mean something
    /// else (MLA's latent widths).
    pub fn base_config(&self, model_type: &str) -> Result<Map<String, Value>, GgufError> {
        let m = self.model.metadata();
        let vocab = match self.opt_count("vocab_size")? {
            Some(v) => v,
            None => m.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let heads = self.count("attention.head_count")?;
        let mut c = Map::new();
        c.insert("model_type".into(), json!(model_type));
        c.insert("vocab_size".into(), json!(vocab));
        c.insert("hidden_size".into(), json!(self.count("embedding_length")?));
        c.insert("num_hidden_layers".into(), json!(self.count("block_count")?));
        c.insert("num_attention_heads".into(), json!(heads));
        c.insert(
            "num_key_value_heads".into(),
            json!(self.opt_count("attention.head_count_kv")?.unwrap_or(heads)),
        );
        c.insert(
            "max_position_embeddings".into(),
            json!(self.count("context_length")?),
        );
        if let Some(theta) = self.opt_float("rope.freq_base")? {
            c.insert("rope_theta".into(), json!(theta));
        }
        if let Some(scaling) = self.rope_scaling()? {
            c.insert("rope_scaling".into(), scaling);
        }
        c.insert(
            "rms_norm_eps".into(),
            json!(self.float("attention.layer_norm_rms_epsilon")?),
        );
        c.insert("num_experts".into(), json!(self.count("expert_count")?));
        c.insert(
            "num_experts_per_tok".into(),
            json!(self.count("expert_used_count")?),
        );
        c.insert(
            "tie_word_embeddings".into(),
            json!(!self.model.has("output.weight")),
        );
        for (key, field) in [
            ("tokenizer.ggml.bos_token_id", "bos_token_id"),
            ("tokenizer.ggml.eos_token_id", "eos_token_id"),
            ("tokenizer.ggml.padding_token_id", "pad_token_id"),
        ] {
            if let Some(id) = optional(m.get_count(key))? {
                c.insert(field.into(), json!(id));
            }
        }
        Ok(c)
    }

    /// `rope.scaling.*` as transformers' `rope_scaling`: `linear` and `yarn`
    /// (factor and pre-scaling context); `none` or no key is none.
    fn rope_scaling(&self) -> Result<Option<Value>, GgufError> {
        let Some(kind) = self.opt_str("rope.scaling.type")? else {
            return Ok(None);
        };
        let factor = || self.float("rope.scaling.factor");
        let original = || self.opt_count("rope.scaling.original_context_length");
        match kind {
            "none" => Ok(None),
            "linear" => {
                let mut s = json!({"rope_type": "linear", "factor": factor()?});
                if let Some(o) = original()? {
                    s["original_max_position_embeddings"] = json!(o);
                }
                Ok(Some(s))
            }
            "yarn" => {
                let o = original()?.ok_or_else(|| GgufError::Key {
                    key: self.key("rope.scaling.original_context_length"),
                    reason: "is needed by YaRN scaling and missing".into(),
                })?;
                let mut s = json!({
                    "rope_type": "yarn", "factor": factor()?,
                    "original_max_position_embeddings": o,
                });
                for (key, field) in [
                    ("rope.scaling.yarn_beta_fast", "beta_fast"),
                    ("rope.scaling.yarn_beta_slow", "beta_slow"),
                ] {
                    if let Some(v) = self.opt_float(key)? {
                        s[field] = json!(v);
                    }
                }
                Ok(Some(s))
            }
            other => Err(GgufError::Key {
                key: self.key("rope.scaling.type"),
                reason: format!("is {other:?}; colibri reads \"none\", \"linear\" and \"yarn\""),
            }),
        }
    }
}
