//! A loaded model plus what running it needs: the expert source, the
//! tokenizer, stop ids, and the generation loop over a conversation's state.

pub mod context;
mod generate;
mod model_files;
mod options;
pub mod profile;
mod slot_store;
pub mod speculative;
pub mod state;
pub mod usage;

pub use model_files::{ModelFiles, ModelFilesError};

pub use generate::{GenStats, PREFILL_CHUNK, Session, StopReason};
pub use options::{DEFAULT_KV_TYPES, EngineOptions, Placement, PromptCacheSize};
pub use slot_store::{RECORD_FORMAT_VERSION, SlotStore, kv_layout, state_layout};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use colibri_actors::cache::memory_headroom;
use colibri_actors::{
    ExpertMap, ExpertSource, MappedSource, PipelineConfig, PipelineProfile, PipelineSource, Predictor,
    SimSpec, SourceStats, Tag,
};

use crate::model::ModelError;
use crate::model::expert::{ExpertCodec, ExpertWeights};
use crate::model::lm::LanguageModel;
use crate::model::olmoe::LoadOptions;
use crate::progress::Progress;
use crate::quant::QFormat;
use crate::tokenizer::{Tokenizer, TokenizerError};
use usage::{CountingSource, PinMode, UsageRecorder, UsageStart, UsageTap};

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("invalid option: {0}")]
    Option(String),
    /// `--ctx` beyond the model's positions or the budget.
    #[error(transparent)]
    Context(#[from] context::ContextError),
    #[error(transparent)]
    Forward(#[from] crate::model::lm::ForwardError),
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("{0}")]
    Files(String),
}

/// Builds the expert source a model streams its experts through, from the
/// model's expert map, its decoder and (for the pilot) its router math.
pub struct SourceFactory<'a> {
    pub opts: &'a EngineOptions,
}

/// Memory the engine needs besides the expert cache, for the default budget.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryNeeds {
    /// Resident (dense) weights, already loaded.
    pub dense_bytes: u64,
    /// KV cache at full context for every slot.
    pub kv_bytes: u64,
    /// The prompt cache's budget (`--prompt-cache-mb`; 0 when off).
    pub prompt_cache_bytes: u64,
    /// Streamed placement only: expert buffers outside the cache's budget
    /// (idle in the pool, in flight, still held by compute after eviction);
    /// see [`streamed_transient_bytes`].
    pub transient_bytes: u64,
}

/// What a streamed pipeline's transient expert buffers may take, reserved
/// outside the expert cache so that the plan's total bounds peak RSS: a
/// fixed count of the largest expert (`transient_expert_buffers`).
pub fn streamed_transient_bytes(map: &ExpertMap, io_workers: usize, top_k: usize) -> u64 {
    colibri_actors::pipeline::transient_expert_buffers(io_workers, top_k) as u64 * map.max_expert_bytes()
}

/// The least expert cache a placement needs, which the default context
/// leaves it: a streamed pipeline's transient buffers plus one layer's
/// routed experts (fewer and a layer evicts its own experts); nothing for
/// `--placement mapped`, whose experts are served from the page cache.
pub fn least_expert_cache_bytes(
    map: &ExpertMap,
    placement: Placement,
    io_workers: usize,
    top_k: usize,
) -> u64 {
    match placement {
        Placement::Mapped => 0,
        Placement::Auto | Placement::Streamed => {
            streamed_transient_bytes(map, io_workers, top_k) + top_k.max(1) as u64 * map.max_expert_bytes()
        }
    }
}

/// How the KV cache is sized: per position of one slot, and the context
/// it is for ([`context::choose_context`] picks it once the budget is known).
#[derive(Clone, Copy, Debug)]
pub struct KvSizing {
    pub per_position: u64,
    /// A sequence's state besides its positions (recurrent layers).
    pub per_sequence: u64,
    pub request: context::ContextRequest,
}

/// Activations, scratch buffers and I/O buffers in flight.
pub const WORKING_SET_BYTES: u64 = 256 << 20;

/// How the engine's memory was budgeted: printed by `--profile` and
/// `coli bench`, so a run's peak RSS can be held against what it planned.
#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    pub needs: MemoryNeeds,
    /// The expert cache's byte budget (`None`: unlimited).
    pub cache_budget: Option<u64>,
    /// Where the total came from (`--ram-gb`, a cgroup limit, MemAvailable).
    pub source: String,
    /// Positions per slot the KV cache is sized for (`--ctx`, else the
    /// model's as the budget allows).
    pub ctx: usize,
    /// Set when the budget held the default context below the model's
    /// positions: the sentence saying so.
    pub ctx_capped: Option<String>,
}

impl MemoryPlan {
    /// Everything the engine planned to hold: dense weights, KV cache at
    /// full context, prompt cache, working set and the expert cache.
    pub fn engine_total(&self) -> Option<u64> {
        Some(
            self.cache_budget?
                + self.needs.dense_bytes
                + self.needs.kv_bytes
                + self.needs.prompt_cache_bytes
                + WORKING_SET_BYTES
                + self.needs.transient_bytes,
        )
    }
}

impl std::fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = |b: u64| b as f64 / (1u64 << 30) as f64;
        match (self.engine_total(), self.cache_budget) {
            (Some(t), Some(c)) => write!(
                f,
                "memory budget {:.2} GiB (dense {:.2} + KV {:.2}{} + working set {:.2}{} + expert cache {:.2}) from {}",
                g(t),
                g(self.needs.dense_bytes),
                g(self.needs.kv_bytes),
                if self.needs.prompt_cache_bytes > 0 {
                    format!(" + prompt cache {:.2}", g(self.needs.prompt_cache_bytes))
                } else {
                    String::new()
                },
                g(WORKING_SET_BYTES),
                if self.needs.transient_bytes > 0 {
                    format!(" + expert buffers in flight {:.2}", g(self.needs.transient_bytes))
                } else {
                    String::new()
                },
                g(c),
                self.source
            ),
            _ => write!(f, "memory budget: unlimited ({})", self.source),
        }
    }
}

/// Peak resident set size of this process (`VmHWM`), where readable.
pub fn peak_rss_bytes() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = t.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

impl SourceFactory<'_> {
    /// The pipelined source configured from the engine options. The cache
    /// budget is `--ram-gb` minus everything else the engine holds, or by
    /// default what MemAvailable leaves after the KV cache and working set
    /// (the dense weights are already loaded when this runs, so
    /// MemAvailable no longer counts them).
    pub fn build(
        &self,
        map: ExpertMap,
        codec: ExpertCodec,
        predictor: Option<Arc<dyn Predictor>>,
        top_k: usize,
        mut needs: MemoryNeeds,
        kv: KvSizing,
    ) -> Result<Built, EngineError> {
        let o = self.opts;
        let disk_sim = match &o.disk_sim {
            Some(spec) => Some(
                spec.parse::<SimSpec>()
                    .map_err(|e| EngineError::Option(format!("--disk-sim {spec:?}: {e}")))?,
            ),
            None => None,
        };
        // The budget's total, and what it must hold besides the KV cache,
        // the prompt cache, the working set and the expert cache: the dense
        // weights under --ram-gb; nothing under the default, which is
        // measured after they loaded (a cgroup's usage and MemAvailable
        // already count them).
        let (total, fixed, source) = match o.ram_gb {
            Some(g) if !(g.is_finite() && g > 0.0) => {
                return Err(EngineError::Option(format!(
                    "--ram-gb must be a positive number, got {g}"
                )));
            }
            Some(g) => (
                Some((g * (1u64 << 30) as f64) as u64),
                needs.dense_bytes,
                String::from("--ram-gb"),
            ),
            None => match memory_headroom() {
                // 90% of the headroom left after the dense weights loaded.
                Some(h) => (Some(h.bytes / 10 * 9), 0, format!("90% of {h}")),
                None => (None, 0, "no readable memory limit".into()),
            },
        };
        let least = least_expert_cache_bytes(&map, o.placement, o.io_workers, top_k);
        let kv_at =
            |ctx: usize| (kv.per_position * ctx as u64 + kv.per_sequence) * kv.request.slots.max(1) as u64;
        let fits = |ctx: usize| {
            total.is_some_and(|t| {
                let k = kv_at(ctx);
                fixed + k + o.prompt_cache.bytes(k, Some(t)) + WORKING_SET_BYTES + least <= t
            })
        };
        let budget = total.map(|t| context::ContextBudget {
            room: t.saturating_sub(fixed + WORKING_SET_BYTES + least),
            fits: &fits,
            kv_bytes: &kv_at,
        });
        let chosen = context::choose_context(&kv.request, budget.as_ref())?;
        needs.kv_bytes = kv_at(chosen.ctx);
        needs.prompt_cache_bytes = o.prompt_cache.bytes(needs.kv_bytes, total);
        let mut ram_budget_bytes = match (o.ram_gb, total) {
            (Some(g), Some(total)) => {
                let others =
                    needs.dense_bytes + needs.kv_bytes + needs.prompt_cache_bytes + WORKING_SET_BYTES;
                let budget = total.saturating_sub(others);
                if budget == 0 {
                    return Err(EngineError::Option(format!(
                        "--ram-gb {g}: the dense weights, KV cache, prompt cache and working set alone need {:.2} GB",
                        others as f64 / (1u64 << 30) as f64
                    )));
                }
                Some(budget)
            }
            (None, Some(usable)) => {
                Some(usable.saturating_sub(needs.kv_bytes + needs.prompt_cache_bytes + WORKING_SET_BYTES))
            }
            _ => None,
        };
        let placement = self.placement(&map, ram_budget_bytes);
        if placement == Placement::Streamed
            && let Some(budget) = ram_budget_bytes
        {
            let transient = streamed_transient_bytes(&map, o.io_workers, top_k);
            if let Some(g) = o.ram_gb
                && budget <= transient
            {
                return Err(EngineError::Option(format!(
                    "--ram-gb {g}: after the dense weights, KV cache and working set, {:.2} GB is left, not enough for the {:.2} GB of expert buffers a streamed pipeline holds in flight",
                    budget as f64 / (1u64 << 30) as f64,
                    transient as f64 / (1u64 << 30) as f64
                )));
            }
            needs.transient_bytes = transient;
            ram_budget_bytes = Some(budget.saturating_sub(transient).max(1));
        }
        let plan = MemoryPlan {
            needs,
            cache_budget: ram_budget_bytes,
            source,
            ctx: chosen.ctx,
            ctx_capped: chosen.capped,
        };
        tracing::info!(?placement, budget = ?ram_budget_bytes, "expert placement");
        let tap = Arc::new(UsageTap::new(
            crate::routing::RoutingTrace::new(
                map.layers,
                map.experts_per_layer,
                top_k,
                usage::layer_expert_bytes(&map),
            ),
            usage::cache_capacity(placement, o.cache_cap, ram_budget_bytes, &map),
            o.pin_share,
        ));
        let counted = |inner: Arc<dyn ExpertSource<ExpertWeights>>| -> Arc<dyn ExpertSource<ExpertWeights>> {
            Arc::new(CountingSource::new(inner, tap.clone()))
        };
        if placement == Placement::Mapped {
            let source =
                MappedSource::open(map, Box::new(codec), ram_budget_bytes, true).map_err(ModelError::from)?;
            return Ok((counted(Arc::new(source)), plan, tap));
        }
        let config = PipelineConfig {
            io_workers: o.io_workers.max(1),
            cache_cap: o.cache_cap,
            ram_budget_bytes,
            pilot: o.pilot && predictor.is_some(),
            pilot_k: o.pilot_k.unwrap_or(top_k).max(1),
            pilot_thread: o.pilot_thread,
            direct: o.direct,
            mmap: o.mmap,
            drop_cache: false,
            disk_sim,
            overlap: o.overlap,
            ..PipelineConfig::default()
        };
        let source =
            PipelineSource::open(map, Box::new(codec), predictor, config).map_err(ModelError::from)?;
        Ok((counted(Arc::new(source)), plan, tap))
    }
}

impl SourceFactory<'_> {
    /// The placement `--placement` asks for; `auto` maps the container when
    /// every expert fits the budget and no option names a streaming-only
    /// feature (a per-layer cap, a simulated disk, O_DIRECT or copy-out
    /// reads, the no-overlap baseline).
    pub fn placement(&self, map: &ExpertMap, budget: Option<u64>) -> Placement {
        let o = self.opts;
        match o.placement {
            Placement::Mapped | Placement::Streamed => o.placement,
            Placement::Auto => {
                let capped = o.cache_cap.is_some_and(|c| c < map.experts_per_layer);
                let streaming_only = capped || o.disk_sim.is_some() || o.direct || o.mmap || !o.overlap;
                let fits = budget.is_some_and(|b| MappedSource::<()>::expert_bytes(map) <= b);
                if fits && !streaming_only {
                    Placement::Mapped
                } else {
                    Placement::Streamed
                }
            }
        }
    }
}

/// A built expert source (counting into its usage tap) and its memory plan.
pub type Built = (Arc<dyn ExpertSource<ExpertWeights>>, MemoryPlan, Arc<UsageTap>);

/// A loaded model, its stop ids, how its memory was planned and its usage tap.
type Loaded = (Box<dyn LanguageModel>, Vec<u32>, MemoryPlan, Arc<UsageTap>);

/// Loads the model family named by config.json's model_type: the family
/// loads its weights and expert map, the engine builds the expert source
/// (with the family's predictor, the KV cache sized from its config), and
/// the family finishes the model around it.
fn load_family(
    files: &ModelFiles,
    opts: &EngineOptions,
    progress: Option<Arc<dyn Progress>>,
) -> Result<Loaded, EngineError> {
    let config = files.config()?;
    let load = LoadOptions {
        expert_format: QFormat::from_bits(opts.expert_bits)
            .map_err(|e| EngineError::Option(e.to_string()))?,
        dense_format: QFormat::from_bits(opts.dense_bits).map_err(|e| EngineError::Option(e.to_string()))?,
        int8_acts: opts.int8_acts,
    };
    let factory = SourceFactory { opts };
    let kv = KvSizing {
        per_position: config.kv_bytes_per_position(opts.kv_types),
        per_sequence: config.sequence_state_bytes(),
        request: context::ContextRequest {
            requested: opts.max_ctx,
            declared: config.max_positions(),
            limit: config.position_limit(),
            slots: opts.kv_slots,
            kv: opts.kv_types,
        },
    };
    let mut ck = files.weights()?;
    if let Some(p) = &progress {
        ck = ck.with_progress(p.clone());
    }
    if ck.skipped_tower_tensors() > 0 {
        tracing::info!(
            tensors = ck.skipped_tower_tensors(),
            "a multimodal release: its vision/audio towers are not loaded, only the language model runs"
        );
    }
    let family = config.into_family().load(ck, load)?;
    if let Some(p) = &progress {
        p.finish();
    }
    let needs = MemoryNeeds {
        dense_bytes: family.dense_bytes,
        kv_bytes: 0,
        prompt_cache_bytes: 0,
        transient_bytes: 0,
    };
    let (source, plan, tap) = factory.build(
        family.map,
        family.codec,
        family.predictor,
        family.top_k,
        needs,
        kv,
    )?;
    let stops = files.stop_ids(family.eos_ids);
    let mut model = (family.finish)(source);
    if !model.set_kv_types(opts.kv_types) {
        tracing::info!(
            "this family's sequence state has no KV cache type: --kv-type does not apply, it stays f32"
        );
    }
    Ok((model, stops, plan, tap))
}

/// A model ready to generate.
pub struct Engine {
    pub dir: PathBuf,
    /// What `dir` holds, and where its tokenizer, template and stop ids are.
    pub files: ModelFiles,
    pub model: Box<dyn LanguageModel>,
    pub tokenizer: Option<Tokenizer>,
    pub stop_ids: Vec<u32>,
    /// Identifies this model as loaded (shape, weights, formats): names the
    /// default state directory and guards state files ([`state`]).
    state_fingerprint: u64,
    /// How memory was budgeted at load.
    pub memory: MemoryPlan,
    /// Per-expert fetch counts and the pins they drive ([`usage`]).
    usage: Arc<UsageTap>,
    /// The engine-wide token-step clock. Every forward pass of every
    /// session gets a newer tag than all before it, because the expert
    /// source treats older tags as stale work to drop.
    generation: u64,
    step: u64,
}

impl Engine {
    /// Loads `dir` with `opts`. A missing tokenizer is not an error here
    /// (validation runs on ids); text front ends ask for it explicitly.
    pub fn load(dir: &Path, opts: &EngineOptions) -> Result<Self, EngineError> {
        Self::load_with_progress(dir, opts, None)
    }

    /// [`Engine::load`], telling `progress` how reading (and quantizing)
    /// the dense weights goes: on a large model that is what a load spends
    /// its time on (the routed experts are not read at load).
    pub fn load_with_progress(
        dir: &Path,
        opts: &EngineOptions,
        progress: Option<Arc<dyn Progress>>,
    ) -> Result<Self, EngineError> {
        let files = ModelFiles::resolve(dir).map_err(|e| EngineError::Files(e.to_string()))?;
        let (model, stop_ids, memory, usage) = load_family(&files, opts, progress)?;
        let state_fingerprint = state::model_fingerprint(&files, opts, model.fingerprint())?;
        let tokenizer = files.tokenizer()?;
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            model,
            tokenizer,
            stop_ids,
            state_fingerprint,
            memory,
            usage,
            generation: 0,
            step: 0,
        })
    }

    /// The digest of the model as loaded (shape, weights, bit widths) that
    /// conversation state files must carry.
    pub fn state_fingerprint(&self) -> u64 {
        self.state_fingerprint
    }

    /// Positions per slot the KV cache was sized for: `--ctx`, else the
    /// model's `max_position_embeddings` as far as the budget allows
    /// ([`MemoryPlan::ctx_capped`] says when it did not).
    pub fn context(&self) -> usize {
        self.memory.ctx
    }

    /// This engine's expert fetch counts and pins.
    pub fn usage(&self) -> &Arc<UsageTap> {
        &self.usage
    }

    /// Starts the usage history in `record_dir` (`None`: record nothing)
    /// and the pins `pins` asks for; see [`usage::UsageRecorder::start`].
    pub fn start_usage(
        &self,
        record_dir: Option<&Path>,
        pins: &PinMode,
    ) -> Result<(Option<UsageRecorder>, UsageStart), usage::UsageError> {
        UsageRecorder::start(
            &self.usage,
            self.model.source().as_ref(),
            self.state_fingerprint,
            record_dir,
            pins,
        )
    }

    /// The tag for the next forward pass (newer than every earlier one).
    pub fn next_tag(&mut self) -> Tag {
        self.step += 1;
        Tag::new(self.generation, self.step, 0)
    }

    /// Abandons the work in flight: in-flight expert loads and waiting
    /// fetches of older tags are dropped by the pipeline.
    pub fn cancel_in_flight(&mut self) {
        self.generation += 1;
        let tag = self.next_tag();
        self.model.source().advance(tag);
    }

    /// The tokenizer, or a clear error naming the missing file.
    pub fn tokenizer(&self) -> Result<&Tokenizer, TokenizerError> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| TokenizerError::Missing(self.dir.join("tokenizer.json")))
    }

    pub fn stats(&self) -> SourceStats {
        self.model.source().stats()
    }

    /// The pipeline's timing and I/O counters (None for sources without them).
    pub fn profile(&self) -> Option<PipelineProfile> {
        self.model.source().profile()
    }

    pub fn new_session(&self) -> Session {
        Session::new(self.model.new_state())
    }
}

/// Stop ids: generation_config.json's `eos_token_id` when present, else
/// config.json's.
pub fn stop_ids(dir: &Path, config_eos: Vec<u32>) -> Vec<u32> {
    let from_gen = std::fs::read_to_string(dir.join("generation_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|v| crate::config::token_ids(v.get("eos_token_id")))
        .unwrap_or_default();
    if from_gen.is_empty() { config_eos } else { from_gen }
}

/// The built-in chat format of a model directory's family (OLMoE's when
/// its config.json cannot be read).
pub fn template_family(dir: &Path) -> crate::chat_template::ChatFormat {
    ModelFiles::resolve(dir).map_or(crate::chat_template::ChatFormat::OLMOE, |f| f.family_format())
}
