//! The incremental reply parser. Fed the reply's text piece by piece (as
//! the decode loop streams it), it sends content and reasoning as soon as
//! they cannot be part of a marker any more, and each tool call once its
//! block is complete. Feeding the text in any pieces gives the same
//! [`Reply`](super::Reply) as feeding it at once.

use super::dialect::{CallSyntax, Dialect, THINK_CLOSE, THINK_OPEN};
use super::harmony::Harmony;
use super::text::{Trimmed, could_become, find_first, partial_suffix};
use super::{Block, Delta, Reply, ToolSet, deepseek, glm, hermes, minimax, mistral, qwen_xml};

/// Parses one reply.
#[derive(Debug)]
pub struct ReplyParser {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Markers(Markers),
    Harmony(Box<Harmony>),
}

impl ReplyParser {
    /// A parser for a reply in `dialect`. `tools`: the tools a call may
    /// name (`None`: calls are not looked for, their text is content).
    /// `in_reasoning`: the prompt opened the reasoning
    /// ([`Dialect::starts_in_reasoning`]).
    pub fn new(dialect: Dialect, tools: Option<ToolSet>, in_reasoning: bool) -> Self {
        let inner = match dialect.calls {
            Some(CallSyntax::Harmony) => Inner::Harmony(Box::new(Harmony::new(tools))),
            calls => Inner::Markers(Markers {
                calls: calls.zip(tools),
                think: dialect.think,
                mode: if in_reasoning && dialect.think {
                    Mode::Reasoning
                } else {
                    Mode::Start
                },
                buf: String::new(),
                content: Trimmed::default(),
                reasoning: Trimmed::default(),
                unchecked: 0,
            }),
        };
        Self { inner }
    }

    /// The deltas `piece` completes.
    pub fn push(&mut self, piece: &str) -> Vec<Delta> {
        let mut out = Out::default();
        match &mut self.inner {
            Inner::Markers(m) => {
                m.buf.push_str(piece);
                m.drain(false, &mut out);
            }
            Inner::Harmony(h) => h.push(piece, false, &mut out),
        }
        out.0
    }

    /// The deltas still held at the reply's end.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Out::default();
        match &mut self.inner {
            Inner::Markers(m) => m.drain(true, &mut out),
            Inner::Harmony(h) => h.push("", true, &mut out),
        }
        out.0
    }

    /// A whole reply at once.
    pub fn parse(dialect: Dialect, tools: Option<ToolSet>, in_reasoning: bool, text: &str) -> Reply {
        let mut p = Self::new(dialect, tools, in_reasoning);
        let mut deltas = p.push(text);
        deltas.extend(p.finish());
        Reply::from_deltas(deltas)
    }
}

/// Deltas in order, neighbouring texts of one kind merged.
#[derive(Debug, Default)]
pub(crate) struct Out(pub(crate) Vec<Delta>);

impl Out {
    pub(crate) fn content(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        match self.0.last_mut() {
            Some(Delta::Content(t)) => t.push_str(&text),
            _ => self.0.push(Delta::Content(text)),
        }
    }

    pub(crate) fn reasoning(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        match self.0.last_mut() {
            Some(Delta::Reasoning(t)) => t.push_str(&text),
            _ => self.0.push(Delta::Reasoning(text)),
        }
    }

    pub(crate) fn call(&mut self, call: super::ToolCall) {
        self.0.push(Delta::Call(call));
    }
}

/// Text a pending block may gain before it is scanned again anyway.
const RESCAN_BYTES: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace yet: `<think>` may still open reasoning.
    Start,
    Reasoning,
    Content,
    /// Inside a call block (the buffer starts at its opening marker).
    Block,
}

/// The formats whose markers stand in plain text: `<think>` reasoning,
/// call blocks in content.
#[derive(Debug)]
struct Markers {
    calls: Option<(CallSyntax, ToolSet)>,
    think: bool,
    mode: Mode,
    /// Text received and not yet sent.
    buf: String,
    content: Trimmed,
    reasoning: Trimmed,
    /// In a block, how much of the buffer the last scan saw (incomplete).
    unchecked: usize,
}

/// The markers that open a block of `syntax`.
fn openers(syntax: CallSyntax) -> &'static [&'static str] {
    match syntax {
        CallSyntax::Hermes => &[hermes::OPEN],
        CallSyntax::QwenXml => &[qwen_xml::OPEN],
        CallSyntax::Glm { .. } => &[glm::OPEN],
        CallSyntax::DeepSeek { .. } => &[deepseek::OPEN],
        CallSyntax::Mistral => &[mistral::OPEN],
        CallSyntax::MiniMax => &[minimax::OPEN],
        CallSyntax::Harmony => &[],
    }
}

impl Markers {
    fn consume(&mut self, n: usize) {
        self.buf.drain(..n);
    }

    fn drain(&mut self, at_end: bool, out: &mut Out) {
        loop {
            match self.mode {
                Mode::Start => {
                    let rest = self.buf.trim_start();
                    if self.think && rest.starts_with(THINK_OPEN) {
                        let n = self.buf.len() - rest.len() + THINK_OPEN.len();
                        self.consume(n);
                        self.mode = Mode::Reasoning;
                        continue;
                    }
                    if self.think && !at_end && could_become(rest, THINK_OPEN) {
                        return;
                    }
                    self.mode = Mode::Content;
                }
                Mode::Reasoning => {
                    if let Some(at) = self.buf.find(THINK_CLOSE) {
                        let text = self.reasoning.feed(&self.buf[..at]);
                        out.reasoning(text);
                        self.reasoning.cut();
                        self.consume(at + THINK_CLOSE.len());
                        self.content.cut();
                        self.mode = Mode::Content;
                        continue;
                    }
                    let keep = if at_end {
                        0
                    } else {
                        partial_suffix(&self.buf, &[THINK_CLOSE])
                    };
                    let send = self.buf.len() - keep;
                    let text = self.reasoning.feed(&self.buf[..send]);
                    out.reasoning(text);
                    self.consume(send);
                    return;
                }
                Mode::Content => {
                    let opens = self.calls.as_ref().map_or(&[][..], |(s, _)| openers(*s));
                    if let Some((at, _)) = find_first(&self.buf, opens) {
                        let text = self.content.feed(&self.buf[..at]);
                        out.content(text);
                        self.consume(at);
                        self.mode = Mode::Block;
                        self.unchecked = 0;
                        continue;
                    }
                    let keep = if at_end {
                        0
                    } else {
                        partial_suffix(&self.buf, opens)
                    };
                    let send = self.buf.len() - keep;
                    let text = self.content.feed(&self.buf[..send]);
                    out.content(text);
                    self.consume(send);
                    return;
                }
                Mode::Block => {
                    let Some((syntax, tools)) = &self.calls else {
                        self.mode = Mode::Content;
                        continue;
                    };
                    // A block completes only at a closing bracket or marker:
                    // a little text without one need not be scanned again
                    // (more is, to find out early that it is no call).
                    let fresh = &self.buf[self.unchecked.min(self.buf.len())..];
                    if !at_end
                        && self.unchecked > 0
                        && fresh.len() < RESCAN_BYTES
                        && !fresh.contains(['}', ']', '>'])
                    {
                        return;
                    }
                    let block = match syntax {
                        CallSyntax::Hermes => hermes::scan(&self.buf, at_end, tools),
                        CallSyntax::QwenXml => qwen_xml::scan(&self.buf, at_end, tools),
                        CallSyntax::Glm { .. } => glm::scan(&self.buf, at_end, tools),
                        CallSyntax::DeepSeek { .. } => deepseek::scan(&self.buf, at_end, tools),
                        CallSyntax::Mistral => mistral::scan(&self.buf, at_end, tools),
                        CallSyntax::MiniMax => minimax::scan(&self.buf, at_end, tools),
                        CallSyntax::Harmony => Block::Bad,
                    };
                    match block {
                        Block::Pending if !at_end => {
                            self.unchecked = self.buf.len();
                            return;
                        }
                        Block::Done { calls, len } => {
                            self.content.cut();
                            for c in calls {
                                out.call(c);
                            }
                            self.consume(len);
                        }
                        Block::Pending | Block::Bad => {
                            // The marker is text after all; go on after it.
                            let opener = openers(*syntax)
                                .iter()
                                .find(|o| self.buf.starts_with(*o))
                                .map_or(1, |o| o.len());
                            let text = self.content.feed(&self.buf[..opener]);
                            out.content(text);
                            self.consume(opener);
                        }
                    }
                    self.mode = Mode::Content;
                }
            }
        }
    }
}
