//! llama.cpp's GBNF, read into llguidance's Lark dialect, so `grammar`
//! requests written for llama-server work here. The two differ in syntax
//! only where it matters here: `name ::= ...` against `name: ...`,
//! `[a-z]` (a character class in GBNF, an optional part in Lark), any
//! character `.`, and rule names (GBNF allows upper case and `_`-free
//! names such as `json-value`; Lark reserves upper case for terminals).
//!
//! Each rule is written on the line its definition starts on, so a Lark
//! error's line number points into the GBNF text too.

use super::compile::CompileError;

/// True when `text` reads as GBNF: its first line that is not blank or a
/// comment defines a rule with `::=`.
pub fn is_gbnf(text: &str) -> bool {
    let Some(line) = text
        .lines()
        .map(str::trim_start)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
    else {
        return false;
    };
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    name_end > 0 && line[name_end..].trim_start().starts_with("::=")
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Defines,
    /// A literal, decoded.
    Str(String),
    /// A character class: negated, and its inclusive ranges.
    Class(bool, Vec<(char, char)>),
    Any,
    /// `<...>`: a token of the tokenizer, passed through as Lark has it.
    Token(String),
    /// `( ) | * + ?` and a whole `{m,n}`, as Lark writes them.
    Punct(String),
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::CharIndices<'a>>,
    line: usize,
}

impl Lexer<'_> {
    fn err(&self, message: impl Into<String>) -> CompileError {
        CompileError::Gbnf {
            line: self.line,
            message: message.into(),
        }
    }

    fn next_char(&mut self) -> Option<char> {
        let c = self.chars.next().map(|(_, c)| c);
        if c == Some('\n') {
            self.line += 1;
        }
        c
    }

    fn peek(&mut self) -> Option<char> {
        self.chars.peek().map(|&(_, c)| c)
    }

    fn hex(&mut self, digits: usize) -> Result<char, CompileError> {
        let mut v = 0u32;
        for _ in 0..digits {
            let d = self
                .next_char()
                .and_then(|c| c.to_digit(16))
                .ok_or_else(|| self.err(format!("an escape needs {digits} hex digits")))?;
            v = v * 16 + d;
        }
        char::from_u32(v).ok_or_else(|| self.err(format!("\\u{v:x} is not a character")))
    }

    /// One character of a literal or class, escapes decoded (llama.cpp's set).
    fn literal_char(&mut self) -> Result<char, CompileError> {
        match self.next_char() {
            None => Err(self.err("the grammar ends inside a literal")),
            Some('\\') => match self.next_char() {
                Some('x') => self.hex(2),
                Some('u') => self.hex(4),
                Some('U') => self.hex(8),
                Some('t') => Ok('\t'),
                Some('r') => Ok('\r'),
                Some('n') => Ok('\n'),
                Some(c @ ('\\' | '"' | '[' | ']')) => Ok(c),
                Some(c) => Err(self.err(format!("unknown escape \\{c}"))),
                None => Err(self.err("the grammar ends inside an escape")),
            },
            Some(c) => Ok(c),
        }
    }

    fn string(&mut self) -> Result<Tok, CompileError> {
        let mut s = String::new();
        loop {
            match self.peek() {
                None | Some('\n') => return Err(self.err("a string literal is not closed")),
                Some('"') => {
                    self.next_char();
                    return Ok(Tok::Str(s));
                }
                Some(_) => s.push(self.literal_char()?),
            }
        }
    }

    fn class(&mut self) -> Result<Tok, CompileError> {
        let negated = self.peek() == Some('^');
        if negated {
            self.next_char();
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.err("a character class is not closed")),
                Some(']') => {
                    self.next_char();
                    return Ok(Tok::Class(negated, ranges));
                }
                Some(_) => {
                    let lo = self.literal_char()?;
                    if self.peek() != Some('-') {
                        ranges.push((lo, lo));
                        continue;
                    }
                    self.next_char();
                    if self.peek() == Some(']') {
                        // A trailing '-' is itself.
                        ranges.push((lo, lo));
                        ranges.push(('-', '-'));
                        continue;
                    }
                    let hi = self.literal_char()?;
                    if hi < lo {
                        return Err(self.err(format!("the range {lo:?}-{hi:?} is backwards")));
                    }
                    ranges.push((lo, hi));
                }
            }
        }
    }

    fn repeat(&mut self) -> Result<Tok, CompileError> {
        let mut body = String::new();
        loop {
            match self.next_char() {
                Some('}') => break,
                Some(c @ ('0'..='9' | ',')) => body.push(c),
                Some(' ' | '\t') => {}
                _ => return Err(self.err("a repetition must read {m}, {m,}, {m,n} or {,n}")),
            }
        }
        let (lo, hi) = match body.split_once(',') {
            Some((lo, hi)) => (lo, Some(hi)),
            None => (body.as_str(), None),
        };
        let num = |s: &str| s.parse::<u32>().ok();
        let shape = match (lo, hi) {
            ("", Some(hi)) if num(hi).is_some() => format!("{{0,{hi}}}"),
            (lo, None) if num(lo).is_some() => format!("{{{lo}}}"),
            (lo, Some("")) if num(lo).is_some() => format!("{{{lo},}}"),
            (lo, Some(hi)) if num(lo).is_some() && num(hi).is_some() => {
                if num(hi) < num(lo) {
                    return Err(self.err(format!("the repetition {{{lo},{hi}}} is backwards")));
                }
                format!("{{{lo},{hi}}}")
            }
            _ => return Err(self.err("a repetition must read {m}, {m,}, {m,n} or {,n}")),
        };
        Ok(Tok::Punct(shape))
    }

    /// Every token with the line it starts on.
    fn tokens(mut self) -> Result<Vec<(Tok, usize)>, CompileError> {
        let mut out = Vec::new();
        while let Some(c) = self.peek() {
            let line = self.line;
            if c.is_whitespace() {
                self.next_char();
                continue;
            }
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.next_char();
                }
                continue;
            }
            self.next_char();
            let tok = match c {
                '"' => self.string()?,
                '[' => self.class()?,
                '.' => Tok::Any,
                '{' => self.repeat()?,
                '(' | ')' | '|' | '*' | '+' | '?' => Tok::Punct(c.to_string()),
                ':' => {
                    if self.next_char() == Some(':') && self.next_char() == Some('=') {
                        Tok::Defines
                    } else {
                        return Err(self.err("expected ::="));
                    }
                }
                '<' => {
                    let mut s = String::from("<");
                    loop {
                        match self.next_char() {
                            Some('>') => break,
                            Some(c) if !c.is_whitespace() && c != '<' => s.push(c),
                            _ => return Err(self.err("a token reference <...> is not closed")),
                        }
                    }
                    s.push('>');
                    Tok::Token(s)
                }
                '!' if self.peek() == Some('<') => {
                    return Err(self.err("negated token references !<...> are not supported"));
                }
                c if is_name_char(c) => {
                    let mut name = c.to_string();
                    while let Some(c) = self.peek().filter(|&c| is_name_char(c)) {
                        name.push(c);
                        self.next_char();
                    }
                    Tok::Name(name)
                }
                c => return Err(self.err(format!("unexpected character {c:?}"))),
            };
            out.push((tok, line));
        }
        Ok(out)
    }
}

/// The Lark name of GBNF rule `name`: `root` is Lark's `start`; lower-case
/// names stay as they are; others get a `g_` prefix with `_` doubled and
/// each capital written `_` + its lower case (no GBNF name becomes another's).
fn lark_name(name: &str) -> String {
    if name == "root" {
        return "start".into();
    }
    let plain = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if plain && name != "start" {
        return name.to_string();
    }
    let mut out = String::from("g_");
    for c in name.chars() {
        match c {
            '_' => out.push_str("__"),
            c if c.is_ascii_uppercase() => {
                out.push('_');
                out.push(c.to_ascii_lowercase());
            }
            c => out.push(c),
        }
    }
    out
}

/// A class as a Lark regex literal; every character written `\x{...}`, so
/// nothing in it needs quoting.
fn class_regex(negated: bool, ranges: &[(char, char)]) -> String {
    if ranges.is_empty() {
        // `[^]`: any character; `[]` is refused before this.
        return r"/[\x{0}-\x{10FFFF}]/".into();
    }
    let mut s = String::from("/[");
    if negated {
        s.push('^');
    }
    for &(lo, hi) in ranges {
        s.push_str(&format!("\\x{{{:X}}}", lo as u32));
        if hi != lo {
            s.push_str(&format!("-\\x{{{:X}}}", hi as u32));
        }
    }
    s.push_str("]/");
    s
}

/// `text` (GBNF) in llguidance's Lark dialect.
pub fn to_lark(text: &str) -> Result<String, CompileError> {
    let lexer = Lexer {
        chars: text.char_indices().peekable(),
        line: 1,
    };
    let toks = lexer.tokens()?;
    let total_lines = text.lines().count().max(1);
    let mut lines = vec![String::new(); total_lines];
    let mut has_root = false;
    let mut i = 0;
    while i < toks.len() {
        let (Tok::Name(name), line) = &toks[i] else {
            return Err(CompileError::Gbnf {
                line: toks[i].1,
                message: "expected a rule definition (name ::= ...)".into(),
            });
        };
        if toks.get(i + 1).map(|t| &t.0) != Some(&Tok::Defines) {
            return Err(CompileError::Gbnf {
                line: *line,
                message: format!("expected ::= after the rule name {name}"),
            });
        }
        has_root |= name == "root";
        let mut body = Vec::new();
        i += 2;
        // A rule runs until the next `name ::=`.
        while i < toks.len() {
            let starts_rule =
                matches!(toks[i].0, Tok::Name(_)) && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Defines);
            if starts_rule {
                break;
            }
            let (tok, at) = &toks[i];
            body.push(match tok {
                Tok::Name(n) => lark_name(n),
                // serde_json writes a JSON string, which is Lark's string syntax.
                Tok::Str(s) => serde_json::to_string(s).map_err(|e| CompileError::Gbnf {
                    line: *at,
                    message: e.to_string(),
                })?,
                Tok::Class(false, r) if r.is_empty() => {
                    return Err(CompileError::Gbnf {
                        line: *at,
                        message: "the character class [] matches nothing".into(),
                    });
                }
                Tok::Class(neg, r) => class_regex(*neg, r),
                Tok::Any => class_regex(true, &[]),
                Tok::Token(t) | Tok::Punct(t) => t.clone(),
                Tok::Defines => {
                    return Err(CompileError::Gbnf {
                        line: *at,
                        message: "::= must follow a rule name".into(),
                    });
                }
            });
            i += 1;
        }
        let slot = line.saturating_sub(1).min(total_lines - 1);
        if !lines[slot].is_empty() {
            return Err(CompileError::Gbnf {
                line: *line,
                message: "put each rule definition on its own line".into(),
            });
        }
        lines[slot] = format!("{}: {}", lark_name(name), body.join(" "));
    }
    if !has_root {
        return Err(CompileError::Gbnf {
            line: 1,
            message: "the grammar has no root rule (root ::= ...)".into(),
        });
    }
    Ok(lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_gbnf_by_its_first_rule() {
        assert!(is_gbnf("# a comment\n\nroot ::= \"a\""));
        assert!(is_gbnf("json-value::=x"));
        assert!(!is_gbnf("start: \"a ::= b\""));
        assert!(!is_gbnf("%llguidance {}\nstart: x"));
        assert!(!is_gbnf(""));
    }

    #[test]
    fn translates_rules_classes_and_repetitions() {
        let g = "root ::= item (\",\" item){0,3}\n\
                 item ::= [a-zA-Z_-]+ | \"\\u00e9\\n\" | Other\n\
                 Other ::= [^\"\\\\] . \"x\"?";
        let lark = to_lark(g).expect("translates");
        let lines: Vec<&str> = lark.lines().collect();
        assert_eq!(lines[0], "start: item ( \",\" item ) {0,3}");
        assert_eq!(
            lines[1],
            r#"item: /[\x{61}-\x{7A}\x{41}-\x{5A}\x{5F}\x{2D}]/ + | "é\n" | g__other"#
        );
        assert_eq!(
            lines[2],
            r#"g__other: /[^\x{22}\x{5C}]/ /[\x{0}-\x{10FFFF}]/ "x" ?"#
        );
    }

    #[test]
    fn multi_line_rules_stay_on_their_first_line() {
        let g = "root ::= (\n  \"a\"\n  | \"b\"\n)\nb-c ::= \"c\"\n";
        let lark = to_lark(g).expect("translates");
        let lines: Vec<&str> = lark.lines().collect();
        assert_eq!(lines[0], "start: ( \"a\" | \"b\" )");
        assert_eq!(lines[4], "b-c: \"c\"");
        assert_eq!(lark_name("start"), "g_start");
        assert_eq!(lark_name("a_B"), "g_a___b");
    }

    #[test]
    fn errors_name_the_line() {
        for (g, line) in [
            ("root ::= \"a", 1),
            ("root ::= [a-", 1),
            ("root ::= x\nx ::= [z-a]", 2),
            ("root ::= \"\\q\"", 1),
            ("root ::= x{3,1}", 1),
            ("root ::= x{a}", 1),
            ("x ::= \"a\"", 1),
            ("root ::= a\n\n  := b", 3),
            ("root ::= []", 1),
            ("root ::= !<x>", 1),
            ("root ::= \"a\" @", 1),
        ] {
            match to_lark(g) {
                Err(CompileError::Gbnf { line: l, .. }) => assert_eq!(l, line, "{g:?}"),
                other => panic!("{g:?}: {other:?}"),
            }
        }
    }
}
