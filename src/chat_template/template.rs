//! Rendering a conversation with a Jinja chat template.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use minijinja::{Environment, Value};
use serde::{Deserialize, Serialize};

use super::builtin::ChatFormat;
use super::error::TemplateError;
use super::hf;
use crate::tool_calls::Dialect;

/// One message of a conversation, as chat templates expect it: `role` and
/// `content` always, the rest only when present (a template tests them with
/// `is defined`, so an absent field must stay absent rather than null).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The reasoning of an assistant turn, apart from its content (Qwen3's
    /// and GLM's templates read `reasoning_content`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same reasoning under the name gpt-oss's template reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// The tool calls of an assistant turn.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<MessageToolCall>,
    /// Which call a `tool` message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's (or a participant's) name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An assistant message's tool call in the OpenAI shape Hugging Face
/// templates read: `tool_call.function.name`, `tool_call.function.arguments`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: MessageFunction,
}

/// The called function. `arguments` is a JSON object for most templates
/// (Qwen3's, GLM's and gpt-oss's iterate or `tojson` it) and the JSON text
/// for those that concatenate it (DeepSeek's): [`Dialect::arguments_as_text`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageFunction {
    pub name: String,
    pub arguments: serde_json::Value,
}

impl MessageToolCall {
    /// A call of function `name` with `arguments` (a JSON object), as the
    /// template of `dialect` wants it: the arguments as the object, or as
    /// JSON text (`text` when the client sent that, else the object's);
    /// the id as the template accepts it ([`Dialect::template_call_id`]).
    pub fn function(
        id: &str,
        name: &str,
        arguments: serde_json::Value,
        text: Option<&str>,
        dialect: Dialect,
    ) -> Self {
        let arguments = if dialect.arguments_as_text() {
            serde_json::Value::String(text.map_or_else(|| arguments.to_string(), str::to_string))
        } else {
            arguments
        };
        MessageToolCall {
            id: dialect.template_call_id(id),
            kind: "function".to_string(),
            function: MessageFunction {
                name: name.to_string(),
                arguments,
            },
        }
    }
}

impl ChatMessage {
    /// A message with an arbitrary role.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
            ..Default::default()
        }
    }
    /// A user turn.
    pub fn user(content: &str) -> Self {
        Self::new("user", content)
    }
    /// A model reply.
    pub fn assistant(content: &str) -> Self {
        Self::new("assistant", content)
    }
    /// A system prompt.
    pub fn system(content: &str) -> Self {
        Self::new("system", content)
    }
    /// A tool's result, answering call `call_id`.
    pub fn tool(call_id: &str, content: &str) -> Self {
        ChatMessage {
            tool_call_id: Some(call_id.to_string()),
            ..Self::new("tool", content)
        }
    }
    /// Sets the reasoning of an assistant turn (under both names templates read).
    pub fn with_reasoning(mut self, reasoning: &str) -> Self {
        self.reasoning_content = Some(reasoning.to_string());
        self.thinking = Some(reasoning.to_string());
        self
    }
}

/// What a render puts in the template's context besides the messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// End with the assistant prompt the reply continues.
    pub add_generation_prompt: bool,
    /// `tools`: the OpenAI tool list (`{"type": "function", "function":
    /// {...}}` entries), as `apply_chat_template(tools=...)` passes it.
    /// `None` leaves the variable undefined.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Further variables (`chat_template_kwargs`: `enable_thinking`,
    /// `reasoning_effort`, ...). Names in [`RESERVED_VARIABLES`] are
    /// ignored here; front ends refuse them.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

impl RenderOptions {
    /// Just the generation prompt flag (no tools, no extra variables).
    pub fn prompt(add_generation_prompt: bool) -> Self {
        Self {
            add_generation_prompt,
            ..Default::default()
        }
    }
}

/// Context variables the renderer sets itself, which `kwargs` cannot replace.
pub const RESERVED_VARIABLES: &[&str] = &[
    "messages",
    "add_generation_prompt",
    "tools",
    "bos_token",
    "eos_token",
    hf::NOW_VAR,
];

const NAME: &str = "chat_template";

/// Where `strftime_now` gets the time: the system clock unless a test (or
/// a caller wanting a fixed date) injects another ([`ChatTemplate::with_clock`]).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// A compiled chat template with the special tokens it refers to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    origin: String,
    clock: Clock,
    dialect: Dialect,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// Newer checkpoints (gpt-oss, GLM-4.5) ship the template as
/// `chat_template.jinja` next to tokenizer_config.json instead of inside it.
fn jinja_beside(config: &Path) -> Result<Option<(std::path::PathBuf, String)>, TemplateError> {
    let path = config.with_file_name("chat_template.jinja");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|source| TemplateError::Read {
        path: path.clone(),
        source,
    })?;
    Ok(Some((path, text)))
}

/// A special token in tokenizer_config.json: a string, `{"content": ...}`, or null.
fn token_of(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// Compiles `source` the way Hugging Face renders chat templates:
    /// `trim_blocks`, `lstrip_blocks`, `{% break %}` / `{% continue %}`,
    /// Python's string and dict methods (`.strip()`, `.split()`,
    /// `.items()`, ...), the globals `raise_exception(message)` and
    /// `strftime_now(format)` (UTC), and transformers' `tojson` (Python's
    /// `json.dumps`: `", "` / `": "` separators, no HTML escaping, keyword
    /// arguments `ensure_ascii`, `indent`, `separators`, `sort_keys`).
    /// `origin` names where the template came from, for error messages.
    pub fn new(source: &str, bos_token: &str, eos_token: &str, origin: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", hf::raise_exception);
        env.add_function("strftime_now", hf::strftime_now);
        env.add_filter("tojson", hf::tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|source| TemplateError::Syntax {
                origin: origin.to_string(),
                source,
            })?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            origin: origin.to_string(),
            clock: Arc::new(SystemTime::now),
            dialect: Dialect::of_template(source),
        })
    }

    /// The same template with `strftime_now` reading `clock` instead of the
    /// system clock (the date is rendered in UTC).
    pub fn with_clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// What the template text shows of the reply's markers, completed by
    /// `family`'s (the family registry's) where the text shows none: a
    /// fine-tune whose template writes another tool-call format keeps its own.
    pub(crate) fn or_dialect(mut self, family: Dialect) -> Self {
        self.dialect = self.dialect.or(family);
        self
    }

    /// How replies to this template mark reasoning and tool calls.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The built-in template of `format` with its default special tokens.
    pub fn builtin(format: ChatFormat) -> Self {
        let (bos, eos) = format.default_tokens();
        Self::builtin_with_tokens(format, bos, eos)
    }

    fn builtin_with_tokens(format: ChatFormat, bos: &str, eos: &str) -> Self {
        let origin = format!("the built-in {format} template");
        match Self::new(format.template, bos, eos, &origin) {
            Ok(t) => t.or_dialect(format.dialect),
            // The built-in sources are constants covered by tests.
            Err(e) => unreachable!("built-in template does not compile: {e}"),
        }
    }

    /// Reads `chat_template`, `bos_token` and `eos_token` from a
    /// tokenizer_config.json. Without a template, `fallback`'s built-in one is
    /// used (with the file's tokens when it names them). A missing file is an
    /// error: the caller decides whether to fall back entirely.
    pub fn from_tokenizer_config(path: &Path, fallback: ChatFormat) -> Result<Self, TemplateError> {
        let text = std::fs::read_to_string(path).map_err(|source| TemplateError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|source| TemplateError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let (dbos, deos) = fallback.default_tokens();
        let bos = token_of(json.get("bos_token")).unwrap_or_else(|| dbos.to_string());
        let eos = token_of(json.get("eos_token")).unwrap_or_else(|| deos.to_string());
        let source = match json.get("chat_template") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            // Newer configs: a list of {"name", "template"}; "default" is the chat one.
            Some(serde_json::Value::Array(list)) => {
                let pick = list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .or_else(|| list.first());
                match pick.and_then(|t| t.get("template")).and_then(|t| t.as_str()) {
                    Some(s) => Some(s.to_string()),
                    None => {
                        return Err(TemplateError::Shape {
                            path: path.to_path_buf(),
                            what: "a list without a usable {\"name\", \"template\"} entry".into(),
                        });
                    }
                }
            }
            Some(other) => {
                return Err(TemplateError::Shape {
                    path: path.to_path_buf(),
                    what: format!("expected a string or a list, found {other}"),
                });
            }
        };
        match source {
            Some(src) => Self::new(&src, &bos, &eos, &path.display().to_string())
                .map(|t| t.or_dialect(fallback.dialect)),
            None => match jinja_beside(path)? {
                Some((jpath, src)) => Self::new(&src, &bos, &eos, &jpath.display().to_string())
                    .map(|t| t.or_dialect(fallback.dialect)),
                None => Ok(Self::builtin_with_tokens(fallback, &bos, &eos)),
            },
        }
    }

    /// The template a model directory ships in its tokenizer_config.json, or
    /// `None` when it ships none (no file, or a file without `chat_template`):
    /// `coli run --prompt` wraps the prompt only for models trained on a
    /// template, so base models still see the raw text.
    pub fn of_model(dir: &Path, fallback: ChatFormat) -> Result<Option<Self>, TemplateError> {
        let path = dir.join("tokenizer_config.json");
        if !path.is_file() {
            return match jinja_beside(&path)? {
                Some((jpath, src)) => {
                    let (bos, eos) = fallback.default_tokens();
                    Self::new(&src, bos, eos, &jpath.display().to_string())
                        .map(|t| Some(t.or_dialect(fallback.dialect)))
                }
                None => Ok(None),
            };
        }
        let text = std::fs::read_to_string(&path).map_err(|source| TemplateError::Read {
            path: path.clone(),
            source,
        })?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|source| TemplateError::Json {
            path: path.clone(),
            source,
        })?;
        match json.get("chat_template") {
            None | Some(serde_json::Value::Null) if jinja_beside(&path)?.is_none() => Ok(None),
            _ => Self::from_tokenizer_config(&path, fallback).map(Some),
        }
    }

    /// The whole conversation as prompt text.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with(messages, &RenderOptions::prompt(add_generation_prompt))
    }

    /// The whole conversation as prompt text, with tools and extra
    /// variables in the context.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<String, TemplateError> {
        self.render_at(messages, opts, (self.clock)())
    }

    /// [`Self::render_with`] with `strftime_now` showing `now`.
    fn render_at(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
        now: SystemTime,
    ) -> Result<String, TemplateError> {
        let render_err = |source| TemplateError::Render {
            origin: self.origin.clone(),
            source,
        };
        let tmpl = self.env.get_template(NAME).map_err(render_err)?;
        let mut ctx: BTreeMap<String, Value> = opts
            .kwargs
            .iter()
            .filter(|(k, _)| !RESERVED_VARIABLES.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), Value::from_serialize(v)))
            .collect();
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(opts.add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token".into(), Value::from(self.eos_token.as_str()));
        ctx.insert(hf::NOW_VAR.into(), Value::from(hf::unix_seconds(now)));
        if let Some(tools) = &opts.tools {
            ctx.insert("tools".into(), Value::from_serialize(tools));
        }
        tmpl.render(Value::from_serialize(&ctx)).map_err(render_err)
    }

    /// The text a new user turn adds after `history` (whose tokens are already
    /// in the KV cache), ending with the assistant prompt.
    ///
    /// Computed as the part of `render(history + [user], true)` past its common
    /// prefix with `render(history, false)`: exact for templates that render a
    /// conversation as the concatenation of its messages. With an empty
    /// history this is the full prompt (including any BOS text). The delta
    /// starts at a whole `<|...|>` special token, never inside one. Both renders
    /// read the clock once, so a template showing the date (gpt-oss's
    /// `strftime_now`) gives a clean delta even across midnight.
    pub fn render_turn(&self, history: &[ChatMessage], user_text: &str) -> Result<String, TemplateError> {
        let mut all = history.to_vec();
        all.push(ChatMessage::user(user_text));
        let now = (self.clock)();
        let full = self.render_at(&all, &RenderOptions::prompt(true), now)?;
        if history.is_empty() {
            return Ok(full);
        }
        let before = self.render_at(history, &RenderOptions::prompt(false), now)?;
        let mut common = full
            .bytes()
            .zip(before.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        while !full.is_char_boundary(common) {
            common -= 1;
        }
        // Never split a special token: gpt-oss's template closes the last
        // assistant turn with `<|return|>` when no generation prompt follows
        // and with `<|end|>` otherwise, so the renders part inside `<|`.
        if let Some(open) = full[..common].rfind("<|")
            && !full[open..common].contains("|>")
        {
            common = open;
        }
        Ok(full[common..].to_string())
    }

    /// Where the template came from (a path or "the built-in ... template").
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Tulu-style template of OLMoE-1B-7B-0125-Instruct's tokenizer_config.json.
    const OLMOE_0125: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}{% if not loop.last %}{{ '<|assistant|>\n'  + message['content'] + eos_token + '\n' }}{% else %}{{ '<|assistant|>\n'  + message['content'] + eos_token }}{% endif %}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}";

    fn conv() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("Be brief."),
            ChatMessage::user("Hi"),
            ChatMessage::assistant("Hello!"),
        ]
    }

    #[test]
    fn real_olmoe_template_renders_tulu() {
        let t = ChatTemplate::new(OLMOE_0125, "<|endoftext|>", "<|endoftext|>", "test").unwrap();
        let s = t.render(&conv(), false).unwrap();
        assert_eq!(
            s,
            "<|endoftext|><|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!<|endoftext|>"
        );
        let s = t.render(&[ChatMessage::user("2+2?")], true).unwrap();
        assert_eq!(s, "<|endoftext|><|user|>\n2+2?\n<|assistant|>\n");
    }

    #[test]
    fn builtin_olmoe_matches_the_real_template() {
        let real = ChatTemplate::new(OLMOE_0125, "<|endoftext|>", "<|endoftext|>", "test").unwrap();
        let ours = ChatTemplate::builtin(ChatFormat::OLMOE);
        let mut msgs = conv();
        for add in [false, true] {
            assert_eq!(ours.render(&msgs, add).unwrap(), real.render(&msgs, add).unwrap());
        }
        msgs.push(ChatMessage::user("multi\nline"));
        assert_eq!(
            ours.render(&msgs, true).unwrap(),
            real.render(&msgs, true).unwrap()
        );
        assert_eq!(
            ours.render_turn(&conv(), "x").unwrap(),
            real.render_turn(&conv(), "x").unwrap()
        );
    }

    #[test]
    fn turn_delta_continues_the_conversation() {
        let t = ChatTemplate::builtin(ChatFormat::OLMOE);
        assert_eq!(
            t.render_turn(&[], "Hi").unwrap(),
            "<|endoftext|><|user|>\nHi\n<|assistant|>\n"
        );
        let hist = [ChatMessage::user("Hi"), ChatMessage::assistant("Yo")];
        assert_eq!(
            t.render_turn(&hist, "Más ñ").unwrap(),
            "\n<|user|>\nMás ñ\n<|assistant|>\n"
        );
    }

    #[test]
    fn glm_builtin_format() {
        let t = ChatTemplate::builtin(ChatFormat::GLM);
        assert_eq!(
            t.render_turn(&[], "Ciao").unwrap(),
            "[gMASK]<sop><|user|>Ciao<|assistant|><think></think>"
        );
        let hist = [ChatMessage::user("Ciao"), ChatMessage::assistant("Salve")];
        assert_eq!(
            t.render_turn(&hist, "Come va?").unwrap(),
            "<|user|>Come va?<|assistant|><think></think>"
        );
    }

    #[test]
    fn glm4_and_harmony_builtin_formats() {
        let t = ChatTemplate::builtin(ChatFormat::GLM4);
        assert_eq!(
            t.render_turn(&[], "Ciao").unwrap(),
            "[gMASK]<sop><|user|>\nCiao<|assistant|>\n<think></think>\n"
        );
        let t = ChatTemplate::builtin(ChatFormat::HARMONY);
        let hist = [ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
        assert_eq!(
            t.render(&hist, true).unwrap(),
            "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>\
             <|start|>user<|message|>Hi<|end|><|start|>assistant"
        );
    }

    #[test]
    fn a_chat_template_jinja_file_is_read() {
        let dir = std::env::temp_dir().join(format!("colibri-jinja-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Without tokenizer_config.json: the file alone is the template.
        std::fs::write(dir.join("chat_template.jinja"), "{{ messages[0].content }}!").unwrap();
        let t = ChatTemplate::of_model(&dir, ChatFormat::OLMOE).unwrap().unwrap();
        assert_eq!(t.render(&[ChatMessage::user("x")], false).unwrap(), "x!");
        // With a tokenizer_config.json lacking chat_template, it is still used.
        std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": "<e>"}"#).unwrap();
        let t = ChatTemplate::of_model(&dir, ChatFormat::OLMOE).unwrap().unwrap();
        assert_eq!(t.render(&[ChatMessage::user("y")], false).unwrap(), "y!");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn chatml_and_mistral_builtin_formats() {
        let t = ChatTemplate::builtin(ChatFormat::CHATML);
        assert_eq!(
            t.render_turn(&[], "Hi").unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        let t = ChatTemplate::builtin(ChatFormat::MISTRAL);
        assert_eq!(t.render_turn(&[], "Hi").unwrap(), "<s>[INST] Hi [/INST]");
        let hist = [ChatMessage::user("Hi"), ChatMessage::assistant("Yo")];
        assert_eq!(t.render_turn(&hist, "Again").unwrap(), "[INST] Again [/INST]");
    }

    #[test]
    fn hf_features_work() {
        let src = "{% for m in messages %}{% if m.role not in ['user','assistant'] %}\
                   {{ raise_exception('bad role: ' + m.role) }}{% endif %}\
                   {{ m.content.strip() | trim }}|{{ m.content.startswith(' a') }}|{{ m | tojson }}\n\
                   {% endfor %}";
        let t = ChatTemplate::new(src, "", "", "test").unwrap();
        let s = t.render(&[ChatMessage::user(" ab ")], false).unwrap();
        // transformers' tojson: json.dumps separators, fields in order.
        assert_eq!(s, "ab|True|{\"role\": \"user\", \"content\": \" ab \"}\n");
        let err = t.render(&[ChatMessage::new("tool", "x")], false).unwrap_err();
        assert!(matches!(err, TemplateError::Render { .. }));
        assert!(format!("{err:#}").contains("bad role: tool") || err.to_string().contains("rendering"));
        let chain = std::error::Error::source(&err)
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(chain.contains("bad role: tool"), "{chain}");
    }

    #[test]
    fn bad_template_is_a_typed_error() {
        let err = ChatTemplate::new("{% for x in %}", "", "", "cfg.json").unwrap_err();
        assert!(matches!(err, TemplateError::Syntax { ref origin, .. } if origin == "cfg.json"));
        let err = ChatTemplate::new("{{ undefined_fn() }}", "", "", "t")
            .unwrap()
            .render(&[], true)
            .unwrap_err();
        assert!(matches!(err, TemplateError::Render { .. }));
    }

    #[test]
    fn tokenizer_config_variants() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokenizer_config.json");
        std::fs::write(
            &p,
            serde_json::json!({"chat_template": OLMOE_0125, "bos_token": "<s>", "eos_token": {"content": "</s>"}})
                .to_string(),
        )
        .unwrap();
        let t = ChatTemplate::from_tokenizer_config(&p, ChatFormat::GLM).unwrap();
        assert_eq!(
            t.render(&[ChatMessage::assistant("a")], false).unwrap(),
            "<s><|assistant|>\na</s>"
        );
        std::fs::write(&p, r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}], "eos_token": "E"}"#).unwrap();
        assert_eq!(
            ChatTemplate::from_tokenizer_config(&p, ChatFormat::OLMOE)
                .unwrap()
                .render(&[], true)
                .unwrap(),
            "DE"
        );
        std::fs::write(&p, r#"{"eos_token": null}"#).unwrap();
        let t = ChatTemplate::from_tokenizer_config(&p, ChatFormat::GLM).unwrap();
        assert!(t.origin().contains("built-in"));
        std::fs::write(&p, r#"{"chat_template": 5}"#).unwrap();
        assert!(matches!(
            ChatTemplate::from_tokenizer_config(&p, ChatFormat::GLM),
            Err(TemplateError::Shape { .. })
        ));
        std::fs::write(&p, "{not json").unwrap();
        assert!(matches!(
            ChatTemplate::from_tokenizer_config(&p, ChatFormat::GLM),
            Err(TemplateError::Json { .. })
        ));
        let missing = dir.path().join("nope.json");
        assert!(matches!(
            ChatTemplate::from_tokenizer_config(&missing, ChatFormat::GLM),
            Err(TemplateError::Read { .. })
        ));
    }
}
