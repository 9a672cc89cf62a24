//! Fallback templates for checkouts without `chat_template`.

/// Model families with a built-in chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// OLMoE-Instruct (0125): the Tulu format, `<|user|>\n...\n<|assistant|>\n`,
    /// replies closed by the EOS token.
    Olmoe,
    /// GLM: `[gMASK]<sop>` once, then `<|user|>...<|assistant|>` with no newline
    /// after the role tags, and an empty `<think></think>` block that switches
    /// thinking off (without it the model rambles and never stops).
    Glm,
}

impl Family {
    /// The built-in template source.
    pub fn template(self) -> &'static str {
        match self {
            Family::Olmoe => OLMOE,
            Family::Glm => GLM,
        }
    }

    /// Default `(bos_token, eos_token)` when the tokenizer config names none.
    pub fn default_tokens(self) -> (&'static str, &'static str) {
        match self {
            Family::Olmoe => ("<|endoftext|>", "<|endoftext|>"),
            Family::Glm => ("", "<|endoftext|>"),
        }
    }
}

// Literal text goes through `{{ '...' }}` so that trim_blocks / lstrip_blocks
// and `{%-` never eat a newline that belongs to the format.
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

const GLM: &str = "[gMASK]<sop>\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ '<|system|>' ~ m.content }}\
{%- elif m.role == 'user' -%}{{ '<|user|>' ~ m.content }}\
{%- elif m.role == 'assistant' -%}{{ '<|assistant|><think></think>' ~ m.content }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<|assistant|><think></think>' }}{%- endif -%}";
