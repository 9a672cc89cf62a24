//! Stop strings over streamed text: text that could still turn into a stop
//! string is held back until it cannot, so a client never sees part of one.

/// Watches generated text for any of a request's stop strings.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not released yet.
    held: String,
}

/// What one piece of text released.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    pub text: String,
    /// A stop string was found: `text` ends just before it, and nothing
    /// after it may be sent.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds `piece`; releases what can no longer be part of a stop string.
    pub fn push(&mut self, piece: &str) -> Released {
        self.held.push_str(piece);
        if self.stops.is_empty() {
            return Released {
                text: std::mem::take(&mut self.held),
                stopped: false,
            };
        }
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = first {
            let text = self.held[..at].to_string();
            self.held.clear();
            return Released { text, stopped: true };
        }
        // Keep the longest tail that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        Released { text, stopped: false }
    }

    /// Everything still held (the reply ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`,
/// at a character boundary of `text`.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = (stop.len() - 1).min(text.len());
    (1..=max)
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k)
                && stop.as_bytes().starts_with(&text.as_bytes()[text.len() - k..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_split_across_pieces_is_never_leaked() {
        let stops = vec!["\nUser:".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("Hello\nUs").text, "Hello");
        let r = m.push("er: next");
        assert_eq!(
            r,
            Released {
                text: String::new(),
                stopped: true
            }
        );
    }

    #[test]
    fn near_miss_is_released_later() {
        assert_eq!(run(&["abc"], &["xa", "bd", "e"]), ("xabde".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true));
    }

    proptest! {
        /// However the text is split into pieces, the output is the text up
        /// to the first stop string (or all of it).
        #[test]
        fn output_is_prefix_before_first_stop(text in "[ab\\né]{0,40}", stop in "[ab\\n]{1,3}", cuts in proptest::collection::vec(0usize..40, 0..6)) {
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).filter(|&c| text.is_char_boundary(c)).collect();
            bounds.push(0);
            bounds.push(text.len());
            bounds.sort();
            bounds.dedup();
            let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let (out, stopped) = run(&[stop.as_str()], &pieces);
            match text.find(&stop) {
                Some(at) => { prop_assert!(stopped); prop_assert_eq!(out, &text[..at]); }
                None => { prop_assert!(!stopped); prop_assert_eq!(out, text); }
            }
        }
    }
}
