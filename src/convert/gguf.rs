//! `coli convert --input FILE.gguf`: a GGUF model repacked into a streaming
//! container. Tensors stored as ggml blocks are copied byte for byte (never
//! requantized) and listed with their type in the container's
//! `__metadata__` ([`crate::st::ggml_blocks`]); float tensors follow
//! `--experts` / `--dense` as a checkpoint's do. What the GGUF keeps in its
//! metadata is written beside the weights as the files a checkpoint
//! directory has: config.json (the config the family rebuilt from the
//! metadata), tokenizer.json (the tokenizer rebuilt from
//! `tokenizer.ggml.*`), tokenizer_config.json (the chat template with its
//! BOS and EOS tokens) and generation_config.json (the stop ids). The
//! container then runs exactly as the GGUF does, with one read per expert.

use std::path::Path;

use super::plan::{self, InputTensor};
use super::{CONVERT_PHASE, CheckpointInput, ContainerSpec, ConvertError, ConvertReport, write_container};
use crate::engine::ModelFiles;
use crate::gguf::checkpoint::ARCHITECTURE_KEY;
use crate::gguf::{GgmlType, GgufModel, tokenizer_from_gguf};
use crate::model::family::ModelConfig;
use crate::progress::Progress;
use crate::quant::QFormat;
use crate::st::ggml_blocks::{GGML_TYPES_KEY, encode};

/// Converts the GGUF model whose (first) file is `input` into a container
/// at `output`; `experts` and `dense` apply to tensors stored as floats.
pub fn convert_gguf(
    input: &Path,
    output: &Path,
    experts: QFormat,
    dense: QFormat,
    progress: Option<&dyn Progress>,
) -> Result<ConvertReport, ConvertError> {
    let gguf_err = |e: &dyn std::fmt::Display| ConvertError::Input {
        path: input.to_path_buf(),
        tensor: "(metadata)".into(),
        reason: e.to_string(),
    };
    let files = ModelFiles::Gguf(input.to_path_buf());
    let model = GgufModel::open(input).map_err(|e| gguf_err(&e))?;
    let config = crate::gguf::config::config_json(&model).map_err(|e| gguf_err(&e))?;
    let cfg = ModelConfig::from_json(input, config.clone())?;
    let spec = cfg.family().convert_spec(input, experts, dense)?;
    let ck = files.weights().map_err(|e| gguf_err(&e))?;
    let inputs = plan::checkpoint_inputs(&ck)?;
    let jobs = plan::plan(&inputs, ck.dir(), &spec)?;
    let blocks: Vec<(&str, GgmlType, &[usize])> = inputs
        .iter()
        .filter_map(|t: &InputTensor| Some((t.name.as_str(), t.block?, t.shape.as_slice())))
        .collect();
    let mut metadata = spec.metadata.clone();
    if !blocks.is_empty() {
        metadata.push((GGML_TYPES_KEY, encode(blocks.iter().copied())));
    }
    metadata.push(("source", "gguf".to_string()));
    // Families whose converter rewrites tensors read them by this key.
    if let Ok(arch) = model.architecture() {
        metadata.push((ARCHITECTURE_KEY, arch.to_string()));
    }
    let (experts_shown, dense_shown) = shown_formats(&inputs, &spec, experts, dense);
    let side_files =
        |tmp: &Path| -> Result<(), ConvertError> { write_side_files(&files, &model, &config, tmp) };
    let cspec = ContainerSpec {
        output,
        experts: experts_shown,
        dense: dense_shown,
        progress,
        phase: CONVERT_PHASE,
        metadata: &metadata,
    };
    let bytes = write_container(&cspec, &jobs, &CheckpointInput(&ck), &side_files)?;
    Ok(ConvertReport {
        output: output.to_path_buf(),
        tensors: jobs.len(),
        experts: spec.experts(),
        bytes,
        experts_format: experts_shown,
        dense_format: dense_shown,
    })
}

/// The formats the container says it holds: for experts and for the dense
/// matrices, the ggml type most of their bytes are in when they are ggml
/// blocks, else the format asked for.
fn shown_formats(
    inputs: &[InputTensor],
    spec: &plan::ModelSpec,
    experts: QFormat,
    dense: QFormat,
) -> (QFormat, QFormat) {
    let mut by_type: [std::collections::BTreeMap<u32, usize>; 2] = Default::default();
    for t in inputs {
        if let Some(ty) = t.block {
            let is_expert = spec.naming.parse(&t.name).is_some();
            let n: usize = t.shape.iter().product();
            *by_type[usize::from(is_expert)].entry(ty.id()).or_default() += n;
        }
    }
    let most = |m: &std::collections::BTreeMap<u32, usize>, asked: QFormat| {
        m.iter()
            .max_by_key(|(id, n)| (**n, std::cmp::Reverse(**id)))
            .and_then(|(id, _)| GgmlType::from_id(*id))
            .map_or(asked, QFormat::Ggml)
    };
    (most(&by_type[1], experts), most(&by_type[0], dense))
}

/// config.json, tokenizer.json, tokenizer_config.json (when the GGUF has a
/// chat template) and generation_config.json (when it names stop ids).
fn write_side_files(
    files: &ModelFiles,
    model: &GgufModel,
    config: &serde_json::Value,
    dir: &Path,
) -> Result<(), ConvertError> {
    let write = |name: &str, text: String| -> Result<(), ConvertError> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| ConvertError::Io { path, source })
    };
    let bad = |what: &str, reason: String| ConvertError::Input {
        path: files.path().to_path_buf(),
        tensor: format!("({what})"),
        reason,
    };
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    write("config.json", pretty(config))?;
    let tok = tokenizer_from_gguf(model.metadata()).map_err(|e| bad("tokenizer", e.to_string()))?;
    let json = tok
        .hf()
        .to_string(true)
        .map_err(|e| bad("tokenizer", e.to_string()))?;
    write("tokenizer.json", json)?;
    let stops = tok.stop_ids();
    if !stops.is_empty() {
        write(
            "generation_config.json",
            pretty(&serde_json::json!({ "eos_token_id": stops })),
        )?;
    }
    if let Some(source) =
        crate::gguf::config::chat_template(model).map_err(|e| bad("chat template", e.to_string()))?
    {
        let name = |id: Option<u32>| id.and_then(|i| tok.hf().id_to_token(i));
        let mut cfg = serde_json::json!({ "chat_template": source });
        if let Some(b) = name(tok.special.bos) {
            cfg["bos_token"] = serde_json::json!(b);
        }
        if let Some(e) = name(tok.special.eos) {
            cfg["eos_token"] = serde_json::json!(e);
        }
        write("tokenizer_config.json", pretty(&cfg))?;
    }
    Ok(())
}
