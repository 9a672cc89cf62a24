//! `--draft` and `--draft-k`: speculative decoding's flags, shared by
//! `coli run` (one session) and `coli serve` (the decode loop), so both
//! parse and default them the same way.

use clap::Args;

use crate::engine::speculative::{DraftMode, MAX_VERIFY_TOKENS, SpecOptions};

#[derive(Debug, Clone, Args)]
pub struct DraftArgs {
    /// Speculative decoding: off, auto (the model's next-token (MTP) head
    /// when it has one, else n-gram prompt lookup), mtp (the same, saying
    /// so when there is no head) or ngram (prompt lookup). Greedy tokens
    /// are identical to decoding without drafts.
    #[arg(long, default_value = "off", value_parser = parse_draft)]
    pub draft: Draft,
    /// Tokens drafted per verification forward.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..MAX_VERIFY_TOKENS as u64))]
    pub draft_k: u64,
}

impl DraftArgs {
    /// The speculation settings, None when `--draft off`.
    pub fn options(&self) -> Option<SpecOptions> {
        self.draft.0.map(|mode| SpecOptions {
            mode,
            max_draft: self.draft_k as usize,
            ..SpecOptions::default()
        })
    }
}

/// `--draft`: off, or where drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Draft(pub Option<DraftMode>);

pub fn parse_draft(s: &str) -> Result<Draft, String> {
    match s {
        "off" => Ok(Draft(None)),
        "auto" => Ok(Draft(Some(DraftMode::Auto))),
        "mtp" => Ok(Draft(Some(DraftMode::Mtp))),
        "ngram" => Ok(Draft(Some(DraftMode::Ngram))),
        _ => Err(format!("expected off, auto, mtp or ngram, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_parses_and_others_are_refused() {
        assert_eq!(parse_draft("off"), Ok(Draft(None)));
        assert_eq!(parse_draft("auto"), Ok(Draft(Some(DraftMode::Auto))));
        assert_eq!(parse_draft("mtp"), Ok(Draft(Some(DraftMode::Mtp))));
        assert_eq!(parse_draft("ngram"), Ok(Draft(Some(DraftMode::Ngram))));
        assert!(parse_draft("on").is_err());
    }
}
