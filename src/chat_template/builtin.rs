//! Fallback templates for checkouts without `chat_template`.

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
    };
    /// GLM: `[gMASK]<sop>` once, then `<|user|>...<|assistant|>` with no newline
    /// after the role tags, and an empty `<think></think>` block that switches
    /// thinking off (without it the model rambles and never stops).
    pub const GLM: ChatFormat = ChatFormat {
        name: "Glm",
        template: GLM,
        bos: "",
        eos: "<|endoftext|>",
    };
    /// Qwen3: ChatML, `<|im_start|>role\n...<|im_end|>\n`, the reply opened
    /// with an empty `<think>` block (Qwen3's `enable_thinking=False`).
    pub const CHATML: ChatFormat = ChatFormat {
        name: "ChatMl",
        template: CHATML,
        bos: "",
        eos: "<|im_end|>",
    };
    /// Mixtral-Instruct: `<s>[INST] ... [/INST]`, replies closed by `</s>`;
    /// a system message is put before the first instruction.
    pub const MISTRAL: ChatFormat = ChatFormat {
        name: "Mistral",
        template: MISTRAL,
        bos: "<s>",
        eos: "</s>",
    };
    /// GLM-4.5 / 4.6: like [`ChatFormat::GLM`] but with a newline after each
    /// role tag, and thinking switched off with `\n<think></think>\n`.
    pub const GLM4: ChatFormat = ChatFormat {
        name: "Glm4",
        template: GLM4,
        bos: "",
        eos: "<|endoftext|>",
    };
    /// gpt-oss's harmony format: `<|start|>role<|message|>...<|end|>`, the
    /// reply opened with `<|start|>assistant`; a system message becomes the
    /// developer message's instructions.
    pub const HARMONY: ChatFormat = ChatFormat {
        name: "Harmony",
        template: HARMONY,
        bos: "<|startoftext|>",
        eos: "<|return|>",
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
