//! The real model behind `coli serve` and `coli chat`: one [`Session`] per
//! KV slot, text through the tokenizer and chat template, replies streamed
//! through a [`StreamDecoder`], and every slot mirrored to its state file.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use colibri_actors::SourceStats;

use super::slot_store::SlotStore;
use super::{Engine, EngineError, Session};
use crate::chat_template::{ChatMessage, ChatTemplate, Family, TemplateError};
use crate::sampling::{Sampler, SamplingParams};
use crate::serve::{GenOutcome, GenParams, ServeEngine};
use crate::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

/// Why a serve-engine call failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeEngineError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("chat template: {0}")]
    Template(#[from] TemplateError),
    #[error("KV slot {slot} does not exist ({slots} slots)")]
    BadSlot { slot: usize, slots: usize },
    #[error("--kv-slots must be between 1 and 16, got {0}")]
    SlotCount(usize),
}

/// How the slots are set up.
#[derive(Clone, Debug)]
pub struct SlotOptions {
    /// Conversations held at once (1..=16).
    pub kv_slots: usize,
    /// Context length of a slot (used to drop over-long saved state).
    pub max_ctx: usize,
    /// Top-k cut for every sampler (0 = none).
    pub top_k: usize,
    /// Directory of the `.coli_kv` files; `None` = no saving.
    pub state_dir: Option<PathBuf>,
}

/// What the last generation call measured, beyond the STAT fields.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LastCall {
    pub outcome: Option<GenOutcome>,
    /// Seconds from the call to the first sampled token.
    pub first_token_secs: f64,
    /// Tokens prefilled.
    pub prompt_tokens: usize,
}

/// [`ServeEngine`] over a loaded [`Engine`].
pub struct EngineServer {
    engine: Engine,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    slots: Vec<Session>,
    top_k: usize,
    store: Option<SlotStore>,
    diag: Box<dyn Write + Send>,
    last: LastCall,
}

/// A seed for calls that name none: different per call, as upstream.
fn fresh_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

fn hit_pct(before: &SourceStats, after: &SourceStats) -> f64 {
    let hits = after.hits.saturating_sub(before.hits);
    let misses = after.misses.saturating_sub(before.misses);
    if hits + misses == 0 {
        0.0
    } else {
        100.0 * hits as f64 / (hits + misses) as f64
    }
}

impl EngineServer {
    /// Builds the slots, the chat template (tokenizer_config.json, else the
    /// family's built-in one) and, with a state directory, restores each slot
    /// from its file. Messages (restored slots, ignored files) go to `diag`.
    pub fn new(
        mut engine: Engine,
        opts: &SlotOptions,
        mut diag: Box<dyn Write + Send>,
    ) -> Result<Self, ServeEngineError> {
        if opts.kv_slots == 0 || opts.kv_slots > crate::serve::MAX_KV_SLOTS {
            return Err(ServeEngineError::SlotCount(opts.kv_slots));
        }
        engine.tokenizer()?;
        let tokenizer = engine
            .tokenizer
            .take()
            .ok_or_else(|| TokenizerError::Missing(engine.dir.join("tokenizer.json")))?;
        let cfg_path = engine.dir.join("tokenizer_config.json");
        let family = template_family(&engine.dir);
        let template = if cfg_path.is_file() {
            ChatTemplate::from_tokenizer_config(&cfg_path, family)?
        } else {
            let _ = writeln!(
                diag,
                "coli: {} not found; using the built-in {family:?} chat template",
                cfg_path.display()
            );
            ChatTemplate::builtin(family)
        };
        let mut slots: Vec<Session> = (0..opts.kv_slots).map(|_| engine.new_session()).collect();
        let store = match &opts.state_dir {
            Some(dir) => SlotStore::open(
                dir,
                &mut slots,
                engine.state_fingerprint(),
                opts.max_ctx,
                diag.as_mut(),
            ),
            None => None,
        };
        Ok(EngineServer {
            engine,
            tokenizer,
            template,
            slots,
            top_k: opts.top_k,
            store,
            diag,
            last: LastCall::default(),
        })
    }

    /// The engine (statistics, model shape).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// What the last generation call measured.
    pub fn last_call(&self) -> LastCall {
        self.last
    }

    /// True while conversations are being saved.
    pub fn saving(&self) -> bool {
        self.store.is_some()
    }

    fn session(&mut self, slot: usize) -> Result<&mut Session, ServeEngineError> {
        let slots = self.slots.len();
        self.slots
            .get_mut(slot)
            .ok_or(ServeEngineError::BadSlot { slot, slots })
    }

    /// Runs a store operation; a failure turns saving off (with a message)
    /// instead of stopping the conversation.
    fn with_store(
        &mut self,
        op: impl FnOnce(&mut SlotStore, &[Session]) -> Result<(), colibri_actors::kv::KvError>,
    ) {
        let Some(store) = self.store.as_mut() else {
            return;
        };
        if let Err(e) = op(store, &self.slots) {
            let _ = writeln!(
                self.diag,
                "coli: saving the conversation failed ({e}); conversations will not be saved"
            );
            self.store = None;
        }
    }
}

impl ServeEngine for EngineServer {
    type Error = ServeEngineError;

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, Self::Error> {
        Ok(self.tokenizer.encode(text)?)
    }

    fn render_user_turn(&self, history: &[ChatMessage], user_text: &str) -> Result<String, Self::Error> {
        Ok(self.template.render_turn(history, user_text)?)
    }

    fn slot_tokens(&self, slot: usize) -> &[u32] {
        self.slots.get(slot).map_or(&[], |s| s.tokens.as_slice())
    }

    fn truncate_slot(&mut self, slot: usize, len: usize) -> Result<(), Self::Error> {
        self.session(slot)?.truncate(len);
        self.with_store(|st, _| st.truncate(slot, len));
        Ok(())
    }

    fn reset_slot(&mut self, slot: usize) -> Result<(), Self::Error> {
        self.session(slot)?.reset();
        self.with_store(|st, _| st.reset(slot));
        Ok(())
    }

    fn prefill_and_generate(
        &mut self,
        slot: usize,
        tokens: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenOutcome, Self::Error> {
        let slots = self.slots.len();
        let session = self
            .slots
            .get_mut(slot)
            .ok_or(ServeEngineError::BadSlot { slot, slots })?;
        let before = self.engine.stats();
        let t0 = Instant::now();
        let mut sampler = Sampler::new(SamplingParams {
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: self.top_k,
            seed: params.seed.unwrap_or_else(fresh_seed),
        });
        let stop_ids = self.engine.stop_ids.clone();
        let tok = &self.tokenizer;
        let mut stream = StreamDecoder::new();
        let mut emitted = 0usize;
        let mut decode_err: Option<TokenizerError> = None;
        let stats = session.generate(
            &mut self.engine,
            tokens,
            params.max_tokens,
            &mut sampler,
            &mut |id| {
                if stop_ids.contains(&id) {
                    // End of reply: not emitted (the session stops after it).
                    return true;
                }
                emitted += 1;
                match stream.push(tok, id) {
                    Ok(piece) if piece.is_empty() => true,
                    Ok(piece) => on_text(&piece).is_continue(),
                    Err(e) => {
                        decode_err = Some(e);
                        false
                    }
                }
            },
        )?;
        if let Some(e) = decode_err {
            return Err(e.into());
        }
        let secs = t0.elapsed().as_secs_f64();
        let outcome = GenOutcome {
            emitted,
            tok_per_s: if secs > 0.0 { emitted as f64 / secs } else { 0.0 },
            hit_pct: hit_pct(&before, &self.engine.stats()),
        };
        self.last = LastCall {
            outcome: Some(outcome),
            first_token_secs: stats.first_token_secs,
            prompt_tokens: tokens.len(),
        };
        Ok(outcome)
    }

    fn persist(&mut self, slot: usize) -> Result<(), Self::Error> {
        if slot >= self.slots.len() {
            return Err(ServeEngineError::BadSlot {
                slot,
                slots: self.slots.len(),
            });
        }
        self.with_store(|st, sessions| st.persist(slot, &sessions[slot]));
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Self::Error> {
        if let Some(store) = self.store.take()
            && let Err(e) = store.close()
        {
            let _ = writeln!(self.diag, "coli: saving the conversation failed: {e}");
        }
        Ok(())
    }
}

/// The built-in chat template family for a model directory's `model_type`.
pub fn template_family(dir: &std::path::Path) -> Family {
    let model_type = crate::config::read_json(dir)
        .ok()
        .and_then(|(_, v)| v.get("model_type").and_then(|t| t.as_str()).map(str::to_string));
    match model_type.as_deref() {
        Some("glm_moe_dsa" | "deepseek_v3") => Family::Glm,
        _ => Family::Olmoe,
    }
}
