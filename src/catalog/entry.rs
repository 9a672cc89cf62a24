//! What `coli list` says of each model: family, formats, size on disk.
//!
//! Read from the files alone (config.json and the safetensors headers), so
//! listing many large models costs a few header reads each, and one broken
//! model is shown with its error instead of failing the whole list.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{CatalogError, ModelsDir, bundled};
use crate::st::Checkpoint;

/// How a model's weights are stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Formats {
    /// A colibri container: the formats `coli convert` wrote.
    Container { experts: String, dense: String },
    /// A checkpoint as published: its tensors' dtypes (quantized at load).
    Checkpoint { dtypes: Vec<String> },
}

impl std::fmt::Display for Formats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Formats::Container { experts, dense } => {
                write!(f, "container: experts {experts}, dense {dense}")
            }
            Formats::Checkpoint { dtypes } => write!(f, "checkpoint {}", dtypes.join("+")),
        }
    }
}

/// One listed model.
#[derive(Clone, Debug)]
pub struct Entry {
    pub name: String,
    pub path: PathBuf,
    /// The model embedded in the binary (not written out yet when `path`
    /// does not exist).
    pub bundled: bool,
    /// Bytes of every file in the model's directory.
    pub size_bytes: u64,
    /// `model_type` from config.json, or why it could not be read.
    pub family: Result<String, String>,
    /// The weights' formats, or why the checkpoint could not be opened.
    pub formats: Result<Formats, String>,
}

/// Every model of `models`, the bundled one first.
pub fn list(models: &ModelsDir) -> Result<Vec<Entry>, CatalogError> {
    let mut out = Vec::new();
    let bundled_dir = bundled::existing_dir();
    let mut names = models.names()?;
    match &bundled_dir {
        Some(dir) => {
            names.retain(|n| !(n == bundled::NAME && models.root().join(n) == *dir));
            let mut e = describe(bundled::NAME, dir);
            e.bundled = true;
            out.push(e);
        }
        None => out.push(Entry {
            name: bundled::NAME.to_string(),
            path: models.root().join(bundled::NAME),
            bundled: true,
            size_bytes: bundled::size(),
            family: Ok("olmoe".to_string()),
            formats: Ok(Formats::Checkpoint {
                dtypes: vec!["F32".to_string()],
            }),
        }),
    }
    for n in names {
        out.push(describe(&n, &models.root().join(&n)));
    }
    Ok(out)
}

/// Reads what a listing shows of the model in `dir`.
pub fn describe(name: &str, dir: &Path) -> Entry {
    Entry {
        name: name.to_string(),
        path: dir.to_path_buf(),
        bundled: false,
        size_bytes: dir_size(dir),
        family: family(dir),
        formats: formats(dir),
    }
}

fn family(dir: &Path) -> Result<String, String> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    // Multimodal releases keep the language model's type in `text_config`.
    let t = v
        .get("model_type")
        .or_else(|| v.get("text_config").and_then(|t| t.get("model_type")))
        .and_then(|t| t.as_str());
    t.map(str::to_string)
        .ok_or_else(|| format!("{}: no model_type", p.display()))
}

fn formats(dir: &Path) -> Result<Formats, String> {
    let ck = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    let meta = ck.metadata();
    if meta.get("format").map(String::as_str) == Some("colibri") {
        let get = |k: &str| meta.get(k).cloned().unwrap_or_else(|| "?".to_string());
        return Ok(Formats::Container {
            experts: get("experts"),
            dense: get("dense"),
        });
    }
    let mut bytes: BTreeMap<String, u64> = BTreeMap::new();
    for name in ck.names() {
        if let Ok(m) = ck.info(name) {
            *bytes.entry(format!("{:?}", m.dtype)).or_default() += m.len;
        }
    }
    // Largest share first: what most of the model is stored in.
    let mut by_size: Vec<(String, u64)> = bytes.into_iter().collect();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(Formats::Checkpoint {
        dtypes: by_size.into_iter().map(|(d, _)| d).collect(),
    })
}

/// Bytes of the regular files under `dir` (symbolic links not followed).
pub fn dir_size(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) if m.is_file() => m.len(),
            _ => 0,
        })
        .sum()
}
