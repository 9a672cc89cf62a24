//! The GLM-5 / DeepSeek-V3 forward pass and its [`LanguageModel`] impl.

use std::sync::Arc;

use colibri_actors::{ExpertSource, Tag};

use super::attention::{AttnCtx, Form, Selection, Span};
use super::config::GlmConfig;
use super::config::MlaFamily;
use super::moe::{Routing, moe_block};
use super::state::{Dims, GlmState, LayerCache};
use super::weights::{DenseWeights, LayerWeights, Mlp};
use crate::model::expert::ExpertWeights;
use crate::model::kv_cache::{KvType, KvTypes};
use crate::model::lm::{
    BatchItem, BatchedForward, ForwardError, LanguageModel, Logits, SequenceState, TypedItem, check_tokens,
    fingerprint, logit_rows,
};
use crate::model::ops::{Rope, rms_norm};

/// Rows of main-model hidden states kept for the MTP head beyond what it has
/// absorbed; older rows are dropped (the MTP cache then restarts later).
const MAX_PENDING_ROWS: usize = 4096;

/// One sequence's part of a layer: where its keys are, its cache, and the
/// DSA selection its indexer layers made for the following shared layers.
struct Segment<'a> {
    span: Span,
    cache: &'a mut LayerCache,
    sel: &'a mut Option<Selection>,
}

/// A GLM-5 or DeepSeek-V3 model ready to run.
pub struct Glm {
    pub cfg: GlmConfig,
    pub weights: Arc<DenseWeights>,
    pub source: Arc<dyn ExpertSource<ExpertWeights>>,
    rope: Rope,
    /// Attention form (tests force one to compare them).
    pub form: Form,
    /// Why the MTP head is unavailable, when it is.
    pub mtp_note: Option<String>,
    /// Routing of the last forward, per sparse layer and token.
    pub last_routing: Vec<Vec<Routing>>,
    /// How new states store the latent and keys (`--kv-type`; the key type,
    /// since the latent serves as keys and values).
    kv_type: KvType,
}

impl Glm {
    pub fn new(
        cfg: GlmConfig,
        weights: Arc<DenseWeights>,
        source: Arc<dyn ExpertSource<ExpertWeights>>,
        mtp_note: Option<String>,
    ) -> Self {
        let rope = cfg.rope();
        Self {
            cfg,
            weights,
            source,
            rope,
            form: Form::Auto,
            mtp_note,
            last_routing: Vec::new(),
            kv_type: KvType::default(),
        }
    }

    fn dims(&self) -> Dims {
        Dims {
            latent: self.cfg.kv_lora_rank,
            rope: self.cfg.qk_rope_head_dim,
            index: self.cfg.index_head_dim(),
        }
    }

    pub fn new_glm_state(&self) -> GlmState {
        let indexed = self
            .weights
            .layers
            .iter()
            .map(|l| l.attn.indexer.is_some())
            .collect();
        let mtp_indexed = self
            .weights
            .mtp
            .as_ref()
            .is_some_and(|m| m.layer.attn.indexer.is_some());
        GlmState::new(
            indexed,
            self.dims(),
            mtp_indexed,
            self.cfg.hidden_size,
            self.kv_type,
        )
    }

    fn embed(&self, tokens: &[u32], at: usize) -> Result<Vec<f32>, ForwardError> {
        let hidden = self.cfg.hidden_size;
        let mut x = vec![0f32; tokens.len() * hidden];
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= self.cfg.vocab_size {
                return Err(ForwardError::Token {
                    id,
                    pos: at + t,
                    vocab: self.cfg.vocab_size,
                });
            }
            self.weights
                .embed
                .dequantize_row(id as usize, &mut x[t * hidden..(t + 1) * hidden]);
        }
        Ok(x)
    }

    /// One decoder layer over `n` rows of `x` (in place).
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        lw: &LayerWeights,
        expert_layer: u32,
        tag: Tag,
        x: &mut [f32],
        span: Span,
        cache: &mut LayerCache,
        sel: &mut Option<Selection>,
        routing: &mut Vec<Vec<Routing>>,
    ) -> Result<(), ForwardError> {
        let mut segs = [Segment { span, cache, sel }];
        self.layer_seqs(lw, expert_layer, tag, x, &mut segs, routing)
    }

    /// One decoder layer over the rows of several sequences (back to back in
    /// `x`, in place): attention per sequence, norms, dense MLP, router and
    /// experts over all rows at once.
    fn layer_seqs(
        &self,
        lw: &LayerWeights,
        expert_layer: u32,
        tag: Tag,
        x: &mut [f32],
        segs: &mut [Segment<'_>],
        routing: &mut Vec<Vec<Routing>>,
    ) -> Result<(), ForwardError> {
        let cfg = &self.cfg;
        let hidden = cfg.hidden_size;
        let eps = cfg.rms_norm_eps as f32;
        let n: usize = segs.iter().map(|s| s.span.n).sum();
        let mut xn = vec![0f32; n * hidden];
        for t in 0..n {
            rms_norm(
                &x[t * hidden..(t + 1) * hidden],
                &lw.input_norm,
                eps,
                &mut xn[t * hidden..(t + 1) * hidden],
            );
        }
        let ctx = AttnCtx {
            cfg,
            rope: &self.rope,
            form: self.form,
        };
        {
            let _s = tracing::trace_span!("attention", layer = expert_layer).entered();
            let mut row0 = 0;
            for seg in segs.iter_mut() {
                let m = seg.span.n;
                let shared = match cfg.family() {
                    MlaFamily::GlmMoeDsa => seg.sel.as_ref(),
                    MlaFamily::DeepseekV3 => None,
                };
                let rows = row0 * hidden..(row0 + m) * hidden;
                let (attn, own) = ctx.attend(&lw.attn, &xn[rows.clone()], seg.span, seg.cache, shared);
                if own.is_some() {
                    *seg.sel = own;
                }
                for (a, b) in x[rows].iter_mut().zip(&attn) {
                    *a += b;
                }
                row0 += m;
            }
        }
        // Offer the residual after this layer's attention to the pilot of
        // the next layer, as OLMoE does: the prefetch then overlaps this
        // layer's experts, not only the next attention.
        if (expert_layer as usize) + 1 < cfg.num_hidden_layers {
            self.source
                .pilot(tag.at_layer(expert_layer + 1), &x[(n - 1) * hidden..n * hidden]);
        }
        for t in 0..n {
            rms_norm(
                &x[t * hidden..(t + 1) * hidden],
                &lw.post_norm,
                eps,
                &mut xn[t * hidden..(t + 1) * hidden],
            );
        }
        match &lw.mlp {
            Mlp::Dense(m) => {
                let mut y = vec![0f32; n * hidden];
                m.forward(&xn, n, &mut y);
                for (a, b) in x.iter_mut().zip(&y) {
                    *a += b;
                }
            }
            Mlp::Moe(m) => {
                let r = moe_block(
                    cfg,
                    m,
                    self.source.as_ref(),
                    tag.at_layer(expert_layer),
                    &xn,
                    n,
                    x,
                )?;
                routing.push(r);
            }
        }
        // And once more with the layer's output, the next layer's input: a
        // later guess, closer to its routing (it misses only the next
        // attention); the pilot adds the experts the first one missed.
        if (expert_layer as usize) + 1 < cfg.num_hidden_layers {
            self.source
                .pilot(tag.at_layer(expert_layer + 1), &x[(n - 1) * hidden..n * hidden]);
        }
        Ok(())
    }

    /// Runs `tokens` after the positions in `st`, appending theirs.
    pub fn forward_glm(
        &mut self,
        tokens: &[u32],
        st: &mut GlmState,
        tag: Tag,
        logits: Logits,
    ) -> Result<Vec<f32>, ForwardError> {
        let mut out = self.forward_states(&mut [(tokens, st, logits)], tag)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// One pass over the new tokens of several sequences (rows back to back):
    /// every row's numbers are independent of the others, so a sequence gets
    /// the same logits alone or in a batch.
    pub fn forward_states(
        &mut self,
        seqs: &mut [(&[u32], &mut GlmState, Logits)],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let cfg = &self.cfg;
        let hidden = cfg.hidden_size;
        let eps = cfg.rms_norm_eps as f32;
        for (tokens, st, _) in seqs.iter() {
            check_tokens(tokens, st.len, cfg.vocab_size, cfg.max_position_embeddings)?;
        }
        let n: usize = seqs.iter().map(|(t, _, _)| t.len()).sum();
        if n == 0 {
            return Ok(vec![Vec::new(); seqs.len()]);
        }
        let mut x = Vec::with_capacity(n * hidden);
        for (tokens, st, _) in seqs.iter() {
            x.extend(self.embed(tokens, st.len)?);
        }
        self.source.advance(tag.at_layer(0));
        // Dense leading layers (GLM-5 has three): guess the first sparse
        // layer's experts from the embedding already, so their reads run
        // while the dense layers compute instead of leaving the disk idle
        // from the last sparse layer of one token to the first of the next.
        if let Some(first) = self
            .weights
            .layers
            .iter()
            .position(|lw| matches!(lw.mlp, Mlp::Moe(_)))
            && first > 0
        {
            self.source
                .pilot(tag.at_layer(first as u32), &x[(n - 1) * hidden..n * hidden]);
        }
        let mut sels: Vec<Option<Selection>> = vec![None; seqs.len()];
        let mut routing = Vec::new();
        for (l, lw) in self.weights.layers.iter().enumerate() {
            let _span = tracing::trace_span!("layer", l).entered();
            let mut segs: Vec<Segment<'_>> = seqs
                .iter_mut()
                .zip(sels.iter_mut())
                .map(|((tokens, st, _), sel)| Segment {
                    span: Span {
                        base: 0,
                        start: st.len,
                        n: tokens.len(),
                    },
                    cache: &mut st.layers[l],
                    sel,
                })
                .collect();
            self.layer_seqs(lw, l as u32, tag, &mut x, &mut segs, &mut routing)?;
        }
        self.last_routing = routing;

        // Final norm of every row (the MTP head reads them too).
        let mut xs = vec![0f32; n * hidden];
        for t in 0..n {
            rms_norm(
                &x[t * hidden..(t + 1) * hidden],
                &self.weights.final_norm,
                eps,
                &mut xs[t * hidden..(t + 1) * hidden],
            );
        }
        let mut sel_rows = Vec::new();
        let mut counts = Vec::with_capacity(seqs.len());
        let mut row0 = 0;
        for (tokens, st, want) in seqs.iter_mut() {
            let m = tokens.len();
            let start = st.len;
            st.len += m;
            if self.weights.mtp.is_some() {
                let rows = &xs[row0 * hidden..(row0 + m) * hidden];
                st.pending.push(start, tokens, rows, hidden, MAX_PENDING_ROWS);
            }
            let wanted = logit_rows(*want, m);
            counts.push(wanted.len());
            for t in wanted {
                sel_rows.extend_from_slice(&xs[(row0 + t) * hidden..(row0 + t + 1) * hidden]);
            }
            row0 += m;
        }
        let _s = tracing::trace_span!("lm_head").entered();
        let vocab = cfg.vocab_size;
        let total: usize = counts.iter().sum();
        let mut all = vec![0f32; total * vocab];
        if total > 0 {
            self.weights.lm_head.matmul(&sel_rows, total, &mut all);
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for k in counts {
            out.push(all[at * vocab..(at + k) * vocab].to_vec());
            at += k;
        }
        Ok(out)
    }

    /// Runs the MTP layer over `n` rows `[enorm(embed(tok_{p+1})) ; hnorm(h_p)]`
    /// for positions `p = start..start + n`, appending to the MTP cache, and
    /// returns the layer's output rows (pre-norm).
    fn mtp_rows(
        &self,
        st: &mut GlmState,
        next_tokens: &[u32],
        h: &[f32],
        start: usize,
        tag: Tag,
    ) -> Result<Vec<f32>, ForwardError> {
        let Some(m) = self.weights.mtp.as_ref() else {
            return Ok(Vec::new());
        };
        let hidden = self.cfg.hidden_size;
        let eps = self.cfg.rms_norm_eps as f32;
        let n = next_tokens.len();
        let e = self.embed(next_tokens, start + 1)?;
        let mut cat = vec![0f32; n * 2 * hidden];
        for t in 0..n {
            let row = &mut cat[t * 2 * hidden..(t + 1) * 2 * hidden];
            let (a, b) = row.split_at_mut(hidden);
            rms_norm(&e[t * hidden..(t + 1) * hidden], &m.enorm, eps, a);
            rms_norm(&h[t * hidden..(t + 1) * hidden], &m.hnorm, eps, b);
        }
        let mut x = vec![0f32; n * hidden];
        m.eh_proj.matmul(&cat, n, &mut x);
        let mtp = &mut st.mtp;
        if mtp.len == 0 || mtp.base + mtp.len != start {
            mtp.truncate_to(0, st.dims, st.mtp_indexed);
            mtp.base = start;
        }
        let span = Span {
            base: mtp.base,
            start,
            n,
        };
        let mut sel = None;
        let mut routing = Vec::new();
        let layer = self.cfg.num_hidden_layers as u32;
        self.layer(
            &m.layer,
            layer,
            tag,
            &mut x,
            span,
            &mut mtp.cache,
            &mut sel,
            &mut routing,
        )?;
        mtp.len += n;
        Ok(x)
    }

    fn mtp_logits(&self, x: &[f32]) -> Vec<f32> {
        let Some(m) = self.weights.mtp.as_ref() else {
            return Vec::new();
        };
        let mut xn = vec![0f32; x.len()];
        rms_norm(x, &m.head_norm, self.cfg.rms_norm_eps as f32, &mut xn);
        let head = m.head.as_ref().unwrap_or(&self.weights.lm_head);
        let mut out = vec![0f32; self.cfg.vocab_size];
        head.matvec(&xn, &mut out);
        out
    }

    /// Up to `k` draft tokens after `next` (the token that will occupy
    /// position `st.len`), from the MTP head: first the verified history the
    /// head has not seen is absorbed into its cache in one batch, then the
    /// chain `h' = layer(eh_proj[enorm(embed(tok)); hnorm(h)])` runs `k`
    /// steps. The draft steps' cache entries are dropped afterwards.
    pub fn mtp_draft(
        &self,
        st: &mut GlmState,
        next: u32,
        k: usize,
        tag: Tag,
    ) -> Result<Vec<u32>, ForwardError> {
        let hidden = self.cfg.hidden_size;
        if self.weights.mtp.is_none() || k == 0 || st.len == 0 {
            return Ok(Vec::new());
        }
        let p = st.len - 1;
        let Some(first) = st.pending.first() else {
            return Ok(Vec::new());
        };
        if first > p || st.pending.end() != st.len {
            return Ok(Vec::new());
        }
        // Absorb (h_q, tok_{q+1}) for q in [from, p).
        let mtp_end = st.mtp.base + st.mtp.len;
        let from = if st.mtp.len > 0 && mtp_end >= first && mtp_end <= p {
            mtp_end
        } else {
            first
        };
        if from < p {
            let (h, toks) = st.pending.rows(from, p, hidden);
            self.mtp_rows(st, &toks, &h, from, tag)?;
        }
        st.pending.drop_before(p, hidden);
        let (mut h, _) = st.pending.rows(p, p + 1, hidden);
        let mut tok = next;
        let mut drafts = Vec::with_capacity(k);
        for g in 0..k {
            if p + g + 2 >= self.cfg.max_position_embeddings {
                break;
            }
            let x = self.mtp_rows(st, &[tok], &h, p + g, tag)?;
            let logits = self.mtp_logits(&x);
            tok = crate::model::ops::argmax(&logits) as u32;
            drafts.push(tok);
            h = x;
        }
        st.mtp.truncate_to(p, st.dims, st.mtp_indexed);
        Ok(drafts)
    }
}

impl BatchedForward for Glm {
    type State = GlmState;
    fn run_batch(
        &mut self,
        seqs: &mut [TypedItem<'_, GlmState>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        self.forward_states(seqs, tag)
    }
}

impl LanguageModel for Glm {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
    fn max_positions(&self) -> usize {
        self.cfg.max_position_embeddings
    }
    fn fingerprint(&self) -> u64 {
        let c = &self.cfg;
        let indexed: u64 = self
            .weights
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| u64::from(l.attn.indexer.is_some()) << (i % 64))
            .fold(0, |a, b| a ^ b);
        fingerprint(&[
            0x474c_4d35, // "GLM5"
            c.vocab_size as u64,
            c.hidden_size as u64,
            c.num_hidden_layers as u64,
            c.num_attention_heads as u64,
            c.kv_lora_rank as u64,
            c.qk_rope_head_dim as u64,
            c.index_head_dim() as u64,
            indexed,
            c.n_routed_experts as u64,
        ])
    }
    fn new_state(&self) -> Box<dyn SequenceState> {
        Box::new(self.new_glm_state())
    }
    fn set_kv_types(&mut self, kv: KvTypes) -> bool {
        self.kv_type = kv.k;
        true
    }
    fn forward(
        &mut self,
        tokens: &[u32],
        state: &mut dyn SequenceState,
        tag: Tag,
        logits: Logits,
    ) -> Result<Vec<f32>, ForwardError> {
        self.forward_one(tokens, state, tag, logits)
    }
    fn forward_batch(
        &mut self,
        items: &mut [BatchItem<'_>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        self.forward_many(items, tag)
    }
    fn source(&self) -> &Arc<dyn ExpertSource<ExpertWeights>> {
        &self.source
    }
    fn dense_bytes(&self) -> usize {
        self.weights.resident_bytes()
    }
    fn step_dense_bytes(&self) -> usize {
        self.weights.step_bytes()
    }
    fn draft(
        &mut self,
        state: &mut dyn SequenceState,
        next: u32,
        k: usize,
        tag: Tag,
    ) -> Result<Vec<u32>, ForwardError> {
        let st = state
            .as_any_mut()
            .downcast_mut::<GlmState>()
            .ok_or(ForwardError::State)?;
        self.mtp_draft(st, next, k, tag)
    }
    fn draft_head(&self) -> Result<(), String> {
        match (&self.weights.mtp, &self.mtp_note) {
            (Some(_), _) => Ok(()),
            (None, Some(note)) => Err(note.clone()),
            (None, None) => Err("the model has no MTP head".into()),
        }
    }
}
