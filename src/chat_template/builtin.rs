//! Fallback templates for checkouts without `chat_template`. Each renders
//! the family's tool calls, tool results and offered tools the way the
//! family's published template does, so a template-less checkout can still
//! use tools.

use crate::tool_calls::{CallSyntax, Dialect};

/// A built-in chat format: the template used when a checkout ships none,
/// and the special tokens it assumes when tokenizer_config.json names none.
/// Each model family picks one in its registration
/// ([`crate::model::family::FamilyConfig::chat_format`]); a family whose
/// format is none of these defines its own constant in its folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatFormat {
    /// Named in messages ("the built-in Olmoe template").
    pub name: &'static str,
    /// The minijinja template source.
    pub template: &'static str,
    /// Default `bos_token`.
    pub bos: &'static str,
    /// Default `eos_token`.
    pub eos: &'static str,
    /// The family's reply markers (a template that shows others wins).
    pub dialect: Dialect,
}

impl ChatFormat {
    /// OLMoE-Instruct (0125): the Tulu format, `<|user|>\n...\n<|assistant|>\n`,
    /// replies closed by the EOS token. Also the fallback for a model whose
    /// config.json cannot be read.
    pub const OLMOE: ChatFormat = ChatFormat {
        name: "Olmoe",
        template: OLMOE,
        bos: "<|endoftext|>",
        eos: "<|endoftext|>",
        dialect: Dialect::NONE,
    };
    /// GLM: `[gMASK]<sop>` once, then `<|user|>...<|assistant|>` with no newline
    /// after the role tags, and an empty `<think></think>` block that switches
    /// thinking off (without it the model rambles and never stops).
    pub const GLM: ChatFormat = ChatFormat {
        name: "Glm",
        template: GLM,
        bos: "",
        eos: "<|endoftext|>",
        dialect: Dialect {
            calls: Some(CallSyntax::Glm { newlines: false }),
            think: true,
        },
    };
    /// Qwen3: ChatML, `<|im_start|>role\n...<|im_end|>\n`, the reply opened
    /// with an empty `<think>` block (Qwen3's `enable_thinking=False`).
    pub const CHATML: ChatFormat = ChatFormat {
        name: "ChatMl",
        template: CHATML,
        bos: "",
        eos: "<|im_end|>",
        dialect: Dialect {
            calls: Some(CallSyntax::Hermes),
            think: true,
        },
    };
    /// Mixtral-Instruct: `<s>[INST] ... [/INST]`, replies closed by `</s>`;
    /// a system message is put before the first instruction.
    pub const MISTRAL: ChatFormat = ChatFormat {
        name: "Mistral",
        template: MISTRAL,
        bos: "<s>",
        eos: "</s>",
        dialect: Dialect {
            calls: Some(CallSyntax::Mistral),
            think: false,
        },
    };
    /// GLM-4.5 / 4.6: like [`ChatFormat::GLM`] but with a newline after each
    /// role tag, and thinking switched off with `\n<think></think>\n`.
    pub const GLM4: ChatFormat = ChatFormat {
        name: "Glm4",
        template: GLM4,
        bos: "",
        eos: "<|endoftext|>",
        dialect: Dialect {
            calls: Some(CallSyntax::Glm { newlines: true }),
            think: true,
        },
    };
    /// gpt-oss's harmony format: `<|start|>role<|message|>...<|end|>`, the
    /// reply opened with `<|start|>assistant`; a system message becomes the
    /// developer message's instructions.
    pub const HARMONY: ChatFormat = ChatFormat {
        name: "Harmony",
        template: HARMONY,
        bos: "<|startoftext|>",
        eos: "<|return|>",
        dialect: Dialect {
            calls: Some(CallSyntax::Harmony),
            think: false,
        },
    };

    /// DeepSeek-V3: `<｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>`,
    /// system prompts first; calls in DeepSeek-V3's fenced form.
    pub const DEEPSEEK: ChatFormat = ChatFormat {
        name: "DeepSeek",
        template: DEEPSEEK,
        bos: "<｜begin▁of▁sentence｜>",
        eos: "<｜end▁of▁sentence｜>",
        dialect: Dialect {
            calls: Some(CallSyntax::DeepSeek { fenced: true }),
            think: true,
        },
    };

    /// Default `(bos_token, eos_token)` when the tokenizer config names none.
    pub fn default_tokens(self) -> (&'static str, &'static str) {
        (self.bos, self.eos)
    }
}

impl std::fmt::Display for ChatFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

// Literal text goes through `{{ '...' }}` so that trim_blocks / lstrip_blocks
// and `{%-` never eat a newline that belongs to the format. Arguments are
// written as they come when they are JSON text, else through `tojson`, as
// the published templates do.
const OLMOE: &str = "{{ bos_token }}\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ '<|system|>\\n' ~ m.content ~ '\\n' }}\
{%- elif m.role == 'user' -%}{{ '<|user|>\\n' ~ m.content ~ '\\n' }}\
{%- elif m.role == 'assistant' -%}{{ '<|assistant|>\\n' ~ m.content ~ eos_token }}\
{%- if not loop.last -%}{{ '\\n' }}{%- endif -%}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}";

/// Qwen3's: offered tools in the system turn, calls as `<tool_call>` JSON,
/// results as `<tool_response>` in a user turn.
const CHATML: &str = "{%- if tools -%}\
{{ '<|im_start|>system\\n' }}\
{%- if messages and messages[0].role == 'system' -%}{{ messages[0].content ~ '\\n\\n' }}{%- endif -%}\
{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}\
{%- for tool in tools -%}{{ '\\n' ~ (tool | tojson) }}{%- endfor -%}\
{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments \
within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": \
<args-json-object>}\\n</tool_call><|im_end|>\\n' }}\
{%- endif -%}\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}\
{%- if not (tools and loop.first) -%}{{ '<|im_start|>system\\n' ~ m.content ~ '<|im_end|>\\n' }}{%- endif -%}\
{%- elif m.role == 'user' -%}{{ '<|im_start|>user\\n' ~ m.content ~ '<|im_end|>\\n' }}\
{%- elif m.role == 'assistant' -%}{{ '<|im_start|>assistant\\n' ~ m.content }}\
{%- for tc in m.tool_calls or [] -%}\
{%- if m.content or not loop.first -%}{{ '\\n' }}{%- endif -%}\
{{ '<tool_call>\\n{\"name\": \"' ~ tc.function.name ~ '\", \"arguments\": ' }}\
{%- if tc.function.arguments is string -%}{{ tc.function.arguments }}{%- else -%}{{ tc.function.arguments | tojson }}{%- endif -%}\
{{ '}\\n</tool_call>' }}\
{%- endfor -%}\
{{ '<|im_end|>\\n' }}\
{%- elif m.role == 'tool' -%}\
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}\
{{ '\\n<tool_response>\\n' ~ m.content ~ '\\n</tool_response>' }}\
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}\
{%- if not enable_thinking -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}\
{%- endif -%}";

/// Mixtral-Instruct's, with Mistral's tool markup: `[AVAILABLE_TOOLS]`
/// before the last user turn, `[TOOL_CALLS]`, `[TOOL_RESULTS]`.
const MISTRAL: &str = "{{ bos_token }}\
{%- set ns = namespace(last_user=-1) -%}\
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ m.content ~ '\\n\\n' }}\
{%- elif m.role == 'user' -%}\
{%- if tools and loop.index0 == ns.last_user -%}{{ '[AVAILABLE_TOOLS] ' ~ (tools | tojson) ~ '[/AVAILABLE_TOOLS]' }}{%- endif -%}\
{{ '[INST] ' ~ m.content ~ ' [/INST]' }}\
{%- elif m.role == 'assistant' and m.tool_calls -%}{{ '[TOOL_CALLS] [' }}\
{%- for tc in m.tool_calls -%}\
{%- if not loop.first -%}{{ ', ' }}{%- endif -%}\
{{ {'name': tc.function.name, 'arguments': tc.function.arguments, 'id': tc.id} | tojson }}\
{%- endfor -%}{{ ']' ~ eos_token }}\
{%- elif m.role == 'assistant' -%}{{ m.content ~ eos_token }}\
{%- elif m.role == 'tool' -%}{{ '[TOOL_RESULTS] ' ~ ({'content': m.content, 'call_id': m.tool_call_id} | tojson) ~ '[/TOOL_RESULTS]' }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}";

/// GLM-5's (GLM-4.7's markup): no newlines around the call tags.
const GLM: &str = "[gMASK]<sop>\
{%- if tools -%}\
{{ '<|system|>\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\\n' }}\
{%- for tool in tools -%}{{ (tool | tojson) ~ '\\n' }}{%- endfor -%}\
{{ '</tools>\\n\\nFor each function call, output the function name and arguments within the following \
XML format:\\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>\
<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>' }}\
{%- endif -%}\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ '<|system|>' ~ m.content }}\
{%- elif m.role == 'user' -%}{{ '<|user|>' ~ m.content }}\
{%- elif m.role == 'assistant' -%}{{ '<|assistant|><think></think>' ~ m.content }}\
{%- for tc in m.tool_calls or [] -%}{{ '<tool_call>' ~ tc.function.name }}\
{%- for k, v in tc.function.arguments | items -%}{{ '<arg_key>' ~ k ~ '</arg_key><arg_value>' }}\
{%- if v is string -%}{{ v }}{%- else -%}{{ v | tojson }}{%- endif -%}{{ '</arg_value>' }}\
{%- endfor -%}{{ '</tool_call>' }}\
{%- endfor -%}\
{%- elif m.role == 'tool' -%}\
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|observation|>' }}{%- endif -%}\
{{ '<tool_response>' ~ m.content ~ '</tool_response>' }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}\
{%- if enable_thinking -%}{{ '<|assistant|><think>' }}{%- else -%}{{ '<|assistant|><think></think>' }}{%- endif -%}\
{%- endif -%}";

/// GLM-4.5's and 4.6's: a newline after the name and around each tag.
const GLM4: &str = "[gMASK]<sop>\
{%- if tools -%}\
{{ '<|system|>\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\\n' }}\
{%- for tool in tools -%}{{ (tool | tojson) ~ '\\n' }}{%- endfor -%}\
{{ '</tools>\\n\\nFor each function call, output the function name and arguments within the following \
XML format:\\n<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>\\n<arg_value>{arg-value-1}</arg_value>\\n\
<arg_key>{arg-key-2}</arg_key>\\n<arg_value>{arg-value-2}</arg_value>\\n...\\n</tool_call>' }}\
{%- endif -%}\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ '<|system|>\\n' ~ m.content }}\
{%- elif m.role == 'user' -%}{{ '<|user|>\\n' ~ m.content }}\
{%- elif m.role == 'assistant' -%}{{ '<|assistant|>\\n<think></think>\\n' ~ m.content }}\
{%- for tc in m.tool_calls or [] -%}{{ '\\n<tool_call>' ~ tc.function.name }}\
{%- for k, v in tc.function.arguments | items -%}{{ '\\n<arg_key>' ~ k ~ '</arg_key>\\n<arg_value>' }}\
{%- if v is string -%}{{ v }}{%- else -%}{{ v | tojson }}{%- endif -%}{{ '</arg_value>' }}\
{%- endfor -%}{{ '\\n</tool_call>' }}\
{%- endfor -%}\
{%- elif m.role == 'tool' -%}\
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|observation|>' }}{%- endif -%}\
{{ '\\n<tool_response>\\n' ~ m.content ~ '\\n</tool_response>' }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}\
{%- if enable_thinking -%}{{ '<|assistant|>' }}{%- else -%}{{ '<|assistant|>\\n<think></think>\\n' }}{%- endif -%}\
{%- endif -%}";

/// Harmony; offered tools go in the developer message as a `functions`
/// namespace (each with its JSON schema, where gpt-oss's own template
/// writes TypeScript types).
const HARMONY: &str = "{%- set ns = namespace(last_call='') -%}\
{%- set tools_text -%}\
{%- if tools -%}{{ '# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n' }}\
{%- for t in tools -%}{{ '// ' ~ (t.function.description or '') ~ '\\ntype ' ~ t.function.name ~ ' = (_: ' \
~ ((t.function.parameters or {}) | tojson) ~ ') => any;\\n\\n' }}{%- endfor -%}\
{{ '} // namespace functions' }}{%- endif -%}\
{%- endset -%}\
{%- if tools and not (messages and messages[0].role == 'system') -%}\
{{ '<|start|>developer<|message|>' ~ tools_text ~ '<|end|>' }}\
{%- endif -%}\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ '<|start|>developer<|message|># Instructions\\n\\n' ~ m.content }}\
{%- if tools and loop.first -%}{{ '\\n\\n' ~ tools_text }}{%- endif -%}{{ '<|end|>' }}\
{%- elif m.role == 'user' -%}{{ '<|start|>user<|message|>' ~ m.content ~ '<|end|>' }}\
{%- elif m.role == 'assistant' and m.tool_calls -%}\
{%- if m.content -%}{{ '<|start|>assistant<|channel|>analysis<|message|>' ~ m.content ~ '<|end|>' }}{%- endif -%}\
{%- for tc in m.tool_calls -%}\
{{ '<|start|>assistant to=functions.' ~ tc.function.name ~ '<|channel|>commentary json<|message|>' }}\
{%- if tc.function.arguments is string -%}{{ tc.function.arguments }}{%- else -%}{{ tc.function.arguments | tojson }}{%- endif -%}\
{{ '<|call|>' }}{%- set ns.last_call = tc.function.name -%}\
{%- endfor -%}\
{%- elif m.role == 'assistant' -%}{{ '<|start|>assistant<|channel|>final<|message|>' ~ m.content ~ '<|end|>' }}\
{%- elif m.role == 'tool' -%}{{ '<|start|>functions.' ~ ns.last_call ~ ' to=assistant<|channel|>commentary<|message|>' \
~ (m.content | tojson) ~ '<|end|>' }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<|start|>assistant' }}{%- endif -%}";

/// DeepSeek-V3's, with the offered tools described in the system prompt
/// (as DeepSeek-V3.1's template does) and calls in V3's fenced form.
const DEEPSEEK: &str = "{%- set ns = namespace(system='', tool=false) -%}\
{%- for m in messages -%}{%- if m.role == 'system' -%}\
{%- set ns.system = ns.system ~ ('\\n\\n' if ns.system else '') ~ m.content -%}\
{%- endif -%}{%- endfor -%}\
{{ bos_token ~ ns.system }}\
{%- if tools -%}{{ ('\\n\\n' if ns.system else '') ~ '## Tools\\nYou have access to the following tools:\\n' }}\
{%- for t in tools -%}{{ '\\n### ' ~ t.function.name ~ '\\nDescription: ' ~ (t.function.description or '') \
~ '\\n\\nParameters: ' ~ ((t.function.parameters or {}) | tojson) ~ '\\n' }}{%- endfor -%}\
{{ '\\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>\
function<｜tool▁sep｜>tool_call_name\\n```json\\ntool_call_arguments\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>\\n' }}\
{%- endif -%}\
{%- for m in messages -%}\
{%- if m.role == 'user' -%}\
{%- if ns.tool -%}{{ '<｜tool▁outputs▁end｜>' }}{%- set ns.tool = false -%}{%- endif -%}{{ '<｜User｜>' ~ m.content }}\
{%- elif m.role == 'assistant' -%}\
{%- if ns.tool -%}{{ '<｜tool▁outputs▁end｜>' }}{%- set ns.tool = false -%}{%- else -%}{{ '<｜Assistant｜>' }}{%- endif -%}\
{{ m.content }}\
{%- if m.tool_calls -%}{{ '<｜tool▁calls▁begin｜>' }}\
{%- for tc in m.tool_calls -%}{%- if not loop.first -%}{{ '\\n' }}{%- endif -%}\
{{ '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' ~ tc.function.name ~ '\\n```json\\n' }}\
{%- if tc.function.arguments is string -%}{{ tc.function.arguments }}{%- else -%}{{ tc.function.arguments | tojson }}{%- endif -%}\
{{ '\\n```<｜tool▁call▁end｜>' }}\
{%- endfor -%}{{ '<｜tool▁calls▁end｜>' }}{%- endif -%}\
{{ '<｜end▁of▁sentence｜>' }}\
{%- elif m.role == 'tool' -%}\
{%- if ns.tool -%}{{ '\\n' }}{%- else -%}{{ '<｜tool▁outputs▁begin｜>' }}{%- endif -%}\
{{ '<｜tool▁output▁begin｜>' ~ m.content ~ '<｜tool▁output▁end｜>' }}{%- set ns.tool = true -%}\
{%- elif m.role != 'system' -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if ns.tool -%}{{ '<｜tool▁outputs▁end｜>' }}\
{%- elif add_generation_prompt -%}{{ '<｜Assistant｜>' }}\
{%- if enable_thinking or thinking -%}{{ '<think>' }}{%- endif -%}\
{%- endif -%}";
