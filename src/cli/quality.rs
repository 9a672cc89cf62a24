//! `coli quality`: how far a model's next-token distributions are from a
//! reference model's on the same text, the figure a quantization is judged
//! by. Both models read the same token ids teacher-forced; per position the
//! command compares the reference's distribution `P` with the judged one
//! `Q`: whether their most likely tokens agree, the KL divergence
//! `KL(P ‖ Q) = Σ P log(P / Q)` in nats, and each model's perplexity on the
//! text itself.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::{EngineArgs, ModelArg};
use crate::engine::{Engine, EngineOptions};
use crate::model::kv_cache::{KvType, KvTypes};
use crate::model::lm::Logits;
use crate::model::ops::argmax;

#[derive(Debug, Args)]
pub struct QualityArgs {
    /// The model to judge (its engine flags below apply to it alone).
    #[command(flatten)]
    pub model: ModelArg,
    /// The reference: usually the same checkpoint in f32. It runs on the
    /// exact path (f32 weights as stored, f32 activations, f32 KV cache)
    /// whatever the flags say.
    #[arg(long, value_name = "DIR")]
    pub reference: PathBuf,
    /// Text to score, tokenized by the judged model's tokenizer.
    #[arg(long, value_name = "FILE", conflicts_with = "ids")]
    pub text: Option<PathBuf>,
    /// Token ids to score, separated by commas or whitespace.
    #[arg(long, value_name = "FILE")]
    pub ids: Option<PathBuf>,
    /// Score at most this many positions (from the start).
    #[arg(long, default_value_t = 4096, value_parser = super::parse_count)]
    pub max_positions: usize,
    /// Cut the text into windows of this many positions, each read from an
    /// empty context (default: the model's context, or the whole text).
    #[arg(long, value_parser = super::parse_count)]
    pub window: Option<usize>,
    /// Positions per forward pass (changes speed only).
    #[arg(long, default_value_t = 256, value_parser = super::parse_count)]
    pub chunk: usize,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// What one comparison measured.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Quality {
    pub positions: usize,
    /// Positions whose most likely token is the reference's.
    pub top1_agree: usize,
    pub mean_kl: f64,
    pub max_kl: f64,
    /// Perplexity of the text (positions with a next token) under each.
    pub ppl_reference: f64,
    pub ppl_model: f64,
}

/// Natural-log softmax of `logits` in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
    logits.iter().map(|&x| x as f64 - lse).collect()
}

/// `KL(P ‖ Q)` from the two log-distributions (terms with `P = 0` are 0).
pub fn kl(lp: &[f64], lq: &[f64]) -> f64 {
    lp.iter()
        .zip(lq)
        .map(|(&a, &b)| {
            if a == f64::NEG_INFINITY {
                0.0
            } else {
                a.exp() * (a - b)
            }
        })
        .sum::<f64>()
        .max(0.0)
}

/// Every position's logits for `ids`, `chunk` positions per forward pass.
fn all_logits(engine: &mut Engine, ids: &[u32], chunk: usize) -> anyhow::Result<Vec<f32>> {
    let mut state = engine.model.new_state();
    let mut out = Vec::with_capacity(ids.len() * engine.model.vocab_size());
    for part in ids.chunks(chunk.max(1)) {
        let tag = engine.next_tag();
        out.extend(engine.model.forward(part, state.as_mut(), tag, Logits::All)?);
    }
    Ok(out)
}

/// Compares the two engines on `ids` (teacher-forced), window by window:
/// each window of `window` positions starts from an empty context, and
/// every position of it is scored.
pub fn compare(
    reference: &mut Engine,
    model: &mut Engine,
    ids: &[u32],
    window: usize,
    chunk: usize,
) -> anyhow::Result<Quality> {
    let vocab = reference.model.vocab_size();
    if model.model.vocab_size() != vocab {
        anyhow::bail!(
            "the reference has a vocabulary of {vocab} and the model {}: not the same tokenizer",
            model.model.vocab_size()
        );
    }
    if ids.is_empty() {
        anyhow::bail!("nothing to score: the text has no tokens");
    }
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        anyhow::bail!("token id {bad} is outside the vocabulary of {vocab}");
    }
    let mut q = Quality {
        positions: ids.len(),
        ..Quality::default()
    };
    let (mut nll_r, mut nll_m, mut kl_sum, mut scored) = (0f64, 0f64, 0f64, 0usize);
    for part in ids.chunks(window.max(1)) {
        let lr = all_logits(reference, part, chunk)?;
        let lm = all_logits(model, part, chunk)?;
        for p in 0..part.len() {
            let (a, b) = (&lr[p * vocab..(p + 1) * vocab], &lm[p * vocab..(p + 1) * vocab]);
            if argmax(a) == argmax(b) {
                q.top1_agree += 1;
            }
            let (la, lb) = (log_softmax(a), log_softmax(b));
            let d = kl(&la, &lb);
            kl_sum += d;
            q.max_kl = q.max_kl.max(d);
            if let Some(&next) = part.get(p + 1) {
                nll_r -= la[next as usize];
                nll_m -= lb[next as usize];
                scored += 1;
            }
        }
    }
    q.mean_kl = kl_sum / ids.len() as f64;
    let scored = scored.max(1) as f64;
    q.ppl_reference = (nll_r / scored).exp();
    q.ppl_model = (nll_m / scored).exp();
    Ok(q)
}

/// Token ids from a file of numbers separated by commas or whitespace.
fn read_ids(path: &Path) -> anyhow::Result<Vec<u32>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            s.parse::<u32>()
                .with_context(|| format!("{}: entry {} ({s:?}) is not a token id", path.display(), i + 1))
        })
        .collect()
}

/// The exact path: weights as stored, f32 activations and KV cache.
fn reference_options() -> EngineOptions {
    EngineOptions {
        int8_acts: false,
        kv_types: KvTypes::both(KvType::F32),
        ..EngineOptions::default()
    }
}

pub fn run(args: QualityArgs) -> anyhow::Result<()> {
    let dir = args.model.resolve()?;
    if args.chunk == 0 {
        return Err(super::usage("--chunk must be at least 1"));
    }
    let mut model =
        Engine::load(&dir, &args.engine.options()).with_context(|| format!("loading {}", dir.display()))?;
    let mut ids = match (&args.text, &args.ids) {
        (Some(t), None) => {
            let text = std::fs::read_to_string(t).with_context(|| format!("reading {}", t.display()))?;
            let tok = model.tokenizer.as_ref().with_context(|| {
                format!("{} has no tokenizer: give --ids instead of --text", dir.display())
            })?;
            tok.encode(&text)
                .with_context(|| format!("tokenizing {}", t.display()))?
        }
        (None, Some(p)) => read_ids(p)?,
        _ => return Err(super::usage("give the text to score: --text FILE or --ids FILE")),
    };
    ids.truncate(args.max_positions);
    let window = args
        .window
        .unwrap_or(model.model.max_positions())
        .min(model.model.max_positions());
    if window == 0 {
        return Err(super::usage("--window must be at least 1"));
    }
    let mut reference = Engine::load(&args.reference, &reference_options())
        .with_context(|| format!("loading the reference {}", args.reference.display()))?;
    let q = compare(&mut reference, &mut model, &ids, window, args.chunk)?;
    let mut out = super::output::stdout();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&q)?)?;
    } else {
        writeln!(
            out,
            "{} positions: top-1 agreement {}/{} ({:.1}%), mean KL {:.5} nats (max {:.4}), perplexity {:.3} (reference {:.3})",
            q.positions,
            q.top1_agree,
            q.positions,
            100.0 * q.top1_agree as f64 / q.positions as f64,
            q.mean_kl,
            q.max_kl,
            q.ppl_model,
            q.ppl_reference
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_is_zero_for_equal_distributions_and_positive_otherwise() {
        let a = log_softmax(&[1.0, 2.0, 3.0]);
        assert!(kl(&a, &a).abs() < 1e-15);
        let b = log_softmax(&[3.0, 2.0, 1.0]);
        // Σ p (log p - log q) by hand for these two.
        let p: Vec<f64> = a.iter().map(|x| x.exp()).collect();
        let want: f64 = (0..3).map(|i| p[i] * (a[i] - b[i])).sum();
        assert!((kl(&a, &b) - want).abs() < 1e-12 && want > 0.1);
        // log_softmax sums to one.
        assert!((b.iter().map(|x| x.exp()).sum::<f64>() - 1.0).abs() < 1e-12);
    }
}
