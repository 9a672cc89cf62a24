//! What one generation request may ask for, defined once. Every front end
//! (`coli run` and `coli chat` flags, `coli serve`'s flags, its `PROMPT`
//! frames and `--batch` `SUBMIT` frames, the OpenAI and Anthropic
//! endpoints) checks its values here, so a value means the same everywhere
//! and a bad one is refused in the same words; a front end only puts in
//! front the name its users spell (`--max-tokens`, `PROMPT max_tokens`,
//! `'max_tokens'`). The ranges are OpenAI's where OpenAI has one; the table
//! users read is in docs/serve-protocol.md ("Request limits").
//!
//! Values arrive as text (a flag, a frame field, a JSON number as JSON
//! writes it), so one parser per value serves every front end.

/// A value outside its range, or a list too long.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("must be {rule}, got {got}")]
    Value { rule: &'static str, got: String },
    #[error("may hold at most {max} strings, got {got}")]
    TooMany { max: usize, got: usize },
}

/// `max_tokens`: a reply generates at least one token (a front end that
/// wants only a prefill has no reason to ask for a reply).
pub const MAX_TOKENS_RULE: &str = "a whole number >= 1";
/// Temperature: 0 is greedy; OpenAI's upper end.
pub const TEMPERATURE_RULE: &str = "a number in [0, 2]";
pub const MAX_TEMPERATURE: f64 = 2.0;
/// Nucleus sampling: 1 keeps every token, 0 would keep none.
pub const TOP_P_RULE: &str = "a number in (0, 1]";
/// Top-k: 0 cuts nothing.
pub const TOP_K_RULE: &str = "a whole number >= 0";
/// A seed is 64 bits; a negative one (JSON clients send them) stands for
/// the same bits unsigned.
pub const SEED_RULE: &str = "a whole number between -2^63 and 2^64 - 1";
/// A context length.
pub const CONTEXT_RULE: &str = "a whole number >= 1";

/// Stop strings of one OpenAI request (OpenAI's own limit).
pub const OPENAI_MAX_STOPS: usize = 4;
/// Stop sequences of one Anthropic request.
pub const ANTHROPIC_MAX_STOPS: usize = 16;

/// Positions kept free at the end of the context: the last generated
/// token's and one more.
pub const CONTEXT_MARGIN: usize = 2;

/// The value as the message quotes it: trimmed, and cut short, since it
/// may come from a client.
fn shown(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(40) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t.to_string(),
    }
}

fn refused(rule: &'static str, text: &str) -> LimitError {
    LimitError::Value {
        rule,
        got: shown(text),
    }
}

/// A whole number >= 0; one too large for 64 bits is as good as the
/// largest (every count here is capped later by something smaller).
fn whole(text: &str) -> Option<u64> {
    match text.trim().parse::<u64>() {
        Ok(n) => Some(n),
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => Some(u64::MAX),
        Err(_) => None,
    }
}

fn number(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|x| x.is_finite())
}

/// Most tokens a reply may generate.
pub fn max_tokens(text: &str) -> Result<usize, LimitError> {
    match whole(text) {
        Some(n) if n >= 1 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        _ => Err(refused(MAX_TOKENS_RULE, text)),
    }
}

/// Sampling temperature.
pub fn temperature(text: &str) -> Result<f32, LimitError> {
    match number(text) {
        Some(t) if (0.0..=MAX_TEMPERATURE).contains(&t) => Ok(t as f32),
        _ => Err(refused(TEMPERATURE_RULE, text)),
    }
}

/// Nucleus (top-p) cut; checked as the sampler will hold it (a positive
/// value too small for an `f32` would become 0).
pub fn top_p(text: &str) -> Result<f32, LimitError> {
    match number(text).map(|p| p as f32) {
        Some(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(refused(TOP_P_RULE, text)),
    }
}

/// Top-k cut (0: none); any larger k than the vocabulary cuts nothing either.
pub fn top_k(text: &str) -> Result<usize, LimitError> {
    match whole(text) {
        Some(k) => Ok(usize::try_from(k).unwrap_or(usize::MAX)),
        None => Err(refused(TOP_K_RULE, text)),
    }
}

/// Sampling seed.
pub fn seed(text: &str) -> Result<u64, LimitError> {
    let t = text.trim();
    t.parse::<u64>()
        .ok()
        .or_else(|| t.parse::<i64>().ok().map(|i| i as u64))
        .ok_or_else(|| refused(SEED_RULE, text))
}

/// A context length in tokens.
pub fn context(text: &str) -> Result<usize, LimitError> {
    match whole(text) {
        Some(n) if n >= 1 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        _ => Err(refused(CONTEXT_RULE, text)),
    }
}

/// Stop strings: at most `max` (empty ones count, then are dropped: they
/// would stop every reply before its first character).
pub fn stops(list: Vec<String>, max: usize) -> Result<Vec<String>, LimitError> {
    if list.len() > max {
        return Err(LimitError::TooMany { max, got: list.len() });
    }
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// True when `held` tokens leave room in a context of `ctx` to generate.
pub fn fits_context(held: usize, ctx: usize) -> bool {
    held.saturating_add(CONTEXT_MARGIN) <= ctx
}

/// Tokens a reply may generate after `held` tokens: `max_tokens`, cut at
/// the context's end (the reply then ends with reason "length").
pub fn reply_budget(held: usize, max_tokens: usize, ctx: usize) -> usize {
    max_tokens.min(ctx.saturating_sub(held.saturating_add(CONTEXT_MARGIN)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg<T: std::fmt::Debug>(r: Result<T, LimitError>) -> String {
        r.err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn ranges_and_their_edges() {
        assert_eq!(max_tokens("1"), Ok(1));
        assert_eq!(msg(max_tokens("0")), "must be a whole number >= 1, got 0");
        assert_eq!(msg(max_tokens("-3")), "must be a whole number >= 1, got -3");
        assert_eq!(msg(max_tokens("2.5")), "must be a whole number >= 1, got 2.5");
        assert_eq!(max_tokens("99999999999999999999"), Ok(usize::MAX));
        assert_eq!(temperature("0"), Ok(0.0));
        assert_eq!(temperature("2"), Ok(2.0));
        assert_eq!(msg(temperature("2.01")), "must be a number in [0, 2], got 2.01");
        for bad in ["-0.1", "nan", "inf", "warm", ""] {
            assert!(temperature(bad).is_err(), "{bad}");
        }
        assert_eq!(top_p("1"), Ok(1.0));
        assert_eq!(msg(top_p("0")), "must be a number in (0, 1], got 0");
        assert!(top_p("1.5").is_err() && top_p("nan").is_err());
        assert!(top_p("1e-50").is_err(), "0 as an f32");
        assert_eq!(top_k("0"), Ok(0));
        assert_eq!(msg(top_k("-1")), "must be a whole number >= 0, got -1");
        assert_eq!(seed("7"), Ok(7));
        assert_eq!(seed("-1"), Ok(u64::MAX));
        assert!(seed("1.5").is_err() && seed("x").is_err());
        assert_eq!(context("1"), Ok(1));
        assert!(context("0").is_err());
    }

    #[test]
    fn a_long_bad_value_is_cut_in_the_message() {
        let long = "9".repeat(100);
        let m = msg(temperature(&long));
        assert!(m.ends_with("...") && m.len() < 100, "{m}");
    }

    #[test]
    fn stops_count_before_dropping_empty_ones() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(stops(s(&["a", "", "b"]), 4), Ok(s(&["a", "b"])));
        assert_eq!(
            msg(stops(s(&["1", "2", "3", "4", "5"]), OPENAI_MAX_STOPS)),
            "may hold at most 4 strings, got 5"
        );
    }

    #[test]
    fn the_context_keeps_its_margin() {
        assert!(fits_context(62, 64));
        assert!(!fits_context(63, 64));
        assert!(!fits_context(usize::MAX, 64));
        assert_eq!(reply_budget(10, 100, 64), 52);
        assert_eq!(reply_budget(10, 5, 64), 5);
        assert_eq!(reply_budget(70, 5, 64), 0);
    }
}
