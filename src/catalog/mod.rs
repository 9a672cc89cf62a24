//! Models by name: the models directory and the bundled model.
//!
//! A user of ollama or LM Studio refers to a model by a short name, not by
//! the path where its files happen to be. colibri keeps named models as
//! subdirectories of one models directory (`$COLI_MODELS`, else
//! `$XDG_DATA_HOME/colibri/models`, else `~/.local/share/colibri/models`):
//! `coli convert --output NAME` writes there, `--model NAME` reads from
//! there, `coli list` and `coli rm` manage it. A path always wins over a
//! name, so every command that took a directory keeps taking it.
//!
//! The bundled model is embedded in the binary ([`bundled`]), so an
//! installed `coli` works without the source tree.

pub mod bundled;
mod entry;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

pub use entry::{Entry, Formats, describe, dir_size, list};

/// Why a model name or the models directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("no models directory: neither COLI_MODELS, XDG_DATA_HOME nor HOME is set")]
    NoHome,
    #[error(
        "no model {given:?}: it is not a path, and the models directory {dir} has no model of that name (`coli list` shows what is there)"
    )]
    UnknownName { given: String, dir: PathBuf },
    #[error("no model at {0}: no such file or directory")]
    NoSuchPath(PathBuf),
    #[error(
        "{0:?} is not a model name: a name is letters, digits, '.', '_', '-' or '+', not starting with '.' or '-' (use ./{0} for a directory here)"
    )]
    BadName(String),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> CatalogError + 'a {
    move |source| CatalogError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// True when `s` is a bare model name rather than a path: what `--model`
/// and `convert --output` look up in the models directory.
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 200
        && !s.starts_with('.')
        && !s.starts_with('-')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'))
}

/// The directory that holds named models.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelsDir {
    root: PathBuf,
}

impl ModelsDir {
    /// From the process environment (see the module comment for the order).
    pub fn from_env() -> Result<ModelsDir, CatalogError> {
        Self::locate(
            std::env::var_os("COLI_MODELS").as_deref(),
            std::env::var_os("XDG_DATA_HOME").as_deref(),
            std::env::var_os("HOME").as_deref(),
        )
    }

    /// From explicit values of `COLI_MODELS`, `XDG_DATA_HOME` and `HOME`:
    /// empty ones count as unset, and a relative `XDG_DATA_HOME` is ignored
    /// as the XDG specification asks.
    pub fn locate(
        coli_models: Option<&OsStr>,
        xdg_data_home: Option<&OsStr>,
        home: Option<&OsStr>,
    ) -> Result<ModelsDir, CatalogError> {
        let set = |v: Option<&OsStr>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
        let root = if let Some(p) = set(coli_models) {
            p
        } else if let Some(p) = set(xdg_data_home).filter(|p| p.is_absolute()) {
            p.join("colibri").join("models")
        } else if let Some(h) = set(home) {
            h.join(".local").join("share").join("colibri").join("models")
        } else {
            return Err(CatalogError::NoHome);
        };
        Ok(ModelsDir { root })
    }

    /// A models directory at `root` (tests, tools).
    pub fn at(root: impl Into<PathBuf>) -> ModelsDir {
        ModelsDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the model `name` lives (or will, once written).
    pub fn path_of(&self, name: &str) -> Result<PathBuf, CatalogError> {
        if !is_name(name) {
            return Err(CatalogError::BadName(name.to_string()));
        }
        Ok(self.root.join(name))
    }

    /// Creates the directory (and its parents) when missing.
    pub fn create(&self) -> Result<(), CatalogError> {
        std::fs::create_dir_all(&self.root).map_err(io_err("creating the models directory", &self.root))
    }

    /// Names of the models in the directory, sorted: subdirectories with a
    /// `config.json`, skipping hidden ones (a conversion in progress writes
    /// to `NAME.tmp-PID`, which [`is_name`] accepts but which has no config
    /// until it is renamed, so it is skipped too).
    pub fn names(&self) -> Result<Vec<String>, CatalogError> {
        let rd = match std::fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("reading the models directory", &self.root)(e)),
        };
        let mut names: Vec<String> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| is_name(n) && self.root.join(n).join("config.json").is_file())
            .collect();
        names.sort();
        Ok(names)
    }
}

/// Resolves what `--model` (or `$COLI_MODEL`) named: an existing path is
/// taken as it is; else a bare name is looked up in the models directory,
/// the bundled model's name always resolving (extracted on first use).
pub fn resolve(given: &Path) -> Result<PathBuf, CatalogError> {
    if given.exists() {
        return Ok(given.to_path_buf());
    }
    let Some(name) = given.to_str().filter(|s| is_name(s)) else {
        return Err(CatalogError::NoSuchPath(given.to_path_buf()));
    };
    if name == bundled::NAME {
        return bundled::dir();
    }
    let models = ModelsDir::from_env()?;
    let p = models.root.join(name);
    if p.exists() {
        Ok(p)
    } else {
        Err(CatalogError::UnknownName {
            given: name.to_string(),
            dir: models.root,
        })
    }
}

/// Where `convert --output` writes: a bare name goes to the models
/// directory, anything else (`./NAME`, `dir/NAME`, an absolute path) is a
/// path as given.
pub fn output_path(given: &Path) -> Result<PathBuf, CatalogError> {
    match given.to_str().filter(|s| is_name(s)) {
        Some(name) => {
            let models = ModelsDir::from_env()?;
            models.create()?;
            models.path_of(name)
        }
        None => Ok(given.to_path_buf()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths_are_told_apart() {
        for ok in ["olmoe", "qwen3-30b-a3b", "glm_4.5+int8", "a"] {
            assert!(is_name(ok), "{ok}");
        }
        for bad in [
            "", ".", "..", ".hidden", "-x", "a/b", "./a", "/abs", "a b", "é", "a:b",
        ] {
            assert!(!is_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_models_directory_follows_the_environment() {
        let o = |s: &str| Some(OsStr::new(s).to_owned());
        let at =
            |m: Option<std::ffi::OsString>, x: Option<std::ffi::OsString>, h: Option<std::ffi::OsString>| {
                ModelsDir::locate(m.as_deref(), x.as_deref(), h.as_deref()).map(|d| d.root)
            };
        assert_eq!(at(o("/m"), o("/x"), o("/h")).ok(), Some(PathBuf::from("/m")));
        assert_eq!(
            at(None, o("/x"), o("/h")).ok(),
            Some(PathBuf::from("/x/colibri/models"))
        );
        // A relative XDG_DATA_HOME is ignored, as the specification says.
        assert_eq!(
            at(o(""), o("rel"), o("/h")).ok(),
            Some(PathBuf::from("/h/.local/share/colibri/models"))
        );
        assert!(matches!(at(None, None, None), Err(CatalogError::NoHome)));
        assert!(matches!(at(None, None, o("")), Err(CatalogError::NoHome)));
    }

    #[test]
    fn names_lists_models_only() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = ModelsDir::at(tmp.path().join("models"));
        assert_eq!(d.names().ok(), Some(vec![]), "a missing directory is empty");
        d.create().expect("create");
        for n in ["b", "a", ".hidden", "x.tmp-1"] {
            std::fs::create_dir(d.root().join(n)).expect("dir");
            if n != "x.tmp-1" {
                std::fs::write(d.root().join(n).join("config.json"), "{}").expect("cfg");
            }
        }
        std::fs::create_dir(d.root().join("empty")).expect("dir");
        std::fs::write(d.root().join("file"), "x").expect("file");
        assert_eq!(d.names().ok(), Some(vec!["a".to_string(), "b".to_string()]));
        assert!(matches!(d.path_of("../x"), Err(CatalogError::BadName(_))));
    }
}
