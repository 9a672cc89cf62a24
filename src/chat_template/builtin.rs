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
    /// Qwen3: ChatML, `<|im_start|>role\n...<|im_end|>\n`, the reply opened
    /// with an empty `<think>` block (Qwen3's `enable_thinking=False`).
    ChatMl,
    /// Mixtral-Instruct: `<s>[INST] ... [/INST]`, replies closed by `</s>`;
    /// a system message is put before the first instruction.
    Mistral,
    /// GLM-4.5 / 4.6: like [`Family::Glm`] but with a newline after each
    /// role tag, and thinking switched off with `\n<think></think>\n`.
    Glm4,
    /// gpt-oss's harmony format: `<|start|>role<|message|>...<|end|>`, the
    /// reply opened with `<|start|>assistant`; a system message becomes the
    /// developer message's instructions.
    Harmony,
}

impl Family {
    /// The built-in template source.
    pub fn template(self) -> &'static str {
        match self {
            Family::Olmoe => OLMOE,
            Family::Glm => GLM,
            Family::ChatMl => CHATML,
            Family::Mistral => MISTRAL,
            Family::Glm4 => GLM4,
            Family::Harmony => HARMONY,
        }
    }

    /// Default `(bos_token, eos_token)` when the tokenizer config names none.
    pub fn default_tokens(self) -> (&'static str, &'static str) {
        match self {
            Family::Olmoe => ("<|endoftext|>", "<|endoftext|>"),
            Family::Glm => ("", "<|endoftext|>"),
            Family::ChatMl => ("", "<|im_end|>"),
            Family::Mistral => ("<s>", "</s>"),
            Family::Glm4 => ("", "<|endoftext|>"),
            Family::Harmony => ("<|startoftext|>", "<|return|>"),
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

const CHATML: &str = "{%- for m in messages -%}\
{%- if m.role in ['system', 'user', 'assistant'] -%}\
{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{%- endif -%}";

const MISTRAL: &str = "{{ bos_token }}\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ m.content ~ '\\n\\n' }}\
{%- elif m.role == 'user' -%}{{ '[INST] ' ~ m.content ~ ' [/INST]' }}\
{%- elif m.role == 'assistant' -%}{{ m.content ~ eos_token }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}";

const GLM: &str = "[gMASK]<sop>\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ '<|system|>' ~ m.content }}\
{%- elif m.role == 'user' -%}{{ '<|user|>' ~ m.content }}\
{%- elif m.role == 'assistant' -%}{{ '<|assistant|><think></think>' ~ m.content }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<|assistant|><think></think>' }}{%- endif -%}";

const GLM4: &str = "[gMASK]<sop>\
{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ '<|system|>\\n' ~ m.content }}\
{%- elif m.role == 'user' -%}{{ '<|user|>\\n' ~ m.content }}\
{%- elif m.role == 'assistant' -%}{{ '<|assistant|>\\n<think></think>\\n' ~ m.content }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<|assistant|>\\n<think></think>\\n' }}{%- endif -%}";

const HARMONY: &str = "{%- for m in messages -%}\
{%- if m.role == 'system' -%}{{ '<|start|>developer<|message|># Instructions\\n\\n' ~ m.content ~ '<|end|>' }}\
{%- elif m.role == 'user' -%}{{ '<|start|>user<|message|>' ~ m.content ~ '<|end|>' }}\
{%- elif m.role == 'assistant' -%}{{ '<|start|>assistant<|channel|>final<|message|>' ~ m.content ~ '<|end|>' }}\
{%- else -%}{{ raise_exception('unsupported role ' ~ m.role) }}\
{%- endif -%}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<|start|>assistant' }}{%- endif -%}";
