//! Engine options shared by every command (README.md, "Engine options").

use crate::model::kv_cache::{KvType, KvTypes};

/// The KV cache's storage when no flag says otherwise: f16, half of f32's
/// memory (llama.cpp's default too). It keeps every oracle token of the
/// committed fixtures at f32 weights; the oracle tests that bound logits to
/// 1e-3 or run int8 activations name `f32`, the token-exact path
/// (docs/state-files.md, "KV cache types").
pub const DEFAULT_KV_TYPES: KvTypes = KvTypes::both(KvType::F16);

/// Where routed experts live while a model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Mapped when every expert fits the memory budget and no option asks
    /// for the streaming pipeline, else streamed.
    #[default]
    Auto,
    /// Served in place from a read-only mapping of the container: no copy,
    /// no I/O threads (`MappedSource`).
    Mapped,
    /// A private cache fed by the I/O workers and the pilot
    /// (`PipelineSource`), for models larger than the budget.
    Streamed,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "mapped" => Ok(Self::Mapped),
            "streamed" => Ok(Self::Streamed),
            _ => Err(format!("expected auto, mapped or streamed, got {s:?}")),
        }
    }
}

/// How much RAM the prompt cache (`runtime::prompt_cache`) may hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PromptCacheSize {
    /// No prompt cache (commands that do not serve conversations).
    #[default]
    Off,
    /// As much as the KV cache of every slot at full context (room for as
    /// many conversations again as there are slots), at most a tenth of
    /// the memory budget (`--ram-gb`, else the headroom).
    Auto,
    /// This many bytes (`--prompt-cache-mb`); 0 is off.
    Bytes(u64),
}

impl PromptCacheSize {
    /// The budget in bytes for a KV cache of `kv_bytes` and a memory total
    /// of `total` bytes (None: unknown).
    pub fn bytes(self, kv_bytes: u64, total: Option<u64>) -> u64 {
        match self {
            Self::Off => 0,
            Self::Bytes(b) => b,
            Self::Auto => total.map_or(kv_bytes, |t| kv_bytes.min(t / 10)),
        }
    }
}

/// How the engine places and runs a model. None of these may change the
/// generated tokens, only speed and memory.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOptions {
    /// Bits for full-precision routed experts (>=16 f32, 5..8 int8, 3..4 int4, 2 int2).
    pub expert_bits: u32,
    /// Bits for full-precision dense matrices.
    pub dense_bits: u32,
    pub cache_cap: Option<usize>,
    pub ram_gb: Option<f64>,
    pub pilot: bool,
    pub pilot_k: Option<usize>,
    /// Predict on the pilot thread instead of inline (`--pilot-thread`).
    pub pilot_thread: bool,
    pub io_workers: usize,
    pub direct: bool,
    pub mmap: bool,
    pub disk_sim: Option<String>,
    pub overlap: bool,
    /// Conversations held at once (sizes the KV part of the memory budget).
    pub kv_slots: usize,
    /// Positions a slot may hold (None: the model's limit); sizes the KV
    /// part of the memory budget with `kv_slots`.
    pub max_ctx: Option<usize>,
    /// Quantized matrices multiply through int8 activations (the default;
    /// `--f32-acts` turns it off). Like `--expert-bits`, a numeric choice:
    /// it changes the tokens, and the tokens then still never depend on
    /// placement. f32 weights always keep the exact path.
    pub int8_acts: bool,
    /// Where routed experts live (never changes the tokens).
    pub placement: Placement,
    /// Share of the expert cache (per layer) the usage-history pins may
    /// take, in (0, 1]; the rest stays LRU (never changes the tokens).
    pub pin_share: f64,
    /// RAM for sequence state of conversations that lost their slot,
    /// counted in the memory plan (never changes the tokens).
    pub prompt_cache: PromptCacheSize,
    /// How KV caches store keys and values (`--kv-type`, `--kv-type-k`,
    /// `--kv-type-v`). Like `--expert-bits`, a numeric choice: a compact
    /// type changes the tokens (f32 is the token-exact path), and sizes
    /// the KV part of the memory budget.
    pub kv_types: KvTypes,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            expert_bits: 32,
            dense_bits: 32,
            cache_cap: None,
            ram_gb: None,
            pilot: true,
            pilot_k: None,
            pilot_thread: false,
            io_workers: 4,
            direct: false,
            mmap: false,
            disk_sim: None,
            overlap: true,
            kv_slots: 1,
            max_ctx: None,
            int8_acts: true,
            placement: Placement::Auto,
            pin_share: crate::engine::usage::DEFAULT_PIN_SHARE,
            prompt_cache: PromptCacheSize::Off,
            kv_types: DEFAULT_KV_TYPES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PromptCacheSize;

    #[test]
    fn the_default_prompt_cache_is_the_slots_kv_at_most_a_tenth_of_the_budget() {
        let kv = 64 << 20;
        assert_eq!(PromptCacheSize::Auto.bytes(kv, None), kv);
        assert_eq!(PromptCacheSize::Auto.bytes(kv, Some(10 << 30)), kv);
        assert_eq!(PromptCacheSize::Auto.bytes(kv, Some(320 << 20)), 32 << 20);
        assert_eq!(PromptCacheSize::Bytes(5).bytes(kv, Some(1)), 5);
        assert_eq!(PromptCacheSize::Off.bytes(kv, Some(10 << 30)), 0);
    }
}
