//! Which markers a model writes in its replies: the tool-call format and
//! whether it opens reasoning with `<think>`. The family registry names a
//! default ([`crate::chat_template::ChatFormat::dialect`]); a template whose
//! text shows another format (a fine-tune) wins over it.

/// How a model writes tool calls, as its own chat template renders them in
/// an assistant turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSyntax {
    /// Qwen3 and Hermes: `<tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>`,
    /// one block per call.
    Hermes,
    /// Qwen3-Coder and Qwen3.5 / 3.6: `<tool_call>\n<function=N>\n`, per
    /// argument `<parameter=K>\nV\n</parameter>\n`, `</function>\n</tool_call>`;
    /// values typed by the tool's schema as GLM's are.
    QwenXml,
    /// GLM-4.5 and later, GLM-5: `<tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`,
    /// string values raw and others as JSON; `newlines`: GLM-4.5/4.6 put a
    /// newline after the name and after each tag (GLM-4.7 and GLM-5 none).
    Glm { newlines: bool },
    /// gpt-oss's harmony messages: a call is a `commentary` message to
    /// `functions.N` whose body is the JSON arguments, ended by `<|call|>`;
    /// the `analysis` channel is the reasoning, `final` the answer.
    Harmony,
    /// DeepSeek: `<｜tool▁calls▁begin｜>` then per call
    /// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>`
    /// (`fenced`, V3) or `<｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`
    /// (V3.1), then `<｜tool▁calls▁end｜>`.
    DeepSeek { fenced: bool },
    /// Mistral and Mixtral: `[TOOL_CALLS] [{"name": N, "arguments": {...}}, ...]`.
    Mistral,
    /// MiniMax-M2: `<minimax:tool_call>\n`, per call `<invoke name="N">\n`,
    /// per argument `<parameter name="K">V</parameter>\n`, `</invoke>\n`,
    /// then `</minimax:tool_call>`; the calls of one block are parallel,
    /// values typed by the tool's schema as GLM's are.
    MiniMax,
}

/// The reply markers of a model: tool calls and reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dialect {
    /// How tool calls are written; `None`: the model has no tool calls we
    /// know how to read.
    pub calls: Option<CallSyntax>,
    /// Reasoning comes between `<think>` and `</think>` (Qwen3, GLM,
    /// DeepSeek). Harmony's reasoning is its `analysis` channel instead.
    pub think: bool,
}

/// The reasoning markers.
pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

impl Dialect {
    /// No markers: the reply is all content.
    pub const NONE: Dialect = Dialect {
        calls: None,
        think: false,
    };

    /// What a template's text shows: a tool-call format when it renders
    /// one, `think` when it mentions `<think>`.
    pub fn of_template(source: &str) -> Dialect {
        Dialect {
            calls: calls_of_template(source),
            think: source.contains(THINK_OPEN) || source.contains(THINK_CLOSE),
        }
    }

    /// `self`, with `family`'s format where `self` shows none.
    pub fn or(self, family: Dialect) -> Dialect {
        Dialect {
            calls: self.calls.or(family.calls),
            think: self.think || family.think,
        }
    }

    /// Whether replies carry any marker this crate reads (else the reply
    /// text is passed through as it is, special tokens left out).
    pub fn has_markers(self) -> bool {
        self.calls.is_some() || self.think
    }

    /// Every marker a reply in this dialect may hold. Where the vocabulary
    /// makes one of them a special token, the reply must be decoded with
    /// its special tokens, or the marker would vanish from the text.
    pub fn markers(self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.think {
            out.extend([THINK_OPEN, THINK_CLOSE]);
        }
        match self.calls {
            None => {}
            Some(CallSyntax::Hermes) => out.extend([super::hermes::OPEN, super::hermes::CLOSE]),
            Some(CallSyntax::QwenXml) => {
                use super::qwen_xml::*;
                out.extend([
                    OPEN,
                    CLOSE,
                    FUNCTION_OPEN,
                    FUNCTION_CLOSE,
                    PARAM_OPEN,
                    PARAM_CLOSE,
                ]);
            }
            Some(CallSyntax::Glm { .. }) => {
                use super::glm::*;
                out.extend([OPEN, CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE]);
            }
            Some(CallSyntax::Harmony) => {
                use super::harmony::*;
                out.extend([START, CHANNEL, CONSTRAIN, MESSAGE, END, CALL, RETURN]);
            }
            Some(CallSyntax::DeepSeek { .. }) => {
                use super::deepseek::*;
                out.extend([OPEN, CLOSE, CALL_OPEN, CALL_CLOSE, SEP]);
            }
            Some(CallSyntax::Mistral) => out.push(super::mistral::OPEN),
            Some(CallSyntax::MiniMax) => {
                use super::minimax::*;
                out.extend([OPEN, CLOSE, INVOKE_OPEN, INVOKE_CLOSE, PARAM_OPEN, PARAM_CLOSE]);
            }
        }
        out
    }

    /// DeepSeek's templates concatenate `arguments` into the prompt, so they
    /// need it as JSON text; the others iterate it or `tojson` it and need
    /// an object (what transformers documents).
    pub fn arguments_as_text(self) -> bool {
        matches!(self.calls, Some(CallSyntax::DeepSeek { .. }))
    }

    /// Whether a reply to `prompt` starts inside reasoning: the generation
    /// prompt opened `<think>` and did not close it (GLM-5's
    /// `<|assistant|><think>`, DeepSeek's thinking mode).
    pub fn starts_in_reasoning(self, prompt: &str) -> bool {
        if !self.think {
            return false;
        }
        match prompt.rfind(THINK_OPEN) {
            Some(at) => !prompt[at..].contains(THINK_CLOSE),
            None => false,
        }
    }

    /// Whether `prompt` ends with reasoning it closed itself (the empty
    /// `<think></think>` a template writes when thinking is switched off):
    /// the reply is the answer, not more reasoning.
    pub fn ends_reasoning(self, prompt: &str) -> bool {
        self.think && prompt.trim_end().ends_with(THINK_CLOSE)
    }

    /// The id a template sees for tool call `id`. Mistral's templates refuse
    /// ids that are not 9 letters or digits, so those get a stable 9-character
    /// stand-in (the same id always maps to the same stand-in, so a call and
    /// its result still match); other formats see the id as it is.
    pub fn template_call_id(self, id: &str) -> String {
        if self.calls != Some(CallSyntax::Mistral)
            || (id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
        {
            return id.to_string();
        }
        const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        // FNV-1a: stable across runs and builds, unlike std's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (0..9)
            .map(|_| {
                let c = DIGITS[(h % 62) as usize] as char;
                h /= 62;
                c
            })
            .collect()
    }
}

/// The tool-call format a template renders, looked for from the most
/// specific marker to the most generic (GLM's `<tool_call>` also holds
/// `<arg_key>`, so it is tested before Hermes').
fn calls_of_template(source: &str) -> Option<CallSyntax> {
    if source.contains("<minimax:tool_call>") {
        return Some(CallSyntax::MiniMax);
    }
    if source.contains("<arg_key>") {
        return Some(CallSyntax::Glm {
            newlines: !source.contains("</arg_key><arg_value>"),
        });
    }
    if source.contains("<｜tool▁calls▁begin｜>") || source.contains("<｜tool▁call▁begin｜>") {
        return Some(CallSyntax::DeepSeek {
            fenced: source.contains("```json"),
        });
    }
    if source.contains("<|call|>") || source.contains("to=functions") {
        return Some(CallSyntax::Harmony);
    }
    if source.contains("[TOOL_CALLS]") {
        return Some(CallSyntax::Mistral);
    }
    if source.contains("<function=") && source.contains("<parameter=") {
        return Some(CallSyntax::QwenXml);
    }
    if source.contains("<tool_call>") {
        return Some(CallSyntax::Hermes);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_show_their_format() {
        let glm45 = "{{ '\\n<tool_call>' + tc.name }}\n<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>\n<think>";
        assert_eq!(
            Dialect::of_template(glm45),
            Dialect {
                calls: Some(CallSyntax::Glm { newlines: true }),
                think: true
            }
        );
        let glm47 = "{{- '<tool_call>' + tc.name -}}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>";
        assert_eq!(
            Dialect::of_template(glm47).calls,
            Some(CallSyntax::Glm { newlines: false })
        );
        let qwen = "<tool_call>\\n{\"name\": ... {%- if enable_thinking %}<think>";
        assert_eq!(
            Dialect::of_template(qwen),
            Dialect {
                calls: Some(CallSyntax::Hermes),
                think: true
            }
        );
        assert_eq!(
            Dialect::of_template("'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + '```json'").calls,
            Some(CallSyntax::DeepSeek { fenced: true })
        );
        assert_eq!(
            Dialect::of_template("'<｜tool▁call▁begin｜>'+ name + '<｜tool▁sep｜>'").calls,
            Some(CallSyntax::DeepSeek { fenced: false })
        );
        assert_eq!(
            Dialect::of_template("\"<|start|>assistant to=\" + \"functions.\" + name + \"<|call|>\"").calls,
            Some(CallSyntax::Harmony)
        );
        assert_eq!(
            Dialect::of_template("{{- \"[TOOL_CALLS] [\" }}").calls,
            Some(CallSyntax::Mistral)
        );
        let minimax = "{%- set toolcall_begin_token = '<minimax:tool_call>' -%}\n\
                       {{- '<invoke name=\"' + tc.name + '\">' }}<parameter name=\"k\">{{- '<think>' }}";
        assert_eq!(
            Dialect::of_template(minimax),
            Dialect {
                calls: Some(CallSyntax::MiniMax),
                think: true
            }
        );
        assert_eq!(Dialect::of_template("{{ m.content }}"), Dialect::NONE);
    }

    #[test]
    fn the_template_wins_over_the_family() {
        let family = Dialect {
            calls: Some(CallSyntax::Hermes),
            think: true,
        };
        let mistral_tune = Dialect::of_template("[TOOL_CALLS]");
        assert_eq!(mistral_tune.or(family).calls, Some(CallSyntax::Mistral));
        assert_eq!(Dialect::NONE.or(family), family);
    }

    #[test]
    fn reasoning_opened_by_the_prompt() {
        let d = Dialect {
            calls: None,
            think: true,
        };
        assert!(d.starts_in_reasoning("<|user|>hi<|assistant|><think>"));
        assert!(!d.starts_in_reasoning("<|assistant|><think></think>"));
        assert!(!d.starts_in_reasoning("<|im_start|>assistant\n"));
        assert!(!Dialect::NONE.starts_in_reasoning("<think>"));
        assert!(d.ends_reasoning("]~b]ai\n<think>\n</think>\n\n"));
        assert!(d.ends_reasoning("<|assistant|><think></think>"));
        assert!(!d.ends_reasoning("<|im_start|>assistant\n"));
        assert!(!d.ends_reasoning("<think>\n"));
        assert!(!Dialect::NONE.ends_reasoning("</think>"));
    }

    #[test]
    fn mistral_ids_are_nine_alphanumerics_and_stable() {
        let d = Dialect {
            calls: Some(CallSyntax::Mistral),
            think: false,
        };
        let a = d.template_call_id("call_0123456789abcdef");
        assert_eq!(a.len(), 9);
        assert!(a.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_eq!(a, d.template_call_id("call_0123456789abcdef"));
        assert_ne!(a, d.template_call_id("call_0123456789abcdeg"));
        assert_eq!(d.template_call_id("abcDEF123"), "abcDEF123");
        assert_eq!(Dialect::NONE.template_call_id("call_x"), "call_x");
    }
}
