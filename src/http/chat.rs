//! What the two chat endpoints share between parsing a request and
//! answering it: the prompt rendered with the offered tools and template
//! variables, a forced call turned into a grammar, and how the reply's text
//! is read back ([`Reading`]).

use serde_json::{Map, Value};

use super::error::ApiError;
use super::request::Generation;
use super::state::Shared;
use super::tools::Tools;
use crate::chat_template::{ChatMessage, RESERVED_VARIABLES, RenderOptions};
use crate::runtime::constraint::ConstraintSpec;
use crate::tool_calls::grammar::{Forced, forced_call};
use crate::tool_calls::{CallSyntax, Dialect, Reply, ReplyParser, ToolSet};

/// How a reply's text is split into content, reasoning and tool calls.
#[derive(Debug, Clone)]
pub struct Reading {
    dialect: Dialect,
    tools: Option<ToolSet>,
    in_reasoning: bool,
}

impl Reading {
    /// Whether the reply is split at all: it may reason (`<think>`, or
    /// harmony's channels, which every gpt-oss reply has), or it may call one
    /// of the offered tools (a model that knows a call format but was
    /// offered none, or `tool_choice: none`, replies plain text).
    fn reads_markers(&self) -> bool {
        let harmony = self.dialect.calls == Some(CallSyntax::Harmony);
        self.dialect.think || harmony || (self.dialect.calls.is_some() && self.tools.is_some())
    }

    /// A parser for the streamed reply; `None` when the model writes no
    /// markers (its text is the content as it is).
    pub fn parser(&self) -> Option<ReplyParser> {
        self.reads_markers()
            .then(|| ReplyParser::new(self.dialect, self.tools.clone(), self.in_reasoning))
    }

    /// The whole reply.
    pub fn parse(&self, text: &str) -> Reply {
        if self.reads_markers() {
            ReplyParser::parse(self.dialect, self.tools.clone(), self.in_reasoning, text)
        } else {
            Reply {
                content: text.to_string(),
                ..Reply::default()
            }
        }
    }
}

/// A rendered chat request.
pub struct ChatPrompt {
    pub ids: Vec<u32>,
    pub reading: Reading,
}

/// The id of a reply's `index`th tool call: `prefix` then the reply's own
/// id's unique part (`chatcmpl-5f3a...` gives `call_5f3a..._0`).
pub fn call_id(prefix: &str, response_id: &str, index: usize) -> String {
    let unique = response_id
        .split_once(['-', '_'])
        .map_or(response_id, |(_, rest)| rest);
    format!("{prefix}{unique}_{index}")
}

/// `chat_template_kwargs` (vLLM's extension): an object of template
/// variables, none of them one the renderer sets itself.
pub fn template_kwargs(p: &super::json::Params) -> Result<Map<String, Value>, ApiError> {
    let Some(kwargs) = p.object("chat_template_kwargs")? else {
        return Ok(Map::new());
    };
    if let Some(k) = kwargs.keys().find(|k| RESERVED_VARIABLES.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            "chat_template_kwargs",
            format!("'chat_template_kwargs' cannot set {k:?}: the server sets it"),
        ));
    }
    Ok(kwargs.clone())
}

/// Renders `messages` with `tools` and `kwargs`, tokenizes the prompt, and
/// sets what the reply needs on `g`: its special tokens kept when the model
/// writes markers, and the grammar when a call is forced.
pub fn prepare(
    st: &Shared,
    messages: &[ChatMessage],
    tools: Option<&Tools>,
    kwargs: Map<String, Value>,
    g: &mut Generation,
) -> Result<ChatPrompt, ApiError> {
    let info = st.handle.info();
    let dialect = info.template.dialect();
    let callable = tools.and_then(Tools::callable);
    if callable.is_some() && dialect.calls.is_none() {
        return Err(ApiError::invalid(
            "tools",
            "'tools': this model's chat template writes no tool-call format this server can read \
             (docs/http-api.md lists the supported ones)",
        )
        .with_code("unsupported_parameter"));
    }
    let opts = RenderOptions {
        add_generation_prompt: true,
        tools: tools.map(|t| t.template.clone()),
        kwargs,
    };
    let text = info.template.render_with(messages, &opts).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("the model's chat template refused the messages: {e}"),
        )
    })?;
    let ids = super::prepare::encode(st, &text, "messages")?;
    let tokenizer = info.tokenizer().map_err(|e| ApiError::internal(e.to_string()))?;
    let in_reasoning = dialect.starts_in_reasoning(&text);
    if let Some(forced) = tools.and_then(Tools::forced) {
        if g.constraint.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "'tool_choice' forcing a call cannot be combined with another constraint on the reply",
            ));
        }
        let f = Forced {
            tools: &forced,
            parallel: tools.is_some_and(|t| t.parallel),
            in_reasoning,
            after_reasoning: dialect.ends_reasoning(&text),
        };
        let special = |marker: &str| tokenizer.special_token_id(marker);
        let grammar = forced_call(dialect, &f, &special)
            .ok_or_else(|| ApiError::internal("no grammar for this model's tool-call format".to_string()))?;
        g.constraint = Some(ConstraintSpec::Lark(grammar));
    }
    g.special_tokens = dialect
        .markers()
        .iter()
        .any(|m| tokenizer.special_token_id(m).is_some());
    Ok(ChatPrompt {
        ids,
        reading: Reading {
            dialect,
            tools: callable,
            in_reasoning,
        },
    })
}
