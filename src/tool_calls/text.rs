//! Small text helpers of the reply parsers: where the first marker is, how
//! much of a text's end could still grow into one, and the whitespace a
//! marker swallows.

/// The earliest of `markers` in `text`: its byte offset and the marker.
pub(crate) fn find_first<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|at| (at, *m)))
        .min_by_key(|(at, m)| (*at, std::cmp::Reverse(m.len())))
}

/// Bytes at the end of `text` that are a proper prefix of one of `markers`
/// (so they may still turn into it), at a character boundary.
pub(crate) fn partial_suffix(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .map(|m| {
            let max = m.len().saturating_sub(1).min(text.len());
            (1..=max)
                .rev()
                .find(|&k| {
                    text.is_char_boundary(text.len() - k)
                        && m.as_bytes().starts_with(&text.as_bytes()[text.len() - k..])
                })
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// Whether `text` could still become `marker` (it is a prefix of it).
pub(crate) fn could_become(text: &str, marker: &str) -> bool {
    marker.starts_with(text)
}

/// One stream of text (content or reasoning) with the whitespace at its
/// edges taken off: leading whitespace is dropped, trailing whitespace is
/// held until more text follows (then sent) or a marker or the end comes
/// (then dropped). Templates put newlines around their markers
/// (`content\n<tool_call>`, `<think>\n...\n</think>\n\n`) that are not
/// part of the text.
#[derive(Debug, Default)]
pub(crate) struct Trimmed {
    started: bool,
    held: String,
}

impl Trimmed {
    /// The part of `text` that can be sent now.
    pub(crate) fn feed(&mut self, text: &str) -> String {
        let body = text.trim_end();
        let tail = &text[body.len()..];
        let mut out = String::new();
        if !body.is_empty() {
            if self.started {
                out.push_str(&std::mem::take(&mut self.held));
                out.push_str(body);
            } else {
                out.push_str(body.trim_start());
                self.started = true;
            }
        }
        if self.started {
            self.held.push_str(tail);
        }
        out
    }

    /// A marker came: the held whitespace was its, and what follows starts
    /// a new run (its leading whitespace dropped too).
    pub(crate) fn cut(&mut self) {
        self.held.clear();
        self.started = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_markers_are_held() {
        assert_eq!(partial_suffix("abc<tool", &["<tool_call>"]), 5);
        assert_eq!(partial_suffix("abc<", &["<tool_call>", "<think>"]), 1);
        assert_eq!(partial_suffix("abc", &["<tool_call>"]), 0);
        // A whole marker is not a partial one.
        assert_eq!(partial_suffix("<a>", &["<a>"]), 0);
        assert_eq!(
            partial_suffix("x<｜tool", &["<｜tool▁calls▁begin｜>"]),
            "<｜tool".len()
        );
        assert_eq!(
            find_first("a</think>b<tool_call>", &["<tool_call>", "</think>"]),
            Some((1, "</think>"))
        );
    }

    #[test]
    fn whitespace_at_the_edges_is_dropped() {
        let mut t = Trimmed::default();
        let mut out = String::new();
        for piece in ["\n\n", " Hi", " there", "\n", "\n", "you", "\n\n"] {
            out.push_str(&t.feed(piece));
        }
        assert_eq!(out, "Hi there\n\nyou");
        t.cut();
        assert_eq!(t.feed("  again "), "again");
    }
}
